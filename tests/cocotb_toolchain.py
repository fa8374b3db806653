"""cocotb side of the toolchain smoke test (run by ``tests/test_toolchain.py``).

Not collected by pytest (the file name does not start with ``test_``); it is
imported inside the Verilator simulation by cocotb.  The stimulus and the
reference model are plain Python so the Amaranth-simulator test can reuse
them.
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

WIDTH = 8
CYCLES = 600
RESET_AT = 450  # one synchronous reset pulse after the counter has wrapped


def stimulus(seed: int = 2024, cycles: int = CYCLES) -> list[tuple[int, int]]:
    """Return the per-cycle ``(rst, en)`` inputs, identical for every simulator."""
    rng = random.Random(seed)
    stim = []
    for cycle in range(cycles):
        rst = int(cycle < 2 or cycle == RESET_AT)
        en = int(rng.random() < 0.75)
        stim.append((rst, en))
    return stim


def reference(stim: list[tuple[int, int]], bias: int = 0) -> list[int]:
    """Return the expected ``count`` before each cycle and after the last one.

    ``bias`` deliberately breaks the model; it exists only so that
    ``test_toolchain`` can prove a failing cocotb test fails pytest.
    """
    count = 0
    expected = [count]
    for rst, en in stim:
        count = 0 if rst else (count + en + bias) % (1 << WIDTH)
        expected.append(count)
    return expected


@cocotb.test()
async def counter_counts_only_when_enabled(dut):
    """``count`` increments (mod 256) exactly on enabled cycles; ``rst`` clears it."""
    stim = stimulus()
    expected = reference(stim, bias=int(os.environ.get("TOOLCHAIN_MODEL_BIAS", "0")))
    assert sum(en for rst, en in stim[2:RESET_AT]) > (1 << WIDTH), "stimulus must wrap"

    # Inputs are defined before the first clock edge so nothing counts early.
    dut.rst.value = 1
    dut.en.value = 0
    Clock(dut.clk, 10, unit="ns").start()

    # Drive and sample on the falling edge: clear of the rising edge that updates count.
    for cycle, (rst, en) in enumerate(stim):
        await FallingEdge(dut.clk)
        got = int(dut.count.value)
        assert got == expected[cycle], f"cycle {cycle}: count={got}, expected {expected[cycle]}"
        dut.rst.value = rst
        dut.en.value = en
    await FallingEdge(dut.clk)
    assert int(dut.count.value) == expected[-1]
