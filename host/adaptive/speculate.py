"""Speculative merges: bet on a data-dependent branch's outcome.

A gated model decides at run time which branch body runs (the MoE's gate picks an
expert with ArgMax + If). When the profiler sees one branch win most of the time,
the runtime *hoists* that branch's NPU work out of the If, ahead of the branch,
into the unit that computes the gate: the merged unit loads the shared input once,
finds the predicted path's weights resident in their tag slots, and keeps the
path's intermediates on chip while the gate's ArgMax resolves.

The program still checks the branch. On a hit, the branch body has nothing left
to do: its outputs are the hoisted results. On a miss, the program falls through
to the original code of the other branches, from the point of divergence (the
gate's result is reused, nothing before the branch runs again); the hoisted work
was wasted. That is a mis-speculation: it is visible in the region trace, because
a unit inside the If ran, and the runtime counts it.

The transformation keeps node names, so units carry over and the reference
interpreter's result on the hoisted graph equals the original's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..compiler.plan import CompileError
from ..ir import Equal, Graph, If


@dataclass(frozen=True)
class Leaf:
    """A branch body without further branches, and how to reach it.

    Members
    -------
    path : ``(If node name, then-branch taken)`` from the top-level If down.
    npu_nodes : the body's NPU nodes (what a speculative merge hoists).
    """

    path: tuple[tuple[str, bool], ...]
    npu_nodes: tuple[str, ...]

    @property
    def top_if(self) -> str:
        return self.path[0][0]

    def describe(self) -> str:
        return " > ".join(f"{name}:{'then' if then else 'else'}" for name, then in self.path)


def leaves(graph: Graph) -> list[Leaf]:
    """Every branch body of the top-level Ifs that has NPU work and no inner If."""
    out: list[Leaf] = []

    def visit(n: If, path):
        for then, body in ((True, n.then_graph), (False, n.else_graph)):
            p = path + ((n.name, then),)
            inner = [m for m in body.nodes if isinstance(m, If)]
            for m in inner:
                visit(m, p)
            npu = tuple(m.name for m in body.nodes
                        if m.device == "npu" and not isinstance(m, (Equal, If)))
            if npu and not inner:
                out.append(Leaf(p, npu))

    for n in graph.nodes:
        if isinstance(n, If):
            visit(n, ())
    return out


def hoist(graph: Graph, leaf: Leaf) -> Graph:
    """A copy of ``graph`` with ``leaf``'s NPU nodes moved out of their branch to the
    top scope, just before the top-level If (their outputs become outer tensors the
    branch returns or its CPU tail reads). Raises :class:`CompileError` when a hoisted
    node reads a tensor defined inside an enclosing branch.
    """
    g = copy.deepcopy(graph)
    scope = g
    for name, then in leaf.path:
        node = scope.node(name)
        scope = node.then_graph if then else node.else_graph
    moved = [scope.node(nm) for nm in leaf.npu_nodes]
    for n in moved:
        scope.nodes.remove(n)
        for o in n.outputs:
            g.tensors[o] = scope.tensors.pop(o)
    at = g.nodes.index(g.node(leaf.top_if))
    g.nodes[at:at] = moved
    g.name = graph.name
    try:
        g.validate()
    except Exception as e:  # a hoisted node needs something only its branch defines
        raise CompileError(f"cannot hoist {leaf.describe()}: {e}") from e
    return g
