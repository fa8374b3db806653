"""Sparsity variants: skip the K-tiles of a GEMM input that are zero, behind a host guard.

A GEMM reads its int8 input ``x`` with the zero point folded into the bias
(``x @ W + bias - zx * colsum(W)``, :class:`~host.ir.QGemm`), so an element
equal to ``zx`` adds ``zx * W[k]`` and nothing that depends on the input. When
the elements ``S`` of a :class:`~.input_stats.GemmInput` are all ``zx``, the
GEMM computes the same accumulators from the other elements alone, with
``zx * colsum(W[S])`` moved into the bias (int32, wrapping like the
accumulator). :func:`sparse_graph` makes that graph: the model input shortened to
its kept elements, every GEMM reading it with the rows ``S`` of its weights
dropped. Its program loads ``|S| / rows`` fewer weight tiles per column group and
runs as many fewer passes through the array.

The guard runs on the host, which writes the input into DRAM itself: it
quantizes the input exactly as the boundary ``Quantize`` does (the same
:func:`~host.reference.eval_node`) and checks that every element of ``S`` equals
``zx``; only then does it write the kept elements, so the bytes the variant
reads are the input's own and the skipped ones are known to be zero. That check
is ``K`` compares per input, and it is sound by the identity above: a passing
input gives the generic program's accumulators bit for bit. A failing input runs
on the generic plan. The ISA has no branch on a scratchpad value; the host
choosing the program per input needs none.

:class:`SparseServer` puts this into the adaptive runtime: it profiles every
input (:class:`~.input_stats.ZeroProfile`), proposes the largest skip set that
held on ``min_hit`` of the recent inputs, compiles the variant of the current
plan through the compile cache, validates its first runs in shadow, measures it
against the generic plan and keeps or reverts it, and drops it when the guard
stops holding (a phase change). Every step is an event.
"""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from firmware.config import NPUConfig

from ..compiler import CompiledModel, CompileError, compile_model
from ..compiler.compile import SharedConsts
from ..ir import Graph, QGemm, Subgraph
from ..reference import run_reference, wrap32
from ..runtime import PAGE
from .cache import CompileCache
from .input_stats import GemmInput, ZeroProfile, clamped_nodes, gemm_inputs
from .profiler import Profiler
from .records import AdaptiveInference, StreamLog, mismatch
from .resident import ResidentProgram

if TYPE_CHECKING:
    from .batching import GenericPlan


@dataclass
class SparsityConfig:
    """The knobs of sparsity variants (docs/runtime.md).

    Members
    -------
    min_hit : the share of recent inputs a skip set must have been all zero in to
        be proposed; a kept variant whose guard holds on less is dropped.
    window : recent inputs the hit rates are measured on.
    warmup : inputs served before the first proposal (a proposal also needs a
        full window).
    measure_runs : warm runs of a validated variant measured against the generic plan.
    settle : inferences the generic plan must have stayed unchanged before a variant
        is built on it (a plan change drops the variant: fusion still moving would
        make it pay cold runs for nothing).
    """

    min_hit: float = 0.9
    window: int = 32
    warmup: int = 32
    measure_runs: int = 3
    settle: int = 12

    def __post_init__(self):
        if not 0 < self.min_hit <= 1:
            raise ValueError(f"min_hit must be in (0, 1], got {self.min_hit}")
        if self.window < 1 or self.warmup < 0 or self.measure_runs < 1 or self.settle < 0:
            raise ValueError("window and measure_runs must be >= 1, warmup and settle >= 0")


def sparse_graph(graph: Graph, source: GemmInput, skip) -> Graph:
    """A copy of ``graph`` whose input ``source.input`` holds only the elements not in
    ``skip`` (positions along K), for inputs whose ``skip`` elements equal
    ``source.zero``: each GEMM reading it drops those weight rows and adds
    ``zero * colsum(W[skip])`` to its bias. Node names stay, so unit lists carry over.
    """
    skip = sorted(set(int(i) for i in skip))
    if not skip or skip[0] < 0 or skip[-1] >= source.k or len(skip) >= source.k:
        raise ValueError(f"skip {skip} must be a proper, non-empty subset of 0..{source.k - 1}")
    keep = np.setdiff1d(np.arange(source.k), skip)
    g = copy.deepcopy(graph)
    g.name = f"{graph.name}@sparse{len(skip)}"
    for name in {source.input, source.tensor}:
        t = g.tensors[name]
        t.shape = (*t.shape[:-1], len(keep))
    for _sub, n in g.walk():
        if n.name not in source.gemms:
            continue
        assert isinstance(n, QGemm)
        w = n.weight
        folded = source.zero * w[skip].astype(np.int64).sum(axis=0)
        base = np.zeros(w.shape[1], np.int64) if n.bias is None else n.bias.astype(np.int64)
        n.weight = np.ascontiguousarray(w[keep])
        n.bias = wrap32(base + folded)
    g.validate()
    return g


@dataclass
class SparseVariant:
    """A sparsity variant of a plan and its guard.

    Members
    -------
    model : the compiled variant (``model.graph`` is :func:`sparse_graph`'s).
    source : the input whose elements it skips.
    skip : the skipped positions along K.
    generic : the graph it specializes (whose inputs callers pass).
    plan : the unit ids of the generic plan it was built on.
    tail_at : where its own constants start when it shares the generic plan's
        (:class:`~host.compiler.compile.SharedConsts`).
    """

    model: CompiledModel
    source: GemmInput
    skip: tuple[int, ...]
    generic: Graph
    plan: tuple[int, ...] = ()
    tail_at: int | None = None
    keep: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.keep = np.setdiff1d(np.arange(self.source.k), self.skip)

    @property
    def name(self) -> str:
        """The specialization key: the input and a digest of the skip set."""
        return skip_key(self.source, self.skip)

    def tiles_saved(self, rows: int) -> int:
        """K-tiles of ``rows`` elements each GEMM's column group no longer loads."""
        k = self.source.k
        return -(-k // rows) - -(-(k - len(self.skip)) // rows)

    def guard_failure(self, values: np.ndarray) -> str:
        """Why an input whose quantized values are ``values`` may not run on the
        variant (``""`` when it may)."""
        bad = np.flatnonzero(values[list(self.skip)] != self.source.zero)
        if not bad.size:
            return ""
        k = self.skip[int(bad[0])]
        return (f"element {k} of {self.source.input!r} is {int(values[k])}, not the zero "
                f"point {self.source.zero} ({bad.size} of {len(self.skip)} skipped elements)")

    def compact(self, inputs: dict) -> dict:
        """The variant's inputs: the source input's kept elements, the rest as given."""
        out = dict(inputs)
        x = np.asarray(inputs[self.source.input])
        out[self.source.input] = np.ascontiguousarray(x[..., self.keep])
        return out


def skip_key(source: GemmInput, skip) -> str:
    digest = hashlib.sha256(",".join(map(str, skip)).encode()).hexdigest()[:12]
    return f"sparse:{source.input}:{len(skip)}:{digest}"


class SparseServer:
    """Serves single inferences on a sparsity variant when its guard holds (see the
    module text).

    Parameters
    ----------
    config : its knobs.
    validate_runs, check : the runtime's (shadow validation; check every inference).
    graph : the simplified model (what the reference checks).
    hw, cache : the NPU's configuration and the compile cache.
    generic : the runtime's generic plan.
    resident : the switch between the generic plan and a variant on the NPU.
    profiler : takes a variant run's trace (the units are the plan's).
    log : the stream's counts and events.
    """

    def __init__(self, config: SparsityConfig, validate_runs: int, check: bool, graph: Graph,
                 hw: NPUConfig, cache: CompileCache, generic: GenericPlan,
                 resident: ResidentProgram, profiler: Profiler, log: StreamLog):
        self.config, self.validate_runs, self.check = config, validate_runs, check
        self.graph, self.hw, self.cache = graph, hw, cache
        self.generic, self.resident, self.profiler, self.log = generic, resident, profiler, log
        self.profiles = [ZeroProfile(s, config.window) for s in gemm_inputs(graph)]
        # Clamps narrower than int8: what a value-range variant could drop (not built:
        # it would save one cfg write per clamp), so their ranges are not profiled here.
        self.clamps = [n.name for n in clamped_nodes(graph)]
        self.variant: SparseVariant | None = None
        self.state = "none"  # none | validating | measuring | kept
        self._left = 0
        self._measured: list[int] = []
        self.refused: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()  # (skip, plan)
        self.generic_warm: dict[tuple[int, ...], float] = {}  # plan -> mean warm cycles
        self.guard_log: list[bool] = []  # the variant's recent guard outcomes
        self.kept_cycles: list[int] = []  # cycles of recent inferences beside it (both paths)
        self.fast = self.guarded = 0  # inputs served by the variant / that met a variant
        self.trials: list[dict] = []
        self._plan_seen: tuple[int, ...] = ()
        self._plan_since = 0  # the inference since which the generic plan is unchanged
        self._served: tuple | None = None  # the cache key of a variant the cache served

    # ---- profiling -----------------------------------------------------------------------
    def observe(self, inputs: dict) -> dict[str, np.ndarray]:
        """Profile one input; its quantized values per profiled source."""
        out = {}
        for p in self.profiles:
            v = p.source.quantized(self.graph, inputs[p.source.input])
            p.observe(v)
            out[p.source.input] = v
        return out

    def generic_ran(self, res, plan: tuple[int, ...]) -> None:
        """Note a run of the generic plan (warm runs give the figure a variant must beat;
        beside a kept variant, a guard failure's run counts with its program switch)."""
        if self.state == "kept":
            self._note_kept(res.cycles)
            return
        if any(r.tag_misses for r in res.trace):
            return
        w = self.generic_warm.get(plan)
        self.generic_warm[plan] = res.cycles if w is None else 0.8 * w + 0.2 * res.cycles

    # ---- serving ---------------------------------------------------------------------------
    def serve(self, inputs: dict, values: dict) -> AdaptiveInference | None:
        """Run ``inputs`` on the variant when there is one and its guard holds; None
        when the generic plan must answer (no variant, a plan change landing, a
        guard failure)."""
        v = self.variant
        if v is None or self.generic.changing():
            return None
        if v.plan != self._plan_ids():
            self._drop("the plan is now " + str(list(self._plan_ids())), retry=True)
            return None
        self.guarded += 1
        why = v.guard_failure(values[v.source.input])
        self.guard_log.append(not why)
        del self.guard_log[:-self.config.window]
        if why:
            self.log.emit("guard-failed", (), f"{v.name}: {why}; running the generic plan")
            return None
        t0 = time.perf_counter()
        res = self.resident.to_variant(v.model, v.tail_at).run(v.compact(inputs))
        checked = False
        if self.state == "validating" or self.check:
            bad = mismatch(res.outputs, run_reference(self.graph, inputs))
            if bad is not None:
                self.log.rollbacks += 1
                self.log.emit("rollback", (), f"{v.name} failed shadow validation: {bad}")
                self._refuse(v)
                self._drop("", retry=False, quiet=True)
                if self._served is not None:  # a stored program is trusted no more
                    self.cache.evict(*self._served[:2], self.hw, specialization=self._served[2])
                    self.log.emit("cache-evicted", (), f"{v.name}: the stored program "
                                  f"differs from the reference ({bad})")
                return None
            checked = True
        self.fast += 1
        if self.state == "kept":
            self._note_kept(res.cycles)
        self.profiler.observe([r.region for r in res.trace], res.trace)
        self._after_run(v, res)
        return AdaptiveInference(res.outputs, res.cycles, res.counters, res.trace, checked,
                                 res.scalars, index=self.log.inferences,
                                 plan=tuple(u.id for u in v.model.units), model=v.model,
                                 host_seconds=time.perf_counter() - t0)

    def _after_run(self, v: SparseVariant, res) -> None:
        if self.state == "validating":
            self._left -= 1
            if self._left <= 0:
                self.state = "measuring"
                self.log.emit("sparsity-validated", (), f"{v.name}: {self.validate_runs} "
                              "inferences equal the reference")
        elif self.state == "measuring":
            if not any(r.tag_misses for r in res.trace):
                self._measured.append(res.cycles)
            if len(self._measured) >= self.config.measure_runs:
                self._verdict(v)

    def _note_kept(self, cycles: int) -> None:
        self.kept_cycles.append(cycles)
        del self.kept_cycles[:-self.config.window]

    def _verdict(self, v: SparseVariant) -> None:
        mean = float(np.mean(self._measured))
        base = self.generic_warm.get(v.plan)
        trial = {"variant": v.name, "skipped": len(v.skip),
                 "tiles_saved": v.tiles_saved(self.hw.rows),
                 "cycles": mean, "generic_cycles": base}
        self.trials.append(trial)
        if base is not None and mean < base:
            self.state = "kept"
            self.kept_cycles = []
            trial["verdict"] = "kept"
            self.log.emit("sparsity-kept", (), f"{v.name}: {mean:.0f} cycles per inference "
                          f"against {base:.0f} on the generic plan")
            return
        trial["verdict"] = "reverted"
        self._refuse(v)
        what = "no warm run of the generic plan to compare with" if base is None else \
            f"{mean:.0f} cycles per inference, not below {base:.0f} on the generic plan"
        self._drop(f"{what}", retry=False)

    # ---- deciding --------------------------------------------------------------------------
    def decide(self, n: int) -> None:
        """After an inference: drop a kept variant whose guard stopped holding or
        whose stream (guard failures' program switches included) stopped paying, or
        propose one from the profile."""
        if self.variant is not None:
            self._review()
        plan = self._plan_ids()
        if plan != self._plan_seen:
            self._plan_seen, self._plan_since = plan, n
        if self.variant is not None or n < self.config.warmup or self.generic.changing() \
                or n - self._plan_since < self.config.settle:
            return
        for p in self.profiles:
            if len(p.masks) < self.config.window:
                continue
            skip, hit = p.skip_set(self.hw.rows, self.config.min_hit)
            if skip and (skip, self._plan_ids()) not in self.refused:
                self._propose(p.source, skip, hit)
                return

    def _review(self) -> None:
        v, window = self.variant, self.config.window
        if len(self.guard_log) >= window:
            rate = float(np.mean(self.guard_log))
            if rate < self.config.min_hit:
                self._drop(f"the guard held on {100 * rate:.0f}% of the last "
                           f"{len(self.guard_log)} inputs (< {100 * self.config.min_hit:.0f}%)",
                           retry=True)
                return
        base = self.generic_warm.get(v.plan)
        if self.state == "kept" and len(self.kept_cycles) >= window and base is not None:
            mean = float(np.mean(self.kept_cycles))
            if mean >= base:
                self._refuse(v)
                self._drop(f"{mean:.0f} cycles per inference over the last {window} inputs "
                           "(guard failures run the generic plan and switch programs), not "
                           f"below {base:.0f} on the generic plan", retry=False)

    def _propose(self, source: GemmInput, skip: tuple[int, ...], hit: float) -> None:
        plan = self.generic.model
        units = [Subgraph(u.id, list(u.nodes)) for u in plan.units]
        spec = skip_key(source, skip)
        self.log.emit("sparsity-planned", (), f"{spec}: {len(skip)} of {source.k} elements "
                      f"of {source.input!r} were zero together in {100 * hit:.0f}% of the "
                      f"last {self.config.window} inputs; GEMMs "
                      f"{', '.join(source.gemms)} skip them")
        # The variant's constants go around the generic plan's, so a switch between
        # the two rewrites no constants and invalidates no tag of a shared blob.
        session = self.resident.generic
        arena = session.arena_base - session.const_base
        tail_at = -(-(arena + 2 * plan.place.arena_bytes + PAGE) // PAGE) * PAGE
        share = SharedConsts(plan.place, tail_at)
        around = hashlib.sha256(plan.const_image()).hexdigest()[:12]
        try:
            g = sparse_graph(plan.graph, source, skip)
            key = f"{spec}:around:{around}:{tail_at}"
            model, hit_cache = self.cache.get_or_compile(
                g, units, self.hw, specialization=key,
                compile_fn=lambda: compile_model(g, self.hw, units, simplified=True,
                                                 share_consts=share))
            if model.place.arena_bytes > plan.place.arena_bytes:
                raise CompileError(f"its activations take {model.place.arena_bytes} bytes, "
                                   f"more than the generic plan's {plan.place.arena_bytes}")
        except CompileError as e:
            self.refused.add((skip, self._plan_ids()))
            self.log.emit("specialize-refused", (), f"{spec}: {e}")
            return
        self.log.compiles += not hit_cache
        self._served = (g, units, key) if hit_cache else None
        self.variant = SparseVariant(model, source, skip, plan.graph, self._plan_ids(),
                                     tail_at)
        self.log.emit("compiled", tuple(u.id for u in model.units),
                      f"{spec} ({'cache hit' if hit_cache else 'compiled'}): "
                      f"{len(model.program)} instructions, "
                      f"{self.variant.tiles_saved(self.hw.rows)} K-tiles fewer per GEMM")
        self.state, self._left, self._measured = "validating", self.validate_runs, []
        self.guard_log = []
        if self.validate_runs == 0:
            self.state = "measuring"

    def _refuse(self, v: SparseVariant) -> None:
        self.refused.add((v.skip, v.plan))

    def _drop(self, why: str, *, retry: bool, quiet: bool = False) -> None:
        v = self.variant
        self.variant, self.state = None, "none"
        if v is not None and not quiet:
            self.log.emit("sparsity-reverted", (), f"{v.name}: {why}" +
                          ("" if not retry else "; proposed again from the profile"))

    def _plan_ids(self) -> tuple[int, ...]:
        return tuple(u.id for u in self.generic.model.units)

    def report(self) -> dict:
        """JSON-ready: the profiles, the variant serving, the trials, the fast-path share."""
        return {"inputs": [p.report(self.hw.rows) for p in self.profiles],
                "clamps": self.clamps,
                "variant": None if self.variant is None else
                {"name": self.variant.name, "state": self.state,
                 "skipped": list(self.variant.skip)},
                "trials": self.trials,
                "fast_path": self.fast, "guarded": self.guarded}
