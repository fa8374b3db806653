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


def _operands_bad(mn: str, f: dict, cfg) -> bool:
    """The operand-range faults the ISA defines for one instruction (docs/isa.md),
    from its raw field values ``f`` (count fields hold the count - 1)."""
    if mn == "cfg":
        rng = isa.CFG_RANGE.get(f["field"])
        value = f["value"] - (1 << 32) if f["value"] >> 31 else f["value"]
        return rng is not None and not rng[1] <= value <= rng[2]
    return {
        "ptsel": lambda: f["set"] >= cfg.pt_sets,
        "tinv": lambda: f["slot"] > cfg.tag_slots,
        "load": lambda: f["tag"] > cfg.tag_slots,
        "wload": lambda: f["k"] + 1 > cfg.rows or f["n"] + 1 > cfg.cols,
        "vbias": lambda: f["n"] + 1 > cfg.cols,
        "vreq": lambda: f["n"] + 1 > cfg.cols,
        "vreqb": lambda: f["n"] + 1 > cfg.cols,
        "vqtab": lambda: f["n"] + 1 > cfg.cols,
        "loop": lambda: f["end"] > cfg.imem_depth,
        "loopr": lambda: f["end"] > cfg.imem_depth,
        "br": lambda: f["target"] >= cfg.imem_depth,
        "dwload": lambda: cfg.dw_rows == 0,
        "dwconv": lambda: _dwconv_bad(f, cfg),
    }.get(mn, lambda: False)()


def _dwconv_bad(f: dict, cfg) -> bool:
    s = f["s"] + 1
    rows_in, cols_in = f["h"] * s + f["kh"] + 1, f["m"] * s + f["kw"] + 1
    return (f["kh"] + 1 > 3 or f["kw"] + 1 > 3 or f["n"] + 1 > cfg.cols
            or rows_in > cfg.dw_rows or rows_in <= f["pt"] + f["pb"]
            or cols_in <= f["pl"] + f["pr"])


def _expected(word: int, cfg) -> dict:
    """What the dispatch must see of ``word``: the registers r1..r15 its opcode's
    register fields name, the register of each read slot, legality, the steps it
    takes, whether its operands are out of ``cfg``'s range."""
    opcode = (word >> isa.OPCODE_LO) & ((1 << isa.OPCODE_BITS) - 1)
    mn = next((m for m, c in DEC["opcodes"].items() if c == opcode), None)
    out = {"uses": 0, "slots": [0] * (1 + max(SLOT_OF.values())), "queue_op": 0, "spans": 0,
           "operands_bad": 0}
    try:
        isa.decode(word)
        out["legal"] = 1
    except isa.DecodeError:
        out["legal"] = 0
    if mn is None:
        return out
    raw = {}
    for name, (lo, bits, kind) in DEC["fields"][mn].items():
        value = raw[name] = (word >> lo) & ((1 << bits) - 1)
        if kind == "reg":
            out["uses"] |= 1 << value
        if (mn, name) in SLOT_OF:
            out["slots"][SLOT_OF[(mn, name)]] = value
    out["uses"] >>= 1  # r1..r15: r0 is never pending
    out["queue_op"] = int(mn in QUEUE_OPS)
    out["spans"] = int(mn in QUEUE_OPS or mn == "br")
    out["operands_bad"] = int(_operands_bad(mn, raw, cfg))
    return out


def _boundary_words(cfg) -> list[int]:
    """Words with an operand just inside and just outside ``cfg``'s range, per rule."""
    def word(mn, **fields):
        spec = isa.BY_MNEMONIC[mn]
        w = (spec.opcode << isa.OPCODE_LO) | (isa.ISA_VERSION << isa.VERSION_LO)
        for name, value in fields.items():
            lo, bits, _ = DEC["fields"][mn][name]
            w |= (value & ((1 << bits) - 1)) << lo
        return w
    out = []
    for edge in (0, 1):  # in range, then one past it (count fields hold count - 1)
        out += [word("ptsel", set=cfg.pt_sets - 1 + edge),
                word("tinv", slot=cfg.tag_slots + edge),
                word("load", tag=cfg.tag_slots + edge),
                word("wload", k=cfg.rows - 1 + edge), word("wload", n=cfg.cols - 1 + edge),
                word("vbias", n=cfg.cols - 1 + edge), word("vreq", n=cfg.cols - 1 + edge),
                word("vqtab", n=cfg.cols - 1 + edge),
                word("loop", end=cfg.imem_depth + edge),
                word("loopr", end=cfg.imem_depth + edge),
                word("br", target=cfg.imem_depth - 1 + edge)]
        for fld, (_, lo, hi) in isa.CFG_RANGE.items():
            out += [word("cfg", field=int(fld), value=lo - edge),
                    word("cfg", field=int(fld), value=hi + edge)]
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
    edges = _boundary_words(cfg)
    words = edges + _words(rng, cfg.imem_depth - 1 - len(edges))
    legal = sum(_expected(w, cfg)["legal"] for w in words)
    assert legal > len(words) // 3 and legal < len(words)  # both kinds are exercised
    bad = sum(_expected(w, cfg)["operands_bad"] for w in words)
    assert len(words) // 20 < bad < len(words) // 2  # so are operands in and out of range

    async def bench(ctx):
        for i, word in enumerate(words):
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_bank, i & 1)
            ctx.set(dut.r_bank, ~i & 1)  # the fetch is on the other bank, as in the NPU
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
            want = _expected(word, cfg)
            got = {"uses": ctx.get(dut.r_pre.uses), "legal": ctx.get(dut.r_pre.legal),
                   "slots": [ctx.get(dut.r_pre.slots[k]) for k in range(len(want["slots"]))],
                   "queue_op": ctx.get(dut.r_pre.queue_op), "spans": ctx.get(dut.r_pre.spans),
                   "operands_bad": ctx.get(dut.r_pre.operands_bad)}
            assert got == want, f"seed {seed}, word {i} {word:#018x}: {got} != {want}"

    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


def test_writes_never_reach_the_bank_being_fetched():
    """A write aimed at ``r_bank`` is dropped (the CSR block refuses those before they
    get here): no cycle reads and writes one address, which the board builds declare
    to Yosys (hdl.imem.YOSYS_SCRIPT). Writes to the other bank land, with the fetch
    reading the same index in the same cycle."""
    cfg = CONFIGS["small"]
    dut = InstructionMemory(cfg)
    first, second = 0x1111_2222_3333_4444, 0x5555_6666_7777_8888

    async def bench(ctx):
        for bank, word in ((0, first), (1, second)):
            ctx.set(dut.r_en, 1)
            ctx.set(dut.r_index, 5)
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_index, 5)
            ctx.set(dut.w_data, word)
            ctx.set(dut.w_bank, bank)
            ctx.set(dut.r_bank, 1)  # bank 0's write lands, bank 1's is dropped
            await ctx.tick()
        ctx.set(dut.w_en, 0)
        got = []
        for bank in (0, 1):
            ctx.set(dut.r_bank, bank)
            await ctx.tick()
            got.append(ctx.get(dut.r_data))
        assert got == [first, 0], [hex(g) for g in got]

    sim = Simulator(dut)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()
