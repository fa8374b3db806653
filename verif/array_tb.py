"""GEMM engine testbench pieces shared by both simulators, and its cocotb side.

In the verif package (pytest does not collect it). The plain-Python
parts (harness, command generator, numpy reference, trace checker) are used by
``tests/test_array.py`` under Amaranth's simulator and by ``bench/bench_array.py``;
the ``@cocotb.test`` functions run inside Verilator on the :class:`ArrayHarness`
Verilog.

The numpy reference follows ``firmware.golden`` (``_op_wload``/``_op_gemm``): two
weight banks, ``wload`` clears the shadow bank and fills ``[:k, :n]``, ``gemm`` swaps
first when asked and writes or adds ``x @ W[:k, :n]`` (int32, wrapping) to ``n``
columns of the accumulator rows.
"""

from __future__ import annotations

import json
import os
import random
from collections import deque
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Const, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from firmware.config import CONFIGS, NPUConfig
from hdl.accumulator import Accumulator
from hdl.array import GemmEngine
from hdl.ports import (
    SP_READ_LATENCY,
    ArrayOp,
    acc_port_signature,
    array_command_layout,
    command_stream,
    sp_window_signature,
)

TOPLEVEL = "array_harness"
ACC_GUARD = 16  # rows of the accumulator at each end that programs use (and we read back)


# ---- the device under test ------------------------------------------------------------


class ArrayHarness(wiring.Component):
    """:class:`hdl.array.GemmEngine` wired to the real :class:`hdl.accumulator.Accumulator`.

    The engine owns the accumulator (``sel=0``) unless ``rb_sel`` is set, which hands
    it to the ``rb`` port so a testbench can read the results back.

    Members
    -------
    cmd, sp, wsp, wload_done, gemm_done, idle, macs, busy, stall
        The engine's members, passed through.
    mon_wen, mon_waddr : Out
        The engine's accumulator write enable and row, for monitors.
    rb_sel : In(1)
        Give the accumulator to ``rb``.
    rb : In(acc_port_signature(config))
        Read-back port (the accumulator's vector-unit port).
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        super().__init__({
            "cmd": In(command_stream(array_command_layout(config))),
            "sp": Out(sp_window_signature(config)),
            "wsp": Out(sp_window_signature(config)),
            "wload_done": Out(1),
            "gemm_done": Out(1),
            "idle": Out(1),
            "macs": Out(range(config.rows * config.cols + 1)),
            "busy": Out(1),
            "stall": Out(1),
            "mon_wen": Out(1),
            "mon_waddr": Out(acc_port_signature(config).members["waddr"].shape),
            "rb_sel": In(1),
            "rb": In(acc_port_signature(config)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = GemmEngine(self.config)
        m.submodules.acc = acc = Accumulator(self.config)
        connect(m, flipped(self.cmd), engine.cmd)
        connect(m, flipped(self.sp), engine.sp)
        connect(m, flipped(self.wsp), engine.wsp)
        connect(m, engine.acc, acc.array)
        connect(m, flipped(self.rb), acc.vector)
        m.d.comb += acc.sel.eq(self.rb_sel)
        for name in ("wload_done", "gemm_done", "idle", "macs", "busy", "stall"):
            m.d.comb += getattr(self, name).eq(getattr(engine, name))
        m.d.comb += [self.mon_wen.eq(engine.acc.wen), self.mon_waddr.eq(engine.acc.waddr)]
        return m


# ---- programs ---------------------------------------------------------------------------


@dataclass
class Command:
    """One resolved wload/gemm, as the sequencer hands it to the engine."""

    op: ArrayOp
    sp: int
    k: int
    n: int
    stride: int = 0
    m: int = 0
    acc: int = 0
    accumulate: int = 0
    swap: int = 0

    def fields(self) -> dict:
        return {"op": self.op, "sp": self.sp, "stride": self.stride, "k": self.k, "n": self.n,
                "m": self.m, "acc": self.acc, "accumulate": self.accumulate, "swap": self.swap}

    def pack(self, config: NPUConfig) -> int:
        """Return the command as the integer value of the ``cmd.payload`` port."""
        return Const.cast(array_command_layout(config).const(self.fields())).value


def acc_window(config: NPUConfig) -> list[int]:
    """Accumulator rows that random programs may use: both ends of the buffer."""
    g = min(ACC_GUARD, config.acc_rows // 2)
    return [*range(g), *range(config.acc_rows - g, config.acc_rows)]


def random_program(config: NPUConfig, rng: random.Random, length: int) -> list[Command]:
    """Return a legal random wload/gemm sequence of about ``length`` commands.

    Covers tiles of every shape up to the array, strides below, equal to and above
    ``k``, overwrite and accumulate, swap and no swap (incl. swapping back to an old
    tile), wload pairs, back-to-back accumulation on the same rows (``m=1`` too),
    long gemms, and tiles at the top of the scratchpad (windows that wrap).
    """
    R, C, S = config.rows, config.cols, config.sp_bytes
    g = min(ACC_GUARD, config.acc_rows // 2)
    dims = [(0, 0), (0, 0)]  # (k, n) of each weight bank, as the sequencer tracks them
    active = 0
    prog: list[Command] = []

    def sp_addr(span):
        if rng.random() < 0.15:
            return S - span  # the window runs past the end and wraps
        return rng.randrange(S - span + 1)

    def wload():
        k, n = rng.randint(1, R), rng.randint(1, C)
        if rng.random() < 0.3:
            k, n = R, C
        prog.append(Command(ArrayOp.WLOAD, sp_addr(k * n), k, n))
        dims[1 - active] = (k, n)

    def gemm(swap, m=None, acc=None, accumulate=None):
        nonlocal active
        if swap:
            active = 1 - active
        k, n = dims[active]
        if m is None:
            m = rng.choice([1, 1, 2, 3, 5, 8, 13, g])
        stride = rng.choice([k, k, rng.randint(1, 3 * k), rng.randint(k, 40)])
        if acc is None:
            base = 0 if rng.random() < 0.5 else config.acc_rows - g
            acc = base + rng.randrange(g - m + 1)
        if accumulate is None:
            accumulate = rng.randrange(2)
        prog.append(Command(ArrayOp.GEMM, sp_addr((m - 1) * stride + k), k, n, stride, m,
                            acc, accumulate, swap))

    wload()
    gemm(swap=1)
    while len(prog) < length:
        roll = rng.random()
        shadow_ok = dims[1 - active][0] > 0
        if roll < 0.3:
            wload()
            if rng.random() < 0.2:
                wload()  # the second one replaces the first
        elif roll < 0.45:
            # Back-to-back accumulation on the same rows, sometimes across tiles of
            # different widths.
            m = rng.choice([1, 1, 2, 4])
            acc = rng.randrange(g - m + 1)
            for _ in range(rng.randint(2, 4)):
                gemm(swap=int(shadow_ok and rng.random() < 0.3), m=m, acc=acc, accumulate=1)
        else:
            gemm(swap=int(shadow_ok and rng.random() < 0.5))
    return prog


def stream_program(config: NPUConfig, tiles: int, m: int = 256) -> list[Command]:
    """Return ``tiles`` pairs of (full-size wload; gemm swap=1 over ``m`` dense rows)."""
    R, C = config.rows, config.cols
    m = min(m, config.acc_rows)
    prog = []
    for t in range(tiles):
        wbase = (t % 4) * R * C
        xbase = 1024 + (t % 2) * m * R
        prog.append(Command(ArrayOp.WLOAD, wbase, R, C))
        prog.append(Command(ArrayOp.GEMM, xbase, R, C, R, m, 0, t % 2, 1))
    return prog


def grants(rng: random.Random, kind: str):
    """Yield the scratchpad's ``ready`` for successive cycles.

    ``kind`` is ``"always"``, ``"random"`` (each cycle with probability 1/2) or
    ``"bursty"`` (alternating runs of 1..12 grants and 1..40 refusals: long enough
    that the array drains while a gemm is stalled).
    """
    if kind == "always":
        while True:
            yield True
    elif kind == "random":
        while True:
            yield rng.random() < 0.5
    elif kind == "bursty":
        while True:
            for _ in range(rng.randint(1, 12)):
                yield True
            for _ in range(rng.randint(1, 40)):
                yield False
    else:
        raise ValueError(f"unknown grant pattern {kind!r}")


def random_scratchpad(config: NPUConfig, rng: random.Random) -> np.ndarray:
    """Return ``sp_bytes`` random bytes (the full int8 range)."""
    return np.frombuffer(rng.randbytes(config.sp_bytes), dtype=np.uint8).copy()


def window(sp: np.ndarray, addr: int, width: int) -> int:
    """Return the scratchpad window at ``addr`` (lane ``i`` = byte ``addr + i``, wrapping)."""
    idx = (addr + np.arange(width)) % len(sp)
    return int.from_bytes(sp[idx].tobytes(), "little")


def reference(config: NPUConfig, sp: np.ndarray, prog: list[Command]) -> np.ndarray:
    """Return the accumulator (``acc_rows x cols`` int64 holding int32) after ``prog``."""
    R, C = config.rows, config.cols
    w = [np.zeros((R, C), np.int64) for _ in range(2)]
    active = 0
    acc = np.zeros((config.acc_rows, C), np.int64)
    for c in prog:
        if c.op == ArrayOp.WLOAD:
            tile = np.zeros((R, C), np.int64)
            tile[:c.k, :c.n] = sp[c.sp: c.sp + c.k * c.n].view(np.int8).reshape(c.k, c.n)
            w[1 - active] = tile
            continue
        if c.swap:
            active = 1 - active
        rows = c.sp + c.stride * np.arange(c.m)
        x = sp[rows[:, None] + np.arange(c.k)[None, :]].view(np.int8).astype(np.int64)
        out = x @ w[active][:c.k, :c.n]
        if c.accumulate:
            out = out + acc[c.acc: c.acc + c.m, :c.n]
        acc[c.acc: c.acc + c.m, :c.n] = (out + 2**31) % 2**32 - 2**31
    return acc


# ---- checking a run -----------------------------------------------------------------------


@dataclass
class Cycle:
    """What a monitor saw at one clock edge."""

    cmd_fire: int
    wload_done: int
    gemm_done: int
    macs: int
    wen: int
    waddr: int
    idle: int
    busy: int
    stall: int
    sp_valid: int
    sp_ready: int
    wsp_valid: int
    wsp_ready: int


def check_trace(config: NPUConfig, prog: list[Command], trace: list[Cycle], what: str) -> dict:
    """Check the engine's status outputs over a run; return summary figures.

    Checks: ``idle`` is high exactly when every accepted command has finished,
    ``busy``/``stall`` agree with it, one ``wload_done``/``gemm_done`` pulse per
    command in order, every gemm writes its ``m`` rows in order before its
    ``gemm_done``, ``macs`` is ``k*n`` on each row write and 0 otherwise (so a
    gemm's sum is ``m*k*n``), and no gemm writes before the weights it uses are loaded.
    """
    wloads = [c for c in prog if c.op == ArrayOp.WLOAD]
    gemms = [c for c in prog if c.op == ArrayOp.GEMM]
    # Wloads a gemm depends on: those before the latest swap at or before it (a gemm
    # without swap may overtake later wloads, which fill the other bank).
    need, seen, loaded = [], 0, 0
    for c in prog:
        if c.op == ArrayOp.WLOAD:
            seen += 1
        else:
            loaded = seen if c.swap else loaded
            need.append(loaded)
    accepted = finished = wdone = 0
    g = row = macs_sum = 0
    total_macs = 0
    for t, s in enumerate(trace):
        where = f"{what}: cycle {t}"
        outstanding = accepted - finished
        assert s.idle == (outstanding == 0), f"{where}: idle={s.idle}, {outstanding} unfinished"
        assert s.busy == 1 - s.idle, f"{where}: busy={s.busy}, idle={s.idle}"
        refused = (s.sp_valid and not s.sp_ready) or (s.wsp_valid and not s.wsp_ready)
        assert s.stall == (s.busy and refused), f"{where}: stall={s.stall}"
        accepted += s.cmd_fire
        finished += s.wload_done + s.gemm_done
        wdone += s.wload_done
        assert wdone <= len(wloads), f"{where}: more wload_done pulses than wloads"
        if s.wen:
            assert g < len(gemms), f"{where}: accumulator write after the last gemm"
            c = gemms[g]
            if row == 0:
                assert wdone >= need[g], (f"{where}: gemm {g} writes before wload {need[g]} "
                                          f"finished ({wdone} done)")
            assert s.waddr == c.acc + row, f"{where}: gemm {g} row {row} to {s.waddr}"
            assert s.macs == c.k * c.n, f"{where}: macs={s.macs}, row of k*n={c.k * c.n}"
            row += 1
            macs_sum += s.macs
        else:
            assert s.macs == 0, f"{where}: macs={s.macs} without a row write"
        total_macs += s.macs
        if s.gemm_done:
            assert g < len(gemms), f"{where}: gemm_done after the last gemm"
            c = gemms[g]
            assert s.wen and row == c.m, f"{where}: gemm {g} done after {row}/{c.m} rows"
            assert macs_sum == c.m * c.k * c.n, f"{where}: gemm {g} macs {macs_sum}"
            g, row, macs_sum = g + 1, 0, 0
        else:
            assert row == 0 or g < len(gemms) and row < gemms[g].m, \
                f"{where}: gemm {g} wrote {row} rows without gemm_done"
    assert accepted == len(prog), f"{what}: {accepted}/{len(prog)} commands accepted"
    assert wdone == len(wloads), f"{what}: {wdone}/{len(wloads)} wload_done pulses"
    assert g == len(gemms), f"{what}: {g}/{len(gemms)} gemm_done pulses"
    assert trace[-1].idle, f"{what}: not idle at the end"
    return {"cycles": len(trace), "macs": total_macs}


def check_acc(config: NPUConfig, expected: np.ndarray, got: dict[int, list[int]], what: str):
    """Compare read-back accumulator rows (``row -> cols`` int32 values) with ``expected``."""
    for r, values in got.items():
        want = [int(v) for v in expected[r]]
        assert values == want, f"{what}: accumulator row {r} is {values}, expected {want}"


def unpack_row(config: NPUConfig, value: int) -> list[int]:
    """Split an accumulator row bus value into ``cols`` signed int32 values."""
    out = []
    for c in range(config.cols):
        v = (value >> (32 * c)) & 0xFFFF_FFFF
        out.append(v - (1 << 32) if v & 0x8000_0000 else v)
    return out


# ---- cocotb side -------------------------------------------------------------------------

try:  # the plain-Python parts above are also used where cocotb is not running
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge
except ImportError:  # pragma: no cover
    cocotb = None


class _TBWindow:
    """One of the engine's scratchpad read windows, served from the scratchpad model
    with the refusals of ``ready`` (a generator)."""

    def __init__(self, dut, name: str, ready):
        self.valid, self.ready = getattr(dut, f"{name}__valid"), getattr(dut, f"{name}__ready")
        self.addr, self.we = getattr(dut, f"{name}__addr"), getattr(dut, f"{name}__we")
        self.rvalid, self.rdata = getattr(dut, f"{name}__rvalid"), getattr(dut, f"{name}__rdata")
        self.grants, self.name = ready, name
        self.unaccepted = None
        self.due = deque([None] * (SP_READ_LATENCY - 1))  # read data on its way
        self.ready.value = int(next(ready))
        self.granted = None

    def sample(self) -> tuple[int, int]:
        """Check and note this cycle's request; return (valid, ready)."""
        valid, ready, addr = int(self.valid.value), int(self.ready.value), int(self.addr.value)
        if self.unaccepted is not None:
            assert valid and addr == self.unaccepted, \
                f"{self.name}: refused request changed before its grant"
        if valid:
            assert int(self.we.value) == 0, "the GEMM engine must only read"
        self.unaccepted = addr if valid and not ready else None
        self.granted = addr if valid and ready else None
        return valid, ready

    def answer(self, sp: np.ndarray, width: int):
        """After the clock edge: send the data due now, decide the next grant."""
        self.due.append(None if self.granted is None else window(sp, self.granted, width))
        rdata = self.due.popleft()
        self.rvalid.value = int(rdata is not None)
        if rdata is not None:
            self.rdata.value = rdata
        self.ready.value = int(next(self.grants))


class TB:
    """Clock, reset, a scratchpad model with random refusals and a monitor."""

    def __init__(self, dut, config: NPUConfig, sp: np.ndarray, rng: random.Random,
                 grant: str):
        self.dut, self.config, self.sp, self.rng = dut, config, sp, rng
        self.grant = grant
        self.trace: list[Cycle] = []
        self.width = config.bus_bytes

    async def start(self):
        d = self.dut
        d.cmd__valid.value = 0
        d.cmd__payload.value = 0
        for port in (d.sp__ready, d.sp__rvalid, d.sp__rdata, d.wsp__ready, d.wsp__rvalid,
                     d.wsp__rdata):
            port.value = 0
        d.rb_sel.value = 0
        d.rb__ren.value = 0
        d.rb__raddr.value = 0
        d.rb__wen.value = 0
        d.rb__waddr.value = 0
        d.rb__wdata.value = 0
        d.rb__wmask.value = 0
        d.rst.value = 1
        Clock(d.clk, 10, unit="ns").start()
        for _ in range(3):
            await RisingEdge(d.clk)
        await FallingEdge(d.clk)
        d.rst.value = 0
        cocotb.start_soon(self._scratchpad_and_monitor())

    async def _scratchpad_and_monitor(self):
        # Sample everything just before each rising edge (ReadOnly of the falling-edge
        # half), answer granted reads right after it. Both of the engine's windows
        # (activation rows, weight loads) are served, with their own refusals.
        d = self.dut
        ports = [_TBWindow(d, name, grants(self.rng, self.grant)) for name in ("sp", "wsp")]
        while True:
            await FallingEdge(d.clk)
            await ReadOnly()
            seen = [w.sample() for w in ports]
            self.trace.append(Cycle(
                int(d.cmd__valid.value) & int(d.cmd__ready.value), int(d.wload_done.value),
                int(d.gemm_done.value), int(d.macs.value), int(d.mon_wen.value),
                int(d.mon_waddr.value), int(d.idle.value), int(d.busy.value),
                int(d.stall.value), *seen[0], *seen[1]))
            await RisingEdge(d.clk)
            for w in ports:
                w.answer(self.sp, self.width)

    async def run(self, prog: list[Command], gaps: bool, timeout: int = 200_000):
        """Drive ``prog`` (with random idle gaps if ``gaps``) and wait until idle."""
        d = self.dut
        for c in prog:
            if gaps:
                for _ in range(self.rng.choice([0, 0, 0, 1, 3])):
                    await FallingEdge(d.clk)
            await FallingEdge(d.clk)
            d.cmd__payload.value = c.pack(self.config)
            d.cmd__valid.value = 1
            while True:
                await ReadOnly()
                if int(d.cmd__ready.value):
                    break
                await FallingEdge(d.clk)
            await RisingEdge(d.clk)
            d.cmd__valid.value = 0
        for _ in range(timeout):
            await FallingEdge(d.clk)
            await ReadOnly()
            if int(d.idle.value):
                break
        else:
            raise AssertionError(f"not idle {timeout} cycles after the last command")
        await FallingEdge(d.clk)  # let the monitor record the idle cycle

    async def read_acc(self, rows) -> dict[int, list[int]]:
        d = self.dut
        await FallingEdge(d.clk)
        d.rb_sel.value = 1
        got = {}
        for r in rows:
            d.rb__ren.value = 1
            d.rb__raddr.value = r
            await FallingEdge(d.clk)
            got[r] = unpack_row(self.config, int(d.rb__rdata.value))
        d.rb__ren.value = 0
        d.rb_sel.value = 0
        return got


if cocotb is not None:

    @cocotb.test()
    async def random_sequence(dut):
        """A random wload/gemm sequence under backpressure matches numpy (default config)."""
        seed = int(os.environ.get("ARRAY_SEED", "1"))
        length = int(os.environ.get("ARRAY_LENGTH", "60"))
        config = CONFIGS["default"]
        rng = random.Random(seed)
        sp = random_scratchpad(config, rng)
        prog = random_program(config, rng, length)
        grant = os.environ.get("ARRAY_GRANT") or rng.choice(["random", "bursty"])
        what = f"verilator seed {seed}, grant={grant}"
        tb = TB(dut, config, sp, rng, grant)
        await tb.start()
        await tb.run(prog, gaps=True)
        check_trace(config, prog, tb.trace, what)
        got = await tb.read_acc(acc_window(config))
        check_acc(config, reference(config, sp, prog), got, what)

    @cocotb.test(skip=not os.environ.get("ARRAY_BENCH_OUT"))
    async def stream_utilization(dut):
        """Benchmark: (wload; gemm swap=1, m=256) pairs; writes figures to ARRAY_BENCH_OUT."""
        config = CONFIGS["default"]
        tiles = int(os.environ.get("ARRAY_BENCH_TILES", "16"))
        grant = os.environ.get("ARRAY_BENCH_GRANT", "always")
        rng = random.Random(1)
        sp = random_scratchpad(config, rng)
        prog = stream_program(config, tiles)
        tb = TB(dut, config, sp, rng, grant)
        await tb.start()
        await tb.run(prog, gaps=False)
        # Count from the cycle the first command is accepted to the cycle it went idle.
        first = next(t for t, s in enumerate(tb.trace) if s.cmd_fire)
        busy = [s for s in tb.trace[first:] if not s.idle]
        figures = check_trace(config, prog, tb.trace, "bench")
        got = await tb.read_acc([0, 255])
        check_acc(config, reference(config, sp, prog), got, "bench")
        cycles = len(busy)
        with open(os.environ["ARRAY_BENCH_OUT"], "w") as fh:
            json.dump({"cycles": cycles, "macs": figures["macs"],
                       "stall_cycles": sum(s.stall for s in busy)}, fh)
