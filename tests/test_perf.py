"""PerfCounters and TraceFIFO (hdl/perf.py) under Amaranth's simulator, against Python models.

TraceFIFO is checked cycle by cycle against a ``collections.deque`` model of the
golden model's region trace (records beyond ``trace_depth`` are dropped and
counted, ``firmware.golden.Machine._region``).
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from firmware.config import CONFIGS, NPUConfig
from firmware.regs import TRACE_FIELDS, counter_names
from hdl.perf import PerfCounters, TraceFIFO, default_counter_widths

M64 = (1 << 64) - 1


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


# ---- PerfCounters -----------------------------------------------------------------------


def test_default_widths():
    cfg = CONFIGS["default"]
    w = default_counter_widths(cfg)
    assert list(w) == counter_names(cfg)
    assert w["macs"] == 7  # 0..64 MACs per cycle on 8x8
    assert default_counter_widths(CONFIGS["small"])["macs"] == 5  # 0..16 on 4x4
    assert w["dram_read_bytes"] == w["dram_write_bytes"] == 13
    assert w["cycles"] == w["tag_misses_p7"] == 1


def test_counter_arguments_are_checked():
    cfg = CONFIGS["small"]
    with pytest.raises(ValueError, match="tag_hits_p4"):
        PerfCounters(cfg, widths={"tag_hits_p4": 1})  # small has 4 partitions
    with pytest.raises(ValueError, match="65"):
        PerfCounters(cfg, widths={"macs": 65})
    with pytest.raises(TypeError):
        PerfCounters({"rows": 4})


@pytest.mark.parametrize("name", ["default", "small"])
def test_counters_random(name, seed, regress):
    cfg = CONFIGS[name]
    rng = random.Random(seed)
    dut = PerfCounters(cfg, widths={"busy_load": 3})
    names = dut.names
    assert names == counter_names(cfg)
    cycles = 2000 if regress else 300
    model = [0] * len(names)
    pending = [0] * len(names)  # presented last cycle, counted this one

    async def bench(ctx):
        for cycle in range(cycles):
            got = [ctx.get(v) for v in dut.values]
            assert got == model, f"seed {seed}, cycle {cycle}: {got} != {model}"
            reset = rng.random() < 0.02
            incs = {}
            for n in names:
                width = dut.widths[n]
                # mostly idle, sometimes the maximum, to hit carries across bit 31
                r = rng.random()
                incs[n] = 0 if r < 0.3 else (1 << width) - 1 if r < 0.4 else rng.getrandbits(width)
                ctx.set(getattr(dut.inc, n), incs[n])
            ctx.set(dut.reset, reset)
            await ctx.tick()
            if reset:
                model[:] = [0] * len(names)
                pending[:] = [0] * len(names)
            else:
                model[:] = [(model[i] + pending[i]) & M64 for i in range(len(names))]
                pending[:] = [incs[n] for n in names]

    _run(dut, bench)


def test_counters_carry_and_wrap():
    """A full-width increment carries into the high half and wraps modulo 2**64."""
    cfg = CONFIGS["small"]
    dut = PerfCounters(cfg, widths={"macs": 64, "cycles": 33})
    macs, cycles = dut.index("macs"), dut.index("cycles")

    async def bench(ctx):
        ctx.set(dut.inc.macs, M64)
        ctx.set(dut.inc.cycles, (1 << 33) - 1)
        await ctx.tick()
        assert ctx.get(dut.values[macs]) == 0  # counted a cycle after it is presented
        await ctx.tick()
        assert ctx.get(dut.values[macs]) == M64
        assert ctx.get(dut.values[cycles]) == (1 << 33) - 1
        await ctx.tick()
        assert ctx.get(dut.values[macs]) == M64 - 1  # wrapped
        assert ctx.get(dut.values[cycles]) == 2 * ((1 << 33) - 1)
        ctx.set(dut.reset, 1)
        await ctx.tick()
        # reset drops the increments of its cycle and the one before, not yet counted
        assert ctx.get(dut.values[macs]) == 0
        assert ctx.get(dut.values[cycles]) == 0
        ctx.set(dut.reset, 0)
        ctx.set(dut.inc.macs, 0)
        ctx.set(dut.inc.cycles, 0)
        await ctx.tick()
        assert ctx.get(dut.values[macs]) == 0
        assert ctx.get(dut.values[cycles]) == 0

    _run(dut, bench)


# ---- TraceFIFO ---------------------------------------------------------------------------


def _record(rng):
    return {f: rng.getrandbits(32) for f in TRACE_FIELDS}


@pytest.mark.parametrize("cfg", [CONFIGS["small"], NPUConfig(trace_depth=5),
                                 NPUConfig(trace_depth=1)],
                         ids=["small", "depth5", "depth1"])
def test_trace_fifo_random(cfg, seed, regress):
    rng = random.Random(seed)
    dut = TraceFIFO(cfg)
    depth = cfg.trace_depth
    cycles = 4000 if regress else 800
    model: deque = deque()
    pending = None  # the record pushed in the cycle before: it enters the FIFO now
    stats = {"overflows": 0, "max": 0, "pops": 0, "clears": 0}

    async def bench(ctx):
        nonlocal pending
        # phases alternate between filling (overflow) and draining (empty pops)
        for cycle in range(cycles):
            filling = (cycle // 150) % 2 == 0
            push = rng.random() < (0.7 if filling else 0.3)
            pop = rng.random() < (0.25 if filling else 0.7)
            # No clear before the first overflow: a clear in the first filling phase
            # could keep a 32-deep FIFO from ever filling (about 1 seed in 300 did).
            clear = rng.random() < 0.01 and stats["overflows"] > 0
            rec = _record(rng)
            ctx.set(dut.push.valid, push)
            ctx.set(dut.push.payload, rec)
            ctx.set(dut.pop, pop)
            ctx.set(dut.clear, clear)

            where = f"seed {seed}, cycle {cycle}"
            assert ctx.get(dut.count) == len(model), where
            assert ctx.get(dut.push.ready) == 1, where
            if model:
                head = ctx.get(dut.head)
                assert {f: getattr(head, f) for f in TRACE_FIELDS} == model[0], where
            # model: clear (dropping the pending record too), then pop, then the
            # pending record is appended if there is room
            if clear:
                model.clear()
                pending = None
                stats["clears"] += 1
            elif pop and model:
                model.popleft()
                stats["pops"] += 1
            overflow = pending is not None and len(model) >= depth
            assert ctx.get(dut.overflow) == overflow, where
            if pending is not None and not overflow:
                model.append(pending)
            pending = rec if push else None
            stats["overflows"] += overflow
            stats["max"] = max(stats["max"], len(model))
            await ctx.tick()
        assert ctx.get(dut.count) == len(model)

    _run(dut, bench)
    # the stimulus must have exercised the corners it is meant to
    assert stats["overflows"] > 0 and stats["max"] == depth and stats["pops"] > 0
    assert stats["clears"] > 0


def test_trace_fifo_push_lands_two_cycles_later():
    cfg = NPUConfig(trace_depth=4)
    dut = TraceFIFO(cfg)
    rng = random.Random(1)
    recs = [_record(rng) for _ in range(7)]

    async def push(ctx, rec, **inputs):
        """Present ``rec`` (or nothing) with ``inputs`` for one cycle."""
        ctx.set(dut.push.valid, rec is not None)
        if rec is not None:
            ctx.set(dut.push.payload, rec)
        for name in ("pop", "clear"):
            ctx.set(getattr(dut, name), inputs.get(name, 0))
        await ctx.tick()

    async def bench(ctx):
        await push(ctx, recs[0])
        assert ctx.get(dut.count) == 0  # registered, not in yet
        await push(ctx, None)
        assert ctx.get(dut.count) == 1
        assert ctx.get(dut.head.region) == recs[0]["region"]
        # pop and push together at count 1: empty for a cycle, then the new record
        await push(ctx, recs[1], pop=1)
        assert ctx.get(dut.count) == 0
        await push(ctx, None)
        assert ctx.get(dut.count) == 1
        assert ctx.get(dut.head.stall_cycles) == recs[1]["stall_cycles"]
        # fill to the brim; the next record overflows in the cycle after its push...
        for r in recs[2:6]:
            await push(ctx, r)
        assert ctx.get(dut.count) == 4 and ctx.get(dut.overflow) == 1
        # ...unless a pop in that cycle makes room for it
        ctx.set(dut.pop, 1)
        assert ctx.get(dut.overflow) == 0
        await push(ctx, None, pop=1)
        assert ctx.get(dut.count) == 4
        assert ctx.get(dut.head.region) == recs[2]["region"]
        await push(ctx, None, clear=1)
        assert ctx.get(dut.count) == 0
        # a clear drops the record pushed the cycle before and keeps the one pushed with it
        await push(ctx, recs[0])
        await push(ctx, recs[6], clear=1)
        assert ctx.get(dut.count) == 0
        await push(ctx, None)
        assert ctx.get(dut.count) == 1
        assert ctx.get(dut.head.end) == recs[6]["end"]

    _run(dut, bench)
