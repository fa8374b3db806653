"""Soak: thousands of runs and hot swaps on the golden NPU, with random bus faults.

The bundled MLP runs through one :class:`~host.runtime.Session` (``check=True``:
every result is compared with the reference interpreter), alternating between two
plans of the model (two units, and both fused into one) by hot swaps staged while
the NPU runs. Some runs meet a bus fault (a random erroring window over the
model's constants or activations): such a run must report ``BUS_ERROR`` and the
next run must be right again (the device stays usable). Nothing may be lost: every
run ends in a checked result or a reported fault, and every staged swap lands.

``make bench-soak`` runs 10,000 runs and 1,000 swaps and writes
``bench/results/soak.json``; ``tests/test_soak.py`` runs a short soak in ``make
test`` and the full one in ``make regress``.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import DeviceError, NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session

from .common import report

MODEL = "host/models/mlp.onnx"


def plans(config):
    """The MLP's initial plan (one unit per layer) and its fused plan (one unit)."""
    base = compile_model(load_onnx(MODEL), config)
    fused = compile_model(base.graph, config, [[n for u in base.units for n in u.nodes]],
                          simplified=True)
    return base, fused


def soak(runs: int, swaps: int, seed: int, fault_rate: float = 0.05) -> dict:
    """Run the soak; return its figures. A result that differs from the reference
    (``MismatchError``) or an error in a run without a fault window ends it."""
    rng = np.random.default_rng(seed)
    config = CONFIGS["default"]
    models = plans(config)
    session = Session(NPUDriver(GoldenDevice(config)), models[0], check=True)
    session.load()
    dev = session.driver.device
    regions = [(session.arena_base, models[0].place.arena_bytes),  # activations
               (session.const_base, models[0].place.const_bytes)]  # weights, tags dropped
    swap_every = max(1, runs // max(swaps, 1))
    outcomes: Counter = Counter()
    faults: Counter = Counter()
    landed = staged = recovered = pending = 0
    t0 = time.perf_counter()
    for i in range(runs):
        x = {"input": rng.uniform(0, 16, (1, 64)).astype(np.float32)}
        stage = None
        if staged < swaps and i % swap_every == swap_every - 1:
            other = models[1] if session.model is models[0] else models[0]
            stage = lambda other=other: session.stage(other)  # noqa: E731
        faulted = rng.random() < fault_rate
        if faulted:
            outcomes["fault windows"] += 1
            base, size = regions[int(rng.random() < 0.3)]
            if base == session.const_base:
                session.driver.invalidate_tags()  # so the weights are read again
            lo = base + int(rng.integers(0, size))
            dev.set_bus_faults([(lo, lo + int(rng.integers(1, 64)), 2)])
        try:
            session.run(x, while_running=stage)
            outcomes["checked"] += 1
            recovered, pending = recovered + pending, 0
        except DeviceError as err:
            if not faulted:
                raise
            code = str(err).split()[2]  # "NPU error BUS_ERROR at pc ..."
            faults[code] += 1
            outcomes["fault reported"] += 1
            pending += 1
        finally:
            dev.set_bus_faults([])
        if stage is not None:
            staged += 1
            landed += session.confirm()
    seconds = time.perf_counter() - t0
    # the device is usable afterwards: one more run, no fault window
    session.run({"input": rng.uniform(0, 16, (1, 64)).astype(np.float32)})
    recovered += pending
    return {
        "runs": runs, "swaps_staged": staged, "swaps_landed": landed,
        "checked_results": outcomes["checked"], "fault_windows": outcomes["fault windows"],
        "faulted_runs": outcomes["fault reported"],
        "faults_by_code": dict(faults), "faults_followed_by_a_checked_run": recovered,
        "seconds": round(seconds, 2), "runs_per_second": round(runs / seconds, 1),
        "seed": seed, "fault_rate": fault_rate,
    }


def main():
    report("soak", soak(runs=10_000, swaps=1_000, seed=1))


if __name__ == "__main__":
    main()
