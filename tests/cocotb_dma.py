"""cocotb side of the DMA tests (run by ``tests/test_dma.py`` and ``bench/bench_dma.py``).

Not collected by pytest. The toplevel is :class:`hdl.dma.DMAShell`; the pytest side
passes the :class:`NPUConfig` as JSON in ``DMA_TB_CONFIG`` and the seed in
``DMA_TB_SEED``.

DRAM is a cocotbext-axi RAM that answers SLVERR/DECERR for chosen address ranges,
the scratchpad is a byte-array model of the window port that refuses requests at
random, and every AXI channel is stalled at random. Each command is checked
against the golden semantics (``firmware.golden``'s ``_op_load``/``_op_store``:
row ``i`` is ``nbytes`` at DRAM ``dram + i*stride`` and at scratchpad
``sp + i*nbytes``), and both memories are compared whole afterwards, so a byte
written outside the rows is caught. A bus monitor checks every burst against
:func:`hdl.dma.burst_plan` and the handshake rules.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
from collections import deque
from dataclasses import dataclass, field

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, Event, RisingEdge, with_timeout
from cocotbext.axi import AxiBus
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.memory import Memory

from firmware.config import NPUConfig
from hdl.dma import burst_plan
from hdl.ports import DMA_DONE_LAYOUT, SP_READ_LATENCY, dma_command_layout

DRAM_BYTES = 1 << 20
PAGE = 4096
RESP_SLVERR, RESP_DECERR = 2, 3
MASK32 = (1 << 32) - 1

# ---- configuration from the pytest side --------------------------------------------


def tb_config() -> NPUConfig:
    return NPUConfig(**json.loads(os.environ["DMA_TB_CONFIG"]))


def tb_rng(name: str) -> random.Random:
    seed = int(os.environ.get("DMA_TB_SEED", "1"))
    return random.Random(f"{seed}:{name}")


def _pack(layout, values: dict) -> int:
    word = 0
    for name, fld in layout:
        word |= (values[name] & ((1 << fld.width) - 1)) << fld.offset
    return word


def _unpack(layout, word: int) -> dict:
    return {name: (word >> fld.offset) & ((1 << fld.width) - 1) for name, fld in layout}


# ---- commands and the golden semantics ---------------------------------------------


@dataclass
class Cmd:
    """One resolved DMA command (``dma_command_layout``)."""

    dram: int
    stride: int  # 32-bit: 2**32 - k steps back by k
    rows: int
    nbytes: int
    sp: int

    def row_addr(self, i: int) -> int:
        return (self.dram + i * self.stride) & MASK32

    def fields(self) -> dict:
        return {"dram": self.dram, "stride": self.stride, "rows": self.rows,
                "nbytes": self.nbytes, "sp": self.sp}

    def __str__(self):
        stride = self.stride - (1 << 32) if self.stride >> 31 else self.stride
        return (f"Cmd(dram={self.dram:#x}, stride={stride}, rows={self.rows}, "
                f"nbytes={self.nbytes}, sp={self.sp:#x})")


def golden_load(cmd: Cmd, dram: bytearray, sp: bytearray, rows=None) -> None:
    """``_op_load`` of the golden model, for the first ``rows`` rows."""
    for i in range(cmd.rows if rows is None else rows):
        a, s = cmd.row_addr(i), cmd.sp + i * cmd.nbytes
        sp[s:s + cmd.nbytes] = dram[a:a + cmd.nbytes]


def golden_store(cmd: Cmd, dram: bytearray, sp: bytearray, rows=None) -> None:
    """``_op_store`` of the golden model, for the first ``rows`` rows."""
    for i in range(cmd.rows if rows is None else rows):
        a, s = cmd.row_addr(i), cmd.sp + i * cmd.nbytes
        dram[a:a + cmd.nbytes] = sp[s:s + cmd.nbytes]


def dram_span(cmd: Cmd) -> tuple[int, int]:
    """Lowest and one-past-highest DRAM byte of the command's rows."""
    starts = [cmd.row_addr(i) for i in (0, cmd.rows - 1)]
    return min(starts), max(starts) + cmd.nbytes


def failing_row(cmd: Cmd, fault: tuple[int, int]) -> int | None:
    """First row with a byte in the (bus-aligned) faulty range, or None."""
    for i in range(cmd.rows):
        a = cmd.row_addr(i)
        if a < fault[1] and fault[0] < a + cmd.nbytes:
            return i
    return None


# ---- DRAM: cocotbext-axi RAM with fault ranges ---------------------------------------


class _FaultyRead(AxiRamRead):
    """Read side: a beat whose word touches a fault range answers its response code."""

    def __init__(self, faults, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.faults = faults
        self._resp = 0
        send = self.r_channel.send

        async def send_with_resp(r):
            if self._resp:
                r.rresp, self._resp = self._resp, 0
            await send(r)

        self.r_channel.send = send_with_resp

    async def _read(self, address, length):
        for lo, hi, resp in self.faults:
            if address < hi and lo < address + length:
                self._resp = resp
                return bytes(length)
        return await super()._read(address, length)


class _FaultyWrite(AxiRamWrite):
    """Write side: bytes in a fault range are not written; the burst answers the code."""

    def __init__(self, faults, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.faults = faults
        self._resp = 0
        send = self.b_channel.send

        async def send_with_resp(b):
            if self._resp:
                b.bresp, self._resp = self._resp, 0
            await send(b)

        self.b_channel.send = send_with_resp

    async def _write(self, address, data):
        for lo, hi, resp in self.faults:
            if address < hi and lo < address + len(data):
                self._resp = self._resp or resp
                return
        await super()._write(address, data)


class FaultyAxiRam(Memory):
    """cocotbext-axi ``AxiRam`` whose ``faults`` (lo, hi, resp) ranges answer errors."""

    def __init__(self, bus, clock, reset, size):
        super().__init__(size)
        self.faults: list[tuple[int, int, int]] = []
        self.write_if = _FaultyWrite(self.faults, bus.write, clock, reset, mem=self.mem)
        self.read_if = _FaultyRead(self.faults, bus.read, clock, reset, mem=self.mem)

    def channels(self):
        w, r = self.write_if, self.read_if
        return [w.aw_channel, w.w_channel, w.b_channel, r.ar_channel, r.r_channel]


# ---- scratchpad window ports ----------------------------------------------------------


class Scratchpad:
    """Byte-array model of the scratchpad behind two window ports (load: write, store: read).

    A request is granted with probability ``1 - refuse`` each cycle; read data is
    valid exactly ``SP_READ_LATENCY`` cycles after the grant. Requests must stay unchanged until
    granted, and the load port may only write and the store port only read.
    """

    def __init__(self, dut, size: int, width: int, rng: random.Random, tb_steps: list):
        self.dut, self.size, self.width, self.rng = dut, size, width, rng
        self.mem = bytearray(size)
        self.refuse = 0.0
        self.corrupt = os.environ.get("DMA_TB_BREAK") == "sp"  # prove the checks bite
        for prefix, write in (("load_sp", True), ("store_sp", False)):
            tb_steps.append(self._port(prefix, write))

    def _window(self, addr: int) -> list[int]:
        return [(addr + i) % self.size for i in range(self.width)]

    def _port(self, prefix: str, write: bool):
        sig = {n: getattr(self.dut, f"{prefix}__{n}") for n in
               ("valid", "ready", "addr", "we", "wdata", "wstrb", "rvalid", "rdata")}
        sig["ready"].value = 0
        sig["rvalid"].value = 0
        sig["rdata"].value = 0
        ready, held = 0, None
        due = deque([None] * (SP_READ_LATENCY - 1))  # read data on its way
        while True:
            yield  # one clock edge
            rdata = None
            if int(sig["valid"].value):
                req = (int(sig["addr"].value), int(sig["we"].value),
                       int(sig["wdata"].value) if write else 0,
                       int(sig["wstrb"].value) if write else 0)
                assert held is None or req == held, \
                    f"{prefix}: request changed while refused: {held} -> {req}"
                assert req[0] < self.size, f"{prefix}: address {req[0]:#x} out of range"
                assert req[1] == write, f"{prefix}: we={req[1]} on the wrong port"
                if ready:
                    held = None
                    lanes = self._window(req[0])
                    if write:
                        data = req[2].to_bytes(self.width, "little")
                        strb = req[3]
                        if self.corrupt and strb:
                            strb &= strb - 1  # drop the lowest strobed lane
                        for i, a in enumerate(lanes):
                            if strb >> i & 1:
                                self.mem[a] = data[i]
                    else:
                        rdata = int.from_bytes(bytes(self.mem[a] for a in lanes), "little")
                else:
                    held = req
            else:
                assert held is None, f"{prefix}: request withdrawn while refused"
            due.append(rdata)
            rdata = due.popleft()
            sig["rvalid"].value = int(rdata is not None)
            if rdata is not None:
                sig["rdata"].value = rdata
            ready = int(self.rng.random() >= self.refuse)
            sig["ready"].value = ready


# ---- bus monitor -----------------------------------------------------------------------


@dataclass
class BusStats:
    ar: list = field(default_factory=list)  # (addr, beats) of accepted bursts
    aw: list = field(default_factory=list)
    r_beats: int = 0
    w_beats: int = 0
    b_resps: int = 0
    max_reads_in_flight: int = 0


class BusMonitor:
    """Records bursts and beats and checks AXI handshake stability and burst rules."""

    def __init__(self, dut, width: int, tb_steps: list):
        self.dut, self.width = dut, width
        self.stats = BusStats()
        self.size = width.bit_length() - 1
        tb_steps.append(self._run())

    def _addr_channel(self, ch: str, held: dict):
        d = self.dut
        if not int(getattr(d, f"axi__{ch}valid").value):
            assert held.get(ch) is None, f"{ch}valid dropped before {ch}ready"
            return None
        req = (int(getattr(d, f"axi__{ch}addr").value), int(getattr(d, f"axi__{ch}len").value),
               int(getattr(d, f"axi__{ch}size").value), int(getattr(d, f"axi__{ch}burst").value))
        assert held.get(ch) in (None, req), f"{ch} changed while stalled: {held[ch]} -> {req}"
        addr, length, size, burst = req
        assert size == self.size, f"{ch}size={size}, expected {self.size}"
        assert burst == 1, f"{ch}burst={burst}: INCR expected"
        assert addr % self.width == 0, f"{ch}addr={addr:#x} not beat-aligned"
        assert addr // PAGE == (addr + (length + 1) * self.width - 1) // PAGE, \
            f"{ch} burst {addr:#x}+{length + 1} beats crosses 4 KiB"
        if int(getattr(d, f"axi__{ch}ready").value):
            held[ch] = None
            return addr, length + 1
        held[ch] = req
        return None

    def _run(self):
        d, st = self.dut, self.stats
        held: dict = {}
        w_held = None
        outstanding = 0
        while True:
            yield  # one clock edge
            for ch, log in (("ar", st.ar), ("aw", st.aw)):
                burst = self._addr_channel(ch, held)
                if burst:
                    log.append(burst)
                    if ch == "ar":
                        outstanding += 1
            if int(d.axi__wvalid.value):
                beat = (int(d.axi__wdata.value), int(d.axi__wstrb.value),
                        int(d.axi__wlast.value))
                assert w_held in (None, beat), "W beat changed while stalled"
                assert beat[1], "W beat without strobes"
                if int(d.axi__wready.value):
                    st.w_beats += 1
                    w_held = None
                else:
                    w_held = beat
            else:
                assert w_held is None, "wvalid dropped before wready"
            if int(d.axi__rvalid.value) and int(d.axi__rready.value):
                st.r_beats += 1
                if int(d.axi__rlast.value):
                    outstanding -= 1
            if int(d.axi__bvalid.value) and int(d.axi__bready.value):
                st.b_resps += 1
            st.max_reads_in_flight = max(st.max_reads_in_flight, outstanding)


# ---- the testbench -----------------------------------------------------------------------


class Channel:
    """Drives one command stream, collects its completions and byte counter."""

    def __init__(self, tb: TB, name: str):
        self.tb, self.name = tb, name
        d = tb.dut
        self.valid = getattr(d, f"{name}_cmd__valid")
        self.payload = getattr(d, f"{name}_cmd__payload")
        self.ready = getattr(d, f"{name}_cmd__ready")
        self.done_valid = getattr(d, f"{name}_done__valid")
        self.done_payload = getattr(d, f"{name}_done__payload")
        self.bytes = getattr(d, "read_bytes" if name == "load" else "write_bytes")
        self.busy = getattr(d, f"{name}_busy")
        self.stall = getattr(d, f"{name}_stall")
        self.done: list[dict] = []
        self.byte_count = 0
        self.busy_cycles = 0
        self.stall_cycles = 0
        self.queue: list[Cmd] = []
        self.issued = 0
        self.gap = 0.0  # chance of an idle cycle between commands
        self.idle = Event()
        self.valid.value = 0
        self.payload.value = 0
        tb.steps += [self._drive(), self._monitor()]

    def _drive(self):
        layout = dma_command_layout(self.tb.config)
        rng = self.tb.rng
        presenting = False
        while True:
            yield  # one clock edge
            if presenting and int(self.ready.value):
                self.issued += 1
                presenting = False
            if not presenting and self.issued < len(self.queue) and rng.random() >= self.gap:
                self.payload.value = _pack(layout, self.queue[self.issued].fields())
                presenting = True
            self.valid.value = int(presenting)

    def _monitor(self):
        while True:
            yield  # one clock edge
            if int(self.done_valid.value):
                self.done.append(_unpack(DMA_DONE_LAYOUT, int(self.done_payload.value)))
                assert len(self.done) <= len(self.queue), f"{self.name}: extra completion"
            n = int(self.bytes.value)
            self.byte_count += n
            busy, stall = int(self.busy.value), int(self.stall.value)
            assert busy or not stall, f"{self.name}_stall without {self.name}_busy"
            self.busy_cycles += busy
            self.stall_cycles += stall
            if len(self.done) == len(self.queue):
                self.idle.set()

    def submit(self, cmds: list[Cmd]) -> None:
        self.queue.extend(cmds)
        self.idle.clear()

    async def wait_idle(self, cycles: int):
        await with_timeout(self.idle.wait(), cycles * 10, "ns")
        await ClockCycles(self.tb.dut.clk, 2)
        assert len(self.done) == len(self.queue), f"{self.name}: extra completion"
        assert not int(self.busy.value), f"{self.name}_busy after the last completion"


class TB:
    """Clock, reset, DRAM, scratchpad, bus monitor and the two command channels."""

    def __init__(self, dut, name: str):
        self.dut = dut
        self.config = tb_config()
        self.rng = tb_rng(name)
        self.width = self.config.bus_bytes
        assert len(dut.axi__wstrb) == self.width
        Clock(dut.clk, 10, unit="ns").start()
        dut.rst.value = 1
        self.ram = FaultyAxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, DRAM_BYTES)
        for side in (self.ram.read_if, self.ram.write_if):
            side.log.setLevel(logging.WARNING)  # one INFO line per burst otherwise
        self.ram.write(0, self.rng.randbytes(DRAM_BYTES))
        self.steps: list = []  # generators advanced once per clock edge by one coroutine
        self.sp = Scratchpad(dut, self.config.sp_bytes, self.width, self.rng, self.steps)
        self.sp.mem[:] = self.rng.randbytes(self.config.sp_bytes)
        self.bus = BusMonitor(dut, self.width, self.steps)
        self.load = Channel(self, "load")
        self.store = Channel(self, "store")
        for step in self.steps:
            next(step)  # run up to the first edge
        cocotb.start_soon(self._tick())

    async def _tick(self):
        # One coroutine for every model: far cheaper than one per model.
        edge = RisingEdge(self.dut.clk)
        while True:
            await edge
            for step in self.steps:
                next(step)

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    def backpressure(self, p_bus: float, p_sp: float, gap: float = 0.0) -> None:
        """Stall each AXI channel with probability ``p_bus`` a cycle, refuse the scratchpad
        with ``p_sp``, leave a command stream idle with ``gap``."""
        for ch in self.ram.channels():
            if p_bus:
                rng = random.Random(self.rng.random())
                ch.set_pause_generator(rng.random() < p_bus for _ in itertools.count())
            else:
                ch.clear_pause_generator()
                ch.pause = False  # clearing keeps the last pause value
        self.sp.refuse = p_sp
        self.load.gap = self.store.gap = gap

    def dram(self) -> bytearray:
        return bytearray(self.ram.read(0, DRAM_BYTES))

    async def run(self, loads: list[Cmd], stores: list[Cmd]):
        """Run both lists concurrently; return the completions of this batch."""
        n_load, n_store = len(self.load.done), len(self.store.done)
        self.load.submit(loads)
        self.store.submit(stores)
        beats = sum(c.rows * (c.nbytes // self.width + 2) for c in loads + stores)
        await self.load.wait_idle(2000 + 40 * beats)
        await self.store.wait_idle(2000 + 40 * beats)
        return self.load.done[n_load:], self.store.done[n_store:]


def compare(what: str, got: bytes, want: bytes, cmds=(), allowed=None) -> None:
    """Assert ``got == want`` byte for byte; ``allowed[a]`` lists extra legal values."""
    bad = [a for a in range(len(want)) if got[a] != want[a]
           and not (allowed and a in allowed and got[a] in allowed[a])]
    if bad:
        a = bad[0]
        raise AssertionError(
            f"{what}: {len(bad)} wrong bytes, first at {a:#x}: got {got[a]:#04x}, "
            f"want {want[a]:#04x}; commands: {', '.join(map(str, cmds))}")


# ---- random commands -------------------------------------------------------------------


class Allocator:
    """Hands out non-overlapping regions with random gaps (the gaps are guard bytes)."""

    def __init__(self, rng: random.Random, size: int, start: int = 0):
        self.rng, self.size, self.next = rng, size, start

    def take(self, n: int, align_to_page_end: bool = False) -> int | None:
        base = self.next + self.rng.randrange(1, 80)
        if align_to_page_end:  # start just below a 4 KiB boundary
            base = (base // PAGE + 1) * PAGE - self.rng.randrange(1, 3 * 64)
            if base <= self.next:
                base += PAGE
        if base + n + 1 > self.size:
            return None
        self.next = base + n
        return base


def random_cmd(rng: random.Random, dram: Allocator, sp: Allocator, budget: int,
               store: bool) -> Cmd | None:
    """A random command within ``budget`` bytes, or None when memory ran out."""
    kind = rng.random()
    if kind < 0.35:
        nbytes = rng.randint(1, 24)
    elif kind < 0.7:
        nbytes = rng.randint(1, 300)
    else:
        nbytes = rng.randint(1, min(4096, budget))
    rows = rng.randint(1, max(1, min(256, budget // nbytes)))
    if rng.random() < 0.3:
        rows = 1
    s = rng.random()
    if s < 0.35:
        stride = nbytes
    elif s < 0.65:
        stride = nbytes + rng.randint(1, 70)
    elif s < 0.8:
        stride = nbytes + rng.randint(70, 5000)
    elif s < 0.9 and nbytes > 1:
        stride = rng.randint(1, nbytes - 1)  # rows overlap in DRAM
    else:
        stride = -rng.randint(nbytes, nbytes + 100)  # rows go down in DRAM
    rows = max(1, min(rows, (1 << 16) // abs(stride)))  # keep the DRAM span modest
    span = (rows - 1) * abs(stride) + nbytes
    base = dram.take(span, align_to_page_end=rng.random() < 0.3)
    spb = sp.take(rows * nbytes)
    if base is None or spb is None:
        return None
    first = base + (rows - 1) * -stride if stride < 0 else base
    return Cmd(first, stride & MASK32, rows, nbytes, spb)


def random_batch(tb: TB, budget_bytes: int):
    """Loads and stores whose DRAM and scratchpad regions are all disjoint."""
    rng = tb.rng
    dram = Allocator(rng, DRAM_BYTES, rng.randrange(0, DRAM_BYTES // 2))
    sp = Allocator(rng, tb.config.sp_bytes)
    loads, stores = [], []
    for lst, is_store in ((loads, False), (stores, True)):
        total = 0
        while total < budget_bytes:
            cmd = random_cmd(rng, dram, sp, min(4096, budget_bytes), is_store)
            if cmd is None:
                break
            lst.append(cmd)
            total += cmd.rows * cmd.nbytes
    rng.shuffle(loads)  # independent regions: any order is legal
    rng.shuffle(stores)
    return loads, stores


def expected_bursts(cmds: list[Cmd], width: int) -> list[tuple[int, int]]:
    return [b for c in cmds for i in range(c.rows)
            for b in burst_plan(c.row_addr(i), c.nbytes, width)]


# ---- tests -----------------------------------------------------------------------------


async def check_batch(tb: TB, loads: list[Cmd], stores: list[Cmd]) -> None:
    """Run a fault-free batch and check memories, completions, counters and bursts."""
    dram0, sp0 = tb.dram(), bytearray(tb.sp.mem)
    want_dram, want_sp = bytearray(dram0), bytearray(sp0)
    for c in loads:
        golden_load(c, dram0, want_sp)
    for c in stores:
        golden_store(c, want_dram, sp0)
    ar0, aw0 = len(tb.bus.stats.ar), len(tb.bus.stats.aw)
    rb0, wb0 = tb.load.byte_count, tb.store.byte_count
    ld, st = await tb.run(loads, stores)
    compare("scratchpad after loads", tb.sp.mem, want_sp, loads)
    compare("DRAM after stores", tb.dram(), want_dram, stores)
    for name, done, cmds in (("load", ld, loads), ("store", st, stores)):
        for c, d in zip(cmds, done, strict=True):
            assert d["error"] == 0, f"{name} {c} reported a bus error at {d['addr']:#x}"
    assert tb.load.byte_count - rb0 == sum(c.rows * c.nbytes for c in loads), "read_bytes"
    assert tb.store.byte_count - wb0 == sum(c.rows * c.nbytes for c in stores), "write_bytes"
    assert tb.bus.stats.ar[ar0:] == expected_bursts(loads, tb.width), "AR bursts"
    assert tb.bus.stats.aw[aw0:] == expected_bursts(stores, tb.width), "AW bursts"


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def random_transfers(dut):
    """Random concurrent loads and stores under random backpressure match the golden model."""
    tb = TB(dut, "random_transfers")
    await tb.reset()
    settings = [(0.0, 0.0, 0.0), (0.3, 0.3, 0.2), (0.6, 0.5, 0.5), (0.1, 0.7, 0.0)]
    rounds = int(os.environ.get("DMA_TB_ROUNDS", "4"))
    for r in range(rounds):
        tb.backpressure(*settings[r % len(settings)])
        loads, stores = random_batch(tb, budget_bytes=min(4000, tb.config.sp_bytes // 3))
        await check_batch(tb, loads, stores)
    # the busy/stall outputs agree with the beats the bus saw
    assert tb.load.busy_cycles - tb.load.stall_cycles == tb.bus.stats.r_beats
    assert tb.store.busy_cycles - tb.store.stall_cycles == tb.bus.stats.w_beats
    assert tb.bus.stats.b_resps == len(tb.bus.stats.aw)


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def edge_cases(dut):
    """Hand-picked rows: 1-byte rows in every lane, 4 KiB crossings, maximal rows."""
    tb = TB(dut, "edge_cases")
    await tb.reset()
    w = tb.width
    base = 5 * PAGE
    cases = [
        [Cmd(base + i, 1, 1, 1, 64 + j) for i in range(w) for j in (0, w - 1)][:2 * w],
        [Cmd(base + PAGE - 3, 7, 3, 7, 200)],  # crosses a page within a row
        [Cmd(base + 2 * PAGE - w * 5 + 1, 4096, 1, 4096, 512)],  # 4 KiB row across a page
        [Cmd(base + 4 * PAGE, 4096, 1, 4096, 5000)],  # aligned 4 KiB row: 256-beat cap
        [Cmd(base + 6 * PAGE + 3, 3, 256, 3, 9000)],  # 256 dense odd rows
        [Cmd(base + 7 * PAGE + w - 1, (-13) & MASK32, 9, 2, 11 * 1024 + 1)],
    ]
    for p_bus, p_sp in ((0.0, 0.0), (0.5, 0.5)):
        tb.backpressure(p_bus, p_sp)
        for cmds in cases:
            cmds = [c for c in cmds if c.sp + c.rows * c.nbytes <= tb.config.sp_bytes]
            stores = [Cmd(c.dram + 64 * PAGE, c.stride, c.rows, c.nbytes,
                          (c.sp + tb.config.sp_bytes // 2) % tb.config.sp_bytes)
                      for c in cmds]
            stores = [c for c in stores if c.sp + c.rows * c.nbytes <= tb.config.sp_bytes]
            await check_batch(tb, cmds, stores)


def _fault_for_row(tb: TB, cmd: Cmd, row: int) -> tuple[int, int]:
    """A bus-aligned faulty range inside row ``row`` of ``cmd``."""
    w = tb.width
    a = cmd.row_addr(row) + tb.rng.randrange(cmd.nbytes)
    lo = a - a % w
    return lo, lo + w * tb.rng.randint(1, 3)


def _error_cmd(tb: TB, dram: int, sp: int) -> Cmd:
    """A multi-row command with random alignment, length and stride."""
    rng = tb.rng
    nbytes = rng.choice([rng.randint(1, 40), rng.randint(1, 600), rng.randint(1, 2500)])
    rows = rng.randint(2, max(2, min(40, 3000 // nbytes)))
    stride = nbytes + rng.choice([0, 0, rng.randint(1, 50)])
    return Cmd(dram + rng.randrange(64), stride, rows, nbytes, sp)


async def _check_error(tb: TB, store: bool, resp: int, p_bus: float, p_sp: float):
    """One failing command queued between good ones, with the other channel busy too."""
    rng = tb.rng
    half = tb.config.sp_bytes // 2
    # The channel under test uses one half of the scratchpad, the other channel the other.
    mine_sp = Allocator(rng, half if not store else tb.config.sp_bytes, 0 if not store else half)
    other_sp = half if not store else 0
    region = rng.randrange(0, 100) * PAGE
    before = Cmd(region + rng.randrange(64), 40, 3, 33, 0)
    bad = _error_cmd(tb, region + 3 * PAGE, 0)
    after = Cmd(region + 20 * PAGE + rng.randrange(64), 99, 5, 77, 0)
    for c in (before, bad, after):
        c.sp = mine_sp.take(c.rows * c.nbytes)
    other = Cmd(region + 40 * PAGE + rng.randrange(64), 300, 4, 200,
                other_sp + rng.randrange(half - 800))
    row = rng.choice([0, bad.rows - 1, rng.randrange(bad.rows)])
    fault = _fault_for_row(tb, bad, row)
    row = failing_row(bad, fault)  # an earlier row may share the faulty word
    tb.ram.faults[:] = [(*fault, resp)]
    tb.backpressure(p_bus, p_sp)

    dram0, sp0 = tb.dram(), bytearray(tb.sp.mem)
    want_dram, want_sp = bytearray(dram0), bytearray(sp0)
    full_dram, full_sp = bytearray(dram0), bytearray(sp0)  # as if the bad command succeeded
    mine = [before, bad, after]
    if store:
        golden_store(before, want_dram, sp0)
        golden_store(bad, want_dram, sp0, rows=row)
        golden_store(after, want_dram, sp0)
        for c in mine:
            golden_store(c, full_dram, sp0)
        golden_load(other, dram0, want_sp)
    else:
        golden_load(before, dram0, want_sp)
        golden_load(bad, dram0, want_sp, rows=row)
        golden_load(after, dram0, want_sp)
        for c in mine:
            golden_load(c, dram0, full_sp)
        golden_store(other, want_dram, sp0)
    rb0, wb0 = tb.load.byte_count, tb.store.byte_count
    bursts = tb.bus.stats.aw if store else tb.bus.stats.ar
    n0 = len(bursts)
    loads, stores = ([other], mine) if store else (mine, [other])
    ld, st = await tb.run(loads, stores)
    tb.ram.faults[:] = []

    # The failing command's bursts stop soon after the failing one: at most the
    # bursts already queued in the DMA (8 in flight, plus the pipeline) follow it.
    w = tb.width
    plan_before, plan_after = expected_bursts([before], w), expected_bursts([after], w)
    plan_bad = expected_bursts([bad], w)
    got = bursts[n0:]
    assert got[:len(plan_before)] == plan_before and got[-len(plan_after):] == plan_after, \
        f"bursts {got} around the failing command"
    issued = got[len(plan_before):len(got) - len(plan_after)]
    first_bad = next(i for i, (a, n) in enumerate(plan_bad)
                     if a < fault[1] and fault[0] < a + n * w)
    assert issued == plan_bad[:len(issued)], "bursts of the failing command"
    assert first_bad < len(issued) <= min(len(plan_bad), first_bad + 12), (
        f"{len(issued)} of {len(plan_bad)} bursts issued, the burst at {first_bad} failed")

    done = st if store else ld
    assert [d["error"] for d in done] == [0, 1, 0], f"completions {done} for {mine}"
    assert done[1]["addr"] == bad.row_addr(row), (
        f"error address {done[1]['addr']:#x}, want row {row} at {bad.row_addr(row):#x} "
        f"(fault {fault[0]:#x}..{fault[1]:#x}, {bad})")
    assert [d["error"] for d in (ld if store else st)] == [0]
    good = before.rows * before.nbytes + row * bad.nbytes + after.rows * after.nbytes
    moved = (tb.store.byte_count - wb0, tb.load.byte_count - rb0)
    assert moved == ((good, other.rows * other.nbytes) if store
                     else (other.rows * other.nbytes, good)), f"byte counters {moved}"

    # The failing row (and for stores, the bursts already in flight after it) may
    # hold old or new bytes; every other byte is exact.
    if store:
        loose = {}
        for i in range(row, bad.rows):
            a = bad.row_addr(i)
            for j in range(bad.nbytes):
                if not fault[0] <= a + j < fault[1]:
                    loose[a + j] = (full_dram[a + j],)
        compare("DRAM after a failed store", tb.dram(), want_dram, mine, loose)
        compare("scratchpad (load beside a failed store)", tb.sp.mem, want_sp, [other])
    else:
        s = bad.sp + row * bad.nbytes
        loose = {a: (full_sp[a],) for a in range(s, s + bad.nbytes)}
        compare("scratchpad after a failed load", tb.sp.mem, want_sp, mine, loose)
        compare("DRAM (store beside a failed load)", tb.dram(), want_dram, [other])


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def bus_errors(dut):
    """SLVERR/DECERR on R and B: error completion with the row address, clean recovery."""
    tb = TB(dut, "bus_errors")
    await tb.reset()
    for i, (store, resp) in enumerate(itertools.product((False, True),
                                                        (RESP_SLVERR, RESP_DECERR))):
        for p_bus, p_sp in ((0.0, 0.0), (0.4, 0.5)):
            await _check_error(tb, store, resp, p_bus, p_sp)
        tb.dut._log.info("bus error case %d passed", i)
    # the bus is clean: a fault-free batch still works
    tb.backpressure(0.3, 0.3)
    loads, stores = random_batch(tb, budget_bytes=2000)
    await check_batch(tb, loads, stores)


async def _measure(tb: TB, loads: list[Cmd], stores: list[Cmd]) -> float:
    """Bytes moved per cycle for one batch (completions included)."""
    start = get_sim_time("ns")
    await check_batch(tb, loads, stores)
    cycles = (get_sim_time("ns") - start) / 10 - 2  # wait_idle's 2 cycles
    return sum(c.rows * c.nbytes for c in loads + stores) / cycles


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def throughput(dut):
    """Bytes per cycle on long rows: near one beat per cycle without backpressure.

    With ``DMA_BENCH_OUT`` set, the figures are written there as JSON.
    """
    tb = TB(dut, "throughput")
    await tb.reset()
    w = tb.width
    half = tb.config.sp_bytes // 2
    n = min(4096, half // 2)
    out = os.environ.get("DMA_BENCH_OUT")
    rows = (half // 2) // n if out else 1  # the benchmark moves more for steadier figures
    figures = {"bus_bytes": w}
    for label, p_bus, p_sp in (("zero_backpressure", 0.0, 0.0),
                               ("random_backpressure", 0.25, 0.25)):
        tb.backpressure(p_bus, p_sp)
        load = Cmd(16 * PAGE + 3, n + 40, rows, n, 5)
        store = Cmd(64 * PAGE + 1, n + 40, rows, n, half + 2)
        small = [Cmd(128 * PAGE + 64 * i + 1, 64, 8, 2 * w, 8 * 2 * w * i) for i in range(8)]
        r = await _measure(tb, [load], [])
        s = await _measure(tb, [], [store])
        both = await _measure(tb, [load], [store])
        rs = await _measure(tb, small, [])
        figures[label] = {
            "load_bytes_per_cycle": round(r, 3),
            "store_bytes_per_cycle": round(s, 3),
            "concurrent_bytes_per_cycle": round(both, 3),
            "load_efficiency": round(r / w, 3),
            "store_efficiency": round(s / w, 3),
            "short_row_load_bytes_per_cycle": round(rs, 3),
        }
    figures["max_read_bursts_in_flight"] = tb.bus.stats.max_reads_in_flight
    tb.dut._log.info("throughput: %s", figures)
    if out:
        with open(out, "w") as fh:
            json.dump(figures, fh)
    zero = figures["zero_backpressure"]
    assert zero["load_efficiency"] >= 0.85, figures
    assert zero["store_efficiency"] >= 0.85, figures
    assert zero["concurrent_bytes_per_cycle"] >= 1.6 * w, figures
    assert figures["max_read_bursts_in_flight"] >= 2, figures
