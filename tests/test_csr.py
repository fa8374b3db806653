"""The AXI4-Lite CSR block (hdl/csr.py).

Under Verilator with cocotbext-axi's ``AxiLiteMaster`` (``tests/cocotb_csr.py``),
for the "default" and "small" configurations, and under Amaranth's simulator for
the channel corner cases that are easiest to drive by hand: W before AW, AW and
W while a B response is held back, R held under ``rready`` low.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from amaranth.sim import Simulator

from firmware import regs as regs_module
from firmware.config import CONFIGS
from firmware.regs import addresses
from hdl.axi import RESP_OKAY, RESP_SLVERR
from hdl.csr import CSRBlock
from verif.sim import run_cocotb, sim_build_dir, to_verilog

COCOTB_MODULE = Path(__file__).with_name("cocotb_csr.py")


@pytest.mark.rtl
@pytest.mark.parametrize("name", ["default", "small"])
def test_csr_verilator(name, seed, regress):
    config = CONFIGS[name]
    build = sim_build_dir(f"csr_{name}")
    source = to_verilog(CSRBlock(config), "csr", build / "csr.v")
    print(f"cocotb seed (CSR_SEED): {seed}")
    run_cocotb("csr", [source], COCOTB_MODULE, build,
               extra_env={"CSR_CONFIG": name, "CSR_SEED": str(seed),
                          "CSR_OPS": "5000" if regress else "600"})


def test_constructor_checks(monkeypatch):
    with pytest.raises(TypeError, match="NPUConfig"):
        CSRBlock({"rows": 8})
    # a register the block has no behaviour for is refused, not silently unmapped
    extra = regs_module.Register("SHINY", 0xFF0, regs_module.Access.RW, "new")
    original = regs_module.registers
    monkeypatch.setattr("hdl.csr.registers", lambda cfg: (*original(cfg), extra))
    with pytest.raises(ValueError, match="SHINY"):
        CSRBlock(CONFIGS["small"])


# ---- Amaranth simulator: hand-driven channel corner cases ----------------------------------


class _Host:
    """Drives the subordinate's channels signal by signal."""

    def __init__(self, ctx, bus):
        self.ctx, self.bus = ctx, bus

    async def handshake(self, valid, ready, **payload):
        ctx = self.ctx
        for sig, v in payload.items():
            ctx.set(getattr(self.bus, sig), v)
        ctx.set(valid, 1)
        while not ctx.get(ready):
            await ctx.tick()
        await ctx.tick()
        ctx.set(valid, 0)

    async def aw(self, addr):
        await self.handshake(self.bus.awvalid, self.bus.awready, awaddr=addr)

    async def w(self, data, strb=0xF):
        await self.handshake(self.bus.wvalid, self.bus.wready, wdata=data, wstrb=strb)

    async def ar(self, addr):
        await self.handshake(self.bus.arvalid, self.bus.arready, araddr=addr)

    async def wait(self, sig, cycles=20):
        for _ in range(cycles):
            if self.ctx.get(sig):
                return
            await self.ctx.tick()
        raise AssertionError(f"{sig} never rose: the subordinate hangs")

    async def b(self):
        await self.wait(self.bus.bvalid)
        resp = self.ctx.get(self.bus.bresp)
        self.ctx.set(self.bus.bready, 1)
        await self.ctx.tick()
        self.ctx.set(self.bus.bready, 0)
        return resp

    async def r(self):
        await self.wait(self.bus.rvalid)
        got = self.ctx.get(self.bus.rdata), self.ctx.get(self.bus.rresp)
        self.ctx.set(self.bus.rready, 1)
        await self.ctx.tick()
        self.ctx.set(self.bus.rready, 0)
        return got


def _sim(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


def test_write_channel_orders():
    cfg = CONFIGS["small"]
    dut = CSRBlock(cfg)
    a = addresses(cfg)
    bus = dut.bus

    async def bench(ctx):
        host = _Host(ctx, bus)
        # W first, AW many cycles later: nothing happens until both are there
        await host.w(0x1111_0001)
        for _ in range(4):
            assert not ctx.get(bus.bvalid) and not ctx.get(bus.wready)
            assert ctx.get(bus.awready)
            await ctx.tick()
        assert ctx.get(dut.args[0]) == 0
        await host.aw(a["ARG0"])
        assert await host.b() == RESP_OKAY
        assert ctx.get(dut.args[0]) == 0x1111_0001
        # AW first, then W
        await host.aw(a["ARG1"])
        for _ in range(3):
            assert not ctx.get(bus.bvalid) and not ctx.get(bus.awready)
            await ctx.tick()
        await host.w(0x2222_0002)
        assert await host.b() == RESP_OKAY
        assert ctx.get(dut.args[1]) == 0x2222_0002
        # AW and W together, then the B response is held back by bready low
        ctx.set(bus.awaddr, a["ARG2"])
        ctx.set(bus.wdata, 0x3333_0003)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        await ctx.tick()
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        await host.wait(bus.bvalid)
        # a second write arrives while the first B waits: accepted, not yet performed
        await host.aw(a["ARG3"])
        await host.w(0x4444_0004)
        for _ in range(5):
            assert ctx.get(bus.bvalid) and ctx.get(bus.bresp) == RESP_OKAY
            assert ctx.get(dut.args[3]) == 0
            await ctx.tick()
        assert ctx.get(dut.args[2]) == 0x3333_0003
        assert await host.b() == RESP_OKAY  # first B
        assert await host.b() == RESP_OKAY  # second B
        assert ctx.get(dut.args[3]) == 0x4444_0004
        # an unmapped write answers SLVERR and the channel keeps working
        await host.aw(0xFFC)
        await host.w(0xFFFF_FFFF)
        assert await host.b() == RESP_SLVERR
        await host.aw(a["ARG4"])
        await host.w(0x5555_0005, strb=0b0100)
        assert await host.b() == RESP_OKAY
        assert ctx.get(dut.args[4]) == 0x0055_0000

    _sim(dut, bench)


def test_read_channel_backpressure(seed):
    cfg = CONFIGS["small"]
    dut = CSRBlock(cfg)
    a = addresses(cfg)
    bus = dut.bus
    rng = random.Random(seed)
    values = [rng.getrandbits(32) for _ in range(16)]

    async def bench(ctx):
        host = _Host(ctx, bus)
        for i, v in enumerate(values):
            ctx.set(dut.regs[i], v)
        await host.ar(a["R5"])
        await host.wait(bus.rvalid)
        # R holds its payload while rready is low; no second address is taken meanwhile
        for _ in range(6):
            ctx.set(dut.regs[5], rng.getrandbits(32))  # the register moves, R does not
            assert ctx.get(bus.rvalid) and not ctx.get(bus.arready)
            assert ctx.get(bus.rdata) == values[5] and ctx.get(bus.rresp) == RESP_OKAY
            await ctx.tick()
        assert await host.r() == (values[5], RESP_OKAY)
        assert not ctx.get(bus.rvalid)
        await host.ar(0x3F0)  # unmapped
        assert await host.r() == (0, RESP_SLVERR)
        await host.ar(a["ID"])
        assert await host.r() == (regs_module.ID_MAGIC, RESP_OKAY)

    _sim(dut, bench)


def test_event_wins_over_same_cycle_clear():
    """A run event (or trace overflow) in the cycle its W1C (or clear) commits is kept."""
    cfg = CONFIGS["small"]
    dut = CSRBlock(cfg)
    a = addresses(cfg)
    rs = {r.name: r for r in regs_module.registers(cfg)}
    bus = dut.bus

    def bit(reg, name):
        f = next(f for f in rs[reg].fields if f.name == name)
        return 1 << f.lo

    async def write_with_event(host, ctx, reg, value, event):
        await host.aw(a[reg])
        await host.w(value)
        # both halves are held now: the write commits in this cycle
        assert not ctx.get(bus.bvalid)
        ctx.set(event, 1)
        await ctx.tick()
        ctx.set(event, 0)
        assert await host.b() == RESP_OKAY

    async def read(host, reg):
        await host.ar(a[reg])
        value, resp = await host.r()
        assert resp == RESP_OKAY
        return value

    async def bench(ctx):
        host = _Host(ctx, bus)
        for event, name in ((dut.run_done, "done"), (dut.run_error, "error")):
            await write_with_event(host, ctx, "IRQ_STATUS", bit("IRQ_STATUS", name), event)
            assert await read(host, "IRQ_STATUS") == bit("IRQ_STATUS", name)
            await host.aw(a["IRQ_STATUS"])
            await host.w(0xFFFF_FFFF)
            assert await host.b() == RESP_OKAY
            assert await read(host, "IRQ_STATUS") == 0
        for clear in ("trace_clear", "counter_reset"):
            await write_with_event(host, ctx, "CTRL", bit("CTRL", clear), dut.trace_overflow)
            assert await read(host, "STATUS") == bit("STATUS", "trace_overflow")
            await host.aw(a["CTRL"])
            await host.w(bit("CTRL", clear))
            assert await host.b() == RESP_OKAY
            assert await read(host, "STATUS") == 0

    _sim(dut, bench)
