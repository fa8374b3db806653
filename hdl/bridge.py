"""UART-to-AXI4-Lite bridge: a board's host port (protocol in firmware/bridge.py).

The host sends request frames over the UART; the bridge buffers each frame, checks
it (CRC, command, length, address), executes it as AXI4-Lite transactions on the
NPU's CSR port or on the board RAM, and answers with one response frame.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from firmware.bridge import (
    BUS_TIMEOUT_CYCLES,
    CSR_SPACE,
    FLAG_IRQ,
    FRAME_TIMEOUT_BITS,
    MAX_PAYLOAD,
    POLL_LEN,
    RSYNC,
    SYNC,
    Command,
    Status,
)

from .axi import RESP_OKAY, axi4_lite_signature
from .uart import UartRx, UartTx, uart_divisor

__all__ = ["UartBridge", "crc16_step"]

_POLY = 0x1021


def _crc16_equations() -> list[list[tuple[str, int]]]:
    """For each CRC output bit, the input bits ('c' crc, 'd' data byte) it XORs."""
    v = [{("c", i)} ^ ({("d", i - 8)} if i >= 8 else set()) for i in range(16)]
    for _ in range(8):
        top = v[15]
        v = [top] + [v[i - 1] ^ (top if _POLY >> i & 1 else set()) for i in range(1, 16)]
    return [sorted(s) for s in v]


_CRC_EQ = _crc16_equations()


def crc16_step(crc: Value, byte: Value) -> Value:
    """CRC-16/CCITT-FALSE of ``crc`` (16 bits) continued by ``byte`` (8 bits).

    Built as one XOR per output bit (the CRC is linear), not as eight chained
    shift steps, to keep the logic two levels deep.
    """
    src = {"c": crc, "d": byte}
    bits = []
    for terms in _CRC_EQ:
        x = Const(0, 1)
        for kind, i in terms:
            x = x ^ src[kind][i]
        bits.append(x)
    return Cat(*bits)


class UartBridge(wiring.Component):
    """The host's way into a board: UART frames in, AXI4-Lite transactions out.

    One request at a time: the bridge answers every request frame with exactly one
    response frame (firmware/bridge.py) and ignores bytes that arrive while it
    executes or answers. A rejected frame executes nothing: the payload is buffered
    and every check passes before the first bus transaction. Memory requests become
    32-bit AXI4-Lite word transactions, with byte strobes for an unaligned head or
    tail (reads fetch whole words and keep the requested bytes). Transactions are
    issued one at a time, AW and W together; the first non-OKAY response (or a
    channel stalled for ``bus_timeout`` cycles, after which the bridge drops its
    valid signals, treating the slave as broken) ends the request with BUS_ERROR.

    Parameters
    ----------
    clk_freq : int
        The clock frequency in Hz.
    baud : int
        The UART bit rate; ``clk_freq / baud`` must round to at least 4 and be
        within 2% (see ``hdl.uart.uart_divisor``).
    mem_addr_width : int
        Byte-address width of the ``mem`` port (1..32); requests beyond it answer
        BAD_ADDRESS.
    max_payload : int
        Payload buffer in bytes (the protocol's MAX_PAYLOAD; the host learns it from
        a POLL).
    frame_timeout_bits : int
        Longest idle gap inside a frame, in bit times, before the frame is dropped
        with TIMEOUT.
    bus_timeout : int
        Bus watchdog in clock cycles.

    Members
    -------
    rx : In(1)
        UART receive line (idle high, 8N1).
    tx : Out(1)
        UART transmit line (idle high, 8N1).
    csr : Out(axi4_lite_signature(12, 32))
        Manager port to the NPU's CSR slave.
    mem : Out(axi4_lite_signature(mem_addr_width, 32))
        Manager port to the board RAM (byte addresses, 32-bit words, byte strobes).
    irq : In(1)
        The NPU's interrupt line, reported in every response's FLAGS.
    error : Out(1)
        High for one cycle when a frame is rejected (any status but OK and BUS_ERROR).
    """

    def __init__(self, clk_freq: int, baud: int, mem_addr_width: int, *,
                 max_payload: int = MAX_PAYLOAD, frame_timeout_bits: int = FRAME_TIMEOUT_BITS,
                 bus_timeout: int = BUS_TIMEOUT_CYCLES):
        try:
            self.divisor = uart_divisor(clk_freq, baud)
            if not isinstance(mem_addr_width, int) or not 1 <= mem_addr_width <= 32:
                raise ValueError(f"mem_addr_width must be an int in 1..32, not "
                                 f"{mem_addr_width!r}")
            if not isinstance(max_payload, int) or not 4 <= max_payload <= MAX_PAYLOAD:
                raise ValueError(f"max_payload must be an int in 4..{MAX_PAYLOAD}, not "
                                 f"{max_payload!r}")
            if not isinstance(frame_timeout_bits, int) or frame_timeout_bits < 20:
                raise ValueError(f"frame_timeout_bits must be an int >= 20 (two byte times), "
                                 f"not {frame_timeout_bits!r}")
            if not isinstance(bus_timeout, int) or bus_timeout < 16:
                raise ValueError(f"bus_timeout must be an int >= 16, not {bus_timeout!r}")
        except ValueError:
            self._MustUse__silence = True  # a failed construction is not an unused design
            raise
        self.clk_freq, self.baud = clk_freq, baud
        self.mem_addr_width = mem_addr_width
        self.max_payload = max_payload
        self.frame_timeout = frame_timeout_bits * self.divisor
        self.bus_timeout = bus_timeout
        super().__init__({
            "rx": In(1, init=1),
            "tx": Out(1, init=1),
            "csr": Out(axi4_lite_signature(12, 32)),
            "mem": Out(axi4_lite_signature(mem_addr_width, 32)),
            "irq": In(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        maxp = self.max_payload
        m.submodules.urx = urx = UartRx(self.divisor)
        m.submodules.utx = utx = UartTx(self.divisor)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]
        m.submodules.buf = buf = Memory(shape=8, depth=maxp, init=[])
        rd = buf.read_port()
        wr = buf.write_port()

        flags = Signal(8)
        m.d.comb += flags.eq(Mux(self.irq, FLAG_IRQ, 0))
        rx_byte = urx.out.payload.data
        rx_valid = urx.out.valid

        # ---- frame registers --------------------------------------------------------
        hdr = Signal(56)            # CMD ADDR[4] LEN[2], shifted in from the top
        cmd, addr, length = hdr[0:8], hdr[8:40], hdr[40:56]
        cnt = Signal(3)             # byte index within a header or CRC field
        idx = Signal(range(maxp + 1))  # payload byte index (buffer address)
        crc = Signal(16)
        crc_lo = Signal(8)
        crc_ok = Signal()
        bad = Signal()              # a UART framing error inside the frame
        word0 = Signal(32)          # the first payload bytes (MEM_READ's count)
        status = Signal(8)
        resp_len = Signal(range(maxp + 1))
        rejects = Signal(8)
        timer = Signal(range(max(self.frame_timeout, self.bus_timeout) + 1))

        # ---- bus engine registers -------------------------------------------------------
        use_csr = Signal()
        cur = Signal(32)            # next byte address
        last = Signal(32)           # address of the last byte gathered (names the word)
        remaining = Signal(range(maxp + 1))
        word = Signal(32)
        strb = Signal(4)
        aw_done = Signal()
        w_done = Signal()
        # Every bus handshake is taken into registers and acted on a cycle later
        # (``got``, ``aw_done``/``w_done``, the response in ``resp_q``), so that a
        # ready or valid from the CSR block or the RAM, across the chip, reaches only
        # these registers and not the next state or the enables of the frame
        # registers that the watchdog's finish() loads (routed board builds' slow
        # paths: bridge -> CSR block -> bridge). A cycle per handshake, on a frame
        # that takes thousands of cycles on the wire.
        resp_q = Signal(2)
        got = Signal()  # the handshake the state waits for happened last cycle

        m.d.comb += [rd.addr.eq(idx), wr.addr.eq(idx)]
        crc_rx_next = crc16_step(crc, rx_byte)
        m.d.sync += self.error.eq(0)

        # Both buses carry the engine's address and data; only the selected one sees
        # valid and ready.
        wordaddr = Cat(Const(0, 2), last[2:])
        readaddr = Cat(Const(0, 2), cur[2:])
        aw_valid, w_valid, b_ready, ar_valid, r_ready = (Signal(name=n) for n in (
            "aw_valid", "w_valid", "b_ready", "ar_valid", "r_ready"))
        for bus in (self.csr, self.mem):
            m.d.comb += [bus.awaddr.eq(wordaddr), bus.araddr.eq(readaddr),
                         bus.wdata.eq(word), bus.wstrb.eq(strb)]
        aw_ready, w_ready, b_valid, ar_ready, r_valid = (Signal(name=n) for n in (
            "aw_ready", "w_ready", "b_valid", "ar_ready", "r_valid"))
        b_resp, r_resp, r_data = Signal(2), Signal(2), Signal(32)
        for sel, bus in ((use_csr, self.csr), (~use_csr, self.mem)):
            m.d.comb += [bus.awvalid.eq(aw_valid & sel), bus.wvalid.eq(w_valid & sel),
                         bus.bready.eq(b_ready & sel), bus.arvalid.eq(ar_valid & sel),
                         bus.rready.eq(r_ready & sel)]
        for dst, a, b in ((aw_ready, self.csr.awready, self.mem.awready),
                          (w_ready, self.csr.wready, self.mem.wready),
                          (b_valid, self.csr.bvalid, self.mem.bvalid),
                          (ar_ready, self.csr.arready, self.mem.arready),
                          (r_valid, self.csr.rvalid, self.mem.rvalid),
                          (b_resp, self.csr.bresp, self.mem.bresp),
                          (r_resp, self.csr.rresp, self.mem.rresp),
                          (r_data, self.csr.rdata, self.mem.rdata)):
            m.d.comb += dst.eq(Mux(use_csr, a, b))

        # ---- request checks (registered, valid in CHECK) --------------------------------
        count = word0[:16]
        known = Signal()
        len_ok = Signal()
        addr_ok = Signal()
        mem_span = Mux(cmd == Command.MEM_READ, count, length)
        mem_end = Signal(34)
        m.d.comb += mem_end.eq(addr + mem_span)
        csr_addr_ok = (addr[:2] == 0) & (addr < CSR_SPACE)
        with m.Switch(cmd):
            with m.Case(Command.CSR_WRITE):
                m.d.comb += [known.eq(1), len_ok.eq(length == 4), addr_ok.eq(csr_addr_ok)]
            with m.Case(Command.CSR_READ):
                m.d.comb += [known.eq(1), len_ok.eq(length == 0), addr_ok.eq(csr_addr_ok)]
            with m.Case(Command.MEM_WRITE):
                m.d.comb += [known.eq(1), len_ok.eq((length != 0) & (length <= maxp)),
                             addr_ok.eq(mem_end <= (1 << self.mem_addr_width))]
            with m.Case(Command.MEM_READ):
                m.d.comb += [known.eq(1),
                             len_ok.eq((length == 2) & (count != 0) & (count <= maxp)),
                             addr_ok.eq(mem_end <= (1 << self.mem_addr_width))]
            with m.Case(Command.POLL):
                m.d.comb += [known.eq(1), len_ok.eq(length == 0), addr_ok.eq(1)]

        # The header and the first payload word are complete at least two received
        # bytes (the CRC) before CHECK reads the checks: registered on the way, they
        # keep the address arithmetic out of CHECK's decision.
        known_q, len_ok_q, addr_ok_q = Signal(), Signal(), Signal()
        m.d.sync += [known_q.eq(known), len_ok_q.eq(len_ok), addr_ok_q.eq(addr_ok)]

        def reject(code):
            m.d.sync += [status.eq(code), resp_len.eq(0), self.error.eq(1),
                         rejects.eq(rejects + 1)]
            respond()

        def respond():
            m.d.sync += [cnt.eq(0), crc.eq(0xFFFF)]
            m.next = "TX_HEADER"

        def finish(code):
            m.d.sync += status.eq(code)
            with m.If(code != Status.OK):
                m.d.sync += resp_len.eq(0)
            respond()

        def idle_gap(code):
            """A frame in progress ends with ``code`` after an idle gap on the line."""
            with m.If(rx_valid):
                m.d.sync += timer.eq(0)
                with m.If(urx.out.payload.error):
                    m.d.sync += bad.eq(1)
            with m.Elif(timer == self.frame_timeout):
                reject(code)
            with m.Else():
                m.d.sync += timer.eq(timer + 1)

        def watchdog():
            """Under ``m.Else()`` of a bus handshake: count the stall, give up at the limit."""
            with m.If(timer == self.bus_timeout):
                finish(Status.BUS_ERROR)
            with m.Else():
                m.d.sync += timer.eq(timer + 1)

        with m.FSM():
            with m.State("HUNT"):
                with m.If(rx_valid & (rx_byte == SYNC) & ~urx.out.payload.error):
                    m.d.sync += [cnt.eq(0), crc.eq(0xFFFF), bad.eq(0), word0.eq(0),
                                 timer.eq(0), hdr.eq(0)]
                    m.next = "HEADER"

            with m.State("HEADER"):
                idle_gap(Status.TIMEOUT)
                with m.If(rx_valid):
                    m.d.sync += [hdr.eq(Cat(hdr[8:], rx_byte)), crc.eq(crc_rx_next),
                                 cnt.eq(cnt + 1), idx.eq(0)]
                    with m.If(cnt == 6):
                        new_len = Cat(hdr[48:56], rx_byte)
                        with m.If(new_len > maxp):
                            m.next = "DRAIN"
                        with m.Elif(new_len == 0):
                            m.d.sync += cnt.eq(0)
                            m.next = "CRC"
                        with m.Else():
                            m.next = "PAYLOAD"

            with m.State("PAYLOAD"):
                idle_gap(Status.TIMEOUT)
                m.d.comb += [wr.data.eq(rx_byte), wr.en.eq(rx_valid)]
                with m.If(rx_valid):
                    m.d.sync += [crc.eq(crc_rx_next), idx.eq(idx + 1)]
                    with m.If(idx < 4):
                        m.d.sync += word0.word_select(idx[:2], 8).eq(rx_byte)
                    with m.If(idx == length - 1):
                        m.d.sync += cnt.eq(0)
                        m.next = "CRC"

            with m.State("CRC"):
                idle_gap(Status.TIMEOUT)
                with m.If(rx_valid):
                    m.d.sync += [crc_lo.eq(rx_byte), cnt.eq(1)]
                    with m.If(cnt == 1):
                        m.d.sync += crc_ok.eq((Cat(crc_lo, rx_byte) == crc) & ~bad
                                              & ~urx.out.payload.error)
                        m.next = "CHECK"

            with m.State("DRAIN"):
                idle_gap(Status.BAD_LENGTH)  # the oversize frame's end is the idle line

            with m.State("CHECK"):
                m.d.sync += [use_csr.eq((cmd == Command.CSR_WRITE) | (cmd == Command.CSR_READ)),
                             cur.eq(addr), idx.eq(0), word.eq(0), strb.eq(0),
                             aw_done.eq(0), w_done.eq(0)]
                with m.If(~crc_ok):
                    reject(Status.BAD_CRC)
                with m.Elif(~known_q):
                    reject(Status.BAD_COMMAND)
                with m.Elif(~len_ok_q):
                    reject(Status.BAD_LENGTH)
                with m.Elif(~addr_ok_q):
                    reject(Status.BAD_ADDRESS)
                with m.Else():
                    with m.Switch(cmd):
                        with m.Case(Command.CSR_WRITE, Command.MEM_WRITE):
                            m.d.sync += [remaining.eq(length), resp_len.eq(0)]
                            m.next = "W_FETCH"
                        with m.Case(Command.CSR_READ):
                            m.d.sync += [remaining.eq(4), resp_len.eq(4)]
                            m.next = "R_ADDR"
                        with m.Case(Command.MEM_READ):
                            m.d.sync += [remaining.eq(count), resp_len.eq(count)]
                            m.next = "R_ADDR"
                        with m.Default():  # POLL
                            m.d.sync += [status.eq(Status.OK), resp_len.eq(POLL_LEN)]
                            respond()

            # ---- writes: gather a word's bytes from the buffer, then AW+W, then B -------
            with m.State("W_FETCH"):
                m.next = "W_LATCH"  # the buffer's read port answers one cycle later
            with m.State("W_LATCH"):
                lane = cur[:2]
                m.d.sync += [word.word_select(lane, 8).eq(rd.data), strb.bit_select(lane, 1).eq(1),
                             last.eq(cur), cur.eq(cur + 1), idx.eq(idx + 1),
                             remaining.eq(remaining - 1), timer.eq(0)]
                with m.If((lane == 3) | (remaining == 1)):
                    m.next = "W_BUS"
                with m.Else():
                    m.next = "W_FETCH"
            with m.State("W_BUS"):
                m.d.comb += [aw_valid.eq(~aw_done), w_valid.eq(~w_done)]
                m.d.sync += [aw_done.eq(aw_done | (aw_valid & aw_ready)),
                             w_done.eq(w_done | (w_valid & w_ready))]
                with m.If(aw_done & w_done):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0), timer.eq(0)]
                    m.next = "W_RESP"
                with m.Else():
                    watchdog()
            with m.State("W_RESP"):
                m.d.comb += b_ready.eq(~got)
                m.d.sync += got.eq(b_valid & b_ready)
                with m.If(b_valid & b_ready):
                    m.d.sync += resp_q.eq(b_resp)
                with m.If(got):
                    m.next = "W_DONE"
                with m.Else():
                    watchdog()
            with m.State("W_DONE"):
                m.d.sync += [word.eq(0), strb.eq(0)]
                with m.If(resp_q != RESP_OKAY):
                    finish(Status.BUS_ERROR)
                with m.Elif(remaining == 0):
                    finish(Status.OK)
                with m.Else():
                    m.next = "W_FETCH"

            # ---- reads: AR, R, then scatter the word's wanted bytes into the buffer -----
            with m.State("R_ADDR"):
                m.d.comb += ar_valid.eq(~got)
                m.d.sync += got.eq(ar_valid & ar_ready)
                with m.If(got):
                    m.d.sync += timer.eq(0)
                    m.next = "R_DATA"
                with m.Else():
                    watchdog()
            with m.State("R_DATA"):
                m.d.comb += r_ready.eq(~got)
                m.d.sync += got.eq(r_valid & r_ready)
                with m.If(r_valid & r_ready):
                    m.d.sync += [word.eq(r_data), resp_q.eq(r_resp)]
                with m.If(got):
                    m.next = "R_DONE"
                with m.Else():
                    watchdog()
            with m.State("R_DONE"):
                with m.If(resp_q != RESP_OKAY):
                    finish(Status.BUS_ERROR)
                with m.Else():
                    m.next = "R_SCATTER"
            with m.State("R_SCATTER"):
                lane = cur[:2]
                m.d.comb += [wr.data.eq(word.word_select(lane, 8)), wr.en.eq(1)]
                m.d.sync += [cur.eq(cur + 1), idx.eq(idx + 1), remaining.eq(remaining - 1),
                             timer.eq(0)]
                with m.If(remaining == 1):
                    finish(Status.OK)
                with m.Elif(lane == 3):
                    m.next = "R_ADDR"

            # ---- the response: header, payload (buffer or poll bytes), CRC --------------
            with m.State("TX_HEADER"):
                header = Signal(8)
                with m.Switch(cnt):
                    for i, value in enumerate((RSYNC, cmd, status, flags, resp_len[:8],
                                               resp_len[8:])):
                        with m.Case(i):
                            m.d.comb += header.eq(value)
                m.d.comb += [utx.inp.valid.eq(1), utx.inp.payload.eq(header)]
                with m.If(utx.inp.ready):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt != 0):  # the sync byte is outside the CRC
                        m.d.sync += crc.eq(crc16_step(crc, header))
                    with m.If(cnt == 5):
                        m.d.sync += [idx.eq(0), cnt.eq(0)]
                        with m.If(resp_len == 0):
                            m.next = "TX_CRC"
                        with m.Else():
                            m.next = "TX_FETCH"
            with m.State("TX_FETCH"):
                m.next = "TX_SEND"
            with m.State("TX_SEND"):
                poll_byte = Signal(8)
                with m.Switch(idx[:2]):
                    for i, value in enumerate((flags, rejects,
                                               Const(maxp & 0xFF, 8), Const(maxp >> 8, 8))):
                        with m.Case(i):
                            m.d.comb += poll_byte.eq(value)
                byte = Mux(cmd == Command.POLL, poll_byte, rd.data)
                m.d.comb += [utx.inp.valid.eq(1), utx.inp.payload.eq(byte)]
                with m.If(utx.inp.ready):
                    m.d.sync += [crc.eq(crc16_step(crc, byte)), idx.eq(idx + 1)]
                    with m.If(idx == resp_len - 1):
                        m.next = "TX_CRC"
                    with m.Else():
                        m.next = "TX_FETCH"
            with m.State("TX_CRC"):
                m.d.comb += [utx.inp.valid.eq(1),
                             utx.inp.payload.eq(Mux(cnt == 0, crc[:8], crc[8:]))]
                with m.If(utx.inp.ready):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == 1):
                        m.next = "HUNT"

        return m
