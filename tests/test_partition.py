"""The partition table: writes, CSR readback, double buffering and range checks.

Checks are compared with the golden model's ``Machine._sp_range`` on random
tables (bases and sizes clustered around the scratchpad's edges) and random
queries (spans clustered around the partition's end).
"""

import gc
import random
import warnings

import pytest
from amaranth.hdl import ResetInserter, Signal, UnusedElaboratable
from amaranth.sim import Simulator

from firmware.config import CONFIGS
from firmware.golden import Machine, _Stop
from firmware.isa import ErrorCode
from hdl.partition import PartitionTable, pt_check_signature

CHECKS = 3


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


async def _write(ctx, dut, bank, pt_set, p, base, size):
    """Write one entry (one cycle)."""
    ctx.set(dut.w_en, 1)
    ctx.set(dut.w_bank, bank)
    ctx.set(dut.w_set, pt_set)
    ctx.set(dut.w_part, p)
    ctx.set(dut.w_base, base)
    ctx.set(dut.w_size, size)
    await ctx.tick()
    ctx.set(dut.w_en, 0)


def _golden(machine, bank, pt_set, p, offset, nbytes):
    """(error, addr, reason) from golden ``_sp_range`` with ``bank``/``pt_set`` active."""
    machine.active_bank, machine.pt_set = bank, pt_set
    try:
        return ErrorCode.NONE, machine._sp_range(p, offset, nbytes), "ok"
    except _Stop as stop:
        reason = next((r for r in _REASONS if r in stop.message), stop.message)
        return stop.code, None, reason


_REASONS = ("does not exist", "disabled", "leaves the scratchpad", "outside partition")
"""Words of golden's messages that tell the PARTITION_BOUNDS causes apart."""


def _random_entry(rng, sp):
    pick = rng.random()
    if pick < 0.15:
        return rng.randrange(sp), 0  # disabled
    if pick < 0.3:  # crosses or touches the end of the scratchpad
        base = sp - rng.randrange(1, 64)
        return base, sp - base + rng.choice([-1, 0, 0, 1, 2])
    if pick < 0.4:  # wild 32-bit values
        return rng.getrandbits(32), rng.getrandbits(32)
    if pick < 0.5:  # base + size just past 2**32: only a 33-bit sum sees it leave
        small = rng.randrange(1, 1 << 10)
        if rng.random() < 0.5:
            return (1 << 32) - small, rng.randrange(small + 1, small + 64)
        return rng.randrange(64), (1 << 32) - small
    base = rng.randrange(sp)
    return base, rng.randrange(1, sp - base + 1)


def _random_query(rng, table):
    """(p, offset, nbytes) aimed at the edges of entry p of ``table``."""
    # p is a 3-bit field: BAD_OPERAND exists only in builds with fewer than 8 partitions
    p = rng.randrange(min(len(table) + 1, 8)) if rng.random() < 0.9 else rng.randrange(8)
    size = table[p][1] if p < len(table) else rng.randrange(64)
    pick = rng.random()
    if pick < 0.4 and size:  # span ending just inside / just past the partition
        nbytes = rng.randrange(1, min(size, 1 << 12) + 1)
        offset = max(0, size - nbytes + rng.choice([-2, -1, 0, 0, 1, 2]))
    elif pick < 0.5:  # huge values: no wrap in 32/40-bit arithmetic
        offset, nbytes = rng.getrandbits(32), rng.randrange(1, 1 << 40)
    elif pick < 0.6:  # offset + nbytes just past 2**32 or 2**40
        small = rng.randrange(1, max(2, size))
        offset, nbytes = rng.choice([((1 << 32) - small, 2 * small),
                                     (small, (1 << 40) - small),
                                     (0, (1 << 32) + small)])
    else:
        offset, nbytes = rng.randrange(size + 8), rng.randrange(1, 512)
    return p, offset & 0xFFFF_FFFF, nbytes


def test_check_signature_widths():
    sig = pt_check_signature(CONFIGS["default"])
    widths = {name: member.shape for name, member in sig.members.items()}
    assert widths == {"p": 3, "offset": 32, "nbytes": 40, "addend": 40, "addr": 16,
                      "error": 4}


@pytest.mark.parametrize("name", ["default", "small"])
def test_random_tables_against_golden(name, seed, regress):
    config = CONFIGS[name]
    rng = random.Random(seed)
    dut = PartitionTable(config, checks=CHECKS)
    golden = Machine(config, dram_bytes=16)
    rounds, queries = (6, 300) if regress else (3, 120)

    async def bench(ctx):
        counts = {reason: 0 for reason in ("ok", *_REASONS)}
        for rnd in range(rounds):
            # rewrite a random subset of entries (all of them the first time);
            # every table keeps at least one disabled entry
            for bank in range(2):
                for pt_set in range(config.pt_sets):
                    off = rng.randrange(config.partitions)
                    for p in range(config.partitions):
                        if rnd and p != off and rng.random() < 0.6:
                            continue
                        entry = _random_entry(rng, config.sp_bytes)
                        if p == off:
                            entry = (entry[0], 0)
                        await _write(ctx, dut, bank, pt_set, p, *entry)
                        golden.ptables[bank][pt_set][p] = entry
            await ctx.tick()  # the checks take the last write a cycle after readback
            # CSR readback of every entry
            for bank in range(2):
                for pt_set in range(config.pt_sets):
                    for p in range(config.partitions):
                        ctx.set(dut.r_bank, bank)
                        ctx.set(dut.r_set, pt_set)
                        ctx.set(dut.r_part, p)
                        got = ctx.get(dut.r_base), ctx.get(dut.r_size)
                        assert got == golden.ptables[bank][pt_set][p], \
                            f"seed {seed}: readback bank {bank} set {pt_set} p{p}: {got}"
            # queries on every check port, the active bank/set changing under them
            for q in range(queries):
                bank, pt_set = rng.randrange(2), rng.randrange(config.pt_sets)
                ctx.set(dut.bank, bank)
                ctx.set(dut.set, pt_set)
                expected = []
                for chk in dut.checks:
                    p, offset, nbytes = _random_query(rng, golden.ptables[bank][pt_set])
                    # the sequencer's split: the span is a product plus an addend
                    addend = rng.choice([0, rng.randrange(nbytes + 1)])
                    ctx.set(chk.p, p)
                    ctx.set(chk.offset, offset)
                    ctx.set(chk.addend, addend)
                    ctx.set(chk.nbytes, nbytes - addend)
                    expected.append(((p, offset, nbytes),
                                     _golden(golden, bank, pt_set, p, offset, nbytes)))
                await ctx.tick().repeat(2)  # the active table, then the lookup
                for i, (chk, (query, (code, addr, reason))) in enumerate(
                        zip(dut.checks, expected, strict=True)):
                    err = ctx.get(chk.error)
                    where = (f"seed {seed} round {rnd} query {q} check {i}: bank {bank} "
                             f"set {pt_set} (p, offset, nbytes)={query}")
                    assert err == code, f"{where}: error {err}, golden {code!r}"
                    if code == ErrorCode.NONE:
                        assert ctx.get(chk.addr) == addr, f"{where}: addr"
                    counts[reason] += 1
        # every outcome of _sp_range was exercised (p is a 3-bit field: a build
        # with 8 partitions has no nonexistent one)
        for reason, n in counts.items():
            if reason != "does not exist" or config.partitions < 8:
                assert n >= 5, f"seed {seed}: {counts}"

    _run(dut, bench)


@pytest.mark.parametrize("name", ["default", "small"])
def test_double_buffer_and_reset(name):
    config = CONFIGS[name]
    dut = PartitionTable(config, checks=1)
    chk = dut.checks[0]
    last_set = config.pt_sets - 1

    async def query(ctx, bank, pt_set, p, offset=0, nbytes=1):
        ctx.set(dut.bank, bank)
        ctx.set(dut.set, pt_set)
        ctx.set(chk.p, p)
        ctx.set(chk.offset, offset)
        ctx.set(chk.nbytes, nbytes)
        await ctx.tick().repeat(2)  # the active table, then the lookup (registered)
        return ctx.get(chk.error), ctx.get(chk.addr)

    async def bench(ctx):
        # reset: every entry disabled
        for bank in range(2):
            for pt_set in range(config.pt_sets):
                err, _ = await query(ctx, bank, pt_set, 0)
                assert err == ErrorCode.PARTITION_BOUNDS
        # one distinct entry per (bank, set), partition 1
        for bank in range(2):
            for pt_set in range(config.pt_sets):
                ctx.set(dut.w_en, 1)
                ctx.set(dut.w_bank, bank)
                ctx.set(dut.w_set, pt_set)
                ctx.set(dut.w_part, 1)
                ctx.set(dut.w_base, 0x100 * (1 + 2 * bank + pt_set))
                ctx.set(dut.w_size, 16 * (1 + 2 * bank + pt_set))
                # a lookup at the write's edge sees the entry as it was
                assert (await query(ctx, bank, pt_set, 1))[0] == ErrorCode.PARTITION_BOUNDS
        # a write to a set the build does not have changes nothing
        ctx.set(dut.w_set, config.pt_sets)
        ctx.set(dut.w_part, 1)
        await ctx.tick()
        ctx.set(dut.w_en, 0)
        for bank in range(2):
            for pt_set in range(config.pt_sets):
                k = 1 + 2 * bank + pt_set
                assert await query(ctx, bank, pt_set, 1, 16 * k - 4, 4) == \
                    (ErrorCode.NONE, 0x100 * k + 16 * k - 4)
                assert (await query(ctx, bank, pt_set, 1, 16 * k - 4, 5))[0] == \
                    ErrorCode.PARTITION_BOUNDS
                # the other partitions of the table are still disabled
                assert (await query(ctx, bank, pt_set, 0))[0] == ErrorCode.PARTITION_BOUNDS
        # a set the build does not have reads as disabled
        if config.pt_sets < 4:
            assert (await query(ctx, 1, last_set + 1, 1))[0] == ErrorCode.PARTITION_BOUNDS
        ctx.set(dut.r_set, config.pt_sets if config.pt_sets < 4 else 0)
        ctx.set(dut.r_part, 7 if config.partitions < 8 else 1)
        if config.pt_sets < 4 or config.partitions < 8:
            assert (ctx.get(dut.r_base), ctx.get(dut.r_size)) == (0, 0)

    _run(dut, bench)


def test_checks_take_a_write_a_cycle_after_readback():
    """The documented write timing: readback at the write's edge, the checks' copy one
    edge later, then the active table, then the lookup."""
    config = CONFIGS["small"]
    dut = PartitionTable(config, checks=1)
    chk = dut.checks[0]

    async def bench(ctx):
        ctx.set(chk.p, 2)
        ctx.set(chk.nbytes, 1)
        await _write(ctx, dut, 0, 0, 2, 0x80, 0x10)
        ctx.set(dut.r_part, 2)
        assert (ctx.get(dut.r_base), ctx.get(dut.r_size)) == (0x80, 0x10)
        await ctx.tick().repeat(2)  # the copy, then the active table: lookup still old
        assert ctx.get(chk.error) == ErrorCode.PARTITION_BOUNDS
        await ctx.tick()
        assert (ctx.get(chk.error), ctx.get(chk.addr)) == (ErrorCode.NONE, 0x80)

    _run(dut, bench)


def test_reset_clears_readback():
    """The readback memory keeps its contents through a reset; the entries must not."""
    config = CONFIGS["default"]
    dut = PartitionTable(config, checks=1)
    rst = Signal()
    top = ResetInserter(rst)(dut)
    chk = dut.checks[0]

    async def bench(ctx):
        await _write(ctx, dut, 0, 0, 3, 0x40, 0x20)
        ctx.set(dut.r_part, 3)
        assert (ctx.get(dut.r_base), ctx.get(dut.r_size)) == (0x40, 0x20)
        ctx.set(chk.p, 3)
        ctx.set(chk.nbytes, 1)
        # the checks' copy of the entry, the active table, then the lookup
        await ctx.tick().repeat(3)
        assert ctx.get(chk.error) == ErrorCode.NONE
        ctx.set(rst, 1)
        await ctx.tick()
        ctx.set(rst, 0)
        assert (ctx.get(dut.r_base), ctx.get(dut.r_size)) == (0, 0)
        await ctx.tick().repeat(2)
        assert ctx.get(chk.error) == ErrorCode.PARTITION_BOUNDS

    _run(top, bench)


def test_rejects_bad_arguments():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="checks=0"):
            PartitionTable(CONFIGS["small"], checks=0)
        with pytest.raises(TypeError, match="NPUConfig"):
            PartitionTable(None)
        gc.collect()


@pytest.mark.parametrize("limit,bits", [(1 << 14, 14), (6144, 13), (1, 1), (2, 1), (3, 2)])
def test_exceeds_matches_the_full_width_sum(limit, bits, seed):
    """``exceeds`` narrows ``base + size > limit`` to a ``bits``-wide adder; it must
    agree with the 33-bit sum everywhere, so probe the edges of every part."""
    from amaranth.hdl import Module

    from hdl.partition import exceeds
    rng = random.Random(seed)
    edges = [0, 1, 2, limit - 1, limit, limit + 1, (1 << bits) - 1, 1 << bits,
             (1 << bits) + 1, 2 << bits, (1 << 32) - 1, (1 << 32) - (1 << bits)]
    values = [v % (1 << 32) for v in edges] + [rng.randrange(1 << 32) for _ in range(8)]
    values += [rng.randrange(limit + 2) for _ in range(8)]
    base, size = Signal(32), Signal(32)
    m = Module()
    out = Signal()
    m.d.comb += out.eq(exceeds(base, size, limit, bits))
    sim = Simulator(m)

    async def bench(ctx):
        for b in values:
            for s in values:
                ctx.set(base, b)
                ctx.set(size, s)
                assert ctx.get(out) == (b + s > limit), (b, s)

    sim.add_testbench(bench)
    sim.run()
