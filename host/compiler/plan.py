"""Compiler front half: simplify the graph, cut it into units, place tensors.

* :func:`simplify` drops identity nodes and folds a Clip into the requantization
  of the GEMM/convolution/average pooling before it (exact: clamps compose).
* :func:`initial_units` makes one unit per anchor operator (GEMM, convolution,
  add, clip, max-pool, average pooling) with its epilogue (an ArgMax reading its output); the
  adaptive runtime later merges and splits units.
* :func:`stages` orders the work: CPU stages (even) and NPU segments (odd).
* :class:`Storage` decides which tensors live in DRAM (those crossing a unit or
  the CPU boundary) and which stay on chip inside a unit.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import ModelError, UnsupportedOpError
from ..ir import (
    ArgMax,
    Clip,
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
    Requant,
    Reshape,
    _outer_reads,
)

ANCHORS = (QGemm, QConv, QAdd, Clip, MaxPool, QAvgPool)
ALIASES = (Flatten, Reshape)
NPU_OPS = ("QGemm", "QConv", "QAdd", "Clip", "MaxPool", "QAvgPool", "ArgMax", "Flatten",
           "Reshape", "Equal", "If")


class CompileError(ModelError):
    """The compiler cannot map this model (or this unit) onto this NPU."""


def simplify(graph: Graph) -> tuple[Graph, list[str]]:
    """A simplified copy of ``graph`` and a log of what changed.

    The copy computes exactly the same values (the reference interpreter gives the
    same outputs on both).
    """
    g = copy.deepcopy(graph)
    log: list[str] = []
    _simplify_scope(g, log)
    g.validate()
    return g, log


def _simplify_scope(g: Graph, log: list[str]):
    for n in list(g.nodes):
        if isinstance(n, If):
            _simplify_scope(n.then_graph, log)
            _simplify_scope(n.else_graph, log)
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            if n.device != "npu":
                continue
            if isinstance(n, Clip) and _fold_clip(g, n, log):
                changed = True
            elif _is_identity(g, n) and _bypass(g, n):
                log.append(f"dropped identity {n.op} {n.name}")
                changed = True


def _is_identity(g: Graph, n: Node) -> bool:
    if isinstance(n, Clip):
        return n.lo == -128 and n.hi == 127
    if isinstance(n, ALIASES):
        src, dst = g.tensors.get(n.inputs[0]), g.tensors.get(n.outputs[0])
        return src is not None and dst is not None and src.shape == dst.shape
    return False


def _rewirable(g: Graph, tensor: str) -> bool:
    """A tensor only read by plain nodes of this scope (not graph output, not a branch)."""
    return tensor not in g.outputs and not any(isinstance(c, If) for c in g.consumers(tensor))


def _bypass(g: Graph, n: Node) -> bool:
    out, src = n.outputs[0], n.inputs[0]
    if not _rewirable(g, out):
        return False
    for c in g.consumers(out):
        c.inputs = [src if i == out else i for i in c.inputs]
    g.nodes.remove(n)
    del g.tensors[out]
    return True


def _fold_clip(g: Graph, n: Clip, log: list[str]) -> bool:
    src = n.inputs[0]
    p = g.producer(src)
    if not isinstance(p, (QGemm, QConv, QAvgPool)) or p.requant is None or p.device != "npu":
        return False
    if len(g.consumers(src)) != 1 or not _rewirable(g, src):
        return False
    r = p.requant
    lo, hi = max(r.lo, n.lo), min(r.hi, n.hi)
    if lo > hi:
        return False
    p.requant = Requant(r.mult, r.shift, r.zp, lo, hi)
    # The GEMM now writes the clip's output tensor.
    out = n.outputs[0]
    p.outputs = [out]
    g.nodes.remove(n)
    del g.tensors[src]
    log.append(f"folded {n.name} into the requantization of {p.name}")
    return True


# ---- units ---------------------------------------------------------------------------------


def initial_units(graph: Graph) -> list[list[str]]:
    """One unit per anchor operator with its epilogue, for every scope of the graph.

    Returns lists of node names, in execution order per scope.
    """
    units: list[list[str]] = []
    _units_of_scope(graph, units)
    return units


def _units_of_scope(g: Graph, units: list[list[str]]):
    by_output: dict[str, list[str]] = {}
    for n in g.nodes:
        if n.device != "npu":
            continue
        if isinstance(n, If):
            _units_of_scope(n.then_graph, units)
            _units_of_scope(n.else_graph, units)
        elif isinstance(n, ANCHORS):
            unit = [n.name]
            units.append(unit)
            by_output[n.outputs[0]] = unit
        elif isinstance(n, ArgMax):
            home = by_output.get(_alias_root(g, n.inputs[0]))
            if home is not None:
                home.append(n.name)
            else:
                units.append([n.name])


def _alias_root(g: Graph, tensor: str) -> str:
    p = g.producer(tensor)
    while isinstance(p, ALIASES) and p.device == "npu":
        tensor = p.inputs[0]
        p = g.producer(tensor)
    return tensor


def check_supported(graph: Graph):
    """Raise :class:`UnsupportedOpError` for an NPU-placed node the compiler cannot lower."""
    producer = {o: n for _, n in graph.walk() for o in n.outputs}
    for g, n in graph.walk():
        if n.device != "npu":
            continue
        if n.op not in NPU_OPS:
            raise UnsupportedOpError(n.op, n.name, "no NPU lowering", NPU_OPS)
        if isinstance(n, QGemm) and n.weight.ndim != 2:
            raise UnsupportedOpError("MatMul", n.name, "batched (3-D) weights on the NPU",
                                     ("2-D weights",))
        if isinstance(n, Equal) and not all(isinstance(u, If) and not has_npu_work(u)
                                            for u in g.consumers(n.outputs[0])):
            users = g.consumers(n.outputs[0])
            src = producer.get(n.inputs[0])
            if not users or not all(isinstance(u, If) and u.inputs[0] == n.outputs[0]
                                    for u in users) or n.outputs[0] in g.outputs:
                raise UnsupportedOpError("Equal", n.name, "the NPU compares only to "
                                         "branch (Equal feeding If conditions)", ("If",))
            if not isinstance(src, ArgMax) or src.device != "npu":
                raise UnsupportedOpError("Equal", n.name, "the NPU branches on an ArgMax "
                                         "result compared with a constant", ("ArgMax",))
        if isinstance(n, If) and has_npu_work(n):
            cond = producer.get(n.inputs[0])
            if not isinstance(cond, Equal) or cond.device != "npu":
                raise UnsupportedOpError("If", n.name, "the condition must be "
                                         "Equal(ArgMax(x), constant)", ("Equal",))
        if isinstance(n, ArgMax):
            t = g.tensors[n.outputs[0]] if n.outputs[0] in g.tensors else None
            if t is not None and t.size != 1:
                raise UnsupportedOpError("ArgMax", n.name, "the NPU takes the argmax of "
                                         "one vector (output of one element)")


def has_npu_work(n: If) -> bool:
    """Whether a branch of ``n`` holds NPU compute (else the host evaluates it)."""
    return any(inner.device == "npu" and not isinstance(inner, (*ALIASES, Equal, If))
               or isinstance(inner, If) and has_npu_work(inner)
               for g in (n.then_graph, n.else_graph) for _, inner in g.walk())


# ---- stages --------------------------------------------------------------------------------


def stages(graph: Graph) -> dict[str, int]:
    """Stage of every top-level node: CPU stages are even, NPU segments odd.

    A CPU node runs after the NPU segment that produced its inputs; an NPU node
    after the CPU nodes it reads. An ``If`` on the NPU finishes (its branches' CPU
    tails) in the CPU stage after its segment.
    """
    producer = {o: n for n in graph.nodes for o in n.outputs}
    stage: dict[str, int] = {}
    for n in graph.topo_order():
        on_npu = n.device == "npu"
        s = 1 if on_npu else 0
        reads = list(n.inputs) + sorted(_outer_reads(n))
        for t in reads:
            p = producer.get(t)
            if p is None:
                continue
            ps = stage[p.name]
            p_on_npu = ps % 2 == 1
            if isinstance(p, If):
                ps, p_on_npu = ps + 1, False  # its outputs exist after its CPU tails
            if on_npu:
                s = max(s, ps if p_on_npu else ps + 1)
            else:
                s = max(s, ps + 1 if p_on_npu else ps)
        stage[n.name] = s
    return stage


@dataclass
class UnitInfo:
    """What the code generator needs to know about one unit."""

    id: int
    nodes: list[Node]
    scope: Graph
    inputs: list[str] = field(default_factory=list)  # DRAM roots to load
    outputs: list[str] = field(default_factory=list)  # DRAM roots to store
    results: list[str] = field(default_factory=list)  # ArgMax tensors (registers)


def check_unit_shape(scope: Graph, names: Iterable[str]) -> list[Node]:
    """The nodes of a unit, in scope order; raise if they are not one scope's NPU nodes."""
    names = list(names)
    nodes = []
    for nm in names:
        try:
            n = scope.node(nm)
        except KeyError:
            raise CompileError(f"unit {names}: node {nm!r} is not in scope "
                               f"{scope.name!r}") from None
        if n.device != "npu" or isinstance(n, (If, Equal)) or isinstance(n, ALIASES):
            raise CompileError(f"unit {names}: {n.op} {nm!r} cannot be part of a unit", nm)
        nodes.append(n)
    order = {n.name: i for i, n in enumerate(scope.nodes)}
    return sorted(nodes, key=lambda n: order[n.name])
