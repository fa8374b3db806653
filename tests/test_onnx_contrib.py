"""onnxruntime's com.microsoft QOperator ops: QGemm and QLinearAdd on the NPU (as
QGemm and QAdd), the forms the NPU cannot take on the CPU; onnxruntime with graph
optimizations off is the oracle (within 1 LSB: the NPU requantizes in fixed point)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from host.ir import CpuOp, QAdd, QGemm
from host.onnx_import import load_onnx
from host.reference import run_reference

MS = "com.microsoft"


def _literal_ort(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(node, inputs, out, inits):
    g = helper.make_graph([node], "g", inputs, [out],
                          initializer=[numpy_helper.from_array(np.asarray(v), k)
                                       for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)])


def _qgemm(rng, m=4, k=12, n=5, **attrs):
    """A QGemm as onnxruntime's quantizer writes it for a Linear: uint8 A, int8 B
    stored (N, K) with transB=1, int32 bias at a_scale * b_scale."""
    sa, sb = np.float32(0.04), np.float32(0.01)
    inits = {"sa": sa, "za": np.uint8(120), "b": rng.integers(-127, 128, (n, k), np.int8),
             "sb": sb, "zb": np.int8(0),
             "c": rng.integers(-2000, 2000, n).astype(np.int32),
             "sy": np.float32(0.05), "zy": np.uint8(128)}
    node = helper.make_node("QGemm", ["a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"], ["y"],
                            name="fc", domain=MS, transB=1, alpha=1.0, **attrs)
    return _model(node, [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                  helper.make_tensor_value_info("y", TensorProto.UINT8, [m, n]), inits)


def _within_one_lsb(got, want):
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1, diff


def test_qgemm_runs_on_the_npu(seed):
    rng = np.random.default_rng(seed)
    m = _qgemm(rng)
    graph = load_onnx(m)
    (n,) = graph.nodes
    assert isinstance(n, QGemm) and n.device == "npu" and n.requant is not None
    for _ in range(5):
        a = rng.integers(0, 256, (4, 12), dtype=np.uint8)
        _within_one_lsb(run_reference(graph, {"a": a})["y"], _literal_ort(m, {"a": a})[0])


def test_qgemm_with_transA_falls_back_to_onnxruntime():
    rng = np.random.default_rng(1)
    m = _qgemm(rng, m=12, k=12, transA=1)
    graph = load_onnx(m, allow_cpu_fallback=True)
    (n,) = graph.nodes
    assert isinstance(n, CpuOp)
    a = rng.integers(0, 256, (12, 12), dtype=np.uint8)
    np.testing.assert_array_equal(run_reference(graph, {"a": a})["y"],
                                  _literal_ort(m, {"a": a})[0])


@pytest.mark.parametrize("et, np_t, zp", [(TensorProto.UINT8, np.uint8, 128),
                                          (TensorProto.INT8, np.int8, -3)])
def test_qlinear_add_runs_on_the_npu(seed, et, np_t, zp):
    rng = np.random.default_rng(seed)
    inits = {"sa": np.float32(0.03), "za": np_t(zp), "sb": np.float32(0.02),
             "zb": np_t(zp + 20), "sc": np.float32(0.045), "zc": np_t(zp - 1)}
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"],
                            ["c"], name="add", domain=MS)
    info = np.iinfo(np_t)
    m = _model(node, [helper.make_tensor_value_info(x, et, [2, 16]) for x in "ab"],
               helper.make_tensor_value_info("c", et, [2, 16]), inits)
    graph = load_onnx(m)
    (n,) = graph.nodes
    assert isinstance(n, QAdd) and n.device == "npu"
    for _ in range(5):
        feeds = {x: rng.integers(info.min, info.max + 1, (2, 16)).astype(np_t) for x in "ab"}
        _within_one_lsb(run_reference(graph, feeds)["c"], _literal_ort(m, feeds)[0])
