"""Records the adaptive runtime hands out: events, inferences, and the log of a stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..compiler import CompiledModel
from ..runtime import Inference


@dataclass
class RuntimeEvent:
    """Something the runtime did, at an inference index (streamed live, reported)."""

    inference: int
    kind: str
    units: tuple[int, ...]
    detail: str = ""

    def __str__(self) -> str:
        ids = "+".join(map(str, self.units))
        return f"[{self.inference:5d}] {self.kind:<16} unit {ids:<12} {self.detail}"

    def as_dict(self) -> dict:
        return {"inference": self.inference, "kind": self.kind, "units": list(self.units),
                "detail": self.detail}


class StreamLog:
    """What happened over the stream a runtime serves: how many inferences, what
    the runtime did (counts), and its events, stamped with the inference index.

    Single and batched serving write to the same log. ``on_event`` is called with
    each event as it happens.

    Members
    -------
    inferences : inferences served so far (the index the next event is stamped with).
    swaps, rollbacks, compiles : plans landed, plans (or batch variants) rolled
        back, plan changes compiled.
    bets, misspeculations : runs of a speculative unit or inputs of a routed batch,
        and those the bet lost.
    events : every event; fresh : the events of the current call.
    """

    def __init__(self, on_event: Callable[[RuntimeEvent], None] | None = None):
        self.on_event = on_event
        self.inferences = 0
        self.swaps = self.rollbacks = self.compiles = 0
        self.bets = self.misspeculations = 0
        self.events: list[RuntimeEvent] = []
        self.fresh: list[RuntimeEvent] = []

    def begin_call(self) -> None:
        """A new call to the runtime: its events start here."""
        self.fresh = []

    def emit(self, kind: str, units, detail: str = "") -> RuntimeEvent:
        """Record an event at the current inference index (and stream it)."""
        ev = RuntimeEvent(self.inferences, kind, tuple(units), detail)
        self.events.append(ev)
        self.fresh.append(ev)
        if self.on_event is not None:
            self.on_event(ev)
        return ev


@dataclass
class AdaptiveInference(Inference):
    """An :class:`~host.runtime.Inference` plus what the runtime did around it.

    Members
    -------
    index : 1-based position in the stream.
    plan : the unit ids of the plan that computed it.
    model : that plan's compiled program.
    events : runtime events during this inference.
    host_seconds : host time spent on it (runs, checks, profiling, decisions).
    overhead_seconds : the part of it the adaptive loop adds to the plain run
        (reference check, profiling, deciding, staging a plan, a rollback re-run).
    speculation : ``"hit"`` or ``"miss"`` when a speculative unit ran, else ``""``.
    """

    index: int = 0
    plan: tuple[int, ...] = ()
    model: CompiledModel | None = field(default=None, repr=False)
    events: list[RuntimeEvent] = field(default_factory=list)
    host_seconds: float = 0.0
    overhead_seconds: float = 0.0
    speculation: str = ""


def mismatch(got: dict, want: dict) -> str | None:
    """How ``got`` differs from ``want`` (output by output), or None when equal."""
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape or not np.array_equal(g, w):
            gv = None if g is None else g.ravel()[:8]
            return f"output {name!r}: NPU {gv} != reference {w.ravel()[:8]}"
    return None
