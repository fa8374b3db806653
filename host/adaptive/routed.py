"""Routed batch variants: batching a model whose inputs take different branches.

A gated model (the MoE) cannot be batched as it is: every input of a batch may
take another branch, and the NPU branches on one scalar per run. A routed batch
variant bets on a set of branches instead. Its program computes, for all ``B``
inputs at once, the gate (the tensor the routing ArgMax reads) and every branch
of the bet, hoisted out of the If (:func:`~.speculate.hoist`): each weight tile
loaded into the array then serves ``B`` rows. The host finishes each input from
those rows: it evaluates the routing (ArgMax, Equal, If) and the branch's CPU
tail exactly as the reference interpreter does. An input routed to a branch
outside the bet is a mis-speculation: it is not answered from the batch but runs
alone on the generic program, so no result is ever wrong.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from firmware.config import NPUConfig

from ..compiler import CompiledModel, compile_model
from ..ir import ArgMax, Equal, Graph, If, Node, Subgraph
from ..reference import eval_node, to_external, to_internal
from .specialize import SpecializationError, batch_graph
from .speculate import Leaf, hoist, leaves

ROUTED_REGION = 32768  # the variant's one region (apart from every plan's unit ids)


@dataclass
class RoutedVariant:
    """A batched program of a gated model betting on some of its branches.

    Members
    -------
    model : the compiled batched program (gate and the bet's branches, B rows).
    batch : inputs per run.
    hoisted : the generic graph with the bet's branches hoisted (what the host
        finishes each input on).
    bet : the branches it computes.
    """

    model: CompiledModel
    batch: int
    hoisted: Graph
    bet: tuple[Leaf, ...]

    @property
    def name(self) -> str:
        """``route8[e0_fc1,e2_fc1]``: B and the first node of each branch bet on."""
        return f"route{self.batch}[" + ",".join(lf.npu_nodes[0] for lf in self.bet) + "]"

    def guard_failure(self, inputs_list) -> str:
        """Why these inputs cannot run on this variant ("" when they can)."""
        if len(inputs_list) != self.batch:
            return f"{len(inputs_list)} inputs, the variant takes {self.batch}"
        for i, x in enumerate(inputs_list):
            for name in self.hoisted.inputs:
                t = self.hoisted.tensors[name]
                v = x.get(name) if isinstance(x, dict) else None
                if v is None or tuple(np.shape(v)) != t.shape:
                    return (f"input {i}: {name!r} has shape {None if v is None else np.shape(v)}"
                            f", expected {t.shape}")
        return ""

    def stack(self, inputs_list) -> dict:
        return {k: np.concatenate([np.asarray(x[k]) for x in inputs_list])
                for k in self.hoisted.inputs}

    def finish(self, batched_outputs: dict, inputs_list) -> list[tuple[dict | None, tuple]]:
        """Per input: its graph outputs from the batch's rows (None: a miss, the
        input took a branch outside the bet) and the branch path it took."""
        index = _index(self.hoisted)  # (once per batch, not per input)
        out = []
        for r, x in enumerate(inputs_list):
            env = {k: to_internal(self.hoisted.tensors[k], x[k]) for k in self.hoisted.inputs}
            for name, v in batched_outputs.items():
                env[name] = np.asarray(v)[r:r + 1]
            out.append(_finish_row(self.hoisted, env, index))
        return out


def routed_graph(graph: Graph, bet: list[Leaf], batch: int) -> tuple[Graph, Graph]:
    """(hoisted generic graph, batched NPU graph) of a bet on some branches.

    The batched graph holds the graph's inputs with their CPU boundary nodes,
    every NPU node outside the If tree except the routing (ArgMax, Equal), and
    the bet's hoisted branches; its outputs are the routing ArgMax's input and
    every hoisted tensor the If tree reads. Raises :class:`SpecializationError`
    when the graph has no such routing.
    """
    g = graph
    for leaf in bet:
        g = hoist(g, leaf)
    routing = [n for n in g.nodes if isinstance(n, ArgMax | Equal | If)]
    argmaxes = [n for n in routing if isinstance(n, ArgMax)]
    if not argmaxes or not any(isinstance(n, If) for n in routing):
        raise SpecializationError(f"{graph.name}: no ArgMax-driven branch to route on")
    keep = [n for n in g.nodes if n not in routing and not _after_routing(g, n, routing)]
    kept_outputs = {o for n in keep for o in n.outputs}
    read_later = set()
    for n in g.nodes:
        if n in keep:
            continue
        read_later.update(n.inputs)
        if isinstance(n, If):
            for _, inner in n.then_graph.walk():
                read_later.update(inner.inputs)
            for _, inner in n.else_graph.walk():
                read_later.update(inner.inputs)
            read_later.update(n.then_graph.outputs)
            read_later.update(n.else_graph.outputs)
    outputs = sorted(t for t in read_later if t in kept_outputs)
    top = Graph(name=f"{graph.name}@route", nodes=copy.deepcopy(keep), inputs=list(g.inputs),
                outputs=outputs)
    needed = set(top.inputs) | {t for n in keep for t in n.inputs + n.outputs}
    top.tensors = {k: copy.deepcopy(v) for k, v in g.tensors.items() if k in needed}
    top.validate()
    return g, batch_graph(top, batch)


def _after_routing(g: Graph, n: Node, routing) -> bool:
    """Whether ``n`` reads (directly or not) a routing result (then the host runs it)."""
    produced = {o: m for m in g.nodes for o in m.outputs}
    seen, todo = set(), list(n.inputs)
    while todo:
        t = todo.pop()
        p = produced.get(t)
        if p is None or p.name in seen:
            continue
        if p in routing:
            return True
        seen.add(p.name)
        todo.extend(p.inputs)
    return False


class _Miss(Exception):
    """The input needs an NPU node the batch did not compute (a branch outside the bet)."""


def _index(g: Graph) -> tuple[dict, dict]:
    """(producer of every tensor, every tensor) over all scopes of ``g``."""
    prod = {o: n for _, n in g.walk() for o in n.outputs}
    tensors = dict(g.tensors)
    for _, n in g.walk():
        if isinstance(n, If):
            tensors.update(n.then_graph.tensors)
            tensors.update(n.else_graph.tensors)
    return prod, tensors


def _finish_row(g: Graph, env: dict, index) -> tuple[dict | None, tuple]:
    """The graph outputs of one input, evaluated on demand from ``env`` (the input
    and the batch's rows for it; None when it needs a branch outside the bet), and
    the path of branches it took."""
    path = []
    prod, tensors = index

    def value(t: str):
        if t in env:
            return env[t]
        n = prod.get(t)
        if n is None:
            data = tensors[t].data if t in tensors else None
            if data is None:
                raise KeyError(f"tensor {t!r} has no value on the host")
            return data
        if isinstance(n, If):
            cond = bool(np.asarray(value(n.inputs[0])).reshape(-1)[0])
            path.append((n.name, cond))
            branch = n.then_graph if cond else n.else_graph
            v = value(branch.outputs[n.outputs.index(t)])
        elif n.device == "npu" and not isinstance(n, ArgMax | Equal):
            raise _Miss(n.name)
        else:
            outs = eval_node(n, [value(i) for i in n.inputs])
            for o, ov in zip(n.outputs, outs, strict=True):
                env[o] = ov
            v = env[t]
        env[t] = v
        return v

    try:
        return {o: to_external(tensors.get(o), value(o), o) for o in g.outputs}, tuple(path)
    except _Miss:
        return None, tuple(path)


def routed_variant(graph: Graph, config: NPUConfig, bet: list[Leaf], batch: int,
                   compile_fn=None) -> RoutedVariant:
    """Compile a routed batch variant of ``graph`` (simplified) betting on ``bet``.

    The NPU part is one unit (the shared input loads once, intermediates stay on
    chip). ``compile_fn(batched_graph, units)`` replaces the compiler (the runtime
    passes its cache).
    """
    hoisted, batched = routed_graph(graph, bet, batch)
    units = [Subgraph(ROUTED_REGION, [n.name for n in batched.nodes if n.device == "npu"])]
    compile_fn = compile_fn or (lambda g, u: compile_model(g, config, u, simplified=True))
    return RoutedVariant(compile_fn(batched, units), batch, hoisted, tuple(bet))


def branch_leaves(graph: Graph) -> list[Leaf]:
    """The branches a routed variant can bet on."""
    return leaves(graph)
