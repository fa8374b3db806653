"""Limits on every run: a cycle budget and a wall-clock timeout, on any backend.

A run's cycle budget is written to the NPU's CYCLE_BUDGET register, so the NPU
itself stops a program that does not end (error TIMEOUT) and stays usable. The
wall-clock timeout bounds the host's wait for the interrupt, for a device that
stops answering (a board, a simulation that no longer advances). Both default to
figures derived from the compiled program's cost-model estimate; ``npu run
--cycle-budget N --timeout S`` overrides them (0: no limit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

BUDGET_FACTOR = 16  # the estimate is a steady-state figure; cold runs and misfits take more
MIN_BUDGET = 100_000  # cycles: covers the estimate's error on small programs
MIN_TIMEOUT_S = 10.0
# The slowest backend's speed (the RTL under Verilator with cocotb): a budget's
# worth of cycles takes at most this long there.
SLOWEST_CYCLES_PER_S = 10_000
MAX_BUDGET = (1 << 32) - 1  # CYCLE_BUDGET is a 32-bit register
FIRST_SLICE = 4096  # cycles of the first wait; later ones double while they are quick
SLICE_S = 0.05  # wall seconds a wait slice aims at, so a timeout is noticed promptly


class LimitExceeded(RuntimeError):
    """A run went past its cycle budget or its wall-clock timeout (not a device
    fault: the device did what it was told, for longer than allowed).

    Members
    -------
    option : the ``npu run`` option that sets the limit (``--cycle-budget``,
        ``--timeout``).
    """

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class RunLimits:
    """The limits of one run (one start of the NPU).

    Members
    -------
    cycle_budget : NPU cycles; None derives it from the program's estimate, 0
        means none.
    timeout_s : wall-clock seconds of waiting; None derives it from the cycle
        budget, 0 means none.
    """

    cycle_budget: int | None = None
    timeout_s: float | None = None

    def __post_init__(self):
        if self.cycle_budget is not None and not 0 <= self.cycle_budget <= MAX_BUDGET:
            raise ValueError(f"cycle_budget={self.cycle_budget}: 0 (none) to {MAX_BUDGET}")
        if self.timeout_s is not None and not self.timeout_s >= 0:
            raise ValueError(f"timeout_s={self.timeout_s}: at least 0 (0: none)")

    def resolve(self, estimate_cycles: float) -> RunLimits:
        """These limits with every derived figure filled in for a program whose
        cost-model estimate is ``estimate_cycles`` per run."""
        budget = self.cycle_budget
        if budget is None:
            budget = min(MAX_BUDGET, max(MIN_BUDGET, int(BUDGET_FACTOR * estimate_cycles)))
        timeout = self.timeout_s
        if timeout is None:
            timeout = MIN_TIMEOUT_S + (budget or MAX_BUDGET) / SLOWEST_CYCLES_PER_S
        return RunLimits(budget, timeout)


def estimate_cycles(model) -> float:
    """Cost-model cycles of one inference of a compiled model: every unit once (a
    unit in an untaken branch counted too, so it is an upper figure)."""
    from .compiler.cost import CostModel

    cost = CostModel(model.config)
    return sum(cost.predict(u.resources["work"]) for u in model.units
               if "work" in u.resources)


def wait_cycles(budget: int) -> int | None:
    """How long the host waits, in cycles, for a run whose NPU-side budget is
    ``budget``: past it, so the NPU's own TIMEOUT is what the host sees."""
    return 2 * budget + FIRST_SLICE if budget else None


def wait_irq_within(device, cycles: int | None, seconds: float | None,
                    clock=time.monotonic) -> str | None:
    """Wait for ``device``'s interrupt in slices; None when it came, else the limit
    that ran out first (``"cycles"`` or ``"seconds"``; None/0 for no limit).

    Slices start small and double while they take little wall time, so a device of
    any speed is checked against the deadline every :data:`SLICE_S` or so.
    """
    deadline = clock() + seconds if seconds else None
    waited, step = 0, FIRST_SLICE
    while True:
        n = step if cycles is None else min(step, cycles - waited)
        t0 = clock()
        if device.wait_irq(n):
            return None
        waited += n
        if cycles is not None and waited >= cycles:
            return "cycles"
        now = clock()
        if deadline is not None and now >= deadline:
            return "seconds"
        if now - t0 < SLICE_S:
            step *= 2
