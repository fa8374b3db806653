"""SpanChecker (hdl/seq/spans.py) under Amaranth's simulator: what each check presents
to the partition table after the SPANS and PRODUCTS steps, and that it holds."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from firmware.config import CONFIGS
from hdl.seq.spans import SpanChecker

CHECKS = 3


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("name", ["default", "small"])
def test_random_spans(name, seed):
    rng = random.Random(seed)
    dut = SpanChecker(CONFIGS[name], checks=CHECKS)

    async def bench(ctx):
        # nothing sampled yet: every check is one byte at offset 0 of partition 0
        ctx.set(dut.multiply, 1)
        await ctx.tick()
        ctx.set(dut.multiply, 0)
        for c in dut.chk:
            assert (ctx.get(c.p), ctx.get(c.offset), ctx.get(c.addend), ctx.get(c.nbytes)) \
                == (0, 0, 0, 1)
        for step in range(200):
            where = f"seed {seed} step {step}"
            extent = rng.getrandbits(28)
            ctx.set(dut.pool_extent, extent)
            reqs = []
            for span in dut.span:
                r = {"p": rng.getrandbits(3), "offset": rng.getrandbits(32),
                     "a": rng.getrandbits(13), "b": rng.getrandbits(21),
                     "add": rng.getrandbits(13), "extra": rng.getrandbits(1)}
                for k, v in r.items():
                    ctx.set(getattr(span, k), v)
                reqs.append(r)
            ctx.set(dut.sample, 1)  # SPANS
            await ctx.tick()
            ctx.set(dut.sample, 0)
            # the next requests do not disturb the checks until they are sampled
            for span in dut.span:
                ctx.set(span.offset, rng.getrandbits(32))
                ctx.set(span.a, rng.getrandbits(13))
            ctx.set(dut.pool_extent, rng.getrandbits(28))
            for c, r in zip(dut.chk, reqs, strict=True):
                assert ctx.get(c.p) == r["p"] and ctx.get(c.offset) == r["offset"], where
                assert ctx.get(c.addend) == r["add"] + (extent if r["extra"] else 0), where
            ctx.set(dut.multiply, 1)  # PRODUCTS
            await ctx.tick()
            ctx.set(dut.multiply, 0)
            await ctx.tick()  # CHECK, and FIRE: the checks hold
            for c, r in zip(dut.chk, reqs, strict=True):
                assert ctx.get(c.nbytes) == r["a"] * r["b"], where
                assert ctx.get(c.offset) == r["offset"], where

    _run(dut, bench)


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="NPUConfig"):
        SpanChecker({"rows": 8}, checks=CHECKS)
    with pytest.raises(ValueError, match="checks=0"):
        SpanChecker(CONFIGS["small"], checks=0)
