"""Soak: thousands of runs and hot swaps on the NPU, with random bus faults.

The bundled MLP runs through one :class:`~host.runtime.Session` (``check=True``:
every result is compared with the reference interpreter), alternating between two
plans of the model (two units, and both fused into one) by hot swaps staged while
the NPU runs. Some runs meet a bus fault (a random erroring window over the
model's constants or activations): such a run must report ``BUS_ERROR`` and the
next run must be right again (the device stays usable). Nothing may be lost: every
run ends in a checked result or a reported fault, and every staged swap lands.

On the RTL (the Verilator library, ``rtl=True``) every run also meets random DRAM
backpressure (pauses on a seeded share of the cycles, 0 to 60 %), and a golden
model twin runs the same inputs, plans, swaps and fault windows in lockstep: the
RTL's outputs, exact counters and trace records must equal the twin's, its errors
the twin's (code, pc and address), and its cycles the twin's on every run without
backpressure where the golden model promises them (``RunResult.cycles_exact``);
the figures count how often the cycles agree where it does not.

``make bench-soak`` runs 10,000 golden runs with 1,000 swaps and 1,000 RTL runs
with 100 swaps (``ARGS=golden`` or ``ARGS=rtl`` for one) and writes both into
``bench/results/soak.json``; ``tests/test_soak.py`` runs short soaks in ``make
test`` and the full ones in ``make regress``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import numpy as np

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import RESP_DECERR, RESP_SLVERR, GoldenDevice
from host.driver import DeviceError, NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Inference, Session
from verif.scenarios import assert_same_inference, golden_cycles_exact

from .common import RESULTS, report

MODEL = "host/models/mlp.onnx"
BACKPRESSURE_PERCENTS = (0, 0, 10, 30, 60)  # per RTL run; 0 twice: cycles checked there


class SoakError(AssertionError):
    """The RTL and its golden twin disagree, or a run failed without a fault."""


def plans(config):
    """The MLP's initial plan (one unit per layer) and its fused plan (one unit)."""
    base = compile_model(load_onnx(MODEL), config, fuse=False)
    fused = compile_model(base.graph, config, [[n for u in base.units for n in u.nodes]],
                          simplified=True)
    return base, fused


def _open_rtl(config):
    from host.verilator_device import VerilatorDevice

    return VerilatorDevice.open(config)


def _attempt(session: Session, x: dict, stage) -> Inference | str:
    """One run: its checked inference, or the error the NPU reported (its code, pc
    and address: "BUS_ERROR at pc 2 (address 0x0)")."""
    try:
        return session.run(x, while_running=stage)
    except DeviceError as err:
        return str(err).removeprefix("NPU error ")


def soak(runs: int, swaps: int, seed: int, fault_rate: float = 0.05, rtl: bool = False) -> dict:
    """Run the soak on the golden model (or the RTL with its golden twin); return its
    figures. A result that differs from the reference (``MismatchError``), an error in
    a run without a fault window, or an RTL run unlike its twin's (:class:`SoakError`)
    ends it."""
    rng = np.random.default_rng(seed)
    config = CONFIGS["default"]
    models = plans(config)
    devices = [_open_rtl(config), GoldenDevice(config)] if rtl else [GoldenDevice(config)]
    sessions = [Session(NPUDriver(d), models[0], check=i == 0) for i, d in enumerate(devices)]
    for s in sessions:
        s.load()
    npu = sessions[0]
    regions = [(npu.arena_base, models[0].place.arena_bytes),  # activations
               (npu.const_base, models[0].place.const_bytes)]  # weights, tags dropped
    swap_every = max(1, runs // max(swaps, 1))
    outcomes: Counter = Counter()
    faults: Counter = Counter()
    landed = staged = recovered = pending = 0
    t0 = time.perf_counter()
    cycles0 = devices[0].cycle() if rtl else 0
    for i in range(runs):
        x = {"input": rng.uniform(0, 16, (1, 64)).astype(np.float32)}
        swap = staged < swaps and i % swap_every == swap_every - 1
        other = models[1] if npu.model is models[0] else models[0]
        faulted = rng.random() < fault_rate
        windows = []
        if faulted:
            outcomes["fault windows"] += 1
            base, size = regions[int(rng.random() < 0.3)]
            if base == npu.const_base:
                for s in sessions:
                    s.driver.invalidate_tags()  # so the weights are read again
            lo = base + int(rng.integers(0, size))
            windows = [(lo, lo + int(rng.integers(1, 64)),
                        (RESP_SLVERR, RESP_DECERR)[int(rng.integers(2))])]
        percent = 0
        if rtl:
            percent = int(rng.choice(BACKPRESSURE_PERCENTS))
            devices[0].set_backpressure(int(rng.integers(1 << 62)), percent)
            outcomes["runs under backpressure"] += percent > 0
        inexact = devices[-1].machine.inexact_runs
        results = []
        for s, dev in zip(sessions, devices, strict=True):
            dev.set_bus_faults(windows)
            stage = (lambda s=s, other=other: s.stage(other)) if swap else None
            try:
                results.append(_attempt(s, x, stage))
            finally:
                dev.set_bus_faults([])
        got = results[0]
        if isinstance(got, str) and not faulted:
            raise SoakError(f"run {i}: NPU error {got} without a fault window")
        if rtl:
            # cycles must agree where the memory never paused and the golden model
            # promises them; elsewhere without pauses, the soak counts how often they do
            vouched = golden_cycles_exact(devices[1], inexact)
            _compare(i, got, results[1], cycles=percent == 0 and vouched)
            if percent == 0 and not isinstance(got, str):
                kind = "vouched" if vouched else "unvouched"
                outcomes[f"cycles {kind}"] += 1
                outcomes[f"cycles {kind}, equal"] += got.cycles == results[1].cycles
        if isinstance(got, str):
            faults[got.split()[0]] += 1
            outcomes["fault reported"] += 1
            pending += 1
        else:
            outcomes["checked"] += 1
            recovered, pending = recovered + pending, 0
        if swap:
            staged += 1
            landed += sessions[0].confirm()
            for twin in sessions[1:]:
                twin.confirm()
    seconds = time.perf_counter() - t0
    # the device is usable afterwards: one more run, no fault window
    npu.run({"input": rng.uniform(0, 16, (1, 64)).astype(np.float32)})
    recovered += pending
    figures = {
        "runs": runs, "swaps_staged": staged, "swaps_landed": landed,
        "checked_results": outcomes["checked"], "fault_windows": outcomes["fault windows"],
        "faulted_runs": outcomes["fault reported"],
        "faults_by_code": dict(faults), "faults_followed_by_a_checked_run": recovered,
        "seconds": round(seconds, 2), "runs_per_second": round(runs / seconds, 1),
        "seed": seed, "fault_rate": fault_rate,
    }
    if rtl:
        figures.update({
            "runs_under_backpressure": outcomes["runs under backpressure"],
            "runs_cycles_checked": outcomes["cycles vouched"],
            "runs_cycles_not_vouched": outcomes["cycles unvouched"],
            "runs_cycles_not_vouched_equal": outcomes["cycles unvouched, equal"],
            "npu_cycles": devices[0].cycle() - cycles0,
        })
        devices[0].close()
    return figures


def _compare(i: int, rtl: Inference | str, gold: Inference | str, cycles: bool) -> None:
    """Check an RTL run against its golden twin's: the same error, or the same
    outputs, exact counters and trace (and with ``cycles`` the same cycles)."""
    if isinstance(rtl, str) or isinstance(gold, str):
        if rtl != gold:
            raise SoakError(f"run {i}: the RTL ended in {_outcome(rtl)}, its golden twin "
                            f"in {_outcome(gold)}")
        return
    try:
        assert_same_inference(f"run {i}", rtl, gold, cycles=cycles)
    except AssertionError as err:
        raise SoakError(str(err)) from None


def _outcome(r: Inference | str) -> str:
    return f"error {r}" if isinstance(r, str) else "a result"


def save(kind: str, figures: dict) -> None:
    """Print ``figures`` and keep them as section ``kind`` ("golden", "rtl") of
    bench/results/soak.json, beside the other kind's."""
    path = RESULTS / "soak.json"
    sections = {}
    if path.is_file():
        old = json.loads(path.read_text())
        sections = {k: old[k] for k in ("golden", "rtl") if isinstance(old.get(k), dict)}
    sections[kind] = figures
    report("soak", sections)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kinds", nargs="*", choices=["golden", "rtl"], default=["golden", "rtl"])
    for kind in p.parse_args(argv).kinds:
        if kind == "golden":
            save("golden", soak(runs=10_000, swaps=1_000, seed=1))
        else:
            save("rtl", soak(runs=1_000, swaps=100, seed=1, rtl=True))


if __name__ == "__main__":
    main()
