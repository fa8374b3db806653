"""The whole NPU under Verilator, driven by the host driver over AXI, against the golden model.

Each test runs a host scenario from :mod:`verif.scenarios`; the scenario compares
DRAM, registers, error status, the exact counters and the region trace with the
golden model bit for bit. Most run on the fast library (:func:`verif.fastsim.run_scenario`:
a C++ DRAM and driver, in-process); the cocotb testbench
(:func:`verif.rtl_device.run_scenario`: cocotbext-axi's AxiRam and AXI4-Lite master,
its pause generators) runs random programs and the bus errors under backpressure;
tests/test_fastsim.py holds the two paths equal on the hand-written programs, cost
programs and random ones. ``--regress`` adds a plain batch of random programs and the
bus errors without backpressure on the cocotb path. The NPU is built once per
configuration and path and cached under build/sim/.
"""

import json

import numpy as np
import pytest

from firmware import asm
from firmware.config import CONFIGS
from verif.fastsim import run_scenario
from verif.randprog import find_races, random_program
from verif.rtl_device import run_scenario as run_cocotb
from verif.scenarios import TABLE, VMAX_REUSE, program_jobs

# Random programs, all in one simulation: about 0.1 s each on the fast library (the
# golden model, the race check and the comparison in Python), about 0.34 s under cocotb
# (mostly the AXI4-Lite traffic of loading and checking them); --regress runs thousands.
RANDOM_COUNT = 240
RANDOM_COUNT_REGRESS = 2000
RANDOM_COUNT_COCOTB = 24


@pytest.mark.rtl
def test_hand_written_programs(seed):
    run_scenario("verif.scenarios:programs", "default", seed=seed)


@pytest.mark.rtl
def test_random_programs(seed, regress):
    """Constrained-random programs (loops, branches, tokens, tags, regions): RTL == golden."""
    count = RANDOM_COUNT_REGRESS if regress else RANDOM_COUNT
    print(f"\n{count} random programs on the default NPU (seed {seed})")
    run_scenario("verif.scenarios:random_programs", "default", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": str(count)})


@pytest.mark.rtl
@pytest.mark.slow
def test_random_programs_cocotb(seed, regress):
    """A batch of them on the cocotb testbench (the backpressure batch below and the
    fast path's equality with this one, tests/test_fastsim.py, cover it in make test)."""
    count = RANDOM_COUNT_COCOTB * (10 if regress else 1)
    run_cocotb("verif.scenarios:random_programs", "default", seed=seed + 2,
               extra_env={"NPU_RANDOM_COUNT": str(count)})


@pytest.mark.rtl
def test_random_programs_with_backpressure(seed, regress):
    """The same under random AXI backpressure on every DRAM channel (the fast
    library's seeded pauses)."""
    count = 200 if regress else 40
    print(f"\n{count} random programs under backpressure (seed {seed + 1})")
    run_scenario("verif.scenarios:random_programs", "default", seed=seed + 1,
                 backpressure=True, extra_env={"NPU_RANDOM_COUNT": str(count)})


@pytest.mark.rtl
def test_random_programs_with_backpressure_cocotb(seed, regress):
    """... and under cocotbext-axi's pause generators."""
    count = 200 if regress else 8
    run_cocotb("verif.scenarios:random_programs", "default", seed=seed + 1,
               backpressure=True, extra_env={"NPU_RANDOM_COUNT": str(count)})


@pytest.mark.rtl
def test_errors(seed):
    """Every error code the golden model raises, reported identically; the NPU recovers."""
    run_scenario("verif.scenarios:errors", "default", seed=seed)


@pytest.mark.rtl
def test_bus_errors(seed):
    """Loads and stores touching a SLVERR/DECERR window: BUS_ERROR status as golden, no
    hang, and the next runs are bit-exact."""
    run_scenario("verif.scenarios:bus_errors", "default", seed=seed)


@pytest.mark.rtl
@pytest.mark.slow
def test_bus_errors_cocotb(seed):
    """The same with cocotbext-axi's RAM answering the errors (make test runs them on
    it under backpressure)."""
    run_cocotb("verif.scenarios:bus_errors", "default", seed=seed)


@pytest.mark.rtl
def test_bus_errors_with_backpressure(seed):
    run_scenario("verif.scenarios:bus_errors", "default", seed=seed + 1, backpressure=True)


@pytest.mark.rtl
def test_bus_errors_with_backpressure_cocotb(seed):
    run_cocotb("verif.scenarios:bus_errors", "default", seed=seed + 1, backpressure=True)


@pytest.mark.rtl
def test_timeouts(seed):
    """Endless programs stop with TIMEOUT within the cycle budget; the next run is good."""
    run_scenario("verif.scenarios:timeouts", "default", seed=seed)


@pytest.mark.rtl
def test_hot_swap(seed):
    """Swap under load: every back-to-back run is all-A or all-B, none lost or doubled."""
    run_scenario("verif.scenarios:hot_swap", "default", seed=seed)


@pytest.mark.rtl
def test_swap_adds_no_cycle(seed, tmp_path):
    """A hot swap between back-to-back runs costs no cycle over a plain run boundary."""
    out = tmp_path / "swap.json"
    run_scenario("verif.scenarios:swap_stall", "default", seed=seed,
                 extra_env={"NPU_BENCH_OUT": str(out)})
    figures = json.loads(out.read_text())
    assert figures["swap_stall_cycles"] == 0, figures


@pytest.mark.rtl
def test_golden_cost_model_is_exact(seed):
    """Every kind of instruction alone, back to back and through each token channel
    takes as many cycles on the RTL as the golden cost model says (plus a run's
    fixed cost)."""
    run_scenario("verif.scenarios:cost_model", "default", seed=seed)


@pytest.mark.rtl
@pytest.mark.parametrize("mnk, tiling", [
    ("64,128,64", "32,2,4"),  # 2 m-blocks x 4 groups x 4 chunks: every token path
    ("24,16,24", "24,3,1"),  # one group, one chunk
])
def test_gemm_kernel(seed, mnk, tiling, tmp_path):
    """The streaming GEMM template (firmware.kernels.gemm_stream) on the RTL: C equals
    numpy and the golden model, with DMA overlapping compute (tokens must be race-free)."""
    out = tmp_path / "gemm.json"
    run_scenario("verif.scenarios:gemm_bench", "default", seed=seed,
                 extra_env={"NPU_GEMM_MNK": mnk, "NPU_GEMM_TILING": tiling,
                            "NPU_BENCH_OUT": str(out)})
    mb, ng, kc = map(int, tiling.split(","))
    assert json.loads(out.read_text())["tiling"] == {"mb": mb, "ng": ng, "kc": kc}


@pytest.mark.rtl
@pytest.mark.slow
def test_random_programs_small_config(seed, regress):
    count = 500 if regress else 50
    print(f"\n{count} random programs on the small NPU (seed {seed})")
    run_scenario("verif.scenarios:random_programs", "small", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": str(count)})


# ---- race freedom (golden model only) ---------------------------------------------------
# The RTL runs the queues concurrently, the golden model in program order: they can only
# be compared on programs whose every conflicting access pair is ordered.


def test_random_programs_are_race_free(seed, regress):
    """Generated programs are race-free on both configurations. Seed 5014 (default) had
    a ``loop 0`` skip the sync before buffers were recycled; the RTL lost that race."""
    count = 600 if regress else 60  # about 40 ms a program on the loaded machine
    for name in ("default", "small"):
        config = CONFIGS[name]
        for s in [5014, *range(seed * 10_000, seed * 10_000 + count)]:
            rp = random_program(config, s)
            races = find_races(config, rp.program, rp.partitions, rp.dram, runs=2)
            assert not races, f"{name} program seed {s} races:\n" + "\n".join(races) + \
                f"\n--- program ---\n{rp.source}"


def test_hand_written_jobs_are_race_free(seed):
    for job in program_jobs(seed):
        races = find_races(CONFIGS["default"], job.program, job.partitions, job.dram,
                           job.args, runs=job.runs)
        assert not races, f"{job.name} (seed {seed}): " + "\n".join(races)


def test_race_check_finds_unordered_reuse(seed):
    """Without its sync, VMAX_REUSE reloads the vmax source while the vmax may still
    read it, and the second vmax overwrites what the first store may still read."""
    assert VMAX_REUSE.count("    sync\n") == 1
    dram = {0x300: np.random.default_rng(seed).integers(-128, 128, 112, dtype=np.int8)}
    racy = asm.assemble(VMAX_REUSE.replace("    sync\n", ""))
    races = find_races(CONFIGS["default"], racy, TABLE, dram, (0x300, 0x1100))
    assert len(races) == 2, races
    assert "load (load) writes sp" in races[0] and "read #5 of the compute queue" in races[0]
    assert "vmax (compute) writes sp" in races[1] and "the store queue" in races[1]
    # Tokens order it as well as the sync: the reload waits for the first vmax, the
    # second pool for the first store.
    tokens = (VMAX_REUSE.replace("    sync\n", "")
              .replace("vmax p2, r0, p0, r0, 3, 9, push=next", "vmax p2, r0, p0, r0, 3, 9, "
                       "push=next|prev")
              .replace("r0, 18, 6, push=next", "r0, 18, 6, push=next, pop=next")
              .replace("3, 9, pop=prev", "3, 9, pop=prev, push=prev")
              .replace("cfg.pool_count 2, pop=prev", "cfg.pool_count 2, pop=prev|next"))
    assert find_races(CONFIGS["default"], asm.assemble(tokens), TABLE, dram,
                      (0x300, 0x1100)) == []
