"""ONNX import: quantized ONNX models to the host IR (:mod:`host.ir`).

Accepted forms (see docs/compiler.md for the full table):

* QOperator models: ``QLinearMatMul``, ``QLinearConv``, ``MatMulInteger``,
  ``ConvInteger`` and integer ``Add``/``Relu``/``Clip``/``MaxPool``/
  ``Flatten``/``Reshape``/``ArgMax`` on int8/uint8 tensors.
* QDQ models as onnxruntime's quantizer writes them: ``QuantizeLinear`` /
  ``DequantizeLinear`` around ``MatMul``/``Gemm``/``Conv`` (grouped and
  depthwise too)/``Add``/``Relu``/``Clip``/``MaxPool``/``AveragePool``/
  ``GlobalAveragePool`` (and the shape ops), weights and int32 biases as
  ``DequantizeLinear`` of constants, per-tensor scales or symmetric per-channel
  weight scales (requantized per output channel on the NPU).
* onnxruntime's ``com.microsoft`` ``QGemm``, ``QLinearAdd``,
  ``QLinearAveragePool`` and ``QLinearGlobalAveragePool``.
* ``Equal`` of an integer tensor against a constant feeding ``If``; both branch
  bodies are imported recursively.

With ``allow_cpu_fallback=True`` whatever the NPU cannot run (any op of any
domain, or a form the NPU lacks: asymmetric per-channel weights, average pooling
that excludes padding from its count, ...) runs on the CPU (:mod:`host.cpu_fallback`)
instead of aborting.

The importer reads the graph in order and keeps each ONNX value as a lazy
abstract value (an IR tensor, the dequantized view of one, a constant, or a
float result still waiting for its ``QuantizeLinear``), so a
``DQ -> MatMul -> [Relu] -> Q`` chain becomes one ``QGemm`` with integer
parameters, and nothing float reaches the NPU. uint8 tensors become int8 by
subtracting 128 from values and zero points; graph inputs and outputs keep
``io_dtype="uint8"`` so the runtime converts them back.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import signal
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from firmware.quant import quantize_multiplier, quantize_multipliers_shared

from .builder import clamp_bounds, fold_bias, requant_for
from .cpu_fallback import infer_outputs, single_node_model
from .errors import REPAIR_HINT, ModelError, UnsupportedOpError
from .ir import (
    ArgMax,
    Clip,
    CpuOp,
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
from .isolate import ChildCrashed, ChildTimedOut, run_isolated

__all__ = ["load_onnx", "freeze_inputs", "SUPPORTED_OPS", "SUPPORTED_CONTRIB_OPS"]

SUPPORTED_OPS = (
    "QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger",
    "QuantizeLinear", "DequantizeLinear", "MatMul", "Gemm", "Conv", "Add", "Relu", "Clip",
    "MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Squeeze",
    "Unsqueeze", "ArgMax", "Equal", "If", "Constant", "Identity",
)
"""ONNX operators (default domain) the importer maps to NPU operators."""

SUPPORTED_CONTRIB_OPS = ("QGemm", "QLinearAdd", "QLinearAveragePool", "QLinearGlobalAveragePool")
"""onnxruntime's ``com.microsoft`` operators the importer maps to NPU operators."""

IMPORT_TIMEOUT_S = 300.0
"""How long one of the import's C++ steps (the checker, the shape inference of a
CPU-fallback node) may take before the model is refused: the zoo's largest model
passes them in well under a second, so only a hang in C++ code (or a model far beyond
any NPU's memory) comes near it; they never run unbounded."""

_REQUANTIZE = ("quantize the model again (onnxruntime.quantization.quantize_static) with "
               "calibration data covering its inputs")
"""What to do about quantization parameters no NPU requantizer can express."""

# ONNX element type -> (IR dtype, io_dtype)
_ONNX_TYPES = {
    TensorProto.INT8: ("int8", None),
    TensorProto.UINT8: ("int8", "uint8"),
    TensorProto.INT32: ("int32", None),
    TensorProto.INT64: ("int64", None),
    TensorProto.FLOAT: ("float32", None),
    TensorProto.BOOL: ("bool", None),
}


def _onnx_type(t: Tensor) -> int:
    if t.io_dtype == "uint8":
        return TensorProto.UINT8
    return {"int8": TensorProto.INT8, "int32": TensorProto.INT32, "int64": TensorProto.INT64,
            "float32": TensorProto.FLOAT, "bool": TensorProto.BOOL}[t.dtype]


# ---- abstract values ---------------------------------------------------------------------


@dataclass
class _TensorRef:
    """A value held in an IR tensor, by the tensor's name."""

    name: str


@dataclass
class _DequantTensor:
    """The float view ``scale * (q - zp)`` of the int8 IR tensor ``q`` (zp int8 domain)."""

    q: str
    scale: np.floating
    zp: int


@dataclass
class _Constant:
    """A constant known at import time (its array carries the dtype)."""

    value: np.ndarray


@dataclass
class _DequantConst:
    """``DequantizeLinear`` of a constant integer tensor (weights, biases)."""

    q: np.ndarray  # int64, original domain
    scale: np.ndarray  # float, scalar or per-axis
    zp: np.ndarray  # int64, same shape as scale
    axis: int = 1

    @property
    def value(self) -> np.ndarray:
        s = _expand(self.scale, self.q.ndim, self.axis)
        z = _expand(self.zp, self.q.ndim, self.axis)
        return ((self.q.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)


def _expand(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    if v.size <= 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


@dataclass
class _PendingOp:
    """A float MatMul/Gemm/Conv/Add/Relu/Clip/AveragePool result awaiting its
    QuantizeLinear."""

    kind: str  # "gemm", "conv", "add", "clip", "avgpool"
    root: onnx.NodeProto  # the operator the NPU node is named after (Conv, not its Relu)
    node: onnx.NodeProto  # outermost ONNX node (for the CPU fallback)
    args: list  # that node's input values
    x: _DequantTensor | None = None
    w: _DequantConst | None = None
    bias: object = None  # _DequantConst or _Constant (float), or None
    b: _DequantTensor | None = None  # second operand of an add
    attrs: dict = field(default_factory=dict)
    lo: float = -np.inf  # fused real clamp
    hi: float = np.inf


# ---- entry points ------------------------------------------------------------------------


def freeze_inputs(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """Return a copy of ``model`` whose graph inputs named in ``values`` are initializers.

    The ONNX backend tests feed weights, scales and zero points as inputs; the
    NPU needs them constant at import time.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    keep = [i for i in g.input if i.name not in values]
    missing = set(values) - {i.name for i in g.input}
    if missing:
        raise ValueError(f"no graph inputs named {sorted(missing)}")
    for name, value in values.items():
        g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    del g.input[:]
    g.input.extend(keep)
    return model


def load_onnx(model, *, allow_cpu_fallback: bool = False, dims: dict | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ``ModelProto``) into a validated IR graph.

    Parameters
    ----------
    model : the model.
    allow_cpu_fallback : run what the NPU cannot (unsupported operators, float
        results that are never requantized, weights that leave int8 after their
        zero point) on the CPU, marked ``device="cpu"``, instead of failing.
    dims : values for symbolic input dimensions, by name. A graph input's
        symbolic *leading* dimension is its batch: without a value it is bound
        to 1 (one inference per run) and ``Graph.notes`` says so. Any other
        symbolic dimension needs a value here, else the import is refused
        naming the input and the dimension.

    Raises
    ------
    UnsupportedOpError : (without fallback) an operator or form the NPU does not
        support, naming the node, the op type, its domain, the supported
        alternatives and ``allow_cpu_fallback=True``.
    ModelError : a malformed model (checker failure, missing initializer,
        dangling input) or a shape/dtype/range problem, naming the node; or a model
        on which onnx's or onnxruntime's C++ code crashes.
    """
    proto = _load_proto(model)
    _check_references(proto.graph, set())
    _in_child(_check_model, proto)
    _check_attributes(proto.graph)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise ModelError("the model does not import the default ONNX opset",
                         fix="add an opset import for domain '' (ai.onnx), e.g. "
                         "onnx.helper.make_opsetid('', 17)")
    opsets = tuple(sorted((o.domain, o.version) for o in proto.opset_import))
    imp = _Importer(proto.graph.name or "model", opset, allow_cpu_fallback, dims or {},
                    opsets=opsets)
    imp._reserved.update(_value_names(proto.graph))
    try:
        return imp.import_main(proto.graph).validate()
    except ModelError as e:
        raise imp.locate(e) from None


def _in_child(fn, *args):
    """``fn(*args)`` in a forked child (:func:`host.isolate.run_isolated`): onnx's checker
    and shape inference and onnxruntime's inference of contrib outputs run C++ that a
    hostile model can crash (a signal, not an exception), so a crash or a hang there is
    a refused model. Only these steps fork: the rest of the import is Python."""
    _warm_onnx_schemas()
    try:
        return run_isolated(fn, *args, timeout=IMPORT_TIMEOUT_S)
    except ChildTimedOut as e:
        raise ModelError(f"onnx's C++ code did not finish the model within {e.seconds:g} s "
                         "(it hangs on it, or the model is far larger than the NPU's "
                         "memory)", fix=REPAIR_HINT) from None
    except ChildCrashed as e:
        how = signal.Signals(e.signal).name if e.signal else f"exit status {e.status}"
        raise ModelError(f"the model crashes onnx's C++ code while importing ({how})",
                         fix=REPAIR_HINT) from None


@functools.cache
def _warm_onnx_schemas() -> None:
    """Build onnx's operator schema registry here, once, so that every child inherits it:
    built in each child instead, it is most of the child's CPU (resnet8's check: 21 ms
    of CPU in a cold child, 5 ms in a warm one; a child that does nothing: 4 ms)."""
    onnx.defs.get_schema("Relu")


def _check_model(proto: onnx.ModelProto):
    """onnx.checker's verdict, naming the node it complains about."""
    try:
        onnx.checker.check_model(proto)
    except UnicodeDecodeError:  # a string field holds bytes that are not UTF-8
        raise ModelError("onnx.checker: a name or string attribute is not valid UTF-8",
                         fix="fix the model so that onnx.checker.check_model accepts it"
                         ) from None
    except onnx.checker.ValidationError as e:
        text = str(e).strip()
        err = ModelError(f"onnx.checker: {text.splitlines()[0]}",
                         fix="fix the model so that onnx.checker.check_model accepts it")
        for k, n in enumerate(proto.graph.node):  # the checker's context names the node
            if n.name and f"Name: {n.name} OpType: {n.op_type}" in text:
                err.locate(n.name, k, n.op_type, n.domain, err.fix)
                break
        raise err from None


# Attributes every standard operator that has them needs positive, and that onnx's
# C++ shape inference divides by without checking: a zero stride there is a
# floating-point exception that kills the process, not an error it raises.
POSITIVE_ATTRIBUTES = ("strides", "dilations", "kernel_shape", "group", "blocksize")
_STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft")


# Pooling whose padding reaches a whole window: the window averages nothing (NaN in
# onnx's reference evaluator); onnxruntime refuses it ("Pad should be smaller than
# kernel").
_POOLS = ("AveragePool", "MaxPool", "LpPool")


def _check_attributes(g: onnx.GraphProto):
    """Refuse a node whose :data:`POSITIVE_ATTRIBUTES` are not positive, or a pooling
    whose padding is not smaller than its kernel (in every subgraph too), before
    anything hands the model to onnx or onnxruntime."""
    for k, n in enumerate(g.node):
        attrs = {}
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _check_attributes(a.g)
            values = list(a.ints) if a.type == onnx.AttributeProto.INTS else [a.i]
            attrs[a.name] = values
            if n.domain not in _STANDARD_DOMAINS or a.name not in POSITIVE_ATTRIBUTES:
                continue
            if a.type not in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS) or \
                    any(v < 1 for v in values):
                _refuse_attribute(n, k, f"attribute {a.name} is {values}: it must be "
                                  "positive integers", "export the model with positive "
                                  f"values (or without {a.name}, for its default)")
        kernel, pads = attrs.get("kernel_shape", []), attrs.get("pads", [])
        if n.op_type in _POOLS and n.domain in _STANDARD_DOMAINS and \
                len(pads) == 2 * len(kernel) and any(
                    p >= kernel[i % len(kernel)] for i, p in enumerate(pads)):
            _refuse_attribute(n, k, f"pads {pads} reach a whole {kernel} window: each must "
                              "be smaller than the kernel", "export the model with less "
                              "padding")


def _refuse_attribute(n: onnx.NodeProto, k: int, reason: str, fix: str):
    raise ModelError(reason, fix=fix).locate(n.name or f"{n.op_type}#{k}", k, n.op_type,
                                             n.domain)


def _load_proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):  # a copy: the importer names unnamed nodes
        return onnx.ModelProto.FromString(model.SerializeToString())
    try:
        if isinstance(model, bytes | bytearray):
            return onnx.load_model_from_string(bytes(model))
        return onnx.load(str(Path(model)))
    except FileNotFoundError:
        raise
    except Exception as e:  # protobuf decode errors have no common base
        raise ModelError(f"cannot read the model: {e}") from None


def _value_names(g: onnx.GraphProto) -> set[str]:
    names = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        names.update(o for o in n.output if o)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= _value_names(a.g)
    return names


def _check_references(g: onnx.GraphProto, outer: set[str]):
    """Every node input is defined before use (name the node with the dangling one)."""
    known = set(outer) | {i.name for i in g.input} | {t.name for t in g.initializer}
    known |= {t.name for t in g.sparse_initializer}
    for k, n in enumerate(g.node):
        for i in n.input:
            if i and i not in known:
                raise ModelError(f"input {i!r} is neither a graph input, an initializer nor "
                                 "an earlier node's output (missing initializer or dangling "
                                 "input)", fix="add the initializer or connect the input "
                                 "to the node that should produce it").locate(
                                     n.name or f"{n.op_type}#{k}", k, n.op_type, n.domain)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _check_references(a.g, known)
        known.update(o for o in n.output if o)
    for o in g.output:
        if o.name not in known:
            raise ModelError(f"graph output {o.name!r} is never produced",
                             fix="remove the output or connect it to a node's output")


# ---- the importer ------------------------------------------------------------------------


class _Importer:
    def __init__(self, name: str, opset: int, fallback: bool, dims: dict,
                 parent: _Importer | None = None, opsets: tuple = ()):
        self.graph = Graph(name)
        self.opset, self.fallback, self.dims, self.parent = opset, fallback, dims, parent
        self.opsets = parent.opsets if parent else (opsets or (("", opset),))
        self.env: dict[str, object] = {}
        self._names = parent._names if parent else set()  # tensor names in use
        self._node_names = parent._node_names if parent else set()
        self._reserved = parent._reserved if parent else set()  # every ONNX value name
        self._counter = parent._counter if parent else itertools.count()
        self._dq_cache: dict = {}
        self._positions: dict[str, tuple[int, str, str]] = {}  # node name -> index, op, domain

    # -- scopes and names --
    def lookup(self, name: str):
        imp = self
        while imp is not None:
            if name in imp.env:
                return imp.env[name]
            imp = imp.parent
        raise ModelError(f"value {name!r} is not defined")

    def tensor(self, name: str) -> Tensor:
        imp = self
        while imp is not None:
            if name in imp.graph.tensors:
                return imp.graph.tensors[name]
            imp = imp.parent
        raise KeyError(name)

    def fresh(self, base: str, onnx_name: bool = False) -> str:
        """A new tensor name: ``base`` itself if free (internal names never take an
        ONNX value's name, which is reserved for that value)."""
        name = base
        while name in self._names or (name in self._reserved and not onnx_name):
            name = f"{base}:{next(self._counter)}"
            onnx_name = False
        self._names.add(name)
        return name

    def fresh_node(self, base: str) -> str:
        name, k = base, 0
        while name in self._node_names:
            k += 1
            name = f"{base}:{k}"
        self._node_names.add(name)
        return name

    def emit(self, node: Node, out_names: list[str], quant: QParams | None = None,
             io_dtype: str | None = None) -> list[str]:
        """Add an IR node; outputs get the given names (made unique)."""
        node.name = self.fresh_node(node.name)
        try:
            node.check()
            specs = node.infer([self.tensor(i) for i in node.inputs])
        except ValueError as e:
            if isinstance(e, ModelError):
                raise
            raise ModelError(str(e), node.name) from None
        outs = []
        for base, (shape, dtype) in zip(out_names, specs, strict=True):
            t = Tensor(self.fresh(base, base in self._reserved), shape, dtype,
                       quant if dtype == "int8" else None,
                       io_dtype=io_dtype if dtype == "int8" else None)
            self.graph.add_tensor(t)
            outs.append(t.name)
        node.outputs = outs
        self.graph.nodes.append(node)
        return outs

    def add_const(self, base: str, value: np.ndarray, onnx_type: int) -> str:
        dtype, io = _ir_type(onnx_type, base)
        if io == "uint8":
            value = value.astype(np.int16) - 128
        t = Tensor(self.fresh(base), value.shape, dtype, data=value, io_dtype=io)
        self.graph.add_tensor(t)
        return t.name

    # -- graphs --
    def import_main(self, g: onnx.GraphProto) -> Graph:
        inits = {t.name for t in g.initializer}
        for t in g.initializer:
            self.env[t.name] = _Constant(numpy_helper.to_array(t))
        for t in g.sparse_initializer:
            raise ModelError(f"sparse initializer {t.values.name!r} is not supported",
                             fix="store it dense (onnx.numpy_helper.from_array)")
        for vi in g.input:
            if vi.name in inits:
                continue  # IR < 4 lists initializers as inputs too
            dtype, io = _ir_type(vi.type.tensor_type.elem_type, vi.name)
            shape = self._static_shape(vi, self.graph.notes)
            self.graph.add_tensor(Tensor(self.fresh(vi.name, True), shape, dtype, io_dtype=io))
            self.graph.inputs.append(vi.name)
            self.env[vi.name] = _TensorRef(vi.name)
        self.import_nodes(g)
        for vo in g.output:
            name = self.materialize_as(self.lookup(vo.name), vo.name)
            self.graph.outputs.append(name)
            self._check_declared(vo, self.graph.tensors[name])
        return self.graph

    def _static_shape(self, vi: onnx.ValueInfoProto, notes: list[str]) -> tuple[int, ...]:
        """The input's shape with its symbolic dimensions bound (see :func:`load_onnx`)."""
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise ModelError(f"graph input {vi.name!r} has no shape",
                             fix="export the model with the input's shape")
        shape = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                if d.dim_value < 1:  # an empty tensor: nothing for the NPU to compute
                    raise ModelError(f"graph input {vi.name!r} has the size {d.dim_value} at "
                                     f"axis {axis}", fix="export the model with sizes of at "
                                     "least 1")
                shape.append(d.dim_value)
                continue
            label = repr(d.dim_param) if d.dim_param else "(unnamed)"
            if d.dim_param in self.dims:
                shape.append(int(self.dims[d.dim_param]))
            elif axis == 0:
                shape.append(1)
                notes.append(f"input {vi.name!r}: symbolic batch dimension {label} bound to 1 "
                             "(one inference per run)")
            else:
                fix = (f"pass dims={{{d.dim_param!r}: N}} to load_onnx" if d.dim_param else
                       "name it in the export (torch: dynamic_axes) and pass dims=") + \
                    ", or export the model with a fixed size for it"
                raise ModelError(f"graph input {vi.name!r} has the symbolic dimension {label} "
                                 f"at axis {axis}: only a leading (batch) dimension binds "
                                 "by itself", fix=fix)
            if shape[-1] < 1:
                raise ModelError(f"dims gives {label} the value {shape[-1]}",
                                 fix="pass a positive size")
        return tuple(shape)

    def _check_declared(self, vo: onnx.ValueInfoProto, t: Tensor):
        tt = vo.type.tensor_type
        producer = self.graph.producer(t.name)
        where = producer.name if producer else ""
        if tt.elem_type and _ir_type(tt.elem_type, vo.name) != (t.dtype, t.io_dtype):
            raise ModelError(f"dtype mismatch: output {vo.name!r} is declared "
                             f"{TensorProto.DataType.Name(tt.elem_type)}, the model computes "
                             f"{t.io_dtype or t.dtype}", where)
        if tt.HasField("shape"):
            declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if len(declared) != len(t.shape) or any(
                    d is not None and d != s for d, s in zip(declared, t.shape, strict=False)):
                raise ModelError(f"shape mismatch: output {vo.name!r} is declared {declared}, "
                                 f"the model computes {list(t.shape)}", where)

    def import_nodes(self, g: onnx.GraphProto):
        for k, node in enumerate(g.node):
            if not node.name:
                node.name = f"{node.op_type}#{k}"
            self._positions[node.name] = (k, node.op_type, node.domain)
            try:
                self._import_node(node)
            except ModelError as e:
                raise self.locate(e, node.name) from None

    def _import_node(self, node: onnx.NodeProto):
        handler = self._handler(node)
        if handler is None:
            return self.unsupported(node, "no NPU mapping")
        try:
            handler(node, [self.lookup(i) if i else None for i in node.input], _attrs(node))
        except _NotOnNpu as e:
            self.unsupported(node, e.reason)
        except ValueError as e:  # a value the IR refuses (a scale of inf, ...)
            if isinstance(e, ModelError):
                raise
            raise ModelError(str(e), node.name) from None

    def locate(self, e: ModelError, current: str = "") -> ModelError:
        """Name the ONNX node an error is about: its index, op and domain (the node
        the error names, else ``current``, the node being imported)."""
        if e.located:
            return e
        imp = self
        for name in (e.node, e.node.rpartition(":")[0], current):
            imp = self
            while imp is not None and name not in imp._positions:
                imp = imp.parent
            if name and imp is not None:
                return e.locate(name, *imp._positions[name])
        return e

    def _handler(self, node: onnx.NodeProto):
        """The ``op_*`` method that maps ``node`` to NPU operators, or None."""
        prefix = {"": "op_", "ai.onnx": "op_", "com.microsoft": "op_ms_"}.get(node.domain)
        return getattr(self, prefix + node.op_type, None) if prefix else None

    # -- values --
    def materialize(self, v) -> str:
        """An IR tensor name holding the value (emits Dequantize / constants / CPU ops)."""
        if isinstance(v, _TensorRef):
            return v.name
        if isinstance(v, _DequantTensor):
            key = (v.q, float(v.scale), v.zp)
            if key not in self._dq_cache:
                node = Dequantize(f"{v.q}:dequantize", [v.q], [], scale=float(v.scale),
                                  zp=v.zp, device="cpu")
                self._dq_cache[key] = self.emit(node, [f"{v.q}:float"])[0]
            return self._dq_cache[key]
        if isinstance(v, _Constant):
            return self.add_const("const", v.value, _np_to_onnx(v.value.dtype))
        if isinstance(v, _DequantConst):
            return self.add_const("const", v.value, TensorProto.FLOAT)
        if isinstance(v, _PendingOp):
            out = self.cpu_node(v.node, v.args, "its float result is never requantized by a "
                                "QuantizeLinear")
            return out[0].name
        raise AssertionError(v)

    def materialize_as(self, v, name: str) -> str:
        """Materialize ``v`` as a tensor called ``name`` (graph outputs keep ONNX names)."""
        if isinstance(v, _DequantTensor) and name not in self._names:
            node = Dequantize(f"{v.q}:dequantize", [v.q], [], scale=float(v.scale), zp=v.zp,
                              device="cpu")
            out = self.emit(node, [name])[0]
        else:
            t = self.materialize(v)
            if t == name and t in self.graph.tensors:
                return t
            src = self.tensor(t)  # an identity reshape gives it the ONNX name
            out = self.emit(Reshape(f"{name}:alias", [t], [], shape=src.shape,
                                    device="cpu" if src.dtype != "int8" else "npu"),
                            [name], src.quant, src.io_dtype)[0]
        if out != name:
            raise ModelError(f"graph output name {name!r} is taken by another value")
        return out

    def unsupported(self, node: onnx.NodeProto, reason: str):
        """Run ``node`` on the CPU under fallback; else refuse it naming the reason."""
        if not self.fallback:
            raise UnsupportedOpError(node.op_type, node.name, reason, _alternatives(node),
                                     node.domain)
        vals = [self.lookup(i) if i else None for i in node.input]
        view = self._shared_view(node, vals)
        if view is None:
            return self.cpu_node(node, vals, reason)
        ints = [_TensorRef(x.q) if isinstance(x, _DequantTensor) else x for x in vals]
        outs = self.cpu_node(node, ints, reason)
        self.bind(node, *[_DequantTensor(o.name, view.scale, view.zp) for o in outs])

    @staticmethod
    def _shared_view(node, vals) -> _DequantTensor | None:
        """For an op that only moves values (:data:`_MOVES`) whose data inputs are
        dequantized views with one scale and zero point: that view. The op then runs
        on the int8 values and its outputs keep the view (exact: the float round trip
        returns the same integers), so no float tensor appears."""
        data = _MOVES.get((node.domain or "", node.op_type))
        if data is None:
            return None
        xs, rest = (vals, []) if data == "all" else (vals[:1], vals[1:])
        if not xs or not all(isinstance(x, _DequantTensor) for x in xs) or \
                any(isinstance(r, _DequantTensor | _PendingOp) for r in rest):
            return None
        if len({(float(x.scale), x.zp) for x in xs}) != 1:
            return None
        return xs[0]

    def cpu_node(self, node: onnx.NodeProto, vals: list, reason: str) -> list[_TensorRef]:
        """Run an ONNX node on the CPU (the fallback); binds and returns its outputs."""
        if not self.fallback:
            raise UnsupportedOpError(node.op_type, node.name, reason, _alternatives(node),
                                     node.domain)
        ins = [self.materialize(v) for v in vals if v is not None]
        in_t = [self.tensor(i) for i in ins]
        proto = onnx.NodeProto.FromString(node.SerializeToString())
        it = iter(ins)
        renamed = [next(it) if n else "" for n in proto.input]
        del proto.input[:]
        proto.input.extend(renamed)
        outs = [self.fresh(o, True) for o in node.output]
        del proto.output[:]
        proto.output.extend(outs)
        specs = self._infer_cpu(proto, in_t, node.name)
        cpu = CpuOp(node.name, ins, [], device="cpu", onnx_node=proto.SerializeToString(),
                    onnx_in_types=tuple(_onnx_type(t) for t in in_t),
                    onnx_out_types=tuple(et for et, _, _ in specs),
                    out_specs=tuple((shape, dtype) for _, shape, dtype in specs),
                    opsets=self.opsets)
        cpu.name = self.fresh_node(node.name)
        cpu.outputs = outs
        for o, (et, shape, dtype) in zip(outs, specs, strict=True):
            io = "uint8" if et == TensorProto.UINT8 else None
            self.graph.add_tensor(Tensor(o, shape, dtype, io_dtype=io))
        self.graph.nodes.append(cpu)
        results = [_TensorRef(o) for o in outs]
        for name, r in zip(node.output, results, strict=True):
            self.env[name] = r
        return results

    def _infer_cpu(self, proto: onnx.NodeProto, ins: list[Tensor], where: str):
        """``(element type, shape, IR dtype)`` of each output of a CPU-fallback node."""
        inputs, inits, seen = [], [], set()
        for t in ins:
            if t.name in seen:
                continue
            seen.add(t.name)
            if t.is_const:
                value = t.data.astype(np.int16) + 128 if t.io_dtype == "uint8" else t.data
                arr = value.astype(np.uint8) if t.io_dtype == "uint8" else value
                inits.append(numpy_helper.from_array(arr, t.name))
            inputs.append((t.name, _onnx_type(t), t.shape))
        model = single_node_model(proto, inputs, [TensorProto.UNDEFINED] * len(proto.output),
                                  self.opsets, inits)
        outputs = list(zip(proto.output, _in_child(infer_outputs, model, where), strict=True))
        for o, (_, shape) in outputs:
            if 0 in shape:  # nothing downstream (the NPU, the report) computes on it
                raise ModelError(f"output {o!r} is empty: shape {list(shape)}", where,
                                 fix="check the node's attributes against its input's "
                                 "shape (a kernel larger than the padded input?)")
        return [(et, shape, _ir_type(et, o, where)[0]) for o, (et, shape) in outputs]

    def const(self, node, v, what: str) -> np.ndarray:
        """A constant input (scale, zero point, weight, shape...)."""
        if isinstance(v, _Constant):
            return v.value
        if isinstance(v, _DequantConst):
            return v.value
        raise _NotConst(f"{what} must be a constant (initializer or Constant)")

    def bind(self, node: onnx.NodeProto, *values):
        for name, v in zip(node.output, values, strict=False):
            if name:
                self.env[name] = v

    def int8_input(self, node, v, what: str) -> Tensor:
        """A raw int8/uint8 IR tensor operand of a QOperator/integer op."""
        if isinstance(v, _Constant) and v.value.dtype in (np.int8, np.uint8):
            v = _TensorRef(self.add_const(f"{node.name}:{what}", v.value,
                                          _np_to_onnx(v.value.dtype)))
        if not isinstance(v, _TensorRef) or self.tensor(v.name).dtype != "int8":
            kind = self.tensor(v.name).dtype if isinstance(v, _TensorRef) else type(v).__name__
            raise ModelError(f"dtype mismatch: {what} must be an int8 or uint8 tensor, got "
                             f"{kind}", node.name)
        return self.tensor(v.name)

    # ---- QOperator / integer ops ------------------------------------------------------------
    def op_QLinearMatMul(self, node, v, a):
        self._linear_q(node, v[0], v[1:3], v[3], v[4:6], v[6:8], None, "gemm", a)

    def op_QLinearConv(self, node, v, a):
        self._linear_q(node, v[0], v[1:3], v[3], v[4:6], v[6:8], v[8] if len(v) > 8 else None,
                       "conv", a)

    def op_MatMulInteger(self, node, v, a):
        self._linear_q(node, v[0], (None, _get(v, 2)), v[1], (None, _get(v, 3)), None, None,
                       "gemm", a)

    def op_ConvInteger(self, node, v, a):
        self._linear_q(node, v[0], (None, _get(v, 2)), v[1], (None, _get(v, 3)), None, None,
                       "conv", a)

    # ---- onnxruntime's com.microsoft QOperator ops ------------------------------------------
    def op_ms_QGemm(self, node, v, a):
        """``Y = alpha * A' B' + C``, C int32 at scale ``alpha * a_scale * b_scale``: a
        QLinearMatMul with a bias where ``alpha = 1``, A untransposed and Y quantized."""
        if a.get("transA", 0):
            raise _NotOnNpu("transA=1")
        if a.get("alpha", 1.0) != 1.0:
            raise _NotOnNpu(f"alpha={a['alpha']} (the NPU takes alpha = 1)")
        if _get(v, 7) is None:
            raise _NotOnNpu("float output (no y_scale)")
        wv = v[3]
        if a.get("transB", 0) and isinstance(wv, _Constant):
            wv = _Constant(wv.value.T)
        self._linear_q(node, v[0], v[1:3], wv, v[4:6], (v[7], _get(v, 8)),
                       self._row_bias(_get(v, 6)), "gemm", a)

    @staticmethod
    def _row_bias(c):
        """QGemm's C as the per-column bias the NPU adds (None, or broadcast rows refused)."""
        if c is None or not isinstance(c, _Constant):
            return c
        if c.value.ndim == 2 and c.value.shape[0] == 1 or c.value.ndim == 1:
            return _Constant(c.value.reshape(-1))
        raise _NotOnNpu(f"a bias C of shape {c.value.shape} (the NPU adds one per column)")

    def op_ms_QLinearAdd(self, node, v, a):
        """``C = (sa (A - za) + sb (B - zb)) / sc + zc`` as the NPU's ``vadd``."""
        if isinstance(v[0], _Constant) or isinstance(v[3], _Constant):
            raise _NotOnNpu("a constant operand")
        ta, tb = self.int8_input(node, v[0], "A"), self.int8_input(node, v[3], "B")
        try:
            sa, sb, sc = (self.const(node, v[i], "scales") for i in (1, 4, 6))
            za, zb, zc = (None if _get(v, i) is None else self.const(node, v[i], "zero points")
                          for i in (2, 5, 7))
        except _NotConst as e:
            raise _NotOnNpu(str(e)) from None
        io = ta.io_dtype
        if tb.io_dtype != io:
            raise ModelError(f"dtype mismatch: QLinearAdd of {io or 'int8'} and "
                             f"{tb.io_dtype or 'int8'}", node.name)
        u8 = io == "uint8"
        dq_a = _DequantTensor(ta.name, self._one_scale(node, sa, "A"),
                              self._zero_point(node, za, u8, "A"))
        dq_b = _DequantTensor(tb.name, self._one_scale(node, sb, "B"),
                              self._zero_point(node, zb, u8, "B"))
        out = self._requant_add(node, dq_a, dq_b, 1.0, self._one_scale(node, sc, "C"),
                                self._zero_point(node, zc, u8, "C"), io)
        self.bind(node, _TensorRef(out))

    def _one_scale(self, node, s: np.ndarray, what: str) -> np.floating:
        """A positive per-tensor float scale (its own float type kept)."""
        if s.dtype.kind != "f":
            raise ModelError(f"dtype mismatch: {what} scale must be a float tensor", node.name)
        if s.size != 1:
            raise _NotOnNpu(f"per-axis {what} scales")
        if not s.reshape(-1)[0] > 0:
            raise ModelError(f"{what} scale {s.reshape(-1)[0]} must be positive", node.name,
                             fix=_REQUANTIZE)
        return s.reshape(-1)[0]

    def _linear_q(self, node, xv, xq, wv, wq, yq, bias_v, kind, attrs):
        """QLinearMatMul/QLinearConv (``yq`` given) and MatMulInteger/ConvInteger."""
        x = self.int8_input(node, xv, "input")
        try:
            w = self.const(node, wv, "the weight (second) operand")
            consts = [None if c is None else self.const(node, c, "scales and zero points")
                      for c in (*xq, *wq, *(yq or ()))]
            bias = None if bias_v is None else self.const(node, bias_v, "the bias")
        except _NotConst as e:
            return self.unsupported(node, str(e))
        sx, zx, sw, zw = consts[:4]
        if w.dtype not in (np.int8, np.uint8):
            raise ModelError(f"dtype mismatch: weights are {w.dtype}, expected int8/uint8",
                             node.name)
        zx8 = self._zero_point(node, zx, x.io_dtype == "uint8", "input")
        wi = self._weights(node, w, zw, kind)
        if bias is not None and bias.dtype != np.int32:
            raise ModelError(f"dtype mismatch: bias is {bias.dtype}, expected int32", node.name)
        requant, io = None, None
        if yq is not None:
            sy, zy = consts[4:6]
            if zy is None:  # defaults to uint8 0
                zy = np.zeros((), np.uint8)
            io = "uint8" if zy.dtype == np.uint8 else None
            zy8 = self._zero_point(node, zy, io == "uint8", "output")
            scale = self._combined_scale(node, sx, sw, sy)
            if np.ndim(scale):  # per output channel
                self._per_channel_weights(kind, wi.shape, 0 if kind == "conv"
                                          else wi.ndim - 1, 0 if zw is None else zw)
                if np.size(scale) != (wi.shape[0] if kind == "conv" else wi.shape[-1]):
                    raise ModelError(f"{np.size(scale)} weight scales for weights "
                                     f"{wi.shape}", node.name)
            else:
                wi, bias, scale = _common_factor(wi, bias, scale)
            requant = self._requant(node, scale, zy8)
        weight, wide = self._fit_int8(node, wi)
        device = "cpu" if (requant is None or wide) else "npu"
        quant = QParams(float(np.asarray(consts[4]).reshape(-1)[0]), requant.zp) \
            if requant else None
        out = self._emit_linear(node, kind, x.name, weight, bias, zx8, requant, attrs, device,
                                quant, io, node.output[0])
        self.bind(node, _TensorRef(out))

    def _emit_linear(self, node, kind, x, weight, bias, zx8, requant, attrs, device, quant,
                     io, out_name) -> str:
        try:
            if kind == "gemm":
                b = fold_bias(bias, zx8, weight.astype(np.int64).sum(axis=-2))
                ir = QGemm(node.name, [x], [], weight=weight, bias=b, requant=requant,
                           device=device)
            else:
                b = fold_bias(bias, zx8, weight.astype(np.int64).sum(axis=(1, 2, 3)))
                xs = self.tensor(x).shape
                strides, pads, dilations = self._conv_geometry(node, attrs, xs,
                                                               weight.shape[2:])
                weight = _dilate(weight, dilations)
                ir = QConv(node.name, [x], [], weight=weight, bias=b, strides=strides,
                           pads=pads, pad_value=zx8, requant=requant, device=device,
                           group=attrs.get("group", 1))
        except ValueError as e:
            if isinstance(e, ModelError):
                raise
            raise ModelError(str(e), node.name) from None
        return self.emit(ir, [out_name], quant, io)[0]

    def _conv_geometry(self, node, attrs, xshape, kshape):
        """``(strides, pads, dilations)`` of a 2-D convolution the NPU can run."""
        group = attrs.get("group", 1)
        if len(xshape) == 4 and (group < 1 or xshape[1] % group):
            raise ModelError(f"group {group} does not divide the {xshape[1]} input channels",
                             node.name)
        if len(kshape) != 2 or len(xshape) != 4:
            raise _NotOnNpu("only 2-D NCHW convolutions")
        if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(kshape):
            raise ModelError(f"shape mismatch: kernel_shape {attrs['kernel_shape']} vs "
                             f"weights {tuple(kshape)}", node.name)
        strides = tuple(attrs.get("strides", [1, 1]))
        dilations = tuple(attrs.get("dilations", [1, 1]))
        if len(dilations) != 2 or min(dilations) < 1:
            raise ModelError(f"dilations {list(dilations)} are not two positive integers",
                             node.name)
        span = tuple((k - 1) * d + 1 for k, d in zip(kshape, dilations, strict=True))
        pads = _pads(node, attrs, xshape[2:], span, strides)
        return strides, pads, dilations

    def _zero_point(self, node, z, is_uint8: bool, what: str) -> int:
        """A per-tensor zero point moved to the int8 domain (dtype checked)."""
        if z is None:
            return -128 if is_uint8 else 0
        if z.dtype not in (np.int8, np.uint8) or (z.dtype == np.uint8) != is_uint8:
            raise ModelError(f"dtype mismatch: {what} zero point is {z.dtype} but the "
                             f"{what} is {'uint8' if is_uint8 else 'int8'}", node.name)
        flat = np.unique(z.reshape(-1))
        if flat.size != 1:
            raise _NotOnNpu(f"per-axis {what} zero points")
        return int(flat[0]) - (128 if is_uint8 else 0)

    def _weights(self, node, w: np.ndarray, zw, kind: str) -> tuple[np.ndarray, bool]:
        """``W - zw`` (int64, not yet fitted to int8)."""
        wi = w.astype(np.int64)
        if zw is not None:
            if zw.dtype != w.dtype:
                raise ModelError(f"dtype mismatch: weight zero point is {zw.dtype}, weights "
                                 f"{w.dtype}", node.name)
            z = zw.astype(np.int64)
            if z.size > 1:  # per output channel: conv axis 0, matmul last axis
                if kind == "conv" and z.size == w.shape[0]:
                    z = z.reshape(-1, 1, 1, 1)
                elif kind == "gemm" and z.size == w.shape[-1]:
                    z = z.reshape(-1)
                else:
                    raise ModelError(f"weight zero point of shape {zw.shape} does not match "
                                     f"weights {w.shape}", node.name)
            else:
                z = z.reshape(())
            wi = wi - z
        return wi

    def _fit_int8(self, node, wi: np.ndarray) -> tuple[np.ndarray, bool]:
        if wi.min(initial=0) >= -128 and wi.max(initial=0) <= 127:
            return wi.astype(np.int8), False
        if not self.fallback:
            raise UnsupportedOpError(
                node.op_type, node.name, f"weights minus their zero point span [{wi.min()}, "
                f"{wi.max()}], outside int8: the NPU's weight tiles are int8 (quantize the "
                "weights symmetric)", (), node.domain)
        return wi.astype(np.int16), True

    def _combined_scale(self, node, sx, sw, sy) -> float | np.ndarray:
        """``sx * sw / sy`` computed in the scales' own float type, like ONNX does: one
        per output channel (an array) when the weight scales are per channel."""
        for s, what in ((sx, "input"), (sw, "weight"), (sy, "output")):
            if s is None or s.dtype.kind != "f":
                raise ModelError(f"dtype mismatch: {what} scale must be a float tensor",
                                 node.name)
            if what != "weight" and np.unique(s.reshape(-1)).size != 1:
                raise _NotOnNpu(f"per-axis {what} scales")
            if not np.all(s > 0):
                raise ModelError(f"{what} scale {s.reshape(-1).min()} must be positive",
                                 node.name, fix=_REQUANTIZE)
        one = lambda s: s.reshape(-1)[:1]  # noqa: E731 - keeps the float type
        if np.unique(sw.reshape(-1)).size != 1:
            return one(sx) * sw.reshape(-1) / one(sy)
        return float((one(sx) * one(sw) / one(sy))[0])

    def _requant(self, node, scale: float, zp: int, lo=-np.inf, hi=np.inf,
                 out_scale: float | None = None) -> Requant:
        try:
            clip = (lo, hi) if (np.isfinite(lo) or np.isfinite(hi)) else None
            return requant_for(scale, zp, clip=clip, out_scale=out_scale)
        except ValueError as e:
            raise ModelError(f"requantization scale {scale!r}: {e}", node.name,
                             fix=_REQUANTIZE) from None

    # ---- QDQ --------------------------------------------------------------------------------
    def op_QuantizeLinear(self, node, v, attrs):
        x = v[0]
        try:
            s = self.const(node, v[1], "y_scale")
            z = self.const(node, v[2], "y_zero_point") if _get(v, 2) is not None else None
        except _NotConst as e:
            return self.unsupported(node, str(e))
        out_type = attrs.get("output_dtype", 0)
        if z is None:
            z = np.zeros((), np.uint8 if out_type in (0, TensorProto.UINT8) else np.int8)
        if z.dtype not in (np.int8, np.uint8):
            return self.unsupported(node, f"quantization to {z.dtype} (int8/uint8 only)")
        if attrs.get("block_size", 0):
            return self.unsupported(node, "blocked quantization")
        is_u8 = z.dtype == np.uint8
        io = "uint8" if is_u8 else None
        if s.dtype.kind != "f":
            raise ModelError("dtype mismatch: y_scale must be float", node.name)
        if s.size != 1 or z.size != 1:
            return self.unsupported(node, "per-axis scales")
        scale = s.reshape(-1)[0]
        if not scale > 0:
            raise ModelError(f"scale {scale} must be positive", node.name, fix=_REQUANTIZE)
        zp = self._zero_point(node, z, is_u8, "output")
        out = node.output[0]
        quant = QParams(float(scale), zp)
        if isinstance(x, _PendingOp):
            try:
                return self._emit_pending(node, x, scale, zp, io)
            except _NotOnNpu as e:
                x = self._pending_on_cpu(x, e.reason)
        if isinstance(x, _DequantTensor):
            xt = self.tensor(x.q)
            if float(x.scale) == float(scale) and x.zp == zp:
                if xt.io_dtype == io:
                    return self.bind(node, _TensorRef(x.q))
                # same int8 values, only the outside view changes
                name = self.emit(Reshape(node.name, [x.q], [], shape=xt.shape), [out], quant,
                                 io)[0]
                return self.bind(node, _TensorRef(name))
            return self.bind(node, _TensorRef(self._requant_add(node, x, x, 0.0, scale, zp, io)))
        if isinstance(x, _TensorRef) and self.tensor(x.name).dtype == "float32":
            name = self.emit(Quantize(node.name, [x.name], [], scale=float(scale), zp=zp,
                                      device="cpu"), [out], quant, io)[0]
            return self.bind(node, _TensorRef(name))
        if isinstance(x, _Constant | _DequantConst) and \
                np.asarray(self.const(node, x, "x")).dtype.kind == "f":
            f = np.asarray(self.const(node, x, "x"), dtype=np.float32)
            q = np.clip(np.rint(f / np.float32(scale)) + zp, -128, 127).astype(np.int8)
            t = Tensor(self.fresh(out), q.shape, "int8", quant, data=q, io_dtype=io)
            self.graph.add_tensor(t)
            return self.bind(node, _TensorRef(t.name))
        raise ModelError("dtype mismatch: QuantizeLinear input must be float", node.name)

    def op_DequantizeLinear(self, node, v, attrs):
        x = v[0]
        try:
            s = self.const(node, v[1], "x_scale")
            z = self.const(node, v[2], "x_zero_point") if _get(v, 2) is not None else None
        except _NotConst as e:
            return self.unsupported(node, str(e))
        if attrs.get("block_size", 0):
            return self.unsupported(node, "blocked quantization")
        if s.dtype.kind != "f":
            raise ModelError("dtype mismatch: x_scale must be float", node.name)
        if isinstance(x, _Constant):
            q = x.value
            if q.dtype not in (np.int8, np.uint8, np.int32):
                return self.unsupported(node, f"dequantization of {q.dtype}")
            if z is not None and z.dtype != q.dtype:
                raise ModelError(f"dtype mismatch: zero point {z.dtype}, data {q.dtype}",
                                 node.name)
            zz = np.zeros_like(s, dtype=np.int64) if z is None else z.astype(np.int64)
            axis = attrs.get("axis", 1)
            if s.size > 1 and not -q.ndim <= axis < q.ndim:
                raise ModelError(f"axis {axis} is outside the {q.ndim}-D data", node.name,
                                 fix="set axis to the dimension the scales run along")
            if s.size > 1 and s.size != q.shape[axis]:
                raise ModelError(f"{s.size} scales along axis {axis} of {q.shape[axis]} "
                                 "values", node.name, fix="give one scale per slice")
            return self.bind(node, _DequantConst(q.astype(np.int64), s, zz, axis + q.ndim
                                                 if axis < 0 else axis))
        if isinstance(x, _TensorRef) and self.tensor(x.name).dtype == "int8":
            t = self.tensor(x.name)
            if s.size != 1 or (z is not None and z.size != 1):
                return self.unsupported(node, "per-axis scales on activations")
            if not s.reshape(-1)[0] > 0:
                raise ModelError(f"scale {s.reshape(-1)[0]} must be positive", node.name,
                                 fix=_REQUANTIZE)
            zp = self._zero_point(node, z, t.io_dtype == "uint8", "input")
            if t.quant is None and not t.is_const:
                t.quant = QParams(float(s.reshape(-1)[0]), zp)
            return self.bind(node, _DequantTensor(x.name, s.reshape(-1)[0], zp))
        return self.unsupported(node, "dequantization of a non-int8 runtime tensor")

    def op_MatMul(self, node, v, attrs):
        x, w = v
        if isinstance(x, _DequantTensor) and isinstance(w, _DequantConst) and w.q.ndim in (2, 3):
            return self.bind(node, _PendingOp("gemm", node, node, v, x=x, w=w))
        return self.unsupported(node, "MatMul needs a dequantized activation and "
                                "dequantized constant weights (QDQ)")

    def op_Gemm(self, node, v, attrs):
        x, w, c = v[0], v[1], _get(v, 2)
        if not (isinstance(x, _DequantTensor) and isinstance(w, _DequantConst) and w.q.ndim == 2
                and (c is None or isinstance(c, _DequantConst | _Constant))):
            return self.unsupported(node, "Gemm needs a dequantized activation and "
                                    "dequantized constant weights (QDQ)")
        if attrs.get("transA", 0):
            return self.unsupported(node, "transA=1")
        if attrs.get("transB", 0):
            w = dataclasses.replace(w, q=w.q.T, axis=1 - w.axis)
        p = _PendingOp("gemm", node, node, v, x=x, w=w, bias=c,
                       attrs={"alpha": attrs.get("alpha", 1.0), "beta": attrs.get("beta", 1.0)})
        return self.bind(node, p)

    def op_Conv(self, node, v, attrs):
        x, w, b = v[0], v[1], _get(v, 2)
        if not (isinstance(x, _DequantTensor) and isinstance(w, _DequantConst) and w.q.ndim == 4
                and (b is None or isinstance(b, _DequantConst | _Constant))):
            return self.unsupported(node, "Conv needs a dequantized activation and "
                                    "dequantized constant weights (QDQ)")
        self._conv_geometry(node, attrs, self.tensor(x.q).shape, w.q.shape[2:])
        return self.bind(node, _PendingOp("conv", node, node, v, x=x, w=w, bias=b, attrs=attrs))

    def op_Add(self, node, v, attrs):
        a, b = v
        if isinstance(a, _DequantTensor) and isinstance(b, _DequantTensor):
            return self.bind(node, _PendingOp("add", node, node, v, x=a, b=b))
        for p, c in ((a, b), (b, a)):  # MatMul + Add(bias)
            if isinstance(p, _PendingOp) and p.kind == "gemm" and p.bias is None and \
                    np.isinf(p.lo) and np.isinf(p.hi) and \
                    isinstance(c, _DequantConst | _Constant) and \
                    np.asarray(self.const(node, c, "bias")).dtype.kind == "f" and \
                    np.asarray(self.const(node, c, "bias")).ndim <= 1:
                return self.bind(node, dataclasses.replace(p, node=node, args=v, bias=c))
        if isinstance(a, _TensorRef) and isinstance(b, _TensorRef):
            ta, tb = self.tensor(a.name), self.tensor(b.name)
            if ta.dtype == tb.dtype == "int8":
                if ta.io_dtype != tb.io_dtype:
                    raise ModelError(f"dtype mismatch: Add of {ta.io_dtype or 'int8'} and "
                                     f"{tb.io_dtype or 'int8'}", node.name)
                # integer Add: unit multipliers, zero points -128 for uint8 (saturates)
                z = -128 if ta.io_dtype == "uint8" else 0
                ir = QAdd(node.name, [a.name, b.name], [], mul_a=1, mul_b=1, zp_a=z, zp_b=z,
                          shift=0, zp=z)
                return self.bind(node, _TensorRef(self.emit(ir, [node.output[0]], None,
                                                           ta.io_dtype)[0]))
        return self.unsupported(node, "Add needs two dequantized int8 tensors (QDQ) or two "
                                "int8/uint8 tensors of the same shape")

    def op_Relu(self, node, v, attrs):
        self._clamp(node, v, 0, None)

    def op_Clip(self, node, v, attrs):
        try:
            if self.opset < 11:
                lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
            else:
                lo = self.const(node, v[1], "min") if _get(v, 1) is not None else None
                hi = self.const(node, v[2], "max") if _get(v, 2) is not None else None
        except _NotConst as e:
            return self.unsupported(node, str(e))
        for name, b in (("min", lo), ("max", hi)):
            if b is not None and np.size(b) != 1:
                raise ModelError(f"Clip's {name} has {np.size(b)} values, the operator "
                                 "takes a scalar", node.name,
                                 fix=f"give Clip a one-element {name}")
        lo, hi = (None if b is None else np.asarray(b).reshape(()) for b in (lo, hi))
        self._clamp(node, v, lo, hi)

    def _clamp(self, node, v, lo, hi):
        x = v[0]
        if isinstance(x, _TensorRef) and self.tensor(x.name).dtype == "int8":
            t = self.tensor(x.name)
            shift = 128 if t.io_dtype == "uint8" else 0

            def bound(b, default):
                if b is None:
                    return default
                b = np.asarray(b)
                if b.dtype.kind == "f":
                    if not np.isfinite(b):
                        return default
                    raise ModelError("dtype mismatch: float clip bound on an integer tensor",
                                     node.name)
                return int(np.clip(int(b) - shift, -128, 127))
            lo8, hi8 = bound(lo, -128), bound(hi, 127)
            hi8 = max(hi8, -128)
            lo8 = min(lo8, hi8)  # numpy/ONNX: min > max clamps everything to max
            ir = Clip(node.name, [x.name], [], lo=lo8, hi=hi8)
            return self.bind(node, _TensorRef(self.emit(ir, [node.output[0]], t.quant,
                                                        t.io_dtype)[0]))
        flo = -np.inf if lo is None else float(np.asarray(lo))
        fhi = np.inf if hi is None else float(np.asarray(hi))
        if isinstance(x, _DequantTensor):
            return self.bind(node, _PendingOp("clip", node, node, v, x=x, lo=flo, hi=fhi))
        if isinstance(x, _PendingOp):
            return self.bind(node, dataclasses.replace(
                x, node=node, args=v, lo=max(x.lo, flo), hi=min(x.hi, fhi)))
        return self.unsupported(node, f"{node.op_type} of a float tensor (the NPU computes "
                                "int8: quantize the model)")

    def _pending_on_cpu(self, p: _PendingOp, reason: str) -> _TensorRef:
        """The float chain of ``p`` on the CPU (its QuantizeLinear follows there too)."""
        if not self.fallback:
            raise UnsupportedOpError(p.root.op_type, p.root.name, reason,
                                     _alternatives(p.root), p.root.domain)
        return _TensorRef(self.materialize(p))

    def _emit_pending(self, qnode, p: _PendingOp, sy, zy: int, io):
        """QuantizeLinear of a pending float op: one NPU operator with requantization."""
        name = qnode.output[0]
        quant = QParams(float(sy), zy)
        if p.kind == "clip":
            if float(p.x.scale) == float(sy) and p.x.zp == zy:
                lo, hi = clamp_bounds(zy, clip=(p.lo, p.hi), out_scale=float(sy))
                out = self.emit(Clip(p.root.name, [p.x.q], [], lo=lo, hi=hi), [name], quant,
                                io)[0]
                return self.bind(qnode, _TensorRef(out))
            return self.bind(qnode, _TensorRef(self._requant_add(
                p.root, p.x, p.x, 0.0, sy, zy, io, p.lo, p.hi, name)))
        if p.kind == "add":
            return self.bind(qnode, _TensorRef(self._requant_add(
                p.root, p.x, p.b, 1.0, sy, zy, io, p.lo, p.hi, name)))
        if p.kind == "avgpool":
            return self.bind(qnode, _TensorRef(self._emit_avgpool(
                p.root, p.x, p.attrs["window"], sy, zy, io, p.lo, p.hi, name)))
        # gemm / conv
        w = p.w
        sx = np.asarray(p.x.scale).reshape(1)
        sw = np.asarray(w.scale).reshape(-1)
        if not np.all(sw > 0):
            raise ModelError(f"weight scale {sw.min()} must be positive", p.root.name,
                             fix=_REQUANTIZE)
        if np.unique(sw).size != 1:
            self._per_channel_weights(p.kind, w.q.shape, w.axis, w.zp)
        else:
            sw = sw[:1]
        zw = w.zp.reshape(-1)
        if zw.size > 1:
            if p.kind == "conv" and w.axis == 0:
                zw = zw.reshape(-1, 1, 1, 1)
            elif p.kind == "gemm" and w.axis == w.q.ndim - 1:
                zw = zw.reshape(-1)
            else:
                raise _NotOnNpu("per-axis weight zero points on this axis")
        else:
            zw = zw.reshape(())
        weight, wide = self._fit_int8(p.root, w.q - zw)
        alpha = np.float32(p.attrs.get("alpha", 1.0))
        acc_scale = sx[:1].astype(np.float32) * sw.astype(np.float32)
        scale = acc_scale * alpha / np.float32(sy)  # float32, like onnxruntime
        if scale.size == 1:
            acc_scale, scale = acc_scale[0], float(scale[0])
        bias = self._bias_ints(p, acc_scale, float(p.attrs.get("beta", 1.0)))
        requant = self._requant(p.root, scale, zy, p.lo, p.hi, float(sy))
        if p.kind == "gemm" and weight.ndim == 3 and bias is not None:
            bias = np.broadcast_to(bias, (weight.shape[0], weight.shape[2]))
        out = self._emit_linear(p.root, p.kind, p.x.q, weight, bias, p.x.zp, requant, p.attrs,
                                "cpu" if wide else "npu", quant, io, name)
        return self.bind(qnode, _TensorRef(out))

    def _bias_ints(self, p: _PendingOp, acc_scale, beta: float):
        """The bias in accumulator units (int32, scale ``s_x * s_w``)."""
        c = p.bias
        if c is None:
            return None
        acc = np.asarray(acc_scale, dtype=np.float64).reshape(-1)  # per tensor or channel
        if isinstance(c, _DequantConst) and c.q.dtype.kind == "i" and beta == 1.0 \
                and np.all(c.zp == 0) \
                and c.scale.size in (1, acc.size) \
                and np.allclose(c.scale.reshape(-1).astype(np.float64), acc, rtol=1e-6,
                                atol=0):
            ints = c.q  # onnxruntime writes the bias quantized to s_x * s_w
        else:
            f = c.value if isinstance(c, _DequantConst) else np.asarray(c.value, dtype=np.float32)
            f = f.astype(np.float64)
            ints = np.rint(f * beta / (acc if acc.size > 1 else acc[0]))
        n = p.w.q.shape[0] if p.kind == "conv" else p.w.q.shape[-1]
        ints = np.broadcast_to(np.asarray(ints).reshape(-1) if np.size(ints) > 1
                               else np.asarray(ints).reshape(()), (n,))
        if not np.isfinite(ints).all():  # a NaN or infinite bias value or bias scale
            raise ModelError("the bias is NaN or infinite (its values or its scale)",
                             p.root.name)
        if ints.min() < -(1 << 31) or ints.max() >= 1 << 31:
            raise ModelError("bias leaves int32 at the accumulator scale", p.root.name,
                             fix=_REQUANTIZE)
        return ints.astype(np.int32)

    @staticmethod
    def _per_channel_weights(kind: str, wshape, axis: int, zp):
        """Refuse (to the CPU) per-channel weight scales the NPU's requantization table
        cannot take: not along the output channels, or with non-zero zero points."""
        out_axis = 0 if kind == "conv" else len(wshape) - 1
        if axis != out_axis:
            raise _NotOnNpu(f"per-axis weight scales on axis {axis} (the NPU scales "
                            "output channels)")
        if np.any(np.asarray(zp) != 0):
            raise _NotOnNpu("per-channel weights with non-zero zero points (the NPU takes "
                            "symmetric per-channel weights)")

    def _requant_add(self, node, a: _DequantTensor, b: _DequantTensor, b_weight: float, sy,
                     zy: int, io, lo=-np.inf, hi=np.inf, out_name=None) -> str:
        """``vadd`` requantizing ``a + b_weight*b`` to ``(sy, zy)`` with one shared shift."""
        f32 = np.float32
        ra = float(f32(a.scale) / f32(sy))
        rb = float(f32(b.scale) / f32(sy)) * b_weight
        try:
            (ma, mb), shift = quantize_multipliers_shared([ra, rb])
        except ValueError as e:
            raise ModelError(f"add requantization: {e}", node.name, fix=_REQUANTIZE) from None
        clip = (lo, hi) if (np.isfinite(lo) or np.isfinite(hi)) else None
        lo8, hi8 = clamp_bounds(zy, clip=clip, out_scale=float(sy))
        ta, tb = self.tensor(a.q), self.tensor(b.q)
        if ta.shape != tb.shape:
            raise _NotOnNpu(f"broadcasting {ta.shape} + {tb.shape}")
        ir = QAdd(node.name, [a.q, b.q], [], mul_a=ma, mul_b=mb, zp_a=a.zp, zp_b=b.zp,
                  shift=shift, zp=zy, lo=lo8, hi=hi8)
        return self.emit(ir, [out_name or node.output[0]], QParams(float(sy), zy), io)[0]

    # ---- shape ops and pooling --------------------------------------------------------------
    def _int8_view(self, node, x, make):
        """Apply an int8 op to a raw int8 tensor or under a dequantized view."""
        if isinstance(x, _DequantTensor):
            t = self.tensor(x.q)
            out = self.emit(make(x.q), [f"{node.output[0]}:q"], t.quant, t.io_dtype)[0]
            self.bind(node, _DequantTensor(out, x.scale, x.zp))
            return True
        if isinstance(x, _TensorRef) and self.tensor(x.name).dtype == "int8":
            t = self.tensor(x.name)
            self.bind(node, _TensorRef(self.emit(make(x.name), [node.output[0]], t.quant,
                                                 t.io_dtype)[0]))
            return True
        return None

    def op_MaxPool(self, node, v, attrs):
        if len(node.output) > 1 and node.output[1]:
            return self.unsupported(node, "the Indices output")
        if attrs.get("ceil_mode", 0) or attrs.get("storage_order", 0) or \
                any(d != 1 for d in attrs.get("dilations", [1, 1])):
            return self.unsupported(node, "ceil_mode, storage_order or dilations")
        k = tuple(attrs.get("kernel_shape", ()))
        x = v[0]
        xt = self.tensor(x.q if isinstance(x, _DequantTensor) else x.name) \
            if isinstance(x, _DequantTensor | _TensorRef) else None
        if len(k) != 2 or xt is None or len(xt.shape) != 4:
            return self.unsupported(node, "only 2-D pooling of int8 NCHW tensors")
        strides = tuple(attrs.get("strides", [1, 1]))
        pads = _pads(node, attrs, xt.shape[2:], k, strides)
        done = self._int8_view(node, x, lambda i: MaxPool(node.name, [i], [], kernel=k,
                                                          strides=strides, pads=pads))
        if done is None:
            self.unsupported(node, "MaxPool of a float tensor")

    def op_AveragePool(self, node, v, attrs):
        self._pending_avgpool(node, v, attrs, is_global=False)

    def op_GlobalAveragePool(self, node, v, attrs):
        self._pending_avgpool(node, v, attrs, is_global=True)

    def _pending_avgpool(self, node, v, attrs, is_global: bool):
        """QDQ average pooling: the float mean waits for its QuantizeLinear."""
        x = v[0]
        if not isinstance(x, _DequantTensor):
            return self.unsupported(node, f"{node.op_type} needs a dequantized int8 tensor "
                                    "(QDQ)")
        window = _avgpool_window(node, attrs, self.tensor(x.q).shape, is_global)
        self.bind(node, _PendingOp("avgpool", node, node, v, x=x, attrs={"window": window}))

    def op_ms_QLinearAveragePool(self, node, v, a):
        self._qlinear_avgpool(node, v, a, is_global=False)

    def op_ms_QLinearGlobalAveragePool(self, node, v, a):
        self._qlinear_avgpool(node, v, a, is_global=True)

    def _qlinear_avgpool(self, node, v, attrs, is_global: bool):
        """onnxruntime's quantized average pooling: ``Y = Q(mean(DQ(X)))``."""
        x = self.int8_input(node, v[0], "X")
        try:
            sx, sy = self.const(node, v[1], "x_scale"), self.const(node, v[3], "y_scale")
            zx, zy = (None if _get(v, i) is None else self.const(node, v[i], "zero points")
                      for i in (2, 4))
        except _NotConst as e:
            raise _NotOnNpu(str(e)) from None
        window = _avgpool_window(node, attrs, x.shape, is_global)
        u8 = x.io_dtype == "uint8"
        dq = _DequantTensor(x.name, self._one_scale(node, sx, "X"),
                            self._zero_point(node, zx, u8, "X"))
        out = self._emit_avgpool(node, dq, window, self._one_scale(node, sy, "Y"),
                                 self._zero_point(node, zy, u8, "Y"), x.io_dtype)
        self.bind(node, _TensorRef(out))

    def _emit_avgpool(self, node, x: _DequantTensor, window, sy, zy: int, io, lo=-np.inf,
                      hi=np.inf, out_name=None) -> str:
        """``QAvgPool``: window sums of ``x - zx``, ``s_x / (s_y * count)`` in the requant."""
        kernel, strides, pads = window
        scale = float(x.scale) / (float(sy) * kernel[0] * kernel[1])
        requant = self._requant(node, scale, zy, lo, hi, float(sy))
        ir = QAvgPool(node.name, [x.q], [], kernel=kernel, strides=strides, pads=pads,
                      zero_point=x.zp, requant=requant)
        return self.emit(ir, [out_name or node.output[0]], QParams(float(sy), zy), io)[0]

    def op_Flatten(self, node, v, attrs):
        axis = attrs.get("axis", 1)
        if isinstance(v[0], _Constant):
            x = v[0].value
            ax = axis + x.ndim if axis < 0 else axis
            return self.bind(node, _Constant(x.reshape(int(np.prod(x.shape[:ax])), -1)))
        if self._int8_view(node, v[0], lambda i: Flatten(node.name, [i], [], axis=axis)) is None:
            self.unsupported(node, "Flatten of a float tensor")

    def op_Reshape(self, node, v, attrs):
        try:
            shape = [int(d) for d in self.const(node, v[1], "the shape")]
        except _NotConst as e:
            return self.unsupported(node, str(e))
        x = v[0]
        if isinstance(x, _Constant):
            src = x.value.shape
        elif isinstance(x, _DequantTensor | _TensorRef):
            src = self.tensor(x.q if isinstance(x, _DequantTensor) else x.name).shape
        else:
            return self.unsupported(node, "Reshape of a float result")
        target = _resolve_shape(node, src, shape, attrs.get("allowzero", 0))
        self._reshape_to(node, x, target)

    def _reshape_to(self, node, x, target: tuple[int, ...]):
        """Bind ``node``'s output to ``x`` reshaped (a constant folds, int8 stays int8)."""
        if isinstance(x, _Constant):
            return self.bind(node, _Constant(x.value.reshape(target)))
        if self._int8_view(node, x, lambda i: Reshape(node.name, [i], [], shape=target)) is None:
            self.unsupported(node, f"{node.op_type} of a float tensor")

    def _shape_of(self, x) -> tuple[int, ...] | None:
        """The static shape of a constant or an int8 tensor (or its dequantized view)."""
        if isinstance(x, _Constant):
            return x.value.shape
        if isinstance(x, _DequantTensor | _TensorRef):
            return self.tensor(x.q if isinstance(x, _DequantTensor) else x.name).shape
        return None

    def _axes(self, node, v, attrs) -> np.ndarray | None:
        """Squeeze/Unsqueeze axes: an input since opset 13, an attribute before."""
        if self.opset >= 13:
            return None if _get(v, 1) is None else np.ravel(self.const(node, v[1], "the axes"))
        return None if "axes" not in attrs else np.ravel(attrs["axes"])

    @staticmethod
    def _normalized(node, axes: np.ndarray, rank: int) -> list[int]:
        out = sorted(int(a) + rank if int(a) < 0 else int(a) for a in axes)
        if len(set(out)) != len(out) or any(not 0 <= a < rank for a in out):
            raise ModelError(f"axes {axes.tolist()} are out of range or repeated for rank "
                             f"{rank}", node.name)
        return out

    def _shape_and_axes(self, node, v, attrs):
        """Squeeze/Unsqueeze's static input shape and raw axes; None when the node went
        to the CPU (a float input or axes known only at run time)."""
        src = self._shape_of(v[0])
        try:
            axes = self._axes(node, v, attrs)
        except _NotConst as e:
            return self.unsupported(node, str(e))
        if src is None:
            return self.unsupported(node, f"{node.op_type} of a float result")
        return src, axes

    def op_Squeeze(self, node, v, attrs):
        found = self._shape_and_axes(node, v, attrs)
        if found is None:
            return
        src, axes = found
        axes = [a for a, d in enumerate(src) if d == 1] if axes is None else \
            self._normalized(node, axes, len(src))
        if any(src[a] != 1 for a in axes):
            raise ModelError(f"shape mismatch: cannot squeeze axes {axes} of {src}", node.name)
        self._reshape_to(node, v[0], tuple(d for a, d in enumerate(src) if a not in axes))

    def op_Unsqueeze(self, node, v, attrs):
        found = self._shape_and_axes(node, v, attrs)
        if found is None:
            return
        src, axes = found
        if axes is None:
            raise ModelError("Unsqueeze needs axes", node.name)
        rank = len(src) + axes.size
        axes = self._normalized(node, axes, rank)
        rest = iter(src)
        self._reshape_to(node, v[0], tuple(1 if a in axes else next(rest) for a in range(rank)))

    def op_ArgMax(self, node, v, attrs):
        if attrs.get("select_last_index", 0):
            return self.unsupported(node, "select_last_index=1 (vargmax returns the first)")
        x = v[0]
        src = x.q if isinstance(x, _DequantTensor) else \
            x.name if isinstance(x, _TensorRef) else None
        # a positive scale keeps the order, so argmax of the int8 values is the same
        if src is None or self.tensor(src).dtype != "int8":
            return self.unsupported(node, "ArgMax of a float tensor")
        ir = ArgMax(node.name, [src], [], axis=attrs.get("axis", 0),
                    keepdims=bool(attrs.get("keepdims", 1)))
        self.bind(node, _TensorRef(self.emit(ir, [node.output[0]])[0]))

    def op_Equal(self, node, v, attrs):
        a, b = v
        if isinstance(a, _Constant) and isinstance(b, _TensorRef):
            a, b = b, a
        if isinstance(a, _TensorRef) and isinstance(b, _Constant) and b.value.size == 1 and \
                b.value.dtype.kind in "iu":
            t = self.tensor(a.name)
            if t.dtype not in ("int8", "int32", "int64"):
                return self.unsupported(node, f"Equal on {t.dtype}")
            if _np_to_onnx(b.value.dtype) != _onnx_type(t):
                raise ModelError(f"dtype mismatch: Equal of {t.io_dtype or t.dtype} and "
                                 f"{b.value.dtype}", node.name)
            value = int(b.value.reshape(-1)[0]) - (128 if t.io_dtype == "uint8" else 0)
            ir = Equal(node.name, [a.name], [], value=value)
            return self.bind(node, _TensorRef(self.emit(ir, [node.output[0]])[0]))
        if isinstance(a, _Constant) and isinstance(b, _Constant):
            return self.bind(node, _Constant(np.equal(a.value, b.value)))
        return self.unsupported(node, "Equal needs an integer tensor and a constant")

    def op_Constant(self, node, v, attrs):
        a = node.attribute[0]
        if a.name == "value":
            value = numpy_helper.to_array(a.t)
        elif a.name in ("value_float", "value_floats"):
            value = np.asarray(attrs[a.name], dtype=np.float32)
        elif a.name in ("value_int", "value_ints"):
            value = np.asarray(attrs[a.name], dtype=np.int64)
        else:
            return self.unsupported(node, f"Constant {a.name}")
        self.bind(node, _Constant(value))

    def op_Identity(self, node, v, attrs):
        self.bind(node, v[0])

    def op_If(self, node, v, attrs):
        c = v[0]
        if isinstance(c, _Constant):  # constant condition: the taken branch, inline
            body = attrs["then_branch" if bool(c.value.reshape(-1)[0]) else "else_branch"]
            sub = self._branch(body, body.name)
            sub.graph = self.graph
            sub.import_nodes(body)
            return self.bind(node, *[sub.lookup(o.name) for o in body.output])
        if not isinstance(c, _TensorRef) or self.tensor(c.name).dtype != "bool":
            raise ModelError("dtype mismatch: the If condition must be a bool tensor",
                             node.name)
        subs, vals = [], []
        for key in ("then_branch", "else_branch"):
            body = attrs[key]
            sub = self._branch(body, f"{node.name}:{key[:4]}")
            sub.import_nodes(body)
            subs.append(sub)
            vals.append([sub.lookup(o.name) for o in body.output])
        if not len(vals[0]) == len(vals[1]) == len(node.output):
            raise ModelError("the branches and the node disagree on the number of outputs",
                             node.name)
        results, outs = [], []
        for i, (tv, ev) in enumerate(zip(*vals, strict=True)):
            # both branches dequantize alike: keep the int8 values, stay lazy outside
            keep_dq = isinstance(tv, _DequantTensor) and isinstance(ev, _DequantTensor) and \
                float(tv.scale) == float(ev.scale) and tv.zp == ev.zp
            names = [sub.materialize(_TensorRef(val.q) if keep_dq else val)
                     for sub, val in zip(subs, (tv, ev), strict=True)]
            tt, te = (sub.tensor(n) for sub, n in zip(subs, names, strict=True))
            if (tt.shape, tt.dtype, tt.io_dtype) != (te.shape, te.dtype, te.io_dtype):
                raise ModelError(f"the branches disagree on output {i}: {tt.shape} "
                                 f"{tt.io_dtype or tt.dtype} vs {te.shape} "
                                 f"{te.io_dtype or te.dtype}", node.name)
            for sub, n in zip(subs, names, strict=True):
                sub.graph.outputs.append(n)
            quant = tt.quant if tt.quant == te.quant else None
            base = f"{node.output[i]}:q" if keep_dq else node.output[i]
            out = Tensor(self.fresh(base, not keep_dq), tt.shape, tt.dtype, quant,
                         io_dtype=tt.io_dtype)
            self.graph.add_tensor(out)
            outs.append(out.name)
            results.append(_DequantTensor(out.name, tv.scale, tv.zp) if keep_dq
                           else _TensorRef(out.name))
        ir = If(self.fresh_node(node.name), [c.name], outs, then_graph=subs[0].graph,
                else_graph=subs[1].graph)
        ir.check()
        self.graph.nodes.append(ir)
        self.bind(node, *results)

    def _branch(self, body: onnx.GraphProto, name: str) -> _Importer:
        sub = _Importer(name, self.opset, self.fallback, self.dims, parent=self)
        for t in body.initializer:
            sub.env[t.name] = _Constant(numpy_helper.to_array(t))
        return sub


_MOVES = {("", "Transpose"): "first", ("", "Split"): "first", ("", "Concat"): "all",
          ("", "Slice"): "first", ("", "Gather"): "first", ("", "Expand"): "first",
          ("", "Tile"): "first", ("", "DepthToSpace"): "first", ("", "SpaceToDepth"): "first"}
"""Ops that only move values, and which of their inputs are data ("first" or "all")."""


class _NotConst(Exception):
    pass


class _NotOnNpu(Exception):
    """A well-formed construct the NPU cannot run: the node falls back to the CPU
    (or, without fallback, is refused naming ``reason``)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---- helpers -----------------------------------------------------------------------------


def _alternatives(node: onnx.NodeProto) -> tuple[str, ...]:
    """The operators of the node's domain that the importer maps to the NPU."""
    return SUPPORTED_CONTRIB_OPS if node.domain == "com.microsoft" else SUPPORTED_OPS


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _get(v: list, i: int):
    return v[i] if len(v) > i else None


def _ir_type(et: int, name: str, where: str = "") -> tuple[str, str | None]:
    if et not in _ONNX_TYPES:
        raise ModelError(f"tensor {name!r} has element type "
                         f"{TensorProto.DataType.Name(et) if et else 'UNDEFINED'}: the NPU "
                         "host handles int8, uint8, int32, int64, float and bool", where,
                         fix="cast it to float32, int8 or uint8 in the model")
    return _ONNX_TYPES[et]


def _np_to_onnx(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _common_factor(wi: np.ndarray, bias, scale: float):
    """``(W - zw, bias, scale)`` with a common factor ``g`` of the weights moved into
    the requantization scale when that brings ``W - zw`` into int8: ``acc * scale =
    (acc / g) * (scale * g)`` exactly, provided every bias is a multiple of ``g`` and
    the NPU's multiplier holds ``scale * g`` exactly. Unchanged otherwise."""
    if wi.size == 0 or (wi.min() >= -128 and wi.max() <= 127):
        return wi, bias, scale
    g = int(np.gcd.reduce(np.abs(wi).reshape(-1)))
    if g < 2 or (wi // g).min() < -128 or (wi // g).max() > 127:
        return wi, bias, scale
    if bias is not None and np.any(bias.astype(np.int64) % g):
        return wi, bias, scale
    mult, shift = quantize_multiplier(scale * g)
    if Fraction(mult, 1 << shift) != Fraction(scale) * g:
        return wi, bias, scale
    return wi // g, None if bias is None else (bias.astype(np.int64) // g).astype(np.int32), \
        float(Fraction(scale) * g)


def _dilate(weight: np.ndarray, dilations: tuple[int, int]) -> np.ndarray:
    """An OIHW kernel with ``d - 1`` zero rows/columns between its taps: the dense
    kernel of the same dilated convolution (exact: the inserted taps are zero)."""
    dh, dw = dilations
    if (dh, dw) == (1, 1):
        return weight
    o, i, kh, kw = weight.shape
    out = np.zeros((o, i, (kh - 1) * dh + 1, (kw - 1) * dw + 1), weight.dtype)
    out[:, :, ::dh, ::dw] = weight
    return out


def _pads(node, attrs, spatial, kernel, strides) -> tuple[int, int, int, int]:
    """ONNX pads/auto_pad to (top, left, bottom, right)."""
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        p = list(attrs.get("pads", [0, 0, 0, 0]))
        if len(p) != 4:
            raise ModelError(f"pads {p} are not 2-D", node.name)
        return (p[0], p[1], p[2], p[3])
    if auto == "VALID":
        return (0, 0, 0, 0)
    lo, hi = [], []
    for size, k, s in zip(spatial, kernel, strides, strict=True):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        small, big = total // 2, total - total // 2
        lo.append(small if auto == "SAME_UPPER" else big)
        hi.append(big if auto == "SAME_UPPER" else small)
    return (lo[0], lo[1], hi[0], hi[1])


def _avgpool_window(node, attrs, xshape, is_global: bool):
    """``(kernel, strides, pads)`` of an average pooling the NPU runs; raise
    :class:`_NotOnNpu` naming what it cannot."""
    if len(xshape) != 4:
        raise _NotOnNpu("only 2-D pooling of NCHW tensors")
    if attrs.get("channels_last", 0):
        raise _NotOnNpu("channels_last=1 (the NPU pools NCHW tensors)")
    if is_global:
        return tuple(xshape[2:]), (1, 1), (0, 0, 0, 0)
    if attrs.get("ceil_mode", 0) or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise _NotOnNpu("ceil_mode or dilations")
    kernel = tuple(attrs.get("kernel_shape", ()))
    if len(kernel) != 2:
        raise _NotOnNpu("only 2-D pooling")
    strides = tuple(attrs.get("strides", [1, 1]))
    pads = _pads(node, attrs, xshape[2:], kernel, strides)
    if any(pads) and not attrs.get("count_include_pad", 0):
        raise _NotOnNpu("count_include_pad=0 with padding (border windows divide by fewer "
                        "elements; the NPU divides every window by one count)")
    if max(pads[0], pads[2]) >= kernel[0] or max(pads[1], pads[3]) >= kernel[1]:
        raise _NotOnNpu(f"pads {pads} not smaller than the kernel {kernel}")
    return kernel, strides, pads


def _resolve_shape(node, src, shape, allowzero) -> tuple[int, ...]:
    out = [src[i] if d == 0 and not allowzero and i < len(src) else d
           for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise ModelError(f"Reshape shape {shape} has more than one -1", node.name)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(src))
        if known == 0 or total % known:
            raise ModelError(f"shape mismatch: cannot reshape {tuple(src)} to {shape}",
                             node.name)
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != int(np.prod(src)):
        raise ModelError(f"shape mismatch: cannot reshape {tuple(src)} to {shape}", node.name)
    return tuple(out)
