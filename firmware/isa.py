"""The NPU instruction set: the single source of truth.

Everything that knows about instructions derives from the tables in this module:
the encoder and decoder below, the assembler and disassembler (:mod:`firmware.asm`),
the golden model (:mod:`firmware.golden`), the Amaranth decoder in ``hdl/`` (through
:func:`decoder_constants`), and ``docs/isa.md`` (through :mod:`firmware.docgen`).

Encoding
--------
Every instruction is one 64-bit word::

    63      58 57  56 55      52 51                                   0
    | opcode  | ver  | tokens   |          operands (per opcode)       |

* ``opcode`` (6 bits): 64 opcodes, most of them reserved for growth.
* ``ver`` (2 bits): the ISA version the word was encoded for (:data:`ISA_VERSION`).
  A word with another version is illegal, so an all-zero word (erased memory) never
  executes as a NOP.
* ``tokens`` (4 bits): dependency-token flags of queue instructions (see
  :class:`Token`); must be zero on sequencer instructions.
* operand bits an opcode does not define are reserved and must be zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

ISA_VERSION = 1
WORD_BITS = 64
OPCODE_LO, OPCODE_BITS = 58, 6
VERSION_LO, VERSION_BITS = 56, 2
TOKENS_LO, TOKENS_BITS = 52, 4
NUM_REGS = 16
NUM_ARG_REGS = 7  # r1..r7 start with the host's argument registers ARG0..ARG6


class Queue(enum.Enum):
    """Where the sequencer sends an instruction.

    ``SEQ`` instructions execute in the sequencer itself (scalar, control, marks).
    ``LOAD``, ``COMPUTE`` and ``STORE`` are the three decoupled queues; they run
    concurrently and order themselves only through dependency tokens.
    """

    SEQ = "seq"
    LOAD = "load"
    COMPUTE = "compute"
    STORE = "store"


class Token(enum.IntFlag):
    """Dependency-token flags (bits 55:52), relative to the instruction's queue.

    The queues form a pipeline ``load -> compute -> store``. ``prev`` is the queue
    before this one, ``next`` the queue after it. A *push* sends one token to that
    neighbour once this instruction has completed; a *pop* waits until a token from
    that neighbour is available before this instruction starts. Load has no
    ``prev`` and store no ``next``.
    """

    POP_PREV = 1
    POP_NEXT = 2
    PUSH_PREV = 4
    PUSH_NEXT = 8


# Which token flags each queue may use.
LEGAL_TOKENS = {
    Queue.SEQ: Token(0),
    Queue.LOAD: Token.POP_NEXT | Token.PUSH_NEXT,
    Queue.COMPUTE: Token.POP_PREV | Token.POP_NEXT | Token.PUSH_PREV | Token.PUSH_NEXT,
    Queue.STORE: Token.POP_PREV | Token.PUSH_PREV,
}

# The four token channels, named by (producer, consumer).
TOKEN_CHANNELS = ("load>compute", "compute>load", "compute>store", "store>compute")


def token_channel(queue: Queue, flag: Token) -> str:
    """Name the channel a token flag of an instruction in ``queue`` uses."""
    order = [Queue.LOAD, Queue.COMPUTE, Queue.STORE]
    i = order.index(queue)
    if flag in (Token.POP_PREV, Token.PUSH_PREV):
        other = order[i - 1]
    else:
        other = order[i + 1]
    if flag in (Token.PUSH_PREV, Token.PUSH_NEXT):
        producer, consumer = queue, other
    else:
        producer, consumer = other, queue
    return f"{producer.value}>{consumer.value}"


class Cond(enum.IntEnum):
    """Comparison of ``CMP`` and branch conditions of ``BR`` (signed unless ``U``)."""

    ALWAYS = 0
    EQ = 1
    NE = 2
    LT = 3
    GE = 4
    LTU = 5
    GEU = 6


class RegionOp(enum.IntEnum):
    BEGIN = 0
    END = 1


class GemmMode(enum.IntEnum):
    """How ``GEMM`` writes the accumulator rows it produces."""

    OVERWRITE = 0
    ACCUMULATE = 1


class CfgField(enum.IntEnum):
    """Compute-unit configuration registers written by ``CFG``.

    They are reset to :data:`CFG_RESET` at the start of every run and hold the
    parameters that would not fit into a 64-bit vector/GEMM instruction.
    """

    QMUL = 0  # requantization multiplier (int32)
    QSHIFT = 1  # requantization right shift, 0..63
    QZP = 2  # output zero point (int8)
    CLIP_LO = 3  # output clamp low (int8); ReLU is CLIP_LO = QZP
    CLIP_HI = 4  # output clamp high (int8)
    ADD_MUL_A = 5  # VADD multiplier of input a (int32)
    ADD_MUL_B = 6  # VADD multiplier of input b (int32)
    ADD_ZP_A = 7  # VADD zero point of input a (int8)
    ADD_ZP_B = 8  # VADD zero point of input b (int8)
    IN_STRIDE = 9  # vector source row stride in bytes (0: dense)
    OUT_STRIDE = 10  # vector destination row stride in bytes (0: dense)
    GEMM_STRIDE = 11  # GEMM activation row stride in bytes (0: dense, = k)
    POOL_COUNT = 12  # VMAX window length, 1..255
    POOL_STRIDE = 13  # VMAX byte distance between window elements
    POOL_ISTRIDE = 14  # VMAX byte distance between consecutive output rows' windows


# (reset value, minimum, maximum) of each configuration register.
CFG_RANGE = {
    CfgField.QMUL: (1 << 30, -(1 << 31), (1 << 31) - 1),
    CfgField.QSHIFT: (30, 0, 63),
    CfgField.QZP: (0, -128, 127),
    CfgField.CLIP_LO: (-128, -128, 127),
    CfgField.CLIP_HI: (127, -128, 127),
    CfgField.ADD_MUL_A: (1 << 30, -(1 << 31), (1 << 31) - 1),
    CfgField.ADD_MUL_B: (1 << 30, -(1 << 31), (1 << 31) - 1),
    CfgField.ADD_ZP_A: (0, -128, 127),
    CfgField.ADD_ZP_B: (0, -128, 127),
    CfgField.IN_STRIDE: (0, 0, (1 << 20) - 1),
    CfgField.OUT_STRIDE: (0, 0, (1 << 20) - 1),
    CfgField.GEMM_STRIDE: (0, 0, (1 << 20) - 1),
    CfgField.POOL_COUNT: (1, 1, 255),
    CfgField.POOL_STRIDE: (0, 0, (1 << 20) - 1),
    CfgField.POOL_ISTRIDE: (0, 0, (1 << 20) - 1),
}
CFG_RESET = {f: r[0] for f, r in CFG_RANGE.items()}

# The per-column requantization table (``vqtab``, ``vreq ... tab=1``): one entry per
# array column, reset with the configuration registers to cfg.qmul's and cfg.qshift's
# reset values. An entry in the scratchpad is QTAB_ENTRY_BYTES bytes: the int32le
# multiplier, then the shift byte, of which bits QTAB_SHIFT_BITS-1..0 count (shifts
# 0..63, so no stored value is out of range: the table is data, checked by nobody at
# dispatch); the other bits and bytes are ignored.
QTAB_ENTRY_BYTES = 8
QTAB_SHIFT_BITS = 6

# The depthwise engine's taps (``dwload``): a 3x3 kernel frame per channel lane.
DW_KERNEL = 3
DW_TAPS = DW_KERNEL * DW_KERNEL
# ``dwload`` reads DW_LOAD_WINDOWS windows of ``cols`` bytes: the taps, one whose byte 0
# is the pad value, then the lanes' int32le biases (4 bytes a lane).
DW_PAD_WINDOW = DW_TAPS
DW_BIAS_WINDOW = DW_TAPS + 1
DW_LOAD_WINDOWS = DW_BIAS_WINDOW + 4


class ErrorCode(enum.IntEnum):
    """Why a program stopped. The RTL reports the same codes in its status register."""

    NONE = 0
    ILLEGAL_INSTRUCTION = 1  # reserved opcode, wrong version, reserved bits set, bad token flags
    BAD_OPERAND = 2  # operand out of range for this configuration (k > rows, tag slot, cfg value)
    PARTITION_BOUNDS = 3  # scratchpad access outside its partition (or a disabled partition)
    ACC_BOUNDS = 4  # accumulator rows outside the accumulator buffer
    BUS_ERROR = 5  # DRAM access answered with SLVERR/DECERR (golden model: outside DRAM)
    PC_BOUNDS = 6  # fetch or branch target outside the instruction bank
    LOOP = 7  # loop stack overflow, bad nesting, empty body, leaving several loops at once
    TOKEN_DEADLOCK = 8  # a pop can never be satisfied: no token was pushed on that channel
    REGION = 9  # region end without a matching begin, or region nesting too deep
    TIMEOUT = 10  # the host's cycle budget ran out (a program that never ends)


ERROR_DOC = {
    ErrorCode.NONE: "no error",
    ErrorCode.ILLEGAL_INSTRUCTION: "reserved opcode, wrong ISA version, reserved bits or "
    "token flags not legal for the instruction's queue",
    ErrorCode.BAD_OPERAND: "operand out of range for this hardware configuration "
    "(array size, tag slot, partition index, CFG value)",
    ErrorCode.PARTITION_BOUNDS: "scratchpad access outside its partition, or to a "
    "disabled (size 0) partition",
    ErrorCode.ACC_BOUNDS: "accumulator rows outside the accumulator buffer",
    ErrorCode.BUS_ERROR: "DRAM transfer answered with SLVERR/DECERR "
    "(the golden model: an address outside DRAM)",
    ErrorCode.PC_BOUNDS: "fetch or branch target outside the instruction bank",
    ErrorCode.LOOP: "loop stack overflow, inner loop not ending before its outer loop, "
    "empty body, or a branch leaving more than one loop",
    ErrorCode.TOKEN_DEADLOCK: "a token pop that can never be satisfied",
    ErrorCode.REGION: "region end that does not match the open region, or nesting "
    "deeper than the region stack",
    ErrorCode.TIMEOUT: "the cycle budget set by the host ran out",
}


class Kind(enum.Enum):
    """Operand kinds: how a field is written in assembly and checked."""

    UINT = "uint"  # unsigned immediate
    SINT = "sint"  # two's complement immediate
    REG = "reg"  # scalar register r0..r15
    PART = "part"  # scratchpad partition p0..p7
    TARGET = "target"  # absolute instruction index (labels in assembly)
    ENUM = "enum"  # member of an IntEnum (mnemonic suffix or name)
    COUNT = "count"  # 1..2**bits, stored minus one


@dataclass(frozen=True)
class Field:
    """One operand field of an instruction word."""

    name: str
    lo: int
    bits: int
    kind: Kind
    doc: str
    enum: type[enum.IntEnum] | None = None
    suffix: bool = False  # written as the mnemonic suffix (``br.eq``)
    default: int | None = None  # optional in assembly when set

    @property
    def mask(self) -> int:
        return (1 << self.bits) - 1

    def value_range(self) -> tuple[int, int]:
        """Smallest and largest value the field can hold (in assembly terms)."""
        if self.kind is Kind.SINT:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        if self.kind is Kind.COUNT:
            return 1, 1 << self.bits
        return 0, self.mask

    def normalize(self, value: int) -> int:
        """Canonical form of an operand value; 32-bit immediates wrap to signed."""
        if self.kind is Kind.ENUM:
            return self.enum(value)
        value = int(value)
        if self.kind is Kind.SINT and self.bits == 32 and (1 << 31) <= value < (1 << 32):
            value -= 1 << 32
        return value

    def pack(self, value: int) -> int:
        lo, hi = self.value_range()
        value = int(self.normalize(value))
        if not lo <= value <= hi:
            raise ValueError(f"field {self.name!r}: {value} outside [{lo}, {hi}]")
        if self.kind is Kind.COUNT:
            value -= 1
        return (value & self.mask) << self.lo

    def unpack(self, word: int) -> int:
        raw = (word >> self.lo) & self.mask
        if self.kind is Kind.SINT and raw >> (self.bits - 1):
            raw -= 1 << self.bits
        if self.kind is Kind.COUNT:
            raw += 1
        if self.kind is Kind.ENUM:
            return self.enum(raw)  # ValueError on a reserved encoding
        return raw


@dataclass(frozen=True)
class InstrSpec:
    """The definition of one instruction: opcode, queue, fields and meaning."""

    mnemonic: str
    opcode: int
    queue: Queue
    fields: tuple[Field, ...]
    doc: str
    semantics: str
    cls: str  # instruction class, for docs and coverage
    operand_bits: int = field(init=False)

    def __post_init__(self):
        used = 0
        for f in self.fields:
            fmask = f.mask << f.lo
            if f.lo + f.bits > TOKENS_LO:
                raise AssertionError(f"{self.mnemonic}.{f.name} overlaps the header")
            if used & fmask:
                raise AssertionError(f"{self.mnemonic}.{f.name} overlaps another field")
            used |= fmask
        object.__setattr__(self, "operand_bits", used)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.mnemonic} has no field {name!r}")

    @property
    def suffix_field(self) -> Field | None:
        return next((f for f in self.fields if f.suffix), None)


def _f(name, lo, bits, kind, doc, **kw):
    return Field(name, lo, bits, kind, doc, **kw)


# Reusable field shapes. Bit positions are chosen per instruction below; the
# helpers only keep names, kinds and docs identical wherever a field recurs.
def _reg(name, lo, doc):
    return _f(name, lo, 4, Kind.REG, doc)


def _part(name, lo, doc="scratchpad partition"):
    return _f(name, lo, 3, Kind.PART, doc)


SPECS: tuple[InstrSpec, ...] = (
    # ---- sequencer: scalar and control --------------------------------------
    InstrSpec("nop", 0x00, Queue.SEQ, (), "Do nothing.", "", "control"),
    InstrSpec(
        "end", 0x01, Queue.SEQ, (),
        "End of program.",
        "Waits until the load, compute and store queues are idle, then stops the run "
        "(status done, interrupt). The next swap, if one is pending, lands here.",
        "control",
    ),
    InstrSpec(
        "li", 0x02, Queue.SEQ,
        (_reg("rd", 32, "destination"), _f("imm", 0, 32, Kind.SINT, "value (also 0..2**32-1)")),
        "Load a 32-bit immediate.", "rd = imm", "scalar",
    ),
    InstrSpec(
        "addi", 0x03, Queue.SEQ,
        (_reg("rd", 36, "destination"), _reg("rs", 32, "source"),
         _f("imm", 0, 32, Kind.SINT, "addend")),
        "Add an immediate.", "rd = rs + imm (mod 2**32)", "scalar",
    ),
    InstrSpec(
        "add", 0x04, Queue.SEQ,
        (_reg("rd", 8, "destination"), _reg("rs1", 4, "source 1"), _reg("rs2", 0, "source 2")),
        "Add registers.", "rd = rs1 + rs2 (mod 2**32)", "scalar",
    ),
    InstrSpec(
        "sub", 0x05, Queue.SEQ,
        (_reg("rd", 8, "destination"), _reg("rs1", 4, "source 1"), _reg("rs2", 0, "source 2")),
        "Subtract registers.", "rd = rs1 - rs2 (mod 2**32)", "scalar",
    ),
    InstrSpec(
        "mul", 0x06, Queue.SEQ,
        (_reg("rd", 8, "destination"), _reg("rs1", 4, "source 1"), _reg("rs2", 0, "source 2")),
        "Multiply registers (low 32 bits).", "rd = rs1 * rs2 (mod 2**32)", "scalar",
    ),
    InstrSpec(
        "cmp", 0x07, Queue.SEQ,
        (_f("cond", 12, 3, Kind.ENUM, "comparison", enum=Cond, suffix=True),
         _reg("rd", 8, "destination"), _reg("rs1", 4, "left"), _reg("rs2", 0, "right")),
        "Compare registers (cmp.eq, cmp.lt, ...).",
        "rd = 1 if cond(rs1, rs2) else 0 (cmp.always sets 1)", "scalar",
    ),
    InstrSpec(
        "br", 0x08, Queue.SEQ,
        (_f("cond", 24, 3, Kind.ENUM, "condition", enum=Cond, suffix=True),
         _reg("rs1", 20, "left"), _reg("rs2", 16, "right"),
         _f("target", 0, 16, Kind.TARGET, "absolute instruction index")),
        "Conditional branch (br.eq, br.lt, ...; br.always jumps).",
        "if cond(rs1, rs2): pc = target. A taken branch reads registers that an "
        "in-flight VARGMAX writes only after it completes. A target outside the "
        "innermost loop body leaves that loop (one level only).",
        "control",
    ),
    InstrSpec(
        "loop", 0x09, Queue.SEQ,
        (_f("count", 16, 16, Kind.UINT, "iterations (0 skips the body)"),
         _f("end", 0, 16, Kind.TARGET, "first instruction after the body")),
        "Hardware loop with an immediate count.",
        "Runs instructions [pc+1, end) count times without branch overhead. Nested "
        "loops must end strictly before the enclosing loop ends.",
        "control",
    ),
    InstrSpec(
        "loopr", 0x0A, Queue.SEQ,
        (_reg("rs", 16, "iteration count (unsigned)"),
         _f("end", 0, 16, Kind.TARGET, "first instruction after the body")),
        "Hardware loop with the count in a register.", "as loop, count = rs", "control",
    ),
    InstrSpec(
        "sync", 0x0B, Queue.SEQ, (),
        "Wait until the load, compute and store queues are idle.", "", "control",
    ),
    InstrSpec(
        "region", 0x0C, Queue.SEQ,
        (_f("op", 16, 1, Kind.ENUM, "begin or end", enum=RegionOp, suffix=True),
         _f("id", 0, 16, Kind.UINT, "region id (the host's subgraph id)")),
        "Region mark (region.begin ID / region.end ID) for per-subgraph counters.",
        "Both marks first wait for the queues to drain, so work is attributed to "
        "exactly the region whose instructions issued it. begin then records the "
        "start cycle and a counter snapshot; end pushes a trace record (id, start, "
        "end, counter deltas). Regions nest up to the region-stack depth.",
        "marks",
    ),
    InstrSpec(
        "ptsel", 0x0D, Queue.SEQ,
        (_f("set", 0, 2, Kind.UINT, "partition-table set of the active bank"),),
        "Select the partition table used by later instructions.",
        "Waits for the queues to drain, then makes table `set` of the running bank "
        "active. Every run starts on set 0.",
        "marks",
    ),
    InstrSpec(
        "tinv", 0x0E, Queue.SEQ,
        (_f("slot", 0, 6, Kind.UINT, "tag slot to invalidate (0: all slots)"),),
        "Invalidate tile tags.",
        "Waits for the load queue to drain, then clears the slot (or all slots).",
        "marks",
    ),
    InstrSpec(
        "misspec", 0x0F, Queue.SEQ, (),
        "Count a lost speculation bet.",
        "Increments the mis-speculation counter (programs execute it on the fallback "
        "path of a speculative merge).",
        "marks",
    ),
    # ---- DMA ------------------------------------------------------------------
    InstrSpec(
        "load", 0x10, Queue.LOAD,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset in the partition"),
         _reg("dram", 41, "DRAM byte address"),
         _reg("stride", 37, "DRAM row stride in bytes (r0: dense, = bytes)"),
         _f("rows", 29, 8, Kind.COUNT, "rows, 1..256"),
         _f("bytes", 17, 12, Kind.COUNT, "bytes per row, 1..4096"),
         _f("tag", 11, 6, Kind.UINT, "tile-tag slot, 1..tag_slots (0: untagged)", default=0),
         _f("off", 0, 11, Kind.UINT, "immediate added to the scratchpad offset", default=0)),
        "DMA a 2-D tile from DRAM into a scratchpad partition (rows stored densely).",
        "for i < rows: sp[p][sp+off + i*bytes : +bytes] = dram[dram + i*stride : +bytes]. "
        "With a tag slot: if the slot holds the same (DRAM address, rows, bytes, "
        "stride, scratchpad address), the transfer is skipped (a hit); otherwise it "
        "runs and the slot is set (a miss).",
        "dma",
    ),
    InstrSpec(
        "store", 0x11, Queue.STORE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset in the partition"),
         _reg("dram", 41, "DRAM byte address"),
         _reg("stride", 37, "DRAM row stride in bytes (r0: dense, = bytes)"),
         _f("rows", 29, 8, Kind.COUNT, "rows, 1..256"),
         _f("bytes", 17, 12, Kind.COUNT, "bytes per row, 1..4096"),
         _f("off", 0, 11, Kind.UINT, "immediate added to the scratchpad offset", default=0)),
        "DMA a 2-D tile from a scratchpad partition (dense rows) to DRAM.",
        "for i < rows: dram[dram + i*stride : +bytes] = sp[p][sp+off + i*bytes : +bytes]",
        "dma",
    ),
    # ---- compute: systolic array ----------------------------------------------
    InstrSpec(
        "cfg", 0x18, Queue.COMPUTE,
        (_f("field", 32, 4, Kind.ENUM, "configuration register", enum=CfgField, suffix=True),
         _f("value", 0, 32, Kind.SINT, "new value")),
        "Write a compute configuration register (cfg.qmul, cfg.qshift, ...).",
        "cfg[field] = value; a value outside the register's range is BAD_OPERAND.",
        "config",
    ),
    InstrSpec(
        "wload", 0x19, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of the weight tile"),
         _f("k", 16, 8, Kind.COUNT, "weight rows (reduction), 1..array rows"),
         _f("n", 8, 8, Kind.COUNT, "weight columns (outputs), 1..array cols"),
         _f("off", 0, 8, Kind.UINT, "immediate added to the offset", default=0)),
        "Preload a k x n int8 weight tile (row-major, dense) into the shadow weight buffer.",
        "W_shadow = 0; W_shadow[:k, :n] = sp[p][sp+off : +k*n]. The active buffer "
        "keeps streaming meanwhile (double buffering).",
        "gemm",
    ),
    InstrSpec(
        "gemm", 0x1A, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of the activations"),
         _reg("acc", 41, "first accumulator row"),
         _f("m", 29, 12, Kind.COUNT, "activation rows, 1..4096"),
         _f("mode", 28, 1, Kind.ENUM, "overwrite or accumulate", enum=GemmMode, suffix=True),
         _f("swap", 27, 1, Kind.UINT, "1: make the shadow weights active first", default=0),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Stream m activation rows through the array (gemm.overwrite / gemm.accumulate).",
        "if swap: exchange shadow and active weights. (k, n) = active tile shape. "
        "for i < m: x = int8 sp[p][sp+off + i*stride : +k] (stride = cfg.gemm_stride "
        "or k); acc[acc+i][:n] (=|+=) x @ W[:k, :n] in int32, wrapping.",
        "gemm",
    ),
    # ---- compute: vector unit ---------------------------------------------------
    InstrSpec(
        "vbias", 0x1B, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of int32 biases"),
         _reg("acc", 41, "first accumulator row"),
         _f("m", 29, 12, Kind.COUNT, "rows"),
         _f("n", 21, 8, Kind.COUNT, "columns, 1..array cols"),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Add an int32 bias vector to accumulator rows.",
        "for i < m, j < n: acc[acc+i][j] += int32le(sp[p][sp+off + 4j : +4]), wrapping.",
        "vector",
    ),
    InstrSpec(
        "vreq", 0x1C, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "destination scratchpad byte offset"),
         _reg("acc", 41, "first accumulator row"),
         _f("m", 29, 12, Kind.COUNT, "rows"),
         _f("n", 21, 8, Kind.COUNT, "columns, 1..array cols"),
         _f("tab", 16, 1, Kind.UINT, "1: column j's multiplier and shift from the "
            "requantization table (vqtab)", default=0),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Requantize accumulator rows to int8 (with clamp: ReLU / clip fused).",
        "y = clamp(cfg.qzp + rshift_rne(acc * mul_j, shift_j), cfg.clip_lo, "
        "cfg.clip_hi) with (mul_j, shift_j) = (cfg.qmul, cfg.qshift), or with tab=1 "
        "the table entry of column j (per-channel requantization); row i goes to "
        "sp+off + i*(cfg.out_stride or n).",
        "vector",
    ),
    InstrSpec(
        "vreqb", 0x22, Queue.COMPUTE,
        (_part("p", 49, "destination partition"),
         _reg("sp", 45, "destination scratchpad byte offset"),
         _reg("acc", 41, "first accumulator row"),
         _f("m", 29, 12, Kind.COUNT, "rows"),
         _f("n", 21, 8, Kind.COUNT, "columns, 1..array cols"),
         _part("pb", 18, "partition of the biases"),
         _reg("b", 14, "scratchpad byte offset of the int32 biases, one per row "
              "(col=1: one per column)"),
         _f("tab", 13, 1, Kind.UINT, "1: column j's multiplier and shift from the "
            "requantization table (vqtab)", default=0),
         _f("col", 12, 1, Kind.UINT, "1: a bias per column (the n words at b, read "
            "before the rows), not per row", default=0)),
        "Requantize accumulator rows to int8 after adding a bias per row (GEMV results) "
        "or per column (GEMM results).",
        "y = clamp(cfg.qzp + rshift_rne((acc + bias) * mul_j, shift_j), cfg.clip_lo, "
        "cfg.clip_hi) with bias = bias_i = int32le(sp[pb][b + 4i : +4]), or with col=1 "
        "bias_j = int32le(sp[pb][b + 4j : +4]), added with int32 "
        "wrapping and (mul_j, shift_j) as vreq; row i goes to sp + i*(cfg.out_stride "
        "or n); the accumulators keep their values. A GEMV that streams transposed "
        "weight rows through a stationary input column leaves output i in row i: "
        "vbias would add one bias to every row. With col=1 it is vbias and vreq in "
        "one pass over the rows.",
        "vector",
    ),
    InstrSpec(
        "vadd", 0x1D, Queue.COMPUTE,
        (_part("pd", 49, "destination partition"), _reg("d", 45, "destination offset"),
         _part("pa", 42, "partition of a"), _reg("a", 38, "offset of a"),
         _part("pb", 35, "partition of b"), _reg("b", 31, "offset of b"),
         _f("m", 19, 12, Kind.COUNT, "rows"),
         _f("n", 7, 12, Kind.COUNT, "bytes per row, 1..4096")),
        "Element-wise add of two int8 tensors with requantization.",
        "y = clamp(cfg.qzp + rshift_rne(cfg.add_mul_a*(a - cfg.add_zp_a) + "
        "cfg.add_mul_b*(b - cfg.add_zp_b), cfg.qshift), cfg.clip_lo, cfg.clip_hi); "
        "source rows advance by cfg.in_stride (or n), destination rows by "
        "cfg.out_stride (or n).",
        "vector",
    ),
    InstrSpec(
        "vclip", 0x1E, Queue.COMPUTE,
        (_part("pd", 49, "destination partition"), _reg("d", 45, "destination offset"),
         _part("ps", 42, "source partition"), _reg("s", 38, "source offset"),
         _f("m", 19, 12, Kind.COUNT, "rows"),
         _f("n", 7, 12, Kind.COUNT, "bytes per row, 1..4096")),
        "Clamp an int8 tensor (standalone ReLU / Clip).",
        "y = clamp(x, cfg.clip_lo, cfg.clip_hi); strides as vadd.",
        "vector",
    ),
    InstrSpec(
        "vmax", 0x1F, Queue.COMPUTE,
        (_part("pd", 49, "destination partition"), _reg("d", 45, "destination offset"),
         _part("ps", 42, "source partition"), _reg("s", 38, "source offset"),
         _f("m", 19, 12, Kind.COUNT, "output rows"),
         _f("n", 7, 12, Kind.COUNT, "bytes per row, 1..4096")),
        "Max over a 1-D window (max-pool is separable: one vmax per axis).",
        "y[i][j] = max over t < cfg.pool_count of x[s + i*cfg.pool_istride + "
        "t*cfg.pool_stride + j]; destination rows advance by cfg.out_stride (or n).",
        "vector",
    ),
    InstrSpec(
        "vargmax", 0x20, Queue.COMPUTE,
        (_reg("rd", 48, "destination scalar register"),
         _part("p", 45), _reg("s", 41, "source offset"),
         _f("n", 29, 12, Kind.COUNT, "elements, 1..4096"),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Index of the first maximum of an int8 vector, into a scalar register.",
        "rd = argmax(int8 sp[p][s+off : +n]) (first index on ties). Later "
        "instructions that read rd wait for it.",
        "vector",
    ),
    InstrSpec(
        "vqtab", 0x21, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of the table entries"),
         _f("n", 21, 8, Kind.COUNT, "entries (columns), 1..array cols"),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Load the per-column requantization table that vreq ... tab=1 uses.",
        "for j < n: e = sp[p][sp+off + 8j : +8]; tab[j] = (int32le(e[0:4]), e[4] & 63). "
        "Entries from n on keep their values; a run starts with every entry at the "
        "reset values of cfg.qmul and cfg.qshift. The table lives in the vector unit, "
        "so vreq reads no table bytes per row.",
        "vector",
    ),
    # ---- compute: depthwise engine ----------------------------------------------
    InstrSpec(
        "dwload", 0x23, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of the taps"),
         _f("off", 0, 16, Kind.UINT, "immediate added to the offset", default=0)),
        "Load the depthwise engine's 3x3 taps of one group of array-cols channels, "
        "its pad value and biases.",
        f"a = sp+off; for t < {DW_TAPS}, j < cols: tap[t][j] = int8 sp[p][a + t*cols + j] "
        f"(tap t = 3i + c: kernel row i, column slot c); pad = int8 sp[p][a + "
        f"{DW_PAD_WINDOW}*cols]; bias[j] = int32le(sp[p][a + {DW_BIAS_WINDOW}*cols + 4j : +4]) "
        f"({DW_LOAD_WINDOWS}*cols bytes). BAD_OPERAND on a build without the depthwise "
        "engine (CAPS dw_rows = 0).",
        "depthwise",
    ),
    InstrSpec(
        "dwconv", 0x24, Queue.COMPUTE,
        (_part("p", 49), _reg("sp", 45, "scratchpad byte offset of the input window"),
         _reg("acc", 41, "first accumulator row"),
         _f("m", 29, 12, Kind.COUNT, "output pixels per output row, 1..4096"),
         _f("h", 25, 4, Kind.COUNT, "output rows, 1..16"),
         _f("mode", 24, 1, Kind.ENUM, "overwrite or accumulate", enum=GemmMode, suffix=True),
         _f("s", 23, 1, Kind.COUNT, "convolution stride (both axes), 1..2"),
         _f("kh", 21, 2, Kind.COUNT, "kernel rows, 1..3"),
         _f("kw", 19, 2, Kind.COUNT, "kernel columns, 1..3"),
         _f("n", 11, 8, Kind.COUNT, "channels (lanes), 1..array cols"),
         _f("pt", 6, 2, Kind.UINT, "pad rows above the input", default=0),
         _f("pb", 4, 2, Kind.UINT, "pad rows below the input", default=0),
         _f("pl", 2, 2, Kind.UINT, "pad columns left of the input", default=0),
         _f("pr", 0, 2, Kind.UINT, "pad columns right of the input", default=0)),
        "Depthwise convolution of h output rows of m pixels on n channels "
        "(dwconv.overwrite / dwconv.accumulate), with padding.",
        "The window is H = (h-1)*s + kh rows of W = (m-1)*s + kw pixels; P = "
        "cfg.gemm_stride or n (bytes between pixels), R = cfg.in_stride or n (bytes "
        "between rows). x[i][c][j] = the dwload pad value when i < pt, i >= H - pb, "
        "c < pl or c >= W - pr, else int8 sp[p][sp + (i-pt)*R + (c-pl)*P + j]. "
        "for r < h, o < m, j < n: acc[acc + r*m + o][j] = bias[j] + (or, accumulate: "
        "+=) sum over i < kh, c < kw of tap[3i + 3-kw+c][j] * x[r*s + i][o*s + c][j], "
        "in int32, wrapping "
        "(a narrower kernel sits in the right-hand columns of the 3x3 taps). "
        "BAD_OPERAND when kh or kw > 3, n > cols, H exceeds CAPS dw_rows, or the "
        "pads leave no input row or column.",
        "depthwise",
    ),
)

BY_MNEMONIC = {s.mnemonic: s for s in SPECS}
BY_OPCODE = {s.opcode: s for s in SPECS}
RESERVED_OPCODES = tuple(op for op in range(1 << OPCODE_BITS) if op not in BY_OPCODE)

assert len(BY_MNEMONIC) == len(SPECS) and len(BY_OPCODE) == len(SPECS)


class DecodeError(ValueError):
    """A word that is not a legal instruction; ``code`` is the error the NPU raises."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.ILLEGAL_INSTRUCTION):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Instr:
    """A decoded instruction: its spec, operand values and token flags."""

    spec: InstrSpec
    ops: dict
    tokens: Token = Token(0)

    @property
    def mnemonic(self) -> str:
        return self.spec.mnemonic

    def __getattr__(self, name):
        ops = self.__dict__.get("ops")
        if ops is not None and name in ops:
            return ops[name]
        raise AttributeError(name)

    def __eq__(self, other):
        return (
            isinstance(other, Instr)
            and self.spec is other.spec
            and {k: int(v) for k, v in self.ops.items()}
            == {k: int(v) for k, v in other.ops.items()}
            and self.tokens == other.tokens
        )

    def __hash__(self):
        return hash((self.spec.opcode, tuple(sorted(self.ops.items())), int(self.tokens)))

    def __repr__(self):
        from .asm import format_instr

        return f"<Instr {format_instr(self)}>"

    def encode(self) -> int:
        """Pack into the 64-bit instruction word."""
        spec = self.spec
        word = (spec.opcode << OPCODE_LO) | (ISA_VERSION << VERSION_LO)
        word |= int(self.tokens) << TOKENS_LO
        for f in spec.fields:
            word |= f.pack(self.ops[f.name])
        return word


def make(mnemonic: str, tokens: Token | int = 0, **ops) -> Instr:
    """Build an :class:`Instr`, filling optional fields with their defaults.

    Raises ``ValueError`` naming the instruction and field when an operand is
    missing, unknown or out of range, or a token flag is illegal for its queue.
    """
    try:
        spec = BY_MNEMONIC[mnemonic]
    except KeyError:
        raise ValueError(f"unknown instruction {mnemonic!r}") from None
    names = {f.name for f in spec.fields}
    unknown = set(ops) - names
    if unknown:
        raise ValueError(f"{mnemonic}: unknown operand(s) {sorted(unknown)}")
    full = {}
    for f in spec.fields:
        if f.name in ops:
            try:
                full[f.name] = f.normalize(ops[f.name])
            except ValueError:
                raise ValueError(f"{mnemonic}: {ops[f.name]!r} is not a {f.name}") from None
        elif f.default is not None:
            full[f.name] = f.default
        else:
            raise ValueError(f"{mnemonic}: missing operand {f.name!r}")
        try:
            f.pack(full[f.name])
        except ValueError as e:
            raise ValueError(f"{mnemonic}: {e}") from None
    tokens = Token(int(tokens))
    if tokens & ~LEGAL_TOKENS[spec.queue]:
        raise ValueError(
            f"{mnemonic}: token flags {tokens!r} not legal in the {spec.queue.value} queue"
        )
    return Instr(spec, full, tokens)


def encode(mnemonic: str, tokens: Token | int = 0, **ops) -> int:
    """Encode one instruction into its 64-bit word."""
    return make(mnemonic, tokens, **ops).encode()


def decode(word: int) -> Instr:
    """Decode a 64-bit word; raises :class:`DecodeError` for anything illegal."""
    if not 0 <= word < (1 << WORD_BITS):
        raise DecodeError(f"word {word:#x} is not 64 bits")
    opcode = (word >> OPCODE_LO) & ((1 << OPCODE_BITS) - 1)
    version = (word >> VERSION_LO) & ((1 << VERSION_BITS) - 1)
    if version != ISA_VERSION:
        raise DecodeError(f"word {word:#018x}: ISA version {version}, expected {ISA_VERSION}")
    spec = BY_OPCODE.get(opcode)
    if spec is None:
        raise DecodeError(f"word {word:#018x}: reserved opcode {opcode:#04x}")
    payload = word & ((1 << TOKENS_LO) - 1)
    if payload & ~spec.operand_bits:
        raise DecodeError(f"word {word:#018x}: reserved bits set in {spec.mnemonic}")
    tokens = Token((word >> TOKENS_LO) & ((1 << TOKENS_BITS) - 1))
    if tokens & ~LEGAL_TOKENS[spec.queue]:
        raise DecodeError(f"word {word:#018x}: token flags not legal for {spec.mnemonic}")
    ops = {}
    for f in spec.fields:
        try:
            ops[f.name] = f.unpack(word)
        except ValueError:
            raise DecodeError(
                f"word {word:#018x}: reserved encoding of {spec.mnemonic}.{f.name}"
            ) from None
    return Instr(spec, ops, tokens)


def decoder_constants() -> dict:
    """Plain-integer tables for the Amaranth decoder (``hdl/`` must not parse docs).

    Returns a dict with header positions, ``opcodes`` (mnemonic -> opcode),
    ``fields`` (mnemonic -> {field: (lo, bits, kind)}), ``queues``, ``legal_tokens``,
    ``operand_masks``, ``cfg`` (name -> (index, reset, min, max)) and ``errors``.
    """
    return {
        "version": ISA_VERSION,
        "word_bits": WORD_BITS,
        "opcode": (OPCODE_LO, OPCODE_BITS),
        "ver": (VERSION_LO, VERSION_BITS),
        "tokens": (TOKENS_LO, TOKENS_BITS),
        "opcodes": {s.mnemonic: s.opcode for s in SPECS},
        "queues": {s.mnemonic: s.queue.value for s in SPECS},
        "legal_tokens": {s.mnemonic: int(LEGAL_TOKENS[s.queue]) for s in SPECS},
        "operand_masks": {s.mnemonic: s.operand_bits for s in SPECS},
        "fields": {
            s.mnemonic: {f.name: (f.lo, f.bits, f.kind.value) for f in s.fields} for s in SPECS
        },
        "cfg": {f.name.lower(): (int(f), *CFG_RANGE[f]) for f in CfgField},
        "errors": {e.name.lower(): int(e) for e in ErrorCode},
    }
