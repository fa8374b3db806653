"""cocotb side of the CSR block tests (run by ``tests/test_csr.py`` under Verilator).

The host side is cocotbext-axi's ``AxiLiteMaster``. Addresses, access modes and
bit positions all come from ``firmware.regs``; the scoreboard of the random test is
``firmware.csrmodel.CSRModel``, the model the golden device serves registers with,
wired to :class:`PortModel` (the ports the testbench drives and the pulses and
writes the DUT must emit). ``CSR_CONFIG`` names the ``firmware.config.CONFIGS``
entry the DUT was built for, ``CSR_SEED`` seeds the stimulus (printed on failure)
and ``CSR_OPS`` sets the length of the random test.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import random
from collections import Counter

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiResp

from firmware.config import CONFIGS, NPUConfig
from firmware.csrmodel import CSRModel, NPUSide, RunState, state_mask
from firmware.isa import ISA_VERSION
from firmware.regs import (
    HW_VERSION,
    ID_MAGIC,
    TRACE_FIELDS,
    Access,
    caps_to_config,
    counter_names,
    pack_fields,
    registers,
    unpack_fields,
)

CONFIG_NAME = os.environ.get("CSR_CONFIG", "default")
CONFIG = CONFIGS[CONFIG_NAME]
SEED = int(os.environ.get("CSR_SEED", "1"))
OPS = int(os.environ.get("CSR_OPS", "600"))  # random transactions per phase
M32 = (1 << 32) - 1
TIMEOUT_MS = 2 + OPS // 1000  # simulated time per test: a hung channel fails, not spins
PULSES = ("start", "swap", "counter_reset", "tag_invalidate", "trace_clear", "trace_pop")
STATUS_INPUTS = ("busy", "active_bank", "swap_pending", "error")


def u(handle) -> int:
    """The unsigned value of a signal handle (1-bit handles hold a Logic, not an array)."""
    return int(handle.value)


def rng_for(test: str) -> random.Random:
    return random.Random(f"{SEED}:{test}")


def get_f(reg, name, word) -> int:
    return unpack_fields(reg.name, word)[name]


def put_f(reg, values: dict) -> int:
    return pack_fields(reg.name, **values)


# ---- reference model ---------------------------------------------------------------------


class PortModel(NPUSide):
    """The DUT's ports as the reference model sees them.

    ``inputs`` mirrors the input ports the testbench drives; ``events`` collects the
    pulses and port writes the DUT must emit, in order, in the monitor's format.
    """

    def __init__(self, config: NPUConfig):
        self.inputs = {n: 0 for n in (*STATUS_INPUTS, "error_code", "error_pc", "error_addr",
                                      "trace_count")}
        self.head = {f: 0 for f in TRACE_FIELDS}
        self.rvals = [0] * 16
        self.cvals = [0] * len(counter_names(config))
        self.table: dict[tuple, tuple[int, int]] = {}
        self.events: list[tuple] = []

    def run_state(self) -> RunState:
        return RunState(**{n: v for n, v in self.inputs.items() if n != "trace_count"})

    def trace_count(self) -> int:
        return self.inputs["trace_count"]

    def trace_head(self, field: str) -> int:
        return self.head[field]

    def scalar(self, index: int) -> int:
        return self.rvals[index]

    def counter(self, index: int) -> int:
        return self.cvals[index]

    def pt_entry(self, bank: int, pt_set: int, partition: int) -> tuple[int, int]:
        return self.table.get((bank, pt_set, partition), (0, 0))

    def commands(self, names: tuple[str, ...]) -> None:
        self.events += [(n,) for n in names]

    def imem_write(self, bank: int, index: int, word: int) -> None:
        self.events.append(("imem", bank, index, word))

    def pt_write(self, bank: int, pt_set: int, partition: int, base: int, size: int) -> None:
        self.table[(bank, pt_set, partition)] = (base, size)
        self.events.append(("pt", bank, pt_set, partition, base, size))


# ---- testbench -----------------------------------------------------------------------------


class TB:
    """Clock, reset, the AXI-Lite master, the port monitor and the partition-table model."""

    def __init__(self, dut, config: NPUConfig = CONFIG):
        self.dut = dut
        self.cfg = config
        self.map = registers(config)
        self.regs = {r.name: r for r in self.map}
        self.addr = {r.name: r.addr for r in self.map}
        self.counters = counter_names(config)
        self.ports = PortModel(config)
        self.model = CSRModel(config, self.ports)
        self.events: list[tuple] = []
        self.cycle = 0
        self.counter_fn = None  # cycle -> list of counter values, driven every cycle
        self.table: dict[tuple, tuple[int, int]] = {}
        for name in (*STATUS_INPUTS, "error_code", "error_pc", "error_addr", "trace_overflow",
                     "run_done", "run_error", "pt_rd_base", "pt_rd_size", "trace_count",
                     "trace_head"):
            getattr(dut, name).value = 0
        for i in range(16):
            getattr(dut, f"regs__{i}").value = 0
        for i in range(len(self.counters)):
            getattr(dut, f"counters__{i}").value = 0
        dut.rst.value = 1
        Clock(dut.clk, 10, unit="ns").start()
        self.axi = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "bus_"), dut.clk, dut.rst)
        for side in (self.axi.write_if, self.axi.read_if):
            side.log.setLevel(logging.WARNING)  # one INFO line per transaction otherwise
        cocotb.start_soon(self._monitor())

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def _monitor(self):
        """Sample the outputs mid-cycle: registered pulses are seen exactly once."""
        dut = self.dut
        while True:
            await FallingEdge(dut.clk)
            self.cycle += 1
            for p in PULSES:
                if u(getattr(dut, p)):
                    self.events.append((p,))
            if u(dut.imem_we):
                self.events.append(("imem", u(dut.imem_bank), u(dut.imem_index),
                                    u(dut.imem_data)))
            if u(dut.pt_we):
                key = (u(dut.pt_bank), u(dut.pt_set), u(dut.pt_part))
                entry = (u(dut.pt_base), u(dut.pt_size))
                self.table[key] = entry
                self.events.append(("pt", *key, *entry))
            # the table answers the lookup PT_SELECT drives, a cycle late (synchronous RAM)
            key = (u(dut.pt_rd_bank), u(dut.pt_rd_set), u(dut.pt_rd_part))
            base, size = self.table.get(key, (0, 0))
            dut.pt_rd_base.value = base
            dut.pt_rd_size.value = size
            if self.counter_fn is not None:
                for i, v in enumerate(self.counter_fn(self.cycle)):
                    getattr(dut, f"counters__{i}").value = v

    async def settle(self, cycles: int = 3):
        await ClockCycles(self.dut.clk, cycles)

    async def read(self, where) -> tuple[int, int]:
        addr = self.addr[where] if isinstance(where, str) else where
        rsp = await self.axi.read(addr, 4)
        return int.from_bytes(rsp.data, "little"), rsp.resp

    async def rd(self, where) -> int:
        """Read a register that must answer OKAY."""
        value, resp = await self.read(where)
        assert resp == AxiResp.OKAY, f"read {where}: {resp!r}"
        return value

    async def write(self, where, value: int, offset: int = 0, length: int = 4) -> int:
        """Write ``length`` bytes of ``value`` (its lanes ``offset``..) to a register."""
        addr = self.addr[where] if isinstance(where, str) else where
        data = (value >> (8 * offset)).to_bytes(4, "little")[:length]
        rsp = await self.axi.write(addr + offset, data)
        return rsp.resp

    async def wr(self, where, value: int):
        """Write a full register that must answer OKAY."""
        resp = await self.write(where, value)
        assert resp == AxiResp.OKAY, f"write {where}: {resp!r}"

    def drive(self, **inputs):
        for name, v in inputs.items():
            getattr(self.dut, name).value = int(v)
            if name in self.ports.inputs:
                self.ports.inputs[name] = int(v)

    async def pulse(self, name: str):
        """Raise a 1-bit input for exactly one cycle (the model takes the same pulse)."""
        await FallingEdge(self.dut.clk)
        getattr(self.dut, name).value = 1
        await FallingEdge(self.dut.clk)
        getattr(self.dut, name).value = 0
        self.model.pulse(name)

    def set_pauses(self, rng: random.Random | None):
        """Random stalls on every channel (valid gaps on AW/W/AR, ready gaps on B/R)."""
        wif, rif = self.axi.write_if, self.axi.read_if
        channels = (wif.aw_channel, wif.w_channel, wif.b_channel, rif.ar_channel,
                    rif.r_channel)
        for ch in channels:
            if rng is None:
                ch.clear_pause_generator()
                ch.pause = False  # the generator may have been stopped mid-pause
            else:
                p = rng.choice((0.2, 0.5, 0.8))
                seed = rng.getrandbits(32)
                g = random.Random(seed)
                ch.set_pause_generator(g.random() < p for _ in itertools.count())

    def take_events(self) -> list[tuple]:
        ev, self.events = self.events, []
        return ev


async def started(dut) -> TB:
    tb = TB(dut)
    await tb.reset()
    return tb


# ---- tests ---------------------------------------------------------------------------------


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def reset_values(dut):
    """Every register reads its reset value; CAPS read back as the build's NPUConfig."""
    tb = await started(dut)
    caps = {}
    for r in tb.map:
        got = await tb.rd(r.name)
        if r.name == "ID":
            want = ID_MAGIC
        elif r.name == "VERSION":
            want = put_f(r, {"isa": ISA_VERSION, "hw": HW_VERSION})
        elif r.name.startswith("CAPS_"):
            caps[r.name] = got
            want = getattr(tb.cfg, r.name[5:].lower())
        else:
            want = 0
        assert got == want, f"{r.name} @ {r.addr:#05x}: {got:#x} != reset value {want:#x}"
    assert caps_to_config(caps) == tb.cfg
    assert len(caps) == len(dataclasses.fields(NPUConfig))
    assert u(tb.dut.irq) == 0
    assert tb.take_events() == []


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def access_modes(dut):
    """RO ignores writes, RW stores its fields, WO and W1S read 0; outputs follow RW."""
    tb = await started(dut)
    rng = rng_for("access_modes")
    for r in tb.map:
        if r.name in ("PT_BASE", "PT_SIZE", "IRQ_STATUS", "IMEM_DATA_HI"):
            continue  # their write side effects have their own tests
        if r.name in ("BANK_VERSION0", "BANK_VERSION1"):
            tb.drive(active_bank=1 - int(r.name[-1]))  # write the shadow bank's version
            await tb.settle(1)
        before = await tb.rd(r.name)
        value = rng.getrandbits(32)
        if r.name in ("CTRL", "TRACE_POP"):
            value = 0  # no commands here
        await tb.wr(r.name, value)
        got = await tb.rd(r.name)
        if r.access == Access.RO:
            assert got == before, f"RO {r.name} changed: {before:#x} -> {got:#x}"
        elif r.access == Access.RW:
            assert got == value & state_mask(r), f"RW {r.name}: wrote {value:#x}, read {got:#x}"
        else:
            assert got == 0, f"{r.access.value} {r.name} reads {got:#x}, not 0"
    # the RW registers drive their output ports
    await tb.settle()
    assert u(tb.dut.cycle_budget) == await tb.rd("CYCLE_BUDGET")
    for i in range(7):
        assert u(getattr(tb.dut, f"args__{i}")) == await tb.rd(f"ARG{i}")
    for b in range(2):
        assert (u(getattr(tb.dut, f"bank_version__{b}"))
                == await tb.rd(f"BANK_VERSION{b}"))
    sel = tb.regs["PT_SELECT"]
    w = await tb.rd("PT_SELECT")
    assert u(tb.dut.pt_rd_part) == get_f(sel, "partition", w)
    assert u(tb.dut.pt_rd_set) == get_f(sel, "set", w)
    assert u(tb.dut.pt_rd_bank) == get_f(sel, "bank", w)
    # byte strobes: a one-byte write changes only that byte
    await tb.wr("ARG3", 0x11223344)
    assert await tb.write("ARG3", 0xAA << 16, offset=2, length=1) == AxiResp.OKAY
    assert await tb.rd("ARG3") == 0x11AA3344
    assert tb.take_events() == []


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def status_inputs(dut):
    """STATUS, ERROR*, R*, TRACE_* and the sticky trace-overflow bit follow the inputs."""
    tb = await started(dut)
    rng = rng_for("status_inputs")
    st = tb.regs["STATUS"]
    for _ in range(8):
        ins = {n: rng.getrandbits(1) for n in STATUS_INPUTS}
        ins |= {"error_code": rng.getrandbits(8), "error_pc": rng.getrandbits(16),
                "error_addr": rng.getrandbits(32), "trace_count": rng.choice((0, 1, 17))}
        tb.drive(**ins)
        head = {f: rng.getrandbits(32) for f in TRACE_FIELDS}
        tb.dut.trace_head.value = sum(v << (32 * i) for i, v in enumerate(head.values()))
        rvals = [rng.getrandbits(32) for _ in range(16)]
        for i, v in enumerate(rvals):
            getattr(tb.dut, f"regs__{i}").value = v
        await tb.settle(1)
        status = await tb.rd("STATUS")
        for n in STATUS_INPUTS:
            assert get_f(st, n, status) == ins[n], f"STATUS.{n}: {status:#x} vs {ins}"
        assert get_f(st, "refused", status) == 0 and get_f(st, "trace_overflow", status) == 0
        assert await tb.rd("ERROR") == ins["error_code"]
        assert await tb.rd("ERROR_PC") == ins["error_pc"]
        assert await tb.rd("ERROR_ADDR") == ins["error_addr"]
        assert await tb.rd("TRACE_COUNT") == ins["trace_count"]
        for f in TRACE_FIELDS:
            want = head[f] if ins["trace_count"] else 0
            assert await tb.rd(f"TRACE_{f.upper()}") == want, f"TRACE_{f.upper()}"
        for i in range(16):
            assert await tb.rd(f"R{i}") == rvals[i], f"R{i}"
    # trace_overflow is sticky until CTRL.trace_clear or CTRL.counter_reset
    ctrl = tb.regs["CTRL"]
    for clear in ("trace_clear", "counter_reset"):
        await tb.pulse("trace_overflow")
        await tb.settle(1)
        for _ in range(2):
            assert get_f(st, "trace_overflow", await tb.rd("STATUS")) == 1
        await tb.wr("CTRL", put_f(ctrl, {"tag_invalidate": 1}))  # not a clear
        assert get_f(st, "trace_overflow", await tb.rd("STATUS")) == 1
        await tb.wr("CTRL", put_f(ctrl, {clear: 1}))
        assert get_f(st, "trace_overflow", await tb.rd("STATUS")) == 0
    await tb.settle()
    assert tb.take_events() == [("tag_invalidate",), ("trace_clear",),
                                ("tag_invalidate",), ("counter_reset",)]


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def command_pulses(dut):
    """Each CTRL bit and TRACE_POP emit exactly one one-cycle pulse; unstrobed bits do not."""
    tb = await started(dut)
    ctrl = tb.regs["CTRL"]
    names = [f.name for f in ctrl.fields]
    for n in names:
        await tb.wr("CTRL", put_f(ctrl, {n: 1}))
        await tb.settle()
        assert tb.take_events() == [(n,)], n
        assert await tb.rd("CTRL") == 0
    await tb.wr("CTRL", M32)
    await tb.settle()
    assert sorted(tb.take_events()) == sorted((n,) for n in names)
    await tb.wr("CTRL", 0)
    assert await tb.write("CTRL", M32, offset=1, length=3) == AxiResp.OKAY  # lane 0 unstrobed
    await tb.settle()
    assert tb.take_events() == []
    for _ in range(3):
        await tb.wr("TRACE_POP", 1)
    await tb.wr("TRACE_POP", 0xFFFF_FFFE)  # bit 0 clear: no pop
    await tb.settle()
    assert tb.take_events() == [("trace_pop",)] * 3


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def imem_writes(dut):
    """IMEM_ADDR sets bank and index; each IMEM_DATA_HI emits one write and advances."""
    tb = await started(dut)
    rng = rng_for("imem_writes")
    ia = tb.regs["IMEM_ADDR"]
    depth = tb.cfg.imem_depth
    tb.drive(active_bank=0)
    start = rng.randrange(depth - 20)
    await tb.wr("IMEM_ADDR", put_f(ia, {"bank": 1, "index": start}))
    words = [rng.getrandbits(64) for _ in range(12)]
    for w in words:
        await tb.wr("IMEM_DATA_LO", w & M32)
        await tb.wr("IMEM_DATA_HI", w >> 32)
    await tb.settle()
    assert tb.take_events() == [("imem", 1, start + i, w) for i, w in enumerate(words)]
    assert await tb.rd("IMEM_ADDR") == put_f(ia, {"bank": 1, "index": start + len(words)})
    # the low half is kept: two HI writes reuse it
    await tb.wr("IMEM_DATA_HI", 7)
    await tb.settle()
    assert tb.take_events() == [("imem", 1, start + 12, 7 << 32 | words[-1] & M32)]
    # bank 0 while bank 1 is active; the last index of the bank, then past it
    tb.drive(active_bank=1)
    await tb.wr("IMEM_ADDR", put_f(ia, {"bank": 0, "index": depth - 1}))
    await tb.wr("IMEM_DATA_LO", 0x12345678)
    await tb.wr("IMEM_DATA_HI", 0x9ABCDEF0)
    assert await tb.write("IMEM_DATA_HI", 1) == AxiResp.SLVERR  # index == imem_depth
    await tb.settle()
    assert tb.take_events() == [("imem", 0, depth - 1, 0x9ABCDEF0_12345678)]
    assert get_f(ia, "index", await tb.rd("IMEM_ADDR")) == depth
    assert await tb.rd("IMEM_DATA_LO") == 0 and await tb.rd("IMEM_DATA_HI") == 0  # WO


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def partition_table(dut):
    """PT_SIZE commits (base, size) to the entry PT_SELECT names; reads return the entry."""
    tb = await started(dut)
    rng = rng_for("partition_table")
    sel = tb.regs["PT_SELECT"]
    cfg = tb.cfg
    tb.drive(active_bank=0)
    want = {}
    entries = [(1, s, p) for s in range(cfg.pt_sets) for p in range(cfg.partitions)]
    rng.shuffle(entries)
    for bank, s, p in entries:
        base, size = rng.getrandbits(32), rng.getrandbits(32)
        await tb.wr("PT_SELECT", put_f(sel, {"bank": bank, "set": s, "partition": p}))
        await tb.wr("PT_BASE", base)
        assert await tb.rd("PT_BASE") == 0, "PT_BASE reads the stored entry, not the staging"
        await tb.wr("PT_SIZE", size)
        want[(bank, s, p)] = (base, size)
    await tb.settle()
    assert tb.take_events() == [("pt", *k, *want[k]) for k in want]
    # readback of every entry, in another order
    tb.drive(active_bank=1)
    rng.shuffle(entries)
    for k in entries:
        await tb.wr("PT_SELECT", put_f(sel, dict(zip(("bank", "set", "partition"), k,
                                                      strict=True))))
        assert (await tb.rd("PT_BASE"), await tb.rd("PT_SIZE")) == want[k], k
    # entries the build does not have answer SLVERR and are not written
    tb.drive(active_bank=1)
    bad = [put_f(sel, {"bank": 0, "set": 0, "partition": cfg.partitions})] if cfg.partitions < 8 \
        else []
    if cfg.pt_sets < 4:
        bad.append(put_f(sel, {"bank": 0, "set": cfg.pt_sets, "partition": 0}))
    assert bad, "both configs leave an out-of-range set"
    for w in bad:
        await tb.wr("PT_SELECT", w)
        assert await tb.write("PT_SIZE", 5) == AxiResp.SLVERR
    await tb.settle()
    assert tb.take_events() == []


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def refused_writes(dut):
    """Writes aimed at the active (or about-to-be-active) bank do nothing and set refused."""
    tb = await started(dut)
    st, irq = tb.regs["STATUS"], tb.regs["IRQ_STATUS"]
    ia, sel = tb.regs["IMEM_ADDR"], tb.regs["PT_SELECT"]
    await tb.wr("IRQ_ENABLE", M32)  # refused is not an interrupt source

    async def check_refused(expect: bool):
        await tb.settle()
        s, q = await tb.rd("STATUS"), await tb.rd("IRQ_STATUS")
        assert get_f(st, "refused", s) == expect and get_f(irq, "refused", q) == expect, \
            (s, q, expect)
        assert u(tb.dut.irq) == 0

    async def clear_refused():
        await tb.wr("IRQ_STATUS", put_f(irq, {"done": 1, "error": 1}))  # other bits: no effect
        await check_refused(True)
        await tb.wr("IRQ_STATUS", put_f(irq, {"refused": 1}))
        await check_refused(False)

    for active, pending in ((1, 0), (0, 0), (0, 1)):
        tb.drive(active_bank=active, swap_pending=pending)
        victim = active if not pending else 1 - active
        await check_refused(False)
        if not pending:  # the shadow bank takes everything
            await tb.wr(f"BANK_VERSION{1 - active}", 0xC0FFEE)
            assert await tb.rd(f"BANK_VERSION{1 - active}") == 0xC0FFEE
            await check_refused(False)
        # IMEM
        await tb.wr("IMEM_ADDR", put_f(ia, {"bank": victim, "index": 5}))
        await tb.wr("IMEM_DATA_LO", 1)
        await tb.wr("IMEM_DATA_HI", 2)  # OKAY on the bus: refusal is reported in STATUS
        await check_refused(True)
        assert await tb.rd("IMEM_ADDR") == put_f(ia, {"bank": victim, "index": 5})
        await clear_refused()
        # PT
        await tb.wr("PT_SELECT", put_f(sel, {"bank": victim, "set": 0, "partition": 1}))
        await tb.wr("PT_BASE", 0x100)
        await tb.wr("PT_SIZE", 0x200)
        await check_refused(True)
        assert await tb.rd("PT_SIZE") == 0
        await clear_refused()
        # BANK_VERSION of the victim bank
        old = await tb.rd(f"BANK_VERSION{victim}")
        await tb.wr(f"BANK_VERSION{victim}", 0xBAD)
        await check_refused(True)
        assert await tb.rd(f"BANK_VERSION{victim}") == old
        # sticky across further good traffic, until W1C
        await tb.wr("ARG0", 3)
        await check_refused(True)
        await clear_refused()
        await tb.settle()
        assert tb.take_events() == [], (active, pending)


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def interrupts(dut):
    """run_done/run_error set IRQ_STATUS; irq is an enabled pending cause; W1C clears."""
    tb = await started(dut)
    irq = tb.regs["IRQ_STATUS"]
    en = tb.regs["IRQ_ENABLE"]

    def line():
        return u(tb.dut.irq)

    for cause, event in (("done", "run_done"), ("error", "run_error")):
        other = "error" if cause == "done" else "done"
        await tb.wr("IRQ_ENABLE", put_f(en, {other: 1}))
        await tb.pulse(event)
        await tb.settle(1)
        assert await tb.rd("IRQ_STATUS") == put_f(irq, {cause: 1})
        assert line() == 0, f"{cause} pending but not enabled"
        await tb.wr("IRQ_ENABLE", put_f(en, {cause: 1}))
        await tb.settle(1)
        assert line() == 1
        await tb.wr("IRQ_ENABLE", 0)
        await tb.settle(1)
        assert line() == 0
        await tb.wr("IRQ_ENABLE", put_f(en, {cause: 1}))
        await tb.settle(1)
        assert line() == 1
        await tb.wr("IRQ_STATUS", put_f(irq, {other: 1}))  # W1C of another cause
        assert line() == 1
        await tb.wr("IRQ_STATUS", put_f(irq, {cause: 1}))
        await tb.settle(1)
        assert line() == 0 and await tb.rd("IRQ_STATUS") == 0
    # both causes pending, clear one at a time
    await tb.wr("IRQ_ENABLE", put_f(en, {"done": 1, "error": 1}))
    await tb.pulse("run_done")
    await tb.pulse("run_error")
    await tb.settle(1)
    assert await tb.rd("IRQ_STATUS") == put_f(irq, {"done": 1, "error": 1}) and line() == 1
    await tb.wr("IRQ_STATUS", put_f(irq, {"done": 1}))
    assert line() == 1
    await tb.wr("IRQ_STATUS", M32)
    await tb.settle(1)
    assert line() == 0 and await tb.rd("IRQ_STATUS") == 0


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def atomic_counter_reads(dut):
    """CNT_x_LO latches the high half: a LO/HI pair never tears while the counter runs."""
    tb = await started(dut)
    rng = rng_for("atomic_counter_reads")
    n = len(tb.counters)
    # every counter crosses a 2**32 boundary a few times during the test
    steps = [rng.randrange(3_000_000, 40_000_000) for _ in range(n)]
    bases = [rng.getrandbits(30) << 32 for _ in range(n)]

    def value(i, cycle):
        return (bases[i] + steps[i] * cycle) % (1 << 64)

    tb.counter_fn = lambda cycle: [value(i, cycle) for i in range(n)]
    tb.set_pauses(rng)
    wraps = 0
    for _ in range(3):
        for i in rng.sample(range(n), n):
            name = tb.counters[i].upper()
            c0 = tb.cycle
            lo = await tb.rd(f"CNT_{name}_LO")
            c1 = tb.cycle
            await ClockCycles(tb.dut.clk, rng.randrange(1, 30))
            hi = await tb.rd(f"CNT_{name}_HI")
            v = hi << 32 | lo
            seen = [value(i, c) for c in range(c0, c1 + 2)]
            assert v in seen, (f"seed {SEED}: {name}: read {v:#x}, counter was "
                               f"{seen[0]:#x}..{seen[-1]:#x} during the LO read")
            wraps += (value(i, tb.cycle) >> 32) != hi
    assert wraps, "the high half must move between LO and HI reads for the test to bite"
    # the latch holds the high half, not a live view
    a, b = rng.sample(range(n), 2)
    na, nb = tb.counters[a].upper(), tb.counters[b].upper()
    tb.set_pauses(None)
    tb.counter_fn = None  # freeze
    await tb.settle()
    frozen = [u(getattr(tb.dut, f"counters__{i}")) for i in range(n)]
    lo = await tb.rd(f"CNT_{na}_LO")
    assert lo == frozen[a] & M32
    getattr(tb.dut, f"counters__{a}").value = frozen[a] + (5 << 32)
    getattr(tb.dut, f"counters__{b}").value = frozen[b] + (9 << 32)
    await tb.settle(1)
    assert await tb.rd(f"CNT_{na}_HI") == frozen[a] >> 32, "HI must return the latched half"
    # HI of a counter whose LO was not the last LO read returns the live half
    assert await tb.rd(f"CNT_{nb}_HI") == ((frozen[b] >> 32) + 9) & M32
    assert await tb.rd(f"CNT_{na}_HI") == frozen[a] >> 32  # latch still held
    await tb.rd(f"CNT_{nb}_LO")
    assert await tb.rd(f"CNT_{na}_HI") == ((frozen[a] >> 32) + 5) & M32  # latch moved to b


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def unmapped_slverr(dut):
    """Every address outside the map answers SLVERR (reads 0); unmapped writes change nothing."""
    tb = await started(dut)
    rng = rng_for("unmapped_slverr")
    mapped = {r.addr for r in tb.map}
    holes = [a for a in range(0, 1 << 12, 4) if a not in mapped]
    assert len(holes) + len(mapped) == 1 << 10
    await tb.wr("CYCLE_BUDGET", 0x5A5A5A5A)
    await tb.wr("ARG6", 0xA5A5A5A5)
    tb.set_pauses(rng)
    for a in holes:
        value, resp = await tb.read(a)
        assert resp == AxiResp.SLVERR and value == 0, f"read {a:#05x}: {resp!r} {value:#x}"
    for a in rng.sample(holes, 48):
        resp = await tb.write(a + rng.randrange(4), M32, length=1)
        assert resp == AxiResp.SLVERR, f"write {a:#05x}: {resp!r}"
    tb.set_pauses(None)
    assert await tb.rd("CYCLE_BUDGET") == 0x5A5A5A5A
    assert await tb.rd("ARG6") == 0xA5A5A5A5
    await tb.settle()
    assert tb.take_events() == []


def _random_value(rng: random.Random, name: str) -> int:
    """A value to write to register ``name``: few commands, selects mostly in range."""
    if name == "CTRL":
        return rng.getrandbits(5) & rng.getrandbits(5)
    if name in ("IMEM_ADDR", "PT_SELECT") and rng.random() < 0.8:
        return rng.getrandbits(32) & (0x8000_0000 | 0x0303 | 0x3F)
    return rng.getrandbits(32)


async def _random_traffic(tb: TB, rng: random.Random, ops: int):
    """Random reads/writes (mapped and not, partial strobes) against the CSR model."""
    model, ports = tb.model, tb.ports
    dut = tb.dut
    head = {f: rng.getrandbits(32) for f in TRACE_FIELDS}
    ports.head = head
    dut.trace_head.value = sum(v << (32 * i) for i, v in enumerate(head.values()))
    ports.rvals = [rng.getrandbits(32) for _ in range(16)]
    for i, v in enumerate(ports.rvals):
        getattr(dut, f"regs__{i}").value = v
    ports.cvals = [rng.getrandbits(64) for _ in tb.counters]
    for i, v in enumerate(ports.cvals):
        getattr(dut, f"counters__{i}").value = v
    writable = [r for r in tb.map if r.access != Access.RO] + [tb.regs["IMEM_DATA_HI"]] * 4
    mapped = [r.addr for r in tb.map]
    stats = Counter()
    for op in range(ops):
        kind = rng.random()
        if kind < 0.04:  # change the run-state inputs between transactions
            tb.drive(active_bank=rng.getrandbits(1), swap_pending=rng.random() < 0.2,
                     busy=rng.getrandbits(1), trace_count=rng.choice((0, 3)),
                     error_code=rng.getrandbits(8))
            await tb.settle(1)
            continue
        if kind < 0.06:  # a run event or trace overflow; the interrupt line follows
            await tb.pulse(rng.choice(("run_done", "run_error", "trace_overflow")))
            await tb.settle(1)
            assert u(dut.irq) == model.irq, f"seed {SEED}, op {op}: irq {u(dut.irq)}"
            continue
        if kind < 0.5:
            addr = rng.choice(mapped) if rng.random() < 0.95 else rng.randrange(1 << 10) * 4
            got = await tb.read(addr)
            value, resp = model.read(addr)
            want = value, AxiResp(resp)
            assert got == want, (f"seed {SEED}, op {op}: read {addr:#05x} -> "
                                 f"{got[0]:#x}/{got[1]!r}, model {want[0]:#x}/{want[1]!r}")
            stats["read"] += 1
        else:
            r = rng.choice(writable)
            addr = r.addr if rng.random() < 0.95 else rng.randrange(1 << 10) * 4
            value = _random_value(rng, r.name)
            offset = rng.choice((0, 0, 0, 0, 1, 2, 3))
            length = 4 - offset if rng.random() < 0.7 else rng.randrange(1, 5 - offset)
            strb = ((1 << length) - 1) << offset
            got = await tb.write(addr, value, offset=offset, length=length)
            want = AxiResp(model.write(addr, value, strb))
            assert got == want, (f"seed {SEED}, op {op}: write {addr:#05x}={value:#x} "
                                 f"strb {strb:#x} -> {got!r}, model {want!r}")
            stats["write"] += 1
    await tb.settle()
    events = tb.take_events()
    assert events == ports.events, (f"seed {SEED}: port events differ\nDUT   {events}\n"
                                    f"model {ports.events}")
    ports.events = []
    assert u(tb.dut.cycle_budget) == model.rw["CYCLE_BUDGET"]
    for i in range(7):
        assert u(getattr(dut, f"args__{i}")) == model.rw[f"ARG{i}"]
    for b in range(2):
        assert (u(getattr(dut, f"bank_version__{b}"))
                == model.rw[f"BANK_VERSION{b}"])
    return stats


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def random_against_model(dut):
    """Random traffic, first without and then with random stalls on all five channels."""
    tb = await started(dut)
    rng = rng_for("random_against_model")
    await _random_traffic(tb, rng, OPS)
    tb.set_pauses(rng)
    stats = await _random_traffic(tb, rng, OPS)
    assert stats["read"] > 100 and stats["write"] > 100


@cocotb.test(timeout_time=TIMEOUT_MS, timeout_unit="ms")
async def concurrent_traffic(dut):
    """Overlapping reads and writes from many workers (AW/W/B and AR/R in flight at once)."""
    tb = await started(dut)
    rng = rng_for("concurrent_traffic")
    tb.set_pauses(rng)
    caps = {r.name: getattr(tb.cfg, r.name[5:].lower()) for r in tb.map
            if r.name.startswith("CAPS_")}
    finals = {}

    async def writer(i):
        for _ in range(12):
            v = rng.getrandbits(32)
            await tb.wr(f"ARG{i}", v)
            finals[i] = v

    async def reader():
        for _ in range(20):
            name = rng.choice(sorted(caps))
            assert await tb.rd(name) == caps[name], name

    tasks = [cocotb.start_soon(writer(i)) for i in range(7)]
    tasks += [cocotb.start_soon(reader()) for _ in range(4)]
    for t in tasks:
        await t
    tb.set_pauses(None)
    for i in range(7):
        assert await tb.rd(f"ARG{i}") == finals[i], f"ARG{i}"
