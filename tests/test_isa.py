"""Property tests of the ISA tables, encoder/decoder, assembler and NPUConfig."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firmware import asm, isa
from firmware.config import CONFIGS, NPUConfig
from firmware.isa import ErrorCode, Kind, Token

SETTINGS = settings(max_examples=100, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
SPEC_IDS = [s.mnemonic for s in isa.SPECS]
HEADER_MASK = ((1 << 64) - 1) ^ ((1 << isa.TOKENS_LO) - 1)


# ---- strategies --------------------------------------------------------------------
def operand(f: isa.Field, max_target: int | None = None):
    """Legal assembly values of one field."""
    if f.kind is Kind.ENUM:
        return st.sampled_from(list(f.enum))
    if f.kind is Kind.TARGET and max_target is not None:
        # mostly inside the program (labels), sometimes anywhere (numeric targets)
        return st.integers(0, max_target) | st.integers(*f.value_range())
    lo, hi = f.value_range()
    s = st.integers(lo, hi)
    if f.kind is Kind.SINT and f.bits == 32:  # 32-bit immediates also take 2**31..2**32-1
        s = s | st.integers(1 << 31, (1 << 32) - 1)
    return s


def legal_tokens(spec: isa.InstrSpec):
    legal = int(isa.LEGAL_TOKENS[spec.queue])
    return st.sampled_from([t for t in range(16) if not t & ~legal])


@st.composite
def instrs(draw, spec=None, max_target=None):
    spec = spec or draw(st.sampled_from(isa.SPECS))
    ops = {f.name: draw(operand(f, max_target)) for f in spec.fields}
    return isa.make(spec.mnemonic, draw(legal_tokens(spec)), **ops)


def is_illegal(word: int) -> bool:
    try:
        isa.decode(word)
    except isa.DecodeError:
        return True
    return False


illegal_words = st.one_of(
    st.just(0),
    st.sampled_from(isa.RESERVED_OPCODES).map(
        lambda op: (op << isa.OPCODE_LO) | (isa.ISA_VERSION << isa.VERSION_LO)),
    st.integers(0, (1 << 64) - 1).filter(is_illegal),
)


@st.composite
def programs(draw):
    """A word list mixing every instruction (targets mostly inside) and illegal words."""
    n = draw(st.integers(1, 24))
    words = []
    for _ in range(n):
        if draw(st.integers(0, 7)) == 0:
            words.append(draw(illegal_words))
        else:
            words.append(draw(instrs(max_target=n)).encode())
    return words


# ---- encode / decode ----------------------------------------------------------------
@pytest.mark.parametrize("spec", isa.SPECS, ids=SPEC_IDS)
@SETTINGS
@given(data=st.data())
def test_encode_decode_roundtrip(spec, data):
    ins = data.draw(instrs(spec))
    word = ins.encode()
    assert 0 <= word < 1 << 64
    assert word >> isa.OPCODE_LO == spec.opcode
    assert (word >> isa.VERSION_LO) & 3 == isa.ISA_VERSION
    assert (word >> isa.TOKENS_LO) & 15 == int(ins.tokens)
    assert word & ((1 << isa.TOKENS_LO) - 1) & ~spec.operand_bits == 0
    back = isa.decode(word)
    assert back == ins
    assert back.spec is spec and back.tokens == ins.tokens
    for f in spec.fields:
        assert int(back.ops[f.name]) == int(ins.ops[f.name])
        lo, hi = f.value_range()
        assert lo <= int(back.ops[f.name]) <= hi
    assert back.encode() == word
    assert isa.encode(spec.mnemonic, ins.tokens, **ins.ops) == word


@SETTINGS
@given(word=st.integers(0, (1 << 64) - 1))
def test_decode_encode_is_identity_on_legal_words(word):
    # Random words are mostly illegal: force a legal header half of the time.
    spec = isa.SPECS[word % len(isa.SPECS)]
    legal = int(isa.LEGAL_TOKENS[spec.queue])
    w = (spec.opcode << isa.OPCODE_LO) | (isa.ISA_VERSION << isa.VERSION_LO)
    w |= (((word >> 52) & legal) << isa.TOKENS_LO) | (word & spec.operand_bits)
    for candidate in (word, w):
        try:
            ins = isa.decode(candidate)
        except isa.DecodeError as e:
            assert e.code == ErrorCode.ILLEGAL_INSTRUCTION
            continue
        assert ins.encode() == candidate


def test_make_rejects_bad_operands():
    with pytest.raises(ValueError, match="count"):
        isa.make("loop", count=1 << 16, end=2)
    with pytest.raises(ValueError, match="rows"):
        isa.make("load", p=0, sp=0, dram=0, stride=0, rows=0, bytes=1)
    with pytest.raises(ValueError, match="missing operand 'rd'"):
        isa.make("li", imm=0)
    with pytest.raises(ValueError, match="unknown operand"):
        isa.make("nop", x=1)
    with pytest.raises(ValueError, match="token"):
        isa.make("load", Token.POP_PREV, p=0, sp=0, dram=0, stride=0, rows=1, bytes=1)
    with pytest.raises(ValueError, match="token"):
        isa.make("nop", Token.PUSH_NEXT)
    assert isa.make("li", rd=1, imm=0xFFFFFFFF).ops["imm"] == -1


# ---- decode rejects ------------------------------------------------------------------
def _legal_word(spec: isa.InstrSpec) -> int:
    ops = {f.name: (list(f.enum)[0] if f.kind is Kind.ENUM else f.value_range()[0])
           for f in spec.fields}
    return isa.make(spec.mnemonic, **ops).encode()


def _assert_illegal(word: int):
    with pytest.raises(isa.DecodeError) as ei:
        isa.decode(word)
    assert ei.value.code == ErrorCode.ILLEGAL_INSTRUCTION, hex(word)
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("opcode", isa.RESERVED_OPCODES)
def test_decode_rejects_reserved_opcode(opcode):
    base = (opcode << isa.OPCODE_LO) | (isa.ISA_VERSION << isa.VERSION_LO)
    for payload in (0, 1, (1 << isa.TOKENS_LO) - 1, 0xA5A5A5A5A5A5A):
        _assert_illegal(base | payload)


@pytest.mark.parametrize("spec", isa.SPECS, ids=SPEC_IDS)
def test_decode_rejects_wrong_version(spec):
    word = _legal_word(spec)
    isa.decode(word)
    for ver in range(4):
        if ver != isa.ISA_VERSION:
            _assert_illegal((word & ~(3 << isa.VERSION_LO)) | (ver << isa.VERSION_LO))


def test_decode_rejects_all_zero_and_all_ones_word():
    _assert_illegal(0)
    _assert_illegal((1 << 64) - 1)
    # even the NOP opcode (0) with a zero version is illegal
    assert isa.BY_MNEMONIC["nop"].opcode == 0
    _assert_illegal(0x0000_FFFF_0000_0000 & ((1 << isa.TOKENS_LO) - 1))


def test_decode_rejects_out_of_range_words():
    for w in (-1, 1 << 64):
        with pytest.raises(isa.DecodeError):
            isa.decode(w)


@pytest.mark.parametrize("spec", isa.SPECS, ids=SPEC_IDS)
def test_decode_rejects_reserved_operand_bits(spec):
    word = _legal_word(spec)
    reserved = [b for b in range(isa.TOKENS_LO) if not spec.operand_bits >> b & 1]
    for b in reserved:
        _assert_illegal(word | (1 << b))
    if reserved:
        _assert_illegal(word | sum(1 << b for b in reserved))


@pytest.mark.parametrize("spec", isa.SPECS, ids=SPEC_IDS)
def test_decode_rejects_illegal_token_flags(spec):
    word = _legal_word(spec)
    legal = int(isa.LEGAL_TOKENS[spec.queue])
    for t in range(16):
        w = word | (t << isa.TOKENS_LO)
        if t & ~legal:
            _assert_illegal(w)
        else:
            assert isa.decode(w).tokens == Token(t)


@pytest.mark.parametrize("spec", [s for s in isa.SPECS
                                  if any(f.kind is Kind.ENUM for f in s.fields)],
                         ids=lambda s: s.mnemonic)
def test_decode_rejects_reserved_enum_encodings(spec):
    word = _legal_word(spec)
    for f in spec.fields:
        if f.kind is not Kind.ENUM:
            continue
        valid = {int(e) for e in f.enum}
        for raw in range(1 << f.bits):
            w = (word & ~(f.mask << f.lo)) | (raw << f.lo)
            if raw in valid:
                assert isa.decode(w).ops[f.name] == raw
            else:
                _assert_illegal(w)


# ---- assembler / disassembler -----------------------------------------------------------
def _asm_roundtrip(words):
    text = asm.disassemble(words)
    prog = asm.assemble(text)
    assert prog.words == words, text
    text2 = asm.disassemble(prog)
    prog2 = asm.assemble(text2)
    assert prog2.words == words, text2
    return text


@pytest.mark.parametrize("spec", isa.SPECS, ids=SPEC_IDS)
@settings(max_examples=40, deadline=None, database=None)
@given(data=st.data())
def test_asm_roundtrip_every_instruction(spec, data):
    ins = data.draw(instrs(spec, max_target=1))
    _asm_roundtrip([ins.encode()])


SUFFIXED = [(s, e) for s in isa.SPECS if s.suffix_field for e in s.suffix_field.enum]


@pytest.mark.parametrize("spec, member", SUFFIXED,
                         ids=[f"{s.mnemonic}.{e.name.lower()}" for s, e in SUFFIXED])
def test_asm_roundtrip_every_suffix(spec, member):
    """Every mnemonic suffix, with small and large operands, disassembles and reassembles."""
    for pick in (0, 1):
        ops = {f.name: f.value_range()[pick] for f in spec.fields}
        ops[spec.suffix_field.name] = member
        if "target" in ops or "end" in ops:
            ops.update({k: 0 for k in ("target", "end") if k in ops})
        _asm_roundtrip([isa.make(spec.mnemonic, **ops).encode()])


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(words=programs())
def test_asm_roundtrip_programs(words):
    text = _asm_roundtrip(words)
    n = len(words)
    for w in words:
        try:
            ins = isa.decode(w)
        except isa.DecodeError:
            assert f".word {w:#018x}" in text
            continue
        for f in ins.spec.fields:
            if f.kind is Kind.TARGET and ins.ops[f.name] <= n:
                assert f"L{ins.ops[f.name]}:" in text  # targets inside get labels


@settings(max_examples=200, deadline=None, database=None)
@given(words=st.lists(illegal_words, min_size=1, max_size=8))
def test_asm_roundtrip_illegal_words(words):
    text = _asm_roundtrip(words)
    assert text.count(".word") == len(words)


def test_asm_example_source():
    src = """
    ; comments start with ';' or '#'
    .equ   ROWS, 16            ; named constant
    .reg   act, r3             # named register
    start:
        li      act, 0x100
        load    p0, act, r1, r0, ROWS, 64, tag=2, push=next
        gemm.accumulate p1, r2, r4, ROWS*4+1, swap=1, pop=prev|next
        cfg.pool_stride 5
        br.lt   r5, r6, start
        .word   0x0400000000000000
    done: end
    """
    prog = asm.assemble(src)
    assert prog.symbols == {"start": 0, "done": 6}
    ins = [isa.decode(w) for w in prog.words[:5]]
    assert ins[0] == isa.make("li", rd=3, imm=0x100)
    assert ins[1] == isa.make("load", Token.PUSH_NEXT, p=0, sp=3, dram=1, stride=0,
                              rows=16, bytes=64, tag=2)
    assert ins[2] == isa.make("gemm", Token.POP_PREV | Token.POP_NEXT, p=1, sp=2, acc=4,
                              m=65, mode=isa.GemmMode.ACCUMULATE, swap=1)
    assert ins[3] == isa.make("cfg", field=isa.CfgField.POOL_STRIDE, value=5)
    assert ins[4] == isa.make("br", cond=isa.Cond.LT, rs1=5, rs2=6, target=0)
    assert prog.words[5] == 0x0400000000000000
    assert asm.assemble(asm.disassemble(prog)).words == prog.words
    assert asm.Program.from_bytes(prog.to_bytes()).words == prog.words


@pytest.mark.parametrize("src, line, msg", [
    ("nop\nnop\nfrobnicate r1, r2\n", 3, "unknown instruction"),
    ("nop\nbr r0, r0, 0\n", 2, "suffix"),
    ("nop\ncmp r1, r2, r3\n", 2, "suffix"),
    ("br.sometimes r0, r0, 0", 1, "not one of"),
    ("nop\nnop\nli r16, 0\n", 3, "not a register"),
    ("add r1, x2, r3", 1, "not a register"),
    ("load q0, r0, r0, r0, 1, 1", 1, "not a partition"),
    ("nop\nloop 65536, 3\nnop\nnop\n", 2, "outside"),
    ("li r1, 0x100000000", 1, "outside"),
    ("load p0, r0, r0, r0, 257, 1", 1, "outside"),
    ("wload p0, r0, 0, 1", 1, "outside"),
    ("nop\nbr.always r0, r0, nowhere\n", 2, "undefined symbol"),
    ("a:\nnop\nnop\na:\nnop\n", 4, "defined twice"),
    ("nop\nnop r1\n", 2, "too many operands"),
    ("add r1, r2, r3, r4", 1, "too many operands"),
    ("sync\nend 1", 2, "too many operands"),
])
def test_asm_errors_name_the_line(src, line, msg):
    with pytest.raises(asm.AsmError) as ei:
        asm.assemble(src)
    assert ei.value.line == line
    assert f"line {line}" in str(ei.value)
    assert msg in str(ei.value)


# ---- decoder constants and config ------------------------------------------------------
def test_decoder_constants_match_specs():
    c = isa.decoder_constants()
    assert c["version"] == isa.ISA_VERSION and c["word_bits"] == 64
    header = [c["opcode"], c["ver"], c["tokens"]]
    assert header == [(58, 6), (56, 2), (52, 4)]
    covered = 0
    for lo, bits in header:
        m = ((1 << bits) - 1) << lo
        assert covered & m == 0
        covered |= m
    assert covered == HEADER_MASK
    names = {s.mnemonic for s in isa.SPECS}
    for key in ("opcodes", "queues", "legal_tokens", "operand_masks", "fields"):
        assert set(c[key]) == names, key
    assert sorted(c["opcodes"].values()) == sorted(s.opcode for s in isa.SPECS)
    assert set(c["opcodes"].values()).isdisjoint(isa.RESERVED_OPCODES)
    assert len(c["opcodes"]) + len(isa.RESERVED_OPCODES) == 64
    for s in isa.SPECS:
        assert c["opcodes"][s.mnemonic] == s.opcode
        assert c["queues"][s.mnemonic] == s.queue.value
        assert c["legal_tokens"][s.mnemonic] == int(isa.LEGAL_TOKENS[s.queue])
        mask = 0
        for f in s.fields:
            fm = ((1 << f.bits) - 1) << f.lo
            assert mask & fm == 0, (s.mnemonic, f.name)
            assert f.lo + f.bits <= isa.TOKENS_LO
            mask |= fm
            assert c["fields"][s.mnemonic][f.name] == (f.lo, f.bits, f.kind.value)
        assert c["operand_masks"][s.mnemonic] == mask == s.operand_bits
        assert len(c["fields"][s.mnemonic]) == len(s.fields)
    assert c["legal_tokens"]["nop"] == 0
    assert c["legal_tokens"]["load"] == int(Token.POP_NEXT | Token.PUSH_NEXT)
    assert c["legal_tokens"]["store"] == int(Token.POP_PREV | Token.PUSH_PREV)
    assert c["legal_tokens"]["gemm"] == 15
    assert set(c["cfg"]) == {f.name.lower() for f in isa.CfgField}
    for f in isa.CfgField:
        idx, reset, lo, hi = c["cfg"][f.name.lower()]
        assert idx == int(f) and lo <= reset <= hi
        assert (reset, lo, hi) == isa.CFG_RANGE[f] and isa.CFG_RESET[f] == reset
        # every cfg value fits the 32-bit signed value field of CFG
        vlo, vhi = isa.BY_MNEMONIC["cfg"].field("value").value_range()
        assert vlo <= lo and hi <= vhi
    assert c["errors"] == {e.name.lower(): int(e) for e in ErrorCode}
    assert sorted(c["errors"].values()) == list(range(len(ErrorCode)))
    assert set(isa.ERROR_DOC) == set(ErrorCode)


def test_token_channels():
    Q = isa.Queue
    assert isa.token_channel(Q.LOAD, Token.PUSH_NEXT) == "load>compute"
    assert isa.token_channel(Q.COMPUTE, Token.POP_PREV) == "load>compute"
    assert isa.token_channel(Q.COMPUTE, Token.PUSH_PREV) == "compute>load"
    assert isa.token_channel(Q.LOAD, Token.POP_NEXT) == "compute>load"
    assert isa.token_channel(Q.COMPUTE, Token.PUSH_NEXT) == "compute>store"
    assert isa.token_channel(Q.STORE, Token.POP_PREV) == "compute>store"
    assert isa.token_channel(Q.STORE, Token.PUSH_PREV) == "store>compute"
    assert isa.token_channel(Q.COMPUTE, Token.POP_NEXT) == "store>compute"


@pytest.mark.parametrize("name, value", [
    ("rows", 0), ("rows", -1), ("rows", 257), ("rows", 16), ("cols", 0), ("cols", 257),
    ("cols", 9), ("sp_banks", 3), ("sp_banks", 1),
    ("rows", 2.0), ("sp_bytes", "65536"),
    ("bus_bytes", 3), ("bus_bytes", 128),
    ("sp_bytes", 1001), ("sp_bytes", (1 << 24) + 8),
    ("sp_banks", 0), ("acc_rows", 0),
    ("partitions", 9), ("partitions", 0),
    ("pt_sets", 5), ("tag_slots", 64), ("imem_depth", (1 << 16) + 1),
    ("loop_depth", 0), ("region_depth", -3), ("trace_depth", 0), ("queue_depth", 0),
])
def test_npuconfig_rejects_bad_values(name, value):
    with pytest.raises(ValueError) as ei:
        NPUConfig(**{name: value})
    assert f"NPUConfig.{name}=" in str(ei.value)


def test_npuconfig_accepts_limits_and_named_configs():
    NPUConfig(rows=64, cols=64, partitions=8, pt_sets=4, tag_slots=63,
              imem_depth=1 << 16, sp_bytes=1 << 24, bus_bytes=64)
    for name, c in CONFIGS.items():
        assert isinstance(c, NPUConfig), name
        assert dataclasses.replace(c) == c
        assert c.peak_macs_per_cycle == c.rows * c.cols
        assert c.as_dict()["rows"] == c.rows
    assert CONFIGS["small"].rows == 4 and CONFIGS["small"].cols == 4
