"""The adaptive runtime: serve inferences while re-planning the program underneath.

Each inference runs on the current plan (a :class:`~host.runtime.Session`). After
it, the region trace feeds the :class:`~.profiler.Profiler` (which units ran, in
which order, at what cost) and the cost model (predicted vs measured cycles per
region). Every few inferences the runtime decides:

1. a merged unit that went cold is split back into its parts (de-fusion);
2. otherwise the best fusion candidate (a frequent chain, scored by the DRAM
   traffic and region boundaries it removes, see :mod:`.fusion`) is merged.

The new plan is compiled off the inference path (a worker thread, or inline with
``async_compile=False``), through the :class:`~.cache.CompileCache`, so a plan
seen before (in this or an earlier process) costs no compile. When it is ready it
is staged into the shadow instruction bank *while the NPU runs* an inference and
lands at the run boundary after it; the bank version is read back to confirm.

A new plan is not trusted at once: its first ``validate_runs`` inferences are
compared with the reference interpreter. A mismatch swaps the previous plan back
in, quarantines the unit with the reason, and re-runs the inference on the
restored plan, so the caller still gets the correct result.

A plan change goes through the states of :mod:`.changes` (serving, compiling,
ready, staged, validating), one change at a time. Batches go to the runtime's
:class:`~.batching.BatchServer`; the stream's counts and events are one
:class:`~.records.StreamLog`, written by both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from firmware.bursts import DramLatency

from ..compiler import CompiledModel
from ..compiler.cost import CostModel
from ..compiler.plan import CompileError, initial_units, simplify
from ..driver import NPUDriver
from ..ir import Graph, Subgraph
from ..reference import run_reference
from ..runtime import Inference, MismatchError, Session, run_each
from .batching import BatchServer
from .cache import CompileCache
from .changes import ChangeKind, PlanChange, PlanChanges, PlanState, Validation
from .fusion import Candidate, refusal, score_chain
from .profiler import Profiler, ProfilerConfig
from .records import AdaptiveInference, RuntimeEvent, StreamLog, mismatch
from .resident import ResidentProgram
from .sparsity import SparseServer, SparsityConfig
from .specialize_units import (
    Outcomes,
    SpecializeConfig,
    Specializer,
    compile_variants,
    variants_key,
)
from .speculate import Bet, SpecCandidate, Speculation, gate_unit, hoist, leaves
from .timeline import attach_timeline
from .units import ACTIVE, MERGED, SPECULATIVE, Unit, UnitGraph

COST_SAMPLES = 512  # measured regions the cost model refits on (most recent)


@dataclass
class AdaptiveConfig:
    """The knobs of the adaptive loop (docs/runtime.md explains each).

    Members
    -------
    fuse_threshold : a chain must run at least this often per inference (decayed
        profiler frequency) to be a fusion candidate.
    defuse_threshold : an active merged unit running less often than this splits.
    min_score : estimated cycles saved per inference below which no merge is made.
    warmup : inferences observed before the first decision.
    decide_every : inferences between decisions.
    settle : inferences a merged unit runs before it may be split again.
    validate_runs : inferences of a new plan checked against the reference.
    spec_threshold : the branch probability a speculative merge needs to be
        planned (raised by ``spec_step`` each time a bet stops paying).
    spec_step : how much a failed bet raises ``spec_threshold``.
    specialize_after : batches of one size seen before a batch variant is built.
    route_cover : a routed batch variant bets on the fewest branches that took
        this share of the inputs.
    route_decay : per-input decay of the observed routes (faster than the
        profiler's: a routed bet should follow a shift within a few batches).
    rebet : re-place a routed bet when the routes move (False keeps the variant
        it has: what a static plan does).
    specialize : when fusion has nothing to do, try variants of the hot units
        chosen by their counters (:mod:`.specialize_units`; None: never).
    sparsity : skip GEMM input elements that the profile shows zero, on inputs
        whose guard holds (:mod:`.sparsity`; None: never).
    start_fused : begin on the compiler's fused plan (what ``npu run`` runs without
        ``--adaptive``) instead of one unit per layer.
    async_compile : compile in a worker thread (False: inline, deterministic).
    check : compare every inference with the reference interpreter (a mismatch
        outside validation raises :class:`~host.runtime.MismatchError`).
    profiler : window, decay and chain length of the profiler.
    """

    fuse_threshold: float = 0.3
    defuse_threshold: float = 0.1
    min_score: float = 1.0
    warmup: int = 6
    decide_every: int = 2
    settle: int = 12
    validate_runs: int = 3
    specialize_after: int = 2
    route_cover: float = 0.95
    route_decay: float = 0.85
    rebet: bool = True
    spec_threshold: float = 0.6
    spec_step: float = 0.1
    specialize: SpecializeConfig | None = None
    sparsity: SparsityConfig | None = None
    start_fused: bool = False
    async_compile: bool = True
    check: bool = True
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self):
        for name in ("fuse_threshold", "defuse_threshold", "min_score"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.defuse_threshold >= self.fuse_threshold > 0:
            raise ValueError("defuse_threshold must be below fuse_threshold (or units "
                             "would merge and split back and forth)")
        for name in ("warmup", "validate_runs", "settle"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.decide_every < 1:
            raise ValueError("decide_every must be >= 1")


class AdaptiveRuntime:
    """A model served on one NPU by the adaptive loop (see the module text).

    Parameters
    ----------
    driver : the NPU (any backend).
    graph : the imported model (``host.onnx_import.load_onnx``).
    config : the loop's knobs.
    cache : compiled plans (default: in memory only).
    on_event : called with each :class:`RuntimeEvent` as it happens.
    fault : test-only compiler fault injection: ``fault(model, unit_id)`` returns a
        broken copy of a freshly compiled plan whose merged unit ``unit_id`` is new.
    state : what :meth:`state` saved at the end of an earlier run of this model on
        this hardware profile: the profile so far and the merged units of its plan.
        The runtime starts on that plan (compiled plans come from the cache) with
        the profiler's knowledge; a state of another model, profile or hardware
        timing (:func:`~host.profiles.timing_key`) is ignored (event
        ``state-ignored``, which says why).

    Members
    -------
    changes : the plan change under way and its state (:mod:`.changes`).
    speculation : the running bet and what lost bets measured.
    batches : serves :meth:`run_batch` on batch variants (:mod:`.batching`).
    resident : which program the NPU holds, the plan's or a variant's.
    log : the stream's inference count, counters and events (both serving paths).
    units, profiler, cost : every unit made, the execution profile, the cost model.
    """

    def __init__(self, driver: NPUDriver, graph: Graph, config: AdaptiveConfig | None = None,
                 *, cache: CompileCache | None = None,
                 on_event: Callable[[RuntimeEvent], None] | None = None,
                 fault: Callable[[CompiledModel, int], CompiledModel] | None = None,
                 state: dict | None = None, dram_latency: DramLatency | None = None):
        from ..profiles import measured_key

        self.driver, self.config = driver, config or AdaptiveConfig()
        # What the specializer's measurements and the saved state are keyed by: the
        # build and, where the host was told of one, its memory's latency.
        self.measured_key = measured_key(driver.config, dram_latency)
        self._words_at_load = (0, 0)  # the driver's program-word counters at load()
        self.hw = driver.config
        self.cache = cache if cache is not None else CompileCache(None)
        self.fault = fault
        self.log = StreamLog(on_event)
        self.graph, self.simplify_log = simplify(graph)
        self.speculation = Speculation(self.config.spec_threshold, self.config.spec_step,
                                       self.config.profiler.decay)
        self.warm_cycles: dict[int, float] = {}  # region -> decayed mean of warm runs
        # id(model) -> (model, graph, plan) of every program the cache served
        self._served: dict[int, tuple[CompiledModel, Graph, list[Subgraph]]] = {}
        base, _ = self._compile([Subgraph(i + 1, list(u))
                                 for i, u in enumerate(self._initial_plan())])
        self.units = UnitGraph(base)
        self._note_resources(base)
        self.session = Session(driver, base, check=False)
        self.profiler = Profiler(self.config.profiler)
        self.cost = CostModel(self.hw)
        self.cost.calibrate(base)
        self._cost_prior = dict(self.cost.coef)  # what the runtime knew before running
        self.refused: dict[frozenset, str] = {}
        self.restored: list[int] = []  # the plan a warm start began with (no swap)
        self.changes = PlanChanges()
        self.swapped_at: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="npu-compile") \
            if self.config.async_compile else None
        if state is not None:
            self._restore(state)
        self.resident = ResidentProgram(driver, self.session)
        # A stored program is trusted no more than a new plan: its first runs are
        # checked (with check off too), so a wrong entry is evicted, never served on.
        self._trial_left = self.config.validate_runs if self._from_cache(self.model) else 0
        self.batches = BatchServer(self.config, self.graph, self.hw, self.cache, self,
                                   self.resident, self.profiler, self.log)
        self.specializer = None if self.config.specialize is None else Specializer(
            self.config.specialize, Outcomes(self.cache))
        self.sparse = None if self.config.sparsity is None else SparseServer(
            self.config.sparsity, self.config.validate_runs, self.config.check, self.graph,
            self.hw, self.cache, self, self.resident, self.profiler, self.log)
        self._decisions = 0

    def _initial_plan(self) -> list:
        """The units the runtime begins with (node names)."""
        if self.config.start_fused:
            from ..compiler.fuse import fuse_units

            try:
                return [list(u.nodes) if isinstance(u, Subgraph) else list(u)
                        for u in fuse_units(self.graph, self.hw).units]
            except CompileError:  # the per-layer plan below says why in its own words
                pass
        return initial_units(self.graph)

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def model(self) -> CompiledModel:
        """The plan the NPU runs now."""
        return self.session.model

    @property
    def variants(self) -> dict:
        """The running plan's unit variants (unit node names -> Variant)."""
        return getattr(self.model, "variants", {})

    @property
    def n(self) -> int:
        """Inferences served so far."""
        return self.log.inferences

    @property
    def events(self) -> list[RuntimeEvent]:
        """Every event so far."""
        return self.log.events

    @property
    def swaps(self) -> int:
        """Plans landed by a swap (or installed between runs)."""
        return self.log.swaps

    @property
    def rollbacks(self) -> int:
        """Plans and batch variants that failed validation."""
        return self.log.rollbacks

    @property
    def misspeculations(self) -> int:
        """Speculative runs and routed inputs whose bet lost."""
        return self.log.misspeculations

    def load(self) -> None:
        """Write constants and the initial plan to the NPU."""
        self.session.load()
        self.resident.generic_installed()
        # Program writes from here on are plan changes (and batch variants).
        self._words_at_load = (self.driver.imem_words_written, self.driver.imem_words_whole)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ---- serving ------------------------------------------------------------------------
    def run(self, inputs: dict) -> AdaptiveInference:
        """One inference; the runtime profiles it and may re-plan around it."""
        t0 = time.perf_counter()
        self.log.inferences += 1
        self.log.begin_call()
        fast = self._run_sparse(inputs)
        if fast is not None:
            fast.host_seconds = time.perf_counter() - t0
            return fast
        ready = self._ready_change()
        stage = None
        if ready is not None:
            def stage():
                self.session.stage(ready.model)
                self.changes.stage()
        self.resident.to_generic()
        started_on = self.model
        t_dev = time.perf_counter()
        res = self.session.run(inputs, while_running=stage)
        device_seconds = time.perf_counter() - t_dev
        if ready is not None:
            self._landed(ready)
        res, ran_on = self._checked(inputs, res, started_on)
        outcome = self._learn(res)
        if self.specializer is not None:
            self.specializer.observe(res.trace, ran_on, self.model)
        if self.sparse is not None:
            self.sparse.generic_ran(res, tuple(u.id for u in ran_on.units))
            self.sparse.decide(self.n)
        if self.n >= self.config.warmup and self.n % self.config.decide_every == 0:
            self._decide()
        out = AdaptiveInference(res.outputs, res.cycles, res.counters, res.trace,
                                res.checked, res.scalars, index=self.n,
                                plan=tuple(u.id for u in ran_on.units),
                                model=ran_on, events=self.log.fresh,
                                speculation=outcome)
        out.host_seconds = time.perf_counter() - t0
        out.overhead_seconds = out.host_seconds - device_seconds
        return out

    def _run_sparse(self, inputs: dict) -> AdaptiveInference | None:
        """Profile the input and answer it on the sparsity variant when its guard
        holds (None: the generic plan answers)."""
        if self.sparse is None:
            return None
        out = self.sparse.serve(inputs, self.sparse.observe(inputs))
        if out is None:
            return None
        self.sparse.decide(self.n)
        if self.n >= self.config.warmup and self.n % self.config.decide_every == 0:
            self._decide()
        out.events = self.log.fresh
        return out

    def run_many(self, batch, progress=None) -> list[AdaptiveInference]:
        """Serve inferences one after another (``progress`` called after each)."""
        return run_each(self.run, batch, progress)

    def run_batch(self, inputs_list: list[dict]) -> list[AdaptiveInference]:
        """Serve several inferences at once, on a batch variant when there is one
        (:mod:`.batching`)."""
        return self.batches.run(inputs_list)

    def changing(self) -> bool:
        """Whether a compiled plan change waits to land, or a landed one is in
        validation (both happen only on runs of the generic plan)."""
        return self.changes.waiting_to_land()

    # ---- checking and rollback ----------------------------------------------------------
    def _checked(self, inputs: dict, res: Inference, ran_on: CompiledModel
                 ) -> tuple[Inference, CompiledModel]:
        """The inference checked against the reference when asked to (always while
        validating), and the plan that answered it: ``ran_on``, or the previous plan
        after a rollback."""
        v = self.changes.validation
        if v is None and self._trial_left and self._from_cache(ran_on):
            return self._trial_checked(inputs, res, ran_on)
        if v is None and not self.config.check:
            return res, ran_on
        expected = run_reference(self.graph, inputs)
        bad = mismatch(res.outputs, expected)
        if bad is None:
            res.checked = True
            if v is not None:
                v.left -= 1
                if v.left <= 0:
                    self.changes.validated()
                    u = v.change.unit
                    self.log.emit(v.change.kind.validated_event, (u.id,),
                                   f"{self.config.validate_runs} inferences equal the reference")
                    u.record(self.n, "validated", f"{self.config.validate_runs} runs equal "
                             "the reference interpreter")
            return res, ran_on
        if v is None:
            raise MismatchError(f"inference {self.n}: {bad} (plan {self._plan_ids()})")
        # The new plan is wrong: back to the previous one, and answer from it.
        self.changes.rolled_back()
        self._evict_if_served(v.change.model, bad)
        u = v.change.unit
        reason = f"shadow validation failed at inference {self.n}: {bad}"
        self.session.install(v.previous)
        self.resident.generic_installed()
        self.log.rollbacks += 1
        self.units.adopt(v.previous.units, self.n, "rollback")
        self.speculation.bet = v.bet
        if v.change.kind is ChangeKind.SPECIALIZE:
            self.specializer.rolled_back()
        elif v.change.kind is not ChangeKind.SPLIT:
            self.units.quarantine(u.id, self.n, reason)
            self.refused[frozenset(u.nodes)] = f"unit {u.id} is quarantined"
        else:
            self.refused[frozenset(("split", u.id))] = reason
        self.log.emit("rollback", (u.id,), reason)
        res = self.session.run(inputs)
        bad = mismatch(res.outputs, expected)
        if bad is not None:
            raise MismatchError(f"inference {self.n} after rollback: {bad}")
        res.checked = True
        return res, v.previous

    def _from_cache(self, model: CompiledModel) -> bool:
        return id(model) in self._served

    def _evict_if_served(self, model: CompiledModel, why: str) -> bool:
        """Evict the cache entry ``model`` came from, if it came from one."""
        served = self._served.pop(id(model), None)
        if served is None:
            return False
        _, graph, plan = served
        self.cache.evict(graph, plan, self.hw)
        self.log.emit("cache-evicted", tuple(s.id for s in plan),
                      f"the stored program differs from the reference ({why}): recompiled")
        return True

    def _trial_checked(self, inputs: dict, res: Inference, ran_on: CompiledModel
                       ) -> tuple[Inference, CompiledModel]:
        """Check a run of a plan the cache served; on a mismatch evict the entry,
        recompile the plan, install it and answer from it."""
        expected = run_reference(self.graph, inputs)
        bad = mismatch(res.outputs, expected)
        if bad is None:
            res.checked = True
            self._trial_left -= 1
            return res, ran_on
        _, graph, plan = self._served[id(ran_on)]
        self._evict_if_served(ran_on, bad)
        self._trial_left = 0
        model, _ = self._compile(plan, graph, self.variants)
        self.session.install(model, invalidate_tags=True)
        self.resident.generic_installed()
        res = self.session.run(inputs)
        bad = mismatch(res.outputs, expected)
        if bad is not None:
            raise MismatchError(f"inference {self.n}, freshly compiled: {bad} "
                                f"(plan {self._plan_ids()})")
        res.checked = True
        return res, model

    # ---- learning ------------------------------------------------------------------------
    def _learn(self, res: Inference) -> str:
        regions = self.model.regions
        ids = [r.region for r in res.trace]
        features = {"route": tuple(sorted(res.scalars.items()))} if res.scalars else None
        self.profiler.observe(ids, res.trace, features)
        outcome = self.speculation.observe(ids, res.trace)
        if outcome:
            self.log.bets += 1
            self.log.misspeculations += outcome == "miss"
        d = self.config.profiler.decay
        for rec in res.trace:
            if not rec.tag_misses:  # warm runs only: what a unit costs in steady state
                w = self.warm_cycles.get(rec.region)
                self.warm_cycles[rec.region] = rec.cycles if w is None else \
                    d * w + (1 - d) * rec.cycles
            unit = regions.get(rec.region)
            if unit is None:
                continue
            if rec.region in self.units.units:
                self.units[rec.region].exec_count += 1
            work = unit.resources.get("work")
            if work is not None:
                self.cost.observe(work, rec.cycles, cold=bool(rec.tag_misses))
        del self.cost.samples[:-COST_SAMPLES]
        return outcome

    def cost_error(self) -> tuple[float, float]:
        """(error of what the runtime knew before running: golden timelines and the
        coefficients calibrated on them; error after refitting on measurements)."""
        before = CostModel(self.hw, dict(self._cost_prior),
                           samples=list(self.cost.samples)).error()
        return before, self.cost.fit()

    # ---- deciding -------------------------------------------------------------------------
    def _decide(self) -> None:
        if self.changes.state is not PlanState.SERVING:
            return
        self.cost.fit()
        for u in self.units.active():
            if u.kind != MERGED or self.n - self.swapped_at.get(u.id, 0) < self.config.settle:
                continue
            f = self.profiler.unit_frequency(u.id)
            if f < self.config.defuse_threshold and \
                    frozenset(("split", u.id)) not in self.refused:
                reason = (f"cold: runs {f:.2f}/inference < {self.config.defuse_threshold}")
                self._submit(PlanChange(ChangeKind.SPLIT, u, self.units.plan_without(u), reason))
                return
        if self.speculation.stops_paying(self.n, self.config.settle):
            b = self.speculation.bet
            reason = self.speculation.give_up(self.n)
            self._submit(PlanChange(ChangeKind.SPLIT, b.unit, self.units.plan_without(b.unit),
                                    reason, graph=self.graph))
            return
        # Specialization takes every other decision, and those fusion has no use for.
        self._decisions += 1
        if self._decisions % 2 == 0 and self._specialize():
            return
        best = self.best_candidate()
        if best is None:
            self._specialize()
            return
        if isinstance(best, SpecCandidate):
            unit = self.units.merged(best.chain, self.n, best.describe(), kind=SPECULATIVE)
            stats = [self.warm_cycles[uid] for uid in best.chain]
            bet = Bet(unit, best.leaf, sum(stats), stats[0], best.waste)
            self.speculation.placed(best.leaf)
            self._submit(PlanChange(ChangeKind.SPECULATE, unit, self.units.plan_with(unit),
                                    best.describe(), graph=hoist(self.model.graph, best.leaf),
                                    bet=bet))
            return
        unit = self.units.merged(best.chain, self.n, best.describe())
        self._submit(PlanChange(ChangeKind.MERGE, unit, self.units.plan_with(unit),
                                best.describe()))

    def _specialize(self) -> bool:
        """Plan the specializer's next variant trial or verdict; whether it did."""
        if self.specializer is None:
            return False
        decision = self.specializer.decide(self)
        if decision is None:
            return False
        variant, key, event, reason = decision
        unit = next(u for u in self.units.active() if tuple(u.nodes) == key)
        variants = {k: v for k, v in {**self.variants, key: variant}.items()
                    if not v.is_default}
        plan = [Subgraph(s.id, list(s.nodes)) for s in self.model.units]
        self._submit(PlanChange(ChangeKind.SPECIALIZE, unit, plan, reason,
                                variants=variants, event=event))
        return True

    def candidates(self) -> list[Candidate]:
        """Feasible fusion candidates above the threshold, best first."""
        bounds = {}
        for u in self.units.active():
            try:
                bounds[u.id] = self.profiler.unit_stats(u.id).bound(
                    self.hw.peak_macs_per_cycle, self.hw.bus_bytes)
            except KeyError:
                pass
        out = []
        for chain in self.profiler.chains(min_len=2):
            f = self.profiler.chain_frequency(chain)
            if f < self.config.fuse_threshold or refusal(self.units, chain, self.refused):
                continue
            out.append(score_chain(self.model, self.units, chain, f, self.cost, bounds))
        out += self.speculative_candidates(bounds)
        out.sort(key=lambda c: (-c.score, c.chain))
        return out

    def speculative_candidates(self, bounds=None) -> list[SpecCandidate]:
        """Bets on a branch body that the profiler sees follow its gate often enough
        (at least the speculation threshold) and that pay on average: the probability times
        what a hit saves must beat the rest times what a miss wastes (the branch's
        measured cycles, computed for nothing)."""
        if self.speculation.bet is not None or self.changes.planned(ChangeKind.SPECULATE):
            return []
        g, out = self.model.graph, []
        active = self.units.active()
        owner = {n: u for u in active for n in u.nodes}
        for leaf in leaves(g):
            gate = gate_unit(g, leaf, owner)
            body = [u for u in active if set(u.nodes) <= set(leaf.npu_nodes)]
            if gate is None or {n for u in body for n in u.nodes} != set(leaf.npu_nodes):
                continue
            chain = (gate.id, *(u.id for u in body))
            key = frozenset(n for uid in chain for n in self.units[uid].nodes)
            if key in self.refused or any(u.kind == SPECULATIVE for u in body):
                continue
            if self.speculation.cooling(leaf, self.n, self.config.settle):
                continue  # a bet that just stopped paying: observe before betting again
            p = self.profiler.edge_probability(gate.id, body[0].id)
            if p < self.speculation.needed(leaf):
                continue
            if any(uid not in self.warm_cycles for uid in chain):
                continue  # not measured warm yet
            waste = sum(self.warm_cycles[u.id] for u in body)
            gain = score_chain(self.model, self.units, chain, 1.0, self.cost,
                               bounds or {}).score
            if p < waste / max(waste + gain, 1e-9):
                continue  # below the estimated break-even: misses would eat the hits
            f = self.profiler.unit_frequency(gate.id)
            # Ranked by what hits save; whether misses eat it is measured once the
            # bet runs (a bet below its measured break-even is split again).
            score = f * p * gain
            c = score_chain(self.model, self.units, chain, f, self.cost, bounds or {})
            out.append(SpecCandidate(chain, f, c.saved_bytes, c.saved_transfers,
                                     c.complementary, score, leaf, p, gain, waste))
        return out

    def best_candidate(self) -> Candidate | None:
        cands = [c for c in self.candidates() if c.score >= self.config.min_score]
        return cands[0] if cands else None

    # ---- compiling and swapping ----------------------------------------------------------
    def _submit(self, change: PlanChange) -> None:
        alone = change.kind in (ChangeKind.SPLIT, ChangeKind.SPECIALIZE)
        parts = (change.unit.id,) if alone else change.unit.parts
        self.log.emit(change.event or change.kind.planned_event, parts, change.reason)
        self.changes.plan(change)
        self.log.compiles += 1
        graph = change.graph if change.graph is not None else self.model.graph
        keys = {tuple(s.nodes) for s in change.plan}
        variants = change.variants if change.variants is not None else \
            {k: v for k, v in self.variants.items() if k in keys}
        if self._pool is not None:
            change.future = self._pool.submit(self._compile, change.plan, graph, variants)
        else:
            self._finish_compile(change, self._compile_safely(change.plan, graph, variants))

    def _compile_safely(self, plan, graph, variants=None):
        try:
            return self._compile(plan, graph, variants), None
        except CompileError as e:
            return None, str(e)

    def _compile(self, plan: list[Subgraph], graph: Graph | None = None,
                 variants: dict | None = None) -> tuple[CompiledModel, bool]:
        graph = self.graph if graph is None else graph
        # Linked from the cache's compiled units: only the units the plan lacks are
        # lowered.
        if variants:
            model, hit = self.cache.get_or_compile(
                graph, plan, self.hw, specialization=variants_key(variants),
                compile_fn=lambda: compile_variants(self.cache, graph, plan, self.hw, variants))
        else:
            model, hit = self.cache.get_or_compile(graph, plan, self.hw)
        model.variants = dict(variants or {})
        if hit:
            self._served[id(model)] = (model, graph, list(plan))
        # The cost model predicts the plan's units from their golden cycles.
        return attach_timeline(model), hit

    def _finish_compile(self, change: PlanChange, outcome) -> None:
        """Take a compile's outcome: the change is ready to stage, or refused."""
        result, error = outcome
        u = change.unit
        if error is not None:
            self.refused[frozenset(u.nodes)] = f"does not compile: {error}"
            u.record(self.n, "refused", error)
            self.log.emit("compile-refused", (u.id,), error)
            self.changes.refused()
            return
        model, hit = result
        change.model, change.hit = model, hit
        if change.kind is ChangeKind.MERGE:  # (a bet's worth is its hit rate: measured)
            why = self._no_gain(model, u)
            if why:
                self.refused[frozenset(u.nodes)] = why
                u.record(self.n, "refused", why)
                self.log.emit("fuse-refused", (u.id,), why)
                self.changes.refused()
                return
        if change.kind is not ChangeKind.SPLIT and self.fault is not None:
            change.model = self.fault(model, u.id)
        self._note_resources(model)
        u.record(self.n, "compiled", "cache hit" if hit else "compiled")
        self.log.emit("compiled", (u.id,), f"{'cache hit' if hit else 'compiled'}: "
                       f"{len(model.program)} instructions, {len(model.units)} units")
        self.changes.compiled()

    def _ready_change(self) -> PlanChange | None:
        """The planned change, once compiled and good to stage during the next run
        (None otherwise; a plan with other constants is installed here instead)."""
        c = self.changes.change
        if c is None:
            return None
        if c.future is not None:
            if not c.future.done():
                return None
            fut, c.future = c.future, None
            try:
                self._finish_compile(c, (fut.result(), None))
            except CompileError as e:
                self._finish_compile(c, (None, str(e)))
        if self.changes.state is not PlanState.READY:
            return None
        if c.model.const_image() != self.model.const_image():
            # Different constants: rewrite them between runs (tags invalidated).
            previous = self.model
            self.session.install(c.model, invalidate_tags=True)
            self.changes.stage()
            self._landed(c, previous, staged=False)
            return None
        return c

    def _landed(self, c: PlanChange, previous: CompiledModel | None = None,
                staged: bool = True) -> None:
        """The change is the running plan: adopt its units, start its validation."""
        previous = previous or self.model
        if staged and not self.session.confirm():
            raise RuntimeError("the staged plan did not land at the run boundary")
        self.resident.generic_installed()
        self.log.swaps += 1
        for u, _ in self.units.adopt(c.plan, self.n, c.reason):
            if u.state == ACTIVE:
                self.swapped_at[u.id] = self.n
        self.profiler.forget([i for i in self._plan_ids_of(previous)
                              if i not in {s.id for s in c.plan}])
        if self.specializer is not None:
            self.specializer.forget()
        self.log.emit("swapped-in", (c.unit.id,),
                       f"bank version {self.session.version}, plan {self._plan_ids()}")
        before = self.speculation.swapped_in(c.unit.id, c.bet, self.model.graph,
                                             self.model.units, self.n)
        self.changes.land(Validation(c, previous, self.config.validate_runs, before)
                          if self.config.validate_runs else None)

    def _no_gain(self, model: CompiledModel, u: Unit) -> str | None:
        """Why a compiled merge is not worth swapping in (cost model), or None."""
        merged = model.regions.get(u.id)
        if merged is None or "work" not in merged.resources:
            return None
        parts = [self.model.regions.get(p) for p in u.parts]
        if any(p is None or "work" not in p.resources for p in parts):
            return None
        after = self.cost.predict(merged.resources["work"])
        before = sum(self.cost.predict(p.resources["work"]) for p in parts)
        if after >= before:
            return f"no predicted gain ({after:.0f} >= {before:.0f} cycles per run)"
        return None

    def _note_resources(self, model: CompiledModel) -> None:
        for sub in model.units:
            if sub.id in self.units.units:
                self.units[sub.id].resources = {k: v for k, v in sub.resources.items()
                                                if k != "work"}

    # ---- warm start ----------------------------------------------------------------------
    def state(self) -> dict:
        """What a later run of this model on this profile starts from (JSON-ready):
        the profiler's state and the merged units of the plan (as chains of original
        units; speculative bets are re-learned)."""
        from ..profiles import timing_key
        from .cache import graph_signature

        merged = [self.units.originals(u.id) for u in self.units.active() if u.kind == MERGED]
        return {"version": 1, "graph": graph_signature(self.graph),
                "profile": self.measured_key, "timing": timing_key(),
                "profiler": self.profiler.to_dict(), "merged": merged, "inferences": self.n,
                "start": "fused" if self.config.start_fused else "per-layer"}

    def _restore(self, state: dict) -> None:
        from ..profiles import timing_key
        from .cache import graph_signature

        mismatch = [why for key, want, why in (
            ("version", 1, "another state format"),
            ("graph", graph_signature(self.graph), "another model"),
            ("profile", self.measured_key, "another hardware profile or memory latency"),
            # Timings measured on another hardware revision would steer the plan.
            ("timing", timing_key(), "another hardware timing revision"),
            ("start", "fused" if self.config.start_fused else "per-layer",
             "another initial plan"),
        ) if state.get(key, "per-layer" if key == "start" else None) != want]
        if mismatch:
            self.log.emit("state-ignored", (), "saved for " + ", ".join(mismatch))
            return
        self.profiler = Profiler.from_dict(state["profiler"])
        plan_units = []
        for chain in state["merged"]:
            try:
                u = self.units.merged(tuple(chain), 0, "restored from the saved state")
            except (KeyError, ValueError) as e:
                self.log.emit("state-ignored", tuple(chain), f"unit not restorable: {e}")
                continue
            plan_units.append(u)
        if not plan_units:
            return
        plan = self.units.plan()
        for u in plan_units:
            covered = set(u.nodes)
            plan = [s for s in plan if not covered & set(s.nodes)] + [Subgraph(u.id, list(u.nodes))]
        order = self.units.order
        plan.sort(key=lambda s: order[s.nodes[0]])
        try:
            model, hit = self._compile(plan)
        except CompileError as e:
            self.log.emit("state-ignored", (), f"the saved plan does not compile: {e}")
            return
        # Not a swap: the run starts on this plan (the first install, not a hot swap).
        self.units.adopt(plan, 0, "restored from the saved state", came="restored",
                         went="set-aside")
        self.restored = [s.id for s in plan]
        self.session = Session(self.driver, model, check=False)
        self._note_resources(model)
        self.log.emit("restored", tuple(s.id for s in plan),
                       f"plan of an earlier run ({'cache hit' if hit else 'compiled'}), profile "
                       f"of {state.get('inferences', 0)} inferences")

    # ---- reporting -----------------------------------------------------------------------
    def _plan_ids(self) -> list[int]:
        return self._plan_ids_of(self.model)

    @staticmethod
    def _plan_ids_of(model: CompiledModel) -> list[int]:
        return [u.id for u in model.units]

    def wait_idle(self) -> None:
        """Block until a pending compile finishes (tests and benchmarks)."""
        c = self.changes.change
        if c is not None and c.future is not None:
            c.future.exception()

    def _program_words(self) -> dict:
        """Instruction words written since the initial load (plan changes, batch
        variants), and what writing each of those programs whole would have taken."""
        written, whole = self._words_at_load
        return {"written": self.driver.imem_words_written - written,
                "whole": self.driver.imem_words_whole - whole}

    def report(self) -> dict:
        """The state of the loop: units with histories, plan, events, figures."""
        before, after = self.cost_error()
        return {
            "model": self.graph.name,
            "profile": self.hw.as_dict(),
            "inferences": self.n,
            "plan": self._plan_ids(),
            "swaps": self.log.swaps,
            "restored_plan": self.restored,
            "rollbacks": self.log.rollbacks,
            "compiles": self.log.compiles,
            "speculation": {"bets": self.log.bets,
                            "misspeculations": self.log.misspeculations,
                            "threshold": self.speculation.threshold,
                            "active": self.speculation.report()},
            "cache": self.cache.stats(),
            "program_words": self._program_words(),
            "cost_model_error": {"profile": before, "refit": after},
            **self.batches.report(),
            "specializations": self.specializer.report() if self.specializer else [],
            "sparsity": self.sparse.report() if self.sparse else None,
            "units": self.units.as_dict()["units"],
            "events": [e.as_dict() for e in self.events],
            "profiler": self.profiler.snapshot(),
        }
