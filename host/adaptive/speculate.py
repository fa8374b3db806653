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
from ..ir import ArgMax, Equal, Graph, If
from .fusion import Candidate
from .units import Unit


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


# ---- bets (the runtime's record of a speculative merge) ------------------------------


@dataclass
class Bet:
    """A speculative unit's wager and its record (decayed and total).

    Members
    -------
    unit : the speculative unit; leaf : the branch it bets on.
    before, gate_before : warm cycles of the gate's and the branch's units before
        the merge, and of the gate's unit alone.
    estimated_waste : the branch's cycles (what a miss wastes, until measured).
    top : region ids outside the branches (a hit runs only these).
    bets, losses : decayed counts; total, lost : plain counts.
    since : the inference it was swapped in at.
    hit_cycles, miss_cycles : decayed mean cycles of its region on hits and misses.
    """

    unit: Unit
    leaf: Leaf
    before: float  # cycles of the gate's and the branch's units before the merge
    gate_before: float  # cycles of the gate's unit alone
    estimated_waste: float
    top: frozenset = frozenset()  # region ids outside the branches (a hit runs only these)
    bets: float = 0.0
    losses: float = 0.0
    total: int = 0
    lost: int = 0
    since: int = 0
    hit_cycles: float | None = None  # decayed mean cycles of the merged region
    miss_cycles: float | None = None

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.losses / self.bets if self.bets else 1.0

    @property
    def gain(self) -> float | None:
        """Measured cycles a hit saves (None before the first hit)."""
        return None if self.hit_cycles is None else self.before - self.hit_cycles

    @property
    def waste(self) -> float:
        """Measured cycles a miss wastes (the estimate before the first miss)."""
        if self.miss_cycles is None:
            return self.estimated_waste
        return max(0.0, self.miss_cycles - self.gate_before)

    @property
    def break_even(self) -> float:
        """The hit rate below which the bet costs more than it saves (measured)."""
        gain = self.gain
        if gain is None:
            return 0.0
        if gain <= 0:
            return 1.0
        return self.waste / (self.waste + gain)


class Speculation:
    """The runtime's speculative merges: the running bet (at most one), the branch
    probability a new bet needs, and what the bets that stopped paying measured.

    Members
    -------
    bet : the running bet, or None.
    threshold : the branch probability a bet needs (raised by ``step`` each time a
        bet stops paying, up to 0.95).
    break_even : per branch, the break-even hit rate its lost bet measured (a later
        bet on it needs a margin over that).
    lost_at : per branch, the inference its last bet was given up at.
    """

    def __init__(self, threshold: float, step: float, decay: float):
        self.threshold, self.step, self.decay = threshold, step, decay
        self.bet: Bet | None = None
        self.break_even: dict[Leaf, float] = {}
        self.lost_at: dict[Leaf, int] = {}

    def observe(self, ids: list[int], trace) -> str:
        """Count a run (its region ids and trace) for the running bet: ``"hit"`` or
        ``"miss"`` when the bet's unit ran, ``""`` otherwise."""
        b = self.bet
        if b is None or b.unit.id not in ids:
            return ""
        lost = any(i not in b.top for i in ids)
        d = self.decay
        b.bets, b.losses = b.bets * d + 1, b.losses * d + lost
        recs = [r for r in trace if r.region == b.unit.id]
        c = sum(r.cycles for r in recs)
        if any(r.tag_misses for r in recs):
            pass  # a cold run (tags refilling after a swap) is not the bet's cost
        elif lost:
            b.miss_cycles = c if b.miss_cycles is None else d * b.miss_cycles + (1 - d) * c
        else:
            b.hit_cycles = c if b.hit_cycles is None else d * b.hit_cycles + (1 - d) * c
        b.total += 1
        b.lost += lost
        return "miss" if lost else "hit"

    def stops_paying(self, n: int, settle: int) -> bool:
        """Whether the running bet, settled, hits less often than its break-even."""
        b = self.bet
        return b is not None and n - b.since >= settle and b.hit_rate < b.break_even

    def give_up(self, n: int) -> str:
        """Learn from the running bet that stops paying (the threshold rises, its
        branch keeps the measured break-even); the reason to split it."""
        b = self.bet
        old = self.threshold
        self.threshold = min(0.95, old + self.step)
        self.break_even[b.leaf] = b.break_even
        self.lost_at[b.leaf] = n
        return (f"bet stops paying: hit rate {100 * b.hit_rate:.0f}% < break-even "
                f"{100 * b.break_even:.0f}%; speculation threshold {100 * old:.0f}% -> "
                f"{100 * self.threshold:.0f}%")

    def cooling(self, leaf: Leaf, n: int, settle: int) -> bool:
        """Whether a bet on ``leaf`` was given up too recently to bet again."""
        return n - self.lost_at.get(leaf, -10**9) < 2 * settle

    def needed(self, leaf: Leaf) -> float:
        """The probability a bet on ``leaf`` needs: the threshold, and a margin over
        the break-even its lost bet measured."""
        floor = self.break_even[leaf] + 0.05 if leaf in self.break_even else 0.0
        return max(self.threshold, floor)

    def placed(self, leaf: Leaf) -> None:
        """A new bet on ``leaf`` is planned: its measured break-even is dropped."""
        self.break_even.pop(leaf, None)

    def swapped_in(self, unit_id: int, bet: Bet | None, graph: Graph, units, n: int
                   ) -> Bet | None:
        """A plan change landed: ``bet`` (a speculative merge's, on ``graph`` with
        ``units``) runs from now, or the change splits the running bet's unit
        ``unit_id``. Returns the bet that ran before."""
        before = self.bet
        if bet is not None:
            bet.since = n
            top_nodes = {node.name for node in graph.nodes}
            bet.top = frozenset(s.id for s in units if set(s.nodes) <= top_nodes)
            self.bet = bet
        elif self.bet is not None and unit_id == self.bet.unit.id:
            self.bet = None
        return before

    def report(self) -> dict | None:
        """The running bet (JSON-ready), or None."""
        b = self.bet
        return None if b is None else {
            "unit": b.unit.id, "branch": b.leaf.describe(), "hit_rate": b.hit_rate,
            "break_even": b.break_even, "gain_per_hit": b.gain, "waste_per_miss": b.waste}


@dataclass
class SpecCandidate(Candidate):
    """A speculative merge: the gate's unit and the predicted branch's units.

    Members (beyond :class:`~.fusion.Candidate`)
    -------
    leaf : the predicted branch body.
    probability : how often the gate's unit is followed by that branch.
    hit_gain, waste : estimated cycles a hit saves and a miss wastes.
    """

    leaf: Leaf | None = None
    probability: float = 0.0
    hit_gain: float = 0.0
    waste: float = 0.0

    def describe(self) -> str:
        return (f"bet on {self.leaf.describe()} after unit {self.chain[0]}: taken "
                f"{100 * self.probability:.0f}%; a hit saves ~{self.hit_gain:.0f} cycles "
                f"(estimate), a miss wastes ~{self.waste:.0f} (measured cycles of the branch)")


def routing_argmax(g: Graph, leaf: Leaf) -> ArgMax | None:
    """The ArgMax whose result decides ``leaf``'s top If (through Equal), if any."""
    prod = {o: n for n in g.nodes for o in n.outputs}
    n = prod.get(g.node(leaf.top_if).inputs[0])
    while n is not None and isinstance(n, Equal):
        n = prod.get(n.inputs[0])
    return n if isinstance(n, ArgMax) else None


def gate_unit(g: Graph, leaf: Leaf, owner: dict) -> Unit | None:
    """The unit (of ``owner``: node -> unit) holding ``leaf``'s routing ArgMax."""
    n = routing_argmax(g, leaf)
    return owner.get(n.name) if n is not None else None
