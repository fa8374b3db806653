"""The CPU fallback: one ONNX node, as a one-node model, run on the host.

The importer turns every node the NPU cannot run into a :class:`host.ir.CpuOp`
holding the serialized node and the model's opset imports (every domain:
``ai.onnx.ml``, ``com.microsoft``, ...). This module builds the one-node model
for such a node, types its outputs, and runs it:

* onnx's ``ReferenceEvaluator`` runs the default and ``ai.onnx.ml`` domains;
* onnxruntime (graph optimizations off, the node executed literally) runs the
  contrib domains (``com.microsoft``), the ops the reference evaluator lacks,
  and the integer ops whose reference implementation wraps where the operator's
  specification saturates (:data:`SATURATING_OPS`).

Inputs are made C-contiguous before either runs: a float reduction sums in
memory order, so a strided view of the same values (an NPU result read back
channels-last) would otherwise round differently from a contiguous copy.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper

from .errors import ModelError

__all__ = ["REFERENCE_DOMAINS", "SATURATING_OPS", "single_node_model", "infer_outputs",
           "run_node", "executor"]

REFERENCE_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
"""Domains onnx's reference evaluator implements (the rest run in onnxruntime)."""

SATURATING_OPS = frozenset({"QLinearMatMul", "QLinearConv"})
"""Default-domain ops whose onnx reference implementation (1.19) wraps int8 results
that the specification saturates; they run in onnxruntime."""


def single_node_model(node: onnx.NodeProto, inputs: list, output_types: list,
                      opsets: tuple, initializers: tuple = ()) -> onnx.ModelProto:
    """A model of ``node`` alone.

    ``inputs`` are ``(name, onnx element type, shape)`` of its distinct inputs,
    ``output_types`` the element types of its outputs (``UNDEFINED`` to infer),
    ``opsets`` the ``(domain, version)`` imports of the model it came from.
    """
    constant = {t.name for t in initializers}
    vis = [helper.make_tensor_value_info(name, et, shape) for name, et, shape in inputs
           if name not in constant]
    outs = [helper.make_tensor_value_info(o, et, None) if et != onnx.TensorProto.UNDEFINED
            else onnx.ValueInfoProto(name=o)
            for o, et in zip(node.output, output_types, strict=True)]
    return helper.make_model(
        helper.make_graph([node], "cpu_op", vis, outs, initializer=list(initializers)),
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def executor(node: onnx.NodeProto) -> str:
    """Which runtime runs ``node``: ``"onnxruntime"`` or ``"onnx-reference"``."""
    if node.domain not in REFERENCE_DOMAINS or node.op_type in SATURATING_OPS:
        return "onnxruntime"
    return "onnx-reference"


def run_node(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Run a :func:`single_node_model` on ``feeds`` (name -> array, ONNX dtypes)."""
    feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
    node = model.graph.node[0]
    run = _runner(model.SerializeToString(), executor(node))
    try:
        results = run(feeds)
    except Exception as e:  # shapes or values the model's own declarations do not admit
        raise ModelError(f"the CPU fallback cannot run {_describe(node)}: {_first_line(e)}",
                         node.name, fix="fix the model's shapes so that onnxruntime runs "
                         "it") from None
    return [np.asarray(r) for r in results]


def infer_outputs(model: onnx.ModelProto, where: str) -> list[tuple[int, tuple[int, ...]]]:
    """``(element type, static shape)`` of each output of a :func:`single_node_model`.

    onnx's shape inference with the model's own opsets first; for what it cannot
    type (contrib ops), onnxruntime runs the node once on zeros of the input shapes.
    """
    node = model.graph.node[0]
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        specs = _static_specs(inferred, node)
    except Exception:
        specs = None
    if specs is not None:
        return specs
    return _infer_by_running(model, node, where)


def _static_specs(inferred: onnx.ModelProto, node: onnx.NodeProto):
    by_name = {v.name: v for v in inferred.graph.output}
    by_name.update({v.name: v for v in inferred.graph.value_info})
    specs = []
    for o in node.output:
        tt = by_name[o].type.tensor_type if o in by_name else None
        if tt is None or not tt.elem_type or not tt.HasField("shape") or any(
                not d.HasField("dim_value") for d in tt.shape.dim):
            return None
        specs.append((tt.elem_type, tuple(d.dim_value for d in tt.shape.dim)))
    return specs


def _infer_by_running(model, node, where: str):
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        feeds[vi.name] = np.zeros([d.dim_value for d in tt.shape.dim],
                                  helper.tensor_dtype_to_np_dtype(tt.elem_type))
    try:
        results = _runner(model.SerializeToString(), "onnxruntime")(feeds)
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"cannot type the CPU fallback of {_describe(node)}: neither onnx "
                         f"shape inference nor onnxruntime can run it ({_first_line(e)})", where,
                         fix=_REPLACE) from None
    return [(helper.np_dtype_to_tensor_dtype(np.asarray(r).dtype), tuple(np.shape(r)))
            for r in results]


@functools.lru_cache(maxsize=256)
def _runner(model_bytes: bytes, which: str):
    model = onnx.load_model_from_string(model_bytes)
    node = model.graph.node[0]
    if which == "onnx-reference":
        from onnx.reference import ReferenceEvaluator
        try:
            ev = ReferenceEvaluator(model)
        except Exception:  # the reference evaluator lacks the op: onnxruntime has it
            return _runner(model_bytes, "onnxruntime")
        return lambda feeds: ev.run(None, feeds)
    ort = _onnxruntime(node)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # errors only: they become the ModelError below
    try:
        session = ort.InferenceSession(model_bytes, options,
                                       providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ModelError(f"onnxruntime cannot run the CPU fallback of {_describe(node)}: "
                         f"{_first_line(e)}", node.name, fix=_REPLACE) from None
    return lambda feeds: session.run(None, feeds)


def _onnxruntime(node: onnx.NodeProto):
    try:
        import onnxruntime
    except ImportError:
        raise ModelError(f"{_describe(node)} runs on the CPU through onnxruntime, which is "
                         "not installed", node.name, fix="pip install onnxruntime") from None
    return onnxruntime


_REPLACE = ("replace the node by operators onnx's reference evaluator or onnxruntime "
            "implement")
"""What to do about a node nothing here can run."""


def _describe(node: onnx.NodeProto) -> str:
    return f"{node.op_type} (domain {node.domain or 'ai.onnx'})"


def _first_line(e: BaseException) -> str:
    return (str(e).strip() or type(e).__name__).splitlines()[0]
