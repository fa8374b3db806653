"""Dispatch (hdl/seq/dispatch.py) under Amaranth's simulator: an instruction resolved
in CHECK fires in the first cycle its needs are met, exactly once, with its entry on
its queue's stream; a faulting instruction, a bus error or a spent budget never fire."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from firmware.config import CONFIGS
from hdl.seq.dispatch import Dispatch, Needs

QUEUES = ("load", "compute", "store")


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


async def _resolve(ctx, dut, need, *, fault=0, expired=0, pc=0):
    """The CHECK step of an instruction that needs ``need`` (a Needs field or None)."""
    for n in Needs.members:
        ctx.set(dut.needs[n], n == need)
    ctx.set(dut.fault, fault)
    ctx.set(dut.expired, expired)
    for q in ("load", "store"):
        ctx.set(getattr(dut, f"{q}_entry").pc, pc)
    ctx.set(dut.compute_entry.tokens, pc & 15)
    ctx.set(dut.resolve, 1)
    await ctx.tick()
    ctx.set(dut.resolve, 0)
    for n in Needs.members:
        ctx.set(dut.needs[n], 0)
    ctx.set(dut.fault, 0)
    ctx.set(dut.expired, 0)


def test_random_waits_against_model(seed):
    rng = random.Random(seed)
    dut = Dispatch(CONFIGS["small"])
    seen = dict.fromkeys(Needs.members, 0)

    async def bench(ctx):
        idle = dict.fromkeys(QUEUES, 1)
        for q in QUEUES:
            ctx.set(getattr(dut, f"{q}_idle"), 1)
        for step in range(300):
            where = f"seed {seed} step {step}"
            need = rng.choice([None, *Needs.members])
            await _resolve(ctx, dut, need, pc=step)
            # FIRE: the idle flags count a cycle late (`prev`), the readies at once
            waited = 0
            while True:
                prev = dict(idle)
                idle = {q: int(rng.random() < 0.6) for q in QUEUES}
                ready = {q: int(rng.random() < 0.5) for q in QUEUES}
                for q in QUEUES:
                    ctx.set(getattr(dut, f"{q}_idle"), idle[q])
                    ctx.set(getattr(dut, q).ready, ready[q])
                met = {None: True, "idle": all(prev.values()), "load_idle": prev["load"],
                       **ready}[need]
                assert ctx.get(dut.fire) == met, (where, need)
                assert ctx.get(dut.waiting) == (not met), where
                for q in QUEUES:
                    assert ctx.get(getattr(dut, q).valid) == (met and need == q), where
                if met:
                    if need in ("load", "store"):
                        assert ctx.get(getattr(dut, need).payload.pc) == step, where
                    if need == "compute":
                        assert ctx.get(dut.compute.payload.tokens) == step & 15, where
                    seen[need or "idle"] += waited > 0
                    await ctx.tick()
                    break
                waited += 1
                await ctx.tick()
            # fired once: nothing more until the next CHECK
            assert not ctx.get(dut.fire) and not ctx.get(dut.waiting), where
        assert all(v > 0 for v in seen.values()), seen

    _run(dut, bench)


@pytest.mark.parametrize("why", ["fault", "expired", "error", "expire"])
def test_what_never_fires(why):
    dut = Dispatch(CONFIGS["small"])

    async def bench(ctx):
        ctx.set(dut.load.ready, 1)
        await _resolve(ctx, dut, "load", fault=why == "fault", expired=why == "expired")
        assert ctx.get(dut.bad) == (why == "fault")
        if why in ("error", "expire"):
            # armed, and would fire now, but a bus error (or the budget running out
            # next cycle) drops it
            ctx.set(getattr(dut, why), 1)
            if why == "expire":
                assert ctx.get(dut.fire)  # this cycle still fires; disarms after
                ctx.set(dut.load.ready, 0)
            await ctx.tick()
            ctx.set(getattr(dut, why), 0)
            ctx.set(dut.load.ready, 1)
        for _ in range(4):
            assert not ctx.get(dut.fire) and not ctx.get(dut.load.valid)
            assert not ctx.get(dut.waiting)
            await ctx.tick()

    _run(dut, bench)


def test_idle_is_registered():
    dut = Dispatch(CONFIGS["small"])

    async def bench(ctx):
        assert ctx.get(dut.idle)  # queues start idle
        for q in ("load", "store"):
            ctx.set(getattr(dut, f"{q}_idle"), 1)
        assert ctx.get(dut.idle)
        await ctx.tick()
        assert not ctx.get(dut.idle)
        ctx.set(dut.compute_idle, 1)
        await ctx.tick()
        assert ctx.get(dut.idle)

    _run(dut, bench)


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="NPUConfig"):
        Dispatch("small")
