"""HeadRegisterFIFO against a list model: order, level, one cycle from a write to
the head, and its argument checks."""

import random

import pytest
from amaranth.sim import Simulator

from hdl.fifo import HeadRegisterFIFO


@pytest.mark.parametrize("depth", [2, 3, 7])
@pytest.mark.parametrize("seed", range(3))
def test_random_pushes_and_pops_match_a_queue(depth, seed):
    rng = random.Random(seed)
    dut = HeadRegisterFIFO(width=16, depth=depth)
    seen = {"pops": 0, "bypassed": 0}

    async def bench(ctx):
        model = []  # entries, head first
        written_last = None  # the value written last cycle into an empty queue
        for cycle in range(600):
            where = f"seed {seed} depth {depth} cycle {cycle}"
            # The head is a register: what the queue holds now is on its outputs.
            assert ctx.get(dut.level) == len(model), where
            assert ctx.get(dut.r_rdy) == bool(model), where
            assert ctx.get(dut.w_rdy) == (len(model) < depth), where
            if model:
                assert ctx.get(dut.r_data) == model[0], where
            if written_last is not None:
                # An entry written into an empty queue is at the head a cycle later.
                assert model and model[0] == written_last, where
                seen["bypassed"] += 1
            pop = bool(model) and rng.random() < 0.5
            # Writes only with room (``w_rdy``), as SyncFIFO's: a pop in the same
            # cycle does not make room.
            push = len(model) < depth and rng.random() < 0.6
            value = rng.getrandbits(16)
            ctx.set(dut.r_en, pop)
            ctx.set(dut.w_en, push)
            ctx.set(dut.w_data, value)
            written_last = value if push and not model else None
            await ctx.tick()
            if pop:
                model.pop(0)
                seen["pops"] += 1
            if push:
                model.append(value)
        assert seen["pops"] > 100 and seen["bypassed"] > 3, seen

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("depth", [2, 3])
def test_a_full_queue_refuses_writes(depth):
    dut = HeadRegisterFIFO(width=8, depth=depth)

    async def bench(ctx):
        for v in range(depth):
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_data, v + 1)
            await ctx.tick()
        assert ctx.get(dut.level) == depth
        assert not ctx.get(dut.w_rdy)
        ctx.set(dut.w_data, 99)
        await ctx.tick()  # refused: nothing lost, nothing added
        ctx.set(dut.w_en, 0)
        out = []
        ctx.set(dut.r_en, 1)
        while ctx.get(dut.r_rdy):
            out.append(ctx.get(dut.r_data))
            await ctx.tick()
        assert out == list(range(1, depth + 1))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("depth", [0, 1, 2.0, None])
def test_rejects_a_depth_under_two(depth):
    with pytest.raises(ValueError, match="depth"):
        HeadRegisterFIFO(width=8, depth=depth)
