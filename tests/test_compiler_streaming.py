"""Streaming lowering (host/compiler/stream.py): GEMM weights and convolution
images that do not fit the scratchpad stream through it in double-buffered
steps, the uniform ones in one hardware loop.

Every program runs on the golden NPU through the runtime (``Session(check=True)``:
bit for bit against the reference interpreter), with balanced token channels and
no races between the queues (tests/test_compiler_tiling.py's checks).
"""


import numpy as np
import pytest
from test_compiler_tiling import race_free

from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.compiler import CompileError, compile_model, simplify
from host.compiler.stream import pipeline, transfers
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.reference import run_reference
from host.runtime import Session
from verif.mlperf_shapes import fc_autoencoder, resnet8_convs, streamed_gemm

SMALL, DEFAULT = CONFIGS["small"], CONFIGS["default"]


def run_checked(graph, config, rng, runs=2):
    """Compile, check races, run ``runs`` random inputs against the reference with
    every token channel empty at the end of each run (loop bodies pop and push per
    pass, so tokens balance at run time, not line by line); return the model."""
    model = compile_model(graph, config)
    device = GoldenDevice(config)
    s = Session(NPUDriver(device), model, check=True)
    s.load()
    assert race_free(model, s)
    for _ in range(runs):
        x = {name: rng.integers(-128, 128, graph.tensors[name].shape, dtype=np.int8)
             for name in graph.inputs}
        r = s.run(x)  # raises MismatchError on any difference from the reference
        assert r.checked
        for k, v in run_reference(graph, x).items():
            assert np.array_equal(r.outputs[k], v), k
        left = {ch: len(q) for ch, q in device.machine.tokens.items() if q}
        assert not left, f"tokens left at the end of the run: {left}"
    return model


def steps(model) -> list:
    return [u.resources.get("streamed_steps") for u in model.units]


def test_streamed_gemm_runs_in_a_hardware_loop(seed):
    rng = np.random.default_rng(seed)
    model = run_checked(streamed_gemm(seed), SMALL, rng)
    (n,) = steps(model)
    assert n >= 4
    assert "loop " in model.source and "steps_" in model.source
    # The program does not grow with the step count (only the last, partial step's
    # shape changes its code). A one-row GEMM streams reduction chunks (GEMV): its
    # steps grow with the depth.
    sizes = {}
    for k in (512, 1024, 2048):
        deep = compile_model(streamed_gemm(seed, k=k), SMALL)
        assert steps(deep)[0] > n
        sizes[k] = deep.instructions
    # (up to two steps, a loop run's remainder modulo the GEMV's three buffers, sit
    # outside the loop)
    assert max(sizes.values()) <= model.instructions + 16, sizes


def test_fc_autoencoder_streams_on_the_default_profile(seed):
    rng = np.random.default_rng(seed)
    model = run_checked(fc_autoencoder(seed), DEFAULT, rng, runs=1)
    assert model.instructions <= DEFAULT.imem_depth
    first, *_, last = steps(model)
    assert first and last  # the 640-wide layers stream their weights


@pytest.mark.slow
def test_fc_autoencoder_on_the_small_profile(seed):
    """Every layer compiles on the small NPU, and the whole model fits its bank."""
    rng = np.random.default_rng(seed)
    model = run_checked(fc_autoencoder(seed), SMALL, rng, runs=1)
    assert all(steps(model)[i] for i in (0, 1, 2, 3, 6, 7, 8, 9))


def conv_graph(rng, c, h, w, oc, pads, strides):
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, h, w), scale=0.05, zp=int(rng.integers(-20, 20)))
    y = b.qconv(x, rng.integers(-128, 128, (oc, c, 3, 3), dtype=np.int8),
                rng.integers(-2000, 2000, oc), pads=pads, strides=strides, w_scale=0.002,
                out_scale=0.05, out_zp=-3, relu=True)
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("geom", [
    (16, 32, 32, 16, (1, 1, 1, 1), (1, 1)),  # ResNet-8's first stage
    (16, 32, 32, 16, (0, 0, 0, 0), (1, 1)),  # no halo padding
    (16, 32, 32, 32, (1, 1, 1, 1), (2, 2)),  # strided, a stage boundary
    (5, 40, 37, 12, (2, 1, 0, 2), (1, 2)),  # uneven pads, partial bands and tiles
], ids=["pad1", "pad0", "stride2", "uneven"])
def test_convolution_streams_bands_with_halos(geom, seed):
    rng = np.random.default_rng(seed)
    model = run_checked(conv_graph(rng, *geom), SMALL, rng)
    (n,) = steps(model)
    assert n >= 2
    assert model.instructions <= SMALL.imem_depth


def test_resnet8_stack_on_the_default_profile(seed):
    rng = np.random.default_rng(seed)
    run_checked(resnet8_convs(seed), DEFAULT, rng, runs=1)


@pytest.mark.slow
def test_resnet8_stack_on_the_small_profile(seed):
    rng = np.random.default_rng(seed)
    model = run_checked(resnet8_convs(seed), SMALL, rng, runs=1)
    assert steps(model)[1] and steps(model)[2]


def test_a_column_tile_larger_than_half_the_room_is_refused():
    # K = 4000 at two rows (the GEMM mapping: a one-row GEMM streams as a GEMV, in
    # chunks of 4 inputs): one 4-column tile holds 16 KB of weights, more than the
    # small NPU has.
    rng = np.random.default_rng(0)
    b = GraphBuilder("deep")
    x = b.input("x", (2, 4000), scale=0.05, zp=0)
    b.output(b.qgemm(x, rng.integers(-128, 128, (4000, 8), dtype=np.int8),
                     rng.integers(-2000, 2000, 8), w_scale=1e-4, out_scale=0.05), "y")
    with pytest.raises(CompileError, match="splitting the reduction"):
        compile_model(b.build(), SMALL)


@pytest.mark.parametrize("nbytes", [1, 4096, 5152, 4097 * 3, 256 * 4096 + 7])
def test_transfers_cover_the_bytes(nbytes):
    parts = transfers(nbytes)
    assert sum(rows * row for _, rows, row in parts) == nbytes
    assert all(rows <= 256 and row <= 4096 for _, rows, row in parts)
    at = 0
    for off, rows, row in parts:
        assert off == at
        at += rows * row


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_pipeline_balances_tokens_and_loops_uniform_steps(n):
    log = []

    class E:
        def forget(self):
            log.append("forget")

        def new_label(self, stem):
            return stem

        def op(self, text):
            log.append(text)

        def loop_end(self, label):
            log.append("end")

    pipeline(E(), n, lambda s, pop: log.append(("load", s, pop)),
             lambda s, push: log.append(("compute", s, push)),
             lambda: None, lambda: None, lambda s: True)
    loads = [x for x in log if x[0] == "load"]
    computes = [x for x in log if x[0] == "compute"]
    pushes = sum(1 for x in computes if x[2])
    pops = sum(1 for x in loads if x[2] == "next")
    assert pushes == pops  # compute>load
    looped = n - 2 if n >= 4 else 0
    assert sum(1 for x in log if isinstance(x, str) and x.startswith("loop")) == (looped > 0)
    assert len(computes) == n - max(0, looped - 1)


@pytest.mark.rtl
def test_streamed_gemm_on_the_rtl(seed):
    """The weights stream through the small NPU under Verilator: results, exact
    counters, trace and cycles equal the golden model's, cold and warm."""
    from verif.fastsim import run_scenario

    run_scenario("verif.mlperf_shapes:streamed_gemm_vs_golden", "small", seed=seed)


def test_per_channel_scales_stream_with_their_weights(seed):
    """Per-channel multipliers and shifts sit in each column tile's constants: a
    streamed group brings them along (a partial last tile included), and a
    streamed convolution loads its table with its weights."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("pc")
    x = b.input("x", (1, 256), scale=0.05, zp=3)
    y = b.qgemm(x, rng.integers(-128, 128, (256, 130), dtype=np.int8),
                rng.integers(-3000, 3000, 130), w_scale=10.0 ** rng.uniform(-4, -2, 130),
                out_scale=0.2, out_zp=-5)
    b.output(y, "y")
    c = b.input("c", (1, 16, 32, 32), scale=0.05, zp=3)
    z = b.qconv(c, rng.integers(-128, 128, (12, 16, 3, 3), dtype=np.int8), None,
                pads=(1, 1, 1, 1), w_scale=10.0 ** rng.uniform(-4, -2, 12), out_scale=0.1,
                relu=True)
    b.output(z, "z")
    model = run_checked(b.build(), SMALL, rng)
    assert all(steps(model)) and "tab=1" in model.source


def separable_chain(rng, c, side, layers):
    """A chain of depthwise 3x3 and pointwise convolutions (``layers``: "dw" or the
    pointwise output channels), each reading the one before, MobileNet-like."""
    b = GraphBuilder("chain")
    h = b.input("x", (1, c, side, side), scale=0.05, zp=3)
    for layer in layers:
        if layer == "dw":
            w, group, pads = rng.integers(-128, 128, (c, 1, 3, 3), dtype=np.int8), c, (1,) * 4
        else:
            w, group, pads = rng.integers(-128, 128, (layer, c, 1, 1), dtype=np.int8), 1, None
            c = layer
        h = b.qconv(h, w, rng.integers(-999, 999, c).astype(np.int32), pads=pads or (0,) * 4,
                    w_scale=0.01, out_scale=0.4, relu=True, group=group)
    b.output(h, "y")
    return b.build()


@pytest.mark.parametrize("layers", [["dw", 96, "dw", 64], [96, "dw", 64, "dw", 96]],
                         ids=["from-depthwise", "from-gemm"])
def test_a_separable_chain_streams_every_gemm_in_one_unit(layers, seed):
    """Depthwise + pointwise pairs fused into one unit, whose pointwise weights are
    not resident: every GEMM streams its weights (two pairs of buffers taking turns),
    the intermediates stay on chip, and only the input and output cross DRAM."""
    rng = np.random.default_rng(seed)
    graph, _ = simplify(separable_chain(rng, 64, 6, layers))
    unit = [n.name for n in graph.nodes if n.device == "npu"]
    model = compile_model(graph, DEFAULT, [unit], simplified=True, weight_budget=0)
    (u,) = model.units
    gemms = sum(isinstance(x, int) for x in layers)
    assert f"a chain streaming the weights of {gemms} GEMMs" in u.instructions[1]
    assert u.resources["streamed_steps"] == sum(x // 8 for x in layers if x != "dw")
    device = GoldenDevice(DEFAULT)
    s = Session(NPUDriver(device), model, check=True)
    s.load()
    assert race_free(model, s)
    for _ in range(2):
        x = {"x": rng.integers(-128, 128, (1, 64, 6, 6), dtype=np.int8)}
        r = s.run(x)
        assert r.checked
        assert not {ch: len(q) for ch, q in device.machine.tokens.items() if q}
        assert r.counters["dram_write_bytes"] == graph.tensors["y"].size
