"""Records the adaptive runtime hands out: events and inferences."""

from __future__ import annotations

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
