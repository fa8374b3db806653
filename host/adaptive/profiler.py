"""The adaptive runtime's profiler: which units run, in which order, and at what cost.

After every inference the runtime hands the :class:`Profiler` that inference's
region trace: the ids of the compiled units (regions) that ran, in execution
order, optionally with their :class:`~firmware.golden.TraceRecord` counters and a
few input features. The profiler keeps

* the last ``window`` traces (:meth:`Profiler.recent`);
* decayed counts of every chain of adjacent units of length ``2..max_chain``
  (:meth:`Profiler.chains`), counted once per occurrence, so loops count too;
* per-unit frequencies and decayed means of the per-region counters
  (:meth:`Profiler.unit_stats`), which tell compute-bound from memory-bound units;
* the observed dependency graph: the probability that unit ``b`` runs right after
  unit ``a`` (:meth:`Profiler.edges`), also conditioned on input features
  (:meth:`Profiler.edge_probability`), which is how branch probabilities of gated
  and early-exit models show up.

Decay
-----
Every count is exponentially decayed per inference: an occurrence seen ``k``
inferences ago (``k = 0`` for the latest inference) weighs ``decay**k``.
Frequencies divide a decayed count by the decayed number of inferences
``sum(decay**k for k in range(n))``, so 1.0 means "once per inference" in steady
state. A chain or edge whose decayed count falls below ``min_count`` is no longer
reported and is swept from the tables (every ``window`` inferences), which bounds
memory. Decay is lazy: each entry stores its value at the inference it was last
updated, so :meth:`Profiler.observe` costs ``O(len(trace) * max_chain)``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from numbers import Integral, Real

import numpy as np

from firmware.golden import TraceRecord

from .bottleneck import classify

__all__ = ["ProfilerConfig", "Profiler", "UnitStats", "STAT_FIELDS"]

STAT_FIELDS = ("cycles", "macs", "dram_read", "dram_write", "hits", "misses", "stalls",
               "busy_load", "busy_store", "busy_array", "busy_vector", "sp_conflicts")
"""Per-unit counter means kept by the profiler, in :class:`UnitStats` field order."""

FeatureKey = tuple[tuple[str, Hashable], ...]


def _record_values(rec: TraceRecord) -> tuple[float, ...]:
    """The :data:`STAT_FIELDS` values of one trace record."""
    return (rec.cycles, rec.macs, rec.dram_read_bytes, rec.dram_write_bytes,
            rec.tag_hits, rec.tag_misses, rec.stall_cycles, rec.busy_load, rec.busy_store,
            rec.busy_array, rec.busy_vector, rec.sp_conflicts)


@dataclass(frozen=True)
class ProfilerConfig:
    """Profiler knobs.

    Members
    -------
    window : how many recent traces :meth:`Profiler.recent` keeps (default 64);
        also the sweep interval of the count tables.
    decay : per-inference decay factor in (0, 1] (default 0.95): a count seen
        ``k`` inferences ago weighs ``decay**k``; old behaviour fades within about
        ``1 / (1 - decay)`` inferences. 1.0 disables decay.
    max_chain : longest chain of adjacent units counted (default 4, at least 2).
    min_count : a chain or edge whose decayed count drops below this is dropped
        from the tables (default 0.01; 0 keeps everything).
    """

    window: int = 64
    decay: float = 0.95
    max_chain: int = 4
    min_count: float = 0.01

    def __post_init__(self):
        for name, low in (("window", 1), ("max_chain", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")
            object.__setattr__(self, name, int(value))
        decay = self.decay
        if isinstance(decay, bool) or not isinstance(decay, Real) or not 0 < decay <= 1:
            raise ValueError(f"decay must be a number in (0, 1], not {decay!r}")
        object.__setattr__(self, "decay", float(decay))
        mc = self.min_count
        if (isinstance(mc, bool) or not isinstance(mc, Real) or not math.isfinite(mc)
                or mc < 0):
            raise ValueError(f"min_count must be a finite number >= 0, not {mc!r}")
        object.__setattr__(self, "min_count", float(mc))


@dataclass(frozen=True)
class UnitStats:
    """What the profiler knows about one unit.

    Members
    -------
    uid : the unit (region) id.
    frequency : decayed runs per decayed inference (1.0 = once per inference).
    runs : undecayed total number of runs observed.
    samples : decayed number of runs that came with a trace record (the weight
        behind the means; 0 when no records were given).
    cycles, macs, dram_read, dram_write, hits, misses, stalls : decayed means per
        run of the region's cycles, MACs, DRAM bytes read and written, tag hits and
        misses, and stall cycles.
    busy_load, busy_store, busy_array, busy_vector, sp_conflicts : decayed means per
        run of the engines' busy cycles and the refused scratchpad port-cycles (the
        counters by cause).
    """

    uid: int
    frequency: float
    runs: int
    samples: float = 0.0
    cycles: float = 0.0
    macs: float = 0.0
    dram_read: float = 0.0
    dram_write: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    stalls: float = 0.0
    busy_load: float = 0.0
    busy_store: float = 0.0
    busy_array: float = 0.0
    busy_vector: float = 0.0
    sp_conflicts: float = 0.0

    def bound(self, peak_macs: float, bus_bytes: float) -> str:
        """Classify what dominates this unit's cycles.

        Parameters
        ----------
        peak_macs : MACs the array does per cycle at best (rows * cols).
        bus_bytes : DRAM bytes the bus moves per cycle at best.

        Returns
        -------
        Where the records measured the engines' busy cycles, the class
        :func:`host.adaptive.bottleneck.classify` reads from them: ``"memory"``,
        ``"compute"``, ``"overhead"`` or ``"conflict"``. Otherwise an estimate from
        the work alone: ``"compute"`` when ``macs / peak_macs`` accounts for at least
        half the cycles and exceeds the DRAM time ``(dram_read + dram_write) /
        bus_bytes``; ``"memory"`` when the DRAM time does so; ``"overhead"`` when
        neither accounts for half the cycles (dispatch, latency, control, or no
        cycles measured at all).
        """
        if not peak_macs > 0 or not bus_bytes > 0:
            raise ValueError(f"peak_macs {peak_macs!r} and bus_bytes {bus_bytes!r} must be > 0")
        busy = (self.busy_load, self.busy_store, self.busy_array, self.busy_vector)
        if self.cycles > 0 and any(busy):
            return classify(self.cycles, vars(self)).kind
        compute = self.macs / peak_macs
        memory = (self.dram_read + self.dram_write) / bus_bytes
        if self.cycles <= 0 or max(compute, memory) < self.cycles / 2:
            return "overhead"
        return "compute" if compute >= memory else "memory"


class _Decayed:
    """A lazily decayed count: ``value`` as of inference ``t``."""

    __slots__ = ("value", "t")

    def __init__(self, value: float = 0.0, t: int = 0):
        self.value = value
        self.t = t


@dataclass
class _Unit:
    """Per-unit accumulators, all as of inference ``t`` (lazy decay)."""

    t: int = 0
    count: float = 0.0  # decayed runs
    runs: int = 0  # undecayed runs
    weight: float = 0.0  # decayed runs with a record
    sums: np.ndarray = field(default_factory=lambda: np.zeros(len(STAT_FIELDS)))


def _padded(sums) -> np.ndarray:
    """Saved per-unit sums as :data:`STAT_FIELDS` long (a state saved before the
    counters by cause has fewer; they read as not measured)."""
    out = np.zeros(len(STAT_FIELDS))
    out[:len(sums)] = sums
    return out


def _feature_keys(features: Mapping[str, Hashable] | None) -> list[FeatureKey]:
    """The condition tables one inference updates: the full feature tuple and each item."""
    if not features:
        return []
    items = sorted(features.items(), key=lambda kv: str(kv[0]))
    keys = [tuple(items)]
    if len(items) > 1:
        keys += [(item,) for item in items]
    return keys


def _feature_key(features: Mapping[str, Hashable]) -> FeatureKey:
    return tuple(sorted(features.items(), key=lambda kv: str(kv[0])))


def _tuplify(x):
    """Undo JSON's tuple-to-list conversion so restored feature values stay hashable."""
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


class Profiler:
    """Rolling, decayed statistics over the region traces of an inference stream.

    Parameters
    ----------
    config : the knobs (default :class:`ProfilerConfig()`).

    Members
    -------
    config : the knobs.
    inferences : number of inferences observed so far.
    """

    def __init__(self, config: ProfilerConfig | None = None):
        if config is None:
            config = ProfilerConfig()
        if not isinstance(config, ProfilerConfig):
            raise TypeError(f"config must be a ProfilerConfig, not {config!r}")
        self.config = config
        self.inferences = 0
        self._norm = _Decayed()  # decayed number of inferences
        self._recent: deque[tuple[int, ...]] = deque(maxlen=config.window)
        self._chains: dict[tuple[int, ...], _Decayed] = {}
        self._units: dict[int, _Unit] = {}
        # source -> successor -> decayed transition count; None keys the unconditioned table
        self._edges: dict[FeatureKey | None, dict[int, dict[int, _Decayed]]] = {None: {}}

    # -- decay helpers --------------------------------------------------------------

    @property
    def _now(self) -> int:
        """Index of the latest inference (the age-0 one)."""
        return self.inferences - 1

    def _value(self, entry: _Decayed) -> float:
        return entry.value * self.config.decay ** (self._now - entry.t)

    def _bump(self, entry: _Decayed, amount: float = 1.0):
        now = self._now
        entry.value = entry.value * self.config.decay ** (now - entry.t) + amount
        entry.t = now

    def _decayed_inferences(self) -> float:
        return self._value(self._norm) if self.inferences else 0.0

    # -- observation -----------------------------------------------------------------

    def observe(self, units: Sequence[int], records: Sequence[TraceRecord] | None = None,
                features: Mapping[str, Hashable] | None = None) -> None:
        """Record one inference's execution trace.

        Parameters
        ----------
        units : ids of the units (regions) that ran, in execution order; may be
            empty (an inference that ran nothing on the NPU still counts).
        records : the matching trace records (same length, ``records[i].region ==
            units[i]``), whose counters feed the per-unit means; None when not read.
        features : simple input features of this inference (e.g. ``{"branch": 2}``),
            which condition the edge statistics; values must be hashable.
        """
        trace = tuple(self._check_uid(u) for u in units)
        if records is not None:
            records = list(records)
            if len(records) != len(trace):
                raise ValueError(f"{len(records)} records for a trace of {len(trace)} units")
            for i, (uid, rec) in enumerate(zip(trace, records, strict=True)):
                if rec.region != uid:
                    raise ValueError(f"record {i} is for region {rec.region}, unit {uid} ran")
        cond_keys = _feature_keys(features)
        for key in cond_keys:
            hash(key)  # fail before any state changes on unhashable feature values

        self.inferences += 1
        self._bump(self._norm)
        self._recent.append(trace)

        for i, uid in enumerate(trace):
            self._bump_unit(uid, records[i] if records is not None else None)

        n = len(trace)
        chains = self._chains
        for i in range(n - 1):
            for j in range(i + 2, min(n, i + self.config.max_chain) + 1):
                chain = trace[i:j]
                entry = chains.get(chain)
                if entry is None:
                    entry = chains[chain] = _Decayed(0.0, self._now)
                self._bump(entry)

        for key in [None, *cond_keys]:
            table = self._edges.setdefault(key, {})
            for a, b in pairwise(trace):
                out = table.setdefault(a, {})
                entry = out.get(b)
                if entry is None:
                    entry = out[b] = _Decayed(0.0, self._now)
                self._bump(entry)

        if self.inferences % self.config.window == 0:
            self.prune()

    def observe_records(self, records: Sequence[TraceRecord],
                        features: Mapping[str, Hashable] | None = None) -> None:
        """Record one inference from its trace records alone (units = their regions)."""
        records = list(records)
        self.observe([r.region for r in records], records, features)

    @staticmethod
    def _check_uid(uid) -> int:
        if isinstance(uid, bool) or not isinstance(uid, Integral):
            raise TypeError(f"unit id must be an integer, not {uid!r}")
        return int(uid)

    def _bump_unit(self, uid: int, rec: TraceRecord | None):
        u = self._units.get(uid)
        if u is None:
            u = self._units[uid] = _Unit(t=self._now)
        scale = self.config.decay ** (self._now - u.t)
        if scale != 1.0:
            u.count *= scale
            u.weight *= scale
            u.sums *= scale
        u.t = self._now
        u.count += 1
        u.runs += 1
        if rec is not None:
            u.weight += 1
            u.sums += _record_values(rec)

    def prune(self) -> None:
        """Drop chains and edges whose decayed count is below ``min_count``.

        Runs by itself every ``window`` inferences; queries already ignore such
        entries, so calling it only frees memory.
        """
        limit = self.config.min_count
        for chain in [c for c, e in self._chains.items() if self._value(e) < limit]:
            del self._chains[chain]
        for key in list(self._edges):
            table = self._edges[key]
            for a in list(table):
                out = table[a]
                for b in [b for b, e in out.items() if self._value(e) < limit]:
                    del out[b]
                if not out:
                    del table[a]
            if key is not None and not table:
                del self._edges[key]

    def forget(self, unit_ids: Iterable[int]) -> None:
        """Drop every chain, edge and unit statistic that involves any of ``unit_ids``.

        Used when units are replaced (merged or split) and their ids stop
        appearing. :meth:`recent` keeps the raw traces as they were observed.
        """
        gone = {self._check_uid(u) for u in unit_ids}
        if not gone:
            return
        for chain in [c for c in self._chains if not gone.isdisjoint(c)]:
            del self._chains[chain]
        for uid in gone:
            self._units.pop(uid, None)
        for key in list(self._edges):
            table = self._edges[key]
            for a in list(table):
                if a in gone:
                    del table[a]
                    continue
                out = table[a]
                for b in gone & out.keys():
                    del out[b]
                if not out:
                    del table[a]
            if key is not None and not table:
                del self._edges[key]

    # -- queries ---------------------------------------------------------------------

    def recent(self) -> list[tuple[int, ...]]:
        """Return the last ``window`` traces, oldest first."""
        return list(self._recent)

    def chains(self, min_len: int = 2, threshold: float = 0.0) -> dict[tuple[int, ...], float]:
        """Return the decayed count of every chain at least ``min_len`` long.

        Chains whose count is below ``threshold`` or ``min_count`` are left out.
        """
        limit = max(threshold, self.config.min_count)
        out = {}
        for chain, entry in self._chains.items():
            if len(chain) >= min_len:
                value = self._value(entry)
                if value >= limit and value > 0:
                    out[chain] = value
        return out

    def chain_count(self, chain: Sequence[int]) -> float:
        """Return the decayed count of ``chain`` (0.0 when unseen or dropped)."""
        entry = self._chains.get(tuple(int(u) for u in chain))
        if entry is None:
            return 0.0
        value = self._value(entry)
        return value if value >= self.config.min_count else 0.0

    def chain_frequency(self, chain: Sequence[int]) -> float:
        """Return the decayed occurrences of ``chain`` per decayed inference."""
        norm = self._decayed_inferences()
        return self.chain_count(chain) / norm if norm else 0.0

    def units(self) -> list[int]:
        """Return the ids of every unit with statistics, sorted."""
        return sorted(self._units)

    def unit_frequency(self, uid: int) -> float:
        """Return the decayed runs of unit ``uid`` per decayed inference (0.0 when unseen)."""
        u = self._units.get(int(uid))
        norm = self._decayed_inferences()
        if u is None or not norm:
            return 0.0
        return u.count * self.config.decay ** (self._now - u.t) / norm

    def unit_stats(self, uid: int) -> UnitStats:
        """Return what is known about unit ``uid``; ``KeyError`` when never seen."""
        uid = int(uid)
        u = self._units.get(uid)
        if u is None:
            raise KeyError(f"unit {uid} was never observed (or was forgotten)")
        scale = self.config.decay ** (self._now - u.t)
        means = u.sums / u.weight if u.weight > 0 else np.zeros(len(STAT_FIELDS))
        return UnitStats(uid, self.unit_frequency(uid), u.runs, u.weight * scale,
                         *(float(m) for m in means))

    def _edge_table(self, a: int, features: Mapping[str, Hashable] | None
                    ) -> dict[int, float]:
        """Decayed successor counts of ``a`` under ``features`` (falls back to none)."""
        out = None
        if features:
            out = self._edges.get(_feature_key(features), {}).get(a)
            if out is not None:
                counts = self._live(out)
                if counts:
                    return counts
        out = self._edges[None].get(a)
        return self._live(out) if out is not None else {}

    def _live(self, out: dict[int, _Decayed]) -> dict[int, float]:
        limit = self.config.min_count
        counts = {b: self._value(e) for b, e in out.items()}
        return {b: v for b, v in counts.items() if v >= limit and v > 0}

    def successors(self, a: int, features: Mapping[str, Hashable] | None = None
                   ) -> list[tuple[int, float]]:
        """Return ``(unit, probability)`` of the units seen right after ``a``.

        Sorted by decreasing probability (ties by unit id); the probabilities sum
        to 1 unless ``a`` was never followed by anything. With ``features``, the
        statistics of inferences with exactly those features are used (a single
        feature ``{name: value}`` matches every inference that had it), falling
        back to the unconditioned ones when no transition out of ``a`` was seen
        under that condition.
        """
        counts = self._edge_table(int(a), features)
        total = sum(counts.values())
        if not total:
            return []
        return sorted(((b, v / total) for b, v in counts.items()), key=lambda bp: (-bp[1], bp[0]))

    def edge_probability(self, a: int, b: int,
                         features: Mapping[str, Hashable] | None = None) -> float:
        """Return the probability that unit ``b`` runs right after unit ``a``.

        Conditioning on ``features`` works as in :meth:`successors`.
        """
        counts = self._edge_table(int(a), features)
        total = sum(counts.values())
        return counts.get(int(b), 0.0) / total if total else 0.0

    def edges(self) -> dict[tuple[int, int], float]:
        """Return the observed dependency graph: ``(a, b) -> P(b runs right after a)``."""
        return {(a, b): p for a in sorted(self._edges[None]) for b, p in self.successors(a)}

    # -- reports and persistence ------------------------------------------------------

    def snapshot(self, top: int = 20) -> dict:
        """Return a JSON-serializable summary for reports.

        Keys: ``inferences``, ``decayed_inferences``, ``chains`` (the ``top``
        chains by count: ``chain``, ``count``, ``frequency``), ``units`` (``uid``,
        ``frequency``, ``runs``), ``edges`` (``src``, ``dst``, ``p``).
        """
        norm = self._decayed_inferences()
        ranked = sorted(self.chains().items(), key=lambda cv: (-cv[1], cv[0]))[:top]
        return {
            "inferences": self.inferences,
            "decayed_inferences": norm,
            "chains": [{"chain": list(c), "count": v, "frequency": v / norm if norm else 0.0}
                       for c, v in ranked],
            "units": [{"uid": uid, "frequency": self.unit_frequency(uid),
                       "runs": self._units[uid].runs} for uid in self.units()],
            "edges": [{"src": a, "dst": b, "p": p} for (a, b), p in self.edges().items()],
        }

    def to_dict(self) -> dict:
        """Return the full state as plain data (JSON-serializable when feature values are).

        :meth:`from_dict` restores a profiler that answers every query identically.
        """
        def decayed(e: _Decayed):
            return [e.value, e.t]

        return {
            "version": 1,
            "config": {"window": self.config.window, "decay": self.config.decay,
                       "max_chain": self.config.max_chain, "min_count": self.config.min_count},
            "inferences": self.inferences,
            "norm": decayed(self._norm),
            "recent": [list(t) for t in self._recent],
            "chains": [[list(c), *decayed(e)] for c, e in self._chains.items()],
            "units": [[uid, u.t, u.count, u.runs, u.weight, u.sums.tolist()]
                      for uid, u in self._units.items()],
            "edges": [[None if key is None else [list(kv) for kv in key],
                       [[a, b, *decayed(e)] for a, out in table.items() for b, e in out.items()]]
                      for key, table in self._edges.items()],
        }

    @classmethod
    def from_dict(cls, state: Mapping) -> Profiler:
        """Rebuild a profiler from :meth:`to_dict` output."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported profiler state version {state.get('version')!r}")
        prof = cls(ProfilerConfig(**state["config"]))
        prof.inferences = int(state["inferences"])
        prof._norm = _Decayed(*state["norm"])
        prof._recent.extend(tuple(t) for t in state["recent"])
        prof._chains = {tuple(c): _Decayed(v, t) for c, v, t in state["chains"]}
        prof._units = {int(uid): _Unit(t=t, count=count, runs=runs, weight=weight,
                                       sums=_padded(sums))
                       for uid, t, count, runs, weight, sums in state["units"]}
        prof._edges = {None: {}}
        for key, rows in state["edges"]:
            if key is not None:
                key = tuple((name, _tuplify(value)) for name, value in key)
            table = prof._edges.setdefault(key, {})
            for a, b, v, t in rows:
                table.setdefault(a, {})[b] = _Decayed(v, t)
        return prof
