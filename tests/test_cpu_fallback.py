"""The CPU fallback (host/cpu_fallback.py): any op onnx or onnxruntime runs, with the
operator's integer semantics, the model's own opsets, and C-contiguous inputs.

onnxruntime with graph optimizations off is the oracle of every result here.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from host.cpu_fallback import executor
from host.errors import UnsupportedOpError
from host.ir import CpuOp
from host.onnx_import import load_onnx
from host.reference import eval_node, run_reference

OPSET = 17
MS = "com.microsoft"


def _literal_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", OPSET),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _scalars(**values):
    return [numpy_helper.from_array(np.asarray(v), k) for k, v in values.items()]


def _runtime_b_qlinear_matmul():
    """QLinearMatMul of two int8 inputs (B computed at run time: no NPU mapping)."""
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"], name="scores")
    inits = _scalars(sa=np.float32(1), za=np.int8(0), sb=np.float32(1), zb=np.int8(0),
                     sy=np.float32(1), zy=np.int8(0))
    ins = [helper.make_tensor_value_info(n, TensorProto.INT8, [2, 2]) for n in ("a", "b")]
    return _model([node], ins, [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 2])],
                  inits)


def test_runtime_b_qlinear_matmul_saturates_like_onnxruntime():
    """100 + 100 leaves int8: the specification (and onnxruntime) saturate to 127,
    onnx 1.19's reference implementation wraps to -56."""
    m = _runtime_b_qlinear_matmul()
    a = np.array([[100, 100], [1, 1]], np.int8)
    b = np.ones((2, 2), np.int8)
    graph = load_onnx(m, allow_cpu_fallback=True)
    (n,) = graph.nodes
    assert isinstance(n, CpuOp) and executor(onnx.NodeProto.FromString(n.onnx_node)) == \
        "onnxruntime"
    got = run_reference(graph, {"a": a, "b": b})["y"]
    want = _literal_ort(m, {"a": a, "b": b})[0]
    wrapped = ReferenceEvaluator(m).run(None, {"a": a, "b": b})[0]
    assert got[0, 0] == 127 and not np.array_equal(want, wrapped)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}),
                                       ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_contrib_op_is_typed_and_run_by_onnxruntime(op, attrs):
    node = helper.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], name="act", domain=MS,
                            **attrs)
    inits = _scalars(sx=np.float32(0.05), zx=np.uint8(128), sy=np.float32(1 / 256),
                     zy=np.uint8(0))
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.UINT8, [3, 5])],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 5])], inits,
               opsets=(("", OPSET), (MS, 1)))
    graph = load_onnx(m, allow_cpu_fallback=True)
    (n,) = graph.nodes
    assert isinstance(n, CpuOp) and (MS, 1) in n.opsets
    assert graph.tensors["y"].shape == (3, 5) and graph.tensors["y"].io_dtype == "uint8"
    x = np.random.default_rng(0).integers(0, 256, (3, 5), dtype=np.uint8)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"],
                                  _literal_ort(m, {"x": x})[0])


def test_contrib_op_without_fallback_names_node_op_domain_and_the_fix():
    node = helper.make_node("QLinearSigmoid", ["x", "s", "z", "s", "z"], ["y"], name="sig",
                            domain=MS)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.UINT8, [4])],
               [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])],
               _scalars(s=np.float32(0.1), z=np.uint8(0)), opsets=(("", OPSET), (MS, 1)))
    with pytest.raises(UnsupportedOpError) as e:
        load_onnx(m)
    text = str(e.value)
    for part in ("'sig'", "QLinearSigmoid", "com.microsoft", "allow_cpu_fallback=True"):
        assert part in text
    assert e.value.domain == MS


def test_ml_domain_op_runs_with_the_models_ml_opset():
    """skl2onnx's label branch: ArrayFeatureExtractor (ai.onnx.ml) of a class table."""
    node = helper.make_node("ArrayFeatureExtractor", ["classes", "i"], ["label"], name="afe",
                            domain="ai.onnx.ml")
    classes = numpy_helper.from_array(np.array([10, 20, 30], np.int64), "classes")
    m = _model([node], [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
               [helper.make_tensor_value_info("label", TensorProto.INT64, [1, 2])], [classes],
               opsets=(("", OPSET), ("ai.onnx.ml", 1)))
    graph = load_onnx(m, allow_cpu_fallback=True)
    i = np.array([2, 0], np.int64)
    np.testing.assert_array_equal(run_reference(graph, {"i": i})["label"],
                                  _literal_ort(m, {"i": i})[0])


def test_strided_input_gives_the_contiguous_result():
    """An NPU result read back channels-last is a strided view; a float reduction on
    the CPU must not round differently from the reference's contiguous array."""
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 1, 1])])
    (n,) = load_onnx(m, allow_cpu_fallback=True).nodes
    nhwc = np.random.default_rng(0).standard_normal((1, 5, 5, 16)).astype(np.float32)
    strided = nhwc.transpose(0, 3, 1, 2)
    contiguous = np.ascontiguousarray(strided)
    ev = ReferenceEvaluator(m)
    assert not np.array_equal(ev.run(None, {"x": strided})[0],
                              ev.run(None, {"x": contiguous})[0])  # the hazard is real
    np.testing.assert_array_equal(eval_node(n, [strided])[0], eval_node(n, [contiguous])[0])


def _zoo(name):
    from verif.zoo import ZOO_DIR
    return ZOO_DIR / name


@pytest.mark.parametrize("file, node, reason", [
    ("attention.qdq-pt-s8.onnx", "gemm_input_reshape", "Reshape of a float tensor"),
    ("pool_cat.qdq-pt-s8.onnx", "/Concat", "no NPU mapping"),
])
def test_unsupported_on_the_npu_falls_back_or_names_the_fix(file, node, reason):
    with pytest.raises(UnsupportedOpError) as e:
        load_onnx(_zoo(file))
    assert e.value.node == node and reason in str(e.value)
    assert "domain ai.onnx" in str(e.value) and "allow_cpu_fallback=True" in str(e.value)
    graph = load_onnx(_zoo(file), allow_cpu_fallback=True)
    on_cpu = [n for n in graph.nodes if n.name == node]
    assert on_cpu and all(n.device == "cpu" for n in on_cpu)
