"""Float-free convolution layers for the mappings of :mod:`host.compiler.convrows`.

One layer per graph, built through :class:`host.builder.GraphBuilder` with seeded
int8 weights: stride 1 over a padded width (the long GEMM), stride 2 with its rows
copied by phase, asymmetric padding, pointwise layers (a GEMM over all pixels,
whole or in M tiles that overlap their loads and stores),
weights too large to leave room for image bands (streamed weights), and a batch.
"""

from __future__ import annotations

import os

import numpy as np

from host.builder import GraphBuilder
from host.ir import Graph

#: name -> (C, H, W, OC, K, strides, pads, batch): the layers the tests and the RTL
#: scenario run.
LAYERS = {
    "long_pad1": (16, 16, 16, 16, 3, (1, 1), (1, 1, 1, 1), 1),
    "phased_stride2": (16, 16, 16, 32, 3, (2, 2), (0, 0, 1, 1), 1),
    "stride2_pad1": (8, 15, 13, 12, 3, (2, 2), (1, 1, 1, 1), 1),
    "pointwise_stride2": (16, 16, 16, 32, 1, (2, 2), (0, 0, 0, 0), 1),
    "pointwise_stride2_bands": (16, 32, 32, 32, 1, (2, 2), (0, 0, 0, 0), 1),
    "phased_stride2_bands": (16, 32, 32, 32, 3, (2, 2), (0, 0, 1, 1), 1),
    "valid": (8, 12, 12, 8, 3, (1, 1), (0, 0, 0, 0), 1),
    "uneven": (5, 17, 11, 12, 3, (1, 2), (2, 1, 0, 2), 2),
    "stem_c3": (3, 32, 32, 16, 3, (1, 1), (1, 1, 1, 1), 1),
    "pointwise": (64, 25, 5, 64, 1, (1, 1), (0, 0, 0, 0), 1),
    "pointwise_m_tiles": (32, 24, 24, 32, 1, (1, 1), (0, 0, 0, 0), 1),
    "weights_stream": (64, 8, 8, 64, 3, (1, 1), (1, 1, 1, 1), 1),
}


def conv_layer(seed: int, c: int, h: int, w: int, oc: int, k, strides, pads,
               batch: int = 1) -> Graph:
    """One convolution (``k x k``, or ``kh x kw`` for a pair ``k``; per-tensor
    scales, ReLU) of a ``batch x c x h x w`` input with a nonzero zero point (the
    pad value is a real value)."""
    kh, kw = (k, k) if isinstance(k, int) else k
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    x = b.input("x", (batch, c, h, w), scale=0.05, zp=int(rng.integers(-20, 20)))
    y = b.qconv(x, rng.integers(-128, 128, (oc, c, kh, kw), dtype=np.int8),
                rng.integers(-2000, 2000, oc), pads=pads, strides=strides,
                w_scale=1.0 / (40.0 * np.sqrt(c * kh * kw)), out_scale=0.05, out_zp=-3,
                relu=True)
    b.output(y, "y")
    return b.build()


def conv_rows_vs_golden(device, config, seed):
    """Each of :data:`LAYERS` (``NPU_LAYERS``: a comma-separated subset) on the RTL
    and the golden model side by side: outputs equal the reference interpreter on
    both, every exact counter and trace field agrees, and so do the cycles where the
    golden model says they are exact. A scenario for
    :func:`verif.rtl_device.run_scenario`."""
    from host.device import GoldenDevice
    from verif.model_scenarios import _checked_session, _run_both
    from verif.scenarios import assert_same_inference

    rng = np.random.default_rng(seed)
    names = [n for n in os.environ.get("NPU_LAYERS", ",".join(LAYERS)).split(",") if n]
    for name in names:
        graph = conv_layer(seed, *LAYERS[name])
        rtl_session, gold_session = (_checked_session(graph, dev) for dev in
                                     (device, GoldenDevice(config)))
        for i in range(2):  # cold (tags miss) and warm
            x = {"x": rng.integers(-128, 128, graph.tensors["x"].shape, dtype=np.int8)}
            rtl, gold, exact = _run_both(rtl_session, gold_session, x)
            assert_same_inference(f"{name} run {i}", rtl, gold, cycles=exact)
            print(f"{name} run {i}: {rtl.cycles} cycles on the RTL, {gold.cycles} golden "
                  f"({'exact' if exact else 'not compared'})")
