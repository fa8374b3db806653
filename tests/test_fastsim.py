"""The fast simulation library (verif/fastsim) against the cocotb testbench.

Both run the same RTL; the fast one with a C++ DRAM and driver in-process, the cocotb
one with cocotbext-axi's AxiRam and AXI4-Lite master. The same programs must give the
same results and take the same NPU cycles on both (and equal the golden model, which
every scenario checks).
"""

import json
import subprocess
import sys

import pytest

from verif import fastsim
from verif.rtl_device import run_scenario as run_cocotb

pytestmark = pytest.mark.rtl  # builds and runs the RTL under Verilator

FINGERPRINT = "verif.fastsim.scenarios:fingerprint"


def test_fast_path_equals_cocotb_path(seed, tmp_path):
    """Per run: status, every counter (cycles, busy and stall cycles too), the length
    of every traced region and a digest of DRAM are equal on both paths."""
    runs = {}
    for name, run in (("fast", fastsim.run_scenario), ("cocotb", run_cocotb)):
        out = tmp_path / f"{name}.json"
        run(FINGERPRINT, "default", seed=seed, extra_env={"NPU_FINGERPRINT_OUT": str(out)})
        runs[name] = json.loads(out.read_text())
    assert len(runs["fast"]) == len(runs["cocotb"]) > 10
    for fast, slow in zip(runs["fast"], runs["cocotb"], strict=True):
        assert fast == slow, f"{fast['job']}: fast {fast}\ncocotb {slow}"


def test_run_boundaries_equal_cocotb_path(seed, tmp_path):
    """The cycles at which runs start and finish around a hot swap (recorded by the
    harness in C++, by cocotb triggers on the same signals) give the same gaps."""
    figures = {}
    for name, run in (("fast", fastsim.run_scenario), ("cocotb", run_cocotb)):
        out = tmp_path / f"{name}.json"
        run("verif.scenarios:swap_stall", "default", seed=seed,
            extra_env={"NPU_BENCH_OUT": str(out)})
        figures[name] = json.loads(out.read_text())
    assert figures["fast"] == figures["cocotb"]


def test_library_is_cached(tmp_path):
    """A second build of an unchanged design reuses the library (no Verilator run)."""
    cmd = [sys.executable, "-m", "verif.fastsim.build", "--config", "default"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    again = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lib = first.stdout.strip().splitlines()[-1]
    assert again.stdout.strip().splitlines()[-1] == lib
    assert lib.endswith("libnpusim.so")


def test_backpressure_changes_timing_not_results(seed, tmp_path):
    """DRAM pauses drawn from a seed slow a GEMM down; its results stay golden (the
    scenario checks them), and the same seed gives the same cycles."""
    def cycles(backpressure: bool) -> int:
        out = tmp_path / "gemm.json"
        fastsim.run_scenario("verif.scenarios:gemm_bench", "default", seed=seed,
                             backpressure=backpressure,
                             extra_env={"NPU_GEMM_MNK": "32,64,32", "NPU_BENCH_OUT": str(out)})
        return json.loads(out.read_text())["rtl_cycles"]

    plain, paused, again = cycles(False), cycles(True), cycles(True)
    assert paused > plain and paused == again


def test_npu_runs_a_model_on_the_verilator_backend():
    """``npu run --backend verilator``: in-process, checked against the reference."""
    done = subprocess.run([sys.executable, "-m", "host.cli", "run", "mlp", "--backend",
                           "verilator", "--digits", "3"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3/3 results equal the reference interpreter" in done.stdout
    # one progress line for the build, nothing of the build's own output
    mentions = [line for line in done.stdout.splitlines() if "Verilator" in line]
    assert len(mentions) == 1 and mentions[0].startswith("npu: the Verilator NPU"), mentions
