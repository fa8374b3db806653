"""LoopStack (hdl/seq/loops.py) under Amaranth's simulator, against a list model: the
pc after a body, passes counted, push/pop order, overflow and nesting flags, and the
branch compares."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from hdl.seq.loops import LoopStack

PC_BITS = 17


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


class Model:
    """The golden model's loop stack: [start, end, passes left], innermost last."""

    def __init__(self, depth):
        self.depth = depth
        self.stack: list[list[int]] = []

    def advance(self, pc):
        if self.stack and pc + 1 == self.stack[-1][1] and self.stack[-1][2] > 1:
            return self.stack[-1][0]
        return pc + 1

    def go_on(self, pc):
        if self.stack and pc + 1 == self.stack[-1][1]:
            if self.stack[-1][2] > 1:
                self.stack[-1][2] -= 1
            else:
                self.stack.pop()

    def outside(self, k, target):
        if len(self.stack) < k:
            return False
        start, end, _ = self.stack[-k]
        return not start <= target < end


async def _instruction(ctx, dut, pc, *, advances=0, push=0, pop=0, end=0, count=0):
    """One instruction's CHECK step (resolve) and then its fire."""
    ctx.set(dut.pc, pc)
    ctx.set(dut.end, end)
    ctx.set(dut.count, count)
    ctx.set(dut.resolve, 1)
    ctx.set(dut.advances, advances)
    ctx.set(dut.push, push)
    ctx.set(dut.pop, pop)
    await ctx.tick()
    ctx.set(dut.resolve, 0)
    ctx.set(dut.advances, 0)
    ctx.set(dut.push, 0)
    ctx.set(dut.pop, 0)
    ctx.set(dut.fire, 1)
    await ctx.tick()
    ctx.set(dut.fire, 0)


def test_nested_loops_run_their_passes_and_pop_in_order():
    dut = LoopStack(depth=2, pc_bits=PC_BITS)
    trace = []

    async def bench(ctx):
        # loop 3 over [1, 4), inside it loop 2 over [2, 3): pcs as the golden model runs
        await _instruction(ctx, dut, 0, push=1, end=4, count=3)
        pc = 1
        while pc != 4:
            trace.append(pc)
            if pc == 1:
                ctx.set(dut.pc, 1)
                assert ctx.get(dut.advance) == 2
                ctx.set(dut.end, 3)
                assert not ctx.get(dut.nests_badly) and not ctx.get(dut.full)
                await _instruction(ctx, dut, 1, push=1, end=3, count=2)
                pc = 2
                continue
            ctx.set(dut.pc, pc)
            nxt = ctx.get(dut.advance)
            await _instruction(ctx, dut, pc, advances=1)
            pc = nxt
        # both loops have closed: the pc goes on in sequence
        ctx.set(dut.pc, 7)
        assert ctx.get(dut.advance) == 8
        assert not ctx.get(dut.full)

    _run(dut, bench)
    assert trace == [1, 2, 2, 3] * 3


def test_full_and_nesting_flags():
    dut = LoopStack(depth=2, pc_bits=PC_BITS)

    async def bench(ctx):
        ctx.set(dut.end, 50)
        assert not ctx.get(dut.nests_badly)  # no loop open
        await _instruction(ctx, dut, 0, push=1, end=40, count=5)
        for end, bad in ((39, 0), (40, 1), (41, 1)):
            ctx.set(dut.end, end)
            assert ctx.get(dut.nests_badly) == bad, end
        assert not ctx.get(dut.full)
        await _instruction(ctx, dut, 1, push=1, end=30, count=5)
        assert ctx.get(dut.full)  # a third push would overflow
        # a taken branch out of the inner loop pops it
        await _instruction(ctx, dut, 5, pop=1)
        assert not ctx.get(dut.full)
        ctx.set(dut.end, 39)
        assert not ctx.get(dut.nests_badly)  # the outer loop [1, 40) is on top again
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.end, 60)
        assert not ctx.get(dut.nests_badly) and not ctx.get(dut.full)

    _run(dut, bench)


def test_resolve_without_fire_changes_nothing():
    """A faulting instruction is resolved but never fires."""
    dut = LoopStack(depth=2, pc_bits=PC_BITS)

    async def bench(ctx):
        ctx.set(dut.pc, 0)
        ctx.set(dut.end, 3)
        ctx.set(dut.count, 2)
        ctx.set(dut.push, 1)
        ctx.set(dut.resolve, 1)
        await ctx.tick()
        ctx.set(dut.resolve, 0)
        ctx.set(dut.push, 0)
        await ctx.tick()
        ctx.set(dut.pc, 2)
        assert ctx.get(dut.advance) == 3  # nothing was pushed

    _run(dut, bench)


@pytest.mark.parametrize("depth", [1, 3])
def test_random_against_model(depth, seed):
    rng = random.Random(seed)
    dut = LoopStack(depth=depth, pc_bits=PC_BITS)
    model = Model(depth)
    seen = {"push": 0, "pass": 0, "close": 0, "leave": 0}

    async def bench(ctx):
        for step in range(400):
            where = f"seed {seed} step {step} stack {model.stack}"
            st = model.stack
            # pcs near the innermost loop's end, so that passes and closes happen
            pc = (st[-1][1] - 1 if st and rng.random() < 0.6 else rng.randrange(0, 200))
            end = rng.randrange(pc + 2, pc + 60)
            ctx.set(dut.pc, pc)
            ctx.set(dut.end, end)
            assert ctx.get(dut.advance) == model.advance(pc), where
            assert ctx.get(dut.full) == (len(st) >= depth), where
            assert ctx.get(dut.nests_badly) == bool(st and end >= st[-1][1]), where
            target = rng.randrange(0, 260)
            ctx.set(dut.target, target)
            ctx.set(dut.sample, 1)
            await ctx.tick()
            ctx.set(dut.sample, 0)
            assert ctx.get(dut.leaves) == model.outside(1, target), where
            assert ctx.get(dut.leaves_two) == model.outside(2, target), where
            kind = rng.choice(["advance", "advance", "loop", "branch"])
            if kind == "loop" and len(st) < depth and not (st and end >= st[-1][1]):
                count = rng.choice([0, 1, 2, 3])
                await _instruction(ctx, dut, pc, push=count != 0, end=end, count=count)
                if count:
                    st.append([pc + 1, end, count])
                    seen["push"] += 1
            elif kind == "branch" and st:
                await _instruction(ctx, dut, pc, pop=1)
                st.pop()
                seen["leave"] += 1
            else:
                before = len(st)
                passing = st and pc + 1 == st[-1][1]
                await _instruction(ctx, dut, pc, advances=1)
                model.go_on(pc)
                if passing:
                    seen["pass" if len(st) == before else "close"] += 1
        assert all(seen.values()), seen

    _run(dut, bench)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="depth=0"):
        LoopStack(depth=0, pc_bits=PC_BITS)
    with pytest.raises(ValueError, match="pc_bits"):
        LoopStack(depth=2, pc_bits="17")
