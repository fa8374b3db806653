"""Unit cycles from the golden model's timeline, before the device runs a plan.

The golden model's cost model takes the RTL's cycles wherever a run is marked
`RunResult.cycles_exact` (tests/test_golden.py pins each timing mechanism), and
comes within a few cycles elsewhere. So the best prediction of what a freshly
compiled plan's units will cost is to run the plan on the golden model: twice,
on zero inputs, and take each region's cycles from the warm second run (its
weights hit their tags, as in steady state).

What this does not see: a region inside a branch the zero inputs do not take
(it has no figure, and the linear model predicts it), data-dependent loop counts
(none in the compiler's output), and a device whose memory is slower than the
simulation's (:class:`~host.compiler.cost.CostModel` refits a per-transfer
extra latency for that).
"""

from __future__ import annotations

import numpy as np

from ..compiler import CompiledModel, CompileError
from ..device import GoldenDevice
from ..driver import NPUDriver
from ..runtime import Session


def zero_inputs(model: CompiledModel) -> dict:
    """Every graph input of ``model`` as zeros, in the dtype the runtime takes."""
    g = model.graph

    def dtype(t):
        if t.io_dtype == "uint8":
            return np.uint8
        return np.int8 if t.dtype == "int8" else np.float32  # int8 in: int8 values

    return {name: np.zeros(g.tensors[name].shape, dtype(g.tensors[name])) for name in g.inputs}


def timeline_cycles(model: CompiledModel) -> dict[int, float]:
    """Region id -> warm cycles per run of that region on the golden model (the
    mean when a region runs more than once per inference)."""
    session = Session(NPUDriver(GoldenDevice(model.config)), model, check=False)
    x = zero_inputs(model)
    try:
        session.load()
        session.run(x)  # cold: the tags fill
        trace = session.run(x).trace
    except RuntimeError as e:  # an NPU error (a compiler bug): refuse the plan before it
        # is swapped in, as the device would fault on it too
        raise CompileError(f"the compiled plan faults on the golden model: {e}") from e
    runs: dict[int, list[int]] = {}
    for rec in trace:
        if not rec.tag_misses:
            runs.setdefault(rec.region, []).append(rec.cycles)
    return {r: float(np.mean(c)) for r, c in runs.items()}


def attach_timeline(model: CompiledModel) -> CompiledModel:
    """Write each measured region's golden cycles into its work (key ``timeline``),
    which :class:`~host.compiler.cost.CostModel` predicts from first."""
    for region, cycles in timeline_cycles(model).items():
        unit = model.regions.get(region)
        if unit is not None and "work" in unit.resources:
            unit.resources["work"]["timeline"] = cycles
    return model
