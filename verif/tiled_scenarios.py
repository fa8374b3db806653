"""Convolutions streamed image and weights together (:mod:`host.compiler.tiled2d`) on
the RTL beside the golden model: a scenario for :func:`verif.fastsim.run_scenario`.

The layers are sized for the ``small`` profile (16 KiB scratchpad): their padded
images do not fit beside their weights, and their weights do not fit beside a
band of their images, so they stream in weight groups x image bands.
"""

from __future__ import annotations

import numpy as np

from host.builder import GraphBuilder
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.runtime import Session
from verif.scenarios import assert_same_inference, golden_cycles_exact

#: (input channels, output channels, height, width, kernel, stride, pads, group) of a
#: dense 3x3 stride-2 layer of 32 channels on 32x32 (alone, a 16 -> 32 one streams its
#: image only, in bands by phase, beside its 4.5 KB of weights) and a depthwise one
#: (DS-CNN's, on the channel-diagonal GEMMs of a build without the depthwise engine).
LAYERS = {
    "dense_32x32_s2": (32, 32, 32, 32, 3, 2, (0, 0, 1, 1), 1),
    "depthwise_64_25x5": (64, 64, 25, 5, 3, 1, (1, 1, 1, 1), 64),
}

CYCLE_SLACK = 4
"""Cycles a run may differ from the golden model's where it flags them as an estimate
(its loads overlap compute on the scratchpad's banks; measured: 0 on the dense layer,
3 on the depthwise one)."""


def layer_graph(rng, c, oc, h, w, k, stride, pads, group):
    """One quantized convolution with a ReLU, random weights and biases."""
    b = GraphBuilder("tiled")
    x = b.input("x", (1, c, h, w), scale=0.05, zp=3)
    weight = rng.integers(-128, 128, (oc, c // group, k, k), dtype=np.int8)
    bias = rng.integers(-3000, 3000, oc).astype(np.int32)
    b.output(b.qconv(x, weight, bias, strides=(stride, stride), pads=pads, w_scale=0.01,
                     out_scale=0.4, out_zp=-5, relu=True, group=group), "y")
    return b.build()


def compile_streamed(graph, config):
    """``graph`` compiled with no resident weights (they stream); raises AssertionError
    unless its convolution streams image and weights together."""
    model = compile_model(graph, config, weight_budget=0)
    note = model.units[0].instructions[1]
    assert "streamed image and weights" in note, note
    return model


def tiled2d_vs_golden(device, config, seed):
    """Each of :data:`LAYERS` on the RTL and the golden model side by side, a cold and
    a warm run: outputs equal the reference interpreter on both, every exact counter
    and trace field agree, and the cycles too where the golden model counts them
    exactly, and within :data:`CYCLE_SLACK` where it flags them as an estimate."""
    rng = np.random.default_rng(seed)
    for name, shape in LAYERS.items():
        graph = layer_graph(rng, *shape)
        sessions = []
        for dev in (device, GoldenDevice(config)):
            drv = NPUDriver(dev)
            s = Session(drv, compile_streamed(graph, drv.config), check=True)
            s.load()
            sessions.append(s)
        gold_device = sessions[1].driver.device
        for i in range(2):
            x = {"x": rng.integers(-128, 128, graph.tensors["x"].shape, dtype=np.int8)}
            mark = gold_device.machine.inexact_runs
            rtl, gold = (s.run(x) for s in sessions)
            exact = golden_cycles_exact(gold_device, mark)
            assert_same_inference(f"{name} run {i}", rtl, gold, cycles=exact)
            assert abs(rtl.cycles - gold.cycles) <= CYCLE_SLACK, \
                f"{name} run {i}: RTL {rtl.cycles} cycles, golden {gold.cycles}"
            print(f"{name} run {i}: {rtl.cycles} cycles on the RTL, {gold.cycles} golden "
                  f"({'exact' if exact else 'an estimate'})")
