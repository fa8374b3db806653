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
