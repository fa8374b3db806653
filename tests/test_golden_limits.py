"""Golden-model runs are bounded the way the RTL's are.

The golden device advances a run only while the host waits for it, so a program that
never ends costs a wait its timeout (the driver's DeviceError) or stops with TIMEOUT
at CYCLE_BUDGET, in well under a second, and the device stays usable.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from firmware import asm
from firmware.config import CONFIGS
from firmware.isa import ErrorCode
from host import cli
from host.cli import ExitCode
from host.device import GoldenDevice
from host.driver import STATUS_BUSY, STATUS_SWAP_PENDING, DeviceError, NPUDriver

SPIN = asm.assemble("li r8, 0\nspin: addi r8, r8, 1\nbr.always r0, r0, spin\nend")
GOOD = asm.assemble("li r9, 42\nend")
TABLE = [(0, 1024)]


def driver():
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    drv.load(SPIN, TABLE)
    return drv


def test_wait_times_out_on_an_endless_program():
    drv = driver()
    t0 = time.perf_counter()
    drv.write("CYCLE_BUDGET", 0)
    drv.start()
    with pytest.raises(DeviceError, match="no interrupt within 20000 cycles"):
        drv.wait(timeout_cycles=20_000)
    assert time.perf_counter() - t0 < 1.0
    assert drv.status() & STATUS_BUSY  # still running, as on the RTL
    with pytest.raises(DeviceError, match="no interrupt within 5000 cycles"):
        drv.wait(timeout_cycles=5_000)  # a later wait continues it
    bank = drv.active_bank  # a swap requested now is pending while the run lasts
    drv.write_program(GOOD)
    drv.set_partitions(TABLE)
    drv.swap(wait=False)
    assert drv.status() & STATUS_SWAP_PENDING and drv.active_bank == bank


def test_cycle_budget_stops_an_endless_program():
    drv = driver()
    t0 = time.perf_counter()
    st = drv.run(cycle_budget=30_000)
    assert time.perf_counter() - t0 < 1.0
    assert st.error == ErrorCode.TIMEOUT and 1 <= st.pc <= 2, st
    with pytest.raises(DeviceError, match="TIMEOUT"):
        st.check()
    assert 30_000 <= drv.counters()["cycles"] <= 30_000 + 8
    drv.load(GOOD, TABLE)  # the device is usable afterwards
    assert drv.run().ok and drv.regs()[9] == 42


def test_waiting_in_steps_changes_no_cycle():
    """A run waited for in small steps ends with the cycles and state of one wait."""
    gemm = asm.assemble_file("firmware/programs/gemm.s",
                             dict(QMUL=1 << 30, QSHIFT=12, QZP=3))
    ends = []
    for step in (10**9, 7):
        dev = GoldenDevice(CONFIGS["default"])
        dev.write_mem(0, np.arange(1 << 16, dtype=np.uint8).tobytes())
        drv = NPUDriver(dev)
        drv.load(gemm, [(i * 2048, 2048) for i in range(4)])
        drv.start(args=(0, 0x400, 0x800, 0x1000))
        waits = 1
        while not dev.wait_irq(step):
            waits += 1
        drv.write("IRQ_STATUS", 3)
        ends.append((drv.last_status(), drv.counters()["cycles"], drv.regs(),
                     dev.read_mem(0, 1 << 16)))
        assert ends[-1][0].ok and (waits > 10) == (step == 7), (ends[-1][:2], waits)
    assert ends[0] == ends[1]


def test_npu_reports_a_run_that_does_not_end(monkeypatch, capsys):
    """``npu run``: a program that never ends is a device error, one line, exit 5.

    (The golden timeline measured at compile time would refuse it first, as a bad
    model; it is skipped so the run on the device meets the program.)"""
    from host.adaptive import timeline
    monkeypatch.setattr(timeline, "attach_timeline", lambda model: model)
    write_program, wait = NPUDriver.write_program, NPUDriver.wait
    monkeypatch.setattr(NPUDriver, "write_program",
                        lambda self, words, version=None: write_program(self, SPIN, version))
    monkeypatch.setattr(NPUDriver, "wait",
                        lambda self, timeout_cycles=20_000: wait(self, timeout_cycles))
    t0 = time.perf_counter()
    code = cli.main(["run", "mlp", "--digits", "1", "--no-cache", "--no-check"])
    err = capsys.readouterr().err
    assert time.perf_counter() - t0 < 5.0
    assert code == ExitCode.DEVICE, err
    assert err.strip().splitlines() == ["npu: device error: no interrupt within 20000 cycles"]
