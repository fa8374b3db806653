"""The compiler and runtime on the golden model: every result equals the reference.

Graphs come from the bundled models and from the builder with random shapes and
values (seeded); each is compiled for both configurations and run through the
one runtime path (Session -> NPUDriver -> GoldenDevice), and every output is
compared bit for bit with the reference interpreter (``Session(check=True)``).
"""

import numpy as np
import pytest

from firmware import asm
from firmware.config import CONFIGS, NPUConfig
from host.builder import GraphBuilder
from host.cli import main as npu_main
from host.compiler import CompileError, compile_model, initial_units, simplify
from host.compiler.cost import CostModel
from host.compiler.layout import Layout
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.errors import UnsupportedOpError
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import MismatchError, Session

MODELS = ["mlp", "cnn", "moe", "early_exit"]


def session(graph, config, units=None, **kw):
    model = compile_model(graph, config, units, **kw)
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    return s


def rand_int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", MODELS)
def test_bundled_model_bit_exact(name, config, digits, seed):
    graph = load_onnx(f"host/models/{name}.onnx")
    s = session(graph, CONFIGS[config])
    shape = graph.tensors["input"].shape
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(digits.x_test), 6, replace=False):
        x = {"input": digits.x_test[i].reshape(shape).astype(np.float32)}
        r = s.run(x)  # raises MismatchError on any difference
        assert r.checked and r.cycles > 0
        # The simplified graph the program computes is the imported one.
        want = run_reference(graph, x)
        for k, v in want.items():
            assert np.array_equal(r.outputs[k], v), f"{name}: {k} #{i}"
    regions = {t.region for t in r.trace}
    assert regions <= set(s.model.regions), "trace names units the program does not have"


def test_branches_run_only_the_taken_expert(digits):
    graph = load_onnx("host/models/moe.onnx")
    s = session(graph, CONFIGS["default"])
    experts = {}
    for i in range(40):
        r = s.run({"input": digits.x_test[i].reshape(1, 64).astype(np.float32)})
        e = int(r.outputs["expert"][0])
        ran = [s.model.regions[t.region].nodes[0] for t in r.trace]
        assert ran[0] == "gate" and all(n.startswith(f"e{e}_") for n in ran[1:]), ran
        experts[e] = experts.get(e, 0) + 1
    assert len(experts) >= 3, f"the test digits should exercise several experts: {experts}"


def _mlp_graph(rng, m, k, n, relu=True):
    b = GraphBuilder("g")
    x = b.input("x", (m, k), scale=0.05, zp=int(rng.integers(-10, 10)))
    w1 = rand_int8(rng, (k, n))
    h = b.qgemm(x, w1, rng.integers(-3000, 3000, n), w_scale=0.01, out_scale=0.2,
                out_zp=-5, relu=relu)
    w2 = rand_int8(rng, (n, 7))
    y = b.qgemm(h, w2, None, w_scale=0.02, out_scale=0.5)
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("shape", [(1, 64, 32), (3, 20, 19), (5, 9, 8), (2, 100, 3),
                                   (17, 8, 40)])
def test_gemm_shapes(shape, config, seed):
    rng = np.random.default_rng(seed)
    g = _mlp_graph(rng, *shape)
    s = session(g, CONFIGS[config])
    for _ in range(3):
        s.run({"x": rand_int8(rng, shape[:2])})


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("shape", [(3, 20, 19), (17, 8, 40), (600, 16, 12)])
def test_per_channel_scales(shape, config, seed):
    """Per-channel weight scales (spanning three decades) on a GEMM and a convolution:
    each column tile loads its multipliers and shifts (vqtab) before its vreq ...
    tab=1, bit-exact with the reference (M tiled in the last shape)."""
    rng = np.random.default_rng(seed)
    m, k, n = shape
    b = GraphBuilder("pc")
    x = b.input("x", (m, k), scale=0.05, zp=int(rng.integers(-10, 10)))
    y = b.qgemm(x, rand_int8(rng, (k, n)), rng.integers(-3000, 3000, n),
                w_scale=10.0 ** rng.uniform(-4, -1, n), out_scale=0.2, out_zp=-5)
    b.output(y, "y")
    c = b.input("c", (1, 3, 6, 5), scale=0.05, zp=3)
    z = b.qconv(c, rand_int8(rng, (n, 3, 3, 3)), None, pads=(1, 1, 1, 1),
                w_scale=10.0 ** rng.uniform(-4, -1, n), out_scale=0.1, relu=True)
    b.output(z, "z")
    g = b.build()
    model = compile_model(g, CONFIGS[config])
    assert model.source.count("vqtab") >= 2 and "tab=1" in model.source
    s = session(g, CONFIGS[config])
    for _ in range(2):
        r = s.run({"x": rand_int8(rng, (m, k)), "c": rand_int8(rng, (1, 3, 6, 5))})
        assert len(np.unique(r.outputs["y"])) > 2


def _conv_graph(rng, n, c, h, w, oc, k, stride, pads, pool, pool_pads=(0, 0, 0, 0)):
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, h, w), scale=0.05, zp=int(rng.integers(-20, 20)))
    y = b.qconv(x, rand_int8(rng, (oc, c, k, k)), rng.integers(-2000, 2000, oc),
                strides=(stride, stride), pads=pads, w_scale=0.01, out_scale=0.3,
                out_zp=-100, relu=True)
    if pool:
        y = b.maxpool(y, kernel=pool, strides=pool, pads=pool_pads)
    f = b.flatten(y)
    size = b.tensor(f).shape[1]
    z = b.qgemm(f, rand_int8(rng, (size, 5)), None, w_scale=0.01, out_scale=0.4)
    b.output(z, "z")
    return b.build()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("geom", [
    # n, c, h, w, oc, k, stride, pads, pool, pool pads
    (1, 1, 8, 8, 8, 3, 1, (1, 1, 1, 1), (2, 2), (0, 0, 0, 0)),
    (1, 3, 7, 9, 5, 3, 2, (1, 0, 2, 1), None, (0, 0, 0, 0)),
    (2, 4, 6, 6, 10, 2, 1, (0, 0, 0, 0), (3, 3), (1, 1, 1, 1)),
    (1, 5, 5, 6, 3, 1, 1, (0, 0, 0, 0), (2, 3), (0, 1, 0, 0)),
])
def test_conv_pool_flatten(geom, config, seed):
    rng = np.random.default_rng(seed)
    g = _conv_graph(rng, *geom)
    s = session(g, CONFIGS[config])
    for _ in range(2):
        s.run({"x": rand_int8(rng, geom[:4])})


def test_add_clip_argmax_branch(seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("res")
    x = b.input("x", (1, 24), scale=0.1, zp=3)
    h = b.qgemm(x, rand_int8(rng, (24, 24)), None, w_scale=0.01, out_scale=0.1, out_zp=2)
    a = b.qadd(h, x, out_scale=0.15, out_zp=-4)
    c = b.clip(a, lo=-60, hi=90)
    gate = b.qgemm(c, rand_int8(rng, (24, 3)), None, w_scale=0.02, out_scale=0.3)
    e = b.argmax(gate, axis=-1, keepdims=False)
    cond = b.equal(e, 1)
    w_then, w_else = rand_int8(rng, (24, 6)), rand_int8(rng, (24, 6))
    (y,) = b.if_(cond,
                 lambda t: [t.qgemm(c, w_then, None, w_scale=0.01, out_scale=0.2)],
                 lambda t: [t.qgemm(c, w_else, None, w_scale=0.01, out_scale=0.2)])
    b.output(y, "y")
    b.output(e, "e")
    g = b.build()
    s = session(g, CONFIGS["default"])
    taken = set()
    for _ in range(24):
        r = s.run({"x": rand_int8(rng, (1, 24))})
        taken.add(int(r.outputs["e"][0]) == 1)
    assert taken == {True, False}, "both branches should run"


def test_simplify_folds_clip_into_requant(seed):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("fold")
    x = b.input("x", (2, 16), scale=0.1)
    h = b.qgemm(x, rand_int8(rng, (16, 8)), None, w_scale=0.01, out_scale=0.1)
    h = b.reshape(h, (2, 8))  # changes nothing
    b.output(b.clip(b.relu(h), -128, 127), "y")  # two clips, folded into the GEMM
    g = b.build()
    s, log = simplify(g)
    assert [n.op for n in s.nodes] == ["QGemm"], log
    assert any("folded" in line for line in log) and any("identity" in line for line in log)
    for _ in range(5):
        xin = {"x": rand_int8(rng, (2, 16))}
        assert np.array_equal(run_reference(g, xin)["y"], run_reference(s, xin)["y"])
    session(g, CONFIGS["default"]).run({"x": rand_int8(rng, (2, 16))})


def test_merged_unit_keeps_the_intermediate_on_chip(digits):
    graph = load_onnx("host/models/mlp.onnx")
    x = {"input": digits.x_test[0].reshape(1, 64).astype(np.float32)}
    split = session(graph, CONFIGS["default"], fuse=False)
    fused = session(split.model.graph, CONFIGS["default"], [["fc1", "fc2"]], simplified=True)
    a, b = split.run(x), fused.run(x)
    assert np.array_equal(a.outputs["logits"], b.outputs["logits"])
    assert len(b.trace) == 1 and len(a.trace) == 2
    # fc1's 32-byte output no longer goes out and comes back.
    assert b.counters["dram_write_bytes"] == a.counters["dram_write_bytes"] - 32
    assert b.counters["dram_read_bytes"] == a.counters["dram_read_bytes"] - 32


def test_weights_stay_resident_across_runs(digits):
    s = session(load_onnx("host/models/mlp.onnx"), CONFIGS["default"])
    x = {"input": digits.x_test[0].reshape(1, 64).astype(np.float32)}
    first, second = s.run(x), s.run(x)
    assert sum(first.counters["tag_misses"]) == 2 and sum(first.counters["tag_hits"]) == 0
    assert sum(second.counters["tag_hits"]) == 2 and sum(second.counters["tag_misses"]) == 0
    assert second.counters["dram_read_bytes"] < first.counters["dram_read_bytes"]


def test_check_catches_a_wrong_result(digits):
    s = session(load_onnx("host/models/mlp.onnx"), CONFIGS["default"])
    blob = s.model.place.blobs["fc2"]
    s.driver.write_mem(s.const_base + blob.dram, bytes(len(blob.data)))  # zero fc2's weights
    s.driver.invalidate_tags()
    with pytest.raises(MismatchError, match="logits"):
        s.run({"input": digits.x_test[3].reshape(1, 64).astype(np.float32)})


def test_more_blobs_than_tag_slots_fall_back_to_streaming(digits):
    cfg = NPUConfig(tag_slots=2)
    graph = load_onnx("host/models/moe.onnx")
    s = session(graph, cfg)
    assert sum(1 for b in s.model.place.blobs.values() if b.slot) == 2
    for i in range(6):
        s.run({"input": digits.x_test[i].reshape(1, 64).astype(np.float32)})


def test_layout_permutation_roundtrip(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (2, 3, 4, 5))
    lay = Layout.nhwc(x.shape)
    dev = lay.to_device(x)
    assert np.array_equal(dev, x.transpose(0, 2, 3, 1).ravel())
    assert np.array_equal(lay.from_device(dev, (2, 60)), x.reshape(2, 60))
    perm = lay.row_permutation(2)
    assert np.array_equal(x.reshape(2, 60)[:, perm], dev.reshape(2, 60))


# ---- errors ----------------------------------------------------------------------------------


def test_unsupported_batched_matmul():
    b = GraphBuilder("bmm")
    x = b.input("x", (2, 3, 4), scale=0.1)
    b.output(b.qgemm(x, np.ones((2, 4, 5), np.int8), None, out_scale=1.0), "y")
    with pytest.raises(UnsupportedOpError, match="batched"):
        compile_model(b.build(), CONFIGS["default"])


def test_tensor_too_big_for_the_scratchpad():
    b = GraphBuilder("big")
    x = b.input("x", (2, 6000), scale=0.1)  # one row pair beyond the partition
    b.output(b.qgemm(x, np.ones((6000, 1), np.int8), None, out_scale=1.0), "y")
    with pytest.raises(CompileError, match="scratchpad"):
        compile_model(b.build(), CONFIGS["small"])


def test_program_too_long_for_the_bank():
    with pytest.raises(CompileError, match="instruction bank holds 64"):
        compile_model(load_onnx("host/models/moe.onnx"), NPUConfig(imem_depth=64))


@pytest.mark.parametrize("units, match", [
    ([["fc1"], ["fc1", "fc2"]], "node in units"),
    ([["fc1"]], "belongs to no unit"),
    ([["fc1"], ["nope"]], "no node 'nope'"),
    ([["fc1", "input_QuantizeLinear"], ["fc2"]], "cannot be part of a unit"),
])
def test_bad_unit_lists(units, match):
    g, _ = simplify(load_onnx("host/models/mlp.onnx"))
    with pytest.raises(CompileError, match=match):
        compile_model(g, CONFIGS["default"], units, simplified=True)


def test_session_refuses_another_profile():
    model = compile_model(load_onnx("host/models/mlp.onnx"), CONFIGS["small"])
    with pytest.raises(ValueError, match="compiled for"):
        Session(NPUDriver(GoldenDevice(CONFIGS["default"])), model)


# ---- program object, cost model, CLI -------------------------------------------------------


def test_program_object_and_disasm():
    model = compile_model(load_onnx("host/models/cnn.onnx"), CONFIGS["default"], fuse=False)
    assert [u.nodes for u in model.units] == initial_units(model.graph)
    text = model.disasm()
    for u in model.units:
        assert f"region.begin {u.id}" in text
    again = asm.assemble(model.source)
    assert again.words == model.program.words
    res = model.resources()
    assert res["instructions"] == len(model.program) <= res["imem_depth"]
    assert res["tag_slots"] == 3 and model.partitions[0] == (0, res["resident_weight_bytes"])


def test_cost_model_refits_on_measurements(digits):
    s = session(load_onnx("host/models/cnn.onnx"), CONFIGS["default"])
    cost = CostModel(s.model.config)
    for i in range(4):
        r = s.run({"input": digits.x_test[i].reshape(1, 1, 8, 8).astype(np.float32)})
        for t in r.trace:
            cost.observe(s.model.regions[t.region].resources["work"], t.cycles)
    before = cost.error()
    after = cost.fit()
    assert after < before and after < 0.25, (before, after)


def test_cost_model_learns_a_slower_memory():
    """Units with a golden timeline on a device whose memory takes 12 more cycles
    per transfer than the simulation's: the refit finds the 12."""
    cost = CostModel(CONFIGS["default"])
    base = dict.fromkeys(("instructions", "load_bytes", "tagged_bytes", "store_bytes",
                          "wload_rows", "gemm_rows", "gemms", "vector_ops", "vector_bytes"), 0)
    for timeline, loads, stores in ((600, 3, 1), (230, 1, 1), (1500, 6, 2), (150, 2, 0)):
        work = {**base, "timeline": timeline, "loads": loads, "stores": stores}
        assert cost.predict(work) == timeline
        cost.observe(work, timeline + 12 * (loads + stores))
        cost.observe(work, timeline + 500, cold=True)  # weights loading: left out
    assert len(cost.samples) == 4
    assert cost.error() > 0.05
    assert cost.fit() < 0.01 and abs(cost.transfer_extra - 12) < 0.1, cost.transfer_extra


def test_cli_commands(capsys):
    assert npu_main(["compile", "mlp"]) == 0
    assert "instructions" in capsys.readouterr().out
    assert npu_main(["disasm", "cnn", "--config", "small"]) == 0
    assert "region.begin 1" in capsys.readouterr().out
    assert npu_main(["info"]) == 0
    assert "peak MACs/cycle" in capsys.readouterr().out
    assert npu_main(["run", "moe", "--digits", "5"]) == 0
    out = capsys.readouterr().out
    assert "5/5 results equal the reference" in out and "accuracy" in out


def test_run_shows_each_units_bottleneck(capsys, monkeypatch):
    """`npu run`'s per-unit table classifies each unit from its counters by cause."""
    monkeypatch.setenv("COLUMNS", "200")
    assert npu_main(["run", "cnn", "--digits", "2", "--per-layer"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "-bound (" in line]
    assert len(rows) == 5, rows  # one per layer of the cnn
    assert any("compute-bound (array" in r for r in rows), rows
