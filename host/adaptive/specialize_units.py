"""Counter-driven specialization: each hot unit tries the variants that address
what its counters say bounds it, keeps what measures faster, reverts the rest.

The adaptive runtime (:mod:`.engine`) asks :meth:`Specializer.decide` for a plan
change when fusion has nothing to do. The specializer

1. picks the hottest unit that still has trials left (share of the measured
   cycles of an inference at least ``hot_share``; a unit's warm runs only);
2. classifies its bottleneck from the cause counters of its region records
   (:func:`.bottleneck.classify`);
3. draws the variants of its library (:func:`host.compiler.variants.candidates`)
   whose knobs address that bottleneck (:data:`KNOBS`), ranks them by the cost
   model's prediction, and plans the best one not tried yet (event
   ``specialize-planned unit 7: memory-bound (load 82%, array 31%) -> extra
   bands 1``); the change compiles, lands and is validated in shadow like a merge;
4. after ``measure_runs`` warm runs on the variant, keeps it when the unit
   measured faster than on the variant before (``specialize-kept``), and
   otherwise plans the way back (``specialize-reverted``);
5. remembers every measurement per unit signature x hardware profile
   (:class:`Outcomes`): a later run starts with the best variant measured
   (exploit) and tries only what was never measured (explore), within a budget
   of ``tries`` variants per unit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ..compiler.cost import CostModel
from ..compiler.plan import CompileError
from ..compiler.variants import (
    DEFAULT,
    Variant,
    candidates,
    predicted_cycles,
    unit_code,
)
from .bottleneck import CAUSE_FIELDS, Bottleneck, classify

KNOBS = {
    # Deeper or coarser prefetch, or a streaming way that overlaps the DMA.
    "memory": ("step_bytes", "block_outputs", "extra_bands", "m_tiles", "way"),
    # Another tiling of the array's work.
    "compute": ("m_tiles", "way", "extra_bands"),
    # Fewer, larger tiles and steps.
    "overhead": ("m_tiles", "step_bytes", "way", "extra_bands"),
    # Another layout of the scratchpad traffic.
    "conflict": ("way", "extra_bands"),
}
"""The knobs a variant may set to address each bottleneck class."""


def variants_key(variants: dict) -> str:
    """The compile cache's specialization string of a plan's unit variants."""
    return "variants " + "; ".join(f"{'|'.join(k)}: {v.describe()}"
                                   for k, v in sorted(variants.items()))


def compile_variants(cache, graph, plan, config, variants: dict):
    """``plan`` with ``variants``, linked from ``cache``'s compiled units (lowered in
    place when the linked program outgrows the bank), as the runtime compiles plans."""
    from ..compiler.compile import ProgramTooLong, compile_model

    try:
        return compile_model(graph, config, plan, simplified=True,
                             unit_store=cache.unit_store(config), variants=variants)
    except ProgramTooLong:
        return compile_model(graph, config, plan, simplified=True, variants=variants)


def addresses(kind: str, v: Variant) -> bool:
    """Whether variant ``v`` turns only knobs that address a ``kind``-bound unit
    (streaming its weights adds DRAM traffic: the offline search alone tries it)."""
    names = [k for k, _ in v.key()]
    return bool(names) and all(k in KNOBS[kind] for k in names)


@dataclass
class Trial:
    """A variant on trial for a unit.

    Members
    -------
    key : the unit's node names.
    variant, previous : the variant tried, and the one before it.
    bottleneck : what the counters said before.
    before : the unit's mean warm cycles and cause counts before.
    after : its warm runs on the variant: (cycles, cause counts) each.
    """

    key: tuple
    variant: Variant
    previous: Variant
    bottleneck: Bottleneck
    before: tuple[float, dict]
    after: list = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict:
        mean = self.mean_after()
        return {"unit": list(self.key), "variant": self.variant.describe(),
                "previous": self.previous.describe(), "bottleneck": self.bottleneck.kind,
                "cycles_before": self.before[0], "counters_before": self.before[1],
                "cycles_after": mean[0] if mean else None,
                "counters_after": mean[1] if mean else None, "verdict": self.verdict}

    def mean_after(self) -> tuple[float, dict] | None:
        if not self.after:
            return None
        return (float(np.mean([c for c, _ in self.after])),
                {f: float(np.mean([d[f] for _, d in self.after])) for f in CAUSE_FIELDS})


class Outcomes:
    """Measured cycles per (unit signature, measured profile, variant), kept in the
    compile cache's file (:meth:`~.cache.CompileCache.measured`: its read-only,
    fork and held-write handling apply; an in-memory cache keeps them for the run)."""

    def __init__(self, cache):
        self.cache = cache
        self._lock = threading.Lock()
        # What this run measured: a fresh cache (``--fresh``) reads nothing back, not
        # even its own rows, and each put rewrites the whole row.
        self._ours: dict[tuple[str, str], dict[str, float]] = {}

    def get(self, unit: str, profile: str) -> dict[str, float]:
        """Variant (as :meth:`Variant.describe` says it) -> measured cycles."""
        return {**self.cache.measured(unit, profile), **self._ours.get((unit, profile), {})}

    def put(self, unit: str, profile: str, variant: Variant, cycles: float) -> None:
        with self._lock:
            self._ours.setdefault((unit, profile), {})[variant.describe()] = cycles
            self.cache.put_measured(unit, profile, self.get(unit, profile))


@dataclass
class SpecializeConfig:
    """The specializer's knobs.

    Members
    -------
    hot_share : a unit is hot from this share of an inference's measured cycles.
    tries : variants tried on the NPU per unit (the exploration budget).
    measure_runs : warm runs on a variant before the verdict.
    min_gain : a variant is kept when it saves at least this share of the unit's cycles.
    """

    hot_share: float = 0.02
    tries: int = 3
    measure_runs: int = 3
    min_gain: float = 0.0005


def _profile(rt) -> str:
    return rt.measured_key


class Specializer:
    """Plans variant trials and verdicts for an :class:`~.engine.AdaptiveRuntime`."""

    def __init__(self, config: SpecializeConfig | None = None, outcomes: Outcomes | None = None):
        self.config = config or SpecializeConfig()
        if outcomes is None:
            from .cache import CompileCache

            outcomes = Outcomes(CompileCache(None))
        self.outcomes = outcomes
        self.trial: Trial | None = None  # the variant on trial (planned, landed, measured)
        self.trials: list[Trial] = []
        self.tried: dict[tuple, set] = {}  # unit key -> variants tried
        self.exhausted: set[tuple] = set()  # unit keys with nothing left to try
        self.samples: dict[int, list] = {}  # region -> recent warm (cycles, causes)

    # ---- observing ---------------------------------------------------------------------
    def observe(self, trace, model, current) -> None:
        """Take the region records of an inference that ran on ``model`` (warm runs
        only: cold ones load weights); ``current`` is the plan now (a run that
        landed a change ran on the plan before it: its records describe that)."""
        variants = getattr(model, "variants", {})
        for rec in trace:
            if rec.tag_misses:
                continue
            causes = {f: float(getattr(rec, f)) for f in CAUSE_FIELDS}
            if model is current:
                recent = self.samples.setdefault(rec.region, [])
                recent.append((float(rec.cycles), causes))
                del recent[:-8]
            t = self.trial
            unit = model.regions.get(rec.region)
            if t is not None and unit is not None and tuple(unit.nodes) == t.key \
                    and variants.get(t.key, DEFAULT) == t.variant and not t.verdict:
                t.after.append((float(rec.cycles), causes))

    def forget(self) -> None:
        """The plan changed: earlier records describe other code."""
        self.samples.clear()

    def rolled_back(self) -> None:
        """The variant on trial failed its shadow validation: never tried again."""
        if self.trial is not None and not self.trial.verdict:
            self.trial.verdict = "rolled back"

    # ---- deciding ----------------------------------------------------------------------
    def decide(self, rt) -> tuple[Variant, tuple, str, str] | None:
        """The next change for runtime ``rt``: ``(variant, unit key, event, reason)``
        or None. Called only when no plan change is under way."""
        t = self.trial
        if t is not None and not t.verdict:
            if len(t.after) < self.config.measure_runs:
                return None
            return self._verdict(rt, t)
        self.trial = None
        return self._explore(rt)

    def _verdict(self, rt, t: Trial):
        cycles, _ = t.mean_after()
        sig = self._signature(rt, t.key)
        self.outcomes.put(sig, _profile(rt), t.variant, cycles)
        self.outcomes.put(sig, _profile(rt), t.previous, t.before[0])
        saved = 1 - cycles / max(t.before[0], 1.0)
        detail = (f"unit {self._uid(rt, t.key)}: {t.variant.describe()} measured "
                  f"{cycles:.0f} cycles, {t.previous.describe()} {t.before[0]:.0f}")
        if saved >= self.config.min_gain:
            t.verdict = "kept"
            rt.log.emit("specialize-kept", (self._uid(rt, t.key),), detail)
            return None
        t.verdict = "reverted"
        return t.previous, t.key, "specialize-reverted", detail

    def _explore(self, rt):
        for uid, share in self._hot(rt):
            unit = rt.model.regions[uid]
            key = tuple(unit.nodes)
            tried = self.tried.setdefault(key, set())  # tried, refused or no change
            current = rt.variants.get(key, DEFAULT)
            tried.add(current)
            trials = sum(1 for t in self.trials if t.key == key)
            if trials >= self.config.tries or key in self.exhausted:
                continue
            recent = self.samples.get(uid, [])
            cycles = float(np.mean([c for c, _ in recent]))
            causes = {f: float(np.mean([d[f] for _, d in recent])) for f in CAUSE_FIELDS}
            neck = classify(cycles, causes)
            pick = self._pick(rt, key, neck, tried, current)
            if pick is None:
                self.exhausted.add(key)
                continue
            variant, why = pick
            tried.add(variant)
            self.trial = Trial(key, variant, current, neck, (cycles, causes))
            self.trials.append(self.trial)
            reason = (f"unit {uid}: {neck.describe()}, {100 * share:.0f}% of the cycles "
                      f"-> {variant.describe()} ({why})")
            return variant, key, "specialize-planned", reason
        return None

    def _pick(self, rt, key, neck: Bottleneck, tried: set, current: Variant):
        """The variant to try: the best measured on this profile before (exploit),
        else among the untried ones that address ``neck`` (or, when none of those
        applies to this unit, the library's other knobs but residency) the one
        the cost model ranks first, and on every second trial of a unit the one
        it ranks last (the cost model's ranking is what measurement checks: a
        knob it misjudges shows at either end)."""
        measured = self.outcomes.get(self._signature(rt, key), _profile(rt))
        if measured:
            best = min(measured, key=measured.get)
            v = Variant.parse(best)
            here = measured.get(current.describe())
            if v not in tried and (here is None or measured[best] < here):
                return v, f"measured {measured[best]:.0f} cycles in an earlier run"
        library = [v for v in candidates(rt.model.graph, list(key))
                   if v not in tried and measured.get(v.describe()) is None]
        ranked = self._ranked(rt, key, [v for v in library if addresses(neck.kind, v)],
                              tried)
        why = ""
        if not ranked:
            ranked = self._ranked(rt, key, [v for v in library if not v.stream_weights],
                                  tried)
            why = f"no {neck.kind} knob applies, "
        if not ranked:
            return None
        ranked.sort(key=lambda p: p[0])
        trials = sum(1 for t in self.trials if t.key == key)
        predicted, v = ranked[-1] if trials % 2 else ranked[0]
        return v, f"{why}predicted {predicted:.0f} cycles"

    def _ranked(self, rt, key, options, tried: set) -> list[tuple[float, Variant]]:
        """(predicted cycles, variant) of the ``options`` that compile and change
        the unit's code (the others join ``tried``). Each compiles only the unit it
        changes: the others come linked from the runtime's cache, as it runs them."""
        cost = CostModel(rt.hw)
        ranked = []
        plan = [list(u.nodes) for u in rt.model.units]

        def compiled(variants):
            return compile_variants(rt.cache, rt.model.graph, plan, rt.hw, variants)

        now = unit_code(compiled(rt.variants), key)
        for v in options:
            try:
                m = compiled({**rt.variants, key: v})
            except CompileError:
                tried.add(v)
                continue
            if unit_code(m, key) == now:  # the knob changes nothing here
                tried.add(v)
                continue
            sub = next(s for s in m.units if tuple(s.nodes) == key)
            ranked.append((predicted_cycles(sub.resources, cost), v))
        return ranked

    def _hot(self, rt) -> list[tuple[int, float]]:
        """Units of the plan with warm records, hottest first, with their share."""
        means = {uid: float(np.mean([c for c, _ in s])) for uid, s in self.samples.items()
                 if s and uid in rt.model.regions}
        total = sum(means.values())
        hot = [(uid, c / total) for uid, c in means.items()
               if total and c / total >= self.config.hot_share]
        return sorted(hot, key=lambda p: -p[1])

    @staticmethod
    def _uid(rt, key) -> int:
        return next((u.id for u in rt.model.units if tuple(u.nodes) == key), 0)

    @staticmethod
    def _signature(rt, key) -> str:
        from .cache import unit_signature

        return unit_signature(rt.model.graph, list(key))

    def report(self) -> list[dict]:
        return [t.as_dict() for t in self.trials]
