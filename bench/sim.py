"""``make bench-sim``: 100 inputs of ResNet-8 on the Verilator NPU, through the host driver.

The model (``host/models/mlperf/resnet8.onnx``, imported as ``npu run --cpu-fallback``
does) runs on the fast simulation library (:class:`host.verilator_device.VerilatorDevice`,
its profile-guided build, built or reused as ``npu run --backend verilator`` does) in a
checked session: every output equals the reference interpreter's. The golden model
runs the same inputs in order in a second process (the machine's other core), and
each RTL inference equals
its golden twin: outputs, exact counters and trace fields, and cycles wherever the
golden run says they are exact. The reference interpreter is held to onnxruntime
(``ORT_DISABLE_ALL``) on every input, within 1 LSB on every int8 tensor
(:func:`verif.zoo.layerwise.layer_errors`).

Inputs: the model's four sample inputs, then seeded random ones drawn per channel
with the samples' mean and spread, quantized by the model's own input quantizer as
the samples are.

Reports wall seconds and where they went: the library's build (or cache look-up),
simulation (the library's calls that run the clock), host (everything else on the RTL
side: compile, driver, reference interpreter, comparisons, waiting for the golden
model), the simulated cycles and cycles per second; and the same in CPU seconds, which
hold on a shared machine: this process's from start to end (the run's critical path,
the build excluded) and the golden process's.
Writes ``bench/results/sim.json``. Run with ``python -m bench.sim [--inputs N]
[--model NAME] [--seed S] [--plain]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

from bench.common import report
from firmware.config import CONFIGS
from host.cli import model_path
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from host.verilator_device import VerilatorDevice
from verif.model_scenarios import model_inputs
from verif.scenarios import assert_same_inference, golden_cycles_exact
from verif.zoo.layerwise import layer_errors

CONFIG = "default"
MODEL = "resnet8"
INPUTS = 100


def bench_inputs(name: str, graph, count: int, seed: int) -> list[dict]:
    """The model's sample inputs, then seeded random ones like them, ``count`` in all."""
    samples = model_inputs(name, graph)
    inp = graph.inputs[0]
    stack = np.stack([s[inp] for s in samples])
    axes = tuple(i for i in range(stack.ndim) if i != 2)  # (sample, batch, channel, ...)
    mean = stack.mean(axis=axes, keepdims=True)[0]
    spread = stack.std(axis=axes, keepdims=True)[0]
    rng = np.random.default_rng(seed)
    shape = stack.shape[1:]
    extra = [{inp: (mean + spread * rng.standard_normal(shape)).astype(np.float32)}
             for _ in range(max(0, count - len(samples)))]
    return (samples + extra)[:count]


# ---- the golden side, in its own process -----------------------------------------------
_golden = None


def _golden_start(name: str) -> None:
    global _golden
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    device = GoldenDevice(CONFIGS[CONFIG])
    session = Session(NPUDriver(device), compile_model(graph, device.config))
    session.load()
    _golden = session


def _golden_run(inputs: dict):
    """One golden inference, whether its cycles are exact, and the process's CPU time."""
    device = _golden.driver.device
    mark = device.machine.inexact_runs
    result = _golden.run(inputs)
    return result, golden_cycles_exact(device, mark), time.process_time()


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _reference_vs_onnxruntime(name: str, inputs: list[dict]) -> tuple[int, float]:
    """The worst int8 tensor difference, in LSBs, of the interpreter vs onnxruntime,
    and the seconds it took to find."""
    t = time.perf_counter()
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    rows = np.stack([i[graph.inputs[0]] for i in inputs])
    errors = layer_errors(graph, model_path(name), rows)
    return max(errors.values()), time.perf_counter() - t


def run(name: str = MODEL, count: int = INPUTS, seed: int = 1, profiled: bool = True) -> dict:
    """Run the benchmark; return its figures (see the module docstring)."""
    started, started_cpu = time.perf_counter(), time.process_time()
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    inputs = bench_inputs(name, graph, count, seed)
    pool = multiprocessing.get_context("spawn").Pool(1, _golden_start, (name,))
    try:
        golden = pool.imap(_golden_run, inputs)  # starts at once, the build meanwhile
        oracle = pool.apply_async(_reference_vs_onnxruntime, (name, inputs))  # then this
        t, children = time.perf_counter(), _children_cpu()
        device = VerilatorDevice.open(CONFIGS[CONFIG], on_status=print, profiled=profiled)
        build, build_cpu = time.perf_counter() - t, _children_cpu() - children
        try:
            t, cpu = time.perf_counter(), time.process_time()
            driver = NPUDriver(device)
            session = Session(driver, compile_model(graph, driver.config), check=True)
            session.load()
            cycles, exact_runs, golden_cpu = [], 0, 0.0
            for i, x in enumerate(inputs):
                rtl = session.run(x)
                gold, exact, golden_cpu = next(golden)
                assert rtl.checked
                assert_same_inference(f"{name} input #{i}", rtl, gold, cycles=exact)
                cycles.append(rtl.cycles)
                exact_runs += exact
            rtl_side, rtl_cpu = time.perf_counter() - t, time.process_time() - cpu
            simulation, simulation_cpu = device.clock_seconds, device.clock_cpu_seconds
        finally:
            device.close()
        t = time.perf_counter()
        worst_lsb, oracle_seconds = oracle.get()
        waited = time.perf_counter() - t
    finally:
        pool.terminate()  # all it owes is in, or a check failed and the rest is moot
    assert worst_lsb <= 1, f"the reference interpreter is {worst_lsb} LSB off onnxruntime"
    wall, process_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    total = int(sum(cycles))
    return {
        "model": name, "config": CONFIG, "inputs": count, "seed": seed,
        "library": "profile-guided" if profiled else "plain",
        "outputs_equal_reference": True,
        "outputs_counters_trace_equal_golden": True,
        "inputs_with_cycles_equal_golden": exact_runs,
        "reference_vs_onnxruntime_worst_lsb": int(worst_lsb),
        "rtl_cycles_total": total,
        "rtl_cycles_first": cycles[0],
        "rtl_cycles_mean_warm": round(float(np.mean(cycles[1:] or cycles))),
        "wall_seconds": round(wall, 1),
        "wall_seconds_without_build": round(wall - build, 1),
        "build_seconds": round(build, 1),
        "simulation_seconds": round(simulation, 1),
        "host_seconds": round(rtl_side - simulation, 1),
        "onnxruntime_check_seconds": round(oracle_seconds, 1),
        "onnxruntime_check_waited_seconds": round(waited, 1),
        "simulated_cycles_per_second": round(total / simulation),
        "end_to_end_cycles_per_second": round(total / rtl_side),
        # CPU seconds: what the run costs whatever else the machine does
        "build_cpu_seconds": round(build_cpu, 1),
        # this process from start to end (the build is a subprocess's): the run's
        # critical path, since the golden process runs beside it on the other core
        "process_cpu_seconds": round(process_cpu, 1),
        "simulation_cpu_seconds": round(simulation_cpu, 1),
        "host_cpu_seconds": round(rtl_cpu - simulation_cpu, 1),
        "golden_process_cpu_seconds": round(golden_cpu, 1),
        "simulated_cycles_per_cpu_second": round(total / simulation_cpu),
        "load_average_1min": round(os.getloadavg()[0], 1),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__)
    ap.add_argument("--model", default=MODEL, help=f"a bundled model (default {MODEL})")
    ap.add_argument("--inputs", type=int, default=INPUTS, help="inferences (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random inputs")
    ap.add_argument("--plain", action="store_true",
                    help="the library's ordinary build, not the profile-guided one")
    opts = ap.parse_args(argv)
    report("sim", run(opts.model, opts.inputs, opts.seed, not opts.plain))


if __name__ == "__main__":
    main()
