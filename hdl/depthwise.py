"""The depthwise-convolution engine: ``dwload`` and ``dwconv``.

A depthwise output channel reads only its own input channel, so the systolic array
has nothing to share between its columns. This engine gives each of the ``cols``
channel lanes its own 3x3 kernel (``DW_TAPS`` taps, 9 x ``cols`` multipliers) and
feeds it from the one scratchpad window a cycle that a read port delivers: a
``dwconv`` walks its input column by column, reading the ``(h-1)*s + kh`` input
rows of a column (one ``W``-byte window each: ``cols`` channels of a pixel), and
keeps the last three columns in registers. Each completed column that ends a
kernel window makes ``h`` outputs, one a cycle, each from all nine taps. So a
window read once serves up to ``kh * kw`` taps of ``h`` output rows: at stride 1
a ``dwconv`` of ``h`` rows needs ``(h + kh - 1) / h`` reads per output pixel
instead of the ``kh * kw`` of a tap-by-tap mapping.
"""

from __future__ import annotations

import enum

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig
from firmware.isa import DW_BIAS_WINDOW, DW_KERNEL, DW_LOAD_WINDOWS, DW_PAD_WINDOW, DW_TAPS

from .ports import (
    M_BITS,
    SP_READ_LATENCY,
    STRIDE_BITS,
    acc_addr_bits,
    acc_port_signature,
    command_stream,
    delayed,
    sp_addr_bits,
    sp_window_signature,
)

__all__ = ["DwOp", "DepthwiseEngine", "dw_command_layout"]


class DwOp(enum.IntEnum):
    LOAD = 0
    CONV = 1


def dw_command_layout(config: NPUConfig) -> data.StructLayout:
    """A resolved ``dwload`` or ``dwconv``.

    ``dwload``: of the ``DW_LOAD_WINDOWS`` windows at ``sp + t*cols``, the first
    ``DW_TAPS`` become the taps, byte 0 of the next one the pad value, the last four
    the lanes' int32le biases.
    ``dwconv``: for ``r < h``, ``o < m``, lane ``j < n``: accumulator row
    ``acc + r*m + o`` gets the bias plus (or, with ``accumulate``, adds)
    ``sum tap[3i + 3-kw+c][j] * x[r*s + i][o*s + c][j]`` over ``i < kh``, ``c < kw``,
    where ``x[i][c]`` is the pad value in the ``pt``/``pb`` rows and ``pl``/``pr``
    columns around the window and ``sp + (i-pt)*row + (c-pl)*pix`` inside it.
    Strides are resolved (nonzero) and every bound checked.
    """
    return data.StructLayout({
        "op": DwOp,
        "sp": sp_addr_bits(config),
        "pix": STRIDE_BITS,
        "row": STRIDE_BITS,
        "m": M_BITS,
        "h": 5,
        "acc": acc_addr_bits(config),
        "accumulate": 1,
        "s": 2,
        "kh": 2,
        "kw": 2,
        "n": range(config.cols + 1),
        "pt": 2, "pb": 2, "pl": 2, "pr": 2,
    })


class DepthwiseEngine(wiring.Component):
    """Depthwise 3x3 convolution on ``cols`` channel lanes.

    One command at a time: ``cmd.ready`` is ``idle``. A ``dwconv`` issues one
    scratchpad read a cycle (``(h-1)*s + kh`` rows of each of ``(m-1)*s + kw``
    columns, column by column) and writes its ``h*m`` accumulator rows as the
    columns complete; ``done`` pulses the cycle after its last write, and the
    engine is idle from then. A ``dwload`` reads its ``DW_LOAD_WINDOWS`` windows and
    is done the cycle after the last arrives. Commands are legal (the sequencer
    checks them): ``(h-1)*s + kh <= config.dw_rows``.

    Members
    -------
    cmd : In(command_stream(dw_command_layout(config)))
    sp : Out(sp_window_signature(config))
        Scratchpad reads (``we`` = 0).
    acc : Out(acc_port_signature(config))
        Writes, and reads for ``accumulate``.
    done, idle, busy : Out(1)
    macs : Out(range(DW_TAPS * cols + 1))
        MACs of the row written this cycle (``kh * kw * n``).
    """

    def __init__(self, config: NPUConfig):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if config.dw_rows < DW_KERNEL:
            raise ValueError(f"config.dw_rows={config.dw_rows}: the depthwise engine needs "
                             f"at least {DW_KERNEL} rows")
        self.config = config
        super().__init__({
            "cmd": In(command_stream(dw_command_layout(config))),
            "sp": Out(sp_window_signature(config)),
            "acc": Out(acc_port_signature(config)),
            "done": Out(1), "idle": Out(1), "busy": Out(1),
            "macs": Out(range(DW_TAPS * config.cols + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        C, K, ROWS = cfg.cols, DW_KERNEL, cfg.dw_rows
        sp, acc = self.sp, self.acc
        cmd = Signal(dw_command_layout(cfg))
        busy = Signal()
        accept = self.cmd.valid & ~busy
        m.d.comb += [self.cmd.ready.eq(~busy), self.busy.eq(busy), self.idle.eq(~busy)]

        def window(v):
            return Cat(v[8 * j: 8 * j + 8] for j in range(C))

        # ---- reads: column by column, the rows of a column top down -------------------
        issuing = Signal()
        is_load = cmd.op == DwOp.LOAD
        col_base = Signal(sp_addr_bits(cfg))
        addr = Signal(sp_addr_bits(cfg))
        q = Signal(range(max(ROWS, DW_LOAD_WINDOWS)))  # row of the column (window of a dwload)
        x = Signal(M_BITS + 1)  # input column
        rows_in = Signal(range(ROWS + 1))
        cols_in = Signal(M_BITS + 2)
        # the columns that end a kernel window: from kw - 1 on, every s-th
        phase = Signal(range(K + 1))  # columns until the next window's end
        # Window positions in the pads are not read: the pad value takes their slot.
        pad_row = (q < cmd.pt) | (q >= rows_in - cmd.pb)
        pad_col = (x < cmd.pl) | (x >= cols_in - cmd.pr)
        pad = ~is_load & (pad_row | pad_col)
        m.d.comb += [sp.valid.eq(issuing & ~pad), sp.addr.eq(addr), sp.we.eq(0)]
        grant = issuing & (pad | sp.ready)  # the window's slot is done
        last_row = Mux(is_load, q == DW_LOAD_WINDOWS - 1, q == rows_in - 1)
        last_col = x == cols_in - 1
        fires = phase == 0
        with m.If(grant):
            with m.If(last_row):
                # (a pad column leaves the walk where it is)
                next_col = col_base + Mux(is_load | pad_col, 0, cmd.pix)
                m.d.sync += [q.eq(0), x.eq(x + 1), col_base.eq(next_col), addr.eq(next_col),
                             phase.eq(Mux(fires, cmd.s - 1, phase - 1))]
                with m.If(is_load | last_col):
                    m.d.sync += issuing.eq(0)
            with m.Else():
                m.d.sync += [q.eq(q + 1),
                             addr.eq(addr + Mux(is_load, C, Mux(pad, 0, cmd.row)))]

        # Context of each read, until its data arrives.
        ctx_layout = data.StructLayout({"valid": 1, "q": range(max(ROWS, DW_LOAD_WINDOWS)),
                                        "end": 1, "fires": 1, "load": 1, "pad": 1})
        ctx = Signal(ctx_layout)
        m.d.comb += [ctx.valid.eq(grant), ctx.q.eq(q), ctx.end.eq(last_row),
                     ctx.fires.eq(last_row & fires), ctx.load.eq(is_load), ctx.pad.eq(pad)]
        resp = data.View(ctx_layout, delayed(m, ctx.as_value(), SP_READ_LATENCY, "dw_ctx")[-1])
        pad_value = Signal(8)
        data_in = Mux(resp.pad, pad_value.replicate(C), window(sp.rdata))

        # ---- taps and the column registers ---------------------------------------------
        taps = Array(Signal(8 * C, name=f"tap{t}") for t in range(DW_TAPS))
        incoming = Array(Signal(8 * C, name=f"in{r}") for r in range(ROWS))
        cols = [Array(Signal(8 * C, name=f"col{c}_{r}") for r in range(ROWS)) for c in range(K)]
        load_done = Signal()
        m.d.sync += load_done.eq(0)
        bias = Array(Signal(8 * C, name=f"bias_bytes{k}") for k in range(4))
        with m.If(resp.valid & resp.load):
            with m.If(resp.q == DW_PAD_WINDOW):
                m.d.sync += pad_value.eq(data_in[:8])
            with m.Elif(resp.q >= DW_BIAS_WINDOW):
                m.d.sync += bias[resp.q - DW_BIAS_WINDOW].eq(data_in)
            with m.Else():
                m.d.sync += taps[resp.q].eq(data_in)
            m.d.sync += load_done.eq(resp.end)
        with m.If(resp.valid & ~resp.load):
            m.d.sync += incoming[resp.q].eq(data_in)
            with m.If(resp.end):
                for r in range(ROWS):
                    for c in range(K - 1):
                        m.d.sync += cols[c][r].eq(cols[c + 1][r])
                    m.d.sync += cols[K - 1][r].eq(Mux(resp.q == r, data_in, incoming[r]))

        # ---- outputs: h rows per completed window, one a cycle ----------------------------
        computing = Signal()
        r_left = Signal(5)
        r_base = Signal(range(2 * 16 + 1))  # r * s: the window's first input row
        out_addr = Signal(acc_addr_bits(cfg))  # acc + r*m + o
        out_o = Signal(acc_addr_bits(cfg))  # acc + o
        with m.If(resp.valid & ~resp.load & resp.fires):
            m.d.sync += [computing.eq(1), r_left.eq(cmd.h - 1), r_base.eq(0),
                         out_addr.eq(out_o), out_o.eq(out_o + 1)]
        with m.Elif(computing):
            m.d.sync += [r_left.eq(r_left - 1), r_base.eq(r_base + cmd.s),
                         out_addr.eq(out_addr + cmd.m)]
            with m.If(r_left == 0):
                m.d.sync += computing.eq(0)

        # Taps outside the kh x kw kernel (rows from kh, columns left of 3 - kw) count 0.
        used = Array(Signal(name=f"tap_used{t}") for t in range(DW_TAPS))
        with m.If(accept):
            p = self.cmd.payload
            for i in range(K):
                for c in range(K):
                    m.d.sync += used[i * K + c].eq((i < p.kh) & (c >= K - p.kw))

        # C1: the products, registered.
        prod = [[Signal(16, name=f"prod{t}_{j}") for j in range(C)] for t in range(DW_TAPS)]
        v1 = Signal()
        a1 = Signal.like(out_addr)
        m.d.sync += [v1.eq(computing), a1.eq(out_addr)]
        # The products and sums are zero but for a window computed (``computing``, then
        # ``v1``), the only ones read: the simulated model skips their 72 multipliers
        # and sums on the engine's idle cycles, and in hardware the zero is the
        # flip-flops' synchronous reset, as an unused tap's already was.
        for i in range(K):
            win_row = r_base + i
            for c in range(K):
                t = i * K + c
                win = cols[c][win_row]
                for j in range(C):
                    w = taps[t][8 * j: 8 * j + 8].as_signed()
                    xv = win[8 * j: 8 * j + 8].as_signed()
                    m.d.sync += prod[t][j].eq(Mux(used[t] & computing, w * xv, 0))
        # C2: the lane sums, registered; the accumulator row is read for accumulate.
        sums = [Signal(32, name=f"sum{j}") for j in range(C)]
        v2 = Signal()
        a2 = Signal.like(out_addr)
        m.d.sync += [v2.eq(v1), a2.eq(a1)]
        for j in range(C):
            total = prod[0][j].as_signed()
            for t in range(1, DW_TAPS):
                total = total + prod[t][j].as_signed()
            m.d.sync += sums[j].eq(Mux(v1, total, 0))
        m.d.comb += [acc.ren.eq(v1 & cmd.accumulate), acc.raddr.eq(a1)]
        # C3: the write.
        lanes = Cat(Signal(32, name=f"acc_in{j}") for j in range(C))
        bias_words = Cat(bias)  # lane j: bytes 4j..4j+3
        for j in range(C):
            old = Mux(cmd.accumulate, acc.rdata[32 * j: 32 * j + 32],
                      bias_words[32 * j: 32 * j + 32])
            m.d.comb += lanes[32 * j: 32 * j + 32].eq(sums[j] + old)
        m.d.comb += [acc.wen.eq(v2), acc.waddr.eq(a2), acc.wdata.eq(lanes),
                     acc.wmask.eq(Cat(j < cmd.n for j in range(C)))]
        kkn = Signal.like(self.macs)
        m.d.comb += self.macs.eq(Mux(v2, kkn, 0))

        # ---- command life ------------------------------------------------------------------
        writes_left = Signal(M_BITS + 5)
        conv_end = Signal()
        m.d.comb += conv_end.eq(v2 & (writes_left == 1))
        with m.If(v2):
            m.d.sync += writes_left.eq(writes_left - 1)
        m.d.sync += self.done.eq(Mux(is_load, load_done, conv_end) & busy)
        with m.If(busy & Mux(is_load, load_done, conv_end)):
            m.d.sync += busy.eq(0)
        with m.If(accept):
            p = self.cmd.payload
            m.d.sync += [
                cmd.eq(p), busy.eq(1), issuing.eq(1), q.eq(0), x.eq(0),
                addr.eq(p.sp), col_base.eq(p.sp),
                rows_in.eq((p.h - 1) * p.s + p.kh),
                cols_in.eq((p.m - 1) * p.s + p.kw),
                phase.eq(p.kw - 1), out_o.eq(p.acc),
                writes_left.eq(p.h * p.m), kkn.eq(p.kh * p.kw * p.n),
            ]
        return m
