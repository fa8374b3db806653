"""M tiling in the compiler's lowering (host/compiler/lower.py).

Units whose rows do not fit at once (the accumulator rows, one ``gemm``'s 4096
rows, the scratchpad's working partition) are split into M tiles streamed
through the scratchpad; convolutions run their output rows in groups that fit
the accumulators. Every graph is compiled for the small configuration
(acc_rows 256, 16 KiB scratchpad), run on the golden NPU through the one runtime
path and compared bit for bit with the reference interpreter
(``Session(check=True)``). Tiled programs are also checked for races (the golden
model runs in program order; the RTL does not) and for balanced token channels.
Programs that need no tiling must stay exactly as before.
"""

import dataclasses
import hashlib
import re

import numpy as np
import pytest

from firmware import asm
from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.compiler import CompileError, compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import Session
from verif.randprog import find_races

SMALL = CONFIGS["small"]
ACC = SMALL.acc_rows

# sha256(source)[:16] of the bundled models' programs: M tiling and streaming leave
# programs that fit unchanged (RTL tests, caches); a new lowering of an operator
# changes them deliberately (cnn: its convolutions as long GEMMs, tests/test_conv_rows.py;
# every one-row GEMM as a GEMV, tests/test_gemv.py; the fused default plan,
# tests/test_fuse.py).
BUNDLED = {
    ("mlp", "default"): "3232fc40825f80ae",
    ("mlp", "small"): "e376b19b4e4004a5",
    ("cnn", "default"): "9680b148b74a586d",
    ("cnn", "small"): "356d142f601ca8b3",
    ("moe", "default"): "7603894d286cce33",
    ("moe", "small"): "a2e68f0b8b12c44d",
    ("early_exit", "default"): "4d7e2610c5cd1473",
    ("early_exit", "small"): "0a7dd1bb8bd27233",
}


def rand_int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def check_tokens(source: str):
    """Every token channel has as many pushes as pops (straight-line programs:
    a leftover token would be taken by a later unit's pop)."""
    count = dict.fromkeys(("load>compute", "compute>load", "compute>store",
                           "store>compute"), 0)
    for line in source.splitlines():
        line = line.strip()
        if not line or line.endswith(":") or line.startswith(";"):
            continue
        q = {"load": "load", "store": "store"}.get(line.split()[0], "compute")
        for kind, d in re.findall(r"(push|pop)=(prev|next)", line):
            other = {("load", "next"): "compute", ("store", "prev"): "compute",
                     ("compute", "prev"): "load", ("compute", "next"): "store"}[(q, d)]
            ch = f"{q}>{other}" if kind == "push" else f"{other}>{q}"
            count[ch] += 1 if kind == "push" else -1
    assert all(v == 0 for v in count.values()), f"unbalanced token channels: {count}"


def race_free(model, session) -> bool:
    """No two queues touch a byte unordered (tokens, drains) in ``model``'s program.

    ``region.begin``/``region.end`` wait for the queues to drain (firmware/isa.py)
    but ``find_races`` does not count them as drains, so a ``sync`` (the same
    ordering) goes before each mark here; the bank is made large enough to hold
    the extra instructions.
    """
    src = re.sub(r"^(\s*)(region\.(begin|end) \d+)$", r"\1sync\n\1\2", model.source,
                 flags=re.M)
    config = dataclasses.replace(model.config, imem_depth=4096)
    races = find_races(config, asm.assemble(src), model.partitions,
                       {session.const_base: np.frombuffer(model.const_image(), np.uint8)},
                       (session.const_base, session.arena_base, 0), runs=2)
    assert races == [], "\n".join(races[:5])
    return True


def run_checked(graph, config, rng, units=None, runs=2, **kw):
    """Compile, check races and tokens, run ``runs`` random inputs against the
    reference; return the compiled model."""
    model = compile_model(graph, config, units, **kw)
    check_tokens(model.source)
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    assert race_free(model, s)
    for _ in range(runs):
        x = {name: rand_int8(rng, graph.tensors[name].shape) for name in graph.inputs}
        r = s.run(x)  # raises MismatchError on any difference from the reference
        assert r.checked
        for k, v in run_reference(graph, x).items():
            assert np.array_equal(r.outputs[k], v), k
    return model


def tiles(model) -> list[int]:
    return [u.resources["m_tiles"] for u in model.units]


def gemm_graph(rng, m, k, n):
    b = GraphBuilder("g")
    x = b.input("x", (m, k), scale=0.05, zp=int(rng.integers(-10, 10)))
    y = b.qgemm(x, rand_int8(rng, (k, n)), rng.integers(-3000, 3000, n), w_scale=0.01,
                out_scale=0.2, out_zp=-5, relu=True)
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("m", [1, ACC - 1, ACC, ACC + 1, 3 * ACC + 5])
def test_gemm_rows_around_the_accumulator(m, seed):
    rng = np.random.default_rng(seed)
    # K = 18 and N = 10 leave partial reduction and column tiles on the 4x4 array.
    model = run_checked(gemm_graph(rng, m, 18, 10), SMALL, rng)
    (t,) = tiles(model)  # more tiles than the accumulator needs overlap more loads
    assert t >= -(-m // ACC)


def test_gemm_tiles_on_the_default_profile(seed):
    rng = np.random.default_rng(seed)
    config = CONFIGS["default"]
    m = 2 * config.acc_rows + 1
    model = run_checked(gemm_graph(rng, m, 24, 12), config, rng, runs=1)
    (t,) = tiles(model)
    assert t >= 3


def test_gemm_that_fits_runs_in_m_tiles_that_overlap_its_loads(seed, monkeypatch):
    """A GEMM that fits whole (MobileNetV1-0.25's 24x24 32 -> 32 pointwise layer)
    runs as M tiles where the cost model says the overlap of the next tile's load
    and the last tile's store with the compute pays for running every weight tile
    once per tile; the golden model measures it faster than whole."""
    from host.compiler import lower

    rng = np.random.default_rng(seed)
    config = CONFIGS["default"]
    graph = gemm_graph(rng, 576, 32, 32)
    tiled = run_checked(graph, config, rng, runs=1)
    assert tiles(tiled)[0] > 1
    monkeypatch.setattr(lower, "OVERLAP_TILE_COUNTS", ())
    whole = run_checked(graph, config, rng, runs=1)
    assert tiles(whole) == [1]

    def cycles(model):
        s = Session(NPUDriver(GoldenDevice(config)), model)
        s.load()
        s.run({"x": rand_int8(rng, (576, 32))})
        return s.run({"x": rand_int8(rng, (576, 32))}).cycles

    assert cycles(tiled) < 0.92 * cycles(whole)


@pytest.mark.parametrize("budget", [None, 0], ids=["resident", "streamed_weights"])
def test_gemm_larger_than_the_scratchpad(budget, seed):
    rng = np.random.default_rng(seed)
    m, k, n = 600, 72, 14
    g = gemm_graph(rng, m, k, n)
    assert m * k > SMALL.sp_bytes  # the input alone does not fit
    model = run_checked(g, SMALL, rng, weight_budget=budget)
    (t,) = tiles(model)
    assert t > -(-m // ACC), "the scratchpad, not the accumulators, sets the tile"
    assert model.units[0].resources["scratchpad_bytes"] <= SMALL.sp_bytes
    assert any(b.slot == 0 for b in model.place.blobs.values()) == (budget == 0)


def chain_graph(rng, m, k, n1, n2):
    """gemm -> add (with the input) -> gemm; the first GEMM's output is also a
    graph output (stored from inside the unit)."""
    b = GraphBuilder("chain")
    x = b.input("x", (m, k), scale=0.05, zp=2)
    h = b.qgemm(x, rand_int8(rng, (k, k)), rng.integers(-2000, 2000, k), w_scale=0.01,
                out_scale=0.1, out_zp=3)
    a = b.qadd(h, x, out_scale=0.12, out_zp=-1)
    z = b.qgemm(a, rand_int8(rng, (k, n1)), None, w_scale=0.01, out_scale=0.3, relu=True)
    y = b.qgemm(z, rand_int8(rng, (n1, n2)), rng.integers(-500, 500, n2), w_scale=0.02,
                out_scale=0.4)
    b.output(h, "h")
    b.output(y, "y")
    return b.build()


def test_merged_chain_tiles_through_every_layer(seed):
    rng = np.random.default_rng(seed)
    g = chain_graph(rng, 700, 12, 8, 5)
    split = compile_model(g, SMALL)
    names = [n.name for n in split.graph.nodes]
    model = run_checked(split.graph, SMALL, rng, [names], simplified=True)
    (t,) = tiles(model)
    assert t >= 3
    # Intermediates stay on chip: only the input and the two outputs cross DRAM.
    assert sorted(model.place.arena) == sorted(["x", *split.graph.outputs])


def test_merged_chain_with_streamed_weights(seed):
    rng = np.random.default_rng(seed)
    g = chain_graph(rng, 2 * ACC + 3, 16, 8, 5)
    split = compile_model(g, SMALL)
    names = [n.name for n in split.graph.nodes]
    model = run_checked(split.graph, SMALL, rng, [names], simplified=True, weight_budget=0)
    assert tiles(model)[0] >= 3


def conv_graph(rng, c, h, w, oc, pool):
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, h, w), scale=0.05, zp=int(rng.integers(-20, 20)))
    y = b.qconv(x, rand_int8(rng, (oc, c, 3, 3)), rng.integers(-2000, 2000, oc),
                pads=(1, 1, 1, 1), w_scale=0.01, out_scale=0.3, out_zp=-100, relu=True)
    y = b.maxpool(y, kernel=pool)
    f = b.flatten(y)
    size = b.tensor(f).shape[1]
    b.output(b.qgemm(f, rand_int8(rng, (size, 5)), None, w_scale=0.01, out_scale=0.4), "z")
    return b.build()


@pytest.mark.parametrize("geom", [(3, 20, 19, 4, (2, 2)), (2, 9, 70, 3, (3, 5))],
                         ids=["rows_400", "rows_630"])
def test_conv_output_rows_beyond_the_accumulator(geom, seed):
    rng = np.random.default_rng(seed)
    c, h, w, oc, pool = geom
    assert h * w > ACC
    model = run_checked(conv_graph(rng, c, h, w, oc, pool), SMALL, rng)
    conv = next(u for u in model.units if u.nodes[0].startswith("qconv"))
    assert conv.resources["m_tiles"] == 1  # on chip whole; only the accumulator is tiled


def test_bundled_programs_unchanged():
    for (name, config), digest in BUNDLED.items():
        src = compile_model(load_onnx(f"host/models/{name}.onnx"), CONFIGS[config]).source
        assert hashlib.sha256(src.encode()).hexdigest()[:16] == digest, (name, config)


def test_units_that_fit_are_not_tiled(seed):
    rng = np.random.default_rng(seed)
    model = compile_model(gemm_graph(rng, 40, 24, 12), SMALL)
    assert tiles(model) == [1] and "M tiled" not in model.source


# ---- what still cannot be tiled ------------------------------------------------------------


def test_refuses_a_row_wider_than_the_scratchpad():
    b = GraphBuilder("wide")
    x = b.input("x", (2, 6000), scale=0.1)
    b.output(b.qgemm(x, np.ones((6000, 1), np.int8), None, out_scale=1.0), "y")
    with pytest.raises(CompileError, match=r"one row of unit 1 needs 12002 bytes of scratchpad"):
        compile_model(b.build(), SMALL)


def test_refuses_a_max_pool_larger_than_the_scratchpad(seed):
    # The convolution streams its image in bands (tests/test_compiler_streaming.py);
    # the max-pool after it does not stream.
    rng = np.random.default_rng(seed)
    with pytest.raises(CompileError, match=r"scratchpad.*MaxPool .* does not work on "
                                           r"independent rows"):
        compile_model(conv_graph(rng, 8, 40, 40, 8, (4, 4)), SMALL)


def test_refuses_an_output_row_wider_than_the_accumulator(seed):
    rng = np.random.default_rng(seed)
    with pytest.raises(CompileError, match="output row of 300 positions exceeds the 256"):
        compile_model(conv_graph(rng, 1, 2, 300, 1, (2, 2)), SMALL)
