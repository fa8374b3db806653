"""Run compiled models on an NPU: one code path for every backend.

A :class:`Session` owns one compiled model on one :class:`~host.driver.NPUDriver`:
it writes the constants into DRAM once, the program and its partition table into
the shadow bank, swaps them in, and then runs inferences. Each inference runs the
model's CPU nodes (the boundary Quantize/Dequantize, CPU fallbacks, the CPU tails
of branches) on the host and its NPU segments on the device, reading back only
the tensors the host needs. With ``check=True`` every result is compared with
the reference interpreter and a mismatch raises :class:`MismatchError`.

A program larger than an instruction bank (``CompiledModel.pages``) runs page by
page, each page staged in the shadow bank while the one before it runs
(:class:`~host.pager.Pager`).

Every NPU run is bounded by the driver's :class:`~host.limits.RunLimits`,
resolved against the running plan's cost-model estimate: a program that does not
end raises :class:`~host.limits.LimitExceeded` instead of running on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.golden import TraceRecord
from firmware.isa import ErrorCode

from .compiler import CompiledModel
from .compiler.lower import scope_tensors
from .driver import STATUS_SWAP_PENDING, NPUDriver
from .ir import Equal, Graph, If, Node
from .limits import LimitExceeded, RunLimits, estimate_cycles, wait_cycles
from .pager import Pager
from .reference import eval_node, run_reference, to_external, to_internal

PAGE = 4096


class MismatchError(AssertionError):
    """The NPU's result differs from the reference interpreter's."""


@dataclass
class Inference:
    """One inference: outputs as the outside sees them, and what it cost.

    Members
    -------
    outputs : graph output name -> value.
    cycles : NPU cycles of its runs (counter delta).
    counters : every counter's delta over the inference.
    trace : the region-trace records of its runs (one per unit that ran).
    checked : True when compared with the reference interpreter (and equal).
    scalars : the NPU's scalar results (ArgMax tensors that drove its branches).
    host_writes : CSR writes the host made for it (starts, acknowledgements, trace
        pops, the pages a paged program stages).
    page_runs : runs of a paged program's pages (0: the program fits a bank).
    late_pages : of them, runs that had ended before the host staged the next page.
    page_counters : with ``Session.count_pages``, every counter's delta over each
        page run, in run order.
    """

    outputs: dict
    cycles: int
    counters: dict
    trace: list[TraceRecord] = field(default_factory=list)
    checked: bool = False
    scalars: dict = field(default_factory=dict)
    host_writes: int = 0
    page_runs: int = 0
    late_pages: int = 0
    page_counters: list[dict] = field(default_factory=list)


class Session:
    """One compiled model loaded on one NPU.

    Parameters
    ----------
    driver : the NPU.
    model : the compiled model.
    check : compare every inference with the reference interpreter.
    const_base, arena_base : DRAM addresses of the constants and the activation
        arena (defaults: constants at 0, the arena on the next page).

    Members
    -------
    count_pages : read the counters after every page run of a paged program
        (``Inference.page_counters``; for comparing backends page by page).
    """

    def __init__(self, driver: NPUDriver, model: CompiledModel, *, check: bool = False,
                 const_base: int = 0, arena_base: int | None = None):
        if driver.config != model.config:
            raise ValueError(f"the model was compiled for {model.config}, the device is "
                             f"{driver.config}")
        self.driver, self.model, self.check = driver, model, check
        self.const_base = const_base
        end = const_base + model.place.const_bytes
        self.arena_base = arena_base if arena_base is not None else -(-end // PAGE) * PAGE
        self.version = 0
        self.index = _GraphIndex(model.graph)
        self.pager: Pager | None = None
        self.count_pages = False

    # ---- program management --------------------------------------------------------
    def load(self, invalidate_tags: bool = True) -> None:
        """Write constants, program and partitions; swap them in.

        Tags are invalidated by default: another model's tiles may sit where this
        one's resident weights go.
        """
        self.driver.write_mem(self.const_base, self.model.const_image())
        self.install(self.model, invalidate_tags=invalidate_tags)

    def install(self, model: CompiledModel, *, invalidate_tags: bool = False,
                wait: bool = True) -> int:
        """Hot-swap to another program of the same model (a fused or split plan).

        Its constants must already be in DRAM (plans of one model share them).
        Returns the new bank version.
        """
        if model.place.const_bytes and model.const_image() != self.model.const_image():
            self.driver.write_mem(self.const_base, model.const_image())
            invalidate_tags = True
        self.version += 1
        if model.pages:
            self.pager = Pager(self.driver, model)
            self.pager.install(self.version, invalidate_tags)
        else:
            self.pager = None
            self.driver.write_program(model.program, version=self.version, changed_only=True)
            self.driver.set_partitions(model.partitions)
            if invalidate_tags:
                self.driver.invalidate_tags()
            self.driver.swap(wait=wait)
        self.model = model
        self.index = _GraphIndex(model.graph)
        return self.version

    def stage(self, model: CompiledModel) -> int:
        """Write another plan of the same model into the shadow bank and request the
        swap without waiting: it lands at the next run boundary, so this may be
        called while the NPU runs (see ``run(..., while_running=)``). Its constants
        must equal the current plan's (tags stay valid). Returns the new version;
        :meth:`confirm` checks it after the next run.
        """
        if model.place.const_bytes and model.const_image() != self.model.const_image():
            raise ValueError("a staged plan must share the running plan's constants "
                             "(install() rewrites them between runs)")
        if model.pages or self.pager is not None:
            raise ValueError("a program larger than an instruction bank pages through "
                             "the shadow bank: no plan can be staged there (install() "
                             "changes plans between runs)")
        self.version += 1
        self.driver.write_program(model.program, version=self.version, changed_only=True)
        self.driver.set_partitions(model.partitions)
        self.driver.swap(wait=False)
        self._staged = model
        return self.version

    def confirm(self) -> bool:
        """After a staged swap landed: the active bank carries the staged version.

        Switches the session to the staged plan and returns True; False (and no
        switch) while the swap is still pending.
        """
        staged = getattr(self, "_staged", None)
        if staged is None:
            return True
        if self.driver.status() & STATUS_SWAP_PENDING:
            return False
        got = self.driver.bank_version(self.driver.active_bank)
        if got != self.version:
            raise RuntimeError(f"after the swap the active bank holds version {got}, "
                               f"expected {self.version}")
        self.model, self._staged = staged, None
        self.index = _GraphIndex(staged.graph)
        return True

    def limits(self) -> RunLimits:
        """The running plan's limits: the driver's, derived figures filled in from
        the plan's cost-model estimate."""
        key = (self.model, self.driver.limits)
        cached = getattr(self, "_limits", None)
        if cached is None or cached[0] is not key[0] or cached[1] != key[1]:
            self._limits = (*key, key[1].resolve(estimate_cycles(self.model)))
        return self._limits[2]

    # ---- inference ------------------------------------------------------------------
    def run(self, inputs: dict, while_running=None) -> Inference:
        """One inference on ``inputs`` (graph input name -> array).

        ``while_running`` is called once while the NPU runs the inference's last
        segment (the adaptive runtime stages a new plan there); a swap it requests
        lands after this inference, which finishes on the plan it started with.
        """
        if while_running is not None and self.pager is not None:
            # A paged program's staging writes the shadow bank: nothing else may.
            raise ValueError(f"{self.model.graph.name}'s program pages through the "
                             "shadow bank: nothing can be staged while it runs")
        before = self.driver.counters()
        self.driver.read_trace()  # drop records of earlier, unrelated runs
        writes = self.driver.reg_writes
        paging = (self.pager.runs, self.pager.late) if self.pager else (0, 0)
        ex = _Executor(self, inputs, while_running)
        outputs = ex.run()
        after = self.driver.counters()
        delta = {k: _sub(after[k], before[k]) for k in after}
        result = Inference(outputs, delta["cycles"], delta, ex.trace, scalars=ex.scalars,
                           host_writes=self.driver.reg_writes - writes,
                           page_counters=ex.page_counters)
        if self.pager:
            result.page_runs = self.pager.runs - paging[0]
            result.late_pages = self.pager.late - paging[1]
        if self.check:
            expected = run_reference(self.model.graph, inputs)
            for name, want in expected.items():
                got = outputs[name]
                if got.shape != want.shape or not np.array_equal(got, want):
                    raise MismatchError(f"output {name!r}: NPU {got.ravel()[:16]} != "
                                        f"reference {want.ravel()[:16]}")
            result.checked = True
        return result

    def run_many(self, batch: list[dict], progress=None) -> list[Inference]:
        """Run inferences one after another (``progress`` called after each)."""
        return run_each(self.run, batch, progress)


def _sub(a, b):
    if isinstance(a, list):
        return [x - y for x, y in zip(a, b, strict=True)]
    return a - b


class _GraphIndex:
    """Producers and tensors of every scope of a graph (computed once per model)."""

    def __init__(self, g: Graph):
        self.prod: dict[str, Node] = {o: n for _, n in g.walk() for o in n.outputs}
        self.tensors = scope_tensors(g)


class _Executor:
    """The host side of one inference: CPU stages, NPU segments, lazy reads."""

    def __init__(self, session: Session, inputs: dict, while_running=None):
        self.s = session
        self.while_running = while_running
        self.last_segment = session.model.segments - 1
        self.m = session.model
        g = self.m.graph
        self.env: dict[str, np.ndarray] = {}
        for name in g.inputs:
            if name not in inputs:
                raise ValueError(f"missing input {name!r}")
            self.env[name] = to_internal(g.tensors[name], inputs[name])
        extra = set(inputs) - set(g.inputs)
        if extra:
            raise ValueError(f"unknown inputs {sorted(extra)}")
        self.written: set[str] = set()
        self.trace: list[TraceRecord] = []
        self.page_counters: list[dict] = []
        self.scalars: dict[str, int] = {}
        self.prod = session.index.prod
        self.tensors = session.index.tensors

    def run(self) -> dict:
        g, stages = self.m.graph, self.m.stages
        last = max(stages.values(), default=0)
        segment = 0
        for s in range(last + 2):  # one CPU stage past the last segment: If tails
            if s % 2 == 0:
                for n in g.nodes:
                    if stages[n.name] == s and n.device == "cpu":
                        self._cpu(n)
                    elif isinstance(n, If) and stages[n.name] == s - 1:
                        self._finish_if(n)
            elif any(v == s for v in stages.values()):
                self._segment(segment)
                segment += 1
        return {o: to_external(g.tensors.get(o), self.value(o), o) for o in g.outputs}

    def _segment(self, k: int):
        drv, m = self.s.driver, self.m
        for r, off in m.place.arena.items():
            p = self.prod.get(r)
            on_npu = p is not None and p.device == "npu"
            if not on_npu and r not in self.written and r in self.env:
                data = m.layouts[r].to_device(self.env[r]).astype(np.int8)
                drv.write_mem(self.s.arena_base + off, data)
                self.written.add(r)
        pager = self.s.pager
        if pager is None:
            self._start(k)
            if k == self.last_segment and self.while_running is not None:
                self.while_running()
            self._wait()
            self.trace += drv.read_trace()
            self._results(m.result_regs)
            return
        # Page by page: each next page is staged while the one before it runs, and
        # started as soon as that run ends (the trace is read while it runs).
        pages = pager.pages_of(k)
        pager.bring(pages[0])
        before = drv.counters() if self.s.count_pages else None
        self._start(k)
        for n, i in enumerate(pages):
            pager.stage_next()
            self._wait()
            pager.check_landed()
            if before is not None:
                after = drv.counters()
                self.page_counters.append({c: _sub(after[c], before[c]) for c in after})
                before = after
            self._results({t: m.result_regs[t] for t in m.pages[i].results})
            if n + 1 < len(pages):
                self._start(k)
            self.trace += drv.read_trace()

    def _start(self, k: int):
        """Start a run of segment ``k`` on the active bank."""
        self.s.driver.write("CYCLE_BUDGET", self.s.limits().cycle_budget)
        self.s.driver.start(args=(self.s.const_base, self.s.arena_base, k))

    def _wait(self):
        """Wait for the run to end; raise if it did not end well."""
        lim = self.s.limits()
        status = self.s.driver.wait(timeout_cycles=wait_cycles(lim.cycle_budget),
                                    timeout_s=lim.timeout_s)
        if status.error == ErrorCode.TIMEOUT:
            raise LimitExceeded(f"the run stopped at its cycle budget of {lim.cycle_budget} "
                                f"cycles (pc {status.pc}; the program's estimate is "
                                f"{estimate_cycles(self.m):.0f} cycles per inference)",
                                option="--cycle-budget")
        status.check()

    def _results(self, result_regs: dict[str, int]):
        """Read the scalar results the run left in registers."""
        if not result_regs:
            return
        regs = self.s.driver.regs()
        for t, r in result_regs.items():
            v = regs[r] - (1 << 32) if regs[r] >= 1 << 31 else regs[r]
            self.env[t] = np.full(self.tensors[t].shape, v, dtype=np.int64)
            self.scalars[t] = v

    def value(self, t: str) -> np.ndarray:
        if t in self.env:
            return self.env[t]
        tensor = self.tensors[t]
        p = self.prod.get(t)
        if p is None:
            if tensor.data is None:
                raise KeyError(f"tensor {t!r} has no value")
            v = tensor.data
        elif p.device == "npu" and p.op in ("Flatten", "Reshape"):
            v = self.value(p.inputs[0]).reshape(tensor.shape)
        elif isinstance(p, Equal):
            v = np.asarray(self.value(p.inputs[0]) == p.value)
        elif t in self.m.place.arena:
            raw = self.s.driver.read_mem(self.s.arena_base + self.m.place.arena[t], tensor.size)
            v = self.m.read_tensor(raw, t, tensor.shape)
        else:
            raise KeyError(f"tensor {t!r} ({p.op} {p.name}) was not computed")
        self.env[t] = v
        return v

    def _cpu(self, n: Node):
        outs = eval_node(n, [self.value(i) for i in n.inputs])
        for o, v in zip(n.outputs, outs, strict=True):
            self.env[o] = v

    def _finish_if(self, n: If):
        """Follow the branch the NPU took; run its CPU tail; bind the If's outputs."""
        branch: Graph = n.then_graph if bool(self.value(n.inputs[0]).reshape(-1)[0]) \
            else n.else_graph
        for inner in branch.nodes:
            if isinstance(inner, If):
                self._finish_if(inner)
            elif inner.device == "cpu":
                self._cpu(inner)
        for o, bo in zip(n.outputs, branch.outputs, strict=True):
            self.env[o] = self.value(bo)


def run_each(run, batch: list[dict], progress=None) -> list:
    """``[run(inputs) for inputs in batch]``, calling ``progress(done, total)`` after each
    (the ``run_many`` of every runtime)."""
    out = []
    for i, inputs in enumerate(batch):
        out.append(run(inputs))
        if progress is not None:
            progress(i + 1, len(batch))
    return out
