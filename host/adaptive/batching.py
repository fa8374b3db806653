"""Serving batches: the specializer's batch variants inside the adaptive loop.

``AdaptiveRuntime.run_batch`` profiles the batch sizes it is asked to serve. Once
a size has come ``specialize_after`` times it builds a variant for it, through
the compile cache:

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
mismatch drops it.
"""

from __future__ import annotations

import time

from ..compiler import CompileError
from ..ir import Subgraph
from ..reference import run_reference
from ..runtime import Session
from .records import AdaptiveInference, mismatch


class BatchServing:
    """The batch half of :class:`~.engine.AdaptiveRuntime` (a mixin: it uses the
    runtime's driver, session, cache, profiler and events)."""

    def _init_batching(self) -> None:
        self.batch_sizes: dict[int, int] = {}  # input profiling: batch sizes asked for
        self.variants: dict = {}  # batch size -> variant, or None (refused)
        self.routes: dict[tuple, float] = {}  # branch path -> decayed count (routed)
        self._variant_checks: dict[int, int] = {}
        self._variant_session: Session | None = None
        self._on_device = None

    def run_batch(self, inputs_list: list[dict]) -> list[AdaptiveInference]:
        """Serve several inferences at once (see the module text)."""
        B = len(inputs_list)
        self.batch_sizes[B] = self.batch_sizes.get(B, 0) + 1
        self._fresh = []
        if B > 1 and B not in self.variants and \
                self.batch_sizes[B] >= self.config.specialize_after:
            self._specialize(B)
        v = self.variants.get(B)
        if getattr(v, "plan", ()):  # a batch variant of the generic plan
            if self._generic_plan_busy():
                # A compiled plan change lands, and is validated in shadow, on runs
                # of the generic plan; served by the variant, it would wait forever.
                return [self.run(x) for x in inputs_list]
            if v.plan != tuple(self._plan_ids()):
                self._specialize(B, f"the plan is now {self._plan_ids()}")
                v = self.variants.get(B)
        if v is not None:
            why = v.guard_failure(inputs_list)
            if why:
                self._event("guard-failed", (), f"{v.name}: {why}; running the generic plan")
                v = None
        if v is None:
            return [self.run(x) for x in inputs_list]
        if hasattr(v, "bet"):
            return self._run_routed(v, inputs_list)
        return self._run_variant(v, inputs_list)

    def _generic_plan_busy(self) -> bool:
        """A compiled plan change waits to land, or a landed one is in validation."""
        c = self.pending
        ready = c is not None and (c.future is None or c.future.done())
        return ready or self.validating is not None

    # ---- building variants -----------------------------------------------------------
    def _specialize(self, B: int, why: str = "") -> None:
        """Build the batch-B variant of the current plan (``why``: a rebuild's reason)."""
        from .routed import branch_leaves
        from .specialize import BatchVariant, SpecializationError, batch_graph

        try:
            bg = batch_graph(self.model.graph, B)
        except SpecializationError as e:
            if branch_leaves(self.graph):
                self._place_bet(B, self._cover_set(), "first bet: every branch")
            else:
                self.variants[B] = None
                self._event("specialize-refused", (), f"batch{B}: {e}")
            return
        try:
            model, hit = self.cache.get_or_compile(
                bg, [Subgraph(u.id, list(u.nodes)) for u in self.model.units], self.hw,
                specialization=f"batch{B}")
        except CompileError as e:
            self.variants[B] = None
            self._event("specialize-refused", (), f"batch{B}: {e}")
            return
        self.variants[B] = BatchVariant(model, B, self.model.graph, tuple(self._plan_ids()))
        self._variant_checks[B] = self.config.validate_runs
        self._event("specialized", tuple(u.id for u in model.units),
                    f"batch{B} ({'cache hit' if hit else 'compiled'}): {B} inputs per run, "
                    f"{len(model.program)} instructions" + (f"; rebuilt: {why}" if why else ""))

    def _cover_set(self) -> list:
        """The fewest branches that took ``route_cover`` of the routed inputs seen
        (every branch when nothing has been seen)."""
        from .routed import branch_leaves

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
        from .routed import routed_variant

        def compile_fn(g, units):
            model, self._last_hit = self.cache.get_or_compile(
                g, units, self.hw, specialization=f"route{B}:" + ";".join(
                    lf.describe() for lf in bet))  # (the batched graph differs per bet too)
            return model

        try:
            v = routed_variant(self.graph, self.hw, bet, B, compile_fn)
        except CompileError as e:
            self.variants[B] = None
            self._event("specialize-refused", (), f"route{B}: {e}")
            return
        self.variants[B] = v
        self._variant_checks[B] = self.config.validate_runs
        how = "cache hit" if self._last_hit else "compiled"
        self._event("specialized", (), f"{v.name} ({how}): {reason}; "
                    f"{len(v.model.program)} instructions")

    # ---- running them ------------------------------------------------------------------
    def _put_on_device(self, model) -> Session:
        if self._on_device is not model:
            self._variant_session = Session(self.driver, model, check=False,
                                            const_base=self.session.const_base,
                                            arena_base=self.session.arena_base)
            if model.const_image() != self.model.const_image():
                self._variant_session.load()
            else:
                self._variant_session.install(model)
            self._on_device = model
        return self._variant_session

    def _check_rows(self, v, outs, inputs_list) -> bool | None:
        """Compare answered rows with the reference: True (checked), False (not
        asked to), None (a mismatch: the variant is dropped)."""
        B = v.batch
        left = self._variant_checks.get(B, 0)
        if not (left or self.config.check):
            return False
        for o, x in zip(outs, inputs_list, strict=True):
            bad = None if o is None else mismatch(o, run_reference(self.graph, x))
            if bad:
                self.variants[B] = None
                self.rollbacks += 1
                self._event("rollback", (), f"{v.name} failed validation: {bad}")
                return None
        if left:
            self._variant_checks[B] = left - 1
            if left == 1:
                self._event("specialize-validated", (), f"{v.name}: "
                            f"{self.config.validate_runs} batches equal the reference")
        return True

    def _run_variant(self, v, inputs_list) -> list[AdaptiveInference]:
        t0 = time.perf_counter()
        res = self._put_on_device(v.model).run(v.stack(inputs_list))
        outs = v.unstack(res.outputs)
        checked = self._check_rows(v, outs, inputs_list)
        if checked is None:
            return [self.run(x) for x in inputs_list]
        self.profiler.observe([r.region for r in res.trace], res.trace)
        records = self._batch_records(v, res, outs, checked, t0)
        self.n += v.batch
        return records

    def _run_routed(self, v, inputs_list) -> list[AdaptiveInference]:
        t0 = time.perf_counter()
        B = v.batch
        res = self._put_on_device(v.model).run(v.stack(inputs_list))
        rows = v.finish(res.outputs, inputs_list)
        outs = [o for o, _ in rows]
        checked = self._check_rows(v, outs, inputs_list)
        if checked is None:
            return [self.run(x) for x in inputs_list]
        d = self.config.route_decay
        self.routes = {k: c * d ** B for k, c in self.routes.items()}
        for _, path in rows:
            self.routes[path] = self.routes.get(path, 0.0) + 1.0
        misses = [i for i, o in enumerate(outs) if o is None]
        self.bets_total += B
        self.misspeculations += len(misses)
        first = self.n
        records = self._batch_records(v, res, outs, checked, t0)
        # A miss runs alone on the generic plan (its share of the batch was wasted).
        for i in misses:
            alone = self.run(inputs_list[i])
            r = records[i]
            r.outputs, r.checked = alone.outputs, alone.checked
            r.cycles += alone.cycles
            r.speculation = "miss"
            r.events += alone.events
        self.n = first + B  # (each miss's run counted itself)
        for i, r in enumerate(records):
            r.speculation = r.speculation or "hit"
            r.index = first + i + 1
        # Re-place the bet when the routes moved away from it.
        if not self.config.rebet:
            pass
        elif misses and len(misses) > (1 - self.config.route_cover) * B * 2:
            bet = self._cover_set()
            if [lf.path for lf in bet] != [lf.path for lf in v.bet]:
                self._place_bet(B, bet, f"{len(misses)}/{B} inputs of the last batch missed "
                                "the bet")
        elif len(v.bet) > 1:
            bet = self._cover_set()
            if len(bet) < len(v.bet):
                self._place_bet(B, bet, f"{len(bet)} branches took "
                                f"{100 * self.config.route_cover:.0f}% of the inputs")
        return records

    def _batch_records(self, v, res, outs, checked, t0) -> list[AdaptiveInference]:
        B = v.batch
        host = (time.perf_counter() - t0) / B
        # Each inference carries its share of the run's cycles and counters.
        share = {k: c // B if isinstance(c, int) else [x // B for x in c]
                 for k, c in res.counters.items()}
        return [AdaptiveInference(o, res.cycles // B, dict(share), res.trace, bool(checked),
                                  index=self.n + i + 1, plan=(v.name,), model=v.model,
                                  events=list(self._fresh) if i == 0 else [],
                                  host_seconds=host)
                for i, o in enumerate(outs)]

    def _restore_generic(self) -> None:
        """Put the generic plan back on the device after a batch variant ran."""
        if self._on_device is self.model:
            return
        if self._on_device is not None and \
                self._on_device.const_image() != self.model.const_image():
            self.session.load()
        else:
            self.session.install(self.model)
        self._on_device = self.model
