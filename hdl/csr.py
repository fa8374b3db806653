"""The NPU's host port: an AXI4-Lite subordinate serving the CSR map of firmware/regs.py.

Every address, access mode and bit position comes from
:func:`firmware.regs.registers`; this module only says what each named register
*does*. A register name it does not know is a construction error, so the map and
the RTL cannot drift apart silently.
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
        # Fail at construction, not deep in elaboration, if regs.py grew a register
        # this block has no behaviour for.
        known = self._known_names()
        unknown = [r.name for r in self.map if r.name not in known]
        if unknown:
            self._MustUse__silence = True
            raise ValueError(f"CSRBlock has no behaviour for registers {unknown}")
        # The read path indexes the counters by address bits: CNT_x_LO/HI of counter i
        # must be words base + 2i and base + 2i + 1, base aligned to the counter block.
        words = {r.name: r.addr >> 2 for r in self.map}
        n = len(self.counter_names)
        self._counter_bits = k = max(1, ceil_log2(2 * n))
        self._counter_base = base = words[f"CNT_{self.counter_names[0].upper()}_LO"]
        self._counter_regs = set()
        for i, name in enumerate(self.counter_names):
            for half, offset in (("LO", 0), ("HI", 1)):
                reg = f"CNT_{name.upper()}_{half}"
                self._counter_regs.add(reg)
                if words[reg] != base + 2 * i + offset or base % (1 << k):
                    self._MustUse__silence = True
                    raise ValueError(f"{reg} is not at word {base + 2 * i + offset} of an "
                                     f"aligned counter block")

    def _known_names(self):
        cfg = self.config
        names = {"ID", "VERSION", "CTRL", "STATUS", "ERROR", "ERROR_PC", "ERROR_ADDR",
                 "IRQ_ENABLE", "IRQ_STATUS", "CYCLE_BUDGET", "BANK_VERSION0",
                 "BANK_VERSION1", "IMEM_ADDR", "IMEM_DATA_LO", "IMEM_DATA_HI",
                 "PT_SELECT", "PT_BASE", "PT_SIZE", "TRACE_COUNT", "TRACE_POP"}
        names |= {f"CAPS_{f.name.upper()}" for f in dataclasses.fields(NPUConfig)}
        names |= {f"ARG{i}" for i in range(7)}
        names |= {f"TRACE_{n.upper()}" for n in TRACE_FIELDS}
        names |= {f"R{i}" for i in range(16)}
        for n in counter_names(cfg):
            names |= {f"CNT_{n.upper()}_LO", f"CNT_{n.upper()}_HI"}
        return names

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        bus = self.bus
        regs = {r.name: r for r in self.map}

        def field(reg, name):
            for f in regs[reg].fields:
                if f.name == name:
                    return f
            raise KeyError(f"{reg}.{name} is not in firmware/regs.py")

        def pack(reg, values):
            """Place field values into a 32-bit word (fields not given read 0)."""
            word = Signal(32, name=f"{reg.lower()}_word")
            for name, value in values.items():
                f = field(reg, name)
                m.d.comb += word[f.lo:f.lo + f.bits].eq(value)
            return word

        def bits(word, reg, name):
            f = field(reg, name)
            return word[f.lo:f.lo + f.bits]

        # ---- state ---------------------------------------------------------------
        irq_en = {n: Signal(name=f"irq_en_{n}") for n in ("done", "error")}
        irq_st = {n: Signal(name=f"irq_st_{n}") for n in ("done", "error", "refused")}
        trace_ovf = Signal()
        imem_sel_index = Signal(16)
        imem_sel_bank = Signal()
        imem_lo = Signal(32)
        pt_sel = {"partition": Signal(3), "set": Signal(2), "bank": Signal()}
        pt_base_stage = Signal(32)
        cnt_hi = Signal(32)
        cnt_sel = Signal(range(len(self.counter_names)))
        cnt_latched = Signal()

        m.d.comb += [
            self.irq.eq((irq_en["done"] & irq_st["done"]) | (irq_en["error"] & irq_st["error"])),
            self.pt_rd_bank.eq(pt_sel["bank"]),
            self.pt_rd_set.eq(pt_sel["set"]),
            self.pt_rd_part.eq(pt_sel["partition"]),
        ]

        # ---- read values, by register name ----------------------------------------
        def vfield(reg, name, value):
            f = field(reg, name)
            return (value & ((1 << f.bits) - 1)) << f.lo

        status = pack("STATUS", {
            "busy": self.busy, "active_bank": self.active_bank,
            "swap_pending": self.swap_pending, "error": self.error,
            "refused": irq_st["refused"], "trace_overflow": trace_ovf,
        })
        irq_enable_word = pack("IRQ_ENABLE", irq_en)
        irq_status_word = pack("IRQ_STATUS", irq_st)
        imem_addr_word = pack("IMEM_ADDR", {"index": imem_sel_index, "bank": imem_sel_bank})
        pt_select_word = pack("PT_SELECT", pt_sel)
        head_valid = self.trace_count != 0

        read_value: dict[str, Value | int] = {
            "ID": ID_MAGIC,
            "VERSION": vfield("VERSION", "hw", HW_VERSION) | vfield("VERSION", "isa", ISA_VERSION),
            "STATUS": status,
            "ERROR": self.error_code,
            "ERROR_PC": self.error_pc,
            "ERROR_ADDR": self.error_addr,
            "IRQ_ENABLE": irq_enable_word,
            "IRQ_STATUS": irq_status_word,
            "CYCLE_BUDGET": self.cycle_budget,
            "BANK_VERSION0": self.bank_version[0],
            "BANK_VERSION1": self.bank_version[1],
            "IMEM_ADDR": imem_addr_word,
            "PT_SELECT": pt_select_word,
            "PT_BASE": self.pt_rd_base,
            "PT_SIZE": self.pt_rd_size,
            "TRACE_COUNT": self.trace_count,
        }
        for f in dataclasses.fields(NPUConfig):
            read_value[f"CAPS_{f.name.upper()}"] = getattr(cfg, f.name)
        for i in range(7):
            read_value[f"ARG{i}"] = self.args[i]
        for name in TRACE_FIELDS:
            read_value[f"TRACE_{name.upper()}"] = Mux(head_valid, getattr(self.trace_head, name),
                                                      0)
        for i in range(16):
            read_value[f"R{i}"] = self.regs[i]

        # ---- read channel: AR accepted -> sample -> select -> R held until rready -----
        ar_held = Signal()  # sampling cycle
        r_select = Signal()  # selecting cycle
        ar_word = Signal(ADDR_WIDTH - 2)
        m.d.comb += bus.arready.eq(~ar_held & ~r_select & ~bus.rvalid)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [ar_held.eq(1), ar_word.eq(bus.araddr[2:])]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)

        def word32(value):
            value = Value.cast(value)
            return Cat(value, Const(0, 32 - len(value))) if len(value) < 32 else value

        # The cycle after AR is accepted every register is sampled into a first level
        # (registered every cycle, from ar_word): per block of 16 words the word the low
        # address bits name, and whether the block is the one addressed; per group of 4
        # counters the one the low index bits name, both halves. The cycle after, R is
        # selected from those registers alone (ar_word still holds the address).
        blocks: dict[int, list] = {}
        for r in self.map:
            if r.name in self._counter_regs:
                continue
            word = r.addr >> 2
            value = 0 if r.access in (Access.WO, Access.W1S) else read_value[r.name]
            blocks.setdefault(word >> 4, [0] * 16)[word & 15] = value
        words = []
        for b, entries in sorted(blocks.items()):
            sample = Signal(32, name=f"rd_block{b:x}")
            hit = Signal(name=f"rd_block{b:x}_hit")
            m.d.sync += [
                sample.eq(Cat(*(word32(v) for v in entries)).word_select(ar_word[:4], 32)),
                hit.eq(ar_word[4:] == b),
            ]
            words.append(Mux(hit, sample, 0))

        # Counters: CNT_x_LO/HI are words base + 2x / base + 2x + 1 (checked at construction)
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
        # which half R returns: LO, live HI, or the HI latched by the last LO read
        use_lo, use_live, use_latch = Signal(), Signal(), Signal()
        latched = cnt_latched & (cnt_sel == cnt_index)
        hi_read = ar_word[0]
        m.d.sync += [
            use_lo.eq(is_counter & ~hi_read),
            use_live.eq(is_counter & hi_read & ~latched),
            use_latch.eq(is_counter & hi_read & latched),
        ]
        words += [Mux(use_lo, cnt_sample[:32], 0), Mux(use_live, cnt_sample[32:], 0),
                  Mux(use_latch, cnt_hi, 0)]
        r_data = Signal(32)
        m.d.comb += r_data.eq(functools.reduce(operator.or_, words))

        r_mapped = Signal()
        mapped_now = Signal()
        with m.Switch(ar_word):
            with m.Case(*(r.addr >> 2 for r in self.map)):
                m.d.comb += mapped_now.eq(1)
        m.d.sync += r_mapped.eq(mapped_now)

        with m.If(ar_held):
            m.d.sync += [ar_held.eq(0), r_select.eq(1)]
        with m.If(r_select):
            m.d.sync += [r_select.eq(0), bus.rvalid.eq(1), bus.rdata.eq(r_data),
                         bus.rresp.eq(Mux(r_mapped, RESP_OKAY, RESP_SLVERR))]
            # a LO read latches the high half sampled with it
            with m.If(use_lo):
                m.d.sync += [cnt_hi.eq(cnt_sample[32:]), cnt_sel.eq(cnt_index),
                             cnt_latched.eq(1)]

        # ---- write channel: AW and W held independently, committed together --------
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
        mask = Cat(b.replicate(8) for b in w_strb)
        set_bits = w_data & mask  # W1S / W1C: only strobed ones act

        def merged(old):
            return (old & ~mask) | (w_data & mask)

        def live(bank):
            """A bank that is live or about to be: writes to it are refused."""
            return (bank == self.active_bank) | self.swap_pending

        # Command and write-port outputs are one-cycle registered pulses.
        ctrl_fields = [f.name for f in regs["CTRL"].fields]
        pulses = [getattr(self, n) for n in ctrl_fields] + [self.trace_pop, self.imem_we,
                                                              self.pt_we]
        for p in pulses:
            m.d.sync += p.eq(0)
        refuse = Signal()
        irq_clear = {n: Signal(name=f"irq_clear_{n}") for n in irq_st}
        ovf_clear = Signal()

        def write(name):
            """Emit the commit-cycle behaviour of a write to register ``name``."""
            if name == "CTRL":
                for f in ctrl_fields:
                    m.d.sync += getattr(self, f).eq(bits(set_bits, name, f))
                m.d.comb += ovf_clear.eq(bits(set_bits, name, "counter_reset")
                                         | bits(set_bits, name, "trace_clear"))
            elif name == "IRQ_ENABLE":
                word = merged(read_value[name])
                m.d.sync += [irq_en[n].eq(bits(word, name, n)) for n in irq_en]
            elif name == "IRQ_STATUS":
                m.d.comb += [irq_clear[n].eq(bits(set_bits, name, n)) for n in irq_clear]
            elif name == "CYCLE_BUDGET":
                m.d.sync += self.cycle_budget.eq(merged(self.cycle_budget))
            elif name in ("BANK_VERSION0", "BANK_VERSION1"):
                b = int(name[-1])
                with m.If(live(b)):
                    m.d.comb += refuse.eq(1)
                with m.Else():
                    m.d.sync += self.bank_version[b].eq(merged(self.bank_version[b]))
            elif name.startswith("ARG"):
                i = int(name[3:])
                m.d.sync += self.args[i].eq(merged(self.args[i]))
            elif name == "IMEM_ADDR":
                word = merged(read_value[name])
                m.d.sync += [imem_sel_index.eq(bits(word, name, "index")),
                             imem_sel_bank.eq(bits(word, name, "bank"))]
            elif name == "IMEM_DATA_LO":
                m.d.sync += imem_lo.eq(merged(imem_lo))
            elif name == "IMEM_DATA_HI":
                with m.If(live(imem_sel_bank)):
                    m.d.comb += refuse.eq(1)
                with m.Elif(imem_sel_index >= cfg.imem_depth):
                    m.d.sync += bus.bresp.eq(RESP_SLVERR)
                with m.Else():
                    m.d.sync += [
                        self.imem_we.eq(1),
                        self.imem_bank.eq(imem_sel_bank),
                        self.imem_index.eq(imem_sel_index),
                        self.imem_data.eq(Cat(imem_lo, merged(0))),
                        imem_sel_index.eq(imem_sel_index + 1),
                    ]
            elif name == "PT_SELECT":
                word = merged(read_value[name])
                m.d.sync += [pt_sel[n].eq(bits(word, name, n)) for n in pt_sel]
            elif name == "PT_BASE":
                m.d.sync += pt_base_stage.eq(merged(pt_base_stage))
            elif name == "PT_SIZE":
                with m.If(live(pt_sel["bank"])):
                    m.d.comb += refuse.eq(1)
                with m.Elif((pt_sel["set"] >= cfg.pt_sets)
                            | (pt_sel["partition"] >= cfg.partitions)):
                    m.d.sync += bus.bresp.eq(RESP_SLVERR)
                with m.Else():
                    m.d.sync += [
                        self.pt_we.eq(1),
                        self.pt_bank.eq(pt_sel["bank"]),
                        self.pt_set.eq(pt_sel["set"]),
                        self.pt_part.eq(pt_sel["partition"]),
                        self.pt_base.eq(pt_base_stage),
                        self.pt_size.eq(merged(self.pt_rd_size)),
                    ]
            elif name == "TRACE_POP":
                m.d.sync += self.trace_pop.eq(set_bits[0])
            # Everything else is read-only: the write is ignored (OKAY).

        # One decoder for "is mapped", one compare per register that acts on writes:
        # far less logic (and Verilator C++) than a case statement per written signal.
        w_mapped = Signal()
        with m.Switch(aw_word):
            with m.Case(*(r.addr >> 2 for r in self.map)):
                m.d.comb += w_mapped.eq(1)
        with m.If(commit):
            m.d.sync += [aw_held.eq(0), w_held.eq(0), bus.bvalid.eq(1),
                         bus.bresp.eq(Mux(w_mapped, RESP_OKAY, RESP_SLVERR))]
            for r in self.map:
                if r.access != Access.RO:
                    with m.If(aw_word == r.addr >> 2):
                        write(r.name)

        # ---- sticky status -----------------------------------------------------------
        for n, event in (("done", self.run_done), ("error", self.run_error),
                         ("refused", refuse)):
            with m.If(event):
                m.d.sync += irq_st[n].eq(1)
            with m.Elif(irq_clear[n]):
                m.d.sync += irq_st[n].eq(0)
        with m.If(self.trace_overflow):
            m.d.sync += trace_ovf.eq(1)
        with m.Elif(ovf_clear):
            m.d.sync += trace_ovf.eq(0)
        return m
