"""The banked, word-interleaved scratchpad with byte-window ports.

The storage layout and the window port are defined in :mod:`hdl.ports` (module
docstring and :func:`hdl.ports.sp_window_signature`); this module serves them.
"""

from __future__ import annotations

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from firmware.config import NPUConfig

from .ports import SP_READ_LATENCY, delayed, sp_addr_bits, sp_window_signature, sp_word_bytes

__all__ = ["Scratchpad"]


class Scratchpad(wiring.Component):
    """``sp_bytes`` of on-chip SRAM behind ``ports`` byte-window ports.

    Storage is ``sp_banks`` banks of ``W = bus_bytes``-byte words, interleaved by
    word (word ``w`` is row ``w // sp_banks`` of bank ``w % sp_banks``); each bank
    has one read and one write port with byte-granular writes.

    Access rules
    ------------
    * A window at byte address ``a`` (``a < sp_bytes``) needs word ``a // W``
      and, if ``a`` is unaligned, word ``a // W + 1`` (modulo the number of words:
      a window wraps at ``sp_bytes``). A write needs the second word only when a
      strobed lane falls into it; a write always needs the first word.
    * Reads and writes are arbitrated separately (they never compete). Each
      cycle, a port is granted (``ready``) when none of the banks it needs is
      granted to a lower-numbered port of the same kind; ports whose banks do not
      overlap are granted in the same cycle. Fixed priority, lower index wins:
      under sustained contention a high-numbered port can starve, so requesters
      that must make progress get low indices or leave gaps in their traffic.
    * ``ready`` is combinational from the requests of this cycle.
    * Read data arrives ``SP_READ_LATENCY`` (2) cycles after the grant with
      ``rvalid``, realigned so that lane ``i`` is byte ``a + i``: the banks read in
      the cycle after the grant and their outputs are registered. A read granted in
      the same cycle as a write to the same byte returns the old byte; the write is
      visible to reads granted from the next cycle on. ``rdata`` is valid in the
      ``rvalid`` cycle only: it does not hold.
    * Strobed write lanes are written at the end of the granted cycle; the other
      lanes are left untouched.

    The contents are not reset (SRAM); they start as zero in simulation.

    Parameters
    ----------
    config : NPUConfig
        The NPU build (``sp_bytes``, ``sp_banks``, ``bus_bytes``).
    ports : int
        Number of window ports, at least 1. Port 0 has the highest priority.

    Members
    -------
    ports : In(sp_window_signature(config)).array(ports)
        The requesters' windows (see :func:`hdl.ports.sp_window_signature`).
    """

    def __init__(self, config: NPUConfig, ports: int):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if not isinstance(ports, int) or isinstance(ports, bool) or ports < 1:
            raise ValueError(f"ports={ports!r}: must be a positive integer")
        self.config = config
        self.port_count = ports
        super().__init__({"ports": In(sp_window_signature(config)).array(ports)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        w = sp_word_bytes(cfg)
        nbanks = cfg.sp_banks
        rows = cfg.sp_bytes // (w * nbanks)
        lw, lb = exact_log2(w), exact_log2(nbanks)
        abits = sp_addr_bits(cfg)

        reads, writes = [], []
        for k in range(nbanks):
            mem = Memory(shape=w * 8, depth=rows, init=[])
            m.submodules[f"bank{k}"] = mem
            # Not transparent: a read and a write of the same row in one cycle
            # return the old row, which is the documented same-cycle rule.
            reads.append(mem.read_port())
            writes.append(mem.write_port(granularity=8))

        # ---- decode every request into its (at most two) words --------------------
        dec = []
        for i, port in enumerate(self.ports):
            off = Signal(lw, name=f"p{i}_off")
            b0 = Signal(lb, name=f"p{i}_b0")
            b1 = Signal(lb, name=f"p{i}_b1")
            row0 = Signal(range(rows), name=f"p{i}_row0")
            row1 = Signal(range(rows), name=f"p{i}_row1")
            m.d.comb += [
                off.eq(port.addr[:lw]),
                b0.eq(port.addr[lw:lw + lb]),
                row0.eq(port.addr[lw + lb:abits]),
                b1.eq(b0 + 1),
                # The next word is in the next row only after the last bank,
                # and wraps to row 0 after the last word of the scratchpad.
                row1.eq(Mux(b0 == nbanks - 1,
                            Mux(row0 == rows - 1, 0, row0 + 1),
                            row0)),
            ]
            # Write lanes moved to their byte positions in the two-word pair.
            shift = Cat(C(0, 3), off)
            wide_data = Signal(2 * w * 8, name=f"p{i}_wide_data")
            wide_strb = Signal(2 * w, name=f"p{i}_wide_strb")
            m.d.comb += [
                wide_data.eq(port.wdata << shift),
                wide_strb.eq(port.wstrb << off),
            ]
            need1_r = Signal(name=f"p{i}_need1_r")
            need1_w = Signal(name=f"p{i}_need1_w")
            m.d.comb += [
                need1_r.eq(off != 0),
                need1_w.eq(wide_strb[w:].any()),
            ]
            need_r = Signal(nbanks, name=f"p{i}_need_r")
            need_w = Signal(nbanks, name=f"p{i}_need_w")
            for k in range(nbanks):
                m.d.comb += [
                    need_r[k].eq((b0 == k) | (need1_r & (b1 == k))),
                    need_w[k].eq((b0 == k) | (need1_w & (b1 == k))),
                ]
            dec.append(dict(off=off, b0=b0, b1=b1, row0=row0, row1=row1,
                            need1_r=need1_r, need1_w=need1_w, need_r=need_r, need_w=need_w,
                            wide_data=wide_data, wide_strb=wide_strb))

        # ---- fixed-priority arbitration, one chain per kind ------------------------
        claimed_r = C(0, nbanks)
        claimed_w = C(0, nbanks)
        grant_r, grant_w = [], []
        for i, (port, d) in enumerate(zip(self.ports, dec, strict=True)):
            gr = Signal(name=f"p{i}_grant_r")
            gw = Signal(name=f"p{i}_grant_w")
            m.d.comb += [
                gr.eq(port.valid & ~port.we & ~(d["need_r"] & claimed_r).any()),
                gw.eq(port.valid & port.we & ~(d["need_w"] & claimed_w).any()),
                port.ready.eq(gr | gw),
            ]
            grant_r.append(gr)
            grant_w.append(gw)
            if i == self.port_count - 1:
                break  # the last port's claims would bind no one
            cr = Signal(nbanks, name=f"claimed_r_{i}")
            cw = Signal(nbanks, name=f"claimed_w_{i}")
            m.d.comb += [
                cr.eq(claimed_r | Mux(gr, d["need_r"], 0)),
                cw.eq(claimed_w | Mux(gw, d["need_w"], 0)),
            ]
            claimed_r, claimed_w = cr, cw

        # ---- even and odd banks ------------------------------------------------------
        # A window's two words are in neighbouring banks, so one is in an even bank
        # and the other in an odd one. Each port therefore drives one even and one
        # odd bank, and each bank's data reaches a port through one selector, not
        # two (word 0 or 1): half the wires from the banks to the ports, which are
        # what congests the FPGA build's routing (docs/fpga-timing.md).
        half = nbanks // 2
        for i, d in enumerate(dec):
            odd = d["b0"][0]  # word 0 is in an odd bank, so word 1 is in the even one
            grp = d["b0"][1:]
            ev_idx = Signal(range(half), name=f"p{i}_ev_idx")
            m.d.comb += ev_idx.eq(Mux(odd, grp + 1, grp))  # wraps with the width
            wd, ws = d["wide_data"], d["wide_strb"]
            d["sides"] = (
                # (bank index in its half, row, needed by a read / a write, data, strobes)
                (ev_idx, Mux(odd, d["row1"], d["row0"]),
                 ~odd | d["need1_r"], ~odd | d["need1_w"],
                 Mux(odd, wd[w * 8:], wd[:w * 8]), Mux(odd, ws[w:], ws[:w])),
                (grp, Mux(odd, d["row0"], d["row1"]),
                 odd | d["need1_r"], odd | d["need1_w"],
                 Mux(odd, wd[:w * 8], wd[w * 8:]), Mux(odd, ws[:w], ws[w:])),
            )
            d["odd"] = odd

        # ---- bank inputs: at most one granted port per bank and kind, so OR them ---
        # The banks read every cycle (a bank no port reads reads row 0): a bank's output
        # is used only in the cycle after a grant (registered for ``rvalid``), so
        # nothing needs it held and the arbitration need not drive a read enable.
        for k in range(nbanks):
            r_addr = []
            w_addr, w_data, w_en = [], [], []
            for d, gr, gw in zip(dec, grant_r, grant_w, strict=True):
                idx, row, need_r, need_w, wdat, strb = d["sides"][k & 1]
                here = idx == (k >> 1) if half > 1 else C(1, 1)
                r = gr & need_r & here
                wr = gw & need_w & here
                r_addr.append(Mux(r, row, 0))
                w_addr.append(Mux(wr, row, 0))
                w_data.append(Mux(wr, wdat, 0))
                w_en.append(Mux(wr, strb, 0))
            m.d.comb += [
                reads[k].addr.eq(_or(r_addr)),
                writes[k].addr.eq(_or(w_addr)),
                writes[k].data.eq(_or(w_data)),
                writes[k].en.eq(_or(w_en)),
            ]

        # ---- read responses: the granted port's even and odd words, realigned ------
        # The banks' outputs are registered first (a block RAM's clock-to-output is most
        # of an FPGA cycle), so the data arrives SP_READ_LATENCY cycles after the grant.
        # Cat(even, odd, even) holds the window whichever bank word 0 is in: it starts
        # at byte ``off`` of the even word, or of the odd word (byte W + off).
        bank_q = []
        for k in range(nbanks):
            q = Signal(w * 8, name=f"bank{k}_q")
            m.d.sync += q.eq(reads[k].data)
            bank_q.append(q)
        even_data, odd_data = bank_q[0::2], bank_q[1::2]
        for i, (port, d, gr) in enumerate(zip(self.ports, dec, grant_r, strict=True)):
            sel = Signal(data.StructLayout({"off": lw, "odd": 1, "ev": range(half),
                                            "od": range(half)}), name=f"p{i}_sel")
            m.d.comb += [sel.off.eq(d["off"]), sel.odd.eq(d["odd"]),
                         sel.ev.eq(d["sides"][0][0]), sel.od.eq(d["sides"][1][0])]
            *_, sel_q = delayed(m, sel.as_value(), SP_READ_LATENCY, f"p{i}_sel")
            *_, rvalid_q = delayed(m, gr, SP_READ_LATENCY, f"p{i}_rvalid")
            sel_q = data.View(sel.shape(), sel_q)
            even, odd = _pick(even_data, sel_q.ev), _pick(odd_data, sel_q.od)
            m.d.comb += [
                port.rvalid.eq(rvalid_q),
                port.rdata.eq(Cat(even, odd, even).bit_select(
                    Cat(C(0, 3), sel_q.off, sel_q.odd), w * 8)),
            ]
        return m


def _pick(values, index):
    """``values[index]``; a single value needs no index."""
    return values[0] if len(values) == 1 else Array(values)[index]


def _or(values):
    """OR-reduce a non-empty list of values (one-hot selections)."""
    out = values[0]
    for v in values[1:]:
        out = out | v
    return out
