"""Fusion candidates: which chains of units to merge, scored and checked for fit.

A candidate is a chain of active units that the profiler saw run back to back
often enough. Its score estimates the cycles a merge saves per inference:

* data locality: every tensor produced inside the chain and read only inside it
  stops crossing DRAM (one store, one load per reader, their bus beats and DMA
  latencies, priced with the cost model's current coefficients), a tensor several
  of its units read is loaded once, and one region boundary (the queues drain at
  each mark) goes away per merged link;
* resource complementarity: a compute-bound unit beside a memory-bound one lets
  the merged unit's DMA overlap its compute, worth a bonus factor.

Feasibility is decided in two steps: structural checks here (one scope, active,
not quarantined, not refused before), then the compiler itself, which refuses a
merged unit that does not fit the scratchpad's working partition, the tag slots or
the instruction bank (:class:`~host.compiler.plan.CompileError`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler import CompiledModel
from ..compiler.cost import CostModel
from ..compiler.lower import is_alias, scope_tensors
from ..ir import If
from .units import ACTIVE, QUARANTINED, UnitGraph

COMPLEMENT_BONUS = 1.25


@dataclass
class Candidate:
    """A chain of active units worth merging.

    Members
    -------
    chain : unit ids in execution order.
    frequency : how often the chain runs per inference (profiler, decayed).
    saved_bytes : DRAM bytes per run that stop crossing the bus.
    saved_transfers : DMA transfers per run that disappear.
    complementary : compute-bound and memory-bound units side by side.
    score : estimated cycles saved per inference.
    """

    chain: tuple[int, ...]
    frequency: float
    saved_bytes: int
    saved_transfers: int
    complementary: bool
    score: float

    def describe(self) -> str:
        return (f"chain {'+'.join(map(str, self.chain))}: runs {self.frequency:.2f}/inference, "
                f"saves {self.saved_bytes} B and {self.saved_transfers} DMA transfers per run"
                + (", compute beside memory bound" if self.complementary else "")
                + f"; ~{self.score:.0f} cycles/inference")


_FACTS: list = []  # (model, facts) of the last model asked about (one per plan)


def _graph_facts(model: CompiledModel) -> tuple[dict, dict, dict]:
    """(readers, producer names, tensors) of a plan's graph, computed once per plan:
    every candidate of every decision asks for them."""
    if _FACTS and _FACTS[0][0] is model:
        return _FACTS[0][1]
    facts = (_consumers(model), {o: n.name for _, n in model.graph.walk() for o in n.outputs},
             scope_tensors(model.graph))
    _FACTS[:] = [(model, facts)]
    return facts


def _consumers(model: CompiledModel) -> dict[str, list[str]]:
    """Tensor (alias roots resolved) -> names of the nodes reading it ('@out' for
    graph and branch outputs)."""
    prod = {o: n for _, n in model.graph.walk() for o in n.outputs}

    def root(t: str) -> str:
        p = prod.get(t)
        while p is not None and is_alias(p):
            t = p.inputs[0]
            p = prod.get(t)
        return t

    readers: dict[str, list[str]] = {}
    for _, n in model.graph.walk():
        if is_alias(n):
            continue
        for t in n.inputs:
            readers.setdefault(root(t), []).append(n.name)
        if isinstance(n, If):  # a branch's outputs are read outside it
            for branch in (n.then_graph, n.else_graph):
                for o in branch.outputs if branch is not None else ():
                    readers.setdefault(root(o), []).append("@out")
    for o in model.graph.outputs:
        readers.setdefault(root(o), []).append("@out")
    return readers


def locality(model: CompiledModel, units: UnitGraph, chain) -> tuple[int, int]:
    """(bytes, transfers) per run that a merge of ``chain`` keeps off DRAM."""
    inside = {n for uid in chain for n in units[uid].nodes}
    readers, prod, tensors = _graph_facts(model)
    owner = {n: uid for uid in chain for n in units[uid].nodes}
    saved_bytes = saved_transfers = 0
    for t in model.place.arena:
        who = readers.get(t, [])
        if prod.get(t) in inside and who and all(r in inside for r in who):
            saved_bytes += tensors[t].size * (1 + len(who))
            saved_transfers += 1 + len(who)
        elif prod.get(t) not in inside:
            # Read by several units of the chain: the merged unit loads it once.
            extra = len({owner[r] for r in who if r in owner}) - 1
            if extra > 0:
                saved_bytes += tensors[t].size * extra
                saved_transfers += extra
    return saved_bytes, saved_transfers


def score_chain(model: CompiledModel, units: UnitGraph, chain, frequency: float,
                cost: CostModel, bounds: dict[int, str]) -> Candidate:
    """Estimate what merging ``chain`` saves per inference (see the module text)."""
    nbytes, transfers = locality(model, units, chain)
    c = cost.coef
    per_run = (c["dma_beats"] * -(-nbytes // model.config.bus_bytes)
               + c["transfers"] * transfers + c["fixed"] * (len(chain) - 1))
    kinds = {bounds.get(uid) for uid in chain}
    complementary = {"compute", "memory"} <= kinds
    score = frequency * max(per_run, 0.0) * (COMPLEMENT_BONUS if complementary else 1.0)
    return Candidate(tuple(chain), frequency, nbytes, transfers, complementary, score)


def refusal(units: UnitGraph, chain, refused: dict) -> str | None:
    """Why ``chain`` cannot be merged before compiling it (None: try the compiler)."""
    if len(set(chain)) != len(chain):
        return "a unit repeats in the chain (a loop, not a chain)"
    for uid in chain:
        if uid not in units.units or units[uid].state != ACTIVE:
            return f"unit {uid} is not in the running plan"
    if not units.same_scope(chain):
        return "the chain crosses a branch (needs a speculative merge)"
    key = frozenset(n for uid in chain for n in units[uid].nodes)
    if key in refused:
        return refused[key]
    found = units.find(key)
    if found is not None and found.state == QUARANTINED:
        return f"unit {found.id} is quarantined"
    return None
