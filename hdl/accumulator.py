"""The int32 accumulator buffer shared by the GEMM engine and the vector unit."""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from firmware.config import NPUConfig

from .ports import acc_port_signature


class Accumulator(wiring.Component):
    """``acc_rows`` x ``cols`` int32, one read and one write per cycle.

    The compute engine hands the buffer to one user at a time through ``sel``
    (0: the GEMM engine's ``array`` port, 1: the vector unit's ``vector`` port);
    the other port is ignored, and its ``rdata`` is whatever the buffer read.

    Members
    -------
    array, vector : In(acc_port_signature(config))
        The two users (see :func:`hdl.ports.acc_port_signature`).
    sel : In(1)
        Which user owns the buffer this cycle.
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
        rd = mem.read_port()
        wr = mem.write_port(granularity=32)
        for port in (self.array, self.vector):
            m.d.comb += port.rdata.eq(rd.data)
        a, v, sel = self.array, self.vector, self.sel
        wen = Mux(sel, v.wen, a.wen)
        m.d.comb += [
            rd.en.eq(Mux(sel, v.ren, a.ren)),
            rd.addr.eq(Mux(sel, v.raddr, a.raddr)),
            wr.addr.eq(Mux(sel, v.waddr, a.waddr)),
            wr.data.eq(Mux(sel, v.wdata, a.wdata)),
            wr.en.eq(Mux(sel, v.wmask, a.wmask) & wen.replicate(cfg.cols)),
        ]
        return m
