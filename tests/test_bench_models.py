"""``make bench-models``'s figures for one model that runs and one the compiler refuses.

The benchmark reports what is true today; these check that its figures hang
together (utilization, roofline, status), not what they are.
"""

import dataclasses

import pytest

from bench.models import TARGETS, measure
from firmware.config import CONFIGS
from host.compiler import CompileError, compile_model
from host.onnx_import import load_onnx
from verif.zoo.workload import workload

PEAK = CONFIGS["default"].peak_macs_per_cycle
BUS = CONFIGS["default"].bus_bytes


def test_a_running_model_has_consistent_figures():
    row, compiled = measure("cnn")
    assert compiled is not None and row["checked"] and row["status"] == "runs on the NPU"
    assert row["npu_macs"] == row["macs"] == 23_680
    assert row["mac_utilization"] == pytest.approx(row["npu_macs"] / (row["cycles"] * PEAK))
    assert row["bound_cycles"] == round(max(row["macs"] / PEAK, row["min_dram_bytes"] / BUS))
    assert row["cycles"] >= row["bound_cycles"]  # nothing beats the roofline
    assert row["dram_read_bytes"] > 0 and row["busy_compute"] > 0
    assert row["target_cycles"] is None
    # The default plan is fused; the per-layer plan's cycles stand beside it.
    assert row["units"] < row["per_layer_units"] == 5
    assert row["per_layer_cycles"] > row["cycles"] and row["fusion"]


def test_a_refused_model_reports_the_compilers_reason():
    from host.models import MLPERF_DIR

    path = MLPERF_DIR / "mobilenet_v1_025.onnx"
    # units of hundreds of instructions fit no 100-instruction page
    narrow = dataclasses.replace(CONFIGS["default"], imem_depth=100)
    with pytest.raises(CompileError) as refused:
        compile_model(load_onnx(path, allow_cpu_fallback=True), narrow, paging=True)
    reason = str(refused.value).splitlines()[0]
    row, compiled = measure("mobilenet_v1_025", narrow)
    assert compiled is None and row["status"] == "does not compile" and row["reason"] == reason
    assert row["target_cycles"] == TARGETS["mobilenet_v1_025"]
    assert row["macs"] == workload(path).macs and row["bound_by"] == "compute"
    assert "cycles" not in row


def test_a_model_with_a_cpu_node_meets_its_target_only_in_cycles():
    # DS-CNN's quantized Softmax runs on the CPU: whatever its cycles, it is not whole on
    # the NPU, and the benchmark says both.
    row, _ = measure("ds_cnn", targets={"ds_cnn": 10**9})
    assert row["status"] == "runs, part on the CPU" and "Softmax" in row["cpu_ops"]
    assert row["cycles_meet_target"] and not row["meets_target"]
