"""Reference model, stimulus and the cocotb side of the scratchpad tests.

Not collected by pytest (the name does not start with ``test_``). The plain
Python parts (:class:`WindowModel`, :class:`Traffic`, :func:`check_grants`) are
shared with ``tests/test_scratchpad.py``, which runs the same traffic under
Amaranth's simulator; the ``@cocotb.test`` below runs it under Verilator.
"""

from __future__ import annotations

import os
import random
from collections import deque
from dataclasses import dataclass

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

from firmware.config import CONFIGS, NPUConfig
from hdl.ports import SP_READ_LATENCY


@dataclass(frozen=True)
class Request:
    """One window request as a port presents it."""

    we: int
    addr: int
    wdata: int = 0
    wstrb: int = 0


class WindowModel:
    """The scratchpad as the window-port contract describes it, byte by byte.

    ``needs`` restates the bank rule of :class:`hdl.scratchpad.Scratchpad`;
    ``step`` applies one cycle: reads granted in it see the bytes before its writes.
    """

    def __init__(self, config: NPUConfig):
        self.w = config.bus_bytes
        self.banks = config.sp_banks
        self.size = config.sp_bytes
        self.nwords = config.sp_bytes // config.bus_bytes
        self.mem = bytearray(self.size)

    def needs(self, req: Request) -> set[int]:
        """Banks a request occupies."""
        word, off = divmod(req.addr, self.w)
        banks = {word % self.banks}
        if req.we:
            second = any(req.wstrb >> lane & 1 for lane in range(self.w - off, self.w))
        else:
            second = off != 0
        if second:
            banks.add((word + 1) % self.nwords % self.banks)
        return banks

    def read(self, addr: int) -> int:
        return int.from_bytes(bytes(self.mem[(addr + i) % self.size] for i in range(self.w)),
                              "little")

    def step(self, reqs: list[Request | None], grants: list[bool]) -> dict[int, int]:
        """Apply one cycle; return ``{port: rdata}`` of the reads granted in it."""
        rdata = {i: self.read(r.addr) for i, (r, g) in enumerate(zip(reqs, grants, strict=True))
                 if g and not r.we}
        for r, g in zip(reqs, grants, strict=True):
            if g and r.we:
                for lane in range(self.w):
                    if r.wstrb >> lane & 1:
                        self.mem[(r.addr + lane) % self.size] = r.wdata >> (8 * lane) & 0xFF
        return rdata


def check_grants(model: WindowModel, reqs: list[Request | None], ready: list[int]) -> None:
    """Assert the arbitration properties on the grants the hardware gave.

    * only presented requests are granted;
    * no bank is granted to two ports of the same kind;
    * a presented request is refused only when a lower-numbered granted port of
      the same kind holds one of its banks (so non-conflicting ports all go).
    """
    held = {0: {}, 1: {}}
    for i, (req, rdy) in enumerate(zip(reqs, ready, strict=True)):
        if req is None:
            assert not rdy, f"port {i} granted without a request"
            continue
        banks = model.needs(req)
        kind = held[req.we]
        blockers = {kind[b] for b in banks if b in kind}
        if rdy:
            assert not blockers, (f"port {i} {req} granted banks {sorted(banks)} already "
                                  f"granted to port(s) {sorted(blockers)}")
            kind.update(dict.fromkeys(banks, i))
        else:
            assert blockers, f"port {i} {req} refused though banks {sorted(banks)} are free"


class Traffic:
    """Random requests from several ports, obeying the request-hold rule.

    A port that has a request keeps presenting it unchanged until it is granted;
    an idle port starts a new one with probability ``load``. Addresses come from
    a small hot spot (conflicts, same-byte read/write), the end of the scratchpad
    (wrap) and anywhere; strobes are full, empty or random.
    """

    def __init__(self, config: NPUConfig, ports: int, seed: int, load: float = 0.7):
        self.rng = random.Random(seed)
        self.w, self.size, self.load = config.bus_bytes, config.sp_bytes, load
        self.hot = self.rng.randrange(self.size)
        self.pending: list[Request | None] = [None] * ports

    def _request(self) -> Request:
        rng, w = self.rng, self.w
        pick = rng.random()
        if pick < 0.45:
            addr = (self.hot + rng.randrange(3 * w)) % self.size
        elif pick < 0.65:
            addr = self.size - 1 - rng.randrange(2 * w)
        else:
            addr = rng.randrange(self.size)
        if rng.random() < 0.5:
            return Request(0, addr)
        strobe = rng.choice([(1 << w) - 1, 0, rng.getrandbits(w), rng.getrandbits(w)])
        return Request(1, addr, rng.getrandbits(8 * w), strobe)

    def requests(self) -> list[Request | None]:
        """This cycle's presented requests (call :meth:`granted` after)."""
        for i, req in enumerate(self.pending):
            if req is None and self.rng.random() < self.load:
                self.pending[i] = self._request()
        if self.rng.random() < 0.02:  # move the hot spot now and then
            self.hot = self.rng.randrange(self.size)
        return list(self.pending)

    def granted(self, grants: list[bool | int]) -> None:
        for i, g in enumerate(grants):
            if g:
                self.pending[i] = None


class Coverage:
    """Counts the interesting events of a run, so a test can insist they happened."""

    def __init__(self, model: WindowModel):
        self.model = model
        self.counts = dict(same_byte=0, wrap=0, unaligned=0, stall=0, multi_read=0,
                           multi_write=0, strobe_one_word=0)

    def record(self, reqs, grants):
        m, c, w = self.model, self.counts, self.model.w
        got = [r for r, g in zip(reqs, grants, strict=True) if g]
        c["stall"] += sum(1 for r, g in zip(reqs, grants, strict=True) if r and not g)
        c["multi_read"] += sum(not r.we for r in got) > 1
        c["multi_write"] += sum(r.we for r in got) > 1
        for r in got:
            c["wrap"] += r.addr + w > m.size
            c["unaligned"] += r.addr % w != 0
            c["strobe_one_word"] += r.we and r.addr % w != 0 and len(m.needs(r)) == 1
        written = {(r.addr + i) % m.size for r in got if r.we
                   for i in range(w) if r.wstrb >> i & 1}
        c["same_byte"] += any((r.addr + i) % m.size in written
                              for r in got if not r.we for i in range(w))


# ---- cocotb (Verilator) ------------------------------------------------------------------

CONFIG_NAME = "default"
PORTS = 4
CYCLES = 2000


def _port(dut, i, name):
    return getattr(dut, f"ports__{i}__{name}")


@cocotb.test()
async def scratchpad_random_traffic(dut):
    """Random concurrent traffic against :class:`WindowModel` and the arbitration rules."""
    config = CONFIGS[CONFIG_NAME]
    seed = int(os.environ.get("SP_SEED", os.environ.get("NPU_SEED", "1")))
    model, traffic = WindowModel(config), Traffic(config, PORTS, seed)
    cover = Coverage(model)
    for i in range(PORTS):
        _port(dut, i, "valid").value = 0
    dut.rst.value = 1
    Clock(dut.clk, 10, unit="ns").start()
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0

    due = deque([{}] * SP_READ_LATENCY)  # the responses of the last cycles' grants
    for cycle in range(CYCLES):
        await FallingEdge(dut.clk)
        # responses to the reads granted SP_READ_LATENCY cycles ago
        expect = due.popleft()
        for i in range(PORTS):
            rvalid = int(_port(dut, i, "rvalid").value)
            assert rvalid == (i in expect), f"seed {seed} cycle {cycle}: port {i} rvalid={rvalid}"
            if rvalid:
                got = int(_port(dut, i, "rdata").value)
                assert got == expect[i], (f"seed {seed} cycle {cycle}: port {i} rdata "
                                          f"{got:#x}, expected {expect[i]:#x}")
        reqs = traffic.requests()
        for i, r in enumerate(reqs):
            _port(dut, i, "valid").value = int(r is not None)
            if r is not None:
                _port(dut, i, "we").value = r.we
                _port(dut, i, "addr").value = r.addr
                _port(dut, i, "wdata").value = r.wdata
                _port(dut, i, "wstrb").value = r.wstrb
        await ReadOnly()
        ready = [int(_port(dut, i, "ready").value) for i in range(PORTS)]
        try:
            check_grants(model, reqs, ready)
        except AssertionError as e:
            raise AssertionError(f"seed {seed} cycle {cycle}: {e}") from None
        grants = [bool(r) for r in ready]
        cover.record(reqs, grants)
        due.append(model.step(reqs, grants))
        traffic.granted(grants)
    missing = [k for k, v in cover.counts.items() if v == 0]
    assert not missing, f"seed {seed}: traffic never produced {missing}: {cover.counts}"
    dut._log.info("coverage %s", cover.counts)
