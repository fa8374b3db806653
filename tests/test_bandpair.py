"""Depthwise + pointwise pairs streamed together in bands (host/compiler/bandpair.py):

* the fused pair is bit-exact with the reference interpreter, and only its input
  and output cross DRAM (stride 1 and 2, a partial channel group);
* the number of bands is the one ``pair_cycles`` predicts fastest, and the
  prediction follows the golden model band count by band count;
* MobileNet's 48x48 and 24x24 pairs run fused on ``default``.
"""

import re

import numpy as np
import pytest

from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.compiler import CompileError, bandpair, compile_model, simplify, stream
from host.compiler.variants import Variant
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.runtime import Session

CONFIG = CONFIGS["default"]


def _pair_graph(rng, c, side, stride, oc):
    """A depthwise 3x3 convolution and a pointwise one after it, too large for the
    working partition whole."""
    b = GraphBuilder("pair")
    x = b.input("x", (1, c, side, side), scale=0.05, zp=3)
    pads = (1, 1, 1, 1) if stride == 1 else (0, 0, 1, 1)
    h = b.qconv(x, rng.integers(-128, 128, (c, 1, 3, 3), dtype=np.int8),
                rng.integers(-999, 999, c).astype(np.int32), strides=(stride, stride),
                pads=pads, w_scale=0.01, out_scale=0.4, relu=True, group=c)
    h = b.qconv(h, rng.integers(-128, 128, (oc, c, 1, 1), dtype=np.int8),
                rng.integers(-999, 999, oc).astype(np.int32), w_scale=0.01,
                out_scale=0.4, out_zp=-3, relu=True)
    b.output(h, "y")
    graph, _ = simplify(b.build())
    return graph


def _run(graph, model, rng, runs=2):
    s = Session(NPUDriver(GoldenDevice(CONFIG)), model, check=True)
    s.load()
    shape = graph.tensors[graph.inputs[0]].shape
    x = {graph.inputs[0]: rng.integers(-128, 128, shape, dtype=np.int8)}
    results = [s.run(x) for _ in range(runs)]  # the second hits the weight tags
    assert all(r.checked for r in results)
    return results[-1]


@pytest.mark.parametrize("c, side, stride, oc", [(8, 48, 1, 16), (16, 64, 2, 32)])
def test_fused_pair_streams_bands_with_the_intermediate_on_chip(c, side, stride, oc, seed):
    rng = np.random.default_rng(seed)
    graph = _pair_graph(rng, c, side, stride, oc)
    model = compile_model(graph, CONFIG)
    assert len(model.regions) == 1, model.fusion  # the default plan fuses the pair
    assert "streamed image" in model.source
    r = _run(graph, model, rng)
    out = graph.tensors[graph.nodes[-1].outputs[0]].size
    # the depthwise rows never leave (two one-byte stores prime the band pipeline)
    assert r.counters["dram_write_bytes"] == out + 2
    # the input once, and the halo rows of each band again (padded rows' width at most)
    bands = int(re.search(r"streamed image: (\d+) bands", model.source).group(1))
    halo = bands * (3 - stride) * (side + 2) * c
    assert c * side * side < r.counters["dram_read_bytes"] <= c * side * side + halo


def test_band_count_follows_the_golden_model(seed, monkeypatch):
    """``pair_cycles`` for each band count, the bands even or the first one
    shorter, within 2 % of the golden model's warm cycles, and the bands it picks
    the golden model's fastest or within 1 % of it."""
    rng = np.random.default_rng(seed)
    graph = _pair_graph(rng, 8, 48, 1, 16)
    unit = [n.name for n in graph.nodes if n.device == "npu"]
    predicted, measured, chosen = {}, {}, None
    real = bandpair.pair_cycles
    for way_key in [(m, t) for m in range(bandpair.MORE_BANDS + 1) for t in stream.TAPERS]:
        def one_way(low, u, why, way_key=way_key):
            n, then = u.nodes
            way = stream._ConvStream(low, u, n, way_key[0], then=then, taper=way_key[1])
            stats = way.emit()
            _, _, _, ow = low.tensor[n.outputs[0]].shape
            predicted[way_key] = real(low.config, n, then, way.bands, ow, way.first_load,
                                      way.last_store)
            return stats

        monkeypatch.setattr(bandpair, "stream_pair", one_way)
        try:
            model = compile_model(graph, CONFIG, [unit], simplified=True)
        except CompileError:  # (more bands than rows, or no shorter first): not a way
            continue
        measured[way_key] = _run(graph, model, rng).counters["cycles"]
    monkeypatch.undo()
    model = compile_model(graph, CONFIG, [unit], simplified=True)
    chosen = _run(graph, model, rng).counters["cycles"]
    assert len(measured) >= 8
    for key, cycles in measured.items():
        assert abs(predicted[key] - cycles) <= 0.02 * cycles, (key, predicted, measured)
    assert chosen <= 1.01 * min(measured.values()), (chosen, measured)
    assert chosen < 0.85 * measured[0, 1]  # fewest bands: the column tiles share rows


def test_a_variant_sets_the_band_count(seed):
    """The unit's variant's ``extra_bands`` overrides the predicted band count, in
    bands as equal as they can be (no shorter first band)."""
    rng = np.random.default_rng(seed)
    graph = _pair_graph(rng, 8, 48, 1, 16)
    unit = [n.name for n in graph.nodes if n.device == "npu"]
    bands = {}
    for extra in (0, 2):
        model = compile_model(graph, CONFIG, [unit], simplified=True,
                              variants={tuple(unit): Variant(extra_bands=extra)})
        bands[extra] = int(model.source.split(" bands of")[0].rsplit(" ", 1)[1])
        assert ", the first of" not in model.source
        _run(graph, model, rng, runs=1)
    assert bands[2] == bands[0] + 2
