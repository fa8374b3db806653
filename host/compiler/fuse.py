"""The fused static plan: neighbouring units merged where the cost model says so.

The per-layer plan (:func:`~host.compiler.plan.initial_units`) stores every
activation to DRAM and loads it back in the next unit. A merged unit keeps its
intermediates on chip, but may lower differently (M tiling, streaming, the
scratchpad it has left), so whether a merge pays is decided on the merged unit's
own code: :func:`fuse_units` lowers each candidate on its own (relocatable, as the
adaptive runtime's merged units; :mod:`host.compiler.units`) and asks the cost
model (:class:`~host.compiler.cost.CostModel`, from the unit's work) for its
cycles. Greedily, the merge of two neighbours that saves the most predicted
cycles is taken, until none saves any; a merge the compiler refuses (scratchpad,
accumulators, rows that do not split) is skipped with its reason kept.

Neighbours are units of one scope that run one after the other in the program
(within one NPU segment: no CPU node between them); a unit of a branch body never
merges with one outside it. Lowered units are remembered by their nodes and
context (:class:`~host.compiler.units.UnitMemo`), so each candidate lowers once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from firmware.config import NPUConfig

from ..ir import Graph, If
from .cost import CostModel
from .plan import CompileError, initial_units, stages
from .units import UnitMemo


@dataclass
class FusedPlan:
    """A plan chosen by :func:`fuse_units`.

    Members
    -------
    units : the plan, lists of node names in program order.
    predicted : predicted cycles of each unit (same order).
    per_layer : predicted cycles of the per-layer plan's units, summed.
    refused : ``(unit nodes, reason)`` of each merge of two of the plan's neighbours
        that the compiler refused.
    lowered : units lowered while choosing (candidates included).
    """

    units: list[list[str]]
    predicted: list[float]
    per_layer: float
    refused: list[tuple[list[str], str]] = field(default_factory=list)
    lowered: int = 0

    def log(self) -> list[str]:
        """What fusing did, one line per merged unit, refusal and the prediction."""
        out = [f"fused {' + '.join(u)}" for u in self.units if len(u) > 1]
        out += [f"not fused {' + '.join(u)}: {why}" for u, why in self.refused]
        out.append(f"fusion: {len(self.units)} units, predicted {round(sum(self.predicted))} "
                   f"cycles (per-layer plan {round(self.per_layer)})")
        return out


def fuse_units(graph: Graph, config: NPUConfig, *, weight_budget: int | None = None,
               cost: CostModel | None = None) -> FusedPlan:
    """The fused plan of the simplified ``graph`` on ``config``.

    Raises :class:`CompileError` when the per-layer plan itself does not compile.
    """
    from .compile import plan_units  # compile imports this module for its default plan

    cost = cost or CostModel(config)
    memo = UnitMemo()
    top_stage = stages(graph)
    places = _Places(graph)
    predicted: dict[tuple[str, ...], _Figure | CompileError] = {}

    def lower(plan: list[list[str]], targets: list[int]) -> None:
        """Predict the units ``targets`` (indices into ``plan``) that lack a figure."""
        todo = [i for i in targets if tuple(plan[i]) not in predicted]
        if not todo:
            return
        try:
            planner = plan_units(graph, config, plan, weight_budget=weight_budget)
        except CompileError as err:  # the plan's storage or placement refuses it
            for i in todo:
                predicted[tuple(plan[i])] = err
            return
        by_first = {u.nodes[0].name: (u, taken) for u, taken in planner.units}
        for i in todo:
            u, taken = by_first[plan[i][0]]
            context = planner.context(u, taken)
            try:
                code = memo.get(graph, plan[i], context)
                if code is None:
                    code = planner.lower(u, taken)
                    memo.put(graph, plan[i], context, code)
            except CompileError as err:
                memo.put(graph, plan[i], context, err)
                predicted[tuple(plan[i])] = err
                continue
            predicted[tuple(plan[i])] = _Figure(cost.predict(code.resources["work"]),
                                                len(code.words))

    plan = [list(u) for u in initial_units(graph)]
    lower(plan, list(range(len(plan))))
    for u in plan:
        if isinstance(predicted[tuple(u)], CompileError):
            raise predicted[tuple(u)]
    per_layer = sum(predicted[tuple(u)].cycles for u in plan)
    budget = config.imem_depth - _program_overhead(graph, top_stage)
    while True:
        order = places.program_order(plan, top_stage)
        pairs = [(a, b) for a, b in zip(order, order[1:], strict=False)
                 if places.neighbours(plan[a], plan[b], top_stage)]
        best, refused = None, []
        size = sum(predicted[tuple(u)].instructions for u in plan)
        for a, b in pairs:
            merged_plan = _merged(plan, a, b)
            k = merged_plan.index(plan[a] + plan[b])
            lower(merged_plan, [k])
            fig = predicted[tuple(plan[a] + plan[b])]
            if isinstance(fig, CompileError):
                refused.append((plan[a] + plan[b], str(fig).splitlines()[0]))
                continue
            fa, fb = predicted[tuple(plan[a])], predicted[tuple(plan[b])]
            gain = fa.cycles + fb.cycles - fig.cycles
            grown = fig.instructions - fa.instructions - fb.instructions
            # Over the budget already (the per-layer plan's units), a merge that
            # shrinks the program still helps.
            fits = size + grown <= budget or grown <= 0
            if gain > 0 and fits and (best is None or gain > best[0]):
                best = (gain, merged_plan)
        if best is None:
            break
        plan = best[1]
    return FusedPlan(plan, [predicted[tuple(u)].cycles for u in plan], per_layer, refused,
                     memo.compiled)


def _program_overhead(graph: Graph, top_stage: dict) -> int:
    """Instructions of a program beyond its units' code: per NPU segment its
    dispatch branch and ``end``, per ``If`` on the NPU its branch and jump."""
    segments = len({s for s in top_stage.values() if s % 2})
    branches = sum(isinstance(n, If) and n.device == "npu" for _, n in graph.walk())
    return 2 * segments + 2 * branches


@dataclass(frozen=True)
class _Figure:
    cycles: float
    instructions: int


def _merged(plan: list[list[str]], a: int, b: int) -> list[list[str]]:
    """``plan`` with units ``a`` and ``b`` as one unit (where the first of them was)."""
    first, second = sorted((a, b))
    out = [list(u) for u in plan]
    out[first] = plan[a] + plan[b]
    del out[second]
    return out


class _Places:
    """Where each node of ``graph`` sits: its walk position, scope and top-level node."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.position, self.scope, self.top = {}, {}, {}
        top = None
        for i, (g, n) in enumerate(graph.walk()):
            if g is graph:
                top = n.name
            self.position[n.name], self.scope[n.name], self.top[n.name] = i, g, top

    def program_order(self, plan: list[list[str]], top_stage: dict) -> list[int]:
        """Indices of ``plan``'s units in the order the program runs them."""
        return sorted(range(len(plan)), key=lambda i: (
            top_stage[self.top[plan[i][0]]], self.position[plan[i][0]]))

    def neighbours(self, a: list[str], b: list[str], top_stage: dict) -> bool:
        """Whether units ``a`` and ``b`` (consecutive in program order) may merge: one
        scope, and in the top scope one NPU segment."""
        scope = self.scope[a[0]]
        if scope is not self.scope[b[0]]:
            return False
        return scope is not self.graph or top_stage[a[0]] == top_stage[b[0]]
