"""The vector unit: configuration registers, bias add, requantization (per tensor, or per
column from its requantization table, with a bias per row for GEMV results), element-wise
add, clip, max-pool and argmax (the ``cfg`` and ``v*`` instructions of the compute queue).

Semantics are those of the golden model (``firmware.golden.Machine._op_cfg`` ...
``_op_vargmax``) and ``firmware.quant``; commands arrive resolved
(:func:`hdl.ports.vector_command_layout`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from firmware.config import NPUConfig
from firmware.isa import CFG_RESET, QTAB_ENTRY_BYTES, QTAB_SHIFT_BITS, CfgField

from .fifo import HeadRegisterFIFO
from .ports import (
    M_BITS,
    N_BITS,
    SP_READ_LATENCY,
    STRIDE_BITS,
    VectorOp,
    acc_addr_bits,
    acc_port_signature,
    command_stream,
    delayed,
    sp_addr_bits,
    sp_window_signature,
    sp_word_bytes,
    vector_command_layout,
)

__all__ = ["VectorUnit", "CFG_SHAPES"]

CFG_SHAPES = {
    CfgField.QMUL: signed(32),
    CfgField.QSHIFT: 6,
    CfgField.QZP: signed(8),
    CfgField.CLIP_LO: signed(8),
    CfgField.CLIP_HI: signed(8),
    CfgField.ADD_MUL_A: signed(32),
    CfgField.ADD_MUL_B: signed(32),
    CfgField.ADD_ZP_A: signed(8),
    CfgField.ADD_ZP_B: signed(8),
    CfgField.IN_STRIDE: 20,
    CfgField.OUT_STRIDE: 20,
    CfgField.GEMM_STRIDE: 20,
    CfgField.POOL_COUNT: 8,
    CfgField.POOL_STRIDE: 20,
    CfgField.POOL_ISTRIDE: 20,
}
"""Shape of each configuration register: enough bits for its ``firmware.isa.CFG_RANGE``."""

# Read responses are buffered in queues. A read is only issued when its response
# is sure to find room (queued + in flight < depth), because responses cannot be
# refused. Three entries sustain one read per cycle; the scratchpad queues are
# deeper so that one of the two ADD sources can run up to three windows ahead of
# the other, off the banks the other one needs.
_ACC_QUEUE_DEPTH = 4
_SP_QUEUE_DEPTH = 7


class _Walker:
    """Address counters walking ``rows x chunks x taps`` beats (taps innermost).

    Beat ``(i, k, t)`` is at ``base + i*rstride + k*W + t*tstride``; ``rem`` is
    ``n - k*W``, the number of elements left in the row from this chunk on.
    """

    def __init__(self, name: str, addr_bits: int, step: int):
        self.step = step
        self.active = Signal(name=f"{name}_active")
        self.addr = Signal(addr_bits, name=f"{name}_addr")
        self.chunk = Signal(addr_bits, name=f"{name}_chunk")
        self.row = Signal(addr_bits, name=f"{name}_row")
        self.i = Signal(M_BITS, name=f"{name}_i")
        self.k = Signal(N_BITS, name=f"{name}_k")
        self.t = Signal(8, name=f"{name}_t")
        self.rem = Signal(N_BITS, name=f"{name}_rem")
        # Lane j of this beat holds an element (rem > j), kept beside rem so that a
        # write's strobes come from a register into the scratchpad's arbitration.
        self.lanes = Signal(step, name=f"{name}_lanes")
        self.i_last = Signal(M_BITS, name=f"{name}_i_last")
        self.k_last = Signal(N_BITS, name=f"{name}_k_last")
        self.t_last = Signal(8, name=f"{name}_t_last")
        self.n = Signal(N_BITS, name=f"{name}_n")
        self.rstride = Signal(STRIDE_BITS, name=f"{name}_rstride")
        self.tstride = Signal(STRIDE_BITS, name=f"{name}_tstride")
        # t == 0, t == t_last, k == k_last and i == i_last, kept as flags: the
        # scratchpad's grant selects the next beat, and comparators between the grant
        # and these registers would be on the FPGA build's critical path.
        self.t_first = Signal(name=f"{name}_t_first")
        self.t_end = Signal(name=f"{name}_t_end")
        self.k_end = Signal(name=f"{name}_k_end")
        self.i_end = Signal(name=f"{name}_i_end")

    @property
    def first_tap(self):
        return self.t_first

    @property
    def last_tap(self):
        return self.t_end

    @property
    def final(self):
        return self.i_end & self.k_end & self.t_end

    def load(self, m, *, base, rows, n, chunks=None, taps=1, rstride=0, tstride=0):
        """Start a walk (``rows``/``chunks``/``taps`` >= 1; ``chunks`` defaults to
        ``ceil(n / W)``)."""
        shift = exact_log2(self.step)
        k_last = ((n - 1) >> shift) if chunks is None else (chunks - 1)
        # The last indices as the registers hold them, so that the flags agree.
        i_last = Value.cast(rows - 1)[:len(self.i_last)]
        k_last = Value.cast(k_last)[:len(self.k_last)]
        t_last = Value.cast(taps - 1)[:len(self.t_last)]
        m.d.sync += [
            self.active.eq(1),
            self.addr.eq(base), self.chunk.eq(base), self.row.eq(base),
            self.i.eq(0), self.k.eq(0), self.t.eq(0), self.rem.eq(n), self.n.eq(n),
            self.lanes.eq(self._lanes(n)),
            self.i_last.eq(i_last), self.k_last.eq(k_last), self.t_last.eq(t_last),
            self.rstride.eq(rstride), self.tstride.eq(tstride),
            self.t_first.eq(1), self.t_end.eq(t_last == 0), self.k_end.eq(k_last == 0),
            self.i_end.eq(i_last == 0),
        ]

    def _lanes(self, rem):
        return Cat(rem > j for j in range(self.step))

    def advance(self, m):
        """Move to the next beat (the walk ends after the final one)."""
        with m.If(~self.t_end):
            m.d.sync += [self.t.eq(self.t + 1), self.addr.eq(self.addr + self.tstride),
                         self.t_first.eq(0),
                         self.t_end.eq((self.t + 1)[:len(self.t)] == self.t_last)]
        with m.Elif(~self.k_end):
            nxt = self.chunk + self.step
            m.d.sync += [
                self.t.eq(0), self.k.eq(self.k + 1), self.rem.eq(self.rem - self.step),
                self.lanes.eq(self._lanes(self.rem - self.step)),
                self.chunk.eq(nxt), self.addr.eq(nxt),
                self.t_first.eq(1), self.t_end.eq(self.t_last == 0),
                self.k_end.eq((self.k + 1)[:len(self.k)] == self.k_last),
            ]
        with m.Elif(~self.i_end):
            nxt = self.row + self.rstride
            m.d.sync += [
                self.t.eq(0), self.k.eq(0), self.i.eq(self.i + 1), self.rem.eq(self.n),
                self.lanes.eq(self._lanes(self.n)),
                self.row.eq(nxt), self.chunk.eq(nxt), self.addr.eq(nxt),
                self.t_first.eq(1), self.t_end.eq(self.t_last == 0),
                self.k_end.eq(self.k_last == 0),
                self.i_end.eq((self.i + 1)[:len(self.i)] == self.i_last),
            ]
        with m.Else():
            m.d.sync += self.active.eq(0)


class VectorUnit(wiring.Component):
    """The NPU's vector unit: executes resolved ``cfg`` and vector commands in order.

    One command executes at a time: a command is accepted only once the previous
    one is complete, so every command sees the scratchpad, the accumulator and the
    configuration registers exactly as the commands before it left them. Inside a
    command the unit is pipelined: it reads one accumulator row per cycle for
    ``BIAS``/``REQ`` and one ``W``-byte window per cycle (per source) for
    ``ADD``/``CLIP``/``MAX``/``ARGMAX`` while the scratchpad grants its requests.

    Operations (``VectorOp``; ``istride`` is ``cfg.in_stride`` or ``n``, ``ostride``
    is ``cfg.out_stride`` or ``n``; the clamp is ``min(max(y, clip_lo), clip_hi)``):

    * ``CFG``: ``cfg[field] = value`` (the value is range-checked upstream).
    * ``BIAS``: ``acc[acc+i][j] += int32le(sp[a+4j : a+4j+4])`` for ``i < m``,
      ``j < n`` (``n <= cols``), wrapping at 32 bits.
    * ``REQ``: ``sp[d + i*ostride + j] = clamp(qzp + rshift_rne(acc[acc+i][j] * qmul,
      qshift))`` with an exact 64-bit product and round-half-to-even shift; with
      ``tab``, ``(qmul, qshift)`` of column ``j`` is table entry ``j``.
    * ``REQB``: ``REQ`` of ``acc[acc+i][j] + int32le(sp[b + 4i : b + 4i + 4])``
      (wrapping at 32 bits): a bias per row, for GEMV results (one output per
      accumulator row). Reader B reads row ``i``'s bias word beside row ``i``, so
      it streams a row per cycle like ``REQ``. With ``col``, ``REQ`` of
      ``acc[acc+i][j] + int32le(sp[b + 4j : b + 4j + 4])``: a bias per column (GEMM
      results), whose words reader A reads first, as ``BIAS`` does.
    * ``QTAB``: table entry ``j = (int32le(sp[a+8j : a+8j+4]), sp[a+8j+4] & 63)`` for
      ``j < n`` (``n <= cols``); the other entries keep their values.
    * ``ADD``: ``sp[d + i*ostride + j] = clamp(qzp + rshift_rne(add_mul_a*(x - add_zp_a)
      + add_mul_b*(y - add_zp_b), qshift))`` with ``x = sp[a + i*istride + j]``,
      ``y = sp[b + i*istride + j]``.
    * ``CLIP``: ``sp[d + i*ostride + j] = clamp(sp[a + i*istride + j])``.
    * ``MAX``: ``sp[d + i*ostride + j] = max over t < pool_count of
      sp[a + i*pool_istride + t*pool_stride + j]`` (no clamp, ``pool_istride`` 0 is 0).
    * ``ARGMAX``: ``result`` = index of the first maximum of int8 ``sp[a : a+n]``.

    Fields a command does not use (``m`` of ``ARGMAX``, ``b`` of ``CLIP`` ...) are
    ignored.

    Overlap: sources are read in order, ahead of the writes, and each output chunk
    (up to ``W`` bytes of a row) is written after the reads it depends on. In-place
    operation is therefore supported: ``d == a`` (or ``d == b`` for ``ADD``) with
    the same row stride for source and destination, not below ``n``. Any other
    overlap of the destination with a source is undefined (a destination byte that
    a later output chunk reads may already have been overwritten).

    Parameters
    ----------
    config : NPUConfig
        The NPU configuration (``cols``, ``bus_bytes``, scratchpad and
        accumulator sizes).

    Members
    -------
    cmd : In(command_stream(vector_command_layout(config)))
        Resolved commands. ``ready`` is high while the unit is idle.
    run_start : In(1)
        Start of a run: reset the configuration registers to ``CFG_RESET`` (wins
        over a ``CFG`` accepted in the same cycle), and every table entry to the
        reset ``(qmul, qshift)``.
    rd_a, rd_b : Out(sp_window_signature(config))
        Scratchpad read windows: ``rd_a`` reads ``a`` (all ops), ``rd_b`` reads
        ``b`` (``ADD``, ``REQB``). Requests follow the window protocol (held until granted).
    wr : Out(sp_window_signature(config))
        Scratchpad write window (``we`` = 1, lanes selected by ``wstrb``).
    acc : Out(acc_port_signature(config))
        Accumulator row port (``BIAS`` reads and writes, ``REQ`` and ``REQB`` read).
    result : Out(32)
        The ``ARGMAX`` index; valid while ``result_valid`` and held until the next one.
    result_valid : Out(1)
        One-cycle pulse together with the ``done`` of an ``ARGMAX``.
    done : Out(1)
        One pulse per completed command (``CFG`` included), in command order, the
        cycle after its last write was accepted (the cycle after acceptance for
        ``CFG``).
    busy : Out(1)
        A vector command is executing (from the cycle after acceptance until it is
        complete; a ``CFG`` never makes the unit busy).
    idle : Out(1)
        ``~busy``: no command executing; a command offered now is accepted.
    stall : Out(1)
        Busy and at least one scratchpad request is presented but not granted.
    gemm_stride : Out(20)
        The ``GEMM_STRIDE`` configuration register (for the unit that resolves
        ``gemm`` strides; written by ``CFG`` like the others).
    """

    def __init__(self, config: NPUConfig):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        window = sp_window_signature(config)
        super().__init__({
            "cmd": In(command_stream(vector_command_layout(config))),
            "run_start": In(1),
            "rd_a": Out(window),
            "rd_b": Out(window),
            "wr": Out(window),
            "acc": Out(acc_port_signature(config)),
            "result": Out(32),
            "result_valid": Out(1),
            "done": Out(1),
            "idle": Out(1),
            "busy": Out(1),
            "stall": Out(1),
            "gemm_stride": Out(20),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        W = sp_word_bytes(cfg)
        C = cfg.cols
        spb, accb = sp_addr_bits(cfg), acc_addr_bits(cfg)
        aw = max(spb, accb)
        shift_w = exact_log2(W)

        # ---- configuration registers -------------------------------------------------
        regs = {f: Signal(shape, name=f"cfg_{f.name.lower()}", init=CFG_RESET[f])
                for f, shape in CFG_SHAPES.items()}
        m.d.comb += self.gemm_stride.eq(regs[CfgField.GEMM_STRIDE])
        # The per-column requantization table (QTAB writes it, REQ with ``tab`` reads it).
        tab_mul = [Signal(signed(32), name=f"qtab_mul{j}", init=CFG_RESET[CfgField.QMUL])
                   for j in range(C)]
        tab_shift = [Signal(QTAB_SHIFT_BITS, name=f"qtab_shift{j}",
                            init=CFG_RESET[CfgField.QSHIFT]) for j in range(C)]

        # ---- command acceptance --------------------------------------------------------
        busy = Signal()
        start = Signal()  # first cycle of a command: load the walkers
        complete = Signal()  # the current command finishes this cycle
        cmd = Signal(vector_command_layout(cfg))  # the command being executed
        op = cmd.op

        m.d.comb += [
            self.cmd.ready.eq(~busy),
            self.busy.eq(busy),
            self.idle.eq(~busy),
        ]
        m.d.sync += [start.eq(0), self.done.eq(complete), self.result_valid.eq(0)]
        accept = self.cmd.valid & self.cmd.ready
        with m.If(accept):
            with m.If(self.cmd.payload.op == VectorOp.CFG):
                m.d.comb += complete.eq(1)
                with m.Switch(self.cmd.payload.field):
                    for f, reg in regs.items():
                        with m.Case(int(f)):
                            m.d.sync += reg.eq(self.cmd.payload.value)
            with m.Else():
                m.d.sync += [cmd.eq(self.cmd.payload), busy.eq(1), start.eq(1)]
        with m.If(busy & complete):
            m.d.sync += busy.eq(0)
        with m.If(self.run_start):
            m.d.sync += [reg.eq(CFG_RESET[f]) for f, reg in regs.items()]
            m.d.sync += [r.eq(CFG_RESET[CfgField.QMUL]) for r in tab_mul]
            m.d.sync += [r.eq(CFG_RESET[CfgField.QSHIFT]) for r in tab_shift]

        n = cmd.n
        istride = Mux(regs[CfgField.IN_STRIDE] == 0, n, regs[CfgField.IN_STRIDE])
        ostride = Mux(regs[CfgField.OUT_STRIDE] == 0, n, regs[CfgField.OUT_STRIDE])

        # ---- readers -------------------------------------------------------------------
        # Reader A walks the source of every op (the bias words then the accumulator
        # rows for BIAS); reader B walks ``b`` for ADD. Responses, with the tags of
        # their beat, go into queues: A's scratchpad windows into ``qa``, its
        # accumulator rows into ``qacc`` (older windows always leave first).
        tag_layout = data.StructLayout({
            "first": 1,  # first tap of a MAX window
            "last": 1,  # last tap of a MAX window: the output chunk is complete
            "final": 1,  # last beat of the command
            "row": 1,  # an accumulator row (BIAS after the bias words, REQ)
            "k": N_BITS,  # chunk index in the row
            "rem": N_BITS,  # elements left in the row from this chunk on
            "addr": accb,  # accumulator row (BIAS)
        })
        qa_layout = data.StructLayout({"data": W * 8, "tag": tag_layout})
        qacc_layout = data.StructLayout({"data": C * 32, "tag": tag_layout})
        # One cycle from a write to the head (HeadRegisterFIFO): the responses come
        # SP_READ_LATENCY (2) cycles after the grant, and the queues give the second
        # cycle back, so the head is where SyncFIFOBuffered put it with 1.
        m.submodules.qa = qa = HeadRegisterFIFO(width=qa_layout.size, depth=_SP_QUEUE_DEPTH)
        m.submodules.qacc = qacc = HeadRegisterFIFO(width=qacc_layout.size,
                                                    depth=_ACC_QUEUE_DEPTH)
        m.submodules.qb = qb = HeadRegisterFIFO(width=W * 8, depth=_SP_QUEUE_DEPTH)

        wa = _Walker("ra", aw, W)
        wb = _Walker("rb", spb, W)
        ww = _Walker("wr", spb, W)
        a_on_acc = Signal()  # reader A reads accumulator rows, not the scratchpad
        # BIAS, and REQB with a bias per column, read their bias words before the rows.
        bias_first = (op == VectorOp.BIAS) | ((op == VectorOp.REQB) & cmd.col)

        with m.If(start):
            m.d.sync += a_on_acc.eq(0)
            with m.Switch(op):
                with m.Case(VectorOp.BIAS):
                    # First the 4n bias bytes at a, then (on the final bias word) the rows.
                    wa.load(m, base=cmd.a, rows=1, n=n,
                            chunks=((n << 2) + (W - 1)) >> shift_w)
                with m.Case(VectorOp.REQ, VectorOp.REQB):
                    with m.If(bias_first):
                        # The 4n bias bytes at b, then (on the final one) the rows.
                        wa.load(m, base=cmd.b, rows=1, n=n,
                                chunks=((n << 2) + (W - 1)) >> shift_w)
                    with m.Else():
                        wa.load(m, base=cmd.acc, rows=cmd.m, n=n, chunks=1, rstride=1)
                        m.d.sync += a_on_acc.eq(1)
                    ww.load(m, base=cmd.d, rows=cmd.m, n=n, rstride=ostride)
                    with m.If((op == VectorOp.REQB) & ~cmd.col):
                        # Each row's bias word: one window per row, beside its row.
                        wb.load(m, base=cmd.b, rows=cmd.m, n=4, chunks=1, rstride=4)
                with m.Case(VectorOp.ADD):
                    wa.load(m, base=cmd.a, rows=cmd.m, n=n, rstride=istride)
                    wb.load(m, base=cmd.b, rows=cmd.m, n=n, rstride=istride)
                    ww.load(m, base=cmd.d, rows=cmd.m, n=n, rstride=ostride)
                with m.Case(VectorOp.CLIP):
                    wa.load(m, base=cmd.a, rows=cmd.m, n=n, rstride=istride)
                    ww.load(m, base=cmd.d, rows=cmd.m, n=n, rstride=ostride)
                with m.Case(VectorOp.MAX):
                    wa.load(m, base=cmd.a, rows=cmd.m, n=n,
                            taps=regs[CfgField.POOL_COUNT],
                            rstride=regs[CfgField.POOL_ISTRIDE],
                            tstride=regs[CfgField.POOL_STRIDE])
                    ww.load(m, base=cmd.d, rows=cmd.m, n=n, rstride=ostride)
                with m.Case(VectorOp.ARGMAX):
                    wa.load(m, base=cmd.a, rows=1, n=n)
                with m.Case(VectorOp.QTAB):
                    wa.load(m, base=cmd.a, rows=1, n=n,
                            chunks=((n * QTAB_ENTRY_BYTES) + (W - 1)) >> shift_w)

        # A request goes out only when its response is sure to find room: a queue's
        # entries plus the reads in flight to it stay under its depth. That sum cannot
        # grow while a request waits, so a presented request stays presented until
        # granted. Each sum is kept in a counter (grants in, pops out) rather than
        # added up from the queue's level, so that the requests come from registers.
        a_occ_sp = Signal(range(_SP_QUEUE_DEPTH + 1))  # qa.level + A's reads in flight
        a_occ_acc = Signal(range(_ACC_QUEUE_DEPTH + 1))  # qacc.level + A's reads in flight
        b_occ = Signal(range(_SP_QUEUE_DEPTH + 1))  # qb.level + B's reads in flight
        a_req = wa.active & Mux(a_on_acc, a_occ_acc < _ACC_QUEUE_DEPTH,
                                a_occ_sp < _SP_QUEUE_DEPTH)
        b_req = wb.active & (b_occ < _SP_QUEUE_DEPTH)
        a_granted = Signal()
        b_granted = Signal()
        m.d.comb += [
            self.rd_a.valid.eq(a_req & ~a_on_acc),
            self.rd_a.addr.eq(wa.addr),
            self.acc.ren.eq(a_req & a_on_acc),
            self.acc.raddr.eq(wa.addr),
            a_granted.eq(a_req & (a_on_acc | self.rd_a.ready)),
            self.rd_b.valid.eq(b_req),
            b_granted.eq(b_req & self.rd_b.ready),
            self.rd_b.addr.eq(wb.addr),
        ]
        tag_now = Signal(tag_layout)
        m.d.comb += [
            tag_now.first.eq(wa.first_tap),
            tag_now.last.eq(wa.last_tap),
            tag_now.final.eq(wa.final & (~bias_first | a_on_acc)),
            tag_now.row.eq(a_on_acc),
            tag_now.k.eq(wa.k),
            tag_now.rem.eq(wa.rem),
            tag_now.addr.eq(wa.addr),
        ]
        # What each read in flight carries; the last stage's data arrives now. The
        # accumulator answers in a cycle: its rows are registered once more to arrive
        # with the scratchpad's windows.
        *_, a_inflight = delayed(m, a_granted, SP_READ_LATENCY, "a_inflight")
        *_, a_inflight_acc = delayed(m, a_on_acc, SP_READ_LATENCY, "a_inflight_acc")
        *_, a_inflight_tag = delayed(m, tag_now.as_value(), SP_READ_LATENCY, "a_inflight_tag")
        *_, b_inflight = delayed(m, b_granted, SP_READ_LATENCY, "b_inflight")
        acc_rdata = ([self.acc.rdata]
                     + delayed(m, self.acc.rdata, SP_READ_LATENCY - 1, "acc_rdata"))[-1]
        with m.If(a_granted):
            with m.If(bias_first & ~a_on_acc & wa.final):
                wa.load(m, base=cmd.acc, rows=cmd.m, n=n, chunks=1, rstride=1)
                m.d.sync += a_on_acc.eq(1)
            with m.Else():
                wa.advance(m)
        with m.If(b_granted):
            wb.advance(m)

        qa_in = data.View(qa_layout, qa.w_data)
        qacc_in = data.View(qacc_layout, qacc.w_data)
        m.d.comb += [
            qa.w_en.eq(a_inflight & ~a_inflight_acc),
            qa_in.data.eq(self.rd_a.rdata),
            qa_in.tag.eq(a_inflight_tag),
            qacc.w_en.eq(a_inflight & a_inflight_acc),
            qacc_in.data.eq(acc_rdata),
            qacc_in.tag.eq(a_inflight_tag),
            qb.w_en.eq(b_inflight),
            qb.w_data.eq(self.rd_b.rdata),
        ]
        # A read in flight counts towards both of A's queues until it lands in one.
        m.d.sync += [
            a_occ_sp.eq(a_occ_sp + a_granted - (a_inflight & a_inflight_acc) - qa.r_en),
            a_occ_acc.eq(a_occ_acc + a_granted - (a_inflight & ~a_inflight_acc) - qacc.r_en),
            b_occ.eq(b_occ + b_granted - qb.r_en),
        ]

        # ---- datapath ---------------------------------------------------------------------
        # S0 pops the queues, S1 forms operands (and reduces MAX windows, argmax
        # chunks, bias sums), S2..S8 multiply, round, shift and saturate (below), S9
        # adds the zero point, clamps and enters the write buffer, whose head is the
        # write presented. All stages advance together (``move``) while the write
        # buffer has room.
        head = data.View(qa_layout, qa.r_data)
        head_acc = data.View(qacc_layout, qacc.r_data)
        tag = data.View(tag_layout, Mux(qa.r_rdy, head.tag.as_value(), head_acc.tag.as_value()))
        # The write buffer: two entries (``wb_head`` presented while ``head_valid``,
        # ``wb_tail`` behind it). The pipeline moves while the tail is free, so that
        # ``move`` is a register and not the scratchpad's write grant.
        head_valid, tail_valid = Signal(), Signal()
        move = ~tail_valid
        is_add = op == VectorOp.ADD
        # b's windows pair with a's beats
        uses_b = is_add | ((op == VectorOp.REQB) & ~cmd.col)
        take = move & (qa.r_rdy | qacc.r_rdy) & (~uses_b | qb.r_rdy)
        m.d.comb += [qa.r_en.eq(take & qa.r_rdy), qacc.r_en.eq(take & ~qa.r_rdy),
                     qb.r_en.eq(take & uses_b)]

        # Per-command constants of the arithmetic path, registered: they change only
        # when a command is accepted (the pipeline is empty then) and its first
        # operands reach S2 cycles later, so the copy is never stale when used, and
        # the multipliers start from registers, not from the opcode decoder.
        req, add = (op == VectorOp.REQ) | (op == VectorOp.REQB), is_add
        coef_a = Signal(signed(32))  # the narrow lanes' (j >= cols) multipliers
        coef_b = Signal(signed(32))
        add_q = Signal()
        qshift = Signal(6)
        zp, lo, hi = Signal(signed(8)), Signal(signed(8)), Signal(signed(8))
        # The rounding constant is (1 << (s-1)) - 1 plus bit s of the value (0 for
        # s = 0): with it the floor shift rounds half to even. Both candidates are
        # per-command constants; so is the mask of the bits at and above s + 9 of a
        # value, those that must all equal its sign for the shifted value to fit in
        # 10 bits.
        half_m1 = Signal(63)
        half_c = Signal(63)  # 1 << (s-1)
        sat_mask = Signal(66)
        # A second copy of qshift for the rounding bit selects (a different reset
        # value keeps synthesis from merging it into ``qshift``): the fanout of
        # either copy is a half of the multiplexers.
        qsel = Signal(6, init=63)
        # The clamp of y + zp to [lo, hi] compares y itself with lo - zp and hi - zp
        # (in parallel with the addition); hi wins where lo > hi.
        lo_m, hi_m = Signal(signed(10)), Signal(signed(10))
        lo_gt_hi = Signal()
        shift_now = Mux(req | add, regs[CfgField.QSHIFT], 0)
        coef_a_now = Mux(req, regs[CfgField.QMUL], Mux(add, regs[CfgField.ADD_MUL_A], 1))
        # What a full lane's second pair of multipliers multiplies the operand's high
        # half by (S2): QMUL for REQ; ADD_MUL_B for ADD, whose second source is that
        # half; 1 otherwise.
        coef_c_now = Mux(add, regs[CfgField.ADD_MUL_B], Mux(req, regs[CfgField.QMUL], 1))
        # The full lanes (j < cols, column j of a REQ) have their own copies, which a REQ
        # with ``tab`` takes from the table: one multiplier and shift per output channel.
        # Their rounding constants and saturation masks are decoded from the lane's
        # shift where they are used: a lane holds 70 flip-flops (two multipliers and a
        # shift), not the 267 that registered copies of those would add.
        lane_tab = req & cmd.tab
        lane_coef_a = [Signal(signed(32), name=f"lane_coef_a{j}") for j in range(C)]
        lane_coef_c = [Signal(signed(32), name=f"lane_coef_c{j}") for j in range(C)]
        lane_shift = [Signal(6, name=f"lane_shift{j}") for j in range(C)]
        # They load in a command's first cycle (``start``) and the ones derived from
        # them in its second (``settle``), and hold otherwise: the simulated model
        # skips their decoding on the unit's idle cycles.
        settle = Signal()
        m.d.sync += settle.eq(start)
        with m.If(start):
            for j in range(C):
                m.d.sync += [
                    lane_coef_a[j].eq(Mux(lane_tab, tab_mul[j], coef_a_now)),
                    lane_coef_c[j].eq(Mux(lane_tab, tab_mul[j], coef_c_now)),
                    lane_shift[j].eq(Mux(lane_tab, tab_shift[j], shift_now)),
                ]
            m.d.sync += [
                coef_a.eq(coef_a_now),
                coef_b.eq(Mux(add, regs[CfgField.ADD_MUL_B], 0)),
                add_q.eq(add),
                qshift.eq(shift_now),
                zp.eq(Mux(req | add, regs[CfgField.QZP], 0)),
                lo.eq(Mux(op == VectorOp.MAX, -128, regs[CfgField.CLIP_LO])),
                hi.eq(Mux(op == VectorOp.MAX, 127, regs[CfgField.CLIP_HI])),
                qsel.eq(shift_now),
            ]
        with m.If(settle):
            m.d.sync += [
                # Derived from the registers above, one cycle later (still long before
                # a command's first operands reach S5).
                lo_m.eq(lo - zp),
                hi_m.eq(hi - zp),
                lo_gt_hi.eq(lo > hi),
                # (the narrow lanes': the full lanes decode their own shift)
                *(c.eq(v) for c, v in zip((half_m1, half_c, sat_mask), shift_constants(qshift),
                                          strict=True)),
            ]

        # S1
        s1_valid, s1_row, s1_am, s1_final = Signal(), Signal(), Signal(), Signal()
        s1_tab = Signal()  # the last table window was taken
        s1_addr = Signal(accb)
        # Lanes below ``cols`` also carry accumulator words; the others only bytes.
        opa = [Signal(signed(32 if j < C else 9), name=f"s1_opa{j}") for j in range(W)]
        # ADD puts both sources into a full lane's ``opa``, 16 bits each (see S2);
        # the narrow lanes take the second one in ``opb``.
        opb = [Signal(signed(9), name=f"s1_opb{j}") for j in range(C, W)]
        opb = [None] * C + opb
        # ... and the first one's sign, as bit 16 of the low half's multiplier operand
        # (a register, so that no logic sits in front of the multipliers).
        xsign = [Signal(name=f"s1_xsign{j}") for j in range(C)]
        bias_buf = Signal(C * 32)
        row_bias = qb.r_data[:32].as_signed()  # REQB: this row's bias word
        a_bytes = [head.data[8 * j: 8 * j + 8].as_signed() for j in range(W)]
        b_bytes = [qb.r_data[8 * j: 8 * j + 8].as_signed() for j in range(W)]
        acc_words = [head_acc.data[32 * j: 32 * j + 32].as_signed() for j in range(C)]
        bias_words = [bias_buf[32 * j: 32 * j + 32].as_signed() for j in range(C)]

        with m.If(move):
            m.d.sync += [
                s1_valid.eq(take & (
                    (req & tag.row) | add | (op == VectorOp.CLIP)
                    | ((op == VectorOp.MAX) & tag.last))),
                s1_row.eq(take & (op == VectorOp.BIAS) & tag.row),
                s1_am.eq(take & (op == VectorOp.ARGMAX)),
                s1_tab.eq(take & (op == VectorOp.QTAB) & tag.final),
                s1_final.eq(tag.final),
                s1_addr.eq(tag.addr),
            ]
        with m.If(take):
            for j in range(W):
                with m.Switch(op):
                    with m.Case(VectorOp.REQ):
                        if j < C:
                            m.d.sync += opa[j].eq(acc_words[j])
                    with m.Case(VectorOp.REQB):
                        if j < C:  # wrapping at 32 bits, as BIAS
                            m.d.sync += opa[j].eq(
                                acc_words[j] + Mux(cmd.col, bias_words[j], row_bias))
                    with m.Case(VectorOp.BIAS):
                        if j < C:
                            m.d.sync += opa[j].eq(acc_words[j] + bias_words[j])
                    with m.Case(VectorOp.ADD):
                        xa = a_bytes[j] - regs[CfgField.ADD_ZP_A]
                        xb = b_bytes[j] - regs[CfgField.ADD_ZP_B]
                        if j < C:
                            m.d.sync += [opa[j].eq(Cat(_sext(xa, 16), _sext(xb, 16))),
                                         xsign[j].eq(xa[-1])]
                        else:
                            m.d.sync += [opa[j].eq(xa), opb[j].eq(xb)]
                    with m.Case(VectorOp.CLIP):
                        m.d.sync += opa[j].eq(a_bytes[j])
                    with m.Case(VectorOp.MAX):
                        keep = ~tag.first & (opa[j] > a_bytes[j])
                        m.d.sync += opa[j].eq(Mux(keep, opa[j], a_bytes[j]))
                with m.If(~add):
                    m.d.sync += opb[j].eq(0) if j >= C else xsign[j].eq(0)
            # The table entries arrive W bytes at a time, like the bias words below;
            # entries from n on keep their values.
            with m.If(op == VectorOp.QTAB):
                for kk in range(-(-QTAB_ENTRY_BYTES * C // W)):
                    with m.If(tag.k == kk):
                        for j in range(W):
                            e, at = divmod(kk * W + j, QTAB_ENTRY_BYTES)
                            byte = head.data[8 * j: 8 * j + 8]
                            if e >= C or at > 4:
                                continue
                            with m.If(cmd.n > e):
                                if at < 4:
                                    m.d.sync += tab_mul[e][8 * at: 8 * at + 8].eq(byte)
                                else:
                                    m.d.sync += tab_shift[e].eq(byte[:QTAB_SHIFT_BITS])
            # The bias words arrive W bytes at a time, chunk k holding bytes kW..kW+W-1.
            with m.If(bias_first & ~tag.row):
                for kk in range(-(-4 * C // W)):
                    with m.If(tag.k == kk):
                        for j in range(W):
                            byte = kk * W + j
                            if byte < 4 * C:
                                m.d.sync += bias_buf[8 * byte: 8 * byte + 8].eq(
                                    head.data[8 * j: 8 * j + 8])

        # BIAS writes the row back from S1 (the accumulator port never waits).
        m.d.comb += [
            self.acc.wen.eq(s1_row),
            self.acc.waddr.eq(s1_addr),
            self.acc.wdata.eq(Cat(opa[j][:32] for j in range(C))),
            self.acc.wmask.eq(Cat(cmd.n > j for j in range(C))),
        ]

        # ARGMAX: reduce the chunk (first lane wins ties) to W/2 candidates in S1, to
        # two in S2 and to one in S3, merge it into the running best in S4, so that
        # the comparator tree is not one long path.
        def reduce(cands, levels):
            for _ in range(levels):
                if len(cands) == 1:
                    break
                merged = []
                for (lv, lval, lidx), (rv, rval, ridx) in zip(cands[0::2], cands[1::2],
                                                              strict=True):
                    right = rv & (~lv | (rval > lval))
                    merged.append((lv | rv, Mux(right, rval, lval), Mux(right, ridx, lidx)))
                cands = merged
            return cands

        def cand_regs(stage, count):
            return [(Signal(name=f"{stage}_am{i}_valid"),
                     Signal(signed(8), name=f"{stage}_am{i}_val"),
                     Signal(N_BITS, name=f"{stage}_am{i}_idx")) for i in range(count)]

        chunk = tag.k << shift_w
        half = reduce([(tag.rem > j, a_bytes[j], chunk | j) for j in range(W)], 1)
        s1_cands = cand_regs("s1", len(half))
        s2_am, s2_final, s2_first = Signal(), Signal(), Signal()
        s3_am, s3_final, s3_first = Signal(), Signal(), Signal()
        s1_first = Signal()
        am_val = Signal(signed(8))
        am_idx = Signal(N_BITS)
        best_val = Signal(signed(8))
        best_idx = Signal(N_BITS)
        with m.If(move & take):
            for (sv, sval, sidx), (hv, hval, hidx) in zip(s1_cands, half, strict=True):
                m.d.sync += [sv.eq(hv), sval.eq(hval), sidx.eq(hidx)]
            m.d.sync += s1_first.eq(tag.k == 0)
        two = reduce(s1_cands, max(shift_w - 2, 0))
        s2_cands = cand_regs("s2", len(two))
        (_, last_val, last_idx), = reduce(s2_cands, 1)
        with m.If(move):
            m.d.sync += [s2_am.eq(s1_am), s2_final.eq(s1_final & s1_am),
                         s3_am.eq(s2_am), s3_final.eq(s2_final)]
            with m.If(s1_am):
                for (sv, sval, sidx), (hv, hval, hidx) in zip(s2_cands, two, strict=True):
                    m.d.sync += [sv.eq(hv), sval.eq(hval), sidx.eq(hidx)]
                m.d.sync += s2_first.eq(s1_first)
            with m.If(s2_am):
                m.d.sync += [am_val.eq(last_val), am_idx.eq(last_idx), s3_first.eq(s2_first)]
        new_better = s3_first | (am_val > best_val)
        new_val = Mux(new_better, am_val, best_val)
        new_idx = Mux(new_better, am_idx, best_idx)
        with m.If(s3_am & move):
            m.d.sync += [best_val.eq(new_val), best_idx.eq(new_idx)]
            with m.If(s3_final):
                m.d.comb += complete.eq(1)
                m.d.sync += [self.result.eq(new_idx), self.result_valid.eq(1)]
        with m.If((s1_row | s1_tab) & s1_final):
            m.d.comb += complete.eq(1)

        # S2: partial products. The 32-bit factors are split into 16-bit halves
        # (``x = x_hi * 2**16 + x_lo``, ``x_lo`` unsigned, ``x_hi`` signed) so that
        # each product is one 18x18 multiplier with a register behind it; a full
        # lane has four. REQ multiplies ``x_lo`` and ``x_hi`` by both halves of
        # ``qmul``; ADD, whose sources are 9-bit, has one in each half of ``opa``
        # (``x_lo`` then signed) and multiplies the first by ADD_MUL_A's halves, the
        # second by ADD_MUL_B's (``coef_c``). S3 and S4 add them into the exact sum
        # ``v``. S5 finds bit ``qshift`` of ``v`` (for the
        # rounding constant), S6 adds the constant (``r``). S7 shifts ``r`` right by
        # the multiple of 8 in ``qshift`` and finds whether the result saturates, S8
        # shifts by the rest and saturates (``y``). S9 (the write buffer) adds the
        # zero point and clamps.
        ca_lo, ca_hi = coef_a[:16], coef_a[16:].as_signed()
        cb_lo, cb_hi = coef_b[:16], coef_b[16:].as_signed()
        s2_valid, s3_valid, s4_valid, s5_valid, s6_valid, s7_valid, s8_valid = (
            Signal(name=f"s{i}_valid") for i in range(2, 9))

        with m.If(move):
            m.d.sync += [s2_valid.eq(s1_valid), s3_valid.eq(s2_valid), s4_valid.eq(s3_valid),
                         s5_valid.eq(s4_valid), s6_valid.eq(s5_valid), s7_valid.eq(s6_valid),
                         s8_valid.eq(s7_valid)]
        # Stage k+1's registers load only when stage k holds a valid beat: a value is
        # read only while its stage is valid, so an empty stage may keep a stale one.
        # In hardware that is each stage's enable; in the simulated model it skips the
        # lanes' wide arithmetic while the unit idles (most of a GEMM's cycles).
        load = [None] + [Signal(name=f"s{k + 1}_load") for k in range(1, 8)]
        for k, valid in enumerate((s1_valid, s2_valid, s3_valid, s4_valid, s5_valid,
                                   s6_valid, s7_valid), start=1):
            m.d.comb += load[k].eq(move & valid)
        out = []
        for j in range(W):
            vw = 65 if j < C else 42
            v = Signal(signed(vw), name=f"s4_v{j}")
            vq = Signal(signed(vw), name=f"s5_v{j}")
            lsb = Signal(name=f"s5_lsb{j}")
            r = Signal(signed(66), name=f"s6_r{j}")
            t = Signal(17, name=f"s7_t{j}")
            over, neg = Signal(name=f"s7_over{j}"), Signal(name=f"s7_neg{j}")
            y = Signal(signed(10), name=f"s8_y{j}")
            if j < C:
                # REQ: opa * qmul = hh * 2**32 + (lh + hl) * 2**16 + ll (ll < 2**32);
                # ADD: ll + hl + (lh + hh) * 2**16. S3 adds the terms at 2**16
                # and the others.
                x_lo = Cat(opa[j][:16], xsign[j]).as_signed()
                x_hi = opa[j][16:].as_signed()
                ll = Signal(signed(34), name=f"s2_ll{j}")
                lh = Signal(signed(33), name=f"s2_lh{j}")
                hl = Signal(signed(33), name=f"s2_hl{j}")
                hh = Signal(signed(32), name=f"s2_hh{j}")
                s3_lo = Signal(signed(65), name=f"s3_lo{j}")
                s3_mid = Signal(signed(35), name=f"s3_mid{j}")
                la, lc = lane_coef_a[j], lane_coef_c[j]
                with m.If(load[1]):
                    m.d.sync += [ll.eq(x_lo * la[:16]), lh.eq(x_lo * la[16:].as_signed()),
                                 hl.eq(x_hi * lc[:16]), hh.eq(x_hi * lc[16:].as_signed())]
                with m.If(load[2]):
                    m.d.sync += [s3_lo.eq(Mux(add_q, ll + hl, Cat(ll[:32], hh).as_signed())),
                                 s3_mid.eq(lh + Mux(add_q, hh, hl))]
            else:
                # A 9-bit operand: (opa * ca_hi) * 2**16 + opa * ca_lo, and the
                # same for opb and coef_b.
                pbl = Signal(signed(26), name=f"s2_pbl{j}")
                pbh = Signal(signed(25), name=f"s2_pbh{j}")
                pal = Signal(signed(26), name=f"s2_pal{j}")
                pah = Signal(signed(25), name=f"s2_pah{j}")
                s3_lo = Signal(signed(27), name=f"s3_lo{j}")
                s3_mid = Signal(signed(26), name=f"s3_mid{j}")
                with m.If(load[1]):
                    m.d.sync += [pbl.eq(opb[j] * cb_lo), pbh.eq(opb[j] * cb_hi),
                                 pal.eq(opa[j] * ca_lo), pah.eq(opa[j] * ca_hi)]
                with m.If(load[2]):
                    m.d.sync += [s3_lo.eq(pal + pbl), s3_mid.eq(pah + pbh)]
            # y = clamp(r >> qshift, -512, 511): r >> qshift fits in 10 bits iff
            # the bits of r under sat_mask all equal its sign; then it is the 10
            # bits of r from qshift on (sign-extended), found in two steps.
            if j < C:
                l_shift = l_sel = lane_shift[j]
                l_half_m1, l_half_c, l_sat = shift_constants(l_shift)
            else:
                l_shift, l_sel, l_half_m1, l_half_c, l_sat = (
                    qshift, qsel, half_m1, half_c, sat_mask)
            r_neg = r[65]
            r_ext = Cat(r, r_neg.replicate(16))
            with m.If(load[3]):
                m.d.sync += v.eq(s3_lo + (s3_mid << 16))
            with m.If(load[4]):
                m.d.sync += [
                    vq.eq(v),
                    # qshift <= 63; v sign-extended
                    lsb.eq(Cat(v, v[-1].replicate(max(64 - vw, 0)))[:64].bit_select(l_sel, 1)),
                ]
            with m.If(load[5]):
                m.d.sync += r.eq(vq + Mux(lsb, l_half_c, l_half_m1))
            with m.If(load[6]):
                m.d.sync += [
                    t.eq(r_ext.bit_select(Cat(Const(0, 3), l_shift[3:]), 17)),  # 8 * l_shift[3:]
                    neg.eq(r_neg),
                    over.eq(Mux(r_neg, (~r & l_sat).any(), (r & l_sat).any())),
                ]
            with m.If(load[7]):
                m.d.sync += y.eq(Mux(over, Mux(neg, -512, 511), t.bit_select(l_shift[:3], 10)))
            # min(max(y + zp, lo), hi)
            out.append(Mux(lo_gt_hi | (y > hi_m), hi, Mux(y < lo_m, lo, y + zp))[:8])

        # S9: the write buffer.
        wb_head, wb_tail = Signal(8 * W), Signal(8 * W)
        push = move & s8_valid
        with m.If(head_valid & self.wr.ready):
            with m.If(tail_valid):
                m.d.sync += [wb_head.eq(wb_tail), tail_valid.eq(0)]
            with m.Elif(push):
                m.d.sync += wb_head.eq(Cat(out))
            with m.Else():
                m.d.sync += head_valid.eq(0)
        with m.Elif(push):
            with m.If(head_valid):
                m.d.sync += [wb_tail.eq(Cat(out)), tail_valid.eq(1)]
            with m.Else():
                m.d.sync += [wb_head.eq(Cat(out)), head_valid.eq(1)]

        # ---- writer -------------------------------------------------------------------------
        m.d.comb += [
            self.wr.valid.eq(head_valid),
            self.wr.we.eq(1),
            self.wr.addr.eq(ww.addr),
            self.wr.wdata.eq(wb_head),
            self.wr.wstrb.eq(ww.lanes),
        ]
        with m.If(self.wr.valid & self.wr.ready):
            ww.advance(m)
            with m.If(ww.final):
                m.d.comb += complete.eq(1)

        m.d.comb += self.stall.eq(busy & (
            (self.rd_a.valid & ~self.rd_a.ready) | (self.rd_b.valid & ~self.rd_b.ready)
            | (self.wr.valid & ~self.wr.ready)))
        return m


def shift_constants(s):
    """The rounding constants and saturation mask of a requantization shift ``s``.

    ``(1 << (s-1)) - 1`` and ``1 << (s-1)`` (zero for ``s = 0``): with bit ``s`` of the
    value added, the floor shift rounds half to even. The mask holds the bits at and
    above ``s + 9``, which must all equal the value's sign for the shifted value to fit
    in 10 bits. All three come from one shift of a constant, ``below``, the bits under
    ``s``: each output bit is one compare of ``s`` with a constant in hardware, and one
    shift instead of 191 compares in the simulated model.
    """
    below = Const(2**63 - 1, 63) >> ~s  # ~s == 63 - s: bits 0 .. s-1
    return (below[1:],  # bits 0 .. s-2; bit 62: never (s <= 63)
            below ^ Cat(below[1:], 0),  # bit s-1
            ~Cat(Const(2**9 - 1, 9), below[:57]))  # bits s+9 .. 65


def _sext(value, width):
    """``value`` (signed, at most ``width`` bits) sign-extended to ``width`` bits."""
    return Cat(value, value[-1].replicate(width - len(value)))
