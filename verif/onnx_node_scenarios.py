"""The ONNX backend node test cases on the RTL, next to the golden model.

A scenario for :func:`verif.fastsim.run_scenario`: many cases in one simulation
(one Verilator build, one reset), each compiled for the device's configuration and
loaded in turn on the same NPU. Environment:

- ``NPU_ONNX_CASES``: case names of :data:`verif.onnx_cases.CASES`, comma-separated
  (default: all of them);
- ``NPU_ONNX_MIN_NPU``: at least this many cases must have run on the NPU
  (default 1);
- ``NPU_ONNX_RANDOM``: seeded random input sets per case beyond ONNX's data sets
  (default 1).
"""

from __future__ import annotations

import os

import numpy as np

from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.onnx_cases import CASES, check_expected, freeze_case, load_case, npu_nodes
from verif.scenarios import assert_same_inference, golden_cycles_exact


def random_inputs(like: dict, rng: np.random.Generator) -> dict:
    """Random inputs of the dtypes and shapes of ``like`` (integers over their full range)."""
    out = {}
    for k, v in like.items():
        if v.dtype == np.bool_:
            out[k] = rng.integers(0, 2, size=v.shape).astype(np.bool_)
        elif np.issubdtype(v.dtype, np.integer):
            info = np.iinfo(v.dtype)
            out[k] = rng.integers(info.min, info.max, size=v.shape, endpoint=True,
                                  dtype=v.dtype)
        else:
            out[k] = rng.standard_normal(v.shape).astype(v.dtype)
    return out


def _agree(where: str, sessions, inputs) -> tuple:
    """Run ``inputs`` on the RTL's and the golden model's session: both checked, equal
    outputs, exact counters and trace fields, and cycles where the golden model counts
    them exactly. Returns the two inferences."""
    gold_device = sessions[1].driver.device
    mark = gold_device.machine.inexact_runs
    rtl, gold = (s.run(inputs) for s in sessions)
    assert rtl.checked and gold.checked, f"{where}: not checked against the reference"
    assert_same_inference(where, rtl, gold, cycles=golden_cycles_exact(gold_device, mark))
    return rtl, gold


def node_cases_vs_golden(device, config, seed):
    """Run ONNX node cases on the RTL and on the golden model side by side.

    For every data set of every case with nodes placed on the NPU: the RTL's
    outputs equal ONNX's expected outputs exactly (the rule of
    :func:`verif.onnx_cases.check_expected`), the reference interpreter's
    (``Session(check=True)``) and the golden model's; the exact counters and
    trace fields agree, cycles too where the golden model counts them exactly. Seeded
    random input sets get the same checks except
    ONNX's (it has no expected outputs for them). Cases placed entirely on the CPU
    are skipped with a note. Raises ``AssertionError`` on a mismatch or when fewer
    than ``NPU_ONNX_MIN_NPU`` cases ran on the NPU.
    """
    names = [n for n in os.environ.get("NPU_ONNX_CASES", ",".join(sorted(CASES))).split(",")
             if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise KeyError(f"unknown ONNX node cases {unknown}")
    need = int(os.environ.get("NPU_ONNX_MIN_NPU", "1"))
    randoms = int(os.environ.get("NPU_ONNX_RANDOM", "1"))
    rng = np.random.default_rng(seed)
    # One golden NPU for the whole run: it sees the same loads and runs as the RTL.
    drivers = (NPUDriver(device), NPUDriver(GoldenDevice(config)))
    ran, skipped, inferences = [], [], 0
    for name in names:
        model, sets = load_case(name)
        assert sets, f"{name} has no data sets"
        for d, (ins, outs) in enumerate(sets):
            frozen, consts = freeze_case(name, model, ins)
            graph = load_onnx(frozen, allow_cpu_fallback=CASES[name][1])
            if not npu_nodes(graph):
                print(f"{name}: skipped, every node runs on the CPU (nothing for the NPU)")
                skipped.append(name)
                break
            compiled = compile_model(graph, config)
            sessions = [Session(drv, compiled, check=True) for drv in drivers]
            for s in sessions:
                s.load()
            where = f"{name} data set {d}"
            rtl, gold = _agree(where, sessions, ins)
            check_expected(name, model, rtl.outputs, ins, consts, outs)
            inferences += 1
            for r in range(randoms):
                extra = random_inputs(ins, rng)
                rtl, gold = _agree(f"{name} random set {r} (seed {seed})", sessions, extra)
                inferences += 1
            print(f"{where}: {npu_nodes(graph)} NPU node(s), {rtl.counters['instructions']} "
                  f"instructions, {rtl.cycles} RTL cycles; equals ONNX, the reference and "
                  f"the golden model (+{randoms} random set(s))")
        else:
            ran.append(name)
    print(f"ONNX node cases on the RTL ({config.rows}x{config.cols}): {len(ran)} ran "
          f"({inferences} inferences), {len(skipped)} skipped (CPU only)")
    assert len(ran) >= need, f"only {len(ran)} NPU cases ran ({ran}), expected {need}"
