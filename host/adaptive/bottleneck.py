"""What bounds a unit's cycles, read from the NPU's counters by cause.

A region-trace record (or a run's counter deltas) says how many of a unit's cycles
each engine was busy (``busy_load``, ``busy_store``, ``busy_array``, ``busy_vector``)
and how many scratchpad port-cycles its bank arbitration refused (``sp_conflicts``).
:func:`classify` turns those into one of four classes, the question the
specialization engine asks before it picks a variant:

* ``conflict``: refused scratchpad requests add up to at least
  :data:`CONFLICT_SHARE` of the cycles (a layout that spreads banks helps);
* ``overhead``: no engine is busy for :data:`BUSY_SHARE` of the cycles
  (dispatch, drains, pipeline latency and token waits dominate; bigger tiles or
  fusion help);
* ``memory``: a DMA channel is the busiest engine (prefetch, residency, reuse help);
* ``compute``: the array or the vector unit is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BUSY_SHARE", "CONFLICT_SHARE", "CAUSE_FIELDS", "Bottleneck", "classify"]

BUSY_SHARE = 0.5
"""An engine busy for less than this share of the cycles does not bound them."""

CONFLICT_SHARE = 0.1
"""Refused scratchpad port-cycles per cycle from which bank conflicts bound a unit."""

CAUSE_FIELDS = ("busy_load", "busy_store", "busy_array", "busy_vector", "sp_conflicts")
"""The counters :func:`classify` reads (region-trace fields and counter names)."""

_ENGINES = {"busy_load": "memory", "busy_store": "memory",
            "busy_array": "compute", "busy_vector": "compute"}


@dataclass(frozen=True)
class Bottleneck:
    """A unit's bottleneck class and the shares of its cycles it was read from.

    Members
    -------
    kind : ``"memory"``, ``"compute"``, ``"overhead"`` or ``"conflict"``.
    shares : each of :data:`CAUSE_FIELDS` divided by the cycles.
    """

    kind: str
    shares: dict

    def describe(self, engines: int = 2) -> str:
        """One line naming the ``engines`` busiest engines, e.g. ``memory-bound (load
        82%, array 31%)``."""
        busy = sorted(((v, k) for k, v in self.shares.items() if k in _ENGINES), reverse=True)
        parts = [f"{k.removeprefix('busy_')} {100 * v:.0f}%" for v, k in busy[:engines]]
        if self.kind == "conflict":
            parts.insert(0, f"conflicts {self.shares['sp_conflicts']:.2f}/cycle")
        return f"{self.kind}-bound ({', '.join(parts)})"


def classify(cycles: float, counts: Mapping[str, float]) -> Bottleneck:
    """Classify what bounds ``cycles`` from the counters by cause in ``counts``
    (a mapping with every :data:`CAUSE_FIELDS` name: a trace record's fields as a
    dict, a run's counter deltas, or per-run means).

    Raises ``ValueError`` for a negative count or a field missing.
    """
    missing = [f for f in CAUSE_FIELDS if f not in counts]
    if missing:
        raise ValueError(f"counters missing: {', '.join(missing)}")
    if any(counts[f] < 0 for f in CAUSE_FIELDS) or cycles < 0:
        raise ValueError(f"negative counts: cycles {cycles}, {dict(counts)}")
    shares = {f: counts[f] / cycles if cycles > 0 else 0.0 for f in CAUSE_FIELDS}
    busiest = max(_ENGINES, key=lambda f: shares[f])
    if shares["sp_conflicts"] >= CONFLICT_SHARE:
        kind = "conflict"
    elif shares[busiest] < BUSY_SHARE:
        kind = "overhead"
    else:
        kind = _ENGINES[busiest]
    return Bottleneck(kind, shares)
