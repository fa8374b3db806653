"""Build IR graphs in code (tests, examples, bundled models).

::

    b = GraphBuilder("mlp")
    x = b.input("x", (1, 64), scale=0.02, zp=0)
    h = b.qgemm(x, w1, b1, w_scale=0.01, out_scale=0.05, relu=True)
    y = b.qgemm(h, w2, None, w_scale=0.01, out_scale=0.1)
    b.output(y)
    g = b.build()

Handles are tensor names. Quantized tensors carry their :class:`QParams`, from
which every operator derives its integer NPU parameters (fixed-point multiplier
and shift, folded bias, clamps), exactly as the ONNX importer does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from firmware.quant import quantize_multiplier, quantize_multipliers_shared

from .errors import ModelError
from .ir import (
    ArgMax,
    Clip,
    Dequantize,
    Equal,
    Flatten,
    Graph,
    If,
    MaxPool,
    Node,
    QAdd,
    QAvgPool,
    QConv,
    QGemm,
    QParams,
    Quantize,
    Requant,
    Reshape,
    Tensor,
)


def requant_for(scale: float, zp: int, relu: bool = False, clip: tuple | None = None,
                out_scale: float | None = None) -> Requant:
    """The :class:`Requant` for accumulators of real scale ``scale`` into an int8 output.

    ``scale`` is ``s_in * s_w / s_out`` (already divided by the output scale), or an
    array of them, one per output channel (per-channel weight scales).
    ``clip`` = (lo, hi) real bounds (need ``out_scale``); ``relu`` clamps at real 0.
    The multiplier holds the scale exactly when the scale's significant bits fit
    (every float32 scale >= 2**-40: 24 bits, shift <= 63), so ``vreq`` rounds the
    exact product ``acc * scale``; see :func:`firmware.quant.quantize_multiplier`.
    """
    if np.ndim(scale) > 0:  # one scale per output channel: the NPU's requantization table
        pairs = [quantize_multiplier(float(s)) for s in np.ravel(scale)]
        mult, shift = tuple(m for m, _ in pairs), tuple(s for _, s in pairs)
    else:
        mult, shift = quantize_multiplier(float(scale))
    lo, hi = clamp_bounds(zp, relu, clip, out_scale)
    return Requant(mult, shift, zp, lo, hi)


def clamp_bounds(zp: int, relu: bool = False, clip: tuple | None = None,
                 out_scale: float | None = None) -> tuple[int, int]:
    """int8 clamp bounds for a fused ReLU / Clip(lo, hi) on an output ``(out_scale, zp)``.

    Real bounds are quantized like QuantizeLinear (round half to even, saturate),
    so clamping before or after quantization gives the same int8 result.
    """
    lo, hi = -128, 127
    if relu:
        lo = max(lo, zp)
    if clip is not None:
        clo, chi = clip
        if out_scale is None:
            raise ValueError("a real-valued clip needs the output scale")
        if clo is not None and np.isfinite(clo):
            lo = max(lo, int(np.clip(np.rint(np.float32(clo) / np.float32(out_scale)) + zp,
                                     -128, 127)))
        if chi is not None and np.isfinite(chi):
            hi = min(hi, int(np.clip(np.rint(np.float32(chi) / np.float32(out_scale)) + zp,
                                     -128, 127)))
    if lo > hi:  # the clip excludes everything representable: pin to the one bound
        lo = hi
    return lo, hi


def fold_bias(bias, zx: int, colsum: np.ndarray) -> np.ndarray:
    """``bias - zx * colsum`` as int32 (the input zero point folded into the bias).

    ``colsum`` is the weight sum per output (``W.sum(axis=-2)`` for a GEMM,
    ``W.sum(axis=(1, 2, 3))`` for a convolution). Raises ``ValueError`` if the
    result leaves int32.
    """
    colsum = np.asarray(colsum, dtype=np.int64)
    b = 0 if bias is None else np.asarray(bias, dtype=np.int64)
    folded = np.broadcast_to(b - int(zx) * colsum, colsum.shape)
    if np.any(folded < -(1 << 31)) or np.any(folded >= 1 << 31):
        raise ValueError("bias with the folded input zero point leaves int32")
    return folded.astype(np.int32)


class GraphBuilder:
    """Make IR graphs in code.

    Parameters
    ----------
    name : the graph's name.
    parent : the enclosing builder, for If branch bodies (they read its tensors).
    """

    def __init__(self, name: str = "graph", parent: GraphBuilder | None = None):
        self.graph = Graph(name)
        self.parent = parent
        self._counter = parent._counter if parent else [0]

    # ---- names and tensors --------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        while True:
            self._counter[0] += 1
            name = f"{base}_{self._counter[0]}"
            if self._lookup(name) is None:
                return name

    def _lookup(self, name: str) -> Tensor | None:
        b = self
        while b is not None:
            if name in b.graph.tensors:
                return b.graph.tensors[name]
            b = b.parent
        return None

    def tensor(self, name: str) -> Tensor:
        """The tensor behind a handle (this graph or an enclosing one)."""
        t = self._lookup(name)
        if t is None:
            raise KeyError(f"no tensor {name!r}")
        return t

    def _emit(self, node: Node, base: str, quant: QParams | None = None,
              io_dtype: str | None = None) -> list[str]:
        if not node.name:
            node.name = self._fresh(node.op.lower())
        ins = [self.tensor(i) for i in node.inputs]
        node.check()
        specs = node.infer(ins)
        outs = []
        for shape, dtype in specs:
            t = Tensor(self._fresh(base), shape, dtype, quant if dtype == "int8" else None,
                       io_dtype=io_dtype)
            self.graph.add_tensor(t)
            outs.append(t.name)
        node.outputs = outs
        self.graph.nodes.append(node)
        return outs

    def _q(self, x: str) -> QParams:
        q = self.tensor(x).quant
        if q is None:
            raise ModelError(f"tensor {x!r} has no quantization parameters")
        return q

    # ---- boundary -----------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], scale: float | None = None,
              zp: int = 0, dtype: str = "int8", io_dtype: str | None = None) -> str:
        """Declare a graph input (int8 with ``scale``/``zp``, or another dtype)."""
        quant = QParams(scale, zp) if scale is not None else None
        self.graph.add_tensor(Tensor(name, tuple(shape), dtype, quant, io_dtype=io_dtype))
        self.graph.inputs.append(name)
        return name

    def const(self, value, dtype: str, name: str | None = None) -> str:
        """Add a constant tensor."""
        value = np.asarray(value)
        t = Tensor(name or self._fresh("const"), value.shape, dtype, data=value)
        self.graph.add_tensor(t)
        return t.name

    def output(self, x: str, name: str | None = None) -> str:
        """Mark ``x`` as a graph output, renaming its tensor to ``name`` if given.

        Returns the output's handle; after a rename the old handle is gone, so
        mark outputs once the tensor has no further uses to build."""
        if name is not None and name != x:
            t = self.graph.tensors.pop(x)
            t.name = name
            self.graph.tensors[name] = t
            for n in self.graph.nodes:
                n.outputs = [name if o == x else o for o in n.outputs]
                n.inputs = [name if i == x else i for i in n.inputs]
            x = name
        self.graph.outputs.append(x)
        return x

    def build(self) -> Graph:
        """Validate and return the graph (raises :class:`ModelError`)."""
        return self.graph.validate()

    # ---- operators ----------------------------------------------------------------------
    def quantize(self, x: str, scale: float, zp: int = 0) -> str:
        """float32 -> int8 on the CPU."""
        return self._emit(Quantize("", [x], [], scale=float(scale), zp=zp, device="cpu"),
                          "q", QParams(float(scale), zp))[0]

    def dequantize(self, x: str) -> str:
        """int8 -> float32 on the CPU, with the tensor's own parameters."""
        q = self._q(x)
        return self._emit(Dequantize("", [x], [], scale=q.scale, zp=q.zero_point,
                                     device="cpu"), "dq")[0]

    def qgemm(self, x: str, weight, bias=None, *, w_scale: float = 1.0,
              out_scale: float | None = None, out_zp: int = 0, relu: bool = False,
              clip: tuple | None = None, requant: Requant | None = None,
              device: str = "npu") -> str:
        """``requant(x @ weight + bias)``: int8 ``weight`` (K, N), int32 ``bias`` in
        accumulator units (scale ``s_x * w_scale``). Give ``out_scale`` (the builder
        derives the requantization) or an explicit ``requant``; neither gives the
        int32 accumulator (CPU only)."""
        weight = np.asarray(weight)
        zx = self._q(x).zero_point if self.tensor(x).quant else 0
        b = fold_bias(bias, zx, weight.astype(np.int64).sum(axis=-2))
        requant, quant = self._output_requant(x, w_scale, out_scale, out_zp, relu, clip,
                                              requant)
        return self._emit(QGemm("", [x], [], weight=weight, bias=b, requant=requant,
                                device=device), "gemm", quant)[0]

    def _output_requant(self, x, w_scale, out_scale, out_zp, relu, clip, requant):
        """The requantization of a GEMM/conv output and the output's quantization:
        derived from ``out_scale`` unless an explicit ``requant`` is given."""
        if requant is None and out_scale is not None:
            requant = requant_for(self._q(x).scale * w_scale / out_scale, out_zp, relu, clip,
                                  out_scale)
        quant = None
        if requant is not None and out_scale:
            quant = QParams(out_scale, requant.zp)
        return requant, quant

    def qconv(self, x: str, weight, bias=None, *, strides=(1, 1), pads=(0, 0, 0, 0),
              w_scale: float = 1.0, out_scale: float | None = None, out_zp: int = 0,
              relu: bool = False, clip: tuple | None = None,
              requant: Requant | None = None, device: str = "npu", group: int = 1) -> str:
        """2-D convolution of an int8 NCHW ``x`` with int8 ``weight`` (OC, C / group, KH, KW)."""
        weight = np.asarray(weight)
        zx = self._q(x).zero_point if self.tensor(x).quant else 0
        b = fold_bias(bias, zx, weight.astype(np.int64).sum(axis=(1, 2, 3)))
        requant, quant = self._output_requant(x, w_scale, out_scale, out_zp, relu, clip,
                                              requant)
        node = QConv("", [x], [], weight=weight, bias=b, strides=tuple(strides),
                     pads=tuple(pads), pad_value=zx, requant=requant, device=device,
                     group=group)
        return self._emit(node, "conv", quant)[0]

    def qadd(self, a: str, b: str, *, out_scale: float, out_zp: int = 0,
             relu: bool = False, clip: tuple | None = None) -> str:
        """``a + b`` in real terms, requantized to ``(out_scale, out_zp)`` (shared shift)."""
        qa, qb = self._q(a), self._q(b)
        (ma, mb), shift = quantize_multipliers_shared([qa.scale / out_scale,
                                                       qb.scale / out_scale])
        lo, hi = clamp_bounds(out_zp, relu, clip, out_scale)
        node = QAdd("", [a, b], [], mul_a=ma, mul_b=mb, zp_a=qa.zero_point,
                    zp_b=qb.zero_point, shift=shift, zp=out_zp, lo=lo, hi=hi)
        return self._emit(node, "add", QParams(out_scale, out_zp))[0]

    def clip(self, x: str, lo: int = -128, hi: int = 127) -> str:
        """Clamp in the int8 domain."""
        return self._emit(Clip("", [x], [], lo=lo, hi=hi), "clip", self.tensor(x).quant)[0]

    def relu(self, x: str) -> str:
        """ReLU of a quantized tensor: clamp below at its zero point."""
        return self.clip(x, lo=self._q(x).zero_point)

    def maxpool(self, x: str, kernel=(2, 2), strides=None, pads=(0, 0, 0, 0)) -> str:
        """2-D max pooling (strides default to the kernel)."""
        node = MaxPool("", [x], [], kernel=tuple(kernel), strides=tuple(strides or kernel),
                       pads=tuple(pads))
        return self._emit(node, "pool", self.tensor(x).quant)[0]

    def avgpool(self, x: str, kernel=(2, 2), strides=None, pads=(0, 0, 0, 0), *,
                out_scale: float | None = None, out_zp: int | None = None) -> str:
        """2-D average pooling, padding counted (strides default to the kernel); the
        output keeps the input's quantization unless given. ``kernel=None``: global."""
        q = self._q(x)
        if kernel is None:
            kernel = self.tensor(x).shape[2:]
        out_scale = q.scale if out_scale is None else out_scale
        out_zp = q.zero_point if out_zp is None else out_zp
        count = kernel[0] * kernel[1]
        requant = requant_for(q.scale / (out_scale * count), out_zp)
        node = QAvgPool("", [x], [], kernel=tuple(kernel), strides=tuple(strides or kernel),
                        pads=tuple(pads), zero_point=q.zero_point, requant=requant)
        return self._emit(node, "avgpool", QParams(out_scale, out_zp))[0]

    def flatten(self, x: str, axis: int = 1) -> str:
        return self._emit(Flatten("", [x], [], axis=axis), "flat", self.tensor(x).quant)[0]

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self._emit(Reshape("", [x], [], shape=tuple(shape)), "reshape",
                          self.tensor(x).quant)[0]

    def argmax(self, x: str, axis: int = -1, keepdims: bool = False) -> str:
        return self._emit(ArgMax("", [x], [], axis=axis, keepdims=keepdims), "argmax")[0]

    def equal(self, x: str, value: int) -> str:
        return self._emit(Equal("", [x], [], value=int(value)), "eq")[0]

    def if_(self, cond: str, then_fn: Callable[[GraphBuilder], Sequence[str]],
            else_fn: Callable[[GraphBuilder], Sequence[str]]) -> list[str]:
        """Branch on a bool scalar. Each function gets a branch builder (which can
        read this graph's tensors) and returns the branch's output handles."""
        branches = []
        for fn, tag in ((then_fn, "then"), (else_fn, "else")):
            sub = GraphBuilder(self._fresh(tag), parent=self)
            outs = list(fn(sub))
            sub.graph.outputs = outs
            branches.append(sub)
        then_b, else_b = branches
        node = If(self._fresh("if"), [cond], [], then_graph=then_b.graph,
                  else_graph=else_b.graph)
        outs = []
        for t_out, e_out in zip(then_b.graph.outputs, else_b.graph.outputs, strict=True):
            tt, te = then_b.tensor(t_out), else_b.tensor(e_out)
            if (tt.shape, tt.dtype) != (te.shape, te.dtype):
                raise ModelError(f"branches disagree: {t_out} {tt.shape} {tt.dtype} vs "
                                 f"{e_out} {te.shape} {te.dtype}", node.name)
            quant = tt.quant if tt.quant == te.quant else None
            t = Tensor(self._fresh("if_out"), tt.shape, tt.dtype, quant)
            self.graph.add_tensor(t)
            outs.append(t.name)
        node.outputs = outs
        node.check()
        self.graph.nodes.append(node)
        return outs
