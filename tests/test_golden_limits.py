"""Runs are bounded: a cycle budget and a wall-clock timeout on every run.

The golden device advances a run only while the host waits for it, so a program that
never ends costs a wait its timeout (the driver's DeviceError) or stops with TIMEOUT
at CYCLE_BUDGET, in well under a second, and the device stays usable. A Session
sets every run's budget from its program's estimate (host/limits.py); the driver's
wait gives up after the wall-clock timeout on any device.
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
from host.limits import (
    BUDGET_FACTOR,
    MIN_BUDGET,
    MIN_TIMEOUT_S,
    LimitExceeded,
    RunLimits,
    estimate_cycles,
)

SPIN = asm.assemble("li r8, 0\nspin: addi r8, r8, 1\nbr.always r0, r0, spin\nend")
GOOD = asm.assemble("li r9, 42\nend")
TABLE = [(0, 1024)]


def driver():
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    drv.load(SPIN, TABLE)
    return drv


def test_wait_times_out_on_an_endless_program():
    drv = driver()
    drv.write("CYCLE_BUDGET", 0)
    drv.start()
    with pytest.raises(DeviceError, match="no interrupt within 20000 cycles"):
        drv.wait(timeout_cycles=20_000)
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
    st = drv.run(cycle_budget=30_000)
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


def spin_instead_of_the_program(monkeypatch):
    """Every program ``npu run`` writes becomes SPIN. (The golden timeline measured at
    compile time would refuse it first, as a bad model; it is skipped so the run on
    the device meets the program.)"""
    from host.adaptive import timeline
    monkeypatch.setattr(timeline, "attach_timeline", lambda model: model)
    write_program = NPUDriver.write_program
    monkeypatch.setattr(NPUDriver, "write_program",
                        lambda self, words, version=None, **kw: write_program(self, SPIN,
                                                                              version))


@pytest.mark.parametrize("args, budget", [([], 100_000), (["--cycle-budget", "20000"], 20_000)])
def test_npu_stops_a_run_that_does_not_end(monkeypatch, capsys, args, budget):
    """``npu run``: a program that never ends stops at its cycle budget (by default
    derived from the program's estimate), one line naming the option, exit 7."""
    spin_instead_of_the_program(monkeypatch)
    code = cli.main(["run", "mlp", "--digits", "1", "--no-cache", "--no-check", *args])
    err = capsys.readouterr().err
    assert code == ExitCode.LIMIT, err
    line, = err.strip().splitlines()
    assert line.startswith(f"npu: the run stopped at its cycle budget of {budget} cycles"), line
    assert "raise it with --cycle-budget" in line


def test_npu_wall_clock_timeout_without_a_budget(monkeypatch, capsys):
    """With no cycle budget the wall-clock timeout still ends the wait."""
    spin_instead_of_the_program(monkeypatch)
    code = cli.main(["run", "mlp", "--digits", "1", "--no-cache", "--no-check",
                     "--cycle-budget", "0", "--timeout", "0.3"])
    err = capsys.readouterr().err
    assert code == ExitCode.LIMIT, err
    assert err.strip().splitlines() == [
        "npu: the run did not end within its timeout of 0.3 s (wall clock): a program that "
        "does not end, or a limit too tight for it (raise it with --timeout, 0 for none)"]


class SilentDevice(GoldenDevice):
    """A device that never raises its interrupt (a board that stopped answering)."""

    def __init__(self):
        super().__init__(CONFIGS["default"])
        self.waits = 0

    def wait_irq(self, timeout_cycles):
        self.waits += 1
        time.sleep(0.002)
        return False


def test_wall_clock_timeout_on_any_device():
    dev = SilentDevice()
    drv = NPUDriver(dev)
    drv.load(GOOD, TABLE)
    drv.start()
    with pytest.raises(LimitExceeded, match=r"timeout of 0.1 s") as info:
        drv.wait(timeout_cycles=None, timeout_s=0.1)
    assert info.value.option == "--timeout" and dev.waits > 1


def test_session_limits_follow_the_program_and_the_driver():
    from host.adaptive.timeline import zero_inputs
    from host.compiler import compile_model
    from host.onnx_import import load_onnx
    from host.runtime import Session

    model = compile_model(load_onnx("host/models/cnn.onnx"), CONFIGS["default"])
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    session = Session(drv, model, check=True)
    est = estimate_cycles(model)
    assert est > 0
    assert session.limits() == RunLimits(max(MIN_BUDGET, int(BUDGET_FACTOR * est)),
                                         MIN_TIMEOUT_S + session.limits().cycle_budget / 10_000)
    session.load()
    r = session.run(zero_inputs(model))
    assert r.checked and r.cycles < session.limits().cycle_budget
    drv.limits = RunLimits(cycle_budget=r.cycles // 4)  # too tight for this program
    with pytest.raises(LimitExceeded, match=f"cycle budget of {r.cycles // 4} cycles"):
        session.run(zero_inputs(model))
    drv.limits = RunLimits()  # the device is usable afterwards
    assert session.run(zero_inputs(model)).checked


def test_run_limits_refuse_nonsense():
    with pytest.raises(ValueError):
        RunLimits(cycle_budget=1 << 32)
    with pytest.raises(ValueError):
        RunLimits(timeout_s=float("nan"))
    assert RunLimits(0, 0).resolve(1e9) == RunLimits(0, 0)



@pytest.mark.parametrize("addr, size", [(0, -5), (-1, 4), (1 << 22, 1), ((1 << 22) - 4, 8)])
def test_memory_outside_the_dram_is_refused(addr, size):
    """``read_mem(0, -5)`` returned all 4 MB (a negative size sliced from the end)."""
    dev = GoldenDevice(CONFIGS["default"])
    with pytest.raises(ValueError, match="outside"):
        dev.read_mem(addr, size)
    if size >= 0:
        with pytest.raises(ValueError, match="outside"):
            dev.write_mem(addr, bytes(size))
