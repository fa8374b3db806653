"""DMA engine (hdl/dma.py): Verilator + cocotb against cocotbext-axi, plus Amaranth-simulator
tests of the burst splitter.

The cocotb tests (``cocotb_dma``) run once per bus width: ``CONFIGS["default"]`` (64-bit
bus) and a 32-bit-bus variant of ``CONFIGS["small"]``, one cached Verilator build each.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import warnings
from pathlib import Path

import pytest
from amaranth.hdl import Module, UnusedElaboratable
from amaranth.sim import Simulator

from firmware.config import CONFIGS
from hdl.dma import DMA, MAX_BURST_BEATS, DMAShell, _Bursts, burst_plan
from verif.sim import CocotbTestFailure, run_cocotb, sim_build_dir, to_verilog

COCOTB_MODULE = Path(__file__).with_name("cocotb_dma.py")
TOPLEVEL = "dma"
DMA_CONFIGS = {
    "default": CONFIGS["default"],
    "bus32": dataclasses.replace(CONFIGS["small"], bus_bytes=4),
}


def run_dma_cocotb(name: str, seed: int, *, testcase=None, extra_env=None):
    """Build (cached) the DMA for ``DMA_CONFIGS[name]`` and run cocotb tests on it."""
    config = DMA_CONFIGS[name]
    build = sim_build_dir(f"dma_{name}")
    source = to_verilog(DMAShell(config), TOPLEVEL, build / f"{TOPLEVEL}.v")
    env = {"DMA_TB_CONFIG": json.dumps(config.as_dict()), "DMA_TB_SEED": str(seed),
           **(extra_env or {})}
    return run_cocotb(TOPLEVEL, [source], COCOTB_MODULE, build, testcase=testcase,
                      extra_env=env)


# ---- Verilator + cocotb ------------------------------------------------------------------


@pytest.mark.rtl
@pytest.mark.parametrize("name", list(DMA_CONFIGS))
def test_dma_verilator(name, seed, regress):
    """Random and hand-picked transfers, bus errors and throughput (see cocotb_dma)."""
    env = {"DMA_TB_ROUNDS": "40"} if regress else {}
    try:
        run_dma_cocotb(name, seed, extra_env=env)
    except CocotbTestFailure as exc:
        raise AssertionError(f"{exc} (seed {seed})") from exc


@pytest.mark.rtl
def test_scoreboard_catches_a_dropped_byte(seed):
    """A scratchpad that loses one strobed lane must fail the random test."""
    with pytest.raises(CocotbTestFailure, match="random_transfers"):
        run_dma_cocotb("default", seed, testcase="random_transfers",
                       extra_env={"DMA_TB_BREAK": "sp", "DMA_TB_ROUNDS": "1"})


# ---- the burst rule --------------------------------------------------------------------


@pytest.mark.parametrize("bus", [4, 8, 16, 64])
def test_burst_plan_rules(bus, seed):
    """Bursts cover exactly the row's beats, in order, <= 256 beats, inside one 4 KiB page."""
    rng = random.Random(seed)
    for _ in range(2000):
        addr = rng.choice([rng.randrange(1 << 32), rng.randrange(1, 200) * 4096 - rng.randrange(
            1, 300)])
        nbytes = rng.choice([rng.randint(1, 64), rng.randint(1, 4096)])
        plan = burst_plan(addr, nbytes, bus)
        cur = addr - addr % bus
        for start, beats in plan:
            assert start == cur % (1 << 32)
            assert 1 <= beats <= MAX_BURST_BEATS
            assert start // 4096 == (start + beats * bus - 1) // 4096
            cur += beats * bus
        assert cur - bus < addr + nbytes <= cur
        # maximal: only the row's end, the 256-beat cap or a page boundary ends a burst
        for (start, beats), _ in zip(plan, plan[1:], strict=False):
            assert beats == MAX_BURST_BEATS or (start + beats * bus) % 4096 == 0
    with pytest.raises(ValueError, match="nbytes=0"):
        burst_plan(0, 0, bus)


def test_dma_rejects_bad_arguments():
    with warnings.catch_warnings():
        # the half-built components are never elaborated, which is the point
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="NPUConfig"):
            DMA({"bus_bytes": 8})
        with pytest.raises(ValueError, match="fifo_depth=1"):
            DMA(CONFIGS["default"], fifo_depth=1)
        gc.collect()


# ---- Amaranth simulator: the burst splitter ---------------------------------------------


def _expected_items(config, cmd):
    """(addr, len, lo, hi, sp_first, row, row_last, cmd_last) of each burst of ``cmd``."""
    w = config.bus_bytes
    dram, stride, rows, nbytes, sp = cmd
    items = []
    for i in range(rows):
        row = (dram + i * stride) % (1 << 32)
        plan = burst_plan(row, nbytes, w)
        for j, (start, beats) in enumerate(plan):
            first = row if j == 0 else start
            lo = first % w
            last = j == len(plan) - 1
            hi = (row + nbytes - 1) % w if last else w - 1
            sp_first = (sp + i * nbytes + (first - row) - lo) % config.sp_bytes
            items.append((start, beats - 1, lo, hi, sp_first, row, int(last),
                          int(last and i == rows - 1)))
    return items


@pytest.mark.parametrize("name", list(DMA_CONFIGS))
def test_bursts_amaranth_sim(name, seed):
    """The splitter's bursts and descriptors match burst_plan, under random backpressure;
    an abort ends the command with a marker and the next command starts clean."""
    config = DMA_CONFIGS[name]
    rng = random.Random(seed)
    dut = _Bursts(config)
    m = Module()
    m.submodules.dut = dut
    cmds = []
    for _ in range(25):
        nbytes = rng.choice([rng.randint(1, 20), rng.randint(1, 4096)])
        rows = rng.randint(1, 4)
        stride = rng.choice([nbytes, rng.randrange(1 << 32)])
        dram = rng.choice([rng.randrange(1 << 32), rng.randrange(1, 64) * 4096 - rng.randint(
            1, 40)])
        sp = rng.randrange(config.sp_bytes - rows * nbytes + 1)
        cmds.append((dram, stride, rows, nbytes, sp))
    abort_at = 7  # this command (many bursts) is aborted after its second burst
    cmds[abort_at] = (rng.randrange(1 << 20), 5000, 4, 4096, 0)
    got: list = []

    async def feed(ctx):
        for i, (dram, stride, rows, nbytes, sp) in enumerate(cmds):
            ctx.set(dut.cmd.payload, {"dram": dram, "stride": stride, "rows": rows,
                                      "nbytes": nbytes, "sp": sp})
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)
            if i == abort_at:
                while sum(1 for g in got if g[0] == i) < 2:
                    await ctx.tick()
                ctx.set(dut.abort, 1)
                await ctx.tick().until(~dut.active)
                ctx.set(dut.abort, 0)

    async def drain(ctx):
        index = 0
        while index < len(cmds):
            ready = rng.random() < 0.7
            ctx.set(dut.out.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.out.valid, dut.out.payload)
            if ready and valid:
                d = p.d
                got.append((index, d.marker, (p.addr, d.len, d.lo, d.hi, d.sp_first, d.row,
                                              d.row_last, d.cmd_last)))
                if d.cmd_last:
                    index += 1

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(feed)
    sim.add_testbench(drain, background=True)
    sim.run_until(2e-3)

    for i, cmd in enumerate(cmds):
        items = [(mk, g) for j, mk, g in got if j == i]
        want = _expected_items(config, cmd)
        if i == abort_at:
            # bursts already prepared still go out; then the marker ends the command
            k = len(items) - 1
            assert 2 <= k < len(want), items
            assert [mk for mk, _ in items] == [0] * k + [1], items
            assert [g for _, g in items[:k]] == want[:k]
        else:
            assert [mk for mk, _ in items] == [0] * len(want), f"command {i}: {cmd}"
            assert [g for _, g in items] == want, f"command {i}: {cmd}"
