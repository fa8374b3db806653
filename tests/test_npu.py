"""The whole NPU under Verilator, driven by the host driver over AXI, against the golden model.

Each test runs a host scenario from :mod:`verif.scenarios` inside the simulator
(:func:`verif.rtl_device.run_scenario`); the scenario compares DRAM, registers, error
status, the exact counters and the region trace with the golden model bit for bit.
The NPU is built once per configuration and cached under build/sim/.
"""

import json

import pytest

from verif.rtl_device import run_scenario

# Random programs, all in one simulation: about 0.34 s each on the loaded 2-core
# machine (mostly the AXI4-Lite traffic of loading and checking them), so the default
# fits about 60 s; --regress runs thousands.
RANDOM_COUNT = 160
RANDOM_COUNT_REGRESS = 2000


def test_hand_written_programs(seed):
    run_scenario("verif.scenarios:programs", "default", seed=seed)


def test_random_programs(seed, regress):
    """Constrained-random programs (loops, branches, tokens, tags, regions): RTL == golden."""
    count = RANDOM_COUNT_REGRESS if regress else RANDOM_COUNT
    print(f"\n{count} random programs on the default NPU (seed {seed})")
    run_scenario("verif.scenarios:random_programs", "default", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": str(count)})


def test_random_programs_with_backpressure(seed, regress):
    """The same under random AXI backpressure on every DRAM channel."""
    count = 200 if regress else 8
    print(f"\n{count} random programs under backpressure (seed {seed + 1})")
    run_scenario("verif.scenarios:random_programs", "default", seed=seed + 1,
                 backpressure=True, extra_env={"NPU_RANDOM_COUNT": str(count)})


def test_errors(seed):
    """Every error code the golden model raises, reported identically; the NPU recovers."""
    run_scenario("verif.scenarios:errors", "default", seed=seed)


def test_bus_errors(seed):
    """Loads and stores touching a SLVERR/DECERR window: BUS_ERROR status as golden, no
    hang, and the next runs are bit-exact."""
    run_scenario("verif.scenarios:bus_errors", "default", seed=seed)


def test_bus_errors_with_backpressure(seed):
    run_scenario("verif.scenarios:bus_errors", "default", seed=seed + 1, backpressure=True)


def test_timeouts(seed):
    """Endless programs stop with TIMEOUT within the cycle budget; the next run is good."""
    run_scenario("verif.scenarios:timeouts", "default", seed=seed)


def test_hot_swap(seed):
    """Swap under load: every back-to-back run is all-A or all-B, none lost or doubled."""
    run_scenario("verif.scenarios:hot_swap", "default", seed=seed)


def test_swap_adds_no_cycle(seed, tmp_path):
    """A hot swap between back-to-back runs costs no cycle over a plain run boundary."""
    out = tmp_path / "swap.json"
    run_scenario("verif.scenarios:swap_stall", "default", seed=seed,
                 extra_env={"NPU_BENCH_OUT": str(out)})
    figures = json.loads(out.read_text())
    assert figures["swap_stall_cycles"] == 0, figures


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


@pytest.mark.slow
def test_random_programs_small_config(seed, regress):
    count = 500 if regress else 50
    print(f"\n{count} random programs on the small NPU (seed {seed})")
    run_scenario("verif.scenarios:random_programs", "small", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": str(count)})
