"""TokenCounters (hdl/seq/tokens.py) under Amaranth's simulator, against the golden
model's token bookkeeping at dispatch: counts per channel, TOKEN_DEADLOCK per queue,
and counts that change only when an instruction fires."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from firmware import isa
from firmware.isa import Token
from hdl.seq.tokens import QUEUES, TokenCounters

POPS = (Token.POP_PREV, Token.POP_NEXT)


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def _deadlocks(counts, queue, flags):
    return any(flags & f and counts[isa.token_channel(queue, f)] == 0
               for f in POPS if isa.LEGAL_TOKENS[queue] & f)


def test_random_instructions_against_model(seed):
    rng = random.Random(seed)
    dut = TokenCounters()
    seen = {"fired": 0, "deadlock": 0, "dropped": 0}

    async def bench(ctx):
        counts = dict.fromkeys(isa.TOKEN_CHANNELS, 0)
        for step in range(600):
            where = f"seed {seed} step {step} counts {counts}"
            queue = rng.choice(QUEUES)
            flags = int(isa.LEGAL_TOKENS[queue]) & rng.getrandbits(4)
            ctx.set(dut.flags, flags)
            for q in QUEUES:
                assert ctx.get(getattr(dut.deadlock, q.value)) == _deadlocks(counts, q, flags), \
                    (where, q, flags)
            dead = _deadlocks(counts, queue, flags)
            seen["deadlock"] += dead
            # CHECK: the counts as this instruction leaves them
            ctx.set(getattr(dut.queue, queue.value), 1)
            ctx.set(dut.resolve, 1)
            await ctx.tick()
            ctx.set(getattr(dut.queue, queue.value), 0)
            ctx.set(dut.resolve, 0)
            # a deadlocked instruction faults and never fires; so do a few others
            fire = not dead and rng.random() < 0.9
            if fire:
                for f in Token:
                    if flags & f:
                        counts[isa.token_channel(queue, f)] += -1 if f in POPS else 1
                seen["fired"] += 1
            else:
                seen["dropped"] += 1
            for _ in range(rng.choice([0, 0, 1, 2])):  # FIRE waits for its queue
                await ctx.tick()
            ctx.set(dut.fire, fire)
            await ctx.tick()
            ctx.set(dut.fire, 0)
            assert [ctx.get(dut.counts[i]) for i in range(len(isa.TOKEN_CHANNELS))] == \
                [counts[c] for c in isa.TOKEN_CHANNELS], where
        assert all(v > 20 for v in seen.values()), seen

    _run(dut, bench)


def test_sequencer_instructions_leave_counts_alone_and_clear_zeroes_them():
    dut = TokenCounters()

    async def bench(ctx):
        # a load that pushes to the compute queue
        ctx.set(dut.flags, Token.PUSH_NEXT)
        ctx.set(dut.queue.load, 1)
        ctx.set(dut.resolve, 1)
        await ctx.tick()
        ctx.set(dut.queue.load, 0)
        ctx.set(dut.fire, 1)
        await ctx.tick()
        assert ctx.get(dut.counts[isa.TOKEN_CHANNELS.index("load>compute")]) == 1
        assert not ctx.get(dut.deadlock.compute)  # POP_PREV would find the token...
        ctx.set(dut.flags, Token.POP_PREV)
        assert not ctx.get(dut.deadlock.compute)
        assert ctx.get(dut.deadlock.store)  # ...but the store queue's prev is compute
        # a sequencer instruction (no queue) resolved and fired: no change
        ctx.set(dut.resolve, 1)
        ctx.set(dut.fire, 0)
        await ctx.tick()
        ctx.set(dut.resolve, 0)
        ctx.set(dut.fire, 1)
        await ctx.tick()
        ctx.set(dut.fire, 0)
        assert ctx.get(dut.counts[isa.TOKEN_CHANNELS.index("load>compute")]) == 1
        ctx.set(dut.clear, 1)
        await ctx.tick()
        assert all(ctx.get(dut.counts[i]) == 0 for i in range(len(isa.TOKEN_CHANNELS)))
        assert ctx.get(dut.deadlock.compute)

    _run(dut, bench)
