"""The instruction memory (hdl/imem.py) and the predecode it stores beside each word,
under Amaranth's simulator, against the ISA's own decoder (firmware/isa.py)."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from firmware import isa
from firmware.config import CONFIGS
from hdl.imem import InstructionMemory
from hdl.sequencer import QUEUE_OPS, SLOT_OF

DEC = isa.decoder_constants()


def _expected(word: int) -> dict:
    """What the dispatch must see of ``word``: the registers r1..r15 its opcode's
    register fields name, the register of each read slot, legality, the steps it takes."""
    opcode = (word >> isa.OPCODE_LO) & ((1 << isa.OPCODE_BITS) - 1)
    mn = next((m for m, c in DEC["opcodes"].items() if c == opcode), None)
    out = {"uses": 0, "slots": [0] * (1 + max(SLOT_OF.values())), "queue_op": 0, "spans": 0}
    try:
        isa.decode(word)
        out["legal"] = 1
    except isa.DecodeError:
        out["legal"] = 0
    if mn is None:
        return out
    for name, (lo, bits, kind) in DEC["fields"][mn].items():
        value = (word >> lo) & ((1 << bits) - 1)
        if kind == "reg":
            out["uses"] |= 1 << value
        if (mn, name) in SLOT_OF:
            out["slots"][SLOT_OF[(mn, name)]] = value
    out["uses"] >>= 1  # r1..r15: r0 is never pending
    out["queue_op"] = int(mn in QUEUE_OPS)
    out["spans"] = int(mn in QUEUE_OPS or mn == "br")
    return out


def _words(rng: random.Random, n: int) -> list[int]:
    """Legal words of every instruction, words with reserved bits or a wrong
    version, and random words."""
    words = []
    specs = list(isa.BY_MNEMONIC.values())
    for i in range(n):
        spec = specs[i % len(specs)]
        base = (spec.opcode << isa.OPCODE_LO) | (isa.ISA_VERSION << isa.VERSION_LO)
        kind = rng.random()
        if kind < 0.6:
            word = base | (rng.getrandbits(isa.TOKENS_LO) & spec.operand_bits)
        elif kind < 0.8:
            word = base | rng.getrandbits(isa.TOKENS_LO)
        else:
            word = rng.getrandbits(64)
        words.append(word)
    return words


def test_predecode_matches_the_isa_decoder(seed):
    cfg = CONFIGS["small"]
    rng = random.Random(seed)
    dut = InstructionMemory(cfg)
    words = _words(rng, cfg.imem_depth - 1)
    legal = sum(_expected(w)["legal"] for w in words)
    assert legal > len(words) // 3 and legal < len(words)  # both kinds are exercised

    async def bench(ctx):
        for i, word in enumerate(words):
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_bank, i & 1)
            ctx.set(dut.w_index, i)
            ctx.set(dut.w_data, word)
            await ctx.tick()
        ctx.set(dut.w_en, 0)
        # the last index was never written: an all-zero word, illegal, predecode zero
        for i, word in enumerate([*words, 0]):
            ctx.set(dut.r_en, 1)
            ctx.set(dut.r_bank, i & 1 if i < len(words) else 0)
            ctx.set(dut.r_index, i)
            await ctx.tick()
            assert ctx.get(dut.r_data) == word
            want = _expected(word)
            got = {"uses": ctx.get(dut.r_pre.uses), "legal": ctx.get(dut.r_pre.legal),
                   "slots": [ctx.get(dut.r_pre.slots[k]) for k in range(len(want["slots"]))],
                   "queue_op": ctx.get(dut.r_pre.queue_op), "spans": ctx.get(dut.r_pre.spans)}
            assert got == want, f"seed {seed}, word {i} {word:#018x}: {got} != {want}"

    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()
