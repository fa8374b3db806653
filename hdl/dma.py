"""The DMA engine: an AXI4 manager that moves 2-D tiles between DRAM and the scratchpad.

Two independent channels share one AXI4 manager port: the load channel uses AR/R
and writes the scratchpad, the store channel reads the scratchpad and uses AW/W/B,
so a load and a store run at the same time. Each channel splits every row of its
command into INCR bursts (at most 256 beats, never across a 4 KiB boundary) and
keeps several bursts in flight.

Realignment costs nothing here: a scratchpad window may start at any byte address,
so every DRAM beat maps onto the window whose lane ``i`` is the scratchpad byte
that DRAM lane ``i`` belongs to, and the strobe keeps only the row's own bytes.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from firmware.bursts import MAX_BURST_BEATS, PAGE, burst_plan
from firmware.config import NPUConfig

from .axi import BURST_INCR, axi4_signature
from .fifo import HeadRegisterFIFO
from .ports import (
    DMA_DONE_LAYOUT,
    DRAM_ADDR_BITS,
    N_BITS,
    SP_READ_LATENCY,
    command_stream,
    delayed,
    dma_command_layout,
    sp_addr_bits,
    sp_window_signature,
    sp_word_bytes,
)

__all__ = ["DMA", "DMAShell", "MAX_BURST_BEATS", "burst_plan"]

def _desc_layout(config: NPUConfig) -> data.StructLayout:
    """What the data side of a channel needs to know about one burst (or an abort marker)."""
    s = exact_log2(sp_word_bytes(config))
    sp = sp_addr_bits(config)
    return data.StructLayout({
        "len": 8,  # beats - 1
        "lo": s,  # first useful lane of the first beat
        "hi": s,  # last useful lane of the last beat
        "sp_first": sp,  # scratchpad address of lane 0 of the first beat
        "sp_next": sp,  # ... of the second beat (later beats add W)
        "row": DRAM_ADDR_BITS,  # DRAM address of the row's first byte (error report)
        "nbytes": N_BITS,  # row length (byte counters)
        "row_last": 1,  # the row's last burst
        "cmd_last": 1,  # the command's last burst
        "marker": 1,  # no burst: the command was abandoned after a bus error
    })


def _load_write_layout(config: NPUConfig, w: int, sp_addr) -> data.StructLayout:
    """One entry of the load channel's write FIFO: a scratchpad write, a completion or both."""
    return data.StructLayout({
        "write": 1,  # a beat to write (not dropped after a bus error)
        "addr": sp_addr,
        "data": w * 8,
        "strb": w,
        "done": 1,  # the command completes once this entry leaves
        "error": 1,  # ... with a bus error (load_done.payload)
        "row": DRAM_ADDR_BITS,  # ... reported at this DRAM address
        "nbytes": N_BITS,  # a row completed without error (read_bytes)
    })


# Descriptor fields read by the store channel's W side and by its B side.
_W_FIELDS = ("len", "lo", "hi", "sp_first", "sp_next")
_B_FIELDS = ("row", "nbytes", "row_last", "cmd_last", "marker")


class _Bursts(wiring.Component):
    """Splits a DMA command into per-row INCR bursts, one per cycle.

    ``out`` carries a beat-aligned DRAM address and a descriptor, from a two-entry
    queue. While ``abort`` is high the current command stops: the next item queued
    is a ``marker`` (no burst) and the command counts as issued (items already
    queued, at most two, still go out).

    Timing: nothing is planned in the cycle a burst is queued. Each row is planned
    (its beats, its lanes, its first burst's 4 KiB cap) from registers one row
    ahead, a row's later bursts are derived from the registered plan of the burst
    before, and whether to queue depends on registers only (not on ``out.ready``).
    A command is taken when the splitter is idle and planned in the next cycle: its
    first burst is queued two cycles after it is taken; then a burst per cycle,
    with no gap between rows.
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        super().__init__({
            "cmd": In(command_stream(dma_command_layout(config))),
            "abort": In(1),
            "active": Out(1),
            "out": Out(stream.Signature(data.StructLayout({
                "addr": DRAM_ADDR_BITS, "d": _desc_layout(config)}))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w = sp_word_bytes(cfg)
        s = exact_log2(w)
        spb = sp_addr_bits(cfg)
        page = PAGE // w  # beats per 4 KiB page
        most = MAX_BURST_BEATS

        # the command
        stride = Signal(DRAM_ADDR_BITS)
        nbytes = Signal(N_BITS)
        rows_left = Signal(9)  # rows not yet completely issued, the current one included
        final_row = Signal()  # rows_left == 1
        prime = Signal()  # the cycle after a command was accepted: plan its first row

        # the next row to plan: its DRAM address and its scratchpad address
        next_row = Signal(DRAM_ADDR_BITS)
        next_sp = Signal(spb)

        # the current burst, all registered
        row = Signal(DRAM_ADDR_BITS)  # the row's first byte (error report)
        beat = Signal(DRAM_ADDR_BITS - s)  # the burst's first beat
        lo = Signal(s)  # first useful lane of the first beat
        hi = Signal(s)  # last useful lane of the row's last beat
        need = Signal(range(page + 2))  # beats from `beat` to the end of the row
        to_page = Signal(range(page + 1))  # beats from `beat` to the next 4 KiB boundary
        cap = Signal(range(min(page, most) + 1))  # min(to_page, MAX_BURST_BEATS)
        last = Signal()  # need <= cap: this burst ends the row
        sp_first = Signal(spb)  # scratchpad address of lane 0 of the first beat
        sp_next = Signal(spb)  # ... of the second beat

        # Per command, from `nbytes` = nb_hi * w + nb_lo: a row needs nb_hi + c beats,
        # c = ceil((off + nb_lo) / w) in 0..2 (off: the row's first lane); for each c
        # the beats (`by_c_need`), whether they fit in one burst (`by_c_most`) and how
        # far into its 4 KiB page the row may start for them to fit before the
        # boundary (`by_c_room`, negative: never).
        nb_lo = nbytes[:s]
        by_c_need = [Signal(range(page + 3), name=f"need_c{c}") for c in range(3)]
        by_c_most = [Signal(name=f"most_c{c}") for c in range(3)]
        by_c_room = [Signal(range(page - 2 - (2**N_BITS >> s), page + 1), name=f"room_c{c}")
                     for c in range(3)]

        # Plan of the row at next_row/next_sp: what the current-burst registers load when
        # that row starts. Only the row's low 12 address bits matter.
        p_off = next_row[:s]
        p_lanes = Signal(s + 2)  # off + nb_lo + w - 1: c above and the last lane
        p_c = p_lanes[s:]
        p_page = next_row[s:12]
        p_to_page = Signal.like(to_page)
        p_cap = Signal.like(cap)
        p_fits = [(p_page <= by_c_room[c]) & by_c_most[c] for c in range(3)]
        m.d.comb += [
            p_lanes.eq(p_off + nb_lo + (w - 1)),
            p_to_page.eq(page - p_page),
        ]
        if page <= most:
            m.d.comb += p_cap.eq(p_to_page)
        else:
            m.d.comb += p_cap.eq(Mux(p_page > page - most, p_to_page, most))
        plan = [
            row.eq(next_row),
            beat.eq(next_row[s:]),
            lo.eq(p_off),
            hi.eq(p_lanes[:s]),  # (row + nbytes - 1) mod w
            need.eq(Mux(p_c[1], by_c_need[2], Mux(p_c[0], by_c_need[1], by_c_need[0]))),
            to_page.eq(p_to_page),
            cap.eq(p_cap),
            last.eq(Mux(p_c[1], p_fits[2], Mux(p_c[0], p_fits[1], p_fits[0]))),
            # The first window may start before scratchpad byte 0: wrap it.
            sp_first.eq(Mux(next_sp < p_off, next_sp + cfg.sp_bytes - p_off, next_sp - p_off)),
            sp_next.eq(next_sp + w - p_off),
            next_row.eq(next_row + stride),
            next_sp.eq(next_sp + nbytes),
        ]

        # The row's next burst, after `cap` beats (not the last burst, so it started at a
        # 4 KiB boundary or ran MAX_BURST_BEATS beats): aligned, and its cap is known.
        n_need = Signal.like(need)
        n_to_page = Signal.like(to_page)
        n_cap = Signal.like(cap)
        at_page = to_page <= most  # this burst runs to the 4 KiB boundary
        m.d.comb += [
            n_need.eq(need - cap),
            n_to_page.eq(Mux(at_page, page, to_page - most)),
        ]
        if page - most <= most:  # after a boundary, min(page, most); else to_page - most
            m.d.comb += n_cap.eq(Mux(at_page, min(page, most), to_page - most))
        else:
            m.d.comb += n_cap.eq(Mux(n_to_page < most, n_to_page, most))
        step = [
            beat.eq(beat + cap),
            lo.eq(0),
            need.eq(n_need),
            to_page.eq(n_to_page),
            cap.eq(n_cap),
            last.eq(n_need <= n_cap),
            sp_first.eq(sp_next + ((cap - 1) << s)),
            sp_next.eq(sp_next + (cap << s)),
        ]

        # Issued items wait in a two-entry queue: the issue decision depends only on
        # registers (the queue's fill, not the consumer's ready), and a burst per cycle
        # still flows.
        out = self.out
        m.submodules.issued = issued = SyncFIFO(width=len(out.payload.as_value()), depth=2)
        item = Signal(out.payload.shape())
        d = item.d
        # `move`: the current burst goes into the queue (as itself, or as the marker when
        # `abort` is high). The burst registers step on `move` alone: after an abort
        # they are dead anyway, so the abort only decides `active` and the item.
        move = Signal()
        m.d.comb += move.eq(self.active & ~prime & issued.w_rdy)
        final = last & final_row  # the command's last burst
        m.d.comb += [
            self.cmd.ready.eq(~self.active),
            issued.w_en.eq(move),
            issued.w_data.eq(item),
            out.valid.eq(issued.r_rdy),
            out.payload.eq(issued.r_data),
            issued.r_en.eq(out.ready),
            item.addr.eq(Cat(Const(0, s), beat)),
            d.len.eq(Mux(last, need, cap) - 1),
            d.lo.eq(lo),
            d.hi.eq(Mux(last, hi, w - 1)),
            d.sp_first.eq(sp_first),
            d.sp_next.eq(sp_next),
            d.row.eq(row),
            d.nbytes.eq(nbytes),
            d.row_last.eq(last),
            # an abort ends the command with a marker (no burst)
            d.cmd_last.eq(self.abort | final),
            d.marker.eq(self.abort),
        ]

        with m.If(prime):
            m.d.sync += [prime.eq(0), *plan]
        with m.If(move):
            with m.If(last):
                m.d.sync += [*plan, rows_left.eq(rows_left - 1), final_row.eq(rows_left == 2)]
            with m.Else():
                m.d.sync += step
            with m.If(self.abort | final):
                m.d.sync += self.active.eq(0)

        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            m.d.sync += [
                self.active.eq(1),
                prime.eq(1),
                next_row.eq(p.dram),
                next_sp.eq(p.sp),
                rows_left.eq(p.rows),
                final_row.eq(p.rows == 1),
                stride.eq(p.stride),
                nbytes.eq(p.nbytes),
            ]
            for c in range(3):
                hi_c = (p.nbytes >> s) + c
                m.d.sync += [
                    by_c_need[c].eq(hi_c),
                    by_c_most[c].eq(hi_c <= most),
                    by_c_room[c].eq(page - hi_c),
                ]
        return m


def _strobe(w: int, lo, hi):
    """Lanes ``lo..hi`` (inclusive) of a ``w``-lane beat."""
    lanes = []
    for i in range(w):
        # lo <= w - 1 and 0 <= hi always hold: leave out those constant comparisons.
        conds = ([lo <= i] if i < w - 1 else []) + ([i <= hi] if i > 0 else [])
        lanes.append(Cat(*conds).all() if conds else Const(1, 1))
    return Cat(*lanes)


class DMA(wiring.Component):
    """Load and store engine between DRAM (AXI4 manager) and the scratchpad.

    Executes resolved ``load``/``store`` commands (see
    :func:`hdl.ports.dma_command_layout`): row ``i`` is the ``nbytes`` bytes at
    DRAM ``dram + i*stride`` and at scratchpad ``sp + i*nbytes``. Any byte
    alignment of addresses, lengths and strides works; bytes outside the rows are
    never written. Rows are moved in order; each command completes exactly once,
    in order, on its channel's ``*_done`` stream.

    A bus error (SLVERR or DECERR on R or B) ends the command with ``error=1`` and
    ``addr`` = the DRAM address of the failing row's first byte. No new burst of
    that command is issued, every outstanding response is drained, and the next
    command runs normally. Rows before the failing one are complete. A failed
    load leaves the failing row's scratchpad bytes unspecified (old or new) and
    later rows untouched; a failed store may have written parts of the failing row
    and of the later rows whose bursts were already in flight.

    W data never waits for AWREADY. R beats enter a two-entry FIFO (``axi.rready``
    is a register) and their scratchpad writes another one (its write side does not
    wait on the scratchpad's ``ready``), so a beat reaches the scratchpad two cycles
    after it arrives, and a load completes a cycle after its last write. The store
    side plans each beat's window into a two-entry FIFO before it reads it, for the
    same reason (the scratchpad's grant reaches that FIFO only).

    Parameters
    ----------
    config : NPUConfig
        Bus width (``bus_bytes``, the scratchpad window width) and scratchpad size.
    fifo_depth : int
        Bursts in flight per channel (at least 2).

    Members
    -------
    load_cmd, store_cmd : In(command_stream(dma_command_layout(config)))
        Commands of each channel.
    load_done, store_done : Out(stream.Signature(DMA_DONE_LAYOUT, always_ready=True))
        One completion per command, in command order.
    load_sp : Out(sp_window_signature(config))
        Scratchpad writes of the load channel.
    store_sp : Out(sp_window_signature(config))
        Scratchpad reads of the store channel.
    axi : Out(axi4_signature(32, 8 * config.bus_bytes))
        The DRAM port: ID 0 only, INCR bursts of full-width beats.
    read_bytes, write_bytes : Out(13)
        ``nbytes`` in the cycle after a row of a load (store) completed without
        error, else 0 (the ``dram_read_bytes``/``dram_write_bytes`` counters).
    load_busy, store_busy : Out(1)
        The channel has accepted a command that has not completed yet.
    load_stall, store_stall : Out(1)
        The channel is busy but moved no data beat this cycle (waiting for the
        bus or the scratchpad).
    """

    def __init__(self, config: NPUConfig, *, fifo_depth: int = 8):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if not isinstance(fifo_depth, int) or fifo_depth < 2:
            raise ValueError(f"fifo_depth={fifo_depth!r}: must be an integer >= 2")
        self.config = config
        self.fifo_depth = fifo_depth
        w = sp_word_bytes(config)
        cmd = command_stream(dma_command_layout(config))
        done = stream.Signature(DMA_DONE_LAYOUT, always_ready=True)
        sp = sp_window_signature(config)
        super().__init__({
            "load_cmd": In(cmd),
            "store_cmd": In(cmd),
            "load_done": Out(done),
            "store_done": Out(done),
            "load_sp": Out(sp),
            "store_sp": Out(sp),
            "axi": Out(axi4_signature(DRAM_ADDR_BITS, w * 8)),
            "read_bytes": Out(N_BITS),
            "write_bytes": Out(N_BITS),
            "load_busy": Out(1),
            "store_busy": Out(1),
            "load_stall": Out(1),
            "store_stall": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w = sp_word_bytes(cfg)
        s = exact_log2(w)
        depth = self.fifo_depth
        axi = self.axi
        dlay = _desc_layout(cfg)
        m.d.comb += [
            axi.arid.eq(0), axi.arsize.eq(s), axi.arburst.eq(BURST_INCR), axi.arprot.eq(0),
            axi.awid.eq(0), axi.awsize.eq(s), axi.awburst.eq(BURST_INCR), axi.awprot.eq(0),
        ]
        self._load(m, cfg, w, depth, dlay)
        self._store(m, cfg, w, depth, dlay)
        return m

    def _inflight(self, m, name, depth, accepted, done):
        """Commands accepted and not yet completed."""
        count = Signal(range(depth + 4), name=name)
        with m.If(accepted & ~done):
            m.d.sync += count.eq(count + 1)
        with m.If(done & ~accepted):
            m.d.sync += count.eq(count - 1)
        return count

    def _load(self, m, cfg, w, depth, dlay):
        axi, sp = self.axi, self.load_sp
        m.submodules.load_bursts = bursts = _Bursts(cfg)
        m.submodules.load_q = q = SyncFIFOBuffered(width=dlay.size, depth=depth)
        wiring.connect(m, wiring.flipped(self.load_cmd), bursts.cmd)

        # issue: AR and the descriptor queue move together (markers only queue)
        b = bursts.out
        mk = b.payload.d.marker
        m.d.comb += [
            axi.araddr.eq(b.payload.addr),
            axi.arlen.eq(b.payload.d.len),
            axi.arvalid.eq(b.valid & ~mk & q.w_rdy),
            b.ready.eq(q.w_rdy & (mk | axi.arready)),
            q.w_en.eq(b.valid & b.ready),
            q.w_data.eq(b.payload.d),
        ]

        # R beats pass through a two-entry FIFO whose ready is a register: the slave's
        # R channel and the scratchpad's arbitration are no longer one combinational
        # path (then the ECP5 build's deepest), at one cycle of latency and full throughput.
        # (RRESP's high bit is all a beat keeps of it: SLVERR or DECERR.)
        m.submodules.load_r = rb = SyncFIFO(width=w * 8 + 1, depth=2)
        m.d.comb += [rb.w_data.eq(Cat(axi.rdata, axi.rresp[1])), rb.w_en.eq(axi.rvalid),
                     axi.rready.eq(rb.w_rdy)]
        rvalid, rdata, is_err = rb.r_rdy, rb.r_data[:w * 8], rb.r_data[w * 8]

        # data: each R beat becomes one scratchpad window write. The writes (and the
        # completions, which must follow their command's last write) pass through a
        # two-entry FIFO whose write side waits on its level only: the scratchpad's
        # grant, combinational from the other ports' requests, then reaches only this
        # FIFO's read side, not the R FIFO, the descriptor queue and the error state
        # (the ECP5 build's routed critical path). One cycle of latency, full throughput.
        # Its head is a register (HeadRegisterFIFO, as soon as a SyncFIFO's), so the
        # request the scratchpad arbitrates does not start with a LUT RAM read.
        d = data.View(dlay, q.r_data)
        slay = _load_write_layout(cfg, w, sp.addr.shape())
        m.submodules.load_w = wb = HeadRegisterFIFO(width=slay.size, depth=2)
        k = Signal(8)  # beat within the burst
        ptr = Signal(sp.addr.shape())  # window address of beat k >= 1
        err = Signal()  # the current command met a bus error: drop the rest
        err_addr = Signal(DRAM_ADDR_BITS)
        beat_last = k == d.len
        drop = err | is_err
        take = Signal()
        marker = q.r_rdy & d.marker & wb.w_rdy
        done = Signal()  # a command's completion enters the write FIFO
        ent = data.View(slay, wb.w_data)
        m.d.comb += [
            rb.r_en.eq(q.r_rdy & ~d.marker & wb.w_rdy),
            take.eq(rvalid & rb.r_en),
            q.r_en.eq(marker | (take & beat_last)),
            done.eq(marker | (take & beat_last & d.cmd_last)),
            wb.w_en.eq(marker | take),
            ent.write.eq(take & ~drop),
            ent.addr.eq(Mux(k == 0, d.sp_first, ptr)),
            ent.data.eq(rdata),
            ent.strb.eq(_strobe(w, Mux(k == 0, d.lo, 0), Mux(beat_last, d.hi, w - 1))),
            ent.done.eq(done),
            ent.error.eq(drop | marker),
            ent.row.eq(Mux(err, err_addr, d.row)),
            ent.nbytes.eq(Mux(take & beat_last & d.row_last & ~drop, d.nbytes, 0)),
        ]
        with m.If(take):
            m.d.sync += [
                k.eq(Mux(beat_last, 0, k + 1)),
                ptr.eq(Mux(k == 0, d.sp_next, ptr + w)),
            ]
            with m.If(is_err & ~err):
                m.d.sync += [err.eq(1), err_addr.eq(d.row)]
        with m.If(done):
            m.d.sync += err.eq(0)

        # the write FIFO's head: the scratchpad write, then the completion
        head = data.View(slay, wb.r_data)
        wrote, finished = Signal(), Signal()
        m.d.comb += [
            sp.valid.eq(wb.r_rdy & head.write),
            sp.we.eq(1),
            sp.addr.eq(head.addr),
            sp.wdata.eq(head.data),
            sp.wstrb.eq(head.strb),
            wb.r_en.eq(~head.write | sp.ready),
            wrote.eq(wb.r_rdy & head.write & sp.ready),
            finished.eq(wb.r_rdy & wb.r_en & head.done),
        ]
        # The bytes of a row that left the head, a cycle later; the pop and the head's
        # count are registered apart, so that the grant reaches one flip-flop, not the
        # reset of the whole count (a routed board build's critical path).
        popped = Signal()
        popped_nbytes = Signal.like(head.nbytes)
        m.d.sync += [
            self.load_done.valid.eq(finished),
            popped.eq(wb.r_rdy & wb.r_en),
            popped_nbytes.eq(head.nbytes),
        ]
        m.d.comb += self.read_bytes.eq(Mux(popped, popped_nbytes, 0))
        # The completion's payload follows a completion at the head whether or not it
        # leaves this cycle: it is read only with ``valid``, and so its enable does not
        # wait on the scratchpad's grant (a routed board build's slow path).
        with m.If(wb.r_rdy & head.done):
            m.d.sync += [
                self.load_done.payload.error.eq(head.error),
                self.load_done.payload.addr.eq(head.row),
            ]

        # Counted up to the completion entering the write FIFO, so that neither the
        # abort nor this count waits on the scratchpad's grant; busy covers the FIFO.
        inflight = self._inflight(m, "load_inflight", depth,
                                  self.load_cmd.valid & self.load_cmd.ready, done)
        # Stop issuing only if the failing command is still being split into bursts.
        m.d.comb += [
            bursts.abort.eq(err & (inflight == 1) & bursts.active),
            self.load_busy.eq((inflight != 0) | wb.r_rdy),
            self.load_stall.eq(self.load_busy & ~wrote),
        ]

    def _store(self, m, cfg, w, depth, dlay):
        axi, sp = self.axi, self.store_sp
        m.submodules.store_bursts = bursts = _Bursts(cfg)
        # The W side needs only a burst's beat geometry and the B side only its row
        # bookkeeping, so each queue holds just its half of the descriptor.
        wlay = data.StructLayout({f: dlay.members[f] for f in _W_FIELDS})
        blay = data.StructLayout({f: dlay.members[f] for f in _B_FIELDS})
        m.submodules.store_wq = wq = SyncFIFOBuffered(width=wlay.size, depth=depth)
        m.submodules.store_bq = bq = SyncFIFOBuffered(width=blay.size, depth=depth)
        wiring.connect(m, wiring.flipped(self.store_cmd), bursts.cmd)

        # issue: a burst goes to the AW queue, the W side and the B side at once, so W
        # data never waits for AWREADY (AXI forbids a manager to); markers only go to
        # the B side.
        m.submodules.store_awq = awq = SyncFIFO(width=DRAM_ADDR_BITS + 8, depth=2)
        b = bursts.out
        mk = b.payload.d.marker
        wq_in, bq_in = data.View(wlay, wq.w_data), data.View(blay, bq.w_data)
        m.d.comb += [
            b.ready.eq(bq.w_rdy & (mk | (wq.w_rdy & awq.w_rdy))),
            awq.w_en.eq(b.valid & b.ready & ~mk),
            awq.w_data.eq(Cat(b.payload.addr, b.payload.d.len)),
            wq.w_en.eq(b.valid & b.ready & ~mk),
            *[wq_in[f].eq(b.payload.d[f]) for f in _W_FIELDS],
            bq.w_en.eq(b.valid & b.ready),
            *[bq_in[f].eq(b.payload.d[f]) for f in _B_FIELDS],
            axi.awvalid.eq(awq.r_rdy),
            axi.awaddr.eq(awq.r_data[:DRAM_ADDR_BITS]),
            axi.awlen.eq(awq.r_data[DRAM_ADDR_BITS:]),
            awq.r_en.eq(axi.awready),
        ]

        # W side: each beat's window (address, strobes, wlast) is planned into a
        # two-entry FIFO whose write side waits on its level only; its head is read
        # from the scratchpad when the data is sure to find room in the buffer that
        # the bus drains. The scratchpad's grant, combinational from the other ports'
        # requests, then reaches only that FIFO's read side, not the descriptor queue
        # and the beat counters. One cycle of latency, full throughput; its head is a
        # register (HeadRegisterFIFO), as the load side's.
        wbuf_depth = 3 + SP_READ_LATENCY  # the reads in flight and three beats for the bus
        m.submodules.store_wbuf = wbuf = SyncFIFO(width=w * 8 + w + 1, depth=wbuf_depth)
        alay = data.StructLayout({"addr": sp.addr.shape(), "strb": w, "last": 1})
        m.submodules.store_a = af = HeadRegisterFIFO(width=alay.size, depth=2)
        d = data.View(wlay, wq.r_data)
        k = Signal(8)
        ptr = Signal(sp.addr.shape())
        beat_last = k == d.len
        plan = Signal()
        plan_in = data.View(alay, af.w_data)
        m.d.comb += [
            plan.eq(wq.r_rdy & af.w_rdy),
            af.w_en.eq(plan),
            plan_in.addr.eq(Mux(k == 0, d.sp_first, ptr)),
            plan_in.strb.eq(_strobe(w, Mux(k == 0, d.lo, 0), Mux(beat_last, d.hi, w - 1))),
            plan_in.last.eq(beat_last),
            wq.r_en.eq(plan & beat_last),
        ]
        with m.If(plan):
            m.d.sync += [
                k.eq(Mux(beat_last, 0, k + 1)),
                ptr.eq(Mux(k == 0, d.sp_next, ptr + w)),
            ]
        head = data.View(alay, af.r_data)
        # The buffer's entries plus the reads in flight to it, counted (reads in, beats
        # out) rather than added up from its level, so that the request the
        # scratchpad arbitrates comes from registers.
        occupied = Signal(range(wbuf_depth + 1))
        room = occupied < wbuf_depth
        ask = Signal()
        # The strobe and wlast of each read in flight; the last stage's data arrives now.
        *_, meta = delayed(m, Cat(head.strb, head.last), SP_READ_LATENCY, "store_meta")
        m.d.comb += [
            sp.valid.eq(af.r_rdy & room),
            sp.we.eq(0),
            sp.addr.eq(head.addr),
            sp.wdata.eq(0),
            sp.wstrb.eq(0),
            ask.eq(sp.valid & sp.ready),
            af.r_en.eq(ask),
            wbuf.w_en.eq(sp.rvalid),
            wbuf.w_data.eq(Cat(sp.rdata, meta)),
        ]
        wmoved = Signal()
        m.d.comb += [
            axi.wvalid.eq(wbuf.r_rdy),
            axi.wdata.eq(wbuf.r_data[:w * 8]),
            axi.wstrb.eq(wbuf.r_data[w * 8:w * 9]),
            axi.wlast.eq(wbuf.r_data[w * 9]),
            wbuf.r_en.eq(axi.wready),
            wmoved.eq(axi.wvalid & axi.wready),
        ]
        m.d.sync += occupied.eq(occupied + ask - wmoved)

        # B side: one response per burst, in order
        e = data.View(blay, bq.r_data)
        err = Signal()
        err_addr = Signal(DRAM_ADDR_BITS)
        is_err = axi.bresp[1]
        marker = bq.r_rdy & e.marker
        resp = Signal()
        m.d.comb += [
            axi.bready.eq(bq.r_rdy & ~e.marker),
            resp.eq(axi.bvalid & axi.bready),
            bq.r_en.eq(marker | resp),
        ]
        with m.If(resp & is_err & ~err):
            m.d.sync += [err.eq(1), err_addr.eq(e.row)]
        drop = err | is_err
        done = Signal()
        m.d.comb += done.eq(marker | (resp & e.cmd_last))
        m.d.sync += [
            self.store_done.valid.eq(done),
            self.write_bytes.eq(Mux(resp & e.row_last & ~drop, e.nbytes, 0)),
        ]
        with m.If(done):
            m.d.sync += [
                self.store_done.payload.error.eq(drop | marker),
                self.store_done.payload.addr.eq(Mux(err, err_addr, e.row)),
                err.eq(0),
            ]

        inflight = self._inflight(m, "store_inflight", depth,
                                  self.store_cmd.valid & self.store_cmd.ready, done)
        m.d.comb += [
            bursts.abort.eq(err & (inflight == 1) & bursts.active),
            self.store_busy.eq(inflight != 0),
            self.store_stall.eq((inflight != 0) & ~wmoved),
        ]


class DMAShell(wiring.Component):
    """A :class:`DMA` that can be the toplevel of a Verilog conversion.

    Amaranth 0.5 cannot turn an ``always_ready`` stream member into ports (its
    ``ready`` is a constant), so here ``load_done``/``store_done`` are plain
    ``valid``/``payload`` pairs. Every other member is the DMA's own.

    Parameters
    ----------
    config : NPUConfig
    fifo_depth : int
        As for :class:`DMA`.

    Members
    -------
    load_done, store_done : Out(Signature({"valid": Out(1), "payload": Out(DMA_DONE_LAYOUT)}))
        The completions, valid for one cycle each.
    others
        As :class:`DMA`.
    """

    def __init__(self, config: NPUConfig, *, fifo_depth: int = 8):
        self.dma = DMA(config, fifo_depth=fifo_depth)
        done = wiring.Signature({"valid": Out(1), "payload": Out(DMA_DONE_LAYOUT)})
        members = dict(self.dma.signature.members)
        members["load_done"] = Out(done)
        members["store_done"] = Out(done)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = self.dma
        for name in ("load_cmd", "store_cmd"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(dma, name))
        for name in ("load_sp", "store_sp", "axi"):
            wiring.connect(m, getattr(dma, name), wiring.flipped(getattr(self, name)))
        for name in ("load_done", "store_done"):
            ours, theirs = getattr(self, name), getattr(dma, name)
            m.d.comb += [ours.valid.eq(theirs.valid), ours.payload.eq(theirs.payload)]
        for name in ("read_bytes", "write_bytes", "load_busy", "store_busy",
                     "load_stall", "store_stall"):
            m.d.comb += getattr(self, name).eq(getattr(dma, name))
        return m
