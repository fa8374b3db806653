"""The int32 accumulator buffer shared by the GEMM engine and the vector unit."""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from firmware.config import NPUConfig

from .ports import acc_port_signature


class Accumulator(wiring.Component):
    """``acc_rows`` x ``cols`` int32, one write per cycle and ``acc_ports`` reads.

    With one read port (``config.acc_ports == 1``) the compute engine hands the
    buffer to one user at a time through ``sel`` (0: the GEMM engine's ``array``
    port, 1: the vector unit's ``vector`` port); the other port is ignored, and its
    ``rdata`` is whatever the buffer read.

    With two, each user reads its own copy of the buffer (both copies take every
    write), so the vector unit reads rows while the array writes others. The write
    port goes to the vector unit in the cycles it writes and to the array otherwise:
    the compute queue never lets the two write at once (only ``vbias`` writes from
    the vector unit, and it runs while the array is idle), nor lets one read a row
    the other writes (:class:`hdl.queues.ComputeQueue`). ``sel`` is ignored.

    Members
    -------
    array, vector : In(acc_port_signature(config))
        The two users (see :func:`hdl.ports.acc_port_signature`).
    sel : In(1)
        Which user owns the buffer this cycle (one read port only).
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        sig = acc_port_signature(config)
        super().__init__({
            "array": In(sig),
            "vector": In(sig),
            "sel": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.mem = mem = Memory(shape=cfg.cols * 32, depth=cfg.acc_rows, init=[])
        wr = mem.write_port(granularity=32)
        a, v = self.array, self.vector
        if cfg.acc_ports == 2:
            rd_a, rd_v = mem.read_port(), mem.read_port()
            wsel = v.wen
            m.d.comb += [
                rd_a.en.eq(a.ren), rd_a.addr.eq(a.raddr), a.rdata.eq(rd_a.data),
                rd_v.en.eq(v.ren), rd_v.addr.eq(v.raddr), v.rdata.eq(rd_v.data),
            ]
        else:
            rd = mem.read_port()
            wsel = self.sel
            for port in (a, v):
                m.d.comb += port.rdata.eq(rd.data)
            m.d.comb += [
                rd.en.eq(Mux(wsel, v.ren, a.ren)),
                rd.addr.eq(Mux(wsel, v.raddr, a.raddr)),
            ]
        wen = Mux(wsel, v.wen, a.wen)
        m.d.comb += [
            wr.addr.eq(Mux(wsel, v.waddr, a.waddr)),
            wr.data.eq(Mux(wsel, v.wdata, a.wdata)),
            wr.en.eq(Mux(wsel, v.wmask, a.wmask) & wen.replicate(cfg.cols)),
        ]
        return m
