"""Float-free test graphs at the MLPerf Tiny reference models' sizes.

Built through :class:`host.builder.GraphBuilder` with seeded int8 weights (no
training, no onnxruntime): the FC autoencoder's dense stack and a ResNet-8-like
stack of 3x3 convolutions with a residual add. They exercise the compiler's
streaming of weights and activations through the scratchpad; the real ONNX
models (tests/zoo/mlperf/) check the import path.
"""

from __future__ import annotations

import numpy as np

from host.builder import GraphBuilder
from host.ir import Graph

AUTOENCODER_WIDTHS = (640, 128, 128, 128, 128, 8, 128, 128, 128, 128, 640)


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _scale(fan_in: int) -> float:
    """A weight scale that keeps outputs of random int8 weights inside int8."""
    return 1.0 / (40.0 * np.sqrt(fan_in))


def fc_autoencoder(seed: int = 0, widths=AUTOENCODER_WIDTHS) -> Graph:
    """The FC autoencoder's dense layers (640-128-...-8-...-128-640), ReLU between."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("fc_autoencoder")
    x = b.input("x", (1, widths[0]), scale=0.05, zp=0)
    for i, (k, n) in enumerate(zip(widths, widths[1:], strict=False)):
        last = i == len(widths) - 2
        x = b.qgemm(x, _int8(rng, (k, n)), rng.integers(-2000, 2000, n),
                    w_scale=_scale(k) * 40, out_scale=0.05, out_zp=0 if last else -128,
                    relu=not last)
    b.output(x, "y")
    return b.build()


def resnet8_convs(seed: int = 0, hw: int = 32, c: int = 16) -> Graph:
    """A ResNet-8 first stage: stem conv (3 -> c), then a residual block of two
    3x3 convolutions (c -> c, padding 1) whose output adds the block's input."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("resnet8_convs")
    x = b.input("x", (1, 3, hw, hw), scale=0.05, zp=0)

    def conv(t, cin, cout, relu=True):
        return b.qconv(t, _int8(rng, (cout, cin, 3, 3)), rng.integers(-2000, 2000, cout),
                       pads=(1, 1, 1, 1), w_scale=_scale(9 * cin) * 40, out_scale=0.05,
                       out_zp=-128 if relu else 0, relu=relu)

    stem = conv(x, 3, c)
    h = conv(stem, c, c)
    h = conv(h, c, c, relu=False)
    y = b.qadd(h, stem, out_scale=0.05, out_zp=-128, relu=True)
    b.output(y, "y")
    return b.build()


def streamed_gemm(seed: int = 0, k: int = 256, n: int = 128) -> Graph:
    """One dense layer (1 x k @ k x n) whose weights do not fit the small NPU's
    working partition: they stream through it."""
    return fc_autoencoder(seed, (k, n))


def streamed_gemm_vs_golden(device, config, seed):
    """A streamed GEMM on the RTL and the golden model side by side: outputs equal
    the reference interpreter; exact counters and trace fields agree (the counters by
    cause and the regions' cycles too where the golden model calls the run exact),
    and the runs' cycles differ by a run's fixed cost (the empty program's
    difference, as in :func:`verif.scenarios.cost_model`). A scenario for
    :func:`verif.rtl_device.run_scenario`."""
    from firmware import asm
    from host.compiler import compile_model
    from host.device import GoldenDevice
    from host.driver import NPUDriver
    from host.runtime import Session
    from verif.scenarios import TABLE, Job, Pair, assert_same_inference

    pair = Pair(device, config)
    pair.run_job(Job("end", asm.assemble("end\n"), TABLE[:config.partitions]),
                 check_dram=False)
    base = pair.rtl.counters()["cycles"] - pair.gold.counters()["cycles"]
    import os

    graph = streamed_gemm(seed, *(int(v) for v in os.environ.get("NPU_STREAM_KN", "256,128")
                                  .split(",")))
    sessions = []
    golden = GoldenDevice(config)
    for dev in (device, golden):
        drv = NPUDriver(dev)
        model = compile_model(graph, drv.config)
        steps = model.units[0].resources.get("streamed_steps")
        assert steps and steps >= 4, f"the weights do not stream in a loop ({steps} steps)"
        s = Session(drv, model, check=True)
        s.load()
        sessions.append(s)
    rng = np.random.default_rng(seed)
    for i in range(2):  # cold (tags miss) and warm
        x = {"x": rng.integers(-128, 128, graph.tensors["x"].shape, dtype=np.int8)}
        rtl, gold = (s.run(x) for s in sessions)
        # cycles, counters by cause and region cycles where the golden model promises them
        exact = golden.machine.last.cycles_exact
        assert_same_inference(f"streamed gemm run {i}", rtl, gold, cycles=exact)
        assert rtl.cycles - gold.cycles == base, \
            f"run {i}: RTL {rtl.cycles} cycles, golden {gold.cycles}, a run's fixed cost {base}"
        print(f"streamed gemm run {i}: {rtl.cycles} cycles on the RTL, golden {gold.cycles} "
              f"(+{base}, a run's fixed cost); counters by cause and regions "
              f"{'compared: exact' if exact else 'not compared: the golden model estimates'}")
