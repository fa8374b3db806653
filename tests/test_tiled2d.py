"""Convolutions that stream image and weights together (host/compiler/tiled2d.py) on
the golden model, checked against the reference interpreter; the MLPerf Tiny zoo on
the ``small`` profile."""

import dataclasses

import numpy as np
import pytest

from firmware.config import CONFIGS
from host.cli import model_path
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.model_scenarios import model_inputs
from verif.tiled_scenarios import LAYERS, compile_streamed, layer_graph
from verif.zoo import MLPERF_NAMES

SMALL = CONFIGS["small"]


def _run_checked(model, config, x, runs=2):
    """Run ``model`` (outputs checked against the reference interpreter); the last run."""
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    for _ in range(runs):
        r = s.run(x)
        assert r.checked
    return r


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_streamed_both_ways_is_bit_exact(name, seed):
    """A dense layer and a depthwise one (channel-diagonal: ``small`` has no depthwise
    engine) whose images do not fit beside their weights, nor their weights beside a
    band of their image: several weight groups, each streaming the image in bands."""
    rng = np.random.default_rng(seed)
    graph = layer_graph(rng, *LAYERS[name])
    model = compile_streamed(graph, SMALL)
    unit = model.units[0]
    assert unit.resources["streamed_steps"] >= 4
    assert "loop" in "\n".join(unit.instructions)
    x = {"x": rng.integers(-128, 128, graph.tensors["x"].shape, dtype=np.int8)}
    r = _run_checked(model, SMALL, x)
    assert r.counters["dram_read_bytes"] > graph.tensors["x"].size  # the image re-read


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_streamed_both_ways_code_does_not_grow_with_the_image(name):
    """Bands and weight groups run in hardware loops: a 4x taller image (more bands,
    other groups) takes about the same program."""
    c, oc, h, w, k, stride, pads, group = LAYERS[name]
    sizes = [len(compile_streamed(layer_graph(np.random.default_rng(0), c, oc, hh, w, k,
                                              stride, pads, group), SMALL).program)
             for hh in (2 * h, 4 * h)]
    assert abs(sizes[1] - sizes[0]) <= 8, sizes
    assert max(sizes) < 300, sizes


#: ``small`` with instruction banks deep enough for the zoo's programs (2,166 to 4,375
#: instructions on it; its 1024-deep banks hold the FC autoencoder's only).
SMALL_DEEP = dataclasses.replace(SMALL, imem_depth=8192)


@pytest.mark.slow
@pytest.mark.parametrize("name", MLPERF_NAMES)
def test_zoo_runs_on_the_small_scratchpad(name):
    """Every MLPerf Tiny model compiles for the 16 KiB scratchpad, 4x4 array and no
    depthwise engine of ``small`` and runs its sample inputs on the golden model,
    every output equal to the reference interpreter."""
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    model = compile_model(graph, SMALL_DEEP)
    s = Session(NPUDriver(GoldenDevice(SMALL_DEEP)), model, check=True)
    s.load()
    for x in model_inputs(name, graph)[:2]:
        assert s.run(x).checked
