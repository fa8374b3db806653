"""A simulated serial port: the byte stream ``host.serial_device.SerialDevice`` needs,
on a cocotb design's UART pins.

Host code is blocking Python running in a cocotb *bridge* thread (``cocotb.task.bridge``);
each :meth:`SimSerial.read` *resumes* a coroutine that waits in simulated time for
cocotbext-uart's ``UartSink`` to collect the bytes, and :meth:`SimSerial.write` queues
bytes on a ``UartSource``. So the real serial transport code runs unchanged against
simulated gateware, as ``serial.Serial`` would against a board::

    link = uart_stream(dut, baud=12_500_000)
    device = await bridge(lambda: SerialDevice(link, clock_hz=100_000_000))()

Reads time out in *simulated* time (like pyserial's ``timeout``, they then return
the bytes they have), and :meth:`SimSerial.clock` is the simulated time, so
``SerialDevice.wait_irq`` counts NPU cycles correctly.
"""

from __future__ import annotations

import logging

from firmware.bridge import MAX_PAYLOAD, REQUEST_HEADER, RESPONSE_HEADER

__all__ = ["SimSerial", "uart_stream"]


class SimSerial:
    """A pyserial-like stream on a UART pin pair (call its methods from a bridge thread).

    Parameters
    ----------
    rx : handle
        The design's receive pin (this stream drives it).
    tx : handle
        The design's transmit pin (this stream listens to it).
    baud : int
        The bit rate (``1e9 / baud`` should be a whole number of ns).
    timeout : float
        Seconds of simulated time a :meth:`read` waits for its bytes.
    """

    def __init__(self, rx, tx, baud: int, timeout: float):
        from cocotb.task import resume
        from cocotbext.uart import UartSink, UartSource

        self.baud = baud
        self.timeout = timeout
        self.source = UartSource(rx, baud=baud)
        self.sink = UartSink(tx, baud=baud)
        for side in (self.source, self.sink):  # a log line per byte costs more than the byte
            side.log.setLevel(logging.WARNING)
        self._read = resume(self._aread)
        self._write = resume(self._awrite)
        self.bytes_written = 0
        self.bytes_read = 0

    async def _awrite(self, data: bytes) -> None:
        await self.source.write(data)

    async def _aread(self, n: int) -> bytes:
        from cocotb.utils import get_sim_time

        out = bytearray()
        deadline = get_sim_time(unit="ns") + self.timeout * 1e9
        while len(out) < n:
            if self.sink.empty():
                left = deadline - get_sim_time(unit="ns")
                if left <= 0:
                    break
                await self.sink.wait(max(1, int(left)), "ns")
                continue
            out += self.sink.read_nowait(min(n - len(out), self.sink.count()))
        return bytes(out)

    def write(self, data: bytes) -> int:
        """Queue ``data`` for sending (returns at once, like a serial port's buffer)."""
        data = bytes(data)
        self._write(data)
        self.bytes_written += len(data)
        return len(data)

    def read(self, n: int) -> bytes:
        """Up to ``n`` received bytes; fewer if the timeout passes first."""
        data = self._read(n)
        self.bytes_read += len(data)
        return data

    def reset_input_buffer(self) -> None:
        """Drop the bytes received and not yet read."""
        self.sink.clear()

    def clock(self) -> float:
        """The simulated time in seconds."""
        from cocotb.utils import get_sim_time

        return get_sim_time(unit="ns") * 1e-9

    def close(self) -> None:
        """Nothing to release (the pins stay with the simulation)."""


def uart_stream(dut, baud: int, *, rx: str = "rx", tx: str = "tx",
                timeout: float | None = None) -> SimSerial:
    """The :class:`SimSerial` on ``dut``'s ``rx``/``tx`` pins (names as seen by the design).

    The default timeout covers a largest request, a largest response and a frame
    timeout of 2000 bit times: a read that times out means the design did not answer.
    """
    if timeout is None:
        frame_bits = 10 * (REQUEST_HEADER + MAX_PAYLOAD + RESPONSE_HEADER + MAX_PAYLOAD + 8)
        timeout = (2 * frame_bits + 2000) / baud
    return SimSerial(getattr(dut, rx), getattr(dut, tx), baud, timeout)
