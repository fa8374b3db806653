"""The scratchpad partition table: double-buffered with the instruction banks.

Each instruction bank has ``pt_sets`` tables of ``partitions`` entries
``(base, size)`` in bytes; a program selects a set with ``ptsel`` and every
scratchpad operand names a partition ``p`` and a byte offset inside it. The
semantics are those of ``firmware.golden.Machine._sp_range`` and the ``PT_*``
registers of ``firmware.regs``.
"""

from __future__ import annotations

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig
from firmware.isa import ErrorCode

from .ports import sp_addr_bits

__all__ = ["PT_BANKS", "PartitionTable", "pt_check_signature"]

PT_BANKS = 2
"""Tables are double-buffered with the two instruction banks."""

_PART_BITS, _SET_BITS = 3, 2  # ISA field widths (at most 8 partitions, 4 sets)


def pt_check_signature(config: NPUConfig) -> wiring.Signature:
    """One range check against the active partition table.

    Members (requester view)
    ------------------------
    p : Out(3)
        Partition index.
    offset : Out(32)
        Byte offset of the first byte inside the partition.
    nbytes : Out(40)
        Length of the span in bytes, less ``addend`` (the span is at least 1 byte).
    addend : Out(40)
        The rest of the span's length: the span is ``addend + nbytes`` bytes. A
        requester whose length is a product and a sum gives the sum here, a cycle
        before the product, so that it is added while the table looks ``p`` up.
    addr : In(sp_addr_bits)
        Absolute scratchpad byte address ``base + offset`` (meaningful only when
        ``error`` is NONE).
    error : In(4)
        ``firmware.isa.ErrorCode``: NONE, BAD_OPERAND when ``p >= partitions``,
        PARTITION_BOUNDS when the entry is disabled (size 0), leaves the
        scratchpad (``base + size > sp_bytes``) or the span leaves the partition
        (``offset + addend + nbytes > size``), checked in that order.

    Timing: the lookup is registered, and so is the active table it reads. ``p``,
    ``offset`` and ``addend`` are sampled at every clock edge, the table's ``bank``, ``set``
    and entries one edge earlier; ``addr`` and ``error`` describe the values
    sampled then, ``error`` combined with the current ``nbytes`` (one compare). A
    requester holds ``p``, ``offset`` and ``addend`` for a cycle before it reads the result,
    and may present ``nbytes`` a cycle later; ``bank``, ``set`` and the entries
    must have held for the cycle before that too.
    """
    return wiring.Signature({
        "p": Out(_PART_BITS),
        "offset": Out(32),
        "nbytes": Out(40),
        "addend": Out(40),
        "addr": In(sp_addr_bits(config)),
        "error": In(4),
    })


def exceeds(base: Value, size: Value, limit: int, bits: int) -> Value:
    """``base + size > limit`` for unsigned ``base`` and ``size``, where ``limit <=
    2**bits``: an adder as wide as ``bits`` rather than as the operands.

    The sum is ``(hi << bits) + lo`` with ``hi`` the sum of the operands' high parts
    and ``lo < 2**(bits + 1)`` the sum of their low parts. A ``hi`` of 2 or more is
    past any such limit, a ``hi`` of 1 is past it unless ``limit == 2**bits`` and
    ``lo == 0``, and a ``hi`` of 0 leaves ``lo > limit`` to decide.
    """
    assert 0 < limit <= 1 << bits
    b_hi, s_hi = base[bits:], size[bits:]
    lo = base[:bits] + size[:bits]
    hi_any = b_hi.any() | s_hi.any()
    if limit < 1 << bits:
        return hi_any | (lo > limit)
    # hi == 1 exactly: one high part is 1 and the other 0.
    hi_one = ((b_hi == 1) & ~s_hi.any()) | (~b_hi.any() & (s_hi == 1))
    return Mux(hi_any, ~hi_one | (lo != 0), lo > limit)


class PartitionTable(wiring.Component):
    """``2 x pt_sets x partitions`` entries of (base, size) with range checkers.

    Every entry resets to (0, 0), i.e. disabled. A write takes effect for
    readback at the end of its cycle (readback in its cycle sees the entry as it
    was), and for the checks a cycle later: the active table takes it at the edge
    after that, and a lookup at that edge still sees the entry as it was. Writes
    to a set or partition the build does not have are ignored, and read back as
    (0, 0). The table writes whichever bank it is told to: refusing writes to the
    active bank is the CSR block's job (it flags them).
    A set the build does not have behaves as a table of disabled entries.

    Parameters
    ----------
    config : NPUConfig
        The NPU build (``partitions``, ``pt_sets``, ``sp_bytes``).
    checks : int
        Number of independent range-check ports, at least 1.

    Members
    -------
    w_en, w_bank, w_set, w_part : In(1), In(1), In(2), In(3)
        Write entry ``w_part`` of set ``w_set`` of bank ``w_bank`` this cycle.
    w_base, w_size : In(32)
        The entry's new base and size in bytes (``PT_BASE``, ``PT_SIZE``).
    r_bank, r_set, r_part : In(1), In(2), In(3)
        Entry to read back (for the CSR block).
    r_base, r_size : Out(32)
        That entry, combinationally.
    bank : In(1)
        The active instruction bank: its tables are the ones checked.
    set : In(2)
        The active set (``ptsel``) inside that bank.
    checks : In(pt_check_signature(config)).array(checks)
        The range-check ports (see :func:`pt_check_signature`).
    """

    def __init__(self, config: NPUConfig, checks: int = 1):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if not isinstance(checks, int) or isinstance(checks, bool) or checks < 1:
            raise ValueError(f"checks={checks!r}: must be a positive integer")
        self.config = config
        super().__init__({
            "w_en": In(1),
            "w_bank": In(1),
            "w_set": In(_SET_BITS),
            "w_part": In(_PART_BITS),
            "w_base": In(32),
            "w_size": In(32),
            "r_bank": In(1),
            "r_set": In(_SET_BITS),
            "r_part": In(_PART_BITS),
            "r_base": Out(32),
            "r_size": Out(32),
            "bank": In(1),
            "set": In(_SET_BITS),
            "checks": In(pt_check_signature(config)).array(checks),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        abits = sp_addr_bits(cfg)
        pb, sb = ceil_log2(cfg.partitions), ceil_log2(cfg.pt_sets)

        # The entries as written, for readback only, in one memory read asynchronously
        # (LUT RAM on the ECP5): a 64-way multiplexer of flip-flops was more than half
        # of this block's logic. ``written`` stands in for the reset the memory lacks:
        # an entry not written since reset reads back as (0, 0).
        m.submodules.store = store = Memory(shape=64, depth=PT_BANKS << (pb + sb), init=[])
        store_w = store.write_port()
        store_r = store.read_port(domain="comb")
        written = Signal(PT_BANKS << (pb + sb))
        w_exists = (self.w_set < cfg.pt_sets) & (self.w_part < cfg.partitions)
        r_exists = (self.r_set < cfg.pt_sets) & (self.r_part < cfg.partitions)
        w_index = Cat(self.w_part[:pb], self.w_set[:sb], self.w_bank)
        r_index = Cat(self.r_part[:pb], self.r_set[:sb], self.r_bank)
        m.d.comb += [
            store_w.addr.eq(w_index),
            store_w.data.eq(Cat(self.w_base, self.w_size)),
            store_w.en.eq(self.w_en & w_exists),
            store_r.addr.eq(r_index),
        ]
        with m.If(self.w_en & w_exists):
            m.d.sync += written.bit_select(w_index, 1).eq(1)
        r_valid = r_exists & written.bit_select(r_index, 1)
        m.d.comb += [
            self.r_base.eq(Mux(r_valid, store_r.data[:32], 0)),
            self.r_size.eq(Mux(r_valid, store_r.data[32:], 0)),
        ]

        # What the checks use, in flip-flops: table[bank][set][part], padded with
        # disabled entries to the full 2 x 4 x 8 index space. Only an entry that passes
        # its verdict is used, and then base + size <= sp_bytes: the base's
        # scratchpad-address bits and one more for the size suffice.
        zb, zs = C(0, abits), C(0, abits + 1)
        base = [[[zb] * (1 << _PART_BITS) for _ in range(1 << _SET_BITS)]
                for _ in range(PT_BANKS)]
        size = [[[zs] * (1 << _PART_BITS) for _ in range(1 << _SET_BITS)]
                for _ in range(PT_BANKS)]
        # Each entry's verdict, decided when it is written: bit 0 disabled (size 0),
        # bit 1 leaves the scratchpad (base + size > sp_bytes).
        verdict = [[[C(0b01, 2)] * (1 << _PART_BITS) for _ in range(1 << _SET_BITS)]
                   for _ in range(PT_BANKS)]
        # They take a write a cycle after the readback does, from registered copies
        # of the write port: the verdict's add and compare then start from this
        # block's registers, not from the CSR block's across the chip (a routed
        # board build's slow path). The CSR block writes only the shadow bank, and a
        # swap takes a cycle more than this to reach the active table.
        wq = {n: Signal.like(getattr(self, n), name=f"{n}_q")
              for n in ("w_en", "w_bank", "w_set", "w_part", "w_base", "w_size")}
        m.d.sync += [q.eq(getattr(self, n)) for n, q in wq.items()]
        w_verdict = Cat(wq["w_size"] == 0,
                        exceeds(wq["w_base"], wq["w_size"], cfg.sp_bytes, abits))
        for b in range(PT_BANKS):
            for s in range(cfg.pt_sets):
                for p in range(cfg.partitions):
                    eb = Signal(abits, name=f"base_b{b}_s{s}_p{p}")
                    es = Signal(abits + 1, name=f"size_b{b}_s{s}_p{p}")
                    ev = Signal(2, name=f"verdict_b{b}_s{s}_p{p}", init=0b01)
                    base[b][s][p], size[b][s][p], verdict[b][s][p] = eb, es, ev
                    with m.If(wq["w_en"] & (wq["w_bank"] == b) & (wq["w_set"] == s)
                              & (wq["w_part"] == p)):
                        m.d.sync += [eb.eq(wq["w_base"]), es.eq(wq["w_size"]),
                                     ev.eq(w_verdict)]

        # The active table and its per-entry verdicts, shared by all checkers, held in
        # registers: they change only with ptsel, a swap or a write, never between a
        # check's lookup and its use, so the lookup starts from registers.
        act_base, act_size, act_bad = [], [], []
        tables = Cat(self.set, self.bank)  # index b * 4 + s
        for p in range(cfg.partitions):
            ab = Signal(abits, name=f"act_base_p{p}")
            asz = Signal(abits + 1, name=f"act_size_p{p}")
            bad = Signal(2, name=f"act_bad_p{p}")  # bit 0: disabled, bit 1: leaves the SP
            def active(table, p=p):
                return Array(table[b][s][p] for b in range(PT_BANKS)
                             for s in range(1 << _SET_BITS))[tables]
            m.d.sync += [ab.eq(active(base)), asz.eq(active(size)), bad.eq(active(verdict))]
            act_base.append(ab)
            act_size.append(asz)
            act_bad.append(bad)
        # padded to the full 3-bit index (such p are BAD_OPERAND anyway)
        pad = (1 << _PART_BITS) - cfg.partitions
        act_base = Array(act_base + [C(0, abits)] * pad)
        act_size = Array(act_size + [C(0, abits + 1)] * pad)
        act_bad = Array(act_bad + [C(0, 2)] * pad)

        for i, chk in enumerate(self.checks):
            # The lookup, registered: the address, the entry's verdict, and the room
            # the partition leaves after the offset and the addend (offset + addend +
            # nbytes > size is nbytes > size - offset - addend), so that the check
            # itself is one compare.
            addr = Signal.like(chk.addr, name=f"chk{i}_addr")
            missing = Signal(name=f"chk{i}_missing")
            bad = Signal(name=f"chk{i}_bad")
            room = Signal(signed(43), name=f"chk{i}_room")
            m.d.sync += [
                addr.eq(act_base[chk.p] + chk.offset),
                missing.eq(chk.p >= cfg.partitions),
                bad.eq(act_bad[chk.p].any()),
                room.eq(act_size[chk.p] - chk.offset - chk.addend),
            ]
            m.d.comb += chk.addr.eq(addr)
            # Same order as golden _sp_range: existence, enabled, inside the SP, span.
            with m.If(missing):
                m.d.comb += chk.error.eq(ErrorCode.BAD_OPERAND)
            with m.Elif(bad | (chk.nbytes > room)):
                m.d.comb += chk.error.eq(ErrorCode.PARTITION_BOUNDS)
            with m.Else():
                m.d.comb += chk.error.eq(ErrorCode.NONE)
        return m
