"""RegionMeters (hdl/seq/regions.py) under Amaranth's simulator: region records
against a model of the golden model's region trace (cycle counts and meter deltas
over each region), the stack's flags, and TRACE_WORDS derived from firmware."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from firmware.regs import TRACE_FIELDS
from hdl.seq.regions import METERS, TRACE_WORDS, RegionMeters
from hdl.sequencer import TRACE_WORDS as SEQ_TRACE_WORDS

M32 = (1 << 32) - 1
WIDTHS = {"instructions": 1, "macs": 16, "dram_read_bytes": 16, "dram_write_bytes": 16,
          "tag_hits": 1, "tag_misses": 1, "stall_cycles": 1, "busy_load": 1, "busy_store": 1,
          "busy_array": 1, "busy_vector": 1, "sp_conflicts": 3}


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_record_layout_comes_from_firmware():
    assert TRACE_WORDS == SEQ_TRACE_WORDS == len(TRACE_FIELDS)
    assert list(METERS) == list(TRACE_FIELDS[3:]) == list(WIDTHS)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_random_regions_against_model(depth, seed):
    rng = random.Random(seed)
    dut = RegionMeters(depth=depth)
    seen = {"records": 0, "nested": 0}

    async def bench(ctx):
        totals = dict.fromkeys(METERS, 0)  # every event before this cycle
        stack = []  # (id, start cycle, totals at the begin)
        last_mark = -2
        for cycle in range(1500):
            where = f"seed {seed} depth {depth} cycle {cycle}"
            ctx.set(dut.cycles, cycle)
            events = {n: rng.getrandbits(w) if rng.random() < 0.7 else 0
                      for n, w in WIDTHS.items()}
            for n, v in events.items():
                ctx.set(getattr(dut, n), v)
            assert ctx.get(dut.open) == bool(stack), where
            assert ctx.get(dut.full) == (len(stack) >= depth), where
            rid = rng.choice([stack[-1][0]] if stack and rng.random() < 0.7 else [5, 6, 7])
            ctx.set(dut.id, rid)
            assert ctx.get(dut.mismatch) == (not stack or stack[-1][0] != rid), where
            # marks at least two cycles apart, as the sequencer's are
            mark = cycle - last_mark >= 2 and rng.random() < 0.3
            begin = bool(mark and len(stack) < depth and rng.random() < 0.5)
            end = bool(mark and not begin and stack and stack[-1][0] == rid)
            ctx.set(dut.begin, begin)
            ctx.set(dut.end, end)
            if end:
                _, start, then = stack.pop()
                want = [rid, start, cycle] + [(totals[n] - then[n]) & M32 for n in METERS]
                assert ctx.get(dut.trace_valid), where
                assert [ctx.get(dut.trace_record[i]) for i in range(TRACE_WORDS)] == want, where
                seen["records"] += 1
                seen["nested"] += bool(stack)
            else:
                assert not ctx.get(dut.trace_valid), where
                assert all(ctx.get(dut.trace_record[i]) == 0 for i in range(TRACE_WORDS))
            if begin:
                stack.append((rid, cycle, dict(totals)))
            if begin or end:
                last_mark = cycle
            await ctx.tick()
            ctx.set(dut.begin, 0)
            ctx.set(dut.end, 0)
            for n, v in events.items():
                totals[n] += v
        assert seen["records"] > 20, seen
        if depth > 1:
            assert seen["nested"] > 0, seen

    _run(dut, bench)


def test_clear_closes_every_region_and_meters_keep_counting():
    dut = RegionMeters(depth=2)

    async def bench(ctx):
        ctx.set(dut.macs, 3)
        ctx.set(dut.id, 9)
        ctx.set(dut.begin, 1)
        await ctx.tick()
        ctx.set(dut.begin, 0)
        assert ctx.get(dut.open) and not ctx.get(dut.mismatch)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        assert not ctx.get(dut.open) and ctx.get(dut.mismatch)
        # a region over the next 4 cycles still sees 3 MACs a cycle
        ctx.set(dut.begin, 1)
        await ctx.tick()
        ctx.set(dut.begin, 0)
        for _ in range(3):
            await ctx.tick()
        ctx.set(dut.end, 1)
        assert ctx.get(dut.trace_valid)
        assert ctx.get(dut.trace_record[3 + METERS.index("macs")]) == 12

    _run(dut, bench)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="depth=0"):
        RegionMeters(depth=0)
