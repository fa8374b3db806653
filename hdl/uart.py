"""UART receiver and transmitter: 8 data bits, no parity, 1 stop bit (8N1), LSB first.

Both run from the ``sync`` clock with an integer bit period ``divisor`` clock
cycles (:func:`uart_divisor` derives it from the clock and baud rates).
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["MIN_DIVISOR", "RX_LAYOUT", "UartRx", "UartTx", "uart_divisor"]

MIN_DIVISOR = 4
"""Smallest bit period in clock cycles: mid-bit sampling needs a few cycles per bit."""

MAX_BAUD_ERROR = 0.02
"""Largest relative baud-rate error :func:`uart_divisor` accepts (8N1 tolerates ~4%)."""

RX_LAYOUT = data.StructLayout({"data": 8, "error": 1})
"""A received byte; ``error`` is set when its stop bit read low (a framing error)."""


def uart_divisor(clk_freq: int, baud: int) -> int:
    """The bit period in clock cycles for ``baud`` on a ``clk_freq`` Hz clock.

    Raises ``ValueError`` when the divisor would be below :data:`MIN_DIVISOR` or the
    rounded divisor misses the baud rate by more than :data:`MAX_BAUD_ERROR`.
    """
    if not isinstance(clk_freq, int) or clk_freq <= 0:
        raise ValueError(f"clk_freq must be a positive int, not {clk_freq!r}")
    if not isinstance(baud, int) or baud <= 0:
        raise ValueError(f"baud must be a positive int, not {baud!r}")
    divisor = round(clk_freq / baud)
    if divisor < MIN_DIVISOR:
        raise ValueError(f"{clk_freq} Hz / {baud} baud gives a divisor of {clk_freq / baud:.2f}"
                         f"; at least {MIN_DIVISOR} clock cycles per bit are needed")
    error = abs(clk_freq / divisor - baud) / baud
    if error > MAX_BAUD_ERROR:
        raise ValueError(f"{clk_freq} Hz cannot make {baud} baud: divisor {divisor} is "
                         f"{100 * error:.1f}% off")
    return divisor


def _check_divisor(component, divisor):
    if not isinstance(divisor, int) or divisor < MIN_DIVISOR:
        component._MustUse__silence = True  # a failed construction is not an unused design
        raise ValueError(f"divisor must be an int >= {MIN_DIVISOR}, not {divisor!r}")


class UartRx(wiring.Component):
    """UART receiver, 8N1.

    The line passes a two-flop synchronizer. A falling edge starts a byte; the start
    bit is sampled again half a bit later and, if the line is back high, the edge was
    a glitch and is ignored (false-start check). Data bits and the stop bit are
    sampled at their middles. After the stop bit's middle the receiver is ready for
    the next start bit at once (so a sender's slightly fast clock is tolerated). A
    byte whose stop bit reads low is still delivered, with ``error`` set; the
    receiver then waits for the line to return high (a break is one error, not a
    stream of zero bytes).

    Parameters
    ----------
    divisor : int
        Bit period in clock cycles (>= :data:`MIN_DIVISOR`).

    Members
    -------
    rx : In(1)
        The serial line (idle high); asynchronous to the clock.
    out : Out(stream.Signature(RX_LAYOUT, always_ready=True))
        One transfer per received byte; the consumer must take it in that cycle.
    """

    def __init__(self, divisor: int):
        _check_divisor(self, divisor)
        self.divisor = divisor
        super().__init__({
            "rx": In(1, init=1),
            "out": Out(stream.Signature(RX_LAYOUT, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1)

        timer = Signal(range(div))
        bit = Signal(range(8))
        shift = Signal(8)
        m.d.sync += self.out.valid.eq(0)
        with m.If(timer != 0):
            m.d.sync += timer.eq(timer - 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer == 0):
                    with m.If(line):  # the low level did not last half a bit: noise
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [timer.eq(div - 1), bit.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer == 0):
                    m.d.sync += [shift.eq((shift >> 1) | (line << 7)), timer.eq(div - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer == 0):
                    m.d.sync += [self.out.valid.eq(1), self.out.payload.data.eq(shift),
                                 self.out.payload.error.eq(~line)]
                    with m.If(line):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """UART transmitter, 8N1.

    Takes a byte from ``inp`` when idle and shifts out start bit, 8 data bits (LSB
    first) and stop bit, ``divisor`` cycles each; ``inp.ready`` is high only while
    the line is idle (after the stop bit), so bytes follow back to back.

    Parameters
    ----------
    divisor : int
        Bit period in clock cycles (>= :data:`MIN_DIVISOR`).

    Members
    -------
    inp : In(stream.Signature(8))
        Bytes to send.
    tx : Out(1)
        The serial line (idle high, registered).
    """

    def __init__(self, divisor: int):
        _check_divisor(self, divisor)
        self.divisor = divisor
        super().__init__({
            "inp": In(stream.Signature(8)),
            "tx": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        timer = Signal(range(div))
        shift = Signal(10, init=0x3FF)  # stop(1) data(8) start(0), LSB out first
        left = Signal(range(11))
        m.d.comb += self.inp.ready.eq(left == 0)
        m.d.sync += self.tx.eq(shift[0])
        with m.If(left != 0):
            with m.If(timer == 0):
                m.d.sync += [shift.eq((shift >> 1) | Const(1 << 9, 10)), left.eq(left - 1),
                             timer.eq(div - 1)]
            with m.Else():
                m.d.sync += timer.eq(timer - 1)
        with m.Elif(self.inp.valid):
            m.d.sync += [shift.eq((self.inp.payload << 1) | Const(1 << 9, 10)), left.eq(10),
                         timer.eq(div - 1)]
        return m
