"""The sequencer: fetch, decode, scalar/control execution and dispatch.

It executes the program in order, one instruction at a time, in steps of one cycle
each, so that no path runs from the register file through the checks to the
dispatch in one cycle (timing, docs/fpga-timing.md): OPERANDS latches the instruction word
and the registers it names; SPANS and PRODUCTS (load, compute and store
instructions only) compute the ranges their partition checks need, factors first,
then products, and SPANS also decides the compares of registers that checks use
(a branch's condition, which is the branch's only extra step, and the
accumulator bound); CHECK runs every check, resolves
the queue entry, the scalar result and the next pc into registers, and fetches the
next instruction; FIRE dispatches (or faults) once the target queue has room, and
is also the next instruction's OPERANDS step (its operands read as this fire leaves
the registers). Two cycles per scalar or control instruction, three per branch,
four per queue instruction, when nothing waits; one more after a vargmax, or while
an operand waits for a vargmax result. Instructions do not overlap past OPERANDS, so the only
state that changes under an instruction in flight is a vargmax write-back, and
OPERANDS waits for those it names. The
scalar and control instructions (registers, compare, branches, hardware loops,
region marks, partition-table select, tag invalidation) run here; load, compute and
store instructions are *resolved* (registers read, defaults applied, partition
offsets translated to absolute scratchpad addresses) and dispatched into the three
decoupled queues (:mod:`hdl.queues`).

The core here (the run's state machine, the steps, the register file, the decode of
each instruction and the choice of its fault) drives the sub-components of
:mod:`hdl.seq`: :class:`~hdl.seq.loops.LoopStack`, :class:`~hdl.seq.regions.RegionMeters`
(region stack, meters and trace records), :class:`~hdl.seq.tokens.TokenCounters`,
:class:`~hdl.seq.bounds.BoundsConfig` (the cfg registers the checks read),
:class:`~hdl.seq.spans.SpanChecker` (the partition checks' spans) and
:class:`~hdl.seq.dispatch.Dispatch` (the FIRE step).

Every check the golden model makes on an instruction happens here, at dispatch, in
the golden model's order: illegal encodings, operands out of range, partition and
accumulator bounds, token pops that can never be satisfied (the dispatch-time count
of pushes minus pops on each channel, exactly the golden model's token deques), loop
and region rules, pc bounds. A failing instruction is not dispatched; the run stops
once everything dispatched before it has finished, so the machine state equals the
golden model's. The only errors raised later are DMA bus errors (the queues report
them); then entries not yet started are flushed.

Decode tables come from :func:`firmware.isa.decoder_constants`, never hand-copied.
"""

from __future__ import annotations

import functools
import operator

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware import isa
from firmware.config import NPUConfig
from firmware.isa import CfgField, Cond, ErrorCode

from .depthwise import DwOp
from .partition import pt_check_signature
from .ports import ArrayOp, VectorOp
from .queues import (
    INSN_PC_BITS,
    PC_BITS,
    compute_entry_layout,
    load_entry_layout,
    store_entry_layout,
)
from .seq.bounds import BoundsConfig
from .seq.dispatch import Dispatch
from .seq.loops import LoopStack
from .seq.regions import TRACE_WORDS, RegionMeters
from .seq.spans import SpanChecker
from .seq.tokens import TokenCounters

DEC = isa.decoder_constants()
OPC = DEC["opcodes"]
NUM_CHECKS = 3
QUEUE_OPS = ("load", "store", "cfg", "wload", "gemm", "vbias", "vreq", "vreqb", "vadd", "vclip",
             "vmax", "vargmax", "vqtab", "dwload", "dwconv")
# The register-reading fields of each instruction, numbered in field order: (mnemonic,
# field) -> read slot. ``rd`` fields are written, never read.
SLOT_OF = {(mn, name): k for mn, fields in DEC["fields"].items()
           for k, name in enumerate(n for n, (_, _, kind) in fields.items()
                                    if kind == "reg" and n != "rd")}
READ_SLOTS = 1 + max(SLOT_OF.values())


def field(word, mnemonic: str, name: str):
    """The operand ``name`` of ``mnemonic`` in ``word``, as the ISA defines it."""
    lo, bits, kind = DEC["fields"][mnemonic][name]
    raw = word[lo:lo + bits]
    if kind == "sint":
        return raw.as_signed()
    if kind == "count":
        return raw + 1
    return raw


def _cond(cond, a, b):
    """Value of ``Cond`` ``cond`` for 32-bit registers ``a``, ``b``."""
    sa, sb = a.as_signed(), b.as_signed()
    table = {
        Cond.ALWAYS: Const(1), Cond.EQ: a == b, Cond.NE: a != b, Cond.LT: sa < sb,
        Cond.GE: sa >= sb, Cond.LTU: a < b, Cond.GEU: a >= b,
    }
    return Array(table[c] for c in Cond)[cond[:3]]


class Sequencer(wiring.Component):
    """Fetch, decode, execute scalar/control instructions and dispatch the rest.

    Members
    -------
    start : In(1)
        Pulse: start a run at pc 0 of the active bank (ignored while busy).
    args : In(32).array(7)
        Initial r1..r7.
    cycle_budget : In(32)
        Cycles a run may take before it stops with TIMEOUT (0: unlimited).
    busy, done : Out(1)
        A run is in progress; pulse when it has finished (with or without error).
    error_code, error_pc, error_addr : Out
        Outcome of the last run (held until the next run ends).
    regs : Out(32).array(16)
        Scalar registers.
    imem_addr, imem_en : Out, imem_data : In(64), imem_pre : In(PREDECODE)
        Fetch port of the active instruction bank (one cycle read latency): the word
        and its :func:`predecode`, stored beside it.
    chk : Out(hdl.partition.pt_check_signature).array(3)
        Partition range checks (the table's lookup is registered: see
        :func:`hdl.partition.pt_check_signature`).
    pt_set : Out(2)
        Selected partition-table set (``ptsel``; 0 at the start of every run).
    tinv_en, tinv_slot : Out
        ``tinv``: invalidate a tag slot (0: all).
    load, compute, store : Out(streams of queue entries)
    load_idle, compute_idle, store_idle : In(1)
    rd_we, rd_index, rd_value : In
        vargmax write-back from the compute queue.
    queue_error, queue_error_pc, queue_error_addr : In
        A DMA bus error (pulse).
    run_start, flush : Out(1)
        Pulse at the start of a run (queues, vector unit); drop queued entries.
    ev_* : event inputs/outputs for the performance counters and region meters
        (``ev_stall_room``: the part of ``ev_stall`` that waits for room in a queue).
    trace_valid, trace_record : Out
        A region record (firmware.regs.TRACE_FIELDS words) to push.
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        self._ibits = max(1, ceil_log2(config.imem_depth))
        super().__init__({
            "start": In(1),
            "args": In(32).array(7),
            "cycle_budget": In(32),
            "busy": Out(1), "done": Out(1),
            "error_code": Out(8), "error_pc": Out(16), "error_addr": Out(32),
            "regs": Out(32).array(16),
            "imem_addr": Out(self._ibits), "imem_en": Out(1), "imem_data": In(64),
            "imem_pre": In(PREDECODE),
            "chk": Out(pt_check_signature(config)).array(NUM_CHECKS),
            "pt_set": Out(2),
            "tinv_en": Out(1), "tinv_slot": Out(6),
            "load": Out(stream.Signature(load_entry_layout(config))),
            "compute": Out(stream.Signature(compute_entry_layout(config))),
            "store": Out(stream.Signature(store_entry_layout(config))),
            "load_idle": In(1), "compute_idle": In(1), "store_idle": In(1),
            "rd_we": In(1), "rd_index": In(4), "rd_value": In(32),
            "queue_error": In(1), "queue_error_pc": In(INSN_PC_BITS), "queue_error_addr": In(32),
            "run_start": Out(1), "flush": Out(1),
            # events
            "ev_instr": Out(1), "ev_region": Out(1), "ev_misspec": Out(1),
            "ev_stall": Out(1), "ev_stall_room": Out(1), "ev_run": Out(1), "ev_error": Out(1),
            "ev_macs": In(16), "ev_read_bytes": In(16), "ev_write_bytes": In(16),
            "ev_hit": In(1), "ev_miss": In(1),
            "ev_busy_load": In(1), "ev_busy_store": In(1), "ev_busy_array": In(1),
            "ev_busy_vector": In(1), "ev_sp_conflicts": In(3),
            "trace_valid": Out(1), "trace_record": Out(32).array(TRACE_WORDS),
        })

    # ------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        depth = cfg.imem_depth

        m.submodules.loops = loops = LoopStack(depth=cfg.loop_depth, pc_bits=PC_BITS)
        m.submodules.regions = regions = RegionMeters(depth=cfg.region_depth)
        m.submodules.tokens = tokens = TokenCounters()
        m.submodules.bounds = bounds = BoundsConfig()
        m.submodules.spans = spans = SpanChecker(cfg, checks=NUM_CHECKS)
        m.submodules.dispatch = dispatch = Dispatch(cfg)
        for i in range(NUM_CHECKS):
            wiring.connect(m, wiring.flipped(self.chk[i]), spans.chk[i])
        for q in ("load", "compute", "store"):
            wiring.connect(m, wiring.flipped(getattr(self, q)), getattr(dispatch, q))
            m.d.comb += getattr(dispatch, f"{q}_idle").eq(getattr(self, f"{q}_idle"))

        # The instruction in flight: latched from the fetch port in OPERANDS.
        word = Signal(64)
        opcode = word[isa.OPCODE_LO:isa.OPCODE_LO + isa.OPCODE_BITS]
        toks = word[isa.TOKENS_LO:isa.TOKENS_LO + isa.TOKENS_BITS]

        # ---- architectural state of a run ---------------------------------------
        pc = Signal(PC_BITS)
        regs = Array(Signal(32, name=f"r{i}") for i in range(isa.NUM_REGS))
        pending = Signal(isa.NUM_REGS)  # vargmax results not yet written
        # Operands: an instruction reads at most READ_SLOTS registers. Each field it
        # reads has a slot (SLOT_OF), so the register file has READ_SLOTS read ports,
        # not one per field position of the ISA; OPERANDS latches them.
        opnd = [Signal(32, name=f"opnd{k}") for k in range(READ_SLOTS)]
        run_cycles = Signal(32)
        pt_set = Signal(2)
        m.d.comb += self.pt_set.eq(pt_set)
        for i in range(isa.NUM_REGS):
            m.d.comb += self.regs[i].eq(regs[i])

        # Weight-tile shapes of the two weight buffers, and which one is active.
        wk = Array(Signal(range(cfg.rows + 1), name=f"wk{i}") for i in range(2))
        wn = Array(Signal(range(cfg.cols + 1), name=f"wn{i}") for i in range(2))
        w_active = Signal()

        # The scalar write of the instruction in flight (resolved in CHECK, done at fire).
        wb_en = Signal()
        wb_rd = Signal(4)
        wb_value = Signal(32)
        wb_mul = Signal()

        # ---- run control --------------------------------------------------------
        OPERANDS, SPANS, PRODUCTS, CHECK, FIRE = range(5)
        stage = Signal(5, init=1)  # one-hot: the step of the instruction in flight (RUN)
        fire = dispatch.fire  # the current instruction completes its dispatch this cycle
        bad = dispatch.bad  # the instruction in FIRE faults (registered in CHECK)
        # What the instruction waits for in FIRE (decoded in CHECK, registered there).
        needs = dispatch.needs
        fault = Signal()
        fault_code = Signal(8)
        fault_addr = Signal(32)
        next_pc = Signal(PC_BITS)  # resolved in CHECK
        next_pc_q = Signal(PC_BITS)
        is_end = Signal()
        is_end_q = Signal()
        timeout = Signal()  # registered: the run has used its cycle budget
        # STOP waits on the idle flags a cycle late, as FIRE does (see Dispatch); a
        # drain takes a cycle more (the golden model's `drain`).
        idle_q = dispatch.idle

        err_code = Signal(8)
        err_pc = Signal(16)
        err_addr = Signal(32)
        m.d.comb += [self.error_code.eq(err_code), self.error_pc.eq(err_pc),
                     self.error_addr.eq(err_addr)]
        cur_code = Signal(8)  # error of the run in progress
        cur_pc = Signal(16)
        cur_addr = Signal(32)
        flushing = Signal()
        m.d.comb += self.flush.eq(flushing)

        # Meters run for every run; they wrap, and records hold differences.
        m.d.comb += [
            regions.cycles.eq(run_cycles),
            regions.macs.eq(self.ev_macs),
            regions.dram_read_bytes.eq(self.ev_read_bytes),
            regions.dram_write_bytes.eq(self.ev_write_bytes),
            regions.tag_hits.eq(self.ev_hit),
            regions.tag_misses.eq(self.ev_miss),
            regions.instructions.eq(fire),
            regions.stall_cycles.eq(self.ev_stall),
            regions.busy_load.eq(self.ev_busy_load),
            regions.busy_store.eq(self.ev_busy_store),
            regions.busy_array.eq(self.ev_busy_array),
            regions.busy_vector.eq(self.ev_busy_vector),
            regions.sp_conflicts.eq(self.ev_sp_conflicts),
            self.trace_valid.eq(regions.trace_valid),
            *[self.trace_record[i].eq(regions.trace_record[i]) for i in range(TRACE_WORDS)],
        ]

        clear_pending = Mux(self.rd_we, 1 << self.rd_index, 0)
        set_pending = Signal(isa.NUM_REGS)
        m.d.sync += pending.eq((pending & ~clear_pending) | set_pending)

        fsm_running = Signal()
        m.d.comb += self.imem_addr.eq(Mux(fsm_running, next_pc, 0))
        timeout_d = Signal()  # `timeout` next cycle, in RUN
        m.d.comb += timeout_d.eq((self.cycle_budget != 0) & (run_cycles >= self.cycle_budget))
        m.d.sync += timeout.eq(timeout_d)

        # The fetched word and its predecode (see `predecode`): the registers it names
        # (it waits in OPERANDS while any of them has a vargmax result in flight: reads
        # must see it, writes must land after it), the register each read slot reads,
        # whether it is legal and which steps it takes. Decoded when the word was
        # written, so the dispatch starts from the memory's outputs.
        live = self.imem_data
        live_opcode = live[isa.OPCODE_LO:isa.OPCODE_LO + isa.OPCODE_BITS]
        pre = self.imem_pre
        reg_wait = (pre.uses & pending[1:]) != 0
        # The registers the fetched word reads, one per slot (read once, shared by both
        # places that latch operands).
        slot_idx = [pre.slots[k] for k in range(READ_SLOTS)]
        slot_val = [Signal(32, name=f"slot{k}_val") for k in range(READ_SLOTS)]
        m.d.comb += [v.eq(regs[i]) for v, i in zip(slot_val, slot_idx, strict=True)]
        # Whether the fetched word is legal, latched with it (CHECK starts from a register).
        legal = Signal()
        legal_live = pre.legal
        wbad = Signal()  # operands_bad(), latched with the word
        live_queue_op = pre.queue_op
        # Queue instructions take two more steps: their partition spans. A branch takes
        # one (SPANS): its condition, a 32-bit compare of two registers, is registered
        # there, so CHECK's fault and next-pc logic start from a flag.
        after_operands = Mux(pre.spans, 1 << SPANS, 1 << CHECK)
        queue_op = Signal()  # latched with the word
        latch_word = Signal()  # the fetched word is latched this cycle

        with m.FSM(name="run") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += [self.run_start.eq(1), self.ev_run.eq(1)]
                    m.d.sync += [
                        pc.eq(0), pending.eq(0), run_cycles.eq(0), pt_set.eq(0),
                        stage.eq(1 << OPERANDS), timeout.eq(0),
                        w_active.eq(0), flushing.eq(0),
                        cur_code.eq(0), cur_pc.eq(0), cur_addr.eq(0),
                        *[wk[i].eq(0) for i in range(2)], *[wn[i].eq(0) for i in range(2)],
                    ]
                    m.d.comb += self.imem_en.eq(1)
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += run_cycles.eq(run_cycles + 1)
                # Stalled: waiting for a queue, the machine to drain or an operand (the
                # OPERANDS and CHECK cycles themselves are the dispatch, not a stall).
                m.d.comb += [self.ev_stall.eq(dispatch.waiting | (stage[OPERANDS] & reg_wait)),
                             self.ev_stall_room.eq(dispatch.waiting_room)]
                with m.If(self.queue_error):
                    m.d.sync += [cur_code.eq(ErrorCode.BUS_ERROR),
                                 cur_pc.eq(self.queue_error_pc),
                                 cur_addr.eq(self.queue_error_addr), flushing.eq(1)]
                    m.next = "STOP"
                with m.Elif(fault):
                    m.d.sync += [cur_code.eq(fault_code), cur_pc.eq(pc),
                                 cur_addr.eq(fault_addr)]
                    m.next = "STOP"
                with m.Elif(fire & is_end_q):
                    m.d.sync += cur_pc.eq(pc)  # a clean run reports the pc of its end
                    m.next = "FINISH"
                with m.Elif(fire):
                    m.d.sync += pc.eq(next_pc_q)
                # The step, the word and the operands are selected by `fire` last, outside
                # the chain above: `fire` comes from the queues' readies, and behind the
                # chain's conditions it would be three LUTs from these registers. In a
                # cycle that leaves RUN they change too, harmlessly: a start sets the
                # step and OPERANDS latches again.
                #
                # At a fire the next instruction, fetched in CHECK, has its OPERANDS step
                # this cycle, reading the registers as this fire leaves them, unless it
                # waits for a vargmax result (or this is a vargmax, whose result becomes
                # pending now). The word and operands are latched even when it waits
                # (OPERANDS latches them again until it does not): so the wait, decoded
                # from the memory's output, sets the next step only, not the enable of
                # every register the word loads.
                m.d.comb += latch_word.eq(Mux(fire, opcode != OPC["vargmax"], stage[OPERANDS]))
                with m.If(latch_word):
                    m.d.sync += [word.eq(live), legal.eq(legal_live), wbad.eq(pre.operands_bad),
                                 queue_op.eq(live_queue_op)]
                    m.d.sync += [sig.eq(Mux(fire, Mux(wb_en & (wb_rd == idx), wb_value, value),
                                            value))
                                 for sig, idx, value in zip(opnd, slot_idx, slot_val,
                                                            strict=True)]
                stage_word = Mux(reg_wait, 1 << OPERANDS, after_operands)  # of a latched word
                stage_stepped = Signal(5)
                with m.If(stage[OPERANDS]):
                    m.d.comb += stage_stepped.eq(stage_word)
                with m.Elif(stage[SPANS]):
                    m.d.comb += stage_stepped.eq(Mux(queue_op, 1 << PRODUCTS, 1 << CHECK))
                with m.Elif(stage[PRODUCTS]):
                    m.d.comb += stage_stepped.eq(1 << CHECK)
                with m.Else():  # CHECK, or FIRE waiting
                    m.d.comb += stage_stepped.eq(1 << FIRE)
                m.d.sync += stage.eq(Mux(fire, Mux(opcode != OPC["vargmax"], stage_word,
                                                   1 << OPERANDS), stage_stepped))
                # Fetch the next instruction in CHECK (its pc is resolved this cycle).
                # Outside the chain above on purpose: the chain's earlier conditions
                # depend on the fetched word (reg_wait), which would make a path from the
                # memory's output to its own enable. Fetching in a CHECK that goes to
                # STOP instead is harmless: nothing reads the word again before the next
                # start fetches pc 0.
                m.d.comb += self.imem_en.eq(stage[CHECK])
            with m.State("STOP"):
                # Let everything dispatched before the failing instruction finish.
                m.d.comb += self.busy.eq(1)
                with m.If(self.queue_error & (cur_code != ErrorCode.BUS_ERROR)):
                    m.d.sync += [cur_code.eq(ErrorCode.BUS_ERROR),
                                 cur_pc.eq(self.queue_error_pc),
                                 cur_addr.eq(self.queue_error_addr), flushing.eq(1)]
                with m.Elif(idle_q):
                    m.next = "FINISH"
            with m.State("FINISH"):
                m.d.comb += [self.done.eq(1), self.ev_error.eq(cur_code != 0)]
                m.d.sync += [err_code.eq(cur_code), err_pc.eq(cur_pc), err_addr.eq(cur_addr),
                             flushing.eq(0)]
                m.next = "IDLE"

        # ---- decode ------------------------------------------------------------------
        running = fsm.ongoing("RUN")
        m.d.comb += fsm_running.eq(running)
        spanning = running & stage[SPANS]  # the step that registers spans and compares
        resolving = running & stage[CHECK]
        for sub in (loops, regions, tokens, bounds):
            m.d.comb += sub.clear.eq(self.run_start)
        m.d.comb += [
            loops.pc.eq(pc), loops.resolve.eq(resolving), loops.fire.eq(fire),
            regions.id.eq(field(word, "region", "id")),
            tokens.flags.eq(toks), tokens.resolve.eq(resolving), tokens.fire.eq(fire),
            bounds.field.eq(field(word, "cfg", "field")),
            bounds.value.eq(field(word, "cfg", "value")),
            bounds.products.eq(running & stage[PRODUCTS]), bounds.resolve.eq(resolving),
            bounds.write.eq(fire & (opcode == OPC["cfg"])),
            spans.pool_extent.eq(bounds.pool_extent),
            spans.sample.eq(spanning), spans.multiply.eq(running & stage[PRODUCTS]),
            dispatch.resolve.eq(resolving), dispatch.error.eq(self.queue_error),
            dispatch.expire.eq(timeout_d), dispatch.expired.eq(timeout),
        ]

        def R(mn, name):
            return opnd[SLOT_OF[(mn, name)]]

        # ---- next pc, loops ------------------------------------------------------------
        advance = loops.advance

        # Which of the three next pcs an instruction takes (a branch's target, a loop's
        # end, else ``advance``) is latched with the word, decoded from the fetched
        # opcode: the next pc is the fetch address, and selected by the opcode in CHECK
        # it would make a path from the word register through the decode into the memory.
        pc_br = Signal()  # a branch: its target when taken
        pc_loop = Signal()  # a loop: its end when the count is 0
        pc_loopi = Signal()  # a loop with an immediate count
        with m.If(latch_word):
            m.d.sync += [pc_br.eq(live_opcode == OPC["br"]),
                         pc_loop.eq((live_opcode == OPC["loop"]) | (live_opcode == OPC["loopr"])),
                         pc_loopi.eq(live_opcode == OPC["loop"])]

        def do_advance():
            m.d.comb += loops.advances.eq(1)

        # ---- partition checks ------------------------------------------------------------
        chk = self.chk

        def check(i, p, offset, a, b, add=0, extra=False, a2=0, b2=0):
            """Partition check ``i`` of ``a * b + a2 * b2 + add`` bytes (+ the pooling
            extent; only check 0 has the second product)."""
            span = spans.span[i]
            m.d.comb += [span.p.eq(p), span.offset.eq(offset), span.a.eq(a), span.b.eq(b),
                         span.add.eq(add), span.extra.eq(extra)]
            if i == 0:
                m.d.comb += [spans.second.a.eq(a2), spans.second.b.eq(b2)]
            return chk[i].error

        def fail(cond, code, at=None):
            """Queue a fault of the instruction whose case is being built; among one
            instruction's faults, those listed earlier win (golden order). ``at``: the
            partition check whose offset a PARTITION_BOUNDS fault reports (golden
            reports the offset for bounds errors, 0 for a missing partition)."""
            faults.append((tuple(case_ops), cond, code, 0 if at is None else at + 1))

        faults: list = []
        case_ops: list = []

        def case(*mnemonics):
            case_ops[:] = [OPC[mn] for mn in mnemonics]
            return m.Case(*case_ops)

        # Effective strides for bounds checks.
        def eff(fld, n):
            name = fld.name.lower()
            return Mux(getattr(bounds.zero, name), n, getattr(bounds.values, name))

        # ---- per-instruction execution -----------------------------------------------
        entry_l = dispatch.load_entry
        entry_c = dispatch.compute_entry
        entry_s = dispatch.store_entry
        with m.If(resolving):
            m.d.sync += [is_end_q.eq(is_end), wb_en.eq(0)]  # an ALU case sets wb_en
            m.d.sync += next_pc_q.eq(next_pc)
        acc_rows = cfg.acc_rows
        acc_over = Signal()  # the accumulator rows run past acc_rows (decided in SPANS)

        def token_checks(queue):
            """TOKEN_DEADLOCK for pops with no dispatched push; count the tokens."""
            fail(getattr(tokens.deadlock, queue.value), ErrorCode.TOKEN_DEADLOCK)
            m.d.comb += getattr(tokens.queue, queue.value).eq(1)

        # The count (the loop instruction's, or its register's) and the end of a loop.
        end = field(word, "loop", "end")
        count = Mux(pc_loopi, field(word, "loop", "count"), R("loopr", "rs"))
        m.d.comb += [loops.end.eq(end), loops.count.eq(count)]
        # A branch's target and its condition, registered in SPANS.
        target = field(word, "br", "target")
        taken_q = Signal()
        m.d.comb += loops.target.eq(target)

        with m.Switch(opcode):
            # -- sequencer instructions --------------------------------------------------
            with case("nop", "misspec"):
                do_advance()
                m.d.comb += self.ev_misspec.eq(fire & (opcode == OPC["misspec"]))
            with case("end"):
                m.d.comb += [needs.idle.eq(1), is_end.eq(1)]
                fail(regions.open, ErrorCode.REGION)
            with case("li", "addi", "add", "sub", "mul", "cmp"):
                result = Signal(32)
                result_q = Signal(32)
                with m.Switch(opcode):
                    with m.Case(OPC["li"]):
                        m.d.comb += result.eq(field(word, "li", "imm"))
                    with m.Case(OPC["addi"]):
                        m.d.comb += result.eq(R("addi", "rs") + field(word, "addi", "imm"))
                    with m.Case(OPC["add"]):
                        m.d.comb += result.eq(R("add", "rs1") + R("add", "rs2"))
                    with m.Case(OPC["sub"]):
                        m.d.comb += result.eq(R("sub", "rs1") - R("sub", "rs2"))
                    with m.Case(OPC["mul"]):
                        pass  # see below
                    with m.Case(OPC["cmp"]):
                        m.d.comb += result.eq(_cond(field(word, "cmp", "cond"),
                                                    R("cmp", "rs1"), R("cmp", "rs2")))
                rd = Mux(opcode == OPC["li"], field(word, "li", "rd"),
                         Mux(opcode == OPC["addi"], field(word, "addi", "rd"),
                             field(word, "add", "rd")))
                # mul: the low 32 bits of the product from three 16x16 partial products
                # registered in CHECK and summed in FIRE (one DSP product per cycle).
                a, b = R("mul", "rs1"), R("mul", "rs2")
                pp = [Signal(32, name=f"mul_pp{i}") for i in range(3)]
                product = (pp[0] + ((pp[1] + pp[2]) << 16))[:32]
                with m.If(resolving):
                    m.d.sync += [result_q.eq(result), pp[0].eq(a[:16] * b[:16]),
                                 pp[1].eq(a[16:] * b[:16]), pp[2].eq(a[:16] * b[16:]),
                                 wb_en.eq(rd != 0), wb_rd.eq(rd),
                                 wb_mul.eq(opcode == OPC["mul"])]
                do_advance()
            with case("br"):
                # The condition and the loop-range compares are registered in SPANS (the
                # loop stack changes only at a fire) and hold through FIRE.
                taken = _cond(field(word, "br", "cond"), R("br", "rs1"), R("br", "rs2"))
                with m.If(spanning):
                    m.d.sync += taken_q.eq(taken)
                m.d.comb += loops.sample.eq(spanning)
                fail(taken_q & wbad, ErrorCode.PC_BOUNDS)  # the target is past the end
                fail(taken_q & loops.leaves & loops.leaves_two, ErrorCode.LOOP)
                with m.If(taken_q):
                    m.d.comb += loops.pop.eq(loops.leaves)
                with m.Else():
                    do_advance()
            with case("loop", "loopr"):
                fail(wbad, ErrorCode.PC_BOUNDS)  # the end is past the end
                fail(end <= pc + 1, ErrorCode.LOOP)
                fail(loops.nests_badly, ErrorCode.LOOP)
                fail(loops.full, ErrorCode.LOOP)
                m.d.comb += loops.push.eq(count != 0)
            with case("sync"):
                m.d.comb += needs.idle.eq(1)
                do_advance()
            with case("region"):
                m.d.comb += needs.idle.eq(1)
                is_begin = field(word, "region", "op") == isa.RegionOp.BEGIN
                fail(is_begin & regions.full, ErrorCode.REGION)
                fail(~is_begin & regions.mismatch, ErrorCode.REGION)
                do_advance()
                with m.If(fire):
                    with m.If(is_begin):
                        m.d.comb += [self.ev_region.eq(1), regions.begin.eq(1)]
                    with m.Else():
                        m.d.comb += regions.end.eq(1)
            with case("ptsel"):
                s = field(word, "ptsel", "set")
                fail(wbad, ErrorCode.BAD_OPERAND)  # no such set
                m.d.comb += needs.idle.eq(1)
                do_advance()
                with m.If(fire):
                    m.d.sync += pt_set.eq(s)
            with case("tinv"):
                slot = field(word, "tinv", "slot")
                fail(wbad, ErrorCode.BAD_OPERAND)  # no such slot
                m.d.comb += [needs.load_idle.eq(1), self.tinv_slot.eq(slot)]
                do_advance()
                with m.If(fire):
                    m.d.comb += self.tinv_en.eq(1)

            # -- load / store --------------------------------------------------------------
            for mn, queue, entry in (("load", isa.Queue.LOAD, entry_l),
                                     ("store", isa.Queue.STORE, entry_s)):
                with case(mn):
                    token_checks(queue)
                    rows, nb = field(word, mn, "rows"), field(word, mn, "bytes")
                    stride_r = field(word, mn, "stride")
                    offset = (R(mn, "sp") + field(word, mn, "off"))[:32]
                    if mn == "load":
                        tag = field(word, "load", "tag")
                        fail(wbad, ErrorCode.BAD_OPERAND)  # no such slot
                        m.d.comb += [entry.slot.eq(tag), entry.part.eq(field(word, mn, "p"))]
                    e = check(0, field(word, mn, "p"), offset, rows, nb)
                    fail(e != 0, e, at=0)
                    m.d.comb += [
                        entry.cmd.dram.eq(R(mn, "dram")),
                        entry.cmd.stride.eq(Mux(stride_r == 0, nb, R(mn, "stride"))),
                        entry.cmd.rows.eq(rows), entry.cmd.nbytes.eq(nb),
                        entry.cmd.sp.eq(chk[0].addr),
                        entry.tokens.eq(toks), entry.pc.eq(pc[:INSN_PC_BITS]),
                        needs[mn].eq(1),
                    ]
                    do_advance()

            # -- compute -------------------------------------------------------------------
            for mn in QUEUE_OPS[2:]:
                with case(mn):
                    token_checks(isa.Queue.COMPUTE)
                    self._compute(m, mn, word, R, check, fail, eff, bounds, entry_c, wk, wn,
                                  w_active, acc_rows, fire, set_pending, spanning, acc_over,
                                  wbad)
                    m.d.comb += [
                        entry_c.tokens.eq(toks),
                        needs.compute.eq(1),
                    ]
                    if self.config.acc_ports == 2:  # for the queue's overlap checks
                        c0 = self.chk[0]
                        m.d.comb += entry_c.last.eq(c0.addr + c0.addend + c0.nbytes - 1)
                    do_advance()

        # (An end or a faulting instruction fetches ``advance``, which nothing reads.)
        m.d.comb += next_pc.eq(Mux(pc_br & taken_q, target,
                                   Mux(pc_loop & (count == 0), end, advance)))

        # The register file's writes, one port per register: the start of a run (r1..r7
        # from ``args``, the others 0), a vargmax write-back, or the scalar write of a
        # fire (its value from registers only). The last two never hit the same register
        # in one cycle: an instruction that names a pending register waits. r0 is 0.
        m.d.comb += wb_value.eq(Mux(wb_mul, product, result_q))
        for i in range(1, isa.NUM_REGS):
            rd_hit = self.rd_we & (self.rd_index == i)
            with m.If(self.run_start):
                m.d.sync += regs[i].eq(self.args[i - 1] if i <= isa.NUM_ARG_REGS else 0)
            with m.Elif(rd_hit | (fire & wb_en & (wb_rd == i))):
                m.d.sync += regs[i].eq(Mux(rd_hit, self.rd_value, wb_value))

        # ---- faults (first listed wins), timeout, pc bounds, illegal ------------------------
        chain_code = Signal(8)  # from the groups' registered outcomes (FIRE)
        chain_at = Signal(range(NUM_CHECKS + 1))  # 1 + the check that failed, or 0
        chain = Signal()  # some group's fault (CHECK)
        # Each instruction's faults form a short priority chain; the opcode picks one
        # chain (a parallel select, not one chain through every instruction's faults).
        by_ops: dict = {}
        for ops, cond, code, at in faults:
            by_ops.setdefault(ops, []).append((cond, code, at))
        # The opcode group is decoded from the fetched word and latched with it (one flag
        # per group, at most one set), so the selection is an AND-OR of the groups'
        # chains rather than a decode of the word in CHECK. CHECK registers whether
        # the instruction faults and each group's own outcome (code, check); which
        # fault it is, and its address, are selected from those registers in FIRE,
        # where only the move to STOP reads them: through the selection and the code's
        # priority into registers, the chains would be too deep for one cycle.
        terms_hit, terms_code, terms_at = [], [], []
        for gi, (ops, items) in enumerate(by_ops.items()):
            grp = Signal(name=f"fault_group{gi}")
            with m.If(latch_word):
                m.d.sync += grp.eq(Cat(live_opcode == op for op in ops).any())
            g_hit, g_code, g_at = Signal(name=f"g{gi}_hit"), Signal(8, name=f"g{gi}_code"), \
                Signal.like(chain_at, name=f"g{gi}_at")
            for cond, code, at in reversed(items):
                with m.If(cond):
                    m.d.comb += [g_hit.eq(1), g_code.eq(code), g_at.eq(at)]
            q_code, q_at = Signal.like(g_code, name=f"g{gi}_code_q"), \
                Signal.like(g_at, name=f"g{gi}_at_q")
            with m.If(resolving):
                m.d.sync += [q_code.eq(g_code), q_at.eq(g_at)]
            terms_hit.append(grp & g_hit)
            terms_code.append(Mux(grp, q_code, 0))
            terms_at.append(Mux(grp, q_at, 0))
        m.d.comb += [chain.eq(Cat(terms_hit).any()),
                     chain_code.eq(functools.reduce(operator.or_, terms_code)),
                     chain_at.eq(functools.reduce(operator.or_, terms_at))]
        # CHECK registers whether it faults (Dispatch's `bad`); FIRE acts on it, and
        # selects which fault from registers (``pc`` and ``legal`` hold until the fire).
        pc_out = pc >= depth
        bad_code = Signal(8)
        bad_at = Signal.like(chain_at)  # the check whose offset the fault reports, + 1
        m.d.comb += [
            dispatch.fault.eq(pc_out | ~legal | chain),
            bad_code.eq(Mux(pc_out, ErrorCode.PC_BOUNDS,
                            Mux(~legal, ErrorCode.ILLEGAL_INSTRUCTION, chain_code))),
            bad_at.eq(Mux(pc_out | ~legal | (chain_code != ErrorCode.PARTITION_BOUNDS),
                          0, chain_at)),
        ]
        with m.If(running):
            with m.If(timeout):
                m.d.comb += [fault.eq(1), fault_code.eq(ErrorCode.TIMEOUT)]
            with m.Elif(stage[FIRE] & bad):
                # The checks' offsets hold until the next instruction's SPANS step.
                bad_addr = Array([Const(0, 32)] + [c.offset for c in chk])[bad_at]
                m.d.comb += [fault.eq(1), fault_code.eq(bad_code), fault_addr.eq(bad_addr)]
        m.d.comb += self.ev_instr.eq(fire)
        return m

    # ------------------------------------------------------------------------------------
    def _compute(self, m, mn, word, R, check, fail, eff, bounds, entry, wk, wn, w_active,
                 acc_rows, fire, set_pending, spanning, acc_over, wbad):
        """Resolve and check one compute-queue instruction (golden order of checks).
        ``wbad``: its operands_bad(), latched with the word."""
        arr, vec, dw = entry.arr, entry.vec, entry.dw
        fieldof = lambda name: field(word, mn, name)  # noqa: E731

        def offset(reg, imm=True):
            base = R(mn, reg)
            return (base + fieldof("off"))[:32] if imm else base

        def acc_check(m_rows):
            # Decided in SPANS (a 32-bit add and compare of a register), used in CHECK.
            first = R(mn, "acc")
            with m.If(spanning):
                m.d.sync += acc_over.eq(first + m_rows > acc_rows)
            fail(acc_over, ErrorCode.ACC_BOUNDS)
            return first

        def rows_span(stride, n, extra=False):
            """Bytes from the first row's start to the last row's end, (m - 1) * stride + n,
            as check() factors (the raw `m` field is m - 1)."""
            lo, bits, _ = DEC["fields"][mn]["m"]
            return word[lo:lo + bits], stride, n, extra

        if mn == "cfg":
            fld = fieldof("field")
            value = fieldof("value")
            fail(wbad, ErrorCode.BAD_OPERAND)  # the value is out of the field's range
            m.d.comb += [entry.vector.eq(1), vec.op.eq(VectorOp.CFG), vec.field.eq(fld),
                         vec.value.eq(value)]
        elif mn == "wload":
            k, n = fieldof("k"), fieldof("n")
            fail(wbad, ErrorCode.BAD_OPERAND)  # k or n larger than the array
            off = offset("sp")
            e = check(0, fieldof("p"), off, k, n)
            fail(e != 0, e, at=0)
            m.d.comb += [arr.op.eq(ArrayOp.WLOAD), arr.sp.eq(self.chk[0].addr),
                         arr.k.eq(k), arr.n.eq(n)]
            with m.If(fire):
                m.d.sync += [wk[~w_active].eq(k), wn[~w_active].eq(n)]
        elif mn == "gemm":
            swap = fieldof("swap")
            active = w_active ^ swap
            k, n = wk[active], wn[active]
            mr = fieldof("m")
            fail(k == 0, ErrorCode.BAD_OPERAND)
            first = acc_check(mr)
            off = offset("sp")
            stride = eff(CfgField.GEMM_STRIDE, k)
            e = check(0, fieldof("p"), off, *rows_span(stride, k))
            fail(e != 0, e, at=0)
            m.d.comb += [arr.op.eq(ArrayOp.GEMM), arr.sp.eq(self.chk[0].addr),
                         arr.stride.eq(stride), arr.k.eq(k), arr.n.eq(n), arr.m.eq(mr),
                         arr.acc.eq(first), arr.accumulate.eq(fieldof("mode")),
                         arr.swap.eq(swap)]
            with m.If(fire):
                m.d.sync += w_active.eq(active)
        elif mn in ("vbias", "vreq"):
            mr, n = fieldof("m"), fieldof("n")
            fail(wbad, ErrorCode.BAD_OPERAND)  # n larger than the array
            first = acc_check(mr)
            off = offset("sp")
            if mn == "vbias":
                e = check(0, fieldof("p"), off, n, 4)
            else:
                e = check(0, fieldof("p"), off, *rows_span(eff(CfgField.OUT_STRIDE, n), n))
            fail(e != 0, e, at=0)
            m.d.comb += [entry.vector.eq(1),
                         vec.op.eq(VectorOp.BIAS if mn == "vbias" else VectorOp.REQ),
                         vec.acc.eq(first), vec.m.eq(mr), vec.n.eq(n)]
            m.d.comb += (vec.a if mn == "vbias" else vec.d).eq(self.chk[0].addr)
            if mn == "vreq":
                m.d.comb += vec.tab.eq(fieldof("tab"))
        elif mn == "vreqb":
            mr, n = fieldof("m"), fieldof("n")
            fail(wbad, ErrorCode.BAD_OPERAND)  # n larger than the array
            first = acc_check(mr)
            ed = check(0, fieldof("p"), R(mn, "sp"),
                       *rows_span(eff(CfgField.OUT_STRIDE, n), n))
            fail(ed != 0, ed, at=0)
            col = fieldof("col")  # n bias words (one per column), not m (one per row)
            rows, _, _, _ = rows_span(4, 4)
            eb = check(1, fieldof("pb"), R(mn, "b"), Mux(col, n, rows), 4, Mux(col, 0, 4))
            fail(eb != 0, eb, at=1)
            m.d.comb += [entry.vector.eq(1), vec.op.eq(VectorOp.REQB),
                         vec.d.eq(self.chk[0].addr), vec.b.eq(self.chk[1].addr),
                         vec.acc.eq(first), vec.m.eq(mr), vec.n.eq(n),
                         vec.tab.eq(fieldof("tab")), vec.col.eq(col)]
        elif mn == "vqtab":
            n = fieldof("n")
            fail(wbad, ErrorCode.BAD_OPERAND)  # n larger than the array
            e = check(0, fieldof("p"), offset("sp"), n, isa.QTAB_ENTRY_BYTES)
            fail(e != 0, e, at=0)
            m.d.comb += [entry.vector.eq(1), vec.op.eq(VectorOp.QTAB),
                         vec.a.eq(self.chk[0].addr), vec.n.eq(n), vec.m.eq(1)]
        elif mn == "vadd":
            mr, n = fieldof("m"), fieldof("n")
            src = rows_span(eff(CfgField.IN_STRIDE, n), n)
            ea = check(0, fieldof("pa"), R(mn, "a"), *src)
            fail(ea != 0, ea, at=0)
            eb = check(1, fieldof("pb"), R(mn, "b"), *src)
            fail(eb != 0, eb, at=1)
            ed = check(2, fieldof("pd"), R(mn, "d"),
                       *rows_span(eff(CfgField.OUT_STRIDE, n), n))
            fail(ed != 0, ed, at=2)
            m.d.comb += [entry.vector.eq(1), vec.op.eq(VectorOp.ADD),
                         vec.a.eq(self.chk[0].addr), vec.b.eq(self.chk[1].addr),
                         vec.d.eq(self.chk[2].addr), vec.m.eq(mr), vec.n.eq(n)]
        elif mn in ("vclip", "vmax"):
            mr, n = fieldof("m"), fieldof("n")
            if mn == "vclip":
                src = rows_span(eff(CfgField.IN_STRIDE, n), n)
            else:
                src = rows_span(bounds.values.pool_istride, n, extra=True)
            es = check(0, fieldof("ps"), R(mn, "s"), *src)
            fail(es != 0, es, at=0)
            ed = check(1, fieldof("pd"), R(mn, "d"),
                       *rows_span(eff(CfgField.OUT_STRIDE, n), n))
            fail(ed != 0, ed, at=1)
            m.d.comb += [entry.vector.eq(1),
                         vec.op.eq(VectorOp.CLIP if mn == "vclip" else VectorOp.MAX),
                         vec.a.eq(self.chk[0].addr), vec.d.eq(self.chk[1].addr),
                         vec.m.eq(mr), vec.n.eq(n)]
        elif mn == "vargmax":
            n = fieldof("n")
            off = offset("s")
            e = check(0, fieldof("p"), off, n, 1)
            fail(e != 0, e, at=0)
            rd = fieldof("rd")
            m.d.comb += [entry.vector.eq(1), vec.op.eq(VectorOp.ARGMAX),
                         vec.a.eq(self.chk[0].addr), vec.n.eq(n), vec.m.eq(1), entry.rd.eq(rd)]
            with m.If(fire & (rd != 0)):
                m.d.comb += set_pending.eq(1 << rd)
        elif mn == "dwload":
            fail(wbad, ErrorCode.BAD_OPERAND)  # no depthwise engine
            e = check(0, fieldof("p"), offset("sp"), isa.DW_LOAD_WINDOWS, self.config.cols)
            fail(e != 0, e, at=0)
            m.d.comb += [entry.depthwise.eq(1), dw.op.eq(DwOp.LOAD), dw.sp.eq(self.chk[0].addr),
                         arr.sp.eq(self.chk[0].addr)]
        elif mn == "dwconv":
            raw = {name: word[lo:lo + bits] for name, (lo, bits, _) in DEC["fields"][mn].items()}
            h, mo, n = fieldof("h"), fieldof("m"), fieldof("n")
            s, kh, kw = fieldof("s"), fieldof("kh"), fieldof("kw")
            fail(wbad, ErrorCode.BAD_OPERAND)  # kernel, lanes or input rows too large
            rows_out = h * mo
            first = acc_check(rows_out)
            pix, row = eff(CfgField.GEMM_STRIDE, n), eff(CfgField.IN_STRIDE, n)
            pt, pb, pl, pr = (fieldof(k) for k in ("pt", "pb", "pl", "pr"))
            # the input's rows and columns past its first: (h-1)*s + kh - 1 - pt - pb,
            # (m-1)*s + kw - 1 - pl - pr
            rows_past = (raw["h"] << raw["s"]) + raw["kh"] - pt - pb
            cols_past = (raw["m"] << raw["s"]) + raw["kw"] - pl - pr
            e = check(0, fieldof("p"), R(mn, "sp"), cols_past, pix, n, a2=rows_past, b2=row)
            fail(e != 0, e, at=0)
            m.d.comb += [entry.depthwise.eq(1), dw.op.eq(DwOp.CONV), dw.sp.eq(self.chk[0].addr),
                         dw.pix.eq(pix), dw.row.eq(row), dw.m.eq(mo), dw.h.eq(h),
                         dw.acc.eq(first), dw.accumulate.eq(fieldof("mode")),
                         dw.s.eq(s), dw.kh.eq(kh), dw.kw.eq(kw), dw.n.eq(n),
                         dw.pt.eq(pt), dw.pb.eq(pb), dw.pl.eq(pl), dw.pr.eq(pr),
                         # its reads and rows where the queue's overlap checks look
                         arr.sp.eq(self.chk[0].addr), arr.acc.eq(first), arr.m.eq(rows_out)]
        else:  # pragma: no cover
            raise AssertionError(mn)


PREDECODE = data.StructLayout({
    # registers r1..r15 the word names, read or written (bit i - 1: r0 is never pending)
    "uses": unsigned(isa.NUM_REGS - 1),
    "slots": data.ArrayLayout(unsigned(4), READ_SLOTS),  # the register each slot reads
    "legal": unsigned(1),  # a legal encoding of this ISA version
    "queue_op": unsigned(1),  # dispatched to a queue: takes SPANS and PRODUCTS
    "spans": unsigned(1),  # takes SPANS (queue instructions and br)
    "operands_bad": unsigned(1),  # operands out of this build's range (operands_bad())
})
"""What the dispatch needs of an instruction word at once, decoded when the word is
written into the instruction memory and stored beside it (:func:`predecode`). The
all-zero word (never written) is illegal, and so is an all-zero predecode."""


def operands_bad(word, mn: str, config: NPUConfig):
    """The faults of ``mn`` that its ``word`` alone decides, ORed: operands out of
    ``config``'s range (BAD_OPERAND; PC_BOUNDS for a loop's end and a branch's
    target, which a branch reports only when taken). None if it has none. Decoded
    into the predecode, so CHECK reads a flag instead of comparing fields."""
    def f(name):
        return field(word, mn, name)
    if mn == "ptsel":
        return f("set") >= config.pt_sets
    if mn == "tinv":
        return f("slot") > config.tag_slots
    if mn == "load":
        return f("tag") > config.tag_slots
    if mn == "cfg":
        # One term per field, ORed (a balanced tree, not a chain of muxes).
        fld, value = f("field"), f("value")
        return Cat((fld == int(c)) & ((value < lo) | (value > hi))
                   for c, (_, lo, hi) in isa.CFG_RANGE.items()).any()
    if mn == "wload":
        return (f("k") > config.rows) | (f("n") > config.cols)
    if mn in ("vbias", "vreq", "vreqb", "vqtab"):
        return f("n") > config.cols
    if mn == "dwload":
        return Const(int(config.dw_rows == 0), 1)
    if mn == "dwconv":
        rows_in = (f("h") - 1) * f("s") + f("kh")
        cols_in = (f("m") - 1) * f("s") + f("kw")
        return ((f("kh") > isa.DW_KERNEL) | (f("kw") > isa.DW_KERNEL) | (f("n") > config.cols)
                | (rows_in > config.dw_rows) | (rows_in <= f("pt") + f("pb"))
                | (cols_in <= f("pl") + f("pr")))
    if mn in ("loop", "loopr"):
        return f("end") >= config.imem_depth + 1
    if mn == "br":
        return f("target") >= config.imem_depth
    return None


def predecode(m: Module, word, config: NPUConfig) -> data.View:
    """The :data:`PREDECODE` fields of the 64-bit ``word`` for the NPU build
    ``config``, as logic in ``m``.

    The instruction memory computes them on its write port, from the CSR block's
    registers; fetched, they save the dispatch the decode of the word, so that no path
    runs from the memory through this decode into the step and operand registers.
    """
    pre = Signal(PREDECODE)
    with m.Switch(word[isa.OPCODE_LO:isa.OPCODE_LO + isa.OPCODE_BITS]):
        for mn, code in OPC.items():
            with m.Case(code):
                named = [n for n, (_, _, k) in DEC["fields"][mn].items() if k == "reg"]
                if named:
                    m.d.comb += pre.uses.eq(_or_shifts(word, mn, named)[1:])
                for (mn_, n), k in SLOT_OF.items():
                    if mn_ == mn:
                        lo, bits, _ = DEC["fields"][mn][n]
                        m.d.comb += pre.slots[k].eq(word[lo:lo + bits])
                m.d.comb += [pre.queue_op.eq(mn in QUEUE_OPS),
                             pre.spans.eq(mn in QUEUE_OPS or mn == "br")]
                bad = operands_bad(word, mn, config)
                if bad is not None:
                    m.d.comb += pre.operands_bad.eq(bad)
    m.d.comb += pre.legal.eq(_legal(m, word))
    return pre


def _legal(m, word):
    """A signal that is 1 when ``word`` is a legal encoding: a known opcode of this ISA
    version, no bits outside its operands or legal tokens, enums in range."""
    known, fields_ok, legal = Signal(), Signal(), Signal()
    payload = word[:isa.TOKENS_LO]
    toks = word[isa.TOKENS_LO:isa.TOKENS_LO + isa.TOKENS_BITS]
    with m.Switch(word[isa.OPCODE_LO:isa.OPCODE_LO + isa.OPCODE_BITS]):
        for mn, code in OPC.items():
            with m.Case(code):
                ok = (payload & ~DEC["operand_masks"][mn]) == 0
                ok &= (toks & ~DEC["legal_tokens"][mn]) == 0
                for name, (lo, bits, kind) in DEC["fields"][mn].items():
                    if kind == "enum":
                        enum = isa.BY_MNEMONIC[mn].field(name).enum
                        if len(enum) < (1 << bits):
                            ok &= word[lo:lo + bits] < len(enum)
                m.d.comb += [known.eq(1), fields_ok.eq(ok)]
    version = word[isa.VERSION_LO:isa.VERSION_LO + isa.VERSION_BITS]
    m.d.comb += legal.eq(fields_ok & known & (version == isa.ISA_VERSION))
    return legal


def _or_shifts(word, mn, names):
    """Bitmask of the registers named by fields ``names`` of ``mn``."""
    mask = Const(0, isa.NUM_REGS)
    for n in names:
        mask = mask | (Const(1, isa.NUM_REGS) << field(word, mn, n))[:isa.NUM_REGS]
    return mask


__all__ = ["Sequencer", "field", "predecode", "PREDECODE", "NUM_CHECKS", "TRACE_WORDS"]
