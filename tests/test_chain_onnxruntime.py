"""Streamed models (host/compiler/stream.py) against onnxruntime.

Small convolution models, built with ``onnx.helper`` and quantized by
``onnxruntime.quantization`` (QDQ per tensor, int8, as the MLPerf models are):

* a depthwise-separable chain whose pointwise weights outgrow the resident-weight
  budget: its default plan fuses the layers into one unit that streams the GEMMs'
  weights with the intermediates on chip (``_ChainStream``);
* a dense 3x3 convolution over an image too large for the scratchpad: its default
  plan streams the image in bands, the first shorter than the others
  (``_ConvStream``, :func:`host.compiler.stream.band_sizes`).

The golden model's outputs must agree with onnxruntime executing the graph
literally within 1 LSB of the output scale on every element
(:mod:`verif.zoo.check`'s rule). Needs onnxruntime, not torch.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.zoo import oracle
from verif.zoo.check import LSB_SLACK
from verif.zoo.status import output_scales

DEFAULT = CONFIGS["default"]
#: (channels, side, layers, what the compiled source says of the streamed unit):
#: layers are depthwise 3x3 ("dw"), or dense convolutions to that many channels,
#: pointwise (an int) or 3x3 ("3x3", channels), each with a ReLU.
CHAIN = (64, 6, ("dw", 128, "dw", 128, "dw", 128, "dw", 128),
         "a chain streaming the weights of")
"""56 KiB of pointwise weights against the 32 KiB ``default`` keeps resident."""
BANDS = (8, 48, (("3x3", 8),), ", the first of")
"""An 18 KiB image (with its output 36 KiB): too large to hold twice, in bands."""


def conv_model(rng, channels: int, side: int, layers) -> onnx.ModelProto:
    """The float model: ``layers`` over an input of ``channels x side x side``."""
    nodes, inits, c, h = [], [], channels, "x"
    for i, layer in enumerate(layers):
        if layer == "dw":
            w, group, pads = rng.normal(0, 0.3, (c, 1, 3, 3)), c, [1, 1, 1, 1]
        elif isinstance(layer, tuple):  # ("3x3", channels)
            w, group, pads = rng.normal(0, 1 / np.sqrt(9 * c), (layer[1], c, 3, 3)), 1, \
                [1, 1, 1, 1]
            c = layer[1]
        else:
            w, group, pads = rng.normal(0, 1 / np.sqrt(c), (layer, c, 1, 1)), 1, [0] * 4
            c = layer
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [h, f"w{i}", f"b{i}"], [f"c{i}"], group=group,
                                   pads=pads, kernel_shape=list(w.shape[2:])),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        h = f"r{i}"
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    graph = helper.make_graph(
        nodes, "conv_stream",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Rows(CalibrationDataReader):
    def __init__(self, rows):
        self._rows = iter(rows)

    def get_next(self):
        x = next(self._rows, None)
        return None if x is None else {"x": x}


def quantized(tmp_path, model: onnx.ModelProto, calibration) -> str:
    """``model`` as a user quantizes it: quant_pre_process, then quantize_static."""
    float_path, pre, q = tmp_path / "float.onnx", tmp_path / "pre.onnx", tmp_path / "q.onnx"
    onnx.save(model, float_path)
    quant_pre_process(str(float_path), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(q), _Rows(calibration), quant_format=QuantFormat.QDQ,
                    per_channel=False, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return str(q)


@pytest.mark.parametrize("case", [CHAIN, BANDS], ids=["chain", "bands"])
def test_a_streamed_model_agrees_with_onnxruntime(tmp_path, case):
    channels, side, layers, says = case
    rng = np.random.default_rng(7)
    inputs = rng.normal(0, 1, (4, 1, channels, side, side)).astype(np.float32)
    path = quantized(tmp_path, conv_model(rng, channels, side, layers), inputs[:3])
    graph = load_onnx(path, allow_cpu_fallback=True)
    model = compile_model(graph, DEFAULT)
    streamed = [u for u in model.units if any(says in ln for ln in u.instructions[:3])]
    assert streamed, [u.instructions[1] for u in model.units]
    assert all(u.resources["streamed_steps"] > 0 for u in streamed)
    want = oracle.run(oracle.session(path, "literal"), inputs)["y"]
    session = Session(NPUDriver(GoldenDevice(DEFAULT)), model, check=True)
    session.load()
    scale = output_scales(onnx.load(path))["y"]
    for x, expected in zip(inputs, want, strict=True):
        result = session.run({"x": x})
        assert result.checked  # the reference interpreter agrees bit for bit
        if case is CHAIN and len(model.units) == 1:  # the intermediates stay on chip
            assert result.counters["dram_write_bytes"] == expected.size
        lsb = np.abs(np.asarray(result.outputs["y"], np.float64) - expected) / scale
        assert lsb.max() <= LSB_SLACK, f"{lsb.max():.3g} LSB"
