"""A board's NPU over a serial line: the :class:`Device` on ``hdl.bridge.UartBridge``.

Every access is one request frame and one response frame of the protocol in
firmware/bridge.py: a CSR read or write per register access, memory in bursts of
the bridge's payload size, and interrupt waits by polling (every response also
carries the interrupt line). The transport is any byte stream with ``write(bytes)``
and ``read(n) -> bytes`` that returns fewer than ``n`` bytes on a timeout:
``serial.Serial(port, baud, timeout=...)`` on a real board, a simulated UART in the
co-simulation (``verif.bridge_link``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from firmware.bridge import (
    MAX_PAYLOAD,
    RESPONSE_HEADER,
    RSYNC,
    Command,
    FrameError,
    Response,
    Status,
    csr_read,
    csr_write,
    decode_response,
    mem_read,
    mem_write,
    poll,
    response_length,
)

from .device import Device
from .driver import DeviceError

DEFAULT_CLOCK_HZ = 25_000_000
"""The NPU clock assumed when none is given (it converts wait_irq's cycles to time)."""

MAX_JUNK = 4096  # bytes skipped hunting a response's sync byte before giving up

# Rejections that, for a frame this class built, can only mean damage on the line (a
# BAD_LENGTH too: a stray sync byte makes the bridge read a length out of our frame).
# A rejected frame was not executed, so sending it again is safe.
RETRIED = (Status.BAD_CRC, Status.TIMEOUT, Status.BAD_LENGTH)


class LinkError(DeviceError):
    """No response, or a garbled one, from the bridge (cable, port, baud rate)."""


class BridgeError(DeviceError):
    """The bridge answered a request with an error status.

    Members
    -------
    status : the :class:`firmware.bridge.Status` it answered.
    command : the :class:`firmware.bridge.Command` of the request.
    addr : the request's address.
    """

    def __init__(self, status: Status, command: Command, addr: int):
        what = {
            Status.BAD_CRC: "the request arrived corrupted (CRC mismatch)",
            Status.BAD_COMMAND: "the bridge does not know the command",
            Status.BAD_LENGTH: "the request's length is not one the command takes",
            Status.BAD_ADDRESS: "the address is misaligned or outside the bus",
            Status.BUS_ERROR: "the bus answered an error (SLVERR/DECERR) or did not answer",
            Status.TIMEOUT: "the request frame was cut short (idle gap inside it)",
        }.get(status, "error")
        super().__init__(f"{command.name} at {addr:#x}: {status.name}: {what}")
        self.status, self.command, self.addr = status, command, addr


class BusError(BridgeError):
    """A CSR or memory access answered SLVERR/DECERR (or the bus hung)."""


@dataclass(frozen=True)
class PollStatus:
    """What a POLL reports.

    Members
    -------
    irq : the NPU's interrupt line.
    rejected : frames the bridge has rejected since reset (mod 256).
    max_payload : the bridge's largest payload in bytes.
    """

    irq: bool
    rejected: int
    max_payload: int


class SerialDevice(Device):
    """The NPU on a board, through its UART bridge.

    Construction polls the bridge (so a dead link fails here, with
    :class:`LinkError`) and learns its payload size. A request the bridge rejects
    in a way only line damage explains (BAD_CRC, TIMEOUT, BAD_LENGTH: not executed)
    is sent again ``retries`` times; any error status left raises :class:`BridgeError`
    (:class:`BusError` for BUS_ERROR). A missing or corrupted response raises
    :class:`LinkError`: the request may have executed, so it is not repeated.

    Parameters
    ----------
    stream : object with ``write(bytes)`` and ``read(n) -> bytes``
        The serial line. Optional: ``clock() -> seconds`` (the time base of
        :meth:`wait_irq`; default :func:`time.monotonic`), ``reset_input_buffer()``
        (drops stale input before a retry), ``close()``.
    clock_hz : int
        The NPU's clock, to turn :meth:`wait_irq`'s cycles into time.
    retries : int
        Resends of a request the bridge rejected as corrupted.
    """

    def __init__(self, stream, clock_hz: int = DEFAULT_CLOCK_HZ, *, retries: int = 1):
        if clock_hz <= 0:
            raise ValueError(f"clock_hz must be positive, not {clock_hz!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries!r}")
        self.stream = stream
        self.clock_hz = clock_hz
        self.retries = retries
        self._clock = getattr(stream, "clock", time.monotonic)
        self.irq = False
        self.max_payload = MAX_PAYLOAD
        self.max_payload = max(4, min(MAX_PAYLOAD, self.poll().max_payload))

    # ---- frames ---------------------------------------------------------------------
    def _read_exact(self, n: int, what: str) -> bytes:
        data = bytes(self.stream.read(n))
        if len(data) != n:
            raise LinkError(f"no response from the bridge ({what}: {len(data)} of {n} bytes "
                            "before the timeout); check the port, the baud rate and the board")
        return data

    def _receive(self) -> Response:
        for _ in range(MAX_JUNK):
            if self._read_exact(1, "waiting for a response")[0] == RSYNC:
                break
        else:
            raise LinkError(f"no response sync byte in {MAX_JUNK} bytes from the bridge")
        header = bytes([RSYNC]) + self._read_exact(RESPONSE_HEADER - 1, "response header")
        rest = self._read_exact(response_length(header) - RESPONSE_HEADER, "response body")
        try:
            return decode_response(header + rest)
        except FrameError as e:
            raise LinkError(f"garbled response from the bridge: {e}") from None

    def _transact(self, frame: bytes, command: Command, addr: int) -> Response:
        for attempt in range(self.retries + 1):
            self.stream.write(frame)
            resp = self._receive()
            if resp.status in RETRIED and attempt < self.retries:
                reset = getattr(self.stream, "reset_input_buffer", None)
                if reset is not None:
                    reset()
                continue
            break
        self.irq = resp.irq
        if resp.status == Status.OK:
            if resp.cmd != command:
                raise LinkError(f"{command.name} answered as command {resp.cmd:#04x}: the "
                                "link is out of step")
            return resp
        if resp.status == Status.BUS_ERROR:
            raise BusError(resp.status, command, addr)
        raise BridgeError(resp.status, command, addr)

    # ---- Device ---------------------------------------------------------------------
    def read_reg(self, addr: int) -> int:
        resp = self._transact(csr_read(addr), Command.CSR_READ, addr)
        if len(resp.payload) != 4:
            raise LinkError(f"CSR_READ answered with {len(resp.payload)} bytes, not 4")
        return int.from_bytes(resp.payload, "little")

    def write_reg(self, addr: int, value: int) -> None:
        self._transact(csr_write(addr, value), Command.CSR_WRITE, addr)

    def read_mem(self, addr: int, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            n = min(self.max_payload, size - len(out))
            a = addr + len(out)
            resp = self._transact(mem_read(a, n), Command.MEM_READ, a)
            if len(resp.payload) != n:
                raise LinkError(f"MEM_READ of {n} bytes answered with {len(resp.payload)}")
            out += resp.payload
        return bytes(out)

    def write_mem(self, addr: int, data: bytes) -> None:
        data = bytes(data)
        for off in range(0, len(data), self.max_payload):
            chunk = data[off:off + self.max_payload]
            self._transact(mem_write(addr + off, chunk), Command.MEM_WRITE, addr + off)

    def poll(self) -> PollStatus:
        """Ask the bridge for its status (interrupt line, rejected frames, payload size)."""
        p = self._transact(poll(), Command.POLL, 0).payload
        if len(p) < 4:
            raise LinkError(f"POLL answered with {len(p)} bytes, not 4")
        return PollStatus(irq=bool(p[0] & 1), rejected=p[1],
                          max_payload=int.from_bytes(p[2:4], "little"))

    def wait_irq(self, timeout_cycles: int) -> bool:
        """Poll until the interrupt line is high; False after ``timeout_cycles`` NPU cycles.

        The cycles become time at ``clock_hz``, measured by the stream's clock.
        """
        deadline = self._clock() + timeout_cycles / self.clock_hz
        while True:
            if self.poll().irq:
                return True
            if self._clock() >= deadline:
                return False

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()
