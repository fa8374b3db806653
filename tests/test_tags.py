"""The tile-tag store against a dict model of golden's ``Machine.tags``.

The model keeps ``{slot: key}`` for valid slots and applies one cycle the way
the hardware documents it: lookups see the state before the cycle, a set makes
its slot valid, and an invalidation of the same slot in the same cycle wins.
Keys come from a small pool plus near misses (one field changed), so hits,
misses on a valid slot and misses on an invalid one all happen.
"""

import gc
import random
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from firmware.config import CONFIGS
from hdl.ports import dma_command_layout
from hdl.tags import TagStore, tag_key_layout


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


def _fields(config):
    return {name: field.width for name, field in tag_key_layout(config)}


def _random_key(rng, config):
    return {name: rng.getrandbits(width) for name, width in _fields(config).items()}


def _near(rng, config, key):
    """``key`` with one of its bits flipped (every bit equally likely)."""
    bit = rng.randrange(sum(_fields(config).values()))
    for name, width in _fields(config).items():
        if bit < width:
            return {**key, name: key[name] ^ (1 << bit)}
        bit -= width
    raise AssertionError("unreachable")


def _set_key(ctx, view, key):
    for name, value in key.items():
        ctx.set(getattr(view, name), value)


def test_key_layout_is_the_dma_command():
    # a resolved DMA command is its own tag key, bit for bit
    for config in CONFIGS.values():
        assert tag_key_layout(config) == dma_command_layout(config)
        assert _fields(config) == {"dram": 32, "stride": 32, "rows": 9, "nbytes": 13,
                                   "sp": (config.sp_bytes - 1).bit_length()}


@pytest.mark.parametrize("name", ["default", "small"])
def test_random_sequences_against_dict_model(name, seed, regress):
    config = CONFIGS[name]
    n = config.tag_slots
    rng = random.Random(seed)
    dut = TagStore(config)
    pool = [_random_key(rng, config) for _ in range(6)]
    cycles = 2000 if regress else 600
    model: dict[int, dict] = {}
    seen = {"hit": 0, "miss_valid": 0, "miss_invalid": 0, "set_vs_inv": 0, "set_looked_up": 0}

    def slot(zero_and_beyond=0.15):
        if rng.random() < zero_and_beyond:  # no slot, or one past the last (aliases too)
            return rng.choice([0, n + 1, 63, rng.randrange(n + 1, 64)])
        return rng.randrange(1, n + 1)

    def key():
        k = rng.choice(pool)
        return _near(rng, config, k) if rng.random() < 0.2 else k

    async def bench(ctx):
        for cycle in range(cycles):
            where = f"seed {seed} cycle {cycle}"
            # one lookup per cycle: what is there, or a near miss of it
            qs, qk, pick = slot(), key(), rng.random()
            if qs in model and pick < 0.8:
                qk = model[qs] if pick < 0.4 else _near(rng, config, model[qs])
            ctx.set(dut.q_slot, qs)
            _set_key(ctx, dut.q_key, qk)
            # this cycle's updates
            set_en, inv_en = rng.random() < 0.4, rng.random() < 0.25
            inv_all = rng.random() < 0.02
            ss, sk, iv = slot(0.05), key(), slot(0.1)
            if set_en and inv_en and rng.random() < 0.3:
                iv = ss  # set and invalidate the same slot in one cycle
            if set_en and rng.random() < 0.3:
                ss = qs  # set the slot being looked up
                sk = qk if rng.random() < 0.5 else sk
            ctx.set(dut.set_en, set_en)
            ctx.set(dut.set_slot, ss)
            _set_key(ctx, dut.set_key, sk)
            ctx.set(dut.inv_en, inv_en)
            ctx.set(dut.inv_slot, iv)
            ctx.set(dut.inv_all, inv_all)
            if set_en and 1 <= ss <= n:
                model[ss] = sk
                seen["set_looked_up"] += ss == qs
            if inv_all or (inv_en and iv == 0):
                model.clear()
            elif inv_en:
                seen["set_vs_inv"] += set_en and iv == ss and ss in model
                model.pop(iv, None)
            await ctx.tick()
            # the lookup answers a cycle later, against the tags as the updates left them
            want = qs in model and model[qs] == qk
            got = ctx.get(dut.q_hit)
            assert got == want, f"{where}: slot {qs} key {qk} hit={got}, model {want}"
            seen["hit" if want else "miss_valid" if qs in model else "miss_invalid"] += 1
        assert all(seen.values()), f"seed {seed}: {seen}"

    _run(dut, bench)


def test_load_queue_protocol():
    # golden _op_load on a miss: invalidate the slot, transfer, then set it.
    config = CONFIGS["small"]
    rng = random.Random(7)
    dut = TagStore(config)
    a, b = _random_key(rng, config), _random_key(rng, config)

    async def lookup(ctx, s, k):
        ctx.set(dut.q_slot, s)
        _set_key(ctx, dut.q_key, k)
        await ctx.tick()  # the lookup is registered
        return ctx.get(dut.q_hit)

    async def pulse(ctx, **kw):
        for name, value in kw.items():
            if name.endswith("key"):
                _set_key(ctx, getattr(dut, name), value)
            else:
                ctx.set(getattr(dut, name), value)
        await ctx.tick()
        for name in ("set_en", "inv_en", "inv_all"):
            ctx.set(getattr(dut, name), 0)

    async def bench(ctx):
        assert not await lookup(ctx, 1, a)  # reset: nothing valid
        await pulse(ctx, set_en=1, set_slot=1, set_key=a)
        assert await lookup(ctx, 1, a)
        assert not await lookup(ctx, 2, a)  # keys are per slot
        assert not await lookup(ctx, 0, a)  # slot 0 means untagged
        # a different key misses: the queue invalidates, transfers, sets
        assert not await lookup(ctx, 1, b)
        await pulse(ctx, inv_en=1, inv_slot=1)
        assert not await lookup(ctx, 1, a)
        await pulse(ctx, set_en=1, set_slot=1, set_key=b)
        assert await lookup(ctx, 1, b) and not await lookup(ctx, 1, a)
        # tinv slot leaves the others alone; tinv 0 and the CSR clear everything
        await pulse(ctx, set_en=1, set_slot=config.tag_slots, set_key=a)
        await pulse(ctx, inv_en=1, inv_slot=1)
        assert not await lookup(ctx, 1, b) and await lookup(ctx, config.tag_slots, a)
        await pulse(ctx, inv_en=1, inv_slot=0)
        assert not await lookup(ctx, config.tag_slots, a)
        await pulse(ctx, set_en=1, set_slot=2, set_key=a)
        await pulse(ctx, inv_all=1)
        assert not await lookup(ctx, 2, a)
        # sets of slot 0 and past the last slot are dropped and disturb no real slot
        n = config.tag_slots
        for s in range(1, n + 1):
            await pulse(ctx, set_en=1, set_slot=s, set_key=a)
        for s in [0, *range(n + 1, 64)]:
            await pulse(ctx, set_en=1, set_slot=s, set_key=b)
            assert not await lookup(ctx, s, b)
        for s in range(1, n + 1):
            assert await lookup(ctx, s, a), f"slot {s}"

    _run(dut, bench)


def test_rejects_bad_arguments():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="NPUConfig"):
            TagStore({"tag_slots": 4})
        gc.collect()
