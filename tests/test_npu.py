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
