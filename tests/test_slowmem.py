"""The slow-memory hardware profile: a DRAM with extra latency (firmware.bursts.DramLatency)
in the golden model, the fast library's C++ DRAM and the cocotb testbench's AxiRam.

The latency is the memory's: the NPU build, its CAPS and the compiled programs are the
default ones; only the cycles change, and the golden model counts them as the RTL does.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from firmware.asm import assemble
from firmware.bursts import DramLatency
from firmware.config import CONFIGS
from firmware.golden import Machine
from host.cli import main as npu
from host.compiler import compile_model
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.models import model_path
from host.onnx_import import load_onnx
from host.profiles import PROFILES, dram_latency, profile, profile_name
from host.runtime import Session
from verif.scenarios import COST_ARGS, TABLE

SLOW = DramLatency(read=40, write=40)

# Cycles of whole runs (with `li r9, 64` first where a stride is used) measured on the
# fast Verilator library behind a DRAM of latency 40/40 (tests/test_slowmem.py's
# RTL tests check every COST_PROGRAMS entry the same way): one burst per row of up
# to 8 beats.
MEASURED_AT_40 = {
    "load p0, r0, r0, r0, 1, 8": 59,  # one burst: the latency once
    "load p0, r0, r0, r0, 4, 8": 179,  # four one-beat bursts: 40 + 3 x 39 more
    "li r9, 64\nload p0, r0, r0, r9, 8, 24": 350,  # eight 3-beat bursts: 40 + 7 x 38
    "load p0, r0, r0, r0, 1, 1000": 183,  # 125 beats, one burst
    "store p0, r0, r0, r0, 1, 64": 69,
    "li r9, 64\nstore p0, r0, r0, r9, 16, 8": 664,  # a response wait per burst
    "li r9, 256\nstore p0, r0, r0, r9, 16, 24": 696,  # ... and its beats after the first two
}


def _cycles(source: str, latency: DramLatency) -> tuple[int, bool]:
    m = Machine(CONFIGS["default"], dram_latency=latency)
    r = m.load_and_run(assemble(source + "\nend\n"), TABLE, args=COST_ARGS)
    return r.cycles, r.cycles_exact


def test_latency_is_zero_or_a_modelled_value():
    assert not DramLatency() and DramLatency(read=16) and DramLatency(write=100)
    for bad in ({"read": 8}, {"write": -1}, {"read": 1.5}):
        with pytest.raises(ValueError, match="must be 0 or an integer >= 16"):
            DramLatency(**bad)


def test_read_gaps_hide_what_the_r_queue_holds():
    assert DramLatency().read_gaps([1, 2, 3]) == [0, 0, 0]
    assert DramLatency(read=40).read_gaps([1, 2, 3, 8]) == [40, 39, 38, 38]
    assert DramLatency(read=40).read_gaps([]) == []


@pytest.mark.parametrize("source", MEASURED_AT_40)
def test_golden_cycles_equal_the_measured_rtl_cycles(source):
    cycles, exact = _cycles(source, SLOW)
    assert (cycles, exact) == (MEASURED_AT_40[source], True)


def test_no_latency_leaves_the_cost_model_alone():
    for source in MEASURED_AT_40:
        assert _cycles(source, DramLatency()) == _cycles(source, None)
        assert _cycles(source, SLOW)[0] > _cycles(source, None)[0]


def test_slowmem_profile_is_the_default_build_behind_a_slow_dram():
    assert profile("slowmem") == CONFIGS["default"]
    assert profile_name(profile("slowmem")) == "default"  # the CAPS say the build only
    assert dram_latency("slowmem").read >= 40 and dram_latency("slowmem").write >= 40
    assert not any(dram_latency(n) for n in PROFILES if n != "slowmem")
    with pytest.raises(KeyError, match="known profiles"):
        dram_latency("ddr5")


def test_the_compiler_plans_without_the_latency():
    """The same program for both profiles: the latency is only measured."""
    graph = load_onnx(model_path("cnn"))
    a, b = (compile_model(graph, profile(n)) for n in ("default", "slowmem"))
    assert a.program.to_bytes() == b.program.to_bytes()


def test_model_outputs_equal_the_reference_behind_a_slow_dram():
    digits = load_digits_split(seed=0).x_test
    graph = load_onnx(model_path("cnn"))
    model = compile_model(graph, CONFIGS["default"])
    cycles = {}
    for name, latency in (("fast", None), ("slow", dram_latency("slowmem"))):
        session = Session(NPUDriver(GoldenDevice(CONFIGS["default"], dram_latency=latency)),
                          model, check=True)
        session.load()
        runs = [session.run({graph.inputs[0]: x.reshape(1, 1, 8, 8).astype(np.float32)})
                for x in digits[:3]]
        assert all(r.checked for r in runs)
        cycles[name] = runs[-1].cycles
    assert cycles["slow"] > cycles["fast"]


def test_npu_run_takes_a_profile(capsys):
    assert npu(["run", "mlp", "--digits", "2", "--profile", "slowmem"]) == 0
    assert "2/2 results equal the reference interpreter" in capsys.readouterr().out
    assert npu(["run", "mlp", "--profile", "slowmem", "--backend", "serial",
                "--port", "/dev/null"]) == 2
    assert "a board's memory is its own" in capsys.readouterr().err


def test_npu_run_refuses_a_profile_and_a_config():
    done = subprocess.run([sys.executable, "-m", "host.cli", "run", "mlp", "--profile",
                           "slowmem", "--config", "small"], capture_output=True, text=True)
    assert done.returncode == 2 and "not allowed with argument --profile" in done.stderr
    assert "Traceback" not in done.stderr


# ---- on the RTL ---------------------------------------------------------------------------------

# The least latency modelled and a read-heavy one; the slowmem profile's own behind
# --regress (the random programs and the model below run behind it).
LATENCIES = [DramLatency(16, 16), DramLatency(100, 40),
             pytest.param(DramLatency(64, 64), marks=pytest.mark.slow)]


@pytest.mark.rtl
@pytest.mark.parametrize("latency", LATENCIES, ids=["16_16", "100_40", "64_64"])
def test_cost_programs_cycle_exact_behind_a_slow_dram(latency, tmp_path):
    """Every COST_PROGRAMS entry takes the golden model's cycles on the fast library
    behind a slow DRAM (the scenario fails on any difference)."""
    from verif.fastsim import run_scenario

    out = tmp_path / "cost.json"
    run_scenario("verif.scenarios:cost_model", "default", dram_latency=latency,
                 extra_env={"NPU_BENCH_OUT": str(out)})
    figures = json.loads(out.read_text())
    assert len(figures) > 100
    assert all(f["rtl_cycles"] == f["golden_cycles"] for f in figures.values())


@pytest.mark.rtl
@pytest.mark.parametrize("config", ["default", "small"])
def test_random_programs_behind_a_slow_dram(config, seed, regress):
    """Random programs: RTL equals golden, cycles too on every run called exact."""
    from verif.fastsim import run_scenario

    count = 200 if regress else 20
    run_scenario("verif.scenarios:random_programs", config, seed=seed,
                 dram_latency=dram_latency("slowmem"),
                 extra_env={"NPU_RANDOM_COUNT": str(count)})


@pytest.mark.rtl
def test_fast_path_equals_cocotb_path_behind_a_slow_dram(seed, tmp_path):
    """The cocotb testbench's delayed AxiRam and the fast library's C++ DRAM wait
    alike: every counter, region and DRAM digest equal (and golden, as checked)."""
    from verif import fastsim
    from verif.rtl_device import run_scenario as run_cocotb

    runs = {}
    for name, run in (("fast", fastsim.run_scenario), ("cocotb", run_cocotb)):
        out = tmp_path / f"{name}.json"
        run("verif.fastsim.scenarios:fingerprint", "default", seed=seed,
            dram_latency=DramLatency(40, 64), extra_env={"NPU_FINGERPRINT_OUT": str(out)})
        runs[name] = json.loads(out.read_text())
    assert len(runs["fast"]) == len(runs["cocotb"]) > 10
    for fast, slow in zip(runs["fast"], runs["cocotb"], strict=True):
        assert fast == slow, f"{fast['job']}: fast {fast}\ncocotb {slow}"


@pytest.mark.rtl
def test_model_on_the_rtl_behind_a_slow_dram():
    """A bundled model on the fast library behind the slowmem DRAM: outputs equal the
    reference, every exact counter and trace field the golden model's."""
    from verif.fastsim import run_scenario

    run_scenario("verif.model_scenarios:model_vs_golden", "default",
                 dram_latency=dram_latency("slowmem"),
                 extra_env={"NPU_MODEL": "cnn", "NPU_INPUTS": "3"})
