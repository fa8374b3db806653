"""The three decoupled instruction queues: load, compute and store.

The sequencer dispatches resolved instructions into these queues in program order.
Each queue executes its own instructions in order and synchronizes with its
neighbours only through dependency tokens (the approach VTA uses): a *pop* waits at
the head of the queue until the neighbour has pushed a token on that channel, a
*push* is sent once the instruction has completed. The token counts live in the
consumer; the producer sends one-cycle pulses.

Token flags follow :class:`firmware.isa.Token` (``POP_PREV``, ``POP_NEXT``,
``PUSH_PREV``, ``PUSH_NEXT``), relative to the pipeline load -> compute -> store.

Errors: the queues never see an illegal instruction (the sequencer checks every
operand at dispatch); a DMA bus error is reported with the instruction's pc and the
failing DRAM row address. ``flush`` drops entries that have not started (used after a
bus error); instructions already running in an engine always finish.
"""

from __future__ import annotations

import enum

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig
from firmware.isa import Token

from .depthwise import DwOp, dw_command_layout
from .ports import (
    DMA_DONE_LAYOUT,
    ArrayOp,
    VectorOp,
    acc_addr_bits,
    array_command_layout,
    command_stream,
    dma_command_layout,
    sp_addr_bits,
    vector_command_layout,
)
from .tags import tag_key_layout

TOKEN_COUNT_BITS = 16
PC_BITS = 17  # one more than the 16-bit targets, so pc == imem_depth is representable
INSN_PC_BITS = 16  # the pc of a dispatched instruction: always < imem_depth <= 65536


def load_entry_layout(config: NPUConfig) -> data.StructLayout:
    """A load-queue entry: the DMA command plus tag slot, partition and tokens."""
    return data.StructLayout({
        "cmd": dma_command_layout(config),
        "slot": 6,  # tile-tag slot, 0: untagged
        "part": 3,  # partition (hit/miss counters are per partition)
        "tokens": 4,
        "pc": INSN_PC_BITS,
    })


def store_entry_layout(config: NPUConfig) -> data.StructLayout:
    return data.StructLayout({
        "cmd": dma_command_layout(config),
        "tokens": 4,
        "pc": INSN_PC_BITS,
    })


def compute_entry_layout(config: NPUConfig) -> data.StructLayout:
    """A compute-queue entry: an array, vector or depthwise command, plus tokens.

    ``rd`` is the destination register of a ``vargmax``. With two accumulator read
    ports, ``last`` is the last scratchpad byte (absolute) of the instruction's first
    span: what a ``wload``, ``gemm``, ``dwload`` or ``dwconv`` reads, what a ``vreq``
    or ``vreqb`` writes. A depthwise entry repeats its first byte read in ``arr.sp``
    and (a ``dwconv``) its accumulator rows in ``arr.acc`` and ``arr.m``, for the
    same checks.
    """
    fields = {
        "vector": 1,
        "depthwise": 1,
        "dw": dw_command_layout(config),
        "arr": array_command_layout(config),
        "vec": vector_command_layout(config),
        "rd": 4,
        "tokens": 4,
    }
    if config.acc_ports == 2:
        fields["last"] = sp_addr_bits(config)
    return data.StructLayout(fields)


def _entry_fifo(m, entry, layout, depth):
    """The queue's entry FIFO, filled from the dispatch stream ``entry``.

    Returns the FIFO and a view of its head entry.
    """
    # A queue's idle flag counts the FIFO's level, not r_rdy: an entry shows in the
    # level the cycle after its write (r_rdy a cycle later), which the sequencer's
    # registered idle flags rely on (hdl/sequencer.py).
    q = fifo.SyncFIFOBuffered(width=data.Layout.cast(layout).size, depth=depth)
    m.submodules.fifo = q
    m.d.comb += [q.w_data.eq(entry.payload), q.w_en.eq(entry.valid), entry.ready.eq(q.w_rdy)]
    return q, data.View(layout, q.r_data)


def _dma_queue_front(m, q, head, cur, flush, pops, tokens, take, first_state, wait_token):
    """IDLE state of a DMA queue: drop the head when flushing, otherwise take it into
    ``cur`` once its pop (if any) has a token, and go to ``first_state``; raise
    ``wait_token`` while the head waits for its token."""
    with m.State("IDLE"):
        with m.If(q.r_rdy & flush):
            m.d.comb += q.r_en.eq(1)
        with m.Elif(q.r_rdy & (~pops | tokens.available)):
            m.d.comb += [q.r_en.eq(1), take.eq(pops)]
            m.d.sync += cur.eq(head)
            m.next = first_state
        with m.Elif(q.r_rdy):
            m.d.comb += wait_token.eq(1)


def _dma_issue_and_wait(m, busy, dma_cmd, dma_done, on_done):
    """ISSUE and WAIT states of a DMA queue: hand the command to the DMA, wait for
    its completion, run ``on_done()`` (comb statements) in that cycle, go IDLE."""
    with m.State("ISSUE"):
        m.d.comb += [busy.eq(1), dma_cmd.valid.eq(1)]
        with m.If(dma_cmd.ready):
            m.next = "WAIT"
    with m.State("WAIT"):
        m.d.comb += busy.eq(1)
        with m.If(dma_done.valid):
            on_done()
            m.next = "IDLE"


class _TokenCounter:
    """Tokens received on one channel and not yet consumed (reset at run start)."""

    def __init__(self, m, name, pulse_in, take, run_start):
        self.count = Signal(TOKEN_COUNT_BITS, name=f"{name}_tokens")
        # `count != 0`, kept as a register: it gates the queue's pop, and compared from
        # the count it was the start of a routed board build's slow path into the FIFO.
        self.available = Signal(name=f"{name}_available")
        with m.If(run_start):
            m.d.sync += [self.count.eq(0), self.available.eq(0)]
        with m.Elif(pulse_in & ~take):
            m.d.sync += [self.count.eq(self.count + 1),
                         self.available.eq(self.count != (1 << TOKEN_COUNT_BITS) - 1)]
        with m.Elif(take & ~pulse_in):
            m.d.sync += [self.count.eq(self.count - 1), self.available.eq(self.count != 1)]


def _dma_done_signature():
    return stream.Signature(DMA_DONE_LAYOUT, always_ready=True)


class LoadQueue(wiring.Component):
    """The load queue: DRAM -> scratchpad transfers, with tile tags.

    A tagged load whose tag hits completes at once without a transfer (a hit);
    otherwise the slot is invalidated, the DMA runs, and on success the slot takes
    the new key (a miss). Hits and misses are reported per partition.

    Members
    -------
    entry : In(stream of load_entry_layout)
        Dispatched instructions.
    dma_cmd : Out(command stream), dma_done : In(completion stream)
        The DMA's load channel.
    tag_* : the tile-tag store's lookup, set and invalidate ports.
    tok_in : In(1)
        compute -> load token pulses. ``tok_out``: load -> compute pulses.
    run_start, flush : In(1)
        Reset the token count at the start of a run; drop entries not yet started.
    idle, busy : Out(1)
        Nothing queued or running; the head instruction is executing.
    wait_token : Out(1)
        The head instruction waits for its token (the ``stall_out_load`` counter:
        compute has not freed the buffer it loads into).
    hit, miss : Out(1), part : Out(3)
        Tag events for the per-partition counters.
    read_error : Out(1)
        Pulse: a transfer failed; ``error_pc`` and ``error_addr`` say where.
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        key = tag_key_layout(config)
        super().__init__({
            "entry": In(stream.Signature(load_entry_layout(config))),
            "dma_cmd": Out(command_stream(dma_command_layout(config))),
            "dma_done": In(_dma_done_signature()),
            "tag_slot": Out(6), "tag_key": Out(key), "tag_hit": In(1),
            "tag_set_en": Out(1), "tag_set_slot": Out(6), "tag_set_key": Out(key),
            "tag_inv_en": Out(1), "tag_inv_slot": Out(6),
            "tok_in": In(1), "tok_out": Out(1),
            "run_start": In(1), "flush": In(1),
            "idle": Out(1), "busy": Out(1), "wait_token": Out(1),
            "hit": Out(1), "miss": Out(1), "part": Out(3),
            "read_error": Out(1), "error_pc": Out(INSN_PC_BITS), "error_addr": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        layout = load_entry_layout(self.config)
        q, head = _entry_fifo(m, self.entry, layout, self.config.queue_depth)
        cur = Signal(layout)
        pops = head.tokens & Token.POP_NEXT != 0
        take = Signal()
        tokens = _TokenCounter(m, "c2l", self.tok_in, take, self.run_start)

        cmd = cur.cmd
        m.d.comb += [
            # The tag key has the DMA command's fields in its order (hdl.tags).
            self.tag_set_key.eq(cmd.as_value()),
            # The tag store's lookup is registered: it is made from the head as IDLE
            # takes it, and answers in CHECK.
            self.tag_key.eq(head.cmd.as_value()), self.tag_slot.eq(head.slot),
            self.tag_set_slot.eq(cur.slot),
            self.tag_inv_slot.eq(cur.slot),
            self.dma_cmd.payload.eq(cmd),
            self.part.eq(cur.part),
            self.error_pc.eq(cur.pc), self.error_addr.eq(self.dma_done.payload.addr),
        ]
        push = cur.tokens & Token.PUSH_NEXT != 0

        def done():
            err = self.dma_done.payload.error
            m.d.comb += [
                self.read_error.eq(err),
                self.tag_set_en.eq(~err & (cur.slot != 0)),
                self.miss.eq(~err & (cur.slot != 0)),
                # Push even after an error, so the other queues drain.
                self.tok_out.eq(push),
            ]

        with m.FSM():
            _dma_queue_front(m, q, head, cur, self.flush, pops, tokens, take, "CHECK",
                             self.wait_token)
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If((cur.slot != 0) & self.tag_hit):
                    m.d.comb += [self.hit.eq(1), self.tok_out.eq(push)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.tag_inv_en.eq(cur.slot != 0)
                    m.next = "ISSUE"
            _dma_issue_and_wait(m, self.busy, self.dma_cmd, self.dma_done, done)
        m.d.comb += self.idle.eq((q.level == 0) & ~self.busy)
        return m


class StoreQueue(wiring.Component):
    """The store queue: scratchpad -> DRAM transfers.

    Members
    -------
    entry, dma_cmd, dma_done, run_start, flush, idle, busy : as :class:`LoadQueue`.
    tok_in : In(1)
        compute -> store token pulses. ``tok_out``: store -> compute pulses.
    wait_token : Out(1)
        The head instruction waits for its token (the ``stall_in_store`` counter:
        compute has not produced the data it stores).
    write_error, error_pc, error_addr : Out
        A transfer failed.
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        super().__init__({
            "entry": In(stream.Signature(store_entry_layout(config))),
            "dma_cmd": Out(command_stream(dma_command_layout(config))),
            "dma_done": In(_dma_done_signature()),
            "tok_in": In(1), "tok_out": Out(1),
            "run_start": In(1), "flush": In(1),
            "idle": Out(1), "busy": Out(1), "wait_token": Out(1),
            "write_error": Out(1), "error_pc": Out(INSN_PC_BITS), "error_addr": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        layout = store_entry_layout(self.config)
        q, head = _entry_fifo(m, self.entry, layout, self.config.queue_depth)
        cur = Signal(layout)
        pops = head.tokens & Token.POP_PREV != 0
        take = Signal()
        tokens = _TokenCounter(m, "c2s", self.tok_in, take, self.run_start)
        push = cur.tokens & Token.PUSH_PREV != 0
        m.d.comb += [
            self.dma_cmd.payload.eq(cur.cmd),
            self.error_pc.eq(cur.pc), self.error_addr.eq(self.dma_done.payload.addr),
        ]
        def done():
            m.d.comb += [
                self.write_error.eq(self.dma_done.payload.error),
                self.tok_out.eq(push),  # also after an error, so the other queues drain
            ]

        with m.FSM():
            _dma_queue_front(m, q, head, cur, self.flush, pops, tokens, take, "ISSUE",
                             self.wait_token)
            _dma_issue_and_wait(m, self.busy, self.dma_cmd, self.dma_done, done)
        m.d.comb += self.idle.eq((q.level == 0) & ~self.busy)
        return m


class _Kind(enum.IntEnum):
    WLOAD = 0
    GEMM = 1
    VECTOR = 2
    DEPTHWISE = 3


class ComputeQueue(wiring.Component):
    """The compute queue: GEMM engine, vector unit and depthwise engine, in program order.

    Array commands stream back to back (the engine overlaps a ``wload`` with the
    gemms before it); a vector command waits until the array is idle and an array
    command until the vector unit is idle, because both share the accumulator and
    the scratchpad; a depthwise command waits for both, and both wait for it (it
    shares the accumulator, and the GEMM engine's scratchpad port). The accumulator
    belongs to whichever engine was issued last.

    With two accumulator read ports (``config.acc_ports``) an array or depthwise
    command may start while the vector unit runs a ``vreq`` or ``vreqb``: the queue
    keeps that instruction's accumulator rows and the scratchpad bytes it writes
    (registered as it is issued, valid while the unit is busy), and a ``wload``,
    ``gemm``, ``dwload`` or ``dwconv`` waits for the vector unit only where its
    scratchpad reads meet those bytes or (a ``gemm``, a ``dwconv``) its
    accumulator rows meet those rows. Nothing else overlaps: the vector unit still
    waits for the array and the depthwise engine, so the requantization never reads
    a row either writes, and neither reads a byte the vector unit has yet to
    write.
    Completions retire in program order, so a token is never pushed for an
    instruction before everything ahead of it in this queue has completed.

    Members
    -------
    entry : In(stream of compute_entry_layout)
    arr_cmd, vec_cmd, dw_cmd : Out(command streams) to the GEMM engine, the vector
        unit and the depthwise engine.
    arr_wload_done, arr_gemm_done, arr_idle, vec_done, vec_idle, dw_done, dw_idle : In(1)
        Engine completion pulses and idle flags (a build without the depthwise engine
        ties ``dw_idle`` high; the sequencer never dispatches to it).
    vec_result, vec_result_valid : In
        vargmax results, written back through ``rd_we``/``rd_index``/``rd_value``.
    acc_sel : Out(1)
        Accumulator owner (0: array or depthwise, 1: vector).
    dw_sel : Out(1)
        The depthwise engine, not the array, owns the accumulator's array port and
        the GEMM engine's scratchpad port.
    tok_in_load, tok_in_store : In(1)
        load -> compute and store -> compute pulses; ``tok_out_load``,
        ``tok_out_store``: compute -> load and compute -> store pulses.
    run_start, flush, idle, busy : as :class:`LoadQueue`.
    wait_load, wait_store : Out(1)
        The head instruction waits for its token from the load queue (its input data)
        or from the store queue (room for its output); the counters by cause.
    head_vector : Out(1)
        The head instruction is a vector command (else an array or depthwise one).
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        super().__init__({
            "entry": In(stream.Signature(compute_entry_layout(config))),
            "arr_cmd": Out(command_stream(array_command_layout(config))),
            "vec_cmd": Out(command_stream(vector_command_layout(config))),
            "dw_cmd": Out(command_stream(dw_command_layout(config))),
            "arr_wload_done": In(1), "arr_gemm_done": In(1), "arr_idle": In(1),
            "vec_done": In(1), "vec_idle": In(1),
            "dw_done": In(1), "dw_idle": In(1, init=1),
            "vec_result": In(32), "vec_result_valid": In(1),
            "rd_we": Out(1), "rd_index": Out(4), "rd_value": Out(32),
            "acc_sel": Out(1), "dw_sel": Out(1),
            "tok_in_load": In(1), "tok_in_store": In(1),
            "tok_out_load": Out(1), "tok_out_store": Out(1),
            "run_start": In(1), "flush": In(1),
            "idle": Out(1), "busy": Out(1),
            "wait_load": Out(1), "wait_store": Out(1), "head_vector": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        layout = compute_entry_layout(cfg)
        q, head = _entry_fifo(m, self.entry, layout, cfg.queue_depth)

        # In-flight instructions, in program order: (kind, push flags).
        inflight_layout = data.StructLayout({"kind": _Kind, "push_prev": 1, "push_next": 1})
        m.submodules.inflight = infl = fifo.SyncFIFO(
            width=data.Layout.cast(inflight_layout).size, depth=cfg.queue_depth)
        # Destination registers of issued vargmax instructions, in order.
        m.submodules.rds = rds = fifo.SyncFIFO(width=4, depth=cfg.queue_depth)

        pop_load = head.tokens & Token.POP_PREV != 0
        pop_store = head.tokens & Token.POP_NEXT != 0
        take = Signal()
        t_load = _TokenCounter(m, "l2c", self.tok_in_load, take & pop_load, self.run_start)
        t_store = _TokenCounter(m, "s2c", self.tok_in_store, take & pop_store, self.run_start)

        is_vec = head.vector
        is_dw = head.depthwise
        is_arr = ~is_vec & ~is_dw
        is_argmax = is_vec & (head.vec.op == VectorOp.ARGMAX)
        kind = Signal(_Kind)
        m.d.comb += kind.eq(_Kind.VECTOR)
        with m.If(is_dw):
            m.d.comb += kind.eq(_Kind.DEPTHWISE)
        with m.Elif(~is_vec):
            m.d.comb += kind.eq(_Kind.GEMM)
            with m.If(head.arr.op == ArrayOp.WLOAD):
                m.d.comb += kind.eq(_Kind.WLOAD)

        tokens_ok = (~pop_load | t_load.available) & (~pop_store | t_store.available)
        beside_vector = (self._beside_vector(m, head, is_vec) if cfg.acc_ports == 2
                         else Signal())
        hazard_ok = self.dw_idle & Mux(is_vec, self.arr_idle,
                                       Mux(is_dw, self.arr_idle, 1)
                                       & (self.vec_idle | beside_vector))
        room = infl.w_rdy & (~is_argmax | rds.w_rdy)
        present = q.r_rdy & ~self.flush & tokens_ok & hazard_ok & room
        waiting = q.r_rdy & ~self.flush
        m.d.comb += [
            self.wait_load.eq(waiting & pop_load & ~t_load.available),
            self.wait_store.eq(waiting & pop_store & ~t_store.available),
            self.head_vector.eq(is_vec),
        ]
        acc_sel, dw_sel = Signal(), Signal()
        m.d.comb += [
            self.arr_cmd.payload.eq(head.arr), self.vec_cmd.payload.eq(head.vec),
            self.dw_cmd.payload.eq(head.dw),
            self.arr_cmd.valid.eq(present & is_arr),
            self.vec_cmd.valid.eq(present & is_vec),
            self.dw_cmd.valid.eq(present & is_dw),
            self.acc_sel.eq(acc_sel), self.dw_sel.eq(dw_sel),
        ]
        # Both engines are idle-checked before presenting, so switching the owner
        # here is safe; engines touch the accumulator at the earliest one cycle
        # after accepting a command.
        with m.If(present):
            m.d.sync += [acc_sel.eq(is_vec), dw_sel.eq(is_dw)]
        issued = present & Mux(is_vec, self.vec_cmd.ready,
                               Mux(is_dw, self.dw_cmd.ready, self.arr_cmd.ready))
        record = Signal(inflight_layout)
        m.d.comb += [
            record.kind.eq(kind),
            record.push_prev.eq(head.tokens & Token.PUSH_PREV != 0),
            record.push_next.eq(head.tokens & Token.PUSH_NEXT != 0),
            take.eq(issued),
            q.r_en.eq(issued | (q.r_rdy & self.flush)),
            infl.w_en.eq(issued), infl.w_data.eq(record),
            rds.w_en.eq(issued & is_argmax), rds.w_data.eq(head.rd),
        ]

        # Completion pulses not yet retired, per kind.
        done_in = {_Kind.WLOAD: self.arr_wload_done, _Kind.GEMM: self.arr_gemm_done,
                   _Kind.VECTOR: self.vec_done, _Kind.DEPTHWISE: self.dw_done}
        pending = {k: Signal(8, name=f"pending_{k.name.lower()}") for k in _Kind}
        top = data.View(inflight_layout, infl.r_data)
        retire = Signal()
        for k, sig in pending.items():
            have = (sig != 0) | done_in[k]
            with m.If(infl.r_rdy & (top.kind == k) & have):
                m.d.comb += retire.eq(1)
            dec = retire & (top.kind == k)
            m.d.sync += sig.eq(sig + done_in[k] - dec)
        with m.If(self.run_start):
            for sig in pending.values():
                m.d.sync += sig.eq(0)
        m.d.comb += [
            infl.r_en.eq(retire),
            self.tok_out_load.eq(retire & top.push_prev),
            self.tok_out_store.eq(retire & top.push_next),
        ]

        m.d.comb += [
            self.rd_we.eq(self.vec_result_valid), self.rd_index.eq(rds.r_data),
            self.rd_value.eq(self.vec_result), rds.r_en.eq(self.vec_result_valid),
        ]
        m.d.comb += [
            self.busy.eq(infl.r_rdy | ~self.arr_idle | ~self.vec_idle | ~self.dw_idle),
            self.idle.eq((q.level == 0) & ~infl.r_rdy & self.arr_idle & self.vec_idle
                         & self.dw_idle),
        ]
        return m

    def _beside_vector(self, m, head, is_vec):
        """Whether the array or depthwise command at the head may start beside the
        vector unit's running instruction: that one is a ``vreq``/``vreqb`` (noted as
        it is issued) whose accumulator rows and written scratchpad bytes the command
        leaves alone."""
        cfg = self.config
        abits = acc_addr_bits(cfg) + 1  # room for first + m - 1 before the bounds check
        vec, arr = head.vec, head.arr
        issue_vec = self.vec_cmd.valid & self.vec_cmd.ready
        # The running vector instruction's rows and bytes (inclusive bounds).
        v_req = Signal()
        v_acc_lo, v_acc_hi = Signal(abits), Signal(abits)
        v_sp_lo, v_sp_hi = Signal.like(head.last), Signal.like(head.last)
        with m.If(issue_vec):
            m.d.sync += [
                v_req.eq((vec.op == VectorOp.REQ) | (vec.op == VectorOp.REQB)),
                v_acc_lo.eq(vec.acc), v_acc_hi.eq(vec.acc + vec.m - 1),
                v_sp_lo.eq(vec.d), v_sp_hi.eq(head.last),
            ]
        a_hi = Signal(abits)
        m.d.comb += a_hi.eq(arr.acc + arr.m - 1)
        reads_apart = (head.last < v_sp_lo) | (v_sp_hi < arr.sp)
        no_rows = Mux(head.depthwise, head.dw.op == DwOp.LOAD, arr.op == ArrayOp.WLOAD)
        rows_apart = no_rows | (a_hi < v_acc_lo) | (v_acc_hi < arr.acc)
        beside = Signal()
        m.d.comb += beside.eq(~is_vec & v_req & reads_apart & rows_apart)
        return beside
