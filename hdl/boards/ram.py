"""On-chip RAM standing in for DRAM on the boards: one memory, two bus ports.

The NPU's DMA reaches it through an AXI4 subordinate port with bursts, the UART
bridge (the host) through an AXI4-Lite subordinate port. Both address the same
bytes: DRAM address ``a`` is RAM byte ``a`` on either port.
"""

from __future__ import annotations

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from ..axi import RESP_DECERR, RESP_OKAY, RESP_SLVERR, axi4_lite_signature, axi4_signature

__all__ = ["DualPortRam", "BURST_FIXED", "BURST_INCR", "BURST_WRAP"]

BURST_FIXED, BURST_INCR, BURST_WRAP = 0, 1, 2

class DualPortRam(wiring.Component):
    """``size_bytes`` of on-chip RAM behind an AXI4 port and an AXI4-Lite port.

    Behaviour
    ---------
    * One storage array, one access per cycle: the two ports take turns a whole
      transaction at a time (an AXI4 burst, or one AXI4-Lite read or write),
      granted round-robin among the four request kinds (AXI4 read, AXI4 write,
      AXI4-Lite read, AXI4-Lite write), so no port starves.
    * AXI4 port: FIXED and INCR bursts of 1..256 beats, any ``size`` up to the bus
      width (beats address the bus word holding their byte address; ``wstrb``
      selects the lanes written). A burst streams one beat per cycle. WRAP bursts
      are answered SLVERR (reads return zero data) and write nothing. Write data is
      accepted only after its address; ``bid``/``rid`` echo ``awid``/``arid``.
    * AXI4-Lite port: 32-bit words at byte addresses (the low two bits are ignored),
      with byte strobes.
    * A beat or access at a byte address ``>= size_bytes`` touches no memory and
      answers DECERR (a read returns zero data); a write burst with such a beat
      answers DECERR once, for the whole burst, after writing its in-range beats.
    * The contents are not reset; they start as zero in simulation.

    Parameters
    ----------
    size_bytes : int
        RAM size, a positive multiple of ``bus_bytes``.
    bus_bytes : int
        AXI4 data width in bytes: 4, 8, 16, 32 or 64 (the NPU's ``bus_bytes``).

    Members
    -------
    axi : In(axi4_signature(32, bus_bytes * 8))
        Subordinate port for the NPU's DMA.
    lite : In(axi4_lite_signature(addr_width, 32))
        Subordinate port for the host bridge, ``addr_width = (size_bytes - 1).bit_length()``.
    """

    def __init__(self, size_bytes: int, bus_bytes: int):
        self._MustUse__silence = True  # until the arguments are known good
        if not isinstance(bus_bytes, int) or bus_bytes not in (4, 8, 16, 32, 64):
            raise ValueError(f"bus_bytes={bus_bytes!r}: must be 4, 8, 16, 32 or 64")
        if (not isinstance(size_bytes, int) or isinstance(size_bytes, bool)
                or size_bytes <= 0 or size_bytes % bus_bytes):
            raise ValueError(f"size_bytes={size_bytes!r}: must be a positive multiple of "
                             f"bus_bytes={bus_bytes}")
        if size_bytes > 1 << 32:
            raise ValueError(f"size_bytes={size_bytes!r}: at most 4 GiB (32-bit addresses)")
        self._MustUse__silence = False
        self.size_bytes = size_bytes
        self.bus_bytes = bus_bytes
        self.addr_width = max(1, (size_bytes - 1).bit_length())
        super().__init__({
            "axi": In(axi4_signature(32, bus_bytes * 8)),
            "lite": In(axi4_lite_signature(self.addr_width, 32)),
        })

    @property
    def depth(self) -> int:
        """Bus words of storage."""
        return self.size_bytes // self.bus_bytes

    # ---- storage ----------------------------------------------------------------------
    def _storage(self, m, addr, ren, wen, wdata):
        """Return the read data (valid the cycle after ``ren``, held while ``ren`` is low).

        In block RAM a write lands a cycle after ``wen``: its enable, address and data
        are registered first, because the enable, decided by the arbitration and the
        bus handshakes, reaches every block RAM (64 on the ULX3S) and was a routed
        board build's critical path. No read can see the storage before such a write:
        every write is followed by a write response cycle (WRITE_B, LITE_B) or by the
        burst's next write, and a read is issued in IDLE or READ only."""
        w = self.bus_bytes
        m.submodules.mem = mem = Memory(shape=w * 8, depth=self.depth, init=[])
        rd = mem.read_port()
        wr = mem.write_port(granularity=8)
        wen_q = Signal(w, name="mem_wen_q")
        waddr_q = Signal.like(addr, name="mem_waddr_q")
        wdata_q = Signal(w * 8, name="mem_wdata_q")
        m.d.sync += [wen_q.eq(wen), waddr_q.eq(addr), wdata_q.eq(wdata)]
        # The block RAMs read every cycle and a register holds the last word read:
        # the read enable, decided by the arbitration and the bus handshakes, would
        # otherwise reach the clock enable of every block RAM (64 on the ULX3S), a
        # routed board build's critical path.
        ren_q = Signal(name="mem_ren_q")
        held = Signal(w * 8, name="mem_rdata_held")
        rdata = Signal(w * 8, name="mem_rdata")
        m.d.sync += [ren_q.eq(ren), held.eq(rdata)]
        m.d.comb += [
            rd.addr.eq(addr),
            rdata.eq(Mux(ren_q, rd.data, held)),
            wr.en.eq(wen_q), wr.addr.eq(waddr_q), wr.data.eq(wdata_q),
        ]
        return rdata

    # ---- control ----------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        w = self.bus_bytes
        lw = exact_log2(w)
        size = self.size_bytes
        axi, lite = self.axi, self.lite

        # one access per cycle to the storage
        m_addr = Signal(range(self.depth), name="mem_addr")
        m_ren = Signal(name="mem_ren")
        m_wen = Signal(w, name="mem_wen")
        m_wdata = Signal(w * 8, name="mem_wdata")
        m_rdata = self._storage(m, m_addr, m_ren, m_wen, m_wdata)

        def word(byte_addr):
            return byte_addr[lw:lw + max(1, (self.depth - 1).bit_length())]

        def in_range(byte_addr):
            # A 32-bit address beyond a power-of-two size has high bits set.
            return byte_addr < size if size < 1 << len(byte_addr) else C(1, 1)

        # ---- round-robin grant among the four request kinds ----------------------------
        reqs = Cat(axi.arvalid, axi.awvalid, lite.arvalid, lite.awvalid & lite.wvalid)
        last = Signal(2, name="rr_last")  # the kind granted last
        grant = Signal(4, name="grant")
        chosen = Signal(name="chosen")
        for off in reversed(range(1, 5)):
            # kind (last + off) % 4 has the highest priority at off = 1
            for k in range(4):
                with m.If((last == (k - off) % 4) & reqs[k]):
                    m.d.comb += [grant.eq(1 << k), chosen.eq(1)]

        # ---- AXI4 burst state ------------------------------------------------------------
        b_addr = Signal(32, name="burst_addr")
        b_left = Signal(9, name="burst_left")  # read beats still to issue
        b_size = Signal(3, name="burst_size")
        b_fixed = Signal(name="burst_fixed")
        b_bad = Signal(name="burst_wrap")  # WRAP: answered SLVERR
        b_err = Signal(name="burst_err")  # a write beat fell outside the RAM
        b_id = Signal(len(axi.arid), name="burst_id")
        b_next = Signal(32, name="burst_next")
        m.d.comb += b_next.eq(Mux(b_fixed, b_addr, b_addr + (C(1, 8) << b_size)))

        r_err = Signal(2, name="r_resp_q")  # response of the beat being presented
        l_lane = Signal(max(1, lw - 2), name="lite_lane_q")
        l_resp = Signal(2, name="lite_resp_q")

        m.d.comb += [
            axi.rid.eq(b_id), axi.bid.eq(b_id),
            axi.rdata.eq(Mux(r_err == RESP_OKAY, m_rdata, 0)),
            axi.rresp.eq(r_err),
            lite.bresp.eq(l_resp), lite.rresp.eq(l_resp),
        ]
        if lw > 2:
            lanes = Array(m_rdata[32 * i:32 * i + 32] for i in range(w // 4))
            lite_word = lanes[l_lane]
        else:
            lite_word = m_rdata
        m.d.comb += lite.rdata.eq(Mux(l_resp == RESP_OKAY, lite_word, 0))

        with m.FSM(name="ram_fsm") as fsm:
            with m.State("IDLE"):
                with m.If(chosen):
                    m.d.sync += last.eq(Mux(grant[0], 0, Mux(grant[1], 1, Mux(grant[2], 2, 3))))
                with m.If(grant[0]):  # AXI4 read burst
                    m.d.comb += axi.arready.eq(1)
                    m.d.sync += [
                        b_addr.eq(axi.araddr), b_left.eq(axi.arlen + 1),
                        b_size.eq(Mux(axi.arsize > lw, lw, axi.arsize)),
                        b_fixed.eq(axi.arburst == BURST_FIXED),
                        b_bad.eq(axi.arburst == BURST_WRAP), b_id.eq(axi.arid),
                        axi.rvalid.eq(0),
                    ]
                    m.next = "READ"
                with m.If(grant[1]):  # AXI4 write burst
                    m.d.comb += axi.awready.eq(1)
                    m.d.sync += [
                        b_addr.eq(axi.awaddr),
                        b_size.eq(Mux(axi.awsize > lw, lw, axi.awsize)),
                        b_fixed.eq(axi.awburst == BURST_FIXED),
                        b_bad.eq(axi.awburst == BURST_WRAP), b_id.eq(axi.awid),
                        b_err.eq(0),
                    ]
                    m.next = "WRITE"
                with m.If(grant[2]):  # AXI4-Lite read: the word arrives next cycle
                    ok = in_range(lite.araddr)
                    m.d.comb += [
                        lite.arready.eq(1), m_ren.eq(ok),
                    ]
                    m.d.sync += [
                        l_resp.eq(Mux(ok, RESP_OKAY, RESP_DECERR)),
                        l_lane.eq(lite.araddr[2:lw] if lw > 2 else 0),
                    ]
                    m.next = "LITE_R"
                with m.If(grant[3]):  # AXI4-Lite write: address and data together
                    ok = in_range(lite.awaddr)
                    shift = lite.awaddr[2:lw] if lw > 2 else C(0, 1)
                    m.d.comb += [
                        lite.awready.eq(1), lite.wready.eq(1),
                        m_wdata.eq(lite.wdata.replicate(w // 4)),
                        m_wen.eq(Mux(ok, lite.wstrb << (shift * 4), 0)),
                    ]
                    m.d.sync += l_resp.eq(Mux(ok, RESP_OKAY, RESP_DECERR))
                    m.next = "LITE_B"

            with m.State("READ"):
                # The storage's read data holds while nothing is read, so a beat
                # stalled by rready stays on rdata until taken.
                advance = ~axi.rvalid | axi.rready
                with m.If(advance):
                    with m.If(b_left != 0):
                        ok = in_range(b_addr) & ~b_bad
                        m.d.comb += m_ren.eq(ok)
                        m.d.sync += [
                            axi.rvalid.eq(1),
                            axi.rlast.eq(b_left == 1),
                            r_err.eq(Mux(b_bad, RESP_SLVERR,
                                         Mux(ok, RESP_OKAY, RESP_DECERR))),
                            b_addr.eq(b_next), b_left.eq(b_left - 1),
                        ]
                    with m.Else():
                        m.d.sync += [axi.rvalid.eq(0), axi.rlast.eq(0)]
                        m.next = "IDLE"

            with m.State("WRITE"):
                m.d.comb += axi.wready.eq(1)
                with m.If(axi.wvalid):
                    ok = in_range(b_addr) & ~b_bad
                    m.d.comb += [m_wdata.eq(axi.wdata), m_wen.eq(Mux(ok, axi.wstrb, 0))]
                    m.d.sync += [b_addr.eq(b_next), b_err.eq(b_err | ~in_range(b_addr))]
                    with m.If(axi.wlast):
                        m.next = "WRITE_B"

            with m.State("WRITE_B"):
                m.d.comb += [
                    axi.bvalid.eq(1),
                    axi.bresp.eq(Mux(b_bad, RESP_SLVERR,
                                     Mux(b_err, RESP_DECERR, RESP_OKAY))),
                ]
                with m.If(axi.bready):
                    m.next = "IDLE"

            with m.State("LITE_R"):
                m.d.comb += lite.rvalid.eq(1)
                with m.If(lite.rready):
                    m.next = "IDLE"

            with m.State("LITE_B"):
                m.d.comb += lite.bvalid.eq(1)
                with m.If(lite.bready):
                    m.next = "IDLE"

        # The storage's address depends on the state and the AXI4-Lite requests only,
        # not on the grant among all four kinds or on the bursts' handshakes: it fans
        # out to every block RAM (64 on the ULX3S), and was a routed board build's slow
        # path. Reading where no one asked is harmless (read data is taken only after
        # ``m_ren``), and only ``m_wen`` writes. In IDLE the address is the AXI4-Lite
        # request's, the write's when the grant would prefer it to the read (kind 3
        # before kind 2 only when kind 2 was granted last); a burst's own grant leaves
        # IDLE, and from then on the address is the burst's.
        lite_write = reqs[3] & (~reqs[2] | (last == 2))
        with m.If(fsm.ongoing("IDLE")):
            m.d.comb += m_addr.eq(word(Mux(lite_write, lite.awaddr, lite.araddr)))
        with m.Else():
            m.d.comb += m_addr.eq(word(b_addr))
        return m
