"""The UART bridge's framing protocol: one definition for the RTL and the host.

A host reaches a board's NPU over a serial line through ``hdl.bridge.UartBridge``,
which turns request frames into AXI4-Lite transactions on the NPU's CSR port and on
the board RAM, and answers every request with one response frame. This module is the
protocol: byte values, frame layouts, the CRC, the limits, and Python encoders and
decoders (the host's ``SerialDevice`` and the testbenches use them; the RTL takes its
constants from here).

Request frame (host -> bridge), multi-byte fields little-endian::

    SYNC  CMD  ADDR[4]  LEN[2]  PAYLOAD[LEN]  CRC[2]

Response frame (bridge -> host)::

    RSYNC  CMD  STATUS  FLAGS  LEN[2]  PAYLOAD[LEN]  CRC[2]

The framing never depends on the command: ``LEN`` is always the number of payload
bytes in the frame, so a frame with an unknown command is still delimited (and its
CRC checked) before it is rejected. The CRC is CRC-16/CCITT-FALSE over every byte
from ``CMD`` to the end of the payload (the sync byte is excluded).

Commands (``ADDR`` / payload):

========== ======================= ============================ =========================
command    ADDR                    request payload              response payload (OK)
========== ======================= ============================ =========================
CSR_WRITE  CSR byte address        value (4 bytes)              none
CSR_READ   CSR byte address        none                         value (4 bytes)
MEM_WRITE  RAM byte address        1..MAX_PAYLOAD data bytes    none
MEM_READ   RAM byte address        count (2 bytes, 1..MAX)      ``count`` data bytes
POLL       0                       none                         POLL_LEN status bytes
========== ======================= ============================ =========================

A bad frame is never executed: the payload is buffered and the CRC checked before any
bus transaction starts. Checks run in this order, and the first that fails answers:
a byte-to-byte gap longer than the frame timeout inside a frame (``TIMEOUT``), a
``LEN`` over ``MAX_PAYLOAD`` (``BAD_LENGTH``, answered once the line has gone idle for
the frame timeout, since the frame's end is unknown), a CRC mismatch or a UART framing
error inside the frame (``BAD_CRC``), an unknown command (``BAD_COMMAND``), a payload
length the command does not take (``BAD_LENGTH``), and an address out of range or
misaligned (``BAD_ADDRESS``). ``BUS_ERROR`` reports an AXI SLVERR/DECERR (or no
answer within the bridge's bus watchdog) from the bus: the transactions before it
took effect, none after it. After any response the bridge hunts for the next
``SYNC`` byte, skipping everything else (resynchronization).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

SYNC = 0xA5
"""First byte of every request frame."""
RSYNC = 0x5A
"""First byte of every response frame."""

MAX_PAYLOAD = 256
"""Largest payload, in bytes, of a request (MEM_WRITE) or a response (MEM_READ)."""

CSR_SPACE = 1 << 12
"""CSR addresses are word-aligned and below this (the NPU's 4 KiB CSR window)."""

REQUEST_HEADER = 8  # SYNC CMD ADDR[4] LEN[2]
RESPONSE_HEADER = 6  # RSYNC CMD STATUS FLAGS LEN[2]
CRC_BYTES = 2

FRAME_TIMEOUT_BITS = 2000
"""Default longest line-idle gap inside a frame, in bit times (about 200 byte times)."""
BUS_TIMEOUT_CYCLES = 1 << 16
"""Default bus watchdog: clock cycles an AXI4-Lite channel may stall before BUS_ERROR."""

FLAG_IRQ = 0x01
"""FLAGS bit: the NPU's interrupt line was high when the response was sent."""

POLL_LEN = 4
"""A POLL response's payload: FLAGS, rejected-frame count (mod 256), MAX_PAYLOAD (u16)."""


class Command(enum.IntEnum):
    """Request commands (the ``CMD`` byte)."""

    CSR_WRITE = 0x01
    CSR_READ = 0x02
    MEM_WRITE = 0x03
    MEM_READ = 0x04
    POLL = 0x05


class Status(enum.IntEnum):
    """Response status codes (the ``STATUS`` byte)."""

    OK = 0x00
    BAD_CRC = 0x01
    BAD_COMMAND = 0x02
    BAD_LENGTH = 0x03
    BAD_ADDRESS = 0x04
    BUS_ERROR = 0x05
    TIMEOUT = 0x06

    @property
    def rejected(self) -> bool:
        """True for the codes of a frame that was rejected, i.e. not executed at all."""
        return self not in (Status.OK, Status.BUS_ERROR)


REJECTED = tuple(s for s in Status if s.rejected)
"""Statuses of frames that were rejected and never executed (they pulse ``error``)."""


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final xor).

    ``crc16(b"123456789") == 0x29B1``. Pass a previous result as ``crc`` to continue.
    """
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def request_length_ok(cmd: int, payload: bytes) -> bool:
    """True when ``payload`` is a valid payload for the known command ``cmd``."""
    n = len(payload)
    if cmd == Command.CSR_WRITE:
        return n == 4
    if cmd in (Command.CSR_READ, Command.POLL):
        return n == 0
    if cmd == Command.MEM_WRITE:
        return 1 <= n <= MAX_PAYLOAD
    if cmd == Command.MEM_READ:
        return n == 2 and 1 <= int.from_bytes(payload, "little") <= MAX_PAYLOAD
    raise ValueError(f"unknown command {cmd:#04x}")


def access_span(cmd: int, addr: int, payload: bytes) -> int:
    """Bytes of the address space a (well-formed) request touches at ``addr``."""
    if cmd in (Command.CSR_WRITE, Command.CSR_READ):
        return 4
    if cmd == Command.MEM_WRITE:
        return len(payload)
    if cmd == Command.MEM_READ:
        return int.from_bytes(payload[:2], "little")
    return 0


def address_ok(cmd: int, addr: int, payload: bytes, mem_addr_width: int) -> bool:
    """True when a well-formed request's address range is one the bridge executes.

    CSR accesses need a word-aligned address below :data:`CSR_SPACE`; memory
    accesses need ``[addr, addr + span)`` inside the ``mem_addr_width``-bit space.
    """
    if cmd in (Command.CSR_WRITE, Command.CSR_READ):
        return addr % 4 == 0 and addr < CSR_SPACE
    if cmd in (Command.MEM_WRITE, Command.MEM_READ):
        return addr + access_span(cmd, addr, payload) <= 1 << mem_addr_width
    return True


def encode_request(cmd: int, addr: int = 0, payload: bytes = b"") -> bytes:
    """The request frame for ``cmd`` (any byte value: tests send unknown ones too).

    Raises ``ValueError`` when ``addr`` does not fit 32 bits or the payload exceeds
    the 16-bit length field.
    """
    payload = bytes(payload)
    if not 0 <= addr < 1 << 32:
        raise ValueError(f"address {addr:#x} does not fit 32 bits")
    if len(payload) >= 1 << 16:
        raise ValueError(f"payload of {len(payload)} bytes does not fit the length field")
    body = struct.pack("<BIH", cmd & 0xFF, addr, len(payload)) + payload
    return bytes([SYNC]) + body + struct.pack("<H", crc16(body))


def csr_write(addr: int, value: int) -> bytes:
    """The CSR_WRITE request of ``value`` (32 bits) at CSR byte address ``addr``."""
    return encode_request(Command.CSR_WRITE, addr, struct.pack("<I", value & 0xFFFF_FFFF))


def csr_read(addr: int) -> bytes:
    """The CSR_READ request of the CSR at byte address ``addr``."""
    return encode_request(Command.CSR_READ, addr)


def mem_write(addr: int, data: bytes) -> bytes:
    """The MEM_WRITE request of ``data`` (at most :data:`MAX_PAYLOAD` bytes) at ``addr``."""
    return encode_request(Command.MEM_WRITE, addr, data)


def mem_read(addr: int, count: int) -> bytes:
    """The MEM_READ request of ``count`` bytes (at most :data:`MAX_PAYLOAD`) at ``addr``."""
    return encode_request(Command.MEM_READ, addr, struct.pack("<H", count))


def poll() -> bytes:
    """The POLL request."""
    return encode_request(Command.POLL)


@dataclass(frozen=True)
class Request:
    """A decoded request frame."""

    cmd: int
    addr: int
    payload: bytes


@dataclass(frozen=True)
class Response:
    """A decoded response frame.

    Members
    -------
    cmd : the ``CMD`` byte of the request answered (0 when none was received).
    status : the :class:`Status`.
    flags : FLAGS (:data:`FLAG_IRQ`).
    payload : read data (OK reads), the poll bytes (OK POLL), else empty.
    """

    cmd: int
    status: Status
    flags: int
    payload: bytes

    @property
    def irq(self) -> bool:
        return bool(self.flags & FLAG_IRQ)


class FrameError(ValueError):
    """A byte sequence that is not a well-formed frame (bad sync, CRC or length)."""


def decode_request(frame: bytes) -> Request:
    """Parse one complete request frame; ``FrameError`` if it is malformed."""
    if len(frame) < REQUEST_HEADER + CRC_BYTES or frame[0] != SYNC:
        raise FrameError("not a request frame")
    cmd, addr, n = struct.unpack_from("<BIH", frame, 1)
    if len(frame) != REQUEST_HEADER + n + CRC_BYTES:
        raise FrameError(f"length field {n} does not match a {len(frame)}-byte frame")
    body = frame[1:REQUEST_HEADER + n]
    if crc16(body) != int.from_bytes(frame[-2:], "little"):
        raise FrameError("CRC mismatch")
    return Request(cmd, addr, bytes(frame[REQUEST_HEADER:REQUEST_HEADER + n]))


def encode_response(cmd: int, status: int, flags: int = 0, payload: bytes = b"") -> bytes:
    """The response frame (what the bridge sends; used by models and tests)."""
    body = struct.pack("<BBBH", cmd & 0xFF, int(status), flags, len(payload)) + bytes(payload)
    return bytes([RSYNC]) + body + struct.pack("<H", crc16(body))


def decode_response(frame: bytes) -> Response:
    """Parse one complete response frame; ``FrameError`` if it is malformed."""
    if len(frame) < RESPONSE_HEADER + CRC_BYTES or frame[0] != RSYNC:
        raise FrameError("not a response frame")
    cmd, status, flags, n = struct.unpack_from("<BBBH", frame, 1)
    if len(frame) != RESPONSE_HEADER + n + CRC_BYTES:
        raise FrameError(f"length field {n} does not match a {len(frame)}-byte frame")
    body = frame[1:RESPONSE_HEADER + n]
    if crc16(body) != int.from_bytes(frame[-2:], "little"):
        raise FrameError("response CRC mismatch")
    try:
        status = Status(status)
    except ValueError:
        raise FrameError(f"unknown status {status:#04x}") from None
    return Response(cmd, status, flags, bytes(frame[RESPONSE_HEADER:RESPONSE_HEADER + n]))


def response_length(header: bytes) -> int:
    """Total bytes of the response frame whose first :data:`RESPONSE_HEADER` bytes are given."""
    return RESPONSE_HEADER + int.from_bytes(header[4:6], "little") + CRC_BYTES


def check_request(req: Request, mem_addr_width: int) -> Status:
    """The status the bridge answers an intact request with, before executing it.

    ``OK`` means the bridge executes it (and may still answer ``BUS_ERROR``).
    """
    if req.cmd not in Command._value2member_map_:
        return Status.BAD_COMMAND
    if not request_length_ok(req.cmd, req.payload):
        return Status.BAD_LENGTH
    if not address_ok(req.cmd, req.addr, req.payload, mem_addr_width):
        return Status.BAD_ADDRESS
    return Status.OK
