"""What a quantized ONNX model asks of any accelerator: MACs and its minimal DRAM bytes.

Read from the ONNX file itself, not from a compiled program, so the figures stay the
same whichever part of the model the NPU runs today:

* MACs: ``Conv`` (output elements x input channels per group x kernel area),
  ``Gemm`` and ``MatMul`` (M x K x N) and their integer forms, over the shapes ONNX
  shape inference gives; an ``If`` counts its costlier branch (one runs).
* minimal DRAM bytes: every integer initializer once (the quantized weights, one
  byte each for int8, four for int32 biases), the graph's input and outputs once as
  int8 (one byte an element): what a batch-1 inference must move at the least.

Needs neither torch nor onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

_CONV = {"Conv", "ConvInteger", "QLinearConv"}
_MATMUL = {"Gemm", "MatMul", "MatMulInteger", "QLinearMatMul", "QGemm"}
_INTEGER = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32}


@dataclass(frozen=True)
class Workload:
    """One inference's work.

    Members
    -------
    macs : multiply-accumulates of the convolutions and matrix products.
    weight_bytes : bytes of the integer initializers (weights, biases, zero points).
    input_bytes, output_bytes : the graph's inputs and outputs as int8.
    """

    macs: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int

    @property
    def min_dram_bytes(self) -> int:
        """Weights, input and output, each moved once."""
        return self.weight_bytes + self.input_bytes + self.output_bytes

    def bound_cycles(self, peak_macs_per_cycle: int, bus_bytes: int) -> float:
        """The roofline: cycles at the array's peak or to move the minimal bytes over
        the bus, whichever is longer (min of peak and bus x intensity, as a time)."""
        return max(self.macs / peak_macs_per_cycle, self.min_dram_bytes / bus_bytes)


def _shape(shapes: dict, name: str) -> tuple[int, ...]:
    dims = shapes[name]
    if any(d <= 0 for d in dims):
        raise ValueError(f"{name!r} has no static shape ({dims})")
    return dims


def _graph_work(g: onnx.GraphProto, shapes: dict) -> tuple[int, int]:
    """(MACs, integer initializer bytes) of one graph, the costlier branch of each If."""
    macs = 0
    weight_bytes = sum(int(np.prod(i.dims)) * (4 if i.data_type == TensorProto.INT32 else 1)
                       for i in g.initializer if i.data_type in _INTEGER)
    for node in g.node:
        if node.op_type in _CONV:
            w = _shape(shapes, node.input[3 if node.op_type == "QLinearConv" else 1])
            out = _shape(shapes, node.output[0])
            macs += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type in _MATMUL:
            out = _shape(shapes, node.output[0])
            a = _shape(shapes, node.input[0])
            trans_a = any(a_.name == "transA" and a_.i for a_ in node.attribute)
            k = a[-2] if trans_a else a[-1]
            macs += int(np.prod(out)) * k
        elif node.op_type == "If":
            branches = [_graph_work(helper.get_attribute_value(a), shapes)
                        for a in node.attribute if a.name in ("then_branch", "else_branch")]
            best = max(branches)
            macs += best[0]
            weight_bytes += best[1]
    return macs, weight_bytes


def _value_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every value's static shape (graph, subgraphs, initializers) after inference."""
    shapes = {}

    def visit(g):
        for i in g.initializer:
            shapes[i.name] = tuple(i.dims)
        for vi in [*g.input, *g.output, *g.value_info]:
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1
                                    for d in vi.type.tensor_type.shape.dim)
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g)

    visit(model.graph)
    return shapes


def workload(path: Path | str) -> Workload:
    """The workload of the ONNX model at ``path`` (static shapes, batch 1)."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = _value_shapes(model)
    g = model.graph
    inits = {i.name for i in g.initializer}
    macs, weight_bytes = _graph_work(g, shapes)
    inputs = sum(int(np.prod(_shape(shapes, i.name))) for i in g.input if i.name not in inits)
    outputs = sum(int(np.prod(_shape(shapes, o.name))) for o in g.output)
    return Workload(macs, weight_bytes, inputs, outputs)
