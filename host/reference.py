"""The reference interpreter: runs an IR graph in numpy, bit-exact with the NPU.

Every quantized operator is evaluated with the integer formulas of the NPU
(``firmware/isa.py``, reusing ``firmware/quant.py``): int8 x int8 products
accumulated in int32 with wrap-around, int32 bias add (wrapping), ``vreq``
requantization, the ``vadd`` formula with its shared shift, clamps, max and
first-index argmax. The compiler's output, run on the golden model or the RTL,
must reproduce these values bit for bit. Boundary ops (Quantize, Dequantize)
and CPU-fallback nodes compute what the CPU computes.
"""

from __future__ import annotations

from collections import ChainMap

import numpy as np

from firmware.quant import rshift_rne

from .errors import ModelError
from .ir import (
    DTYPES,
    ArgMax,
    Clip,
    CpuOp,
    Dequantize,
    Equal,
    Flatten,
    FoldRows,
    Graph,
    If,
    MaxPool,
    Node,
    QAdd,
    QAvgPool,
    QConv,
    QGemm,
    Quantize,
    Reshape,
)


def run_reference(graph: Graph, inputs: dict, *, keep_all: bool = False) -> dict:
    """Run ``graph`` on ``inputs`` and return its outputs by name.

    ``inputs`` maps every graph input name to an array as the outside world
    sees it (``uint8`` for ``io_dtype="uint8"`` tensors, which are shifted into
    the int8 domain here); outputs come back the same way. With ``keep_all``
    every tensor of the top-level graph (in the IR's int8 domain; branch bodies'
    internals excluded) is returned as well. Raises ``ValueError`` for a missing, misshapen or
    out-of-range input.
    """
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise ValueError(f"missing input {name!r}")
        env[name] = to_internal(graph.tensors[name], inputs[name])
    extra = set(inputs) - set(graph.inputs)
    if extra:
        raise ValueError(f"unknown inputs {sorted(extra)}")
    scope = ChainMap(env)
    _run_graph(graph, scope)
    out = {name: to_external(graph.tensors.get(name), scope[name], name)
           for name in graph.outputs}
    if keep_all:
        return {**dict(scope), **out}
    return out


def to_internal(t, value) -> np.ndarray:
    """Convert an input value as the outside sees it to the tensor's IR form."""
    v = np.asarray(value)
    if tuple(v.shape) != t.shape:
        raise ValueError(f"input {t.name!r}: shape {v.shape}, expected {t.shape}")
    if t.io_dtype == "uint8":
        if v.dtype.kind not in "iu" or v.min(initial=0) < 0 or v.max(initial=0) > 255:
            raise ValueError(f"input {t.name!r}: expected uint8 values")
        return (v.astype(np.int16) - 128).astype(np.int8)
    if t.dtype == "int8" and (v.dtype.kind not in "iu" or v.min(initial=0) < -128
                              or v.max(initial=0) > 127):
        raise ValueError(f"input {t.name!r}: expected int8 values")
    return v.astype(DTYPES[t.dtype])


def to_external(t, value: np.ndarray, name: str = "") -> np.ndarray:
    """Convert an IR value of tensor ``t`` to what the outside sees (uint8 shift back)."""
    if t is not None and t.io_dtype == "uint8":
        return (value.astype(np.int16) + 128).astype(np.uint8)
    return value


def _run_graph(graph: Graph, scope: ChainMap):
    for name, t in graph.tensors.items():
        if t.is_const:
            scope[name] = t.data
    for node in graph.topo_order():
        try:
            results = _eval(node, [scope[i] for i in node.inputs], scope)
        except KeyError as e:
            raise ModelError(f"input {e.args[0]!r} was never computed", node.name) from None
        for name, value in zip(node.outputs, results, strict=True):
            scope[name] = value


def wrap32(x) -> np.ndarray:
    """int32 with two's-complement wrap, as the accumulator adds."""
    return np.asarray(x, dtype=np.int64).astype(np.int32)


def _acc_finish(node, acc, bias_shape) -> np.ndarray:
    """Bias add (int32, wrapping) and requantization of int64 raw products."""
    acc = wrap32(acc)
    if node.bias is not None:
        acc = wrap32(acc.astype(np.int64) + node.bias.astype(np.int64).reshape(bias_shape))
    return node.requant.apply(acc, bias_shape) if node.requant is not None else acc


def _eval(node: Node, xs: list, scope: ChainMap) -> list[np.ndarray]:
    if isinstance(node, QGemm):
        x, w = xs[0].astype(np.int64), node.weight.astype(np.int64)
        if w.ndim == 2:
            acc = (x.reshape(-1, w.shape[0]) @ w).reshape(*x.shape[:-1], w.shape[1])
            return [_acc_finish(node, acc, (-1,))]
        acc = np.matmul(x, w)  # (B, M, K) @ (B, K, N): one GEMM per batch
        return [_acc_finish(node, acc, (-1, 1, w.shape[2]) if node.bias is not None
                            and node.bias.ndim == 2 else (-1,))]
    if isinstance(node, QConv):
        acc = conv2d(xs[0], node.weight, node.strides, node.pads, node.pad_value, node.group)
        return [_acc_finish(node, acc, (1, -1, 1, 1))]
    if isinstance(node, QAvgPool):
        return [node.requant.apply(window_sum(xs[0], node.kernel, node.strides, node.pads,
                                              node.zero_point))]
    if isinstance(node, QAdd):
        a = xs[0].astype(np.int64) - node.zp_a
        b = xs[1].astype(np.int64) - node.zp_b
        y = rshift_rne(a * node.mul_a + b * node.mul_b, node.shift) + node.zp
        return [np.clip(y, node.lo, node.hi).astype(np.int8)]
    if isinstance(node, Clip):
        return [np.clip(xs[0], node.lo, node.hi).astype(np.int8)]
    if isinstance(node, MaxPool):
        return [maxpool2d(xs[0], node.kernel, node.strides, node.pads)]
    if isinstance(node, Flatten):
        x = xs[0]
        axis = node.axis + x.ndim if node.axis < 0 else node.axis
        return [x.reshape(int(np.prod(x.shape[:axis])), -1)]
    if isinstance(node, Reshape):
        return [xs[0].reshape(node.shape)]
    if isinstance(node, ArgMax):
        return [np.argmax(xs[0], axis=node.axis, keepdims=node.keepdims).astype(np.int64)]
    if isinstance(node, Equal):
        return [xs[0] == node.value]
    if isinstance(node, If):
        branch = node.then_graph if bool(np.asarray(xs[0]).reshape(-1)[0]) \
            else node.else_graph
        inner = scope.new_child()
        _run_graph(branch, inner)
        return [inner[o] for o in branch.outputs]
    if isinstance(node, FoldRows):
        return [fold_rows(xs[0], node.factor, node.top, node.bottom, node.fill, node.row_step)]
    if isinstance(node, Quantize):
        # ONNX QuantizeLinear: float32 division, round half to even, saturate.
        q = np.rint(xs[0].astype(np.float32) / np.float32(node.scale))
        return [np.clip(q + node.zp, -128, 127).astype(np.int8)]
    if isinstance(node, Dequantize):
        return [((xs[0].astype(np.float32) - np.float32(node.zp))
                 * np.float32(node.scale)).astype(np.float32)]
    if isinstance(node, CpuOp):
        return _run_cpu_op(node, xs)
    raise ModelError(f"the interpreter has no rule for {node.op}", node.name)


def conv2d(x: np.ndarray, w: np.ndarray, strides, pads, pad_value: int,
           group: int = 1) -> np.ndarray:
    """Integer NCHW convolution (int64 result), padding with ``pad_value``; with
    ``group`` > 1 output group ``g`` reads input channel group ``g`` only."""
    win = _windows(x, w.shape[2:], strides, pads, pad_value)  # (N, C, OH, OW, KH, KW)
    n, c, oh, ow, kh, kw = win.shape
    oc, cg = w.shape[:2]
    win = win.reshape(n, group, cg, oh, ow, kh, kw)
    wg = w.astype(np.int64).reshape(group, oc // group, cg, kh, kw)
    return np.einsum("ngchwij,gocij->ngohw", win, wg).reshape(n, oc, oh, ow)


def fold_rows(x: np.ndarray, factor: int, top: int, bottom: int, fill: int,
              step: int = 0) -> np.ndarray:
    """NCHW ``x`` with ``top`` and ``bottom`` rows of ``fill`` added, its rows folded
    into channels ``factor`` at a time, ``step`` rows apart (0: ``factor``;
    :class:`host.ir.FoldRows`)."""
    n, c, h, w = x.shape
    step = step or factor
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (0, 0)), constant_values=fill)
    rows = (xp.shape[2] - factor) // step + 1
    folded = np.stack([xp[:, :, p:p + (rows - 1) * step + 1:step] for p in range(factor)],
                      axis=1)
    return np.ascontiguousarray(folded.reshape(n, factor * c, rows, w))


def window_sum(x: np.ndarray, kernel, strides, pads, zero_point: int) -> np.ndarray:
    """Sum of ``x - zero_point`` over each pooling window (int64; padding adds 0)."""
    win = _windows(x, kernel, strides, pads, zero_point)
    return win.sum(axis=(4, 5)) - zero_point * kernel[0] * kernel[1]


def _windows(x: np.ndarray, kernel, strides, pads, fill: int) -> np.ndarray:
    """int64 view ``(N, C, OH, OW, KH, KW)`` of the windows of ``x`` padded with ``fill``."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)),
                constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, tuple(kernel), axis=(2, 3))
    return win[:, :, ::strides[0], ::strides[1]]


def maxpool2d(x: np.ndarray, kernel, strides, pads) -> np.ndarray:
    """int8 NCHW max pooling; padding is -128, which never beats a real element."""
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-128)
    win = np.lib.stride_tricks.sliding_window_view(xp, tuple(kernel), axis=(2, 3))
    return win[:, :, ::strides[0], ::strides[1]].max(axis=(4, 5)).astype(np.int8)


def _run_cpu_op(node: CpuOp, xs: list) -> list[np.ndarray]:
    """Run a CPU-fallback node (:mod:`host.cpu_fallback` picks onnx or onnxruntime)."""
    import onnx

    from .cpu_fallback import run_node, single_node_model

    proto = onnx.NodeProto()
    proto.ParseFromString(node.onnx_node)
    feeds, inputs = {}, []
    names = [n for n in proto.input if n]  # "" marks an omitted optional input
    for name, value, et in zip(names, xs, node.onnx_in_types, strict=True):
        if et == onnx.TensorProto.UINT8:
            value = (value.astype(np.int16) + 128).astype(np.uint8)
        if name not in feeds:
            inputs.append((name, et, value.shape))
        feeds[name] = value
    model = single_node_model(proto, inputs, list(node.onnx_out_types), node.opsets)
    converted = []
    for value, et, (_, dtype) in zip(run_node(model, feeds), node.onnx_out_types,
                                     node.out_specs, strict=True):
        if et == onnx.TensorProto.UINT8:
            value = (value.astype(np.int16) - 128).astype(np.int8)
        converted.append(value.astype(DTYPES[dtype]))
    return converted


def eval_node(node: Node, inputs: list) -> list[np.ndarray]:
    """Evaluate one node (not ``If``) on IR-domain input values, as the NPU would."""
    if isinstance(node, If):
        raise ValueError("eval_node does not run If nodes (their branches need a scope)")
    return _eval(node, inputs, ChainMap())
