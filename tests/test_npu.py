"""The whole NPU under Verilator, driven by the host driver over AXI, against the golden model.

Each test runs a host scenario from :mod:`verif.scenarios` inside the simulator
(:func:`verif.rtl_device.run_scenario`); the scenario compares DRAM, registers, error
status, the exact counters and the region trace with the golden model bit for bit.
The NPU is built once per configuration and cached under build/sim/.
"""

import pytest

from verif.rtl_device import run_scenario


def test_hand_written_programs(seed):
    run_scenario("verif.scenarios:programs", "default", seed=seed)


def test_random_programs(seed, regress):
    """Constrained-random programs (loops, branches, tokens, tags, regions): RTL == golden."""
    count = 200 if regress else 12
    run_scenario("verif.scenarios:random_programs", "default", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": str(count)})


def test_random_programs_with_backpressure(seed):
    """The same under random AXI backpressure on every DRAM channel."""
    run_scenario("verif.scenarios:random_programs", "default", seed=seed + 1,
                 backpressure=True, extra_env={"NPU_RANDOM_COUNT": "4"})


def test_errors(seed):
    """Every error code the golden model raises, reported identically; the NPU recovers."""
    run_scenario("verif.scenarios:errors", "default", seed=seed)


def test_hot_swap(seed):
    """Swap under load: every back-to-back run is all-A or all-B, none lost or doubled."""
    run_scenario("verif.scenarios:hot_swap", "default", seed=seed)


@pytest.mark.slow
def test_random_programs_small_config(seed):
    run_scenario("verif.scenarios:random_programs", "small", seed=seed,
                 extra_env={"NPU_RANDOM_COUNT": "50"})
