"""The board gateware: the board RAM, the board SoC, the ULX3S top and its config.

The RAM is checked under Amaranth's simulator against a bytearray model, with an
AXI4 manager and an AXI4-Lite manager running at once and random handshake stalls;
the SoC end to end over its UART pins. The FPGA build itself is ``make synth``
(tests/test_fpga_tools.py checks its tooling with stand-in tools).
"""

from __future__ import annotations

import random
import re
import warnings

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from firmware.config import NPUConfig
from hdl.axi import RESP_DECERR, RESP_OKAY, RESP_SLVERR
from hdl.boards.ram import BURST_FIXED, BURST_INCR, BURST_WRAP, DualPortRam

# ---- a small AXI4 / AXI4-Lite manager for Amaranth testbenches -----------------------


async def _handshake(ctx, valid, ready, rng, stall=0.0):
    """Hold ``valid`` until the subordinate's ``ready`` is seen at a clock edge."""
    while rng.random() < stall:
        await ctx.tick()
    ctx.set(valid, 1)
    # Sample at the clock edge: another testbench may change ready's inputs after us.
    while not (await ctx.tick().sample(ready))[2]:
        pass
    ctx.set(valid, 0)


async def _receive(ctx, valid, ready, rng, stall, fields):
    """Accept one beat (``ready`` asserted at random) and return ``fields``' values."""
    while True:
        rdy = rng.random() >= stall
        ctx.set(ready, rdy)
        _, _, seen, *values = await ctx.tick().sample(valid, *fields)
        if seen and rdy:
            ctx.set(ready, 0)
            return values


class AxiManager:
    """Sequential AXI4 bursts with random stalls on every channel."""

    def __init__(self, bus, bus_bytes, rng, stall=0.3):
        self.bus, self.w, self.rng, self.stall = bus, bus_bytes, rng, stall

    async def write(self, ctx, addr, beats, strobes, *, burst=BURST_INCR, size=None, ident=0):
        b = self.bus
        ctx.set(b.awaddr, addr)
        ctx.set(b.awlen, len(beats) - 1)
        ctx.set(b.awsize, (self.w.bit_length() - 1) if size is None else size)
        ctx.set(b.awburst, burst)
        ctx.set(b.awid, ident)
        await _handshake(ctx, b.awvalid, b.awready, self.rng, self.stall)
        for i, (data, strb) in enumerate(zip(beats, strobes, strict=True)):
            ctx.set(b.wdata, int.from_bytes(data, "little"))
            ctx.set(b.wstrb, strb)
            ctx.set(b.wlast, i == len(beats) - 1)
            await _handshake(ctx, b.wvalid, b.wready, self.rng, self.stall)
        resp, bid = await _receive(ctx, b.bvalid, b.bready, self.rng, self.stall,
                                   [b.bresp, b.bid])
        assert bid == ident
        return resp

    async def read(self, ctx, addr, n, *, burst=BURST_INCR, size=None, ident=0):
        b = self.bus
        ctx.set(b.araddr, addr)
        ctx.set(b.arlen, n - 1)
        ctx.set(b.arsize, (self.w.bit_length() - 1) if size is None else size)
        ctx.set(b.arburst, burst)
        ctx.set(b.arid, ident)
        await _handshake(ctx, b.arvalid, b.arready, self.rng, self.stall)
        out = []
        for i in range(n):
            data, resp, last, rid = await _receive(ctx, b.rvalid, b.rready, self.rng,
                                                   self.stall, [b.rdata, b.rresp, b.rlast, b.rid])
            assert last == (i == n - 1), f"rlast wrong on beat {i} of {n}"
            assert rid == ident
            out.append((data.to_bytes(self.w, "little"), resp))
        return out


class LiteManager:
    """Sequential AXI4-Lite word accesses with random stalls."""

    def __init__(self, bus, rng, stall=0.3):
        self.bus, self.rng, self.stall = bus, rng, stall

    async def write(self, ctx, addr, value, strb=0xF):
        b = self.bus
        ctx.set(b.awaddr, addr)
        ctx.set(b.wdata, value)
        ctx.set(b.wstrb, strb)
        ctx.set(b.awvalid, 1)
        ctx.set(b.wvalid, 1)
        while not (await ctx.tick().sample(b.awready & b.wready))[2]:
            pass
        ctx.set(b.awvalid, 0)
        ctx.set(b.wvalid, 0)
        (resp,) = await _receive(ctx, b.bvalid, b.bready, self.rng, self.stall, [b.bresp])
        return resp

    async def read(self, ctx, addr):
        b = self.bus
        ctx.set(b.araddr, addr)
        await _handshake(ctx, b.arvalid, b.arready, self.rng, self.stall)
        data, resp = await _receive(ctx, b.rvalid, b.rready, self.rng, self.stall,
                                    [b.rdata, b.rresp])
        return data, resp


def _simulate(dut, *benches, deadline=200_000):
    """Run ``benches`` until they all return (or ``deadline`` cycles pass: a hang)."""
    m = Module()
    m.domains.sync = ClockDomain("sync")
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(1e-8)
    left = [len(benches)]

    def finishing(bench):
        async def run(ctx):
            await bench(ctx)
            left[0] -= 1
        return run

    for bench in benches:
        sim.add_testbench(finishing(bench))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(1, deadline // 1000 + 1):
            sim.run_until(step * 1000 * 1e-8)
            if not left[0]:
                break


def _apply(model, addr, data, strb, size):
    """Write the strobed lanes of one beat into ``model`` (lanes past the end are dropped)."""
    base = addr - addr % len(data)
    for lane, byte in enumerate(data):
        if strb >> lane & 1 and base + lane < size:
            model[base + lane] = byte


# ---- DualPortRam -----------------------------------------------------------------------


@pytest.mark.parametrize("size,bus_bytes", [(2048, 8), (1000, 8), (512, 4), (1024, 16)])
def test_ram_random_traffic_both_ports(seed, size, bus_bytes):
    """Random AXI4 bursts and AXI4-Lite words at once match a bytearray model.

    The two managers work on disjoint halves (so the model does not depend on the
    interleaving the arbiter picks), then each reads back the other's half.
    """
    rng = random.Random(seed)
    dut = DualPortRam(size, bus_bytes)
    model = bytearray(size)
    axi = AxiManager(dut.axi, bus_bytes, random.Random(rng.random()))
    lite = LiteManager(dut.lite, random.Random(rng.random()))
    half = size // 2 - (size // 2) % bus_bytes
    done = {"axi": False, "lite": False}

    async def axi_bench(ctx):
        for _ in range(25):
            nbeats = rng.randint(1, 12)
            first = rng.randrange(0, half // bus_bytes - nbeats + 1)
            addr = first * bus_bytes + rng.randrange(bus_bytes)  # unaligned start
            if rng.random() < 0.5:
                beats = [bytes(rng.randrange(256) for _ in range(bus_bytes))
                         for _ in range(nbeats)]
                strobes = [rng.randrange(1 << bus_bytes) for _ in range(nbeats)]
                assert await axi.write(ctx, addr, beats, strobes, ident=rng.randrange(16)) \
                    == RESP_OKAY
                for i, (d, s) in enumerate(zip(beats, strobes, strict=True)):
                    _apply(model, (first + i) * bus_bytes, d, s, size)
            else:
                got = await axi.read(ctx, addr, nbeats, ident=rng.randrange(16))
                for i, (data, resp) in enumerate(got):
                    a = (first + i) * bus_bytes
                    assert resp == RESP_OKAY
                    assert data == bytes(model[a:a + bus_bytes]), f"seed {seed}: beat {i}"
        done["axi"] = True

    async def lite_bench(ctx):
        for _ in range(60):
            addr = rng.randrange(half, size - 3) & ~3
            if rng.random() < 0.5:
                value, strb = rng.randrange(1 << 32), rng.randrange(16)
                assert await lite.write(ctx, addr + rng.randrange(4), value, strb) == RESP_OKAY
                _apply(model, addr, value.to_bytes(4, "little"), strb, size)
            else:
                data, resp = await lite.read(ctx, addr)
                assert resp == RESP_OKAY
                assert data == int.from_bytes(model[addr:addr + 4], "little"), f"seed {seed}"
        done["lite"] = True

    async def cross_check(ctx):
        while not (done["axi"] and done["lite"]):
            await ctx.tick()
        # every byte, seen through the other port
        for a in range(0, size - size % 4, 4):
            data, resp = await lite.read(ctx, a)
            assert resp == RESP_OKAY
            assert data == int.from_bytes(model[a:a + 4], "little"), f"seed {seed}: {a:#x}"
        nwords = size // bus_bytes
        for start in range(0, nwords, 64):
            n = min(64, nwords - start)
            got = await axi.read(ctx, start * bus_bytes, n)
            for i, (data, resp) in enumerate(got):
                a = (start + i) * bus_bytes
                assert (data, resp) == (bytes(model[a:a + bus_bytes]), RESP_OKAY)
        done["checked"] = True

    _simulate(dut, axi_bench, lite_bench, cross_check)
    assert done.get("checked"), "the testbench did not finish: a port hung"


@pytest.mark.parametrize("bus_bytes", [4, 8])
def test_ram_lite_read_and_write_requested_together(seed, bus_bytes):
    """An AXI4-Lite manager that presents a read and a write at once (AR and AW are
    independent channels) gets each served at its own address, whichever the
    round robin grants first: the writes land in their half and only there, the
    reads return their half's contents."""
    size = 512
    rng = random.Random(seed)
    dut = DualPortRam(size, bus_bytes)
    # Two managers on the one AXI4-Lite port: one only writes (AW, W, B), the other
    # only reads (AR, R), so their requests overlap.
    wr = LiteManager(dut.lite, random.Random(rng.random()), stall=0.1)
    rd = LiteManager(dut.lite, random.Random(rng.random()), stall=0.1)
    half = size // 2
    written = {}
    done = {}

    async def writer(ctx):
        for _ in range(80):
            addr = rng.randrange(0, half, 4)
            value = rng.randrange(1, 1 << 32)
            assert await wr.write(ctx, addr, value) == RESP_OKAY
            written[addr] = value
        done["writer"] = True

    async def reader(ctx):
        # The upper half is never written: it must read as zero throughout, and the
        # lower half's words as last written (checked once the writer is done).
        n = 0
        while not done.get("writer") or n < 80:
            addr = rng.randrange(half, size, 4)
            data, resp = await rd.read(ctx, addr)
            assert (data, resp) == (0, RESP_OKAY), f"seed {seed}: read {addr:#x}: {data:#x}"
            n += 1
        for addr, value in written.items():
            data, resp = await rd.read(ctx, addr)
            assert (data, resp) == (value, RESP_OKAY), \
                f"seed {seed}: {addr:#x} holds {data:#x}, not {value:#x}"
        done["reader"] = True

    _simulate(dut, writer, reader)
    assert done.get("reader"), "the testbench did not finish: a port hung"


@pytest.mark.parametrize("bus_bytes", [4, 8])
def test_ram_read_right_after_a_write_sees_it(seed, bus_bytes):
    """The storage writes a cycle after the write beat (registered): a read presented
    the cycle after the write's response, the earliest it can be granted, returns the
    new data, after an AXI4-Lite write and after an AXI4 burst."""
    rng = random.Random(seed)
    dut = DualPortRam(1024, bus_bytes)
    lite = LiteManager(dut.lite, rng, stall=0.0)
    axi = AxiManager(dut.axi, bus_bytes, rng, stall=0.0)

    async def bench(ctx):
        for i in range(40):
            addr = rng.randrange(4 * bus_bytes, 1024 - 8 * bus_bytes, 4)
            value = rng.randrange(1 << 32)
            if i % 2:
                assert await lite.write(ctx, addr, value) == RESP_OKAY
            else:  # a burst whose last beat holds the word
                base = addr - addr % bus_bytes
                beats = [rng.randbytes(bus_bytes) for _ in range(rng.randrange(1, 4))]
                last = bytearray(beats[-1])
                last[addr % bus_bytes:addr % bus_bytes + 4] = value.to_bytes(4, "little")
                beats[-1] = bytes(last)
                await axi.write(ctx, base - (len(beats) - 1) * bus_bytes, beats,
                                [(1 << bus_bytes) - 1] * len(beats))
            data, resp = await lite.read(ctx, addr)
            assert (data, resp) == (value, RESP_OKAY), \
                f"seed {seed}, access {i}: {addr:#x} reads {data:#x}, not {value:#x}"

    _simulate(dut, bench)


def test_ram_long_burst_streams_one_beat_per_cycle():
    """A 256-beat read with rready always high takes about one cycle per beat."""
    dut = DualPortRam(4096, 8)
    rng = random.Random(1)
    axi = AxiManager(dut.axi, 8, rng, stall=0.0)
    cycles = {}

    async def bench(ctx):
        beats = [bytes([i & 0xFF, i >> 8, 0, 0, 0, 0, 0, 0xA5]) for i in range(256)]
        await axi.write(ctx, 2048, beats[:256], [0xFF] * 256)
        t0 = 0
        b = dut.axi
        ctx.set(b.araddr, 0)
        ctx.set(b.arlen, 255)
        ctx.set(b.arsize, 3)
        ctx.set(b.arburst, BURST_INCR)
        ctx.set(b.rready, 1)
        await _handshake(ctx, b.arvalid, b.arready, rng)
        got = 0
        while got < 256:
            got += (await ctx.tick().sample(b.rvalid))[2]
            t0 += 1
        cycles["read"] = t0

    _simulate(dut, bench)
    assert cycles["read"] <= 256 + 2


def test_ram_decerr_beyond_size_and_wrap_slverr():
    """Beats past the end answer DECERR and write nothing; WRAP bursts answer SLVERR."""
    size, w = 1000, 8  # not a power of two: 32-bit addresses past 1000 must fail
    dut = DualPortRam(size, w)
    rng = random.Random(7)
    axi = AxiManager(dut.axi, w, rng, stall=0.2)
    lite = LiteManager(dut.lite, rng, stall=0.2)
    result = {}

    async def bench(ctx):
        # a burst that crosses the end: 3 beats in range, 2 beyond
        beats = [bytes([0x11 * (i + 1)] * w) for i in range(5)]
        start = size - 3 * w
        result["wr"] = await axi.write(ctx, start, beats, [0xFF] * 5)
        result["rd"] = await axi.read(ctx, start, 5)
        result["far"] = await axi.read(ctx, 0x8000_0000, 2)
        result["far_wr"] = await axi.write(ctx, 0xFFFF_FFF8, [bytes(w)], [0xFF])
        result["wrap"] = await axi.read(ctx, 64, 4, burst=BURST_WRAP)
        result["wrap_wr"] = await axi.write(ctx, 64, [bytes([0xEE] * w)] * 4, [0xFF] * 4,
                                            burst=BURST_WRAP)
        result["after_wrap"] = await axi.read(ctx, 64, 4)
        result["lite_far"] = await lite.read(ctx, 1020)
        result["lite_far_wr"] = await lite.write(ctx, 1020, 0x12345678)
        result["lite_in"] = await lite.read(ctx, size - 4)
        result["done"] = True

    _simulate(dut, bench)
    assert result.get("done")
    assert result["wr"] == RESP_DECERR
    assert [r for _, r in result["rd"]] == [RESP_OKAY] * 3 + [RESP_DECERR] * 2
    assert [d for d, _ in result["rd"]] == beats_expected(w) + [bytes(w)] * 2
    assert [r for _, r in result["far"]] == [RESP_DECERR] * 2
    assert [d for d, _ in result["far"]] == [bytes(w)] * 2
    assert result["far_wr"] == RESP_DECERR
    assert [r for _, r in result["wrap"]] == [RESP_SLVERR] * 4
    assert result["wrap_wr"] == RESP_SLVERR
    assert [d for d, _ in result["after_wrap"]] == [bytes(w)] * 4  # WRAP wrote nothing
    assert result["lite_far"] == (0, RESP_DECERR)
    assert result["lite_far_wr"] == RESP_DECERR
    assert result["lite_in"] == (int.from_bytes(bytes([0x33] * 4), "little"), RESP_OKAY)


def beats_expected(w):
    return [bytes([0x11 * (i + 1)] * w) for i in range(3)]


def test_ram_fixed_and_narrow_bursts(seed):
    """FIXED bursts stay on one word; narrow INCR bursts step by their size."""
    rng = random.Random(seed)
    w = 8
    dut = DualPortRam(512, w)
    axi = AxiManager(dut.axi, w, rng, stall=0.2)
    lite = LiteManager(dut.lite, rng, stall=0.2)
    out = {}

    async def bench(ctx):
        beats = [bytes(rng.randrange(256) for _ in range(w)) for _ in range(4)]
        assert await axi.write(ctx, 128, beats, [0xFF] * 4, burst=BURST_FIXED) == RESP_OKAY
        out["fixed"] = (await axi.read(ctx, 128, 1))[0][0]
        out["fixed_neighbour"] = (await axi.read(ctx, 136, 1))[0][0]
        # 4-byte beats from byte 256: lanes 0-3, 4-7, then the next word's 0-3
        narrow = [bytes([1, 2, 3, 4, 0, 0, 0, 0]), bytes([0, 0, 0, 0, 5, 6, 7, 8]),
                  bytes([9, 10, 11, 12, 0, 0, 0, 0])]
        assert await axi.write(ctx, 256, narrow, [0x0F, 0xF0, 0x0F], size=2) == RESP_OKAY
        out["narrow"] = [await lite.read(ctx, a) for a in (256, 260, 264)]
        out["fixed_beats"] = await axi.read(ctx, 256, 3, burst=BURST_FIXED)
        out["beats"] = beats

    _simulate(dut, bench)
    assert out["fixed"] == out["beats"][-1], f"seed {seed}: the last FIXED beat wins"
    assert out["fixed_neighbour"] == bytes(w)
    assert out["narrow"] == [(0x04030201, 0), (0x08070605, 0), (0x0C0B0A09, 0)]
    assert [d for d, _ in out["fixed_beats"]] == [bytes(range(1, 9))] * 3


@pytest.mark.parametrize("size,bus", [(0, 8), (12, 8), (64, 3), (64, 2), (True, 8)])
def test_ram_rejects_bad_arguments(size, bus):
    with pytest.raises(ValueError, match="size_bytes|bus_bytes"):
        DualPortRam(size, bus)


def test_ram_lite_address_width():
    for size, width in ((128 * 1024, 17), (1000, 10), (4, 2)):
        ram = DualPortRam(size, 4)
        ram._MustUse__silence = True  # only its signature is looked at
        assert ram.lite.awaddr.shape().width == width
        assert ram.lite.araddr.shape().width == width


# ---- the board build ----------------------------------------------------------------------


def test_board_config_is_valid_and_is_a_host_profile():
    """The ULX3S build validates and the host's profile database names it."""
    from dataclasses import replace

    from firmware.config import NPUConfig
    from hdl.boards import ulx3s
    from host.profiles import PROFILES, profile_name

    cfg = ulx3s.CONFIG
    assert isinstance(cfg, NPUConfig)
    assert replace(cfg) == cfg  # re-runs NPUConfig's validation
    assert PROFILES["ulx3s"] == cfg, "host/profiles.py 'ulx3s' differs from the board build"
    assert ulx3s.RAM_BYTES % cfg.bus_bytes == 0
    # the ULX3S builds the small NPU, so its programs share the simulations' cache
    assert profile_name(cfg) == "small"


def test_bundled_models_fit_the_board_build():
    """Every bundled model compiles for the board build, and its constants plus
    activation arena fit the board RAM (constants at 0, the arena on the next page)."""
    from hdl.boards import ulx3s
    from host.cli import model_path
    from host.compiler import compile_model
    from host.onnx_import import load_onnx

    page = 4096
    for name in ("mlp", "cnn", "early_exit", "moe"):
        model = compile_model(load_onnx(model_path(name)), ulx3s.CONFIG)
        end = -(-model.place.const_bytes // page) * page + model.place.arena_bytes
        assert end <= ulx3s.RAM_BYTES, f"{name} needs {end} bytes of RAM on the ULX3S"


@pytest.mark.parametrize("f_out", [100e6, 75e6, 80e6, 62.5e6, 50e6])
def test_ecp5_pll_matches_ecppll(f_out):
    """Dividers as ecppll (yowasp-ecppll) computes them for the 25 MHz oscillator."""
    from hdl.boards.ulx3s import pll_params

    expected = {100e6: (1, 4, 6), 75e6: (1, 3, 8), 80e6: (5, 16, 7), 62.5e6: (2, 5, 10),
                50e6: (1, 2, 12)}[f_out]
    p = pll_params(25e6, f_out)
    assert (p["CLKI_DIV"], p["CLKFB_DIV"], p["CLKOP_DIV"]) == expected
    assert p["f_out"] == f_out
    assert 400e6 <= p["f_out"] * p["CLKOP_DIV"] <= 800e6


def test_pll_rejects_unreachable():
    from hdl.boards import ulx3s

    with pytest.raises(ValueError, match="frequencies must be positive"):
        ulx3s.pll_params(25e6, 0)
    with pytest.raises(ValueError, match="frequencies must be positive"):
        ulx3s.pll_params(-1, 24e6)


# ---- the SoC ---------------------------------------------------------------------------------


def test_board_soc_converts_to_verilog():
    """The board's SoC (NPU + RAM + bridge) elaborates and converts to Verilog."""
    from amaranth.back import verilog

    from hdl.boards import ulx3s as mod
    from hdl.boards.soc import BoardSoC

    board = "ulx3s"
    soc = BoardSoC(mod.CONFIG, mod.RAM_BYTES, mod.CLK_HZ, mod.BAUD)
    assert soc.ram_bytes == mod.RAM_BYTES
    assert soc.ram.lite.awaddr.shape().width == (mod.RAM_BYTES - 1).bit_length()
    text = verilog.convert(soc, name=f"soc_{board}", emit_src=False)
    header = text[text.index(f"module soc_{board}("):]
    header = header[:header.index(");")]
    for port in ("clk", "rst", "rx", "tx", "irq", "error"):
        assert re.search(rf"\b{port}\b", header), f"port {port} missing"
    # the three blocks are there, joined: the NPU's DMA drives the RAM's AXI4 port
    assert "module soc_" + board + ".npu" in text or f"soc_{board}.npu" in text
    assert f"soc_{board}.ram" in text and f"soc_{board}.bridge" in text


def test_board_soc_rejects_bad_arguments():
    from firmware.config import CONFIGS
    from hdl.boards.soc import BoardSoC

    with pytest.raises(TypeError, match="NPUConfig"):
        BoardSoC({"rows": 4}, 4096, 24_000_000, 115_200)
    with pytest.raises(ValueError, match="baud"):
        BoardSoC(CONFIGS["small"], 4096, 24_000_000, 0)
    with pytest.raises(ValueError, match="too fast"):
        BoardSoC(CONFIGS["small"], 4096, 1_000_000, 500_000)
    with pytest.raises(ValueError, match="size_bytes"):
        BoardSoC(CONFIGS["small"], 100, 24_000_000, 115_200)


def test_board_top_prepares_build_files():
    """The board top goes through the platform's build preparation (constraints, scripts)
    without running any tool: the clock constraint and the UART pins are there.
    """
    from hdl.boards import ulx3s
    from tools.fpga.synth import tool_options

    def text(f):
        return f if isinstance(f, str) else f.decode()

    plan = ulx3s.platform().prepare(ulx3s.make_top(), name="top", **tool_options(ulx3s))
    files = plan.files
    ys = text(files["top.ys"])
    # Yosys is told that the fetch never reads the address being written, after reading
    # the design and before synthesis; the pattern names the imem's module.
    assert ys.index("setparam -set COLLISION_X_MASK 1'1 *.npu.imem/t:$memrd_v2") \
        < ys.index("synth_")
    assert re.search(r"^module \\top\.soc\.npu\.imem$", files["top.il"], re.M)
    lpf = text(files["top.lpf"])
    # the board's own build: the small NPU at the 60 MHz it meets
    assert re.search(r'FREQUENCY NET "pll_clk" 60000000(\.0)? HZ', lpf), lpf
    assert 'SITE "M1"' in lpf and 'SITE "L4"' in lpf  # FTDI rx, tx
    assert "EHXPLLL" in files["top.il"]
    script = text(files["build_top.sh"])
    assert "--placer-heap-timingweight 80" in script  # the placer weighs timing more
    # nextpnr writes its machine-readable report and a timing miss still packs
    assert "--report nextpnr-report.json --timing-allow-fail" in script
    assert "DCCA" in files["top.il"]  # the reset on a global network


# ---- the SoC end to end over its UART ------------------------------------------------------

_SMALL_SOC = NPUConfig(rows=4, cols=4, sp_bytes=6 * 1024, sp_banks=2, acc_rows=64,
                       partitions=2, pt_sets=1, tag_slots=4, imem_depth=320, bus_bytes=4,
                       loop_depth=2, region_depth=2, trace_depth=4, queue_depth=2)
"""A small NPU build (32-bit bus, shallow queues) that keeps the simulation quick."""
_BIT = 8  # clock cycles per UART bit in the SoC smoke test (clk 1 MHz, 125 kbaud)


async def _uart_send(ctx, line, data):
    for byte in data:
        for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
            ctx.set(line, bit)
            await ctx.tick().repeat(_BIT)


async def _uart_receive(ctx, line, count, timeout=20_000):
    """Receive ``count`` bytes (8N1), sampling mid-bit; fail on a missing start or stop bit."""
    out = bytearray()
    waited = 0
    while len(out) < count:
        while ctx.get(line):
            await ctx.tick()
            waited += 1
            assert waited < timeout, f"no UART byte after {len(out)} of {count}"
        await ctx.tick().repeat(_BIT // 2)
        assert ctx.get(line) == 0, "start bit glitch"
        byte = 0
        for i in range(8):
            await ctx.tick().repeat(_BIT)
            byte |= ctx.get(line) << i
        await ctx.tick().repeat(_BIT)
        assert ctx.get(line) == 1, "missing stop bit"
        out.append(byte)
    return bytes(out)


def test_board_soc_end_to_end_over_uart(seed):
    """Frames on the SoC's rx pin reach the NPU's CSRs and the RAM: read the NPU's ID,
    write unaligned bytes into the RAM through the bridge and read them back."""
    from firmware import bridge as proto
    from firmware.regs import ID_MAGIC
    from hdl.boards.soc import BoardSoC

    rng = random.Random(seed)
    soc = BoardSoC(_SMALL_SOC, 4096, 1_000_000, 1_000_000 // _BIT)
    addr = rng.randrange(0, 4096 - 64)
    data = bytes(rng.randrange(256) for _ in range(rng.randint(5, 40)))
    got = {}

    async def host(ctx):
        ctx.set(soc.rx, 1)
        await ctx.tick().repeat(4 * _BIT)

        async def transact(frame, payload_len):
            await _uart_send(ctx, soc.rx, frame)
            raw = await _uart_receive(ctx, soc.tx, proto.RESPONSE_HEADER + payload_len
                                      + proto.CRC_BYTES)
            return proto.decode_response(raw)

        got["id"] = await transact(proto.csr_read(0x000), 4)
        got["write"] = await transact(proto.mem_write(addr, data), 0)
        got["read"] = await transact(proto.mem_read(addr, len(data)), len(data))
        got["past_end"] = await transact(proto.mem_read(4096 - 2, 4), 0)

    _simulate(soc, host, deadline=60_000)
    assert got["id"].status == proto.Status.OK
    assert int.from_bytes(got["id"].payload, "little") == ID_MAGIC
    assert got["write"].status == proto.Status.OK
    assert got["read"].status == proto.Status.OK
    assert got["read"].payload == data, f"seed {seed}: RAM read back differs"
    # 4096 bytes of RAM give the bridge 12 address bits: the read is refused or errs
    assert got["past_end"].status != proto.Status.OK


