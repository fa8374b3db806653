"""The NPU's host port: an AXI4-Lite subordinate serving the CSR map of firmware/regs.py.

Every address, access mode and bit position comes from
:func:`firmware.regs.registers`; this module only says what each named register
*does*, one rule per register for reads and one for writes. A register without a
rule is a construction error, so the map and the RTL cannot drift apart silently.
The transaction-level model the block is checked against (tests/cocotb_csr.py),
and that the golden device serves, is :class:`firmware.csrmodel.CSRModel`.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig
from firmware.isa import ISA_VERSION
from firmware.regs import (
    HW_VERSION,
    ID_MAGIC,
    TRACE_FIELDS,
    Access,
    counter_names,
    registers,
)

from .axi import RESP_OKAY, RESP_SLVERR, axi4_lite_signature
from .perf import TRACE_RECORD_LAYOUT

__all__ = ["CSRBlock", "ADDR_WIDTH"]

ADDR_WIDTH = 12  # the 4 KiB CSR window


class CSRBlock(wiring.Component):
    """AXI4-Lite CSR block: decodes ``firmware.regs.registers(config)`` into plain signals.

    Bus behaviour: 32-bit registers, byte strobes honoured (W1S/W1C bits only act
    where strobed); AW and W are accepted independently, in either order or
    together, and a write takes effect when both have arrived and the previous B
    response has been taken; B and R wait for ``bready``/``rready`` with their
    payload held. An address outside the map answers SLVERR (reads return 0,
    writes do nothing). Writes to read-only registers are ignored with OKAY; reads
    of write-only and W1S registers return 0. A write of IMEM_DATA_HI with
    ``index >= imem_depth``, or of PT_SIZE naming a set or partition the build does
    not have, answers SLVERR and emits nothing.

    Refusal: a write aimed at a bank that is, or is about to become, live (the
    ``active_bank``, or either bank while ``swap_pending``) - IMEM_DATA_HI, PT_SIZE
    and BANK_VERSIONn - answers OKAY but emits nothing and stores nothing (the IMEM
    index does not advance); it sets the sticky IRQ_STATUS.refused (which is also
    STATUS.refused; W1C clears both). Refusal is not an interrupt source.

    STATUS.trace_overflow is sticky: set by the ``trace_overflow`` pulse, cleared
    by a CTRL.counter_reset or CTRL.trace_clear command (a pulse in the same cycle
    as the clear wins).

    Counters: reading CNT_x_LO returns bits 31:0 and latches bits 63:32 of the
    same cycle into one shared latch; CNT_x_HI returns that latch when the last
    LO read was of counter x, and the live bits 63:32 otherwise.

    Output ports (commands, write ports) are registers: a command or port write is
    high for exactly one cycle, the cycle in which the write's B response is first
    presented. Read data is sampled one cycle after the read address is accepted,
    so ``pt_rd_base``/``pt_rd_size`` may come from a synchronous lookup of
    ``pt_rd_*`` (which follow PT_SELECT); R is presented the cycle after that (two
    cycles after AR: the read mux is split over the two). A run event and a W1C of
    its cause in the same cycle leave the cause set.

    Parameters
    ----------
    config : NPUConfig
        The build: CAPS values, counter list, table and memory bounds.

    Members
    -------
    bus : In(axi4_lite_signature(12, 32))
        The host port (subordinate side).
    start, swap, counter_reset, tag_invalidate, trace_clear : Out(1)
        One-cycle command pulses from the CTRL bits of the same names.
    busy, active_bank, swap_pending, error : In(1)
        Run state, shown in STATUS.
    error_code : In(8), error_pc : In(16), error_addr : In(32)
        Shown in ERROR, ERROR_PC, ERROR_ADDR.
    trace_overflow : In(1)
        Pulse: a trace record was dropped (sets sticky STATUS.trace_overflow).
    run_done, run_error : In(1)
        Pulses that set IRQ_STATUS.done / IRQ_STATUS.error.
    irq : Out(1)
        Level interrupt: an IRQ_STATUS cause (done, error) whose IRQ_ENABLE bit is set.
    cycle_budget : Out(32), bank_version : Out(32).array(2), args : Out(32).array(7)
        The CYCLE_BUDGET, BANK_VERSIONn and ARGn registers.
    imem_we : Out(1), imem_bank : Out(1), imem_index : Out(16), imem_data : Out(64)
        Instruction-memory write port: one write per accepted IMEM_DATA_HI write,
        ``imem_data = HI:LO``.
    pt_we : Out(1), pt_bank : Out(1), pt_set : Out(2), pt_part : Out(3),
    pt_base : Out(32), pt_size : Out(32)
        Partition-table write port: one write per accepted PT_SIZE write, for the
        entry PT_SELECT names, with the base last written to PT_BASE.
    pt_rd_bank : Out(1), pt_rd_set : Out(2), pt_rd_part : Out(3)
        The entry PT_SELECT names, for the table lookup.
    pt_rd_base, pt_rd_size : In(32)
        That entry as stored (PT_BASE / PT_SIZE read data).
    trace_count : In(16), trace_head : In(TRACE_RECORD_LAYOUT)
        The trace FIFO's fill and oldest record (TRACE_COUNT, TRACE_<field>;
        the head reads as 0 when the count is 0).
    trace_pop : Out(1)
        Pulse from a TRACE_POP write of 1.
    regs : In(32).array(16)
        Scalar registers r0..r15 (R0..R15).
    counters : In(64).array(len(counter_names(config)))
        Counter values in ``counter_names(config)`` order (CNT_x_LO/HI).
    """

    def __init__(self, config: NPUConfig):
        if not isinstance(config, NPUConfig):
            self._MustUse__silence = True  # a failed construction is not an unused design
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.map = registers(config)
        self.counter_names = counter_names(config)
        super().__init__({
            "bus": In(axi4_lite_signature(ADDR_WIDTH, 32)),
            "start": Out(1), "swap": Out(1), "counter_reset": Out(1),
            "tag_invalidate": Out(1), "trace_clear": Out(1),
            "busy": In(1), "active_bank": In(1), "swap_pending": In(1), "error": In(1),
            "error_code": In(8), "error_pc": In(16), "error_addr": In(32),
            "trace_overflow": In(1),
            "run_done": In(1), "run_error": In(1),
            "irq": Out(1),
            "cycle_budget": Out(32),
            "bank_version": Out(32).array(2),
            "args": Out(32).array(7),
            "imem_we": Out(1), "imem_bank": Out(1), "imem_index": Out(16),
            "imem_data": Out(64),
            "pt_we": Out(1), "pt_bank": Out(1), "pt_set": Out(2), "pt_part": Out(3),
            "pt_base": Out(32), "pt_size": Out(32),
            "pt_rd_bank": Out(1), "pt_rd_set": Out(2), "pt_rd_part": Out(3),
            "pt_rd_base": In(32), "pt_rd_size": In(32),
            "trace_count": In(16),
            "trace_head": In(TRACE_RECORD_LAYOUT),
            "trace_pop": Out(1),
            "regs": In(32).array(16),
            "counters": In(64).array(len(self.counter_names)),
        })
        self._fields = _Fields(self.map)
        self._reads = self._read_rules()
        self._writes = self._write_rules()
        self._counter_regs = {f"CNT_{n.upper()}_{half}" for n in self.counter_names
                              for half in ("LO", "HI")}
        # Fail at construction, not deep in elaboration, if regs.py grew a register
        # this block has no behaviour for.
        unknown = [r.name for r in self.map if r.name not in self._counter_regs
                   and ((r.access in (Access.RO, Access.RW, Access.W1C)
                         and r.name not in self._reads)
                        or (r.access != Access.RO and r.name not in self._writes))]
        if unknown:
            self._MustUse__silence = True
            raise ValueError(f"CSRBlock has no behaviour for registers {unknown}")
        self._check_counter_block()

    def _check_counter_block(self):
        """The read path indexes the counters by address bits: CNT_x_LO/HI of counter i
        must be words base + 2i and base + 2i + 1, base aligned to the counter block."""
        words = {r.name: r.addr >> 2 for r in self.map}
        n = len(self.counter_names)
        self._counter_bits = k = max(1, ceil_log2(2 * n))
        self._counter_base = base = words[f"CNT_{self.counter_names[0].upper()}_LO"]
        for i, name in enumerate(self.counter_names):
            for half, offset in (("LO", 0), ("HI", 1)):
                reg = f"CNT_{name.upper()}_{half}"
                if words[reg] != base + 2 * i + offset or base % (1 << k):
                    self._MustUse__silence = True
                    raise ValueError(f"{reg} is not at word {base + 2 * i + offset} of an "
                                     f"aligned counter block")

    # ---- what each register shows and does ------------------------------------------------
    def _read_rules(self):
        """Register name -> ``rule(m, state)``, the value a read returns (RO/RW/W1C)."""
        cfg, f = self.config, self._fields
        rules = {
            "ID": lambda m, s: ID_MAGIC,
            "VERSION": lambda m, s: f.const("VERSION", hw=HW_VERSION, isa=ISA_VERSION),
            "STATUS": lambda m, s: f.pack(m, "STATUS", {
                "busy": self.busy, "active_bank": self.active_bank,
                "swap_pending": self.swap_pending, "error": self.error,
                "refused": s.irq_st["refused"], "trace_overflow": s.trace_ovf,
            }),
            "ERROR": lambda m, s: self.error_code,
            "ERROR_PC": lambda m, s: self.error_pc,
            "ERROR_ADDR": lambda m, s: self.error_addr,
            "IRQ_ENABLE": lambda m, s: f.pack(m, "IRQ_ENABLE", s.irq_en),
            "IRQ_STATUS": lambda m, s: f.pack(m, "IRQ_STATUS", s.irq_st),
            "CYCLE_BUDGET": lambda m, s: self.cycle_budget,
            "BANK_VERSION0": lambda m, s: self.bank_version[0],
            "BANK_VERSION1": lambda m, s: self.bank_version[1],
            "IMEM_ADDR": lambda m, s: f.pack(m, "IMEM_ADDR", {"index": s.imem_sel_index,
                                                             "bank": s.imem_sel_bank}),
            "PT_SELECT": lambda m, s: f.pack(m, "PT_SELECT", s.pt_sel),
            "PT_BASE": lambda m, s: self.pt_rd_base,
            "PT_SIZE": lambda m, s: self.pt_rd_size,
            "TRACE_COUNT": lambda m, s: self.trace_count,
        }
        for fl in dataclasses.fields(NPUConfig):
            value = getattr(cfg, fl.name)
            rules[f"CAPS_{fl.name.upper()}"] = lambda m, s, value=value: value
        for i in range(7):
            rules[f"ARG{i}"] = lambda m, s, i=i: self.args[i]
        for name in TRACE_FIELDS:
            rules[f"TRACE_{name.upper()}"] = lambda m, s, name=name: Mux(
                self.trace_count != 0, getattr(self.trace_head, name), 0)
        for i in range(16):
            rules[f"R{i}"] = lambda m, s, i=i: self.regs[i]
        return rules

    def _write_rules(self):
        """Register name -> ``rule(m, state, write)``, the commit-cycle behaviour of a write.

        Registers without a rule are read-only: the write is ignored (OKAY).
        """
        rules = {
            "CTRL": self._write_ctrl,
            "IRQ_ENABLE": self._write_irq_enable,
            "IRQ_STATUS": self._write_irq_status,
            "CYCLE_BUDGET": self._write_cycle_budget,
            "BANK_VERSION0": functools.partial(self._write_bank_version, 0),
            "BANK_VERSION1": functools.partial(self._write_bank_version, 1),
            "IMEM_ADDR": self._write_imem_addr,
            "IMEM_DATA_LO": self._write_imem_lo,
            "IMEM_DATA_HI": self._write_imem_hi,
            "PT_SELECT": self._write_pt_select,
            "PT_BASE": self._write_pt_base,
            "PT_SIZE": self._write_pt_size,
            "TRACE_POP": self._write_trace_pop,
        }
        for i in range(7):
            rules[f"ARG{i}"] = functools.partial(self._write_arg, i)
        return rules

    def _live(self, bank):
        """A bank that is live or about to be: writes to it are refused."""
        return (bank == self.active_bank) | self.swap_pending

    def _write_ctrl(self, m, s, w):
        for name in s.ctrl_fields:
            m.d.sync += getattr(self, name).eq(self._fields.bits(w.set_bits, "CTRL", name))
        m.d.comb += s.ovf_clear.eq(self._fields.bits(w.set_bits, "CTRL", "counter_reset")
                                   | self._fields.bits(w.set_bits, "CTRL", "trace_clear"))

    def _write_irq_enable(self, m, s, w):
        word = w.merged(s.read_value["IRQ_ENABLE"])
        m.d.sync += [s.irq_en[n].eq(self._fields.bits(word, "IRQ_ENABLE", n)) for n in s.irq_en]

    def _write_irq_status(self, m, s, w):
        m.d.comb += [s.irq_clear[n].eq(self._fields.bits(w.set_bits, "IRQ_STATUS", n))
                     for n in s.irq_clear]

    def _write_cycle_budget(self, m, s, w):
        m.d.sync += self.cycle_budget.eq(w.merged(self.cycle_budget))

    def _write_bank_version(self, b, m, s, w):
        with m.If(self._live(b)):
            m.d.comb += s.refuse.eq(1)
        with m.Else():
            m.d.sync += self.bank_version[b].eq(w.merged(self.bank_version[b]))

    def _write_arg(self, i, m, s, w):
        m.d.sync += self.args[i].eq(w.merged(self.args[i]))

    def _write_imem_addr(self, m, s, w):
        word = w.merged(s.read_value["IMEM_ADDR"])
        m.d.sync += [s.imem_sel_index.eq(self._fields.bits(word, "IMEM_ADDR", "index")),
                     s.imem_sel_bank.eq(self._fields.bits(word, "IMEM_ADDR", "bank"))]

    def _write_imem_lo(self, m, s, w):
        m.d.sync += s.imem_lo.eq(w.merged(s.imem_lo))

    def _write_imem_hi(self, m, s, w):
        with m.If(self._live(s.imem_sel_bank)):
            m.d.comb += s.refuse.eq(1)
        with m.Elif(s.imem_sel_index >= self.config.imem_depth):
            m.d.sync += self.bus.bresp.eq(RESP_SLVERR)
        with m.Else():
            m.d.sync += [
                self.imem_we.eq(1),
                self.imem_bank.eq(s.imem_sel_bank),
                self.imem_index.eq(s.imem_sel_index),
                self.imem_data.eq(Cat(s.imem_lo, w.merged(0))),
                s.imem_sel_index.eq(s.imem_sel_index + 1),
            ]

    def _write_pt_select(self, m, s, w):
        word = w.merged(s.read_value["PT_SELECT"])
        m.d.sync += [s.pt_sel[n].eq(self._fields.bits(word, "PT_SELECT", n)) for n in s.pt_sel]

    def _write_pt_base(self, m, s, w):
        m.d.sync += s.pt_base_stage.eq(w.merged(s.pt_base_stage))

    def _write_pt_size(self, m, s, w):
        cfg, sel = self.config, s.pt_sel
        with m.If(self._live(sel["bank"])):
            m.d.comb += s.refuse.eq(1)
        with m.Elif((sel["set"] >= cfg.pt_sets) | (sel["partition"] >= cfg.partitions)):
            m.d.sync += self.bus.bresp.eq(RESP_SLVERR)
        with m.Else():
            m.d.sync += [
                self.pt_we.eq(1),
                self.pt_bank.eq(sel["bank"]),
                self.pt_set.eq(sel["set"]),
                self.pt_part.eq(sel["partition"]),
                self.pt_base.eq(s.pt_base_stage),
                self.pt_size.eq(w.merged(self.pt_rd_size)),
            ]

    def _write_trace_pop(self, m, s, w):
        m.d.sync += self.trace_pop.eq(w.set_bits[0])

    # ---- elaboration ------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        s = _State(self)
        m.d.comb += [
            self.irq.eq((s.irq_en["done"] & s.irq_st["done"])
                        | (s.irq_en["error"] & s.irq_st["error"])),
            self.pt_rd_bank.eq(s.pt_sel["bank"]),
            self.pt_rd_set.eq(s.pt_sel["set"]),
            self.pt_rd_part.eq(s.pt_sel["partition"]),
        ]
        s.read_value = {name: rule(m, s) for name, rule in self._reads.items()}
        self._read_channel(m, s)
        self._write_channel(m, s)
        self._sticky_status(m, s)
        return m

    def _decode_mapped(self, m, word, name):
        """A signal that is high when ``word`` (an address's bits 11:2) names a register."""
        mapped = Signal(name=name)
        with m.Switch(word):
            with m.Case(*(r.addr >> 2 for r in self.map)):
                m.d.comb += mapped.eq(1)
        return mapped

    def _read_channel(self, m, s):
        """AR accepted -> sample -> select -> R held until rready."""
        bus = self.bus
        ar_held = Signal()  # sampling cycle
        r_select = Signal()  # selecting cycle
        ar_word = Signal(ADDR_WIDTH - 2)
        m.d.comb += bus.arready.eq(~ar_held & ~r_select & ~bus.rvalid)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [ar_held.eq(1), ar_word.eq(bus.araddr[2:])]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)

        words = self._sample_registers(m, s, ar_word)
        counter = self._sample_counters(m, s, ar_word)
        words += counter.words
        r_data = Signal(32)
        m.d.comb += r_data.eq(functools.reduce(operator.or_, words))

        r_mapped = Signal()
        mapped_now = self._decode_mapped(m, ar_word, "mapped_now")
        m.d.sync += r_mapped.eq(mapped_now)

        with m.If(ar_held):
            m.d.sync += [ar_held.eq(0), r_select.eq(1)]
        with m.If(r_select):
            m.d.sync += [r_select.eq(0), bus.rvalid.eq(1), bus.rdata.eq(r_data),
                         bus.rresp.eq(Mux(r_mapped, RESP_OKAY, RESP_SLVERR))]
            # a LO read latches the high half sampled with it
            with m.If(counter.use_lo):
                m.d.sync += [s.cnt_hi.eq(counter.sample[32:]), s.cnt_sel.eq(counter.index),
                             s.cnt_latched.eq(1)]

    def _sample_registers(self, m, s, ar_word):
        """The first read level for every register but the counters.

        The cycle after AR is accepted every register is sampled (registered every
        cycle, from ``ar_word``): per block of 16 words the word the low address bits
        name, and whether the block is the one addressed. The cycle after, R is
        selected from those registers alone (``ar_word`` still holds the address).
        Returns the per-block words, zero unless addressed.
        """
        blocks: dict[int, list] = {}
        for r in self.map:
            if r.name in self._counter_regs:
                continue
            word = r.addr >> 2
            value = 0 if r.access in (Access.WO, Access.W1S) else s.read_value[r.name]
            blocks.setdefault(word >> 4, [0] * 16)[word & 15] = value
        words = []
        for b, entries in sorted(blocks.items()):
            sample = Signal(32, name=f"rd_block{b:x}")
            hit = Signal(name=f"rd_block{b:x}_hit")
            m.d.sync += [
                sample.eq(Cat(*(_word32(v) for v in entries)).word_select(ar_word[:4], 32)),
                hit.eq(ar_word[4:] == b),
            ]
            words.append(Mux(hit, sample, 0))
        return words

    def _sample_counters(self, m, s, ar_word):
        """The first read level of the counters, per group of 4 counters the one the low
        index bits name, both halves; and which half R returns: LO, live HI, or the HI
        latched by the last LO read. CNT_x_LO/HI are words base + 2x / base + 2x + 1
        (checked at construction)."""
        base, k = self._counter_base, self._counter_bits
        n = len(self.counter_names)
        cnt_index = ar_word[1:k]
        is_counter = (ar_word[k:] == base >> k) & (ar_word[:k] < 2 * n)
        groups = []
        for j in range(0, n, 4):
            sample = Signal(64, name=f"rd_counters{j // 4}")
            m.d.sync += sample.eq(Cat(*self.counters[j:j + 4]).word_select(cnt_index[:2], 64))
            groups.append(sample)
        cnt_sample = Signal(64)  # the addressed counter
        m.d.comb += cnt_sample.eq(Cat(*groups).word_select(cnt_index[2:], 64)
                                  if len(groups) > 1 else groups[0])
        use_lo, use_live, use_latch = (Signal(name=n) for n in ("use_lo", "use_live",
                                                                "use_latch"))
        latched = s.cnt_latched & (s.cnt_sel == cnt_index)
        hi_read = ar_word[0]
        m.d.sync += [
            use_lo.eq(is_counter & ~hi_read),
            use_live.eq(is_counter & hi_read & ~latched),
            use_latch.eq(is_counter & hi_read & latched),
        ]
        words = [Mux(use_lo, cnt_sample[:32], 0), Mux(use_live, cnt_sample[32:], 0),
                 Mux(use_latch, s.cnt_hi, 0)]
        return _CounterRead(words=words, use_lo=use_lo, sample=cnt_sample, index=cnt_index)

    def _write_channel(self, m, s):
        """AW and W held independently, committed together when B is free."""
        bus = self.bus
        aw_held = Signal()
        aw_word = Signal(ADDR_WIDTH - 2)
        w_held = Signal()
        w_data = Signal(32)
        w_strb = Signal(4)
        m.d.comb += [bus.awready.eq(~aw_held), bus.wready.eq(~w_held)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_held.eq(1), aw_word.eq(bus.awaddr[2:])]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_held.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        commit = Signal()
        m.d.comb += commit.eq(aw_held & w_held & ~bus.bvalid)
        w = _Write(w_data, Cat(b.replicate(8) for b in w_strb))

        # Command and write-port outputs are one-cycle registered pulses.
        pulses = [getattr(self, n) for n in s.ctrl_fields] + [self.trace_pop, self.imem_we,
                                                                self.pt_we]
        for p in pulses:
            m.d.sync += p.eq(0)

        # One decoder for "is mapped", one compare per register that acts on writes:
        # far less logic (and Verilator C++) than a case statement per written signal.
        w_mapped = self._decode_mapped(m, aw_word, "w_mapped")
        with m.If(commit):
            m.d.sync += [aw_held.eq(0), w_held.eq(0), bus.bvalid.eq(1),
                         bus.bresp.eq(Mux(w_mapped, RESP_OKAY, RESP_SLVERR))]
            for r in self.map:
                if r.access != Access.RO:
                    with m.If(aw_word == r.addr >> 2):
                        self._writes[r.name](m, s, w)

    def _sticky_status(self, m, s):
        """IRQ_STATUS causes and STATUS.trace_overflow: an event in the cycle of its
        clear wins."""
        for n, event in (("done", self.run_done), ("error", self.run_error),
                         ("refused", s.refuse)):
            with m.If(event):
                m.d.sync += s.irq_st[n].eq(1)
            with m.Elif(s.irq_clear[n]):
                m.d.sync += s.irq_st[n].eq(0)
        with m.If(self.trace_overflow):
            m.d.sync += s.trace_ovf.eq(1)
        with m.Elif(s.ovf_clear):
            m.d.sync += s.trace_ovf.eq(0)


class _Fields:
    """Bit positions of the map's fields, applied to Amaranth values."""

    def __init__(self, registers):
        self.regs = {r.name: r for r in registers}

    def field(self, reg, name):
        for f in self.regs[reg].fields:
            if f.name == name:
                return f
        raise KeyError(f"{reg}.{name} is not in firmware/regs.py")

    def pack(self, m, reg, values):
        """Place field values into a 32-bit word (fields not given read 0)."""
        word = Signal(32, name=f"{reg.lower()}_word")
        for name, value in values.items():
            f = self.field(reg, name)
            m.d.comb += word[f.lo:f.lo + f.bits].eq(value)
        return word

    def const(self, reg, **values):
        """The constant word of ``reg`` with the named fields set."""
        word = 0
        for name, value in values.items():
            f = self.field(reg, name)
            word |= (value & ((1 << f.bits) - 1)) << f.lo
        return word

    def bits(self, word, reg, name):
        f = self.field(reg, name)
        return word[f.lo:f.lo + f.bits]


class _State:
    """The block's own registers, and the combinational signals the write rules drive
    for the sticky bits (``refuse``, ``irq_clear``, ``ovf_clear``)."""

    def __init__(self, block: CSRBlock):
        self.ctrl_fields = [f.name for f in block._fields.regs["CTRL"].fields]
        self.irq_en = {n: Signal(name=f"irq_en_{n}") for n in ("done", "error")}
        self.irq_st = {n: Signal(name=f"irq_st_{n}") for n in ("done", "error", "refused")}
        self.trace_ovf = Signal(name="trace_ovf")
        self.imem_sel_index = Signal(16, name="imem_sel_index")
        self.imem_sel_bank = Signal(name="imem_sel_bank")
        self.imem_lo = Signal(32, name="imem_lo")
        self.pt_sel = {"partition": Signal(3, name="pt_sel_partition"),
                       "set": Signal(2, name="pt_sel_set"),
                       "bank": Signal(name="pt_sel_bank")}
        self.pt_base_stage = Signal(32, name="pt_base_stage")
        self.cnt_hi = Signal(32, name="cnt_hi")
        self.cnt_sel = Signal(range(len(block.counter_names)), name="cnt_sel")
        self.cnt_latched = Signal(name="cnt_latched")
        self.refuse = Signal(name="refuse")
        self.irq_clear = {n: Signal(name=f"irq_clear_{n}") for n in self.irq_st}
        self.ovf_clear = Signal(name="ovf_clear")
        self.read_value: dict[str, Value | int] = {}


@dataclasses.dataclass
class _Write:
    """The write being committed: its data and its byte-lane mask."""

    data: Value
    mask: Value

    @property
    def set_bits(self):
        """The strobed ones (what W1S / W1C registers act on)."""
        return self.data & self.mask

    def merged(self, old):
        """``old`` with the strobed bytes replaced by the written ones."""
        return (old & ~self.mask) | (self.data & self.mask)


@dataclasses.dataclass
class _CounterRead:
    words: list
    use_lo: Value
    sample: Value
    index: Value


def _word32(value):
    value = Value.cast(value)
    return Cat(value, Const(0, 32 - len(value))) if len(value) < 32 else value
