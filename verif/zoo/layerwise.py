"""The reference interpreter against onnxruntime tensor by tensor, not only at the end.

The NPU requantizes with a fixed-point multiplier where onnxruntime multiplies in
float, so a quantized tensor may differ by one LSB where the product lands near a
rounding tie. Through a deep network such differences feed the next layers and can
grow; the fair check of the interpreter's semantics is per layer: every int8 tensor
onnxruntime computes (each ``QuantizeLinear`` output, the graph executed literally)
is compared with the interpreter's value computed from onnxruntime's own values of
its inputs, then pinned to onnxruntime's value before the next node runs.

Needs onnxruntime (the oracle), not torch.
"""

from __future__ import annotations

from collections import ChainMap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from host.ir import Graph, If
from host.reference import eval_node, to_internal

from . import oracle


def _with_quantized_outputs(path: Path) -> tuple[bytes, list[str]]:
    """The model with every int8 QuantizeLinear output made a graph output."""
    model = onnx.load(str(path))
    names = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    outputs = {o.name for o in model.graph.output}
    for name in names:
        if name not in outputs:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.INT8,
                                                                    None))
    return model.SerializeToString(), names


def layer_errors(graph: Graph, path: Path, inputs: np.ndarray) -> dict[str, int]:
    """The largest difference, in LSBs, between the interpreter and onnxruntime of
    each int8 tensor both compute, over ``inputs`` (one inference a row), each
    computed from onnxruntime's values of its inputs. ``graph`` is ``path``
    imported (int8 activations; no ``If``)."""
    model, names = _with_quantized_outputs(path)
    session = oracle.session(model, "literal")
    ort_values = oracle.run(session, inputs)
    name = graph.inputs[0]
    worst: dict[str, int] = {}
    for row in range(len(inputs)):
        scope = ChainMap({n: t.data for n, t in graph.tensors.items() if t.is_const})
        scope[name] = to_internal(graph.tensors[name],
                                  inputs[row].reshape(graph.tensors[name].shape))
        for node in graph.topo_order():
            if isinstance(node, If):
                raise ValueError(f"{node.name}: layer_errors does not follow branches")
            for out, value in zip(node.outputs, eval_node(node, [scope[i] for i in node.inputs]),
                                  strict=True):
                if out in names and out in ort_values:
                    want = ort_values[out][row]
                    if want.dtype != np.int8:
                        raise ValueError(f"{out}: {want.dtype} activations (int8 only)")
                    diff = np.abs(value.astype(np.int64) - want.reshape(value.shape))
                    worst[out] = max(worst.get(out, 0), int(diff.max(initial=0)))
                    value = want.reshape(value.shape)
                scope[out] = value
    return worst
