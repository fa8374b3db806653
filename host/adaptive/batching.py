"""Serving batches: the specializer's batch variants inside the adaptive loop.

``AdaptiveRuntime.run_batch`` hands each batch to its :class:`BatchServer`, which
profiles the batch sizes it is asked to serve. Once a size has come
``specialize_after`` times it builds a variant for it, through the compile cache:

* a **batch variant** (:mod:`.specialize`) when every operator treats inputs as
  independent rows: the whole plan with ``B`` rows per GEMM;
* a **routed batch variant** (:mod:`.routed`) for a gated model: the gate and
  the branches of a bet, for ``B`` rows, finished per input on the host. The bet
  is the smallest set of branches that covered ``route_cover`` of the inputs seen
  (all branches before anything is known); an input routed outside it is a
  mis-speculation and runs alone on the generic plan. When the routes shift, the
  bet is re-placed.

Each variant carries a guard (count and shapes of the inputs); a failure runs the
inputs one by one on the generic plan. Its first ``validate_runs`` batches are
checked input by input against the reference (always, with ``check``); a
mismatch drops it. A variant the compile cache served is trusted no more: on a
mismatch its entry is evicted, and the next batch of its size compiles it anew.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from firmware.config import NPUConfig

from ..compiler import CompiledModel, CompileError
from ..ir import Graph, Subgraph
from ..reference import run_reference
from .cache import CompileCache
from .profiler import Profiler
from .records import AdaptiveInference, StreamLog, mismatch
from .resident import ResidentProgram
from .routed import RoutedVariant, branch_leaves, routed_variant
from .specialize import BatchVariant, SpecializationError, batch_graph

if TYPE_CHECKING:
    from .engine import AdaptiveConfig


class GenericPlan(Protocol):
    """What batch serving needs from the runtime's generic plan (one input per run)."""

    @property
    def model(self) -> CompiledModel:
        """The plan the NPU runs single inferences on now."""

    def run(self, inputs: dict) -> AdaptiveInference:
        """Serve one input on it (counted, checked and profiled like any other)."""

    def changing(self) -> bool:
        """Whether a compiled plan change waits to land, or a landed one is in
        validation (both happen only on runs of the generic plan)."""


class BatchServer:
    """Serves batches for the adaptive runtime (see the module text).

    Parameters
    ----------
    config : the runtime's knobs (:class:`~.engine.AdaptiveConfig`).
    graph : the simplified model (what the reference checks, what routes).
    hw, cache : the NPU's configuration and the compile cache variants go through.
    generic : the runtime's generic plan.
    resident : the switch between the generic plan and a variant on the NPU.
    profiler : takes a batch variant's trace.
    log : the stream's counts and events, shared with the runtime.
    """

    def __init__(self, config: AdaptiveConfig, graph: Graph, hw: NPUConfig, cache: CompileCache,
                 generic: GenericPlan, resident: ResidentProgram, profiler: Profiler,
                 log: StreamLog):
        self.config, self.graph, self.hw, self.cache = config, graph, hw, cache
        self.generic, self.resident = generic, resident
        self.profiler, self.log = profiler, log
        self.sizes: dict[int, int] = {}  # input profiling: batch sizes asked for
        # batch size -> its variant, or None (refused)
        self.variants: dict[int, BatchVariant | RoutedVariant | None] = {}
        self.routes: dict[tuple, float] = {}  # branch path -> decayed count (routed)
        self._checks_left: dict[int, int] = {}
        # batch size -> the cache key (graph, units, specialization) its variant was
        # served from, when it was a cache hit
        self._served: dict[int, tuple[Graph, list[Subgraph], str]] = {}

    def use(self, variant: BatchVariant | RoutedVariant) -> None:
        """Serve batches of its size with ``variant`` from now on, trusted (no
        validation runs): what a benchmark's fixed choice does."""
        self.variants[variant.batch] = variant
        self._checks_left[variant.batch] = 0
        self._served.pop(variant.batch, None)  # not the cache's: never evicted

    def report(self) -> dict:
        """The batch sizes asked for and the variant each has (JSON-ready)."""
        return {
            "batch_sizes": {str(b): n for b, n in sorted(self.sizes.items())},
            "batch_variants": {str(b): "refused" if v is None else f"{v.name}, "
                               f"{len(v.model.program)} instructions"
                               for b, v in sorted(self.variants.items())},
        }

    def run(self, inputs_list: list[dict]) -> list[AdaptiveInference]:
        """Serve several inferences at once (see the module text)."""
        B = len(inputs_list)
        self.sizes[B] = self.sizes.get(B, 0) + 1
        self.log.begin_call()
        if B > 1 and B not in self.variants and \
                self.sizes[B] >= self.config.specialize_after:
            self._specialize(B)
        v = self.variants.get(B)
        if isinstance(v, BatchVariant) and v.plan:  # a batch variant of the generic plan
            if self.generic.changing():
                # A compiled plan change lands, and is validated in shadow, on runs
                # of the generic plan; served by the variant, it would wait forever.
                return self._singly(inputs_list)
            if v.plan != self._plan_ids():
                self._specialize(B, f"the plan is now {list(self._plan_ids())}")
                v = self.variants.get(B)
        if v is not None:
            why = v.guard_failure(inputs_list)
            if why:
                self.log.emit("guard-failed", (), f"{v.name}: {why}; running the generic "
                              "plan")
                v = None
        if v is None:
            return self._singly(inputs_list)
        if isinstance(v, RoutedVariant):
            return self._run_routed(v, inputs_list)
        return self._run_variant(v, inputs_list)

    def _singly(self, inputs_list) -> list[AdaptiveInference]:
        return [self.generic.run(x) for x in inputs_list]

    def _plan_ids(self) -> tuple[int, ...]:
        return tuple(u.id for u in self.generic.model.units)

    # ---- building variants -----------------------------------------------------------
    def _specialize(self, B: int, why: str = "") -> None:
        """Build the batch-B variant of the current plan (``why``: a rebuild's reason)."""
        plan = self.generic.model
        try:
            bg = batch_graph(plan.graph, B)
        except SpecializationError as e:
            if branch_leaves(self.graph):
                self._place_bet(B, self._cover_set(), "first bet: every branch")
            else:
                self.variants[B] = None
                self.log.emit("specialize-refused", (), f"batch{B}: {e}")
            return
        units, spec = [Subgraph(u.id, list(u.nodes)) for u in plan.units], f"batch{B}"
        try:
            model, hit = self.cache.get_or_compile(bg, units, self.hw, specialization=spec)
        except CompileError as e:
            self.variants[B] = None
            self.log.emit("specialize-refused", (), f"batch{B}: {e}")
            return
        self._remember(B, hit, bg, units, spec)
        self.variants[B] = BatchVariant(model, B, plan.graph, self._plan_ids())
        self._checks_left[B] = self.config.validate_runs
        self.log.emit("specialized", tuple(u.id for u in model.units),
                      f"batch{B} ({'cache hit' if hit else 'compiled'}): {B} inputs per run, "
                      f"{len(model.program)} instructions" + (f"; rebuilt: {why}" if why else ""))

    def _remember(self, B: int, hit: bool, graph: Graph, units: list[Subgraph],
                  spec: str) -> None:
        """Note where the batch-``B`` variant came from (a cache hit: its key)."""
        if hit:
            self._served[B] = (graph, units, spec)
        else:
            self._served.pop(B, None)

    def _cover_set(self) -> list:
        """The fewest branches that took ``route_cover`` of the routed inputs seen
        (every branch when nothing has been seen)."""
        everything = branch_leaves(self.graph)
        total = sum(self.routes.values())
        if total <= 0:
            return everything
        by_path = {lf.path: lf for lf in everything}
        chosen, covered = [], 0.0
        for path, count in sorted(self.routes.items(), key=lambda kv: -kv[1]):
            if path in by_path:
                chosen.append(by_path[path])
                covered += count
            if covered >= self.config.route_cover * total:
                break
        return sorted(chosen, key=everything.index) or everything

    def _place_bet(self, B: int, bet: list, reason: str) -> None:
        hits = []
        spec = f"route{B}:" + ";".join(lf.describe() for lf in bet)

        def compile_fn(g, units):
            # (the batched graph differs per bet too)
            model, hit = self.cache.get_or_compile(g, units, self.hw, specialization=spec)
            hits.append(hit)
            self._remember(B, hit, g, units, spec)
            return model

        try:
            v = routed_variant(self.graph, self.hw, bet, B, compile_fn)
        except CompileError as e:
            self.variants[B] = None
            self.log.emit("specialize-refused", (), f"route{B}: {e}")
            return
        self.variants[B] = v
        self._checks_left[B] = self.config.validate_runs
        how = "cache hit" if hits[-1] else "compiled"
        self.log.emit("specialized", (), f"{v.name} ({how}): {reason}; "
                      f"{len(v.model.program)} instructions")

    # ---- running them ------------------------------------------------------------------
    def _check_rows(self, v, outs, inputs_list) -> bool | None:
        """Compare answered rows with the reference: True (checked), False (not
        asked to), None (a mismatch: the variant is dropped)."""
        B = v.batch
        left = self._checks_left.get(B, 0)
        if not (left or self.config.check):
            return False
        for o, x in zip(outs, inputs_list, strict=True):
            bad = None if o is None else mismatch(o, run_reference(self.graph, x))
            if bad:
                self.log.rollbacks += 1
                self.log.emit("rollback", (), f"{v.name} failed validation: {bad}")
                self._drop(B, bad)
                return None
        if left:
            self._checks_left[B] = left - 1
            if left == 1:
                self.log.emit("specialize-validated", (), f"{v.name}: "
                              f"{self.config.validate_runs} batches equal the reference")
        return True

    def _drop(self, B: int, why: str) -> None:
        """Drop the batch-``B`` variant after a mismatch: refused from now on when it
        was compiled here; evicted from the cache, and compiled anew by the next
        batch of its size, when the cache served it."""
        served = self._served.pop(B, None)
        if served is None:
            self.variants[B] = None
            return
        graph, units, spec = served
        self.cache.evict(graph, units, self.hw, specialization=spec)
        del self.variants[B]
        self.log.emit("cache-evicted", (), f"{spec}: the stored program differs from the "
                      f"reference ({why}): recompiled at the next batch of {B}")

    def _run_variant(self, v: BatchVariant, inputs_list) -> list[AdaptiveInference]:
        t0 = time.perf_counter()
        res = self.resident.to_variant(v.model).run(v.stack(inputs_list))
        outs = v.unstack(res.outputs)
        checked = self._check_rows(v, outs, inputs_list)
        if checked is None:
            return self._singly(inputs_list)
        self.profiler.observe([r.region for r in res.trace], res.trace)
        records = self._batch_records(v, res, outs, checked, t0)
        self.log.inferences += v.batch
        return records

    def _run_routed(self, v: RoutedVariant, inputs_list) -> list[AdaptiveInference]:
        t0 = time.perf_counter()
        B = v.batch
        res = self.resident.to_variant(v.model).run(v.stack(inputs_list))
        rows = v.finish(res.outputs, inputs_list)
        outs = [o for o, _ in rows]
        checked = self._check_rows(v, outs, inputs_list)
        if checked is None:
            return self._singly(inputs_list)
        d = self.config.route_decay
        self.routes = {k: c * d ** B for k, c in self.routes.items()}
        for _, path in rows:
            self.routes[path] = self.routes.get(path, 0.0) + 1.0
        misses = [i for i, o in enumerate(outs) if o is None]
        self.log.bets += B
        self.log.misspeculations += len(misses)
        first = self.log.inferences
        records = self._batch_records(v, res, outs, checked, t0)
        # A miss runs alone on the generic plan (its share of the batch was wasted).
        for i in misses:
            alone = self.generic.run(inputs_list[i])
            r = records[i]
            r.outputs, r.checked = alone.outputs, alone.checked
            r.cycles += alone.cycles
            r.speculation = "miss"
            r.events += alone.events
        self.log.inferences = first + B  # (each miss's run counted itself)
        for i, r in enumerate(records):
            r.speculation = r.speculation or "hit"
            r.index = first + i + 1
        self._rebet(v, misses)
        return records

    def _rebet(self, v: RoutedVariant, misses: list[int]) -> None:
        """Re-place the bet when the routes moved away from it."""
        B = v.batch
        if not self.config.rebet:
            return
        if misses and len(misses) > (1 - self.config.route_cover) * B * 2:
            bet = self._cover_set()
            if [lf.path for lf in bet] != [lf.path for lf in v.bet]:
                self._place_bet(B, bet, f"{len(misses)}/{B} inputs of the last batch missed "
                                "the bet")
        elif len(v.bet) > 1:
            bet = self._cover_set()
            if len(bet) < len(v.bet):
                self._place_bet(B, bet, f"{len(bet)} branches took "
                                f"{100 * self.config.route_cover:.0f}% of the inputs")

    def _batch_records(self, v, res, outs, checked, t0) -> list[AdaptiveInference]:
        B = v.batch
        host = (time.perf_counter() - t0) / B
        # Each inference carries its share of the run's cycles and counters.
        share = {k: c // B if isinstance(c, int) else [x // B for x in c]
                 for k, c in res.counters.items()}
        return [AdaptiveInference(o, res.cycles // B, dict(share), res.trace, bool(checked),
                                  index=self.log.inferences + i + 1, plan=(v.name,),
                                  model=v.model,
                                  events=list(self.log.fresh) if i == 0 else [],
                                  host_seconds=host)
                for i, o in enumerate(outs)]
