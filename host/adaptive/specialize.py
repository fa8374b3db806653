"""Specialized variants of a model: batch-specialized programs behind a guard.

A *batched* program runs ``B`` inferences in one NPU run. Every activation gets
a leading dimension ``B`` instead of 1, so every GEMM streams ``M = B`` rows
through each weight tile it loads into the array: the ``wload`` of a tile, its
systolic fill and the region and DMA overheads are paid once per batch instead
of once per input. For ``M = 1`` GEMV models (the bundled ``mlp``) the weight
loads dominate and batching divides the cycles per inference several times;
convolutions already stream one output row per GEMM, so they gain less.

Every variant carries a guard: :meth:`BatchVariant.guard` accepts exactly ``B``
inputs, each with the generic model's input names, shapes and dtypes. When it
fails, :meth:`BatchVariant.run` falls back to the generic program (one run per
input) or raises :class:`GuardError` for the caller to do so; a guarded variant
never returns a wrong result.

Batching is only valid when every operator treats the leading dimension as
independent rows. Data-dependent branches (``If`` on an ``ArgMax``) route each
input separately, and the NPU's ``vargmax`` reduces one vector per run; such
graphs are refused with :class:`SpecializationError` naming the node.

```python
g = compile_model(load_onnx(model_path("mlp")), config).graph   # simplified
v = specialize_batch(g, config, 8)
s = Session(driver, v.model); s.load()
outs = v.run(s, inputs_list, fallback=generic_session)          # 8 dicts
```
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from firmware.config import NPUConfig

from ..compiler import CompiledModel, CompileError, compile_model
from ..compiler.cost import CostModel
from ..errors import ModelError
from ..ir import (
    DTYPES,
    ArgMax,
    CpuOp,
    Equal,
    Flatten,
    Graph,
    If,
    QGemm,
    Reshape,
    Subgraph,
)
from ..runtime import Inference

DEFAULT_MAX_BATCH = 64  # a batch waits for B arrivals: beyond this, latency costs too much
DEFAULT_MIN_GAIN = 0.05  # a larger batch is worth trying only if it saves this much


class SpecializationError(ModelError):
    """This graph cannot be specialized this way (names the node that prevents it).

    Members
    -------
    node : name of the node at fault (``""`` when the fault is not in a node).
    """


class GuardError(ValueError):
    """The inputs do not satisfy a variant's guard (and no fallback was given).

    Members
    -------
    reason : why the guard failed.
    """

    def __init__(self, reason: str):
        super().__init__(f"guard failed: {reason}")
        self.reason = reason


# ---- the batched graph ---------------------------------------------------------------------


def batch_graph(graph: Graph, batch: int) -> Graph:
    """A copy of ``graph`` computing ``batch`` inferences at once.

    Inputs, outputs and every activation tensor get leading dimension ``batch``
    instead of 1 (``N`` of NCHW for convolutions and pooling); constants are
    untouched and node names stay the same, so unit lists carry over. Input ``i``
    of the batch is row ``i`` of every tensor, and its outputs equal the original
    graph's outputs for that input alone. ``graph`` itself is not changed.

    Raises ``ValueError`` for ``batch < 1`` and :class:`SpecializationError`
    naming the node when batching would change what an input computes: an
    ``If`` (per-input routing), an NPU ``ArgMax`` (one reduction per run), a CPU
    fallback operator, batched (3-D) weights, a flatten or reshape that moves
    the leading dimension, or a tensor whose leading dimension is not 1.
    """
    if not isinstance(batch, int | np.integer) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    batch = int(batch)
    _check_batchable(graph)
    g = copy.deepcopy(graph)
    g.name = f"{graph.name}@batch{batch}"
    for name in g.outputs:
        if name in g.tensors and g.tensors[name].is_const:
            raise SpecializationError(f"graph output {name!r} is a constant, not one value "
                                      "per input")
    for t in g.tensors.values():
        if t.is_const:
            continue
        if not t.shape or t.shape[0] != 1:
            who = graph.producer(t.name)
            raise SpecializationError(
                f"tensor {t.name!r} of shape {t.shape} has no leading dimension 1 to batch",
                who.name if who is not None else "")
        t.shape = (batch, *t.shape[1:])
    for n in g.nodes:
        if isinstance(n, Reshape):
            n.shape = (batch, *tuple(n.shape)[1:])
    try:
        g.validate()
    except ModelError as err:  # an operator that does not keep the batch leading
        raise SpecializationError(f"the batched graph is inconsistent: {err}",
                                  err.node) from None
    return g


def _check_batchable(graph: Graph):
    """Refuse the operators whose result for one input would depend on the batch."""
    # Branches first: an ArgMax feeding one is refused for the routing, not itself.
    for g, n in graph.walk():
        if isinstance(n, If):
            cond = g.producer(n.inputs[0])
            src = g.producer(cond.inputs[0]) if isinstance(cond, Equal) else None
            on = f" on {src.op} {src.name!r}" if src is not None else ""
            raise SpecializationError(
                f"If {n.name!r} branches{on}: every input of a batch may take another "
                "path (per-input routing), so one batched program cannot run them", n.name)
    for _g, n in graph.walk():
        if isinstance(n, ArgMax) and n.device == "npu":
            raise SpecializationError(
                f"ArgMax {n.name!r} runs on the NPU, whose vargmax reduces one vector per "
                "run into one scalar register; a batch needs one result per input", n.name)
        if isinstance(n, Equal) and n.device == "npu":
            raise SpecializationError(f"Equal {n.name!r} compares one scalar register for a "
                                      "branch; a batch has one value per input", n.name)
        if isinstance(n, CpuOp):
            raise SpecializationError(f"CPU fallback {n.name!r}: its ONNX semantics may mix "
                                      "the leading dimension", n.name)
        if isinstance(n, QGemm) and n.weight.ndim != 2:
            raise SpecializationError(f"QGemm {n.name!r} has batched (3-D) weights indexed "
                                      "by the leading dimension", n.name)
        if isinstance(n, Flatten) and n.axis == 0:
            raise SpecializationError(f"Flatten {n.name!r} with axis 0 merges the batch into "
                                      "the features", n.name)
        if isinstance(n, Reshape) and (not n.shape or n.shape[0] != 1):
            raise SpecializationError(f"Reshape {n.name!r} to {tuple(n.shape)} does not keep "
                                      "a leading dimension 1", n.name)


# ---- the variant ---------------------------------------------------------------------------


@dataclass
class BatchResult:
    """What :meth:`BatchVariant.run_batch` did.

    Members
    -------
    outputs : one output dict per input, in input order.
    batched : True when the batched program ran, False after a guard failure
        (the generic program ran each input).
    inferences : the batched run (one) or the generic runs (one per input).
    reason : why the guard failed (``""`` when it held).
    """

    outputs: list[dict]
    batched: bool
    inferences: list[Inference] = field(default_factory=list)
    reason: str = ""

    @property
    def cycles(self) -> int:
        """NPU cycles of every run."""
        return sum(r.cycles for r in self.inferences)

    @property
    def cycles_per_inference(self) -> float:
        return self.cycles / max(1, len(self.outputs))


@dataclass
class BatchVariant:
    """A batch-specialized program of a model and its guard.

    Members
    -------
    model : the compiled batched program (``model.graph`` is the batched graph).
    batch : inferences per run (``B``).
    generic : the unbatched (simplified) graph it specializes.
    plan : the unit ids of the generic plan it batches (a later plan needs a new
        variant).
    """

    model: CompiledModel
    batch: int
    generic: Graph
    plan: tuple[int, ...] = ()
    _signature: str = field(default="", init=False, repr=False)

    @property
    def name(self) -> str:
        """The specialization's key (what the compile cache stores it under)."""
        return f"batch{self.batch}"

    def expected_inputs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Each input's shape and dtype as the generic model takes it from outside."""
        out = {}
        for name in self.generic.inputs:
            t = self.generic.tensors[name]
            dtype = np.dtype(np.uint8) if t.io_dtype == "uint8" else np.dtype(DTYPES[t.dtype])
            out[name] = (t.shape, dtype)
        return out

    def guard_failure(self, inputs_list) -> str:
        """Why ``inputs_list`` may not run on this variant (``""`` when it may).

        It may when it is a sequence of exactly ``batch`` dicts, each holding the
        generic model's inputs (no more, no fewer) as arrays of exactly their
        shapes and dtypes (``uint8`` for ``io_dtype="uint8"`` inputs).
        """
        if isinstance(inputs_list, Mapping) or not isinstance(inputs_list, Sequence):
            return f"expected a list of {self.batch} input dicts, got {type(inputs_list)}"
        if len(inputs_list) != self.batch:
            return f"{len(inputs_list)} inputs for a batch of {self.batch}"
        want = self.expected_inputs()
        for i, inputs in enumerate(inputs_list):
            if not isinstance(inputs, Mapping):
                return f"input {i} is a {type(inputs).__name__}, not a dict"
            if set(inputs) != set(want):
                return f"input {i} has {sorted(inputs)}, the model takes {sorted(want)}"
            for name, (shape, dtype) in want.items():
                v = inputs[name]
                if not isinstance(v, np.ndarray):
                    return f"input {i} {name!r} is a {type(v).__name__}, not an array"
                if v.shape != shape or v.dtype != dtype:
                    return (f"input {i} {name!r} is {v.dtype} {v.shape}, the model takes "
                            f"{dtype} {shape}")
        return ""

    def guard(self, inputs_list) -> bool:
        """Whether ``inputs_list`` may run on this variant (see :meth:`guard_failure`)."""
        return not self.guard_failure(inputs_list)

    def stack(self, inputs_list) -> dict:
        """The batched program's inputs: the ``batch`` inputs along dimension 0."""
        return {name: np.concatenate([x[name] for x in inputs_list], axis=0)
                for name in self.generic.inputs}

    def unstack(self, outputs: dict) -> list[dict]:
        """Split the batched program's outputs back into one dict per input."""
        return [{name: np.ascontiguousarray(v[i:i + 1]) for name, v in outputs.items()}
                for i in range(self.batch)]

    def run_batch(self, session, inputs_list, fallback=None) -> BatchResult:
        """Run ``inputs_list`` through ``session`` (a :class:`~host.runtime.Session`
        holding :attr:`model`) in one batched run.

        When the guard fails, each input runs on ``fallback`` (a session of the
        generic program) instead; without one, :class:`GuardError` is raised and
        nothing runs. ``ValueError`` if ``session`` runs another program.
        """
        reason = self.guard_failure(inputs_list)
        if reason:
            if fallback is None:
                raise GuardError(reason)
            runs = [fallback.run(x) for x in inputs_list]
            return BatchResult([r.outputs for r in runs], False, runs, reason)
        self._check_session(session)
        r = session.run(self.stack(inputs_list))
        return BatchResult(self.unstack(r.outputs), True, [r])

    def run(self, session, inputs_list, fallback=None) -> list[dict]:
        """The outputs of :meth:`run_batch`, one dict per input."""
        return self.run_batch(session, inputs_list, fallback).outputs

    def _check_session(self, session):
        m = session.model
        if m is self.model:
            return
        if not self._signature:
            self._signature = self.model.signature()
        if m.signature() != self._signature:
            raise ValueError(f"the session runs {m.graph.name!r}, not this variant's "
                             f"program ({self.model.graph.name!r})")


def _fresh_units(units):
    """Unit lists for one compile: the compiler writes into Subgraph records, so the
    caller's (the generic program's) are copied, keeping their region ids."""
    if units is None:
        return None
    return [Subgraph(u.id, list(u.nodes)) if isinstance(u, Subgraph) else list(u)
            for u in units]


def specialize_batch(graph: Graph, config: NPUConfig, batch: int,
                     units: list | None = None) -> BatchVariant:
    """Compile the ``batch``-specialized program of ``graph`` for ``config``.

    ``graph`` is a simplified graph (``CompiledModel.graph``) and ``units`` cuts
    it as for :func:`~host.compiler.compile_model` (node names carry over; given
    :class:`~host.ir.Subgraph` records are not modified). Raises
    :class:`SpecializationError` when the graph cannot be batched and
    :class:`~host.compiler.CompileError` when the batched program does not fit
    (scratchpad working partition, accumulators, instruction bank).
    """
    batched = batch_graph(graph, batch)
    model = compile_model(batched, config, _fresh_units(units), simplified=True, fuse=False)
    return BatchVariant(model, int(batch), graph)


def predicted_cycles(model: CompiledModel, cost: CostModel | None = None) -> float:
    """Steady-state cycles of one run of ``model``, summed over its units."""
    cost = cost or CostModel(model.config)
    return sum(cost.predict(u.resources["work"]) for u in model.units)


def batch_candidates(graph: Graph, config: NPUConfig, units: list | None = None, *,
                     max_batch: int = DEFAULT_MAX_BATCH, min_gain: float = DEFAULT_MIN_GAIN,
                     cost: CostModel | None = None) -> list[int]:
    """Batch sizes worth specializing ``graph`` for on ``config``, ascending.

    Powers of two from 2 up to ``max_batch`` while the batched program fits the
    profile (scratchpad working partition, accumulator rows, instruction bank: a
    larger batch only needs more of each), kept where its predicted cycles per
    inference (``cost``, default the profile's initial coefficients) improve on
    the best kept so far (the generic program for the first) by at least
    ``min_gain``. A size that does not gain does not end the search: a one-row
    GEMM runs as a GEMV, which a batch of 2 (two rows through the GEMM mapping)
    may not beat while 4 does. Empty when the graph cannot be batched.
    """
    try:
        batch_graph(graph, 2)
    except SpecializationError:
        return []
    prev = predicted_cycles(compile_model(graph, config, _fresh_units(units),
                                          simplified=True, fuse=False), cost)
    out, b = [], 2
    while b <= max_batch:
        try:
            v = specialize_batch(graph, config, b, units)
        except CompileError:
            break
        per = predicted_cycles(v.model, cost) / b
        if per <= prev * (1 - min_gain):
            out.append(b)
            prev = per
        b *= 2
    return out
