"""The host graph IR: int8 tensors, NPU-shaped operators, and subgraph records.

A :class:`Graph` is a list of :class:`Node` objects over named :class:`Tensor`
values. Every quantized operator carries exactly the integer parameters the NPU
uses (see ``firmware/isa.py``): fixed-point multipliers and shifts, zero points
and clamps in the int8 domain, int32 biases with the activation zero point
already folded in. Floats exist only at the boundary (:class:`Quantize`,
:class:`Dequantize`) and in CPU-fallback nodes.

Conventions
-----------
* Quantized activations are ``int8``. A tensor that the outside world sees as
  ``uint8`` (ONNX QUInt8) holds ``value - 128`` and has ``io_dtype="uint8"``;
  graph inputs and outputs are converted at the boundary by the runtime.
* ``real = scale * (q - zero_point)`` with ``zero_point`` in the int8 domain.
* Nodes run on the NPU unless ``device == "cpu"`` (the importer's CPU fallback,
  and int32-output GEMMs the NPU cannot store).
* ``If`` branches are graphs without inputs of their own: they read tensors of
  the enclosing graph by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from firmware.quant import requantize

from .errors import ModelError

DTYPES = {
    "int8": np.int8, "int32": np.int32, "int64": np.int64,
    "float32": np.float32, "bool": np.bool_,
}
"""IR element types and their numpy equivalents."""

DEVICES = ("npu", "cpu")

Shape = tuple[int, ...]


@dataclass(frozen=True)
class QParams:
    """Per-tensor quantization: ``real = scale * (q - zero_point)``, int8 domain."""

    scale: float
    zero_point: int

    def __post_init__(self):
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale {self.scale!r} must be positive and finite")
        if not -128 <= self.zero_point <= 127:
            raise ValueError(f"zero point {self.zero_point} outside int8")


@dataclass
class Tensor:
    """A named value of a graph.

    Members
    -------
    name : unique name in its graph (and the graphs it can see).
    shape : static shape.
    dtype : one of :data:`DTYPES`.
    quant : quantization of an int8 tensor, when known (informative: the
        operators carry the integer parameters they use).
    data : the value of a constant, else ``None``.
    io_dtype : ``"uint8"`` when the outside world sees ``value + 128``.
    """

    name: str
    shape: Shape
    dtype: str
    quant: QParams | None = None
    data: np.ndarray | None = None
    io_dtype: str | None = None

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        if self.dtype not in DTYPES:
            raise ValueError(f"tensor {self.name!r}: dtype {self.dtype!r} not in {list(DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: negative dimension in {self.shape}")
        if self.io_dtype not in (None, "uint8"):
            raise ValueError(f"tensor {self.name!r}: io_dtype {self.io_dtype!r}")
        if self.data is not None:
            self.data = np.asarray(self.data, dtype=DTYPES[self.dtype]).reshape(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_const(self) -> bool:
        return self.data is not None


@dataclass(frozen=True)
class Requant:
    """The ``vreq`` parameters: ``clamp(zp + rshift_rne(acc * mult, shift), lo, hi)``.

    ``mult`` is int32, ``shift`` 0..63, ``zp``/``lo``/``hi`` int8 (ReLU is ``lo = zp``).
    Per-channel requantization (``vqtab`` + ``vreq ... tab=1``) gives ``mult`` and
    ``shift`` as tuples, one entry per output channel; zero point and clamp stay
    per tensor.
    """

    mult: int | tuple[int, ...]
    shift: int | tuple[int, ...]
    zp: int
    lo: int = -128
    hi: int = 127

    def __post_init__(self):
        per_channel = [np.ndim(v) > 0 for v in (self.mult, self.shift)]
        if any(per_channel):
            mult = tuple(int(v) for v in np.broadcast_to(self.mult, np.shape(
                self.mult if per_channel[0] else self.shift)))
            shift = tuple(int(v) for v in np.broadcast_to(self.shift, (len(mult),)))
            if not mult:
                raise ValueError("per-channel requant without channels")
        else:
            mult, shift = int(self.mult), int(self.shift)
        object.__setattr__(self, "mult", mult)
        object.__setattr__(self, "shift", shift)
        for m in np.atleast_1d(mult):
            if not -(1 << 31) <= m < (1 << 31):
                raise ValueError(f"requant multiplier {m} outside int32")
        for sh in np.atleast_1d(shift):
            if not 0 <= sh <= 63:
                raise ValueError(f"requant shift {sh} outside 0..63")
        for what in ("zp", "lo", "hi"):
            if not -128 <= getattr(self, what) <= 127:
                raise ValueError(f"requant {what} {getattr(self, what)} outside int8")
        if self.lo > self.hi:
            raise ValueError(f"requant clamp [{self.lo}, {self.hi}] is empty")

    @property
    def per_channel(self) -> bool:
        """One multiplier and shift per output channel (the NPU's requantization table)."""
        return isinstance(self.mult, tuple)

    def apply(self, acc, channel_shape=(-1,)) -> np.ndarray:
        """Requantize int32 accumulators to int8 exactly as the NPU does; per-channel
        parameters are reshaped to ``channel_shape`` (the output channels' axis)."""
        if not self.per_channel:
            return requantize(acc, self.mult, self.shift, self.zp, self.lo, self.hi)
        mult = np.asarray(self.mult, dtype=np.int64).reshape(channel_shape)
        shift = np.asarray(self.shift, dtype=np.int64).reshape(channel_shape)
        return requantize(acc, mult, shift, self.zp, self.lo, self.hi)


# ---- nodes ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Node:
    """An operator instance. Subclasses add their parameters.

    Members
    -------
    name : unique node name.
    inputs, outputs : tensor names.
    device : ``"npu"`` or ``"cpu"`` (placement; the semantics do not change).
    """

    name: str
    inputs: list[str]
    outputs: list[str]
    device: str = field(default="npu", kw_only=True)

    op: ClassVar[str] = "?"
    arity: ClassVar[tuple[int, int]] = (1, 1)  # (inputs, outputs)

    def infer(self, ins: list[Tensor]) -> list[tuple[Shape, str]]:
        """Output (shape, dtype) pairs for these inputs; raise :class:`ModelError`."""
        raise NotImplementedError

    def check(self):
        """Check the node's own parameters; raise :class:`ModelError` naming the node."""

    def _need(self, t: Tensor, *dtypes: str):
        if t.dtype not in dtypes:
            raise ModelError(f"{self.op} input {t.name!r} has dtype {t.dtype}, "
                             f"expected {' or '.join(dtypes)}", self.name)

    def _fail(self, message: str):
        raise ModelError(f"{self.op}: {message}", self.name)

    def __repr__(self):
        return f"<{self.op} {self.name} {self.inputs} -> {self.outputs} on {self.device}>"


def _check_int8(node: Node, **values):
    for what, v in values.items():
        if not -128 <= int(v) <= 127:
            node._fail(f"{what} {v} outside int8")


def _check_bias(node: Node, bias, shape: tuple[int, ...]):
    if bias is None:
        return
    if not isinstance(bias, np.ndarray) or bias.dtype != np.int32 or bias.shape != shape:
        node._fail(f"bias must be int32 of shape {shape}, got "
                   f"{getattr(bias, 'dtype', type(bias))} {getattr(bias, 'shape', '')}")


def _check_weight(node: Node, w: np.ndarray):
    # The NPU's weight tiles are int8; wider weights (a weight zero point pushed
    # W - zw out of int8) are only legal on the CPU.
    if w.dtype == np.int8:
        return
    if w.dtype == np.int16 and node.device == "cpu":
        return
    node._fail(f"weights are {w.dtype}: the NPU takes int8 weights "
               "(int16 only on CPU-fallback nodes)")


@dataclass(eq=False)
class QGemm(Node):
    """``y = requant(x @ weight + bias)`` (MatMul/Gemm/fully connected).

    ``x`` is int8 ``(..., K)``; ``weight`` int8 ``(K, N)`` (or ``(B, K, N)`` with
    ``x`` of shape ``(B, M, K)``: one GEMM per batch); ``bias`` int32 ``(N,)``
    (``(B, N)`` for batched weights) with the input zero point folded in
    (``bias - zx * colsum(W)``); the int32 accumulation and bias add wrap.
    Without ``requant`` the output is the int32 accumulator (MatMulInteger): the
    NPU cannot store it, so such nodes are CPU nodes.
    """

    weight: np.ndarray = None
    bias: np.ndarray | None = None
    requant: Requant | None = None
    op: ClassVar[str] = "QGemm"

    def check(self):
        w = self.weight
        if not isinstance(w, np.ndarray) or w.ndim not in (2, 3):
            self._fail("weight must be a 2-D or 3-D array")
        _check_weight(self, w)
        _check_bias(self, self.bias, (*w.shape[:-2], w.shape[-1]))
        if self.requant is None and self.device != "cpu":
            self._fail("an int32-output GEMM (no requant) must run on the CPU")
        _check_channels(self, w.shape[-1])

    def infer(self, ins):
        (x,) = ins
        self._need(x, "int8")
        w = self.weight
        if len(x.shape) < 1 or x.shape[-1] != w.shape[-2]:
            self._fail(f"input {x.name!r} {x.shape} does not match weights {w.shape}")
        if w.ndim == 3 and (len(x.shape) != 3 or x.shape[0] != w.shape[0]):
            self._fail(f"batched weights {w.shape} need an input of shape "
                       f"({w.shape[0]}, M, {w.shape[1]}), got {x.shape}")
        return [((*x.shape[:-1], w.shape[-1]), "int8" if self.requant else "int32")]


def _check_channels(node, channels: int):
    """A per-channel requantization has one multiplier and shift per output channel."""
    r = node.requant
    if r is not None and r.per_channel and len(r.mult) != channels:
        node._fail(f"per-channel requant of {len(r.mult)} channels for {channels} outputs")


def conv_out_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int) -> int:
    """Output length of a convolution or pooling window along one axis (floor mode)."""
    return (size + pad_lo + pad_hi - kernel) // stride + 1


@dataclass(eq=False)
class QConv(Node):
    """2-D convolution, NCHW, dilation 1: ``y = requant(conv(x, weight) + bias)``.

    ``weight`` int8 ``(OC, C / group, KH, KW)``; with ``group`` > 1 the input
    channels and the output channels split into ``group`` equal groups and output
    group ``g`` reads input group ``g`` only (``group == C == OC``: depthwise).
    ``pads`` = (top, left, bottom, right) filled with ``pad_value`` (the input zero
    point, so padding is a real zero: the bias already holds ``-zx * sum(W[oc])``).
    Without ``requant`` the output is the int32 accumulator (ConvInteger, CPU only).
    """

    weight: np.ndarray = None
    bias: np.ndarray | None = None
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    pad_value: int = 0
    requant: Requant | None = None
    group: int = 1
    op: ClassVar[str] = "QConv"

    @property
    def is_depthwise(self) -> bool:
        """One input channel per output channel (``group == C == OC``)."""
        return self.group > 1 and self.weight.shape[:2] == (self.group, 1)

    def check(self):
        w = self.weight
        if not isinstance(w, np.ndarray) or w.ndim != 4:
            self._fail("weight must be a 4-D (OC, C, KH, KW) array")
        _check_weight(self, w)
        _check_bias(self, self.bias, (w.shape[0],))
        _check_int8(self, pad_value=self.pad_value)
        if len(self.strides) != 2 or min(self.strides) < 1:
            self._fail(f"strides {self.strides} must be two positive ints")
        if len(self.pads) != 4 or min(self.pads) < 0:
            self._fail(f"pads {self.pads} must be four non-negative ints")
        if self.requant is None and self.device != "cpu":
            self._fail("an int32-output convolution (no requant) must run on the CPU")
        _check_channels(self, w.shape[0])
        if self.group < 1 or w.shape[0] % self.group:
            self._fail(f"group {self.group} does not divide the {w.shape[0]} output channels")

    def infer(self, ins):
        (x,) = ins
        self._need(x, "int8")
        oc, cg, kh, kw = self.weight.shape
        c = cg * self.group
        if len(x.shape) != 4 or x.shape[1] != c:
            self._fail(f"input {x.name!r} {x.shape} is not NCHW with {c} channels")
        pt, pl, pb, pr = self.pads
        oh = conv_out_size(x.shape[2], kh, self.strides[0], pt, pb)
        ow = conv_out_size(x.shape[3], kw, self.strides[1], pl, pr)
        if oh < 1 or ow < 1:
            self._fail(f"kernel {kh}x{kw} larger than the padded input {x.shape}")
        return [((x.shape[0], oc, oh, ow), "int8" if self.requant else "int32")]


@dataclass(eq=False)
class QAdd(Node):
    """Element-wise add (``vadd``), same shapes:
    ``y = clamp(zp + rshift_rne(mul_a*(a - zp_a) + mul_b*(b - zp_b), shift), lo, hi)``.
    """

    mul_a: int = 1
    mul_b: int = 1
    zp_a: int = 0
    zp_b: int = 0
    shift: int = 0
    zp: int = 0
    lo: int = -128
    hi: int = 127
    op: ClassVar[str] = "QAdd"
    arity: ClassVar[tuple[int, int]] = (2, 1)

    def check(self):
        for what in ("mul_a", "mul_b"):
            if not -(1 << 31) <= getattr(self, what) < (1 << 31):
                self._fail(f"{what} {getattr(self, what)} outside int32")
        if not 0 <= self.shift <= 63:
            self._fail(f"shift {self.shift} outside 0..63")
        _check_int8(self, zp_a=self.zp_a, zp_b=self.zp_b, zp=self.zp, lo=self.lo, hi=self.hi)
        if self.lo > self.hi:
            self._fail(f"clamp [{self.lo}, {self.hi}] is empty")

    def infer(self, ins):
        a, b = ins
        self._need(a, "int8")
        self._need(b, "int8")
        if a.shape != b.shape:
            self._fail(f"inputs {a.name!r} {a.shape} and {b.name!r} {b.shape} differ in shape "
                       "(the NPU adds equal shapes only)")
        return [(a.shape, "int8")]


@dataclass(eq=False)
class Clip(Node):
    """``y = clamp(x, lo, hi)`` on int8 (``vclip``; standalone ReLU is ``lo = zp``)."""

    lo: int = -128
    hi: int = 127
    op: ClassVar[str] = "Clip"

    def check(self):
        _check_int8(self, lo=self.lo, hi=self.hi)
        if self.lo > self.hi:
            self._fail(f"clamp [{self.lo}, {self.hi}] is empty")

    def infer(self, ins):
        self._need(ins[0], "int8")
        return [(ins[0].shape, "int8")]


def _check_window(node: Node):
    """A pooling node's strides and pads (smaller than its two-int kernel)."""
    if len(node.strides) != 2 or min(node.strides) < 1:
        node._fail(f"strides {node.strides} must be two positive ints")
    if len(node.pads) != 4 or min(node.pads) < 0:
        node._fail(f"pads {node.pads} must be four non-negative ints")
    if max(node.pads[0], node.pads[2]) >= node.kernel[0] or \
            max(node.pads[1], node.pads[3]) >= node.kernel[1]:
        node._fail(f"pads {node.pads} must be smaller than the kernel {node.kernel}")


@dataclass(eq=False)
class MaxPool(Node):
    """2-D max pooling on int8 NCHW (two ``vmax`` passes); padding never wins (-128 fill)."""

    kernel: tuple[int, int] = (2, 2)
    strides: tuple[int, int] = (2, 2)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    op: ClassVar[str] = "MaxPool"

    def check(self):
        if len(self.kernel) != 2 or min(self.kernel) < 1 or max(self.kernel) > 255:
            self._fail(f"kernel {self.kernel} must be two ints in 1..255 (vmax window)")
        _check_window(self)

    def infer(self, ins):
        (x,) = ins
        self._need(x, "int8")
        if len(x.shape) != 4:
            self._fail(f"input {x.name!r} {x.shape} is not NCHW")
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.strides, self.pads
        oh = conv_out_size(x.shape[2], kh, sh, pt, pb)
        ow = conv_out_size(x.shape[3], kw, sw, pl, pr)
        if oh < 1 or ow < 1:
            self._fail(f"kernel {self.kernel} larger than the padded input {x.shape}")
        return [((*x.shape[:2], oh, ow), "int8")]


@dataclass(eq=False)
class QAvgPool(Node):
    """2-D average pooling on int8 NCHW:
    ``y = requant(sum over the window of (x - zero_point))``.

    The input is padded with ``zero_point``, so padding adds nothing to a window's
    sum; ``requant`` divides by the window count (its multiplier holds
    ``s_x / (s_y * count)``), one count for every window of the node (ONNX
    ``count_include_pad = 1``, or windows that never cover padding). Global
    average pooling is a ``kernel`` of the input's whole H x W.
    """

    kernel: tuple[int, int] = (2, 2)
    strides: tuple[int, int] = (2, 2)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    zero_point: int = 0
    requant: Requant = None
    op: ClassVar[str] = "QAvgPool"

    def check(self):
        if len(self.kernel) != 2 or min(self.kernel) < 1:
            self._fail(f"kernel {self.kernel} must be two positive ints")
        _check_window(self)
        _check_int8(self, zero_point=self.zero_point)
        if not isinstance(self.requant, Requant):
            self._fail("average pooling needs its requantization (the 1/count scale)")

    infer = MaxPool.infer


@dataclass(eq=False)
class Flatten(Node):
    """Reshape to 2-D ``(prod(shape[:axis]), prod(shape[axis:]))`` (no data movement)."""

    axis: int = 1
    op: ClassVar[str] = "Flatten"

    def infer(self, ins):
        (x,) = ins
        r = len(x.shape)
        axis = self.axis + r if self.axis < 0 else self.axis
        if not 0 <= axis <= r:
            self._fail(f"axis {self.axis} out of range for rank {r}")
        return [((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))), x.dtype)]


@dataclass(eq=False)
class Reshape(Node):
    """Reshape to a static ``shape`` with the same element count (no data movement)."""

    shape: tuple[int, ...] = ()
    op: ClassVar[str] = "Reshape"

    def infer(self, ins):
        (x,) = ins
        if any(d < 0 for d in self.shape) or int(np.prod(self.shape)) != x.size:
            self._fail(f"cannot reshape {x.name!r} {x.shape} to {tuple(self.shape)}")
        return [(tuple(self.shape), x.dtype)]


@dataclass(eq=False)
class ArgMax(Node):
    """Index (int64) of the first maximum along ``axis`` (``vargmax`` per vector)."""

    axis: int = 0
    keepdims: bool = True
    op: ClassVar[str] = "ArgMax"

    def infer(self, ins):
        (x,) = ins
        self._need(x, "int8", "int32", "int64")
        r = len(x.shape)
        axis = self.axis + r if self.axis < 0 else self.axis
        if not 0 <= axis < r or x.shape[axis] == 0:
            self._fail(f"axis {self.axis} out of range for {x.shape}")
        shape = list(x.shape)
        if self.keepdims:
            shape[axis] = 1
        else:
            del shape[axis]
        return [(tuple(shape), "int64")]


@dataclass(eq=False)
class Equal(Node):
    """``y = (x == value)`` as bool; against a constant, it becomes a branch compare."""

    value: int = 0
    op: ClassVar[str] = "Equal"

    def infer(self, ins):
        self._need(ins[0], "int8", "int32", "int64")
        return [(ins[0].shape, "bool")]


@dataclass(eq=False)
class If(Node):
    """Data-dependent branch: runs ``then_graph`` or ``else_graph`` on a bool scalar.

    Both branches produce the node's outputs in order, with equal shapes and dtypes.
    """

    then_graph: Graph = None
    else_graph: Graph = None
    op: ClassVar[str] = "If"
    arity: ClassVar[tuple[int, int]] = (1, -1)

    def check(self):
        for which in ("then_graph", "else_graph"):
            g = getattr(self, which)
            if not isinstance(g, Graph):
                self._fail(f"{which} is not a Graph")
            if len(g.outputs) != len(self.outputs):
                self._fail(f"{which} has {len(g.outputs)} outputs, the node "
                           f"{len(self.outputs)}")

    def infer(self, ins):
        (c,) = ins
        self._need(c, "bool")
        if c.size != 1:
            self._fail(f"condition {c.name!r} has shape {c.shape}, expected one element")
        return []  # checked against the branches by Graph.validate


@dataclass(eq=False)
class Quantize(Node):
    """Boundary op on the CPU: float32 -> int8, ``sat(rne(x / scale) + zp)`` (float32 divide)."""

    scale: float = 1.0
    zp: int = 0
    op: ClassVar[str] = "Quantize"

    def check(self):
        if not (np.isfinite(self.scale) and self.scale > 0):
            self._fail(f"scale {self.scale!r} must be positive and finite")
        _check_int8(self, zp=self.zp)

    def infer(self, ins):
        self._need(ins[0], "float32")
        return [(ins[0].shape, "int8")]


@dataclass(eq=False)
class Dequantize(Node):
    """Boundary op on the CPU: int8 -> float32, ``(x - zp) * scale`` in float32."""

    scale: float = 1.0
    zp: int = 0
    op: ClassVar[str] = "Dequantize"

    check = Quantize.check

    def infer(self, ins):
        self._need(ins[0], "int8")
        return [(ins[0].shape, "float32")]


@dataclass(eq=False)
class FoldRows(Node):
    """Layout op on the CPU: an NCHW image's rows folded into its channels,
    ``factor`` rows at a time, ``step`` rows apart (0: ``factor``, no row twice),
    after ``top`` and ``bottom`` rows of ``fill``.

    Output ``(N, factor * C, (top + H + bottom - factor) / step + 1, W)``: channel
    ``p * C + c`` of row ``i`` is row ``i * step + p - top`` of channel ``c``.
    The compiler inserts it where a convolution with a row stride runs faster on
    the folded rows (:mod:`host.compiler.foldrows`): the host writes the input
    in the order the array reads it, and the values do not change.
    """

    factor: int = 2
    top: int = 0
    bottom: int = 0
    fill: int = 0
    step: int = 0
    op: ClassVar[str] = "FoldRows"

    @property
    def row_step(self) -> int:
        """Input rows from one folded row to the next."""
        return self.step or self.factor

    def check(self):
        if self.device != "cpu":
            self._fail("FoldRows runs on the CPU")
        if self.factor < 2 or min(self.top, self.bottom) < 0:
            self._fail(f"factor {self.factor} must be at least 2 and the added rows "
                       f"({self.top}, {self.bottom}) non-negative")
        if not 0 <= self.step <= self.factor:
            self._fail(f"step {self.step} must be 0 or 1 to the factor {self.factor}")
        _check_int8(self, fill=self.fill)

    def infer(self, ins):
        (x,) = ins
        self._need(x, "int8")
        if len(x.shape) != 4:
            self._fail(f"input {x.name!r} {x.shape} is not NCHW")
        n, c, h, w = x.shape
        rows = self.top + h + self.bottom - self.factor
        if rows < 0 or rows % self.row_step:
            self._fail(f"{rows + self.factor} rows do not fold by {self.factor} "
                       f"{self.row_step} apart")
        return [((n, self.factor * c, rows // self.row_step + 1, w), "int8")]


@dataclass(eq=False)
class CpuOp(Node):
    """An ONNX node the NPU cannot run, executed on the CPU (import's CPU fallback).

    Members
    -------
    onnx_node : the serialized ``onnx.NodeProto``.
    onnx_in_types, onnx_out_types : ONNX element types of its inputs and outputs
        (``uint8`` values are converted from/to the int8 domain around the call).
    out_specs : ``(shape, dtype)`` of each output, from ONNX shape inference (or,
        where it cannot type the node, from onnxruntime running it once).
    opsets : the ``(domain, version)`` opset imports of the model the node came
        from, every domain (``ai.onnx.ml``, ``com.microsoft``, ...).
    """

    onnx_node: bytes = b""
    onnx_in_types: tuple[int, ...] = ()
    onnx_out_types: tuple[int, ...] = ()
    out_specs: tuple[tuple[Shape, str], ...] = ()
    opsets: tuple[tuple[str, int], ...] = (("", 17),)
    op: ClassVar[str] = "CpuOp"
    arity: ClassVar[tuple[int, int]] = (-1, -1)

    def check(self):
        if self.device != "cpu":
            self._fail("a CpuOp must run on the CPU")

    def infer(self, ins):
        return [(tuple(s), d) for s, d in self.out_specs]


OPS = {c.op: c for c in (QGemm, QConv, QAdd, Clip, MaxPool, QAvgPool, Flatten, Reshape, ArgMax,
                         Equal, If, Quantize, Dequantize, FoldRows, CpuOp)}
"""Every IR operator class by name."""


# ---- graphs --------------------------------------------------------------------------------


@dataclass(eq=False)
class Graph:
    """A dataflow graph of :class:`Node` over :class:`Tensor`.

    Members
    -------
    name : graph name.
    tensors : every tensor the graph defines (inputs, constants, node outputs).
    nodes : the nodes; :meth:`validate` puts them in topological order.
    inputs, outputs : boundary tensor names (branch graphs have no inputs).
    notes : what the importer decided on the user's behalf (a symbolic batch
        dimension bound to 1), one line each, for the user to read.
    """

    name: str = "graph"
    tensors: dict[str, Tensor] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_tensor(self, t: Tensor) -> Tensor:
        """Add a tensor; raise :class:`ModelError` if the name is taken."""
        if t.name in self.tensors:
            raise ModelError(f"tensor {t.name!r} defined twice")
        self.tensors[t.name] = t
        return t

    def node(self, name: str) -> Node:
        """Find a node of this graph by name (``KeyError`` if absent)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def producer(self, tensor: str) -> Node | None:
        """The node of this graph that writes ``tensor`` (None for inputs and constants)."""
        return next((n for n in self.nodes if tensor in n.outputs), None)

    def consumers(self, tensor: str) -> list[Node]:
        """Nodes of this graph reading ``tensor`` (If nodes count when a branch reads it)."""
        return [n for n in self.nodes if tensor in n.inputs or tensor in _outer_reads(n)]

    def walk(self) -> Iterable[tuple[Graph, Node]]:
        """Yield ``(graph, node)`` for every node, branch bodies included."""
        for n in self.nodes:
            yield self, n
            if isinstance(n, If):
                yield from n.then_graph.walk()
                yield from n.else_graph.walk()

    def topo_order(self) -> list[Node]:
        """The nodes in a dependency order (stable); raise :class:`ModelError` on a cycle."""
        produced = {o: n for n in self.nodes for o in n.outputs}
        order, state = [], {}

        def visit(n: Node, stack: list[str]):
            s = state.get(n.name)
            if s == "done":
                return
            if s == "active":
                raise ModelError(f"cycle through {' -> '.join(stack + [n.name])}", n.name)
            state[n.name] = "active"
            for t in list(n.inputs) + sorted(_outer_reads(n)):
                p = produced.get(t)
                if p is not None:
                    visit(p, stack + [n.name])
            state[n.name] = "done"
            order.append(n)

        for n in self.nodes:
            visit(n, [])
        return order

    def validate(self, outer: dict[str, Tensor] | None = None) -> Graph:
        """Check the graph and sort its nodes; return ``self``.

        Raises :class:`ModelError` naming the offending node on an undefined or
        doubly-produced tensor, a bad parameter, or a shape/dtype mismatch
        between a node and its declared output tensors. ``outer`` is the scope a
        branch body can read.
        """
        outer = outer or {}
        names = set()
        for n in self.nodes:
            if n.name in names:
                raise ModelError("node name used twice", n.name)
            names.add(n.name)
            if n.device not in DEVICES:
                raise ModelError(f"device {n.device!r} not in {DEVICES}", n.name)
        for name in self.inputs:
            if name not in self.tensors:
                raise ModelError(f"graph input {name!r} has no tensor")
        writers: dict[str, str] = {}
        for n in self.nodes:
            for o in n.outputs:
                if o in writers or o in self.inputs or (o in self.tensors
                                                        and self.tensors[o].is_const):
                    raise ModelError(f"tensor {o!r} is written twice", n.name)
                writers[o] = n.name
        self.nodes = self.topo_order()
        visible = dict(outer)
        for name, t in self.tensors.items():
            if name in self.inputs or t.is_const:
                visible[name] = t
        for n in self.nodes:
            ins, nin, nout = [], *n.arity
            if nin >= 0 and len(n.inputs) != nin or nout >= 0 and len(n.outputs) != nout:
                raise ModelError(f"{n.op} takes {nin} input(s) and {nout} output(s), got "
                                 f"{len(n.inputs)} and {len(n.outputs)}", n.name)
            for i in n.inputs:
                if i not in visible:
                    raise ModelError(f"input {i!r} is not defined before the node "
                                     "(dangling or missing initializer)", n.name)
                ins.append(visible[i])
            n.check()
            specs = n.infer(ins)
            if isinstance(n, If):
                specs = self._validate_if(n, visible)
            for o, (shape, dtype) in zip(n.outputs, specs, strict=True):
                t = self.tensors.get(o)
                if t is None:
                    raise ModelError(f"output {o!r} has no tensor", n.name)
                if t.dtype != dtype:
                    raise ModelError(f"dtype mismatch: output {o!r} is declared {t.dtype}, "
                                     f"{n.op} produces {dtype}", n.name)
                if t.shape != tuple(shape):
                    raise ModelError(f"shape mismatch: output {o!r} is declared {t.shape}, "
                                     f"{n.op} produces {tuple(shape)}", n.name)
                visible[o] = t
        for name in self.outputs:
            if name not in visible:
                raise ModelError(f"graph output {name!r} is never produced")
        return self

    def _validate_if(self, n: If, visible: dict[str, Tensor]):
        specs = None
        for which in ("then_graph", "else_graph"):
            g = getattr(n, which)
            if g.inputs:
                raise ModelError(f"{which} must not have inputs", n.name)
            g.validate(visible)
            scope = {**visible, **g.tensors}
            got = [(scope[o].shape, scope[o].dtype) for o in g.outputs]
            if specs is not None and got != specs:
                raise ModelError(f"the branches disagree on their outputs: {specs} vs {got}",
                                 n.name)
            specs = got
        return specs

    def subgraph(self, sid: int, node_names: Iterable[str]) -> Subgraph:
        """Make a :class:`Subgraph` record of some nodes of this graph with its edges.

        Inputs are tensors the nodes read but do not produce (constants excluded);
        outputs are tensors they produce that other nodes or the graph outputs read.
        """
        chosen = [self.node(nm) for nm in node_names]
        inside = {n.name for n in chosen}
        produced = {o for n in chosen for o in n.outputs}
        inputs, outputs = [], []
        for n in chosen:
            for t in list(n.inputs) + sorted(_outer_reads(n)):
                tensor = self.tensors.get(t)
                if t not in produced and t not in inputs and not (tensor and tensor.is_const):
                    inputs.append(t)
            for o in n.outputs:
                used_outside = o in self.outputs or any(
                    c.name not in inside for c in self.consumers(o))
                if used_outside:
                    outputs.append(o)
        return Subgraph(sid, [n.name for n in chosen], inputs, outputs)

    def summary(self) -> str:
        """A readable listing: one line per node with shapes and placement."""
        lines = [f"graph {self.name}: inputs {self.inputs} -> outputs {self.outputs}"]
        for g, n in self.walk():
            shapes = [g.tensors[o].shape if o in g.tensors else "?" for o in n.outputs]
            lines.append(f"  {n.op:<10} {n.name:<24} {n.inputs} -> {n.outputs} {shapes}"
                         f"{'  [cpu]' if n.device == 'cpu' else ''}")
        return "\n".join(lines)


def _outer_reads(n: Node) -> set[str]:
    """Tensors an If node's branches read from the enclosing scope."""
    if not isinstance(n, If):
        return set()
    reads = set()
    for g in (n.then_graph, n.else_graph):
        own = set(g.tensors)
        for _, inner in g.walk():
            reads.update(t for t in inner.inputs if t not in own)
        reads.update(t for t in g.outputs if t not in own)
    return reads


@dataclass(eq=False)
class Subgraph:
    """A unit the compiler compiles and the adaptive runtime profiles, fuses and splits.

    Members
    -------
    id : region id (the ``region`` marks carry it).
    nodes : names of the graph nodes it covers.
    inputs, outputs : the tensors on its edges.
    exec_count : how often it has run.
    resources : resource use (scratchpad bytes, tag slots, instructions, ...).
    instructions : its compiled program (empty until compiled).
    history : ``(event, reason)`` entries (compiled, fused, split, promoted, ...).
    """

    id: int
    nodes: list[str]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    exec_count: int = 0
    resources: dict = field(default_factory=dict)
    instructions: list = field(default_factory=list)
    history: list[tuple[str, str]] = field(default_factory=list)

    def record(self, event: str, reason: str = ""):
        """Append a history entry."""
        self.history.append((event, reason))
