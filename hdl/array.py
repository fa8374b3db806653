"""The GEMM engine: a weight-stationary systolic array with double-buffered weights.

``wload`` copies a ``k x n`` int8 weight tile from the scratchpad into the shadow
weight registers of the processing elements; ``gemm`` streams activation rows
from the scratchpad through the array (one row per cycle while the scratchpad
grants) and writes or accumulates the int32 results into the accumulator buffer.
The semantics are those of ``firmware.golden`` (``_op_wload``/``_op_gemm``).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig

from .ports import (
    M_BITS,
    SP_READ_LATENCY,
    STRIDE_BITS,
    ArrayOp,
    acc_addr_bits,
    acc_port_signature,
    array_command_layout,
    command_stream,
    delayed,
    sp_addr_bits,
    sp_window_signature,
)

__all__ = ["ProcessingElement", "GemmEngine"]

PSUM_BITS = 32
PE_STAGES = 3
"""Cycles from a cell's activation input to its partial-sum output."""


class ProcessingElement(wiring.Component):
    """One multiply-accumulate cell of the array, holding two weights.

    Every cycle the cell forwards its activation (and the weight bank that goes with
    it) to the right, one cycle later, and ``psum_in + a_in * w[sel_in]`` downwards,
    :data:`PE_STAGES` cycles later: the cell below, which sees the same activation
    row one cycle later, adds it in its last stage. The weight bank travels with each
    activation, so rows of different gemms using different banks can be in the array
    at the same time.

    Members
    -------
    a_in : In(signed(8))
        Activation from the left neighbour (or the input skew at column 0).
    sel_in : In(1)
        Weight bank to multiply ``a_in`` with.
    psum_in : In(signed(32))
        Partial sum from the cell above (0 in the top row), read ``PE_STAGES - 1``
        cycles after the ``a_in`` it goes with.
    a_out : Out(signed(8))
        ``a_in``, one cycle later.
    sel_out : Out(1)
        ``sel_in``, one cycle later.
    psum_out : Out(signed(32))
        ``psum_in + a_in * w[sel_in]`` (wrapping), ``PE_STAGES`` cycles after ``a_in``.
    w_we : In(2)
        Write ``w_data`` into weight bank ``b`` when bit ``b`` is set; the new weight
        is used from the next cycle on.
    w_data : In(signed(8))
        Weight to write.
    """

    a_in: In(signed(8))
    sel_in: In(1)
    psum_in: In(signed(PSUM_BITS))
    a_out: Out(signed(8))
    sel_out: Out(1)
    psum_out: Out(signed(PSUM_BITS))
    w_we: In(2)
    w_data: In(signed(8))

    def elaborate(self, platform):
        m = Module()
        w = [Signal(signed(8), name=f"w{b}") for b in range(2)]
        for b in range(2):
            with m.If(self.w_we[b]):
                m.d.sync += w[b].eq(self.w_data)
        # Three stages, so that no path holds more than one of: the weight-bank mux,
        # the multiplier (a DSP block, often far from the cell's logic), the adder.
        # The partial sum from above is read in the third, which is exactly when the
        # cell above (one cycle ahead on the same activation row) presents it.
        a_q = Signal(signed(8))
        w_q = Signal(signed(8))
        prod = Signal(signed(16))  # int8 x int8 fits 16 bits
        m.d.sync += [
            a_q.eq(self.a_in),
            w_q.eq(Mux(self.sel_in, w[1], w[0])),
            prod.eq(a_q * w_q),
            self.a_out.eq(self.a_in),
            self.sel_out.eq(self.sel_in),
            # the 32-bit sum wraps like the golden model's
            self.psum_out.eq(self.psum_in + prod),
        ]
        return m


class GemmEngine(wiring.Component):
    """Weight-stationary ``rows x cols`` systolic GEMM engine.

    Commands (:func:`hdl.ports.array_command_layout`) are accepted in order:

    * ``wload`` fills the shadow weight bank (``W_shadow = 0``, then
      ``W_shadow[:k, :n]`` from the ``k*n`` dense bytes at ``sp``). It may run while
      earlier gemms still stream from the active bank; a wload that follows a
      ``swap`` gemm waits until the rows of the gemms before that swap have left
      the array, because it overwrites the weights they use.
    * ``gemm`` (with ``swap``: on the weights of the latest wload before it, which it
      waits for) streams ``m`` rows of ``k`` activation bytes at ``sp + i*stride`` and
      writes (``accumulate=0``) or adds (``accumulate=1``) the ``n`` int32 results
      into accumulator row ``acc + i``; columns ``>= n`` are left untouched. A gemm
      starts streaming as soon as the previous one has issued its last row.

    One activation row enters the array per cycle while the scratchpad grants; a
    wload's ``k`` reads go through their own port, one a cycle while granted, beside
    a streaming gemm's rows (the scratchpad's priority decides where their banks
    meet: :data:`hdl.top.SP_PORTS`); a row's result reaches the accumulator
    :attr:`latency` cycles after its read was granted. Consecutive accumulating rows
    on the same accumulator row are forwarded, so any command sequence gives the
    sequential (golden) result. Commands are
    assumed legal (``k``, ``n``, ``m`` >= 1 and every address in range): the
    sequencer checks them.

    Parameters
    ----------
    config : NPUConfig
        ``rows``, ``cols``, ``bus_bytes``, ``sp_bytes`` and ``acc_rows`` are used.

    Attributes
    ----------
    latency : int
        Cycles from the grant of a row's scratchpad read to its accumulator write.

    Members
    -------
    cmd : In(command_stream(array_command_layout(config)))
        Resolved ``wload``/``gemm`` commands. ``ready`` depends combinationally on
        ``payload.op`` and ``sp.ready`` (never on ``valid``).
    sp : Out(sp_window_signature(config))
        The gemms' activation-row reads (``we`` is always 0).
    wsp : Out(sp_window_signature(config))
        The weight loader's reads (``we`` is always 0), beside ``sp``.
    acc : Out(acc_port_signature(config))
        The accumulator row port (reads only for ``accumulate``).
    wload_done : Out(1)
        One-cycle pulse per completed wload, in wload order.
    gemm_done : Out(1)
        One-cycle pulse per gemm, in the cycle its last row is written.
    idle : Out(1)
        No accepted command is unfinished.
    macs : Out(range(rows*cols + 1))
        MACs retired this cycle: ``k*n`` of the row written to the accumulator.
    busy : Out(1)
        Not ``idle``.
    stall : Out(1)
        Busy and waiting for a scratchpad grant (on either port).
    """

    def __init__(self, config: NPUConfig):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.latency = config.rows + config.cols + PE_STAGES + SP_READ_LATENCY - 2
        super().__init__({
            "cmd": In(command_stream(array_command_layout(config))),
            "sp": Out(sp_window_signature(config)),
            "wsp": Out(sp_window_signature(config)),
            "acc": Out(acc_port_signature(config)),
            "wload_done": Out(1),
            "gemm_done": Out(1),
            "idle": Out(1),
            "macs": Out(range(config.rows * config.cols + 1)),
            "busy": Out(1),
            "stall": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        A = sp_addr_bits(cfg)
        AB = acc_addr_bits(cfg)
        cmd, sp, acc = self.cmd, self.sp, self.acc
        p = cmd.payload

        def lane(port, i):
            return port.rdata[8 * i: 8 * i + 8].as_signed()

        # ---- weight-bank bookkeeping ----------------------------------------------------
        # `front` is the bank the most recently accepted gemm uses; a wload fills the other.
        front = Signal()
        # Cycles until no issued row can still read bank b (set when a row is granted).
        drain_len = R + C
        drain = [Signal(range(drain_len + 1), name=f"drain{b}") for b in range(2)]
        # drain[b] == 0, kept as flags (reset: drained), like the other counters' tests
        # below: they decide the request the scratchpad arbitrates, which should come
        # from registers.
        drained = [Signal(name=f"drained{b}", init=1) for b in range(2)]

        # ---- weight loader state ----------------------------------------------------------
        wl_busy = Signal()
        wl_started = Signal()  # the shadow rows >= k are cleared and reads may go out
        wl_bank = Signal()
        wl_k = Signal(range(R + 1))
        wl_n = Signal(range(C + 1))
        wl_addr = Signal(A)
        wl_left = Signal(range(R + 1))  # rows still to request
        wl_left_nz = Signal()  # wl_left != 0
        wl_row = Signal(range(R + 1))  # next row to be written by a response
        # Compares of the loader's counters, kept as flags updated with them: they decide
        # `promote` and the loader's end, whose paths run on into the compute queue
        # (`cmd.ready`, the done pulses) and the scratchpad request: the deepest logic of
        # the FPGA build.
        wl_k_is0 = Signal()  # wl_k == 0
        wl_k_is1 = Signal()  # wl_k == 1
        wl_left_is1 = Signal()  # wl_left == 1: the next granted read is the last
        wl_row_last = Signal()  # wl_row == wl_k - 1: the next response is the last row
        # bank_free(wl_bank), registered from the next state (it was two LUTs of
        # `wl_start`, which `promote` and the done pulse wait for).
        wl_free = Signal(init=1)

        # ---- gemm streamer state: one gemm issuing rows (cur) and one queued (nxt) -----
        nxt_valid = Signal()
        nxt_wait = Signal()  # swap gemm waiting for the wload before it to issue its reads
        nxt_bank = Signal()
        nxt_sp = Signal(A)
        nxt_stride = Signal(STRIDE_BITS)
        nxt_n = Signal(range(C + 1))
        nxt_m = Signal(M_BITS)
        nxt_acc = Signal(AB)
        nxt_accum = Signal()
        nxt_kn = Signal(range(R * C + 1))

        cur_rows = Signal(M_BITS)  # rows still to request
        cur_busy = Signal()  # cur_rows != 0
        cur_last = Signal()  # cur_rows == 1
        cur_addr = Signal(A)
        cur_stride = Signal(STRIDE_BITS)
        cur_n = Signal(range(C + 1))
        cur_acc = Signal(AB)
        cur_accum = Signal()
        cur_bank = Signal()
        cur_kn = Signal(range(R * C + 1))

        # The state the scratchpad request is decided from also exists as its next
        # value (``nxt_state``, below), so that the request is a register: decided
        # from the state, it would feed the arbitration's claim chain through three
        # LUTs and across the die, the head of the FPGA build's critical path.
        now = dict(drained=drained, cur_busy=cur_busy, cur_bank=cur_bank)

        def next_of(sig):
            """``sig``'s value after this cycle: assign it instead of ``sig``."""
            n = Signal.like(sig, name=f"{sig.name}_next")
            m.d.comb += n.eq(sig)
            m.d.sync += sig.eq(n)
            return n

        nxt_state = dict(drained=[next_of(d) for d in drained], cur_busy=next_of(cur_busy),
                         cur_bank=next_of(cur_bank))
        wl_busy_n, wl_started_n, wl_bank_n = (next_of(s) for s in (wl_busy, wl_started, wl_bank))
        wl_left_nz_n, wl_addr_n, cur_addr_n = (next_of(s) for s in (wl_left_nz, wl_addr,
                                                                    cur_addr))

        def bank_free(b, st=now):
            # No gemm ahead of the pending wload still needs bank b. Only the streaming
            # gemm can be one: a queued gemm is either the latest one, which uses `front`
            # (not b), or a swap gemm after the wload, waiting for it.
            return (Mux(b, st["drained"][1], st["drained"][0])
                    & ~(st["cur_busy"] & (st["cur_bank"] == b)))

        # ---- command intake -----------------------------------------------------------------
        is_wload = p.op == ArrayOp.WLOAD
        # The gemm slot refills in the cycle it hands its gemm on, so m=1 gemms stream
        # back to back.
        promote = Signal()
        m.d.comb += cmd.ready.eq(Mux(is_wload, ~wl_busy, ~nxt_valid | promote))
        take = cmd.valid & cmd.ready
        take_wl = cmd.valid & is_wload & ~wl_busy  # = take & is_wload, without `promote`

        wl_start = Signal()
        wl_resp = Signal()
        wl_done = Signal()
        # The loader's last read is granted (``wl_issued``). A swap gemm may start
        # streaming in the cycle after ``wl_released``: its rows reach weight row r no
        # earlier than that row is written. Rows are written a cycle after their
        # response (the write enables fan out to every cell: registered), which the
        # skew hides when k >= 2 (the gemm's activations come as late after their
        # grant as the weights do); a single row is read by the gemm's first
        # activation at once, so a one-row wload releases one cycle after its read.
        wl_issued = Signal()
        wl_issued_q = Signal()
        wl_released = Signal()
        m.d.comb += wl_released.eq(Mux(wl_k_is1, wl_issued_q, wl_issued))
        wl_pending = Signal()  # reads still to be issued
        wl_more_after = Signal()  # wl_left != 0 after this cycle's read, if granted
        m.d.comb += wl_more_after.eq(~wl_left_is1)
        m.d.comb += [
            wl_start.eq(wl_busy & ~wl_started & wl_free),
            wl_done.eq(wl_busy & ((wl_start & wl_k_is0) | (wl_resp & wl_row_last))),
            self.wload_done.eq(wl_done),
            wl_pending.eq(wl_busy & ~(wl_started & ~wl_left_nz)),
        ]

        with m.If(take_wl):
            k = p.k[:len(wl_k)]
            m.d.sync += [wl_k_is0.eq(k == 0), wl_k_is1.eq(k == 1), wl_left_is1.eq(k == 1),
                         wl_row_last.eq(k == 1)]
            m.d.sync += [
                wl_k.eq(p.k),
                wl_n.eq(p.n),
                wl_left.eq(p.k),
                wl_row.eq(0),
            ]
        with m.If(take & ~is_wload):
            bank = Mux(p.swap, ~front, front)
            m.d.sync += [
                front.eq(bank),
                nxt_valid.eq(1),
                nxt_wait.eq(p.swap & wl_pending & ~wl_released),
                nxt_bank.eq(bank),
                nxt_sp.eq(p.sp),
                nxt_stride.eq(p.stride),
                nxt_n.eq(p.n),
                nxt_m.eq(p.m),
                nxt_acc.eq(p.acc),
                nxt_accum.eq(p.accumulate),
                nxt_kn.eq(p.k * p.n),
            ]
        with m.Elif(wl_released):
            m.d.sync += nxt_wait.eq(0)

        # ---- scratchpad requests ----------------------------------------------------------
        # The loader reads through its own port (``wsp``), beside the streaming gemm's
        # (``sp``); the scratchpad grants both in a cycle where their banks differ. A
        # presented request stays unchanged until granted. Both requests are registered:
        # valid and addr are the values for this cycle's state, computed from the
        # previous cycle's next state.
        wsp = self.wsp
        gs_valid, gs_addr = Signal(), Signal(A)
        wl_valid, wl_raddr = Signal(), Signal(A)
        m.d.comb += [
            sp.valid.eq(gs_valid), sp.addr.eq(gs_addr),
            wsp.valid.eq(wl_valid), wsp.addr.eq(wl_raddr),
        ]
        for port in (sp, wsp):
            m.d.comb += [port.we.eq(0), port.wdata.eq(0), port.wstrb.eq(0)]
        wl_fire = Signal()
        gs_fire = Signal()
        m.d.comb += [
            wl_fire.eq(wsp.valid & wsp.ready),
            gs_fire.eq(sp.valid & sp.ready),
            wl_issued.eq((wl_fire & wl_left_is1) | (wl_start & wl_k_is0)),
        ]
        m.d.sync += wl_issued_q.eq(wl_issued)
        # The next requests are decided for each outcome of the two late decisions of
        # this cycle, and they pick one last: `promote` (a gemm taking over the stream:
        # from the loader's release and the streaming gemm's last read) and `take_wl` (a
        # wload accepted: from the compute queue's head and its tokens). In front of the
        # bank check, either was the deepest path of a board build.
        # The streaming gemm's next state, without and with a gemm promoted:
        stay = dict(drained=nxt_state["drained"], cur_busy=Mux(gs_fire, ~cur_last, cur_busy),
                    cur_bank=cur_bank, addr=Mux(gs_fire, cur_addr + cur_stride, cur_addr))
        new = dict(drained=nxt_state["drained"], cur_busy=nxt_m != 0, cur_bank=nxt_bank,
                   addr=nxt_sp)
        # The loader's, without and with a wload taken (it is idle then: no read, start
        # or end of its own this cycle).
        keep = dict(busy=wl_busy & ~wl_done, started=wl_started | wl_start, bank=wl_bank,
                    left_nz=Mux(wl_fire, wl_more_after, wl_left_nz),
                    addr=Mux(wl_fire, wl_addr + wl_n, wl_addr))
        took = dict(busy=1, started=0, bank=~front,
                    left_nz=p.k[:len(wl_left)] != 0, addr=p.sp)

        def request(st, ld):
            free = bank_free(ld["bank"], st)
            return ld["busy"] & ld["left_nz"] & (ld["started"] | free), free

        def pick(if_new, if_stay):
            return [Mux(promote, a, b) for a, b in zip(if_new, if_stay, strict=True)]

        wl_valid_n, free_n = [Mux(take_wl, a, b) for a, b in zip(
            pick(request(new, took), request(stay, took)),
            pick(request(new, keep), request(stay, keep)), strict=True)]
        m.d.comb += [nxt_state["cur_busy"].eq(Mux(promote, new["cur_busy"], stay["cur_busy"])),
                     nxt_state["cur_bank"].eq(Mux(promote, new["cur_bank"], stay["cur_bank"])),
                     cur_addr_n.eq(Mux(promote, new["addr"], stay["addr"]))]
        m.d.comb += [n.eq(Mux(take_wl, took[k], keep[k])) for k, n in (
            ("busy", wl_busy_n), ("started", wl_started_n), ("bank", wl_bank_n),
            ("left_nz", wl_left_nz_n), ("addr", wl_addr_n))]
        m.d.sync += [wl_valid.eq(wl_valid_n), wl_free.eq(free_n), wl_raddr.eq(wl_addr_n),
                     gs_valid.eq(nxt_state["cur_busy"]), gs_addr.eq(cur_addr_n)]

        *_, resp_gs = delayed(m, gs_fire, SP_READ_LATENCY, "resp_gs")
        gs_resp = Signal()
        # (the gemm's port may be shared: take read data only for its own grants)
        m.d.comb += [wl_resp.eq(wsp.rvalid), gs_resp.eq(sp.rvalid & resp_gs)]

        # ---- weight loader ----------------------------------------------------------------
        with m.If(wl_fire):
            m.d.sync += [wl_left.eq(wl_left - 1), wl_left_is1.eq(wl_left == 2)]
        with m.If(wl_resp):
            m.d.sync += [wl_row.eq(wl_row + 1), wl_row_last.eq(wl_row + 2 == wl_k)]
        # Row r of the shadow bank: cleared at the start when r >= k, else written from
        # its response (columns >= n as zero), one cycle later. The two never fall in
        # the same cycle.
        row_we = [Signal(name=f"w_row_we{r}") for r in range(R)]
        col_data = [Signal(signed(8), name=f"w_col{c}") for c in range(C)]
        w_bank = Signal()
        m.d.sync += w_bank.eq(wl_bank)
        for r in range(R):
            m.d.sync += row_we[r].eq((wl_start & (wl_k <= r)) | (wl_resp & (wl_row == r)))
        for c in range(C):
            m.d.sync += col_data[c].eq(Mux(wl_resp & (wl_n > c), lane(self.wsp, c), 0))

        # ---- gemm streamer --------------------------------------------------------------
        last_fire = gs_fire & cur_last
        m.d.comb += promote.eq(nxt_valid & ~(nxt_wait & ~wl_released)
                               & (~cur_busy | last_fire))
        # What a granted row needs when its response arrives, kept alongside its read.
        row_layout = data.StructLayout({
            "acc": AB, "accum": 1, "n": range(C + 1), "kn": range(R * C + 1),
            "bank": 1, "last": 1})
        row_now = Signal(row_layout)
        m.d.comb += [row_now.acc.eq(cur_acc), row_now.accum.eq(cur_accum),
                     row_now.n.eq(cur_n), row_now.kn.eq(cur_kn), row_now.bank.eq(cur_bank),
                     row_now.last.eq(cur_last)]
        row_resp = data.View(row_layout,
                             delayed(m, row_now.as_value(), SP_READ_LATENCY, "row")[-1])
        r_acc, r_accum, r_n, r_kn = row_resp.acc, row_resp.accum, row_resp.n, row_resp.kn
        r_bank, r_last = row_resp.bank, row_resp.last
        with m.If(gs_fire):
            m.d.sync += [
                cur_rows.eq(cur_rows - 1),
                cur_last.eq(cur_rows == 2),
                cur_acc.eq(cur_acc + 1),
            ]
        with m.If(promote & ~(take & ~is_wload)):
            m.d.sync += nxt_valid.eq(0)
        with m.If(promote):
            m.d.sync += [
                cur_rows.eq(nxt_m),
                cur_last.eq(nxt_m == 1),
                cur_stride.eq(nxt_stride),
                cur_n.eq(nxt_n),
                cur_acc.eq(nxt_acc),
                cur_accum.eq(nxt_accum),
                cur_kn.eq(nxt_kn),
            ]
        for b in range(2):
            with m.If(gs_fire & (cur_bank == b)):
                m.d.sync += drain[b].eq(drain_len)
                m.d.comb += nxt_state["drained"][b].eq(0)
            with m.Elif(~drained[b]):
                m.d.sync += drain[b].eq(drain[b] - 1)
                m.d.comb += nxt_state["drained"][b].eq(drain[b] == 1)

        # ---- the array --------------------------------------------------------------------
        # Row r of the activation vector enters row r of the array r cycles late, so that
        # it meets the partial sum of the same activation row coming down each column.
        x_skew = []
        for r in range(R):
            a = Signal(signed(8), name=f"x{r}_in")
            s = Signal(name=f"x{r}_sel_in")
            # Lanes >= k meet the zero rows of the weight tile. Cycles without a row enter
            # zeros, so idle columns do not toggle.
            m.d.comb += [a.eq(Mux(gs_resp, lane(sp, r), 0)), s.eq(r_bank)]
            for d in range(r):
                a_d = Signal(signed(8), name=f"x{r}_skew{d}")
                s_d = Signal(name=f"x{r}_sel_skew{d}")
                m.d.sync += [a_d.eq(a), s_d.eq(s)]
                a, s = a_d, s_d
            x_skew.append((a, s))

        pe = [[ProcessingElement() for _ in range(C)] for _ in range(R)]
        for r in range(R):
            for c in range(C):
                cell = pe[r][c]
                m.submodules[f"pe_{r}_{c}"] = cell
                a_in, s_in = x_skew[r] if c == 0 else (pe[r][c - 1].a_out, pe[r][c - 1].sel_out)
                m.d.comb += [
                    cell.a_in.eq(a_in),
                    cell.sel_in.eq(s_in),
                    cell.psum_in.eq(0 if r == 0 else pe[r - 1][c].psum_out),
                    cell.w_we.eq(Mux(w_bank, 0b10, 0b01) & row_we[r].replicate(2)),
                    cell.w_data.eq(col_data[c]),
                ]

        # Column c leaves the array c cycles after column 0: delay the early columns so a
        # whole output row is ready together, rows + cols + PE_STAGES - 2 cycles after
        # it entered.
        out = []
        for c in range(C):
            v = pe[R - 1][c].psum_out
            for d in range(C - 1 - c):
                v_d = Signal(signed(PSUM_BITS), name=f"y{c}_deskew{d}")
                m.d.sync += v_d.eq(v)
                v = v_d
            out.append(v)

        # ---- row bookkeeping alongside the array ------------------------------------------
        meta_layout = data.StructLayout({
            "valid": 1, "last": 1, "accumulate": 1,
            "acc": AB, "n": range(C + 1), "kn": range(R * C + 1),
        })
        depth = R + C + PE_STAGES - 2
        meta = [Signal(meta_layout, name="meta_in")]
        m.d.comb += [
            meta[0].valid.eq(gs_resp),
            meta[0].last.eq(r_last),
            meta[0].accumulate.eq(r_accum),
            meta[0].acc.eq(r_acc),
            meta[0].n.eq(r_n),
            meta[0].kn.eq(r_kn),
        ]
        for d in range(depth):
            st = Signal(meta_layout, name=f"meta{d + 1}")
            m.d.sync += st.eq(meta[-1])
            meta.append(st)
        rd, wr = meta[depth - 1], meta[depth]

        # ---- accumulator: read one cycle ahead, write in the output cycle -----------------
        fwd_hit = Signal()
        fwd_data = Signal(C * 32)
        fwd_mask = Signal(C)
        m.d.comb += [
            acc.ren.eq(rd.valid & rd.accumulate),
            acc.raddr.eq(rd.acc),
            acc.wen.eq(wr.valid),
            acc.waddr.eq(wr.acc),
        ]
        # The buffer returns the old value for a row written in the cycle it is read:
        # forward that write to the next row.
        m.d.sync += [
            fwd_hit.eq(acc.wen & acc.ren & (acc.waddr == acc.raddr)),
            fwd_data.eq(acc.wdata),
            fwd_mask.eq(acc.wmask),
        ]
        for c in range(C):
            old = Mux(fwd_hit & fwd_mask[c], fwd_data[32 * c: 32 * c + 32],
                      acc.rdata[32 * c: 32 * c + 32]).as_signed()
            m.d.comb += [
                acc.wmask[c].eq(wr.n > c),
                acc.wdata[32 * c: 32 * c + 32].eq(out[c] + Mux(wr.accumulate, old, 0)),
            ]

        # ---- status ----------------------------------------------------------------------
        inflight = Signal(range(self.latency + 4))  # granted gemm rows not yet written
        m.d.sync += inflight.eq(inflight + gs_fire - wr.valid)
        m.d.comb += [
            self.gemm_done.eq(wr.valid & wr.last),
            self.macs.eq(Mux(wr.valid, wr.kn, 0)),
            self.idle.eq(~wl_busy & ~cur_busy & ~nxt_valid & (inflight == 0)),
            self.busy.eq(~self.idle),
            self.stall.eq(self.busy & ((sp.valid & ~sp.ready) | (wsp.valid & ~wsp.ready))),
        ]
        return m
