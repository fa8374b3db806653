"""BoundsConfig (hdl/seq/bounds.py) under Amaranth's simulator: the cfg fields the
bounds checks read, their zero flags and the pooling window's extent, against a
dict model of the golden model's cfg registers."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from firmware import isa
from firmware.isa import CfgField
from hdl.seq.bounds import BOUNDS_FIELDS, BoundsConfig


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


async def _cfg(ctx, dut, field, value, *, fire=True):
    """A cfg's PRODUCTS and CHECK steps, then its fire (or a fault: no fire)."""
    ctx.set(dut.field, int(field))
    ctx.set(dut.value, value)
    ctx.set(dut.products, 1)
    await ctx.tick()
    ctx.set(dut.products, 0)
    ctx.set(dut.resolve, 1)
    await ctx.tick()
    ctx.set(dut.resolve, 0)
    ctx.set(dut.write, fire)
    await ctx.tick()
    ctx.set(dut.write, 0)


def _check(ctx, dut, model, where):
    for f in BOUNDS_FIELDS:
        name = f.name.lower()
        assert ctx.get(getattr(dut.values, name)) == model[f], (where, f)
        assert ctx.get(getattr(dut.zero, name)) == (model[f] == 0), (where, f)
    extent = (model[CfgField.POOL_COUNT] - 1) * model[CfgField.POOL_STRIDE]
    assert ctx.get(dut.pool_extent) == extent, where


def test_random_writes_against_model(seed):
    rng = random.Random(seed)
    dut = BoundsConfig()

    async def bench(ctx):
        model = {f: isa.CFG_RESET[f] for f in CfgField}
        _check(ctx, dut, model, "reset")
        for step in range(300):
            where = f"seed {seed} step {step}"
            field = rng.choice([*BOUNDS_FIELDS, *BOUNDS_FIELDS, rng.choice(list(CfgField))])
            _, lo, hi = isa.CFG_RANGE[field]
            value = rng.choice([lo, hi, 0 if lo <= 0 <= hi else lo, rng.randint(lo, hi)])
            fire = rng.random() < 0.85
            await _cfg(ctx, dut, field, value, fire=fire)
            if fire:
                model[field] = value
            _check(ctx, dut, model, where)
            if rng.random() < 0.05:
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
                model = {f: isa.CFG_RESET[f] for f in CfgField}
                _check(ctx, dut, model, where + " clear")

    _run(dut, bench)


def test_extent_takes_the_largest_window():
    dut = BoundsConfig()

    async def bench(ctx):
        await _cfg(ctx, dut, CfgField.POOL_STRIDE, (1 << 20) - 1)
        assert ctx.get(dut.pool_extent) == 0  # count 1: one row, no extent
        await _cfg(ctx, dut, CfgField.POOL_COUNT, 255)
        assert ctx.get(dut.pool_extent) == 254 * ((1 << 20) - 1)

    _run(dut, bench)
