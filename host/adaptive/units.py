"""The dynamic compilation graph: every unit the runtime has made, and the live plan.

A *unit* is a set of nodes of one graph scope that the compiler turns into one
region of the program. The runtime starts from the compiler's initial units (one
anchor operator with its epilogue each), merges chains of them that run together
often, and splits merged units back when they go cold. Every unit ever made stays
in the graph with its history, so ``npu report`` can show how the plan evolved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..compiler import CompiledModel
from ..ir import Subgraph

ORIGINAL, MERGED, SPECULATIVE = "original", "merged", "speculative"
ACTIVE, IDLE, RETIRED, QUARANTINED = "active", "idle", "retired", "quarantined"
MERGED_BASE = 1024  # merged units of consecutive originals: MERGED_BASE + first*64 + last
OTHER_BASE = 8192
SPEC_BASE = 16384  # speculative merges: SPEC_BASE + first*64 + last original unit


def merged_unit_id(originals) -> int | None:
    """The region id of a merge of consecutive original units ``a..b`` (ids in
    program order): ``MERGED_BASE + a*64 + b``; None for any other set."""
    covered = sorted(originals)
    a, b = covered[0], covered[-1]
    if covered == list(range(a, b + 1)) and b < 64:
        return MERGED_BASE + a * 64 + b
    return None


@dataclass
class Event:
    """One entry of a unit's history (``created``, ``merged``, ``swapped-in``, ...)."""

    inference: int
    kind: str
    reason: str = ""
    time: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return {"inference": self.inference, "kind": self.kind, "reason": self.reason}


@dataclass
class Unit:
    """A node of the compilation graph.

    Members
    -------
    id : the region id its code carries (unique over the graph's lifetime).
    nodes : graph node names, in scope order.
    parts : the unit ids it was merged from (empty for an original unit).
    kind : ``original``, ``merged`` (a chain of one scope) or ``speculative``
        (a branch's predicted path hoisted into the unit that decides it).
    state : ``active`` (in the running plan), ``idle`` (not in it, may return),
        ``retired`` (split back into its parts) or ``quarantined`` (failed
        validation; never used again).
    specialization : the variant it is compiled as (``""`` = generic).
    exec_count : runs of its region seen in the trace.
    resources : scratchpad, tag and instruction figures from its last compile.
    history : its events.
    """

    id: int
    nodes: tuple[str, ...]
    parts: tuple[int, ...] = ()
    kind: str = ORIGINAL
    state: str = IDLE
    specialization: str = ""
    exec_count: int = 0
    resources: dict = field(default_factory=dict)
    history: list[Event] = field(default_factory=list)

    def record(self, inference: int, kind: str, reason: str = "") -> Event:
        ev = Event(inference, kind, reason)
        self.history.append(ev)
        return ev

    def as_dict(self) -> dict:
        return {"id": self.id, "nodes": list(self.nodes), "parts": list(self.parts),
                "kind": self.kind, "state": self.state,
                "specialization": self.specialization, "exec_count": self.exec_count,
                "resources": dict(self.resources),
                "history": [e.as_dict() for e in self.history]}


class UnitGraph:
    """All units of one model and the plan (the active units) the NPU runs.

    Parameters
    ----------
    model : the model compiled with its initial units; they become units 1..n.
    """

    def __init__(self, model: CompiledModel):
        self.graph = model.graph
        self.order = {n.name: i for i, (_, n) in enumerate(model.graph.walk())}
        self.units: dict[int, Unit] = {}
        self.scope: dict[str, str] = {n.name: g.name for g, n in model.graph.walk()}
        self.owner: dict[str, int] = {}  # node -> original unit
        for sub in model.units:
            if sub.id >= MERGED_BASE:
                raise ValueError(f"initial unit id {sub.id} collides with merged ids")
            self.owner.update({n: sub.id for n in sub.nodes})
            u = Unit(sub.id, tuple(sub.nodes), state=ACTIVE)
            u.record(0, "created", "initial unit (anchor operator and its epilogue)")
            self.units[u.id] = u

    # ---- queries ----------------------------------------------------------------------
    def __getitem__(self, uid: int) -> Unit:
        return self.units[uid]

    def active(self) -> list[Unit]:
        """The plan's units in program order."""
        return sorted((u for u in self.units.values() if u.state == ACTIVE),
                      key=lambda u: self.order[u.nodes[0]])

    def plan(self) -> list[Subgraph]:
        """The active units as the compiler takes them."""
        return [Subgraph(u.id, list(u.nodes)) for u in self.active()]

    def originals(self, uid: int) -> list[int]:
        """The original units a unit is made of (itself when original)."""
        u = self.units[uid]
        if not u.parts:
            return [uid]
        return [o for p in u.parts for o in self.originals(p)]

    def same_scope(self, uids) -> bool:
        return len({self.scope[self.units[u].nodes[0]] for u in uids}) == 1

    def find(self, nodes) -> Unit | None:
        """A unit (of any state) covering exactly these nodes."""
        key = tuple(sorted(nodes, key=self.order.__getitem__))
        for u in self.units.values():
            if u.nodes == key:
                return u
        return None

    # ---- changes (each returns the new plan; the runtime installs it) ------------------
    def merged(self, chain, inference: int, reason: str, kind: str = MERGED) -> Unit:
        """The unit covering a chain of active units, made (idle) if new.

        A chain merged before and split again reuses its unit and id, so its
        cached code and history carry over.
        """
        nodes = [n for uid in chain for n in self.units[uid].nodes]
        existing = self.find(nodes)
        if existing is not None:
            if existing.state == QUARANTINED:
                raise ValueError(f"unit {existing.id} is quarantined")
            return existing
        uid = self._merged_id(nodes, kind)
        u = Unit(uid, tuple(sorted(nodes, key=self.order.__getitem__)), tuple(chain),
                 kind=kind)
        u.record(inference, "created", reason)
        self.units[uid] = u
        return u

    def _merged_id(self, nodes, kind: str = MERGED) -> int:
        """A region id that depends only on which original units are covered, so a
        merged unit gets the same id in every session (compiled plans are cached
        across sessions and processes, and their region marks carry the ids).

        Original units are numbered in program order; a merge of the consecutive
        originals ``a..b`` (the usual case: a chain) gets ``MERGED_BASE + a*64 + b``;
        anything else the next free id above ``OTHER_BASE``.
        """
        covered = sorted({self.owner[n] for n in nodes})
        uid = merged_unit_id(covered) if kind == MERGED else None
        if kind == SPECULATIVE and covered[-1] < 64:
            uid = SPEC_BASE + covered[0] * 64 + covered[-1]
        if uid is None:
            uid = max(OTHER_BASE, max(self.units) + 1)
        if uid in self.units:
            raise ValueError(f"unit id {uid} is taken")
        return uid

    def plan_with(self, unit: Unit) -> list[Subgraph]:
        """The plan after ``unit`` replaces the active units it covers (merge)."""
        covered = set(unit.nodes)
        keep = [u for u in self.active() if not covered & set(u.nodes)]
        units = sorted(keep + [unit], key=lambda u: self.order[u.nodes[0]])
        return [Subgraph(u.id, list(u.nodes)) for u in units]

    def plan_without(self, unit: Unit) -> list[Subgraph]:
        """The plan after an active merged unit is split back into its parts."""
        units = [u for u in self.active() if u.id != unit.id]
        units += [self.units[p] for p in unit.parts]
        units.sort(key=lambda u: self.order[u.nodes[0]])
        return [Subgraph(u.id, list(u.nodes)) for u in units]

    def adopt(self, plan: list[Subgraph], inference: int, reason: str,
              came: str = "swapped-in", went: str = "swapped-out") -> list[tuple[Unit, Event]]:
        """Make ``plan`` the active set; record who came and went (history kinds
        ``came`` and ``went``: a swap on the device by default) and why."""
        ids = {s.id for s in plan}
        events = []
        for u in self.units.values():
            if u.id in ids and u.state != ACTIVE:
                u.state = ACTIVE
                events.append((u, u.record(inference, came, reason)))
            elif u.id not in ids and u.state == ACTIVE:
                u.state = IDLE if u.kind == ORIGINAL else RETIRED
                events.append((u, u.record(inference, went, reason)))
        return events

    def quarantine(self, uid: int, inference: int, reason: str) -> None:
        u = self.units[uid]
        u.state = QUARANTINED
        u.record(inference, "quarantined", reason)

    def as_dict(self) -> dict:
        return {"units": [u.as_dict() for u in sorted(self.units.values(),
                                                       key=lambda u: u.id)],
                "plan": [u.id for u in self.active()]}
