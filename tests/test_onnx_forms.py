"""Forms of supported ops that the NPU runs after a rewrite, checked against onnxruntime.

A dilated convolution runs as the dense kernel with zero taps; ``W - zw`` outside
int8 with a common factor moves the factor into the requantization scale;
``Squeeze``/``Unsqueeze`` become reshapes of int8 values. Each model is built here
with onnx.helper, imported, and run on the reference interpreter, whose outputs
must equal onnxruntime's (graph optimizations off) bit for bit.
"""

from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from firmware.quant import quantize_multiplier
from host.onnx_import import load_onnx
from host.reference import run_reference


def ort_run(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def qlinear_conv(w, zw, *, bias=None, dilations=(1, 1), auto_pad=None, pads=(0, 0, 0, 0),
                 x_shape=(1, 2, 9, 9), opset=17, sy=0.05):
    consts = {"sx": np.float32(0.02), "zx": np.uint8(128), "w": w, "sw": np.float32(0.01),
              "zw": zw, "sy": np.float32(sy), "zy": np.uint8(120)}
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if bias is not None:
        consts["b"] = bias
        names.append("b")
    attrs = {"dilations": list(dilations)}
    attrs.update({"auto_pad": auto_pad} if auto_pad else {"pads": list(pads)})
    node = helper.make_node("QLinearConv", names, ["y"], name="conv", **attrs)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [None] * 4)],
                          initializer=[numpy_helper.from_array(np.asarray(v), k)
                                       for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def assert_equals_onnxruntime(model, graph, rng):
    x = rng.integers(0, 256, graph.tensors["x"].shape, dtype=np.uint8)
    (want,) = ort_run(model, {"x": x})
    got = run_reference(graph, {"x": x})["y"]
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("geometry", [
    dict(dilations=(2, 2), pads=(2, 2, 2, 2)),
    dict(dilations=(2, 3), pads=(1, 0, 2, 3)),
    dict(dilations=(3, 2), pads=(3, 2, 3, 2)),
])
def test_dilated_conv_runs_on_the_npu(geometry, seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(-100, 100, (3, 2, 3, 3), dtype=np.int8)
    m = qlinear_conv(w, np.int8(0), **geometry)
    g = load_onnx(m)
    (conv,) = g.nodes
    assert conv.device == "npu"
    dh, dw = geometry["dilations"]
    assert conv.weight.shape[2:] == (2 * dh + 1, 2 * dw + 1)
    assert_equals_onnxruntime(m, g, rng)


def test_common_weight_factor_moves_into_the_scale(seed):
    rng = np.random.default_rng(seed)
    w = (rng.integers(0, 2, (3, 2, 1, 1)) * 2).astype(np.uint8)  # 0 or 2, minus 254
    w.flat[:2] = 0, 2  # both values: all-equal weights (1 seed in 32) have another factor
    bias = (rng.integers(-50, 50, 3) * 4).astype(np.int32)  # multiples of 4
    m = qlinear_conv(w, np.uint8(254), bias=bias)
    g = load_onnx(m)
    (conv,) = g.nodes
    assert conv.device == "npu" and conv.weight.dtype == np.int8
    assert set(np.unique(conv.weight)) <= {-127, -126}  # (w - 254) / 2
    assert_equals_onnxruntime(m, g, rng)


def test_common_factor_needs_a_divisible_bias(seed):
    rng = np.random.default_rng(seed)
    w = (rng.integers(0, 2, (3, 2, 1, 1)) * 2).astype(np.uint8)
    m = qlinear_conv(w, np.uint8(254), bias=np.array([1, 2, 4], np.int32))
    with pytest.raises(ValueError, match="outside int8"):
        load_onnx(m)
    g = load_onnx(m, allow_cpu_fallback=True)
    (conv,) = g.nodes
    assert conv.device == "cpu" and conv.weight.dtype == np.int16
    assert_equals_onnxruntime(m, g, rng)


def _inexact_output_scale() -> float:
    """An output scale whose ``sx * sw / sy * 255`` needs more than the multiplier's
    31 significant bits."""
    for k in range(1, 1000):
        sy = np.float32(0.05 + k * 1e-5)
        scale = Fraction(float(np.float32(0.02) * np.float32(0.01) / sy)) * 255
        mult, shift = quantize_multiplier(float(scale))
        if Fraction(mult, 1 << shift) != scale:
            return float(sy)
    raise AssertionError("no inexact scale found")


def test_common_factor_needs_an_exact_multiplier():
    w = np.zeros((1, 1, 1, 1), np.uint8)
    m = qlinear_conv(w, np.uint8(255), x_shape=(1, 1, 4, 4), sy=_inexact_output_scale())
    g = load_onnx(m, allow_cpu_fallback=True)
    assert g.nodes[0].device == "cpu"
    assert_equals_onnxruntime(m, g, np.random.default_rng(0))


@pytest.mark.parametrize("opset", [11, 17])
def test_squeeze_unsqueeze_are_int8_reshapes(opset):
    x = helper.make_tensor_value_info("x", TensorProto.INT8, [1, 3, 1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT8, [None] * 4)
    if opset >= 13:
        inits = [numpy_helper.from_array(np.array([0, -2], np.int64), "sq"),
                 numpy_helper.from_array(np.array([-1, 1], np.int64), "un")]
        nodes = [helper.make_node("Squeeze", ["x", "sq"], ["s"], name="squeeze"),
                 helper.make_node("Unsqueeze", ["s", "un"], ["y"], name="unsqueeze")]
    else:
        inits = []
        nodes = [helper.make_node("Squeeze", ["x"], ["s"], name="squeeze", axes=[0, -2]),
                 helper.make_node("Unsqueeze", ["s"], ["y"], name="unsqueeze", axes=[-1, 1])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    g = load_onnx(m)
    assert [(n.op, n.device) for n in g.nodes] == [("Reshape", "npu")] * 2
    v = np.arange(12, dtype=np.int8).reshape(1, 3, 1, 4)
    (want,) = ort_run(m, {"x": v})
    got = run_reference(g, {"x": v})["y"]
    assert got.shape == want.shape == (3, 1, 4, 1) and np.array_equal(got, want)
