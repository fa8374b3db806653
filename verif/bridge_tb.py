"""UART bridge verification: build parameters, the Verilator build, and a Python model.

:class:`BridgeModel` is the bridge's semantics in plain Python (firmware/bridge.py
says what a frame means; this says what the bridge then does to its two buses),
used as the scoreboard of the RTL tests (``verif.bridge_cocotb``) and, through
:class:`ModelSerial`, as a fake board for fast host-side tests of
``host.serial_device.SerialDevice``. :func:`run_bridge_tests` builds the bridge
(cached) and runs the cocotb tests.
"""

from __future__ import annotations

import json
import struct
from collections import deque

from firmware.bridge import (
    CRC_BYTES,
    CSR_SPACE,
    FLAG_IRQ,
    MAX_PAYLOAD,
    REQUEST_HEADER,
    RESPONSE_HEADER,
    SYNC,
    Command,
    FrameError,
    Status,
    check_request,
    decode_request,
    encode_response,
)

CLOCK_NS = 10
CLK_FREQ = 1_000_000_000 // CLOCK_NS
BAUD = CLK_FREQ // 8          # 8 clock cycles per bit: fast, and a whole number of ns
MEM_ADDR_WIDTH = 16           # 64 KiB behind the mem port
FRAME_TIMEOUT_BITS = 40       # four byte times: short, so timeout tests stay quick
BUS_TIMEOUT = 300             # watchdog cycles (the RAM models answer within a few)
PARAMS = {"clk_freq": CLK_FREQ, "baud": BAUD, "mem_addr_width": MEM_ADDR_WIDTH,
          "frame_timeout_bits": FRAME_TIMEOUT_BITS, "bus_timeout": BUS_TIMEOUT}


def run_bridge_tests(testcase=None, *, seed: int = 0, ops: int = 300, waves: bool = False):
    """Build the bridge with :data:`PARAMS` (cached) and run ``verif.bridge_cocotb``."""
    from hdl.bridge import UartBridge
    from verif.sim import run_cocotb, sim_build_dir, source_digest, to_verilog_cached

    build = sim_build_dir("uart_bridge")
    key = source_digest("hdl", "firmware") + json.dumps(PARAMS)
    source = to_verilog_cached(lambda: UartBridge(CLK_FREQ, BAUD, MEM_ADDR_WIDTH,
                                                  frame_timeout_bits=FRAME_TIMEOUT_BITS,
                                                  bus_timeout=BUS_TIMEOUT),
                               "uart_bridge", build / "uart_bridge.v", key)
    tag = testcase if isinstance(testcase, str) else "all" if testcase is None else "some"
    return run_cocotb("uart_bridge", [source], "verif.bridge_cocotb", build, testcase=testcase,
                      extra_env={"BRIDGE_SEED": str(seed), "BRIDGE_OPS": str(ops)},
                      waves=waves, test_dir=build / f"run_{tag}")


class BridgeModel:
    """What the bridge does with each request frame, on byte-array models of its buses.

    ``csr`` and ``mem`` are the two address spaces; ``csr_faults`` and ``mem_faults``
    hold word addresses whose accesses answer SLVERR (as the RTL test's RAM models
    are told to). ``irq`` is the interrupt line; ``rejects`` counts rejected frames.

    With ``device`` (a ``host.device.Device``, e.g. ``GoldenDevice``), CSR and memory
    requests go to that device instead (an access it refuses with ``ValueError``
    answers BUS_ERROR) and ``irq`` follows its interrupt: a board with that NPU. The
    NPU runs while frames travel: each response samples the line after letting the
    device run ``FRAME_CYCLES`` cycles (``wait_irq``), a response frame's time at
    115200 baud on a 25 MHz NPU.
    """

    FRAME_CYCLES = (RESPONSE_HEADER + CRC_BYTES) * 10 * 25_000_000 // 115_200

    def __init__(self, mem_addr_width: int = MEM_ADDR_WIDTH, device=None):
        self.mem_addr_width = mem_addr_width
        self.device = device
        self.csr = bytearray(CSR_SPACE)
        self.mem = bytearray(1 << mem_addr_width)
        self.csr_faults: set[int] = set()
        self.mem_faults: set[int] = set()
        self.irq = False
        self.rejects = 0

    @property
    def flags(self) -> int:
        irq = self.irq if self.device is None else self.device.wait_irq(self.FRAME_CYCLES)
        return FLAG_IRQ if irq else 0

    def reject(self, status: Status, cmd: int = 0) -> bytes:
        """The response to a rejected frame (counted)."""
        self.rejects = (self.rejects + 1) & 0xFF
        return encode_response(cmd, status, self.flags)

    def execute(self, frame: bytes) -> bytes:
        """The response frame to one complete request frame (and its bus effects).

        A frame that fails to decode answers BAD_CRC (an oversize length, which the
        RTL answers as BAD_LENGTH after the line idles, is the caller's business).
        """
        try:
            req = decode_request(frame)
        except FrameError:
            return self.reject(Status.BAD_CRC, frame[1] if len(frame) > 1 else 0)
        status = check_request(req, self.mem_addr_width)
        if status != Status.OK:
            return self.reject(status, req.cmd)
        cmd, addr, p = req.cmd, req.addr, req.payload
        if cmd == Command.POLL:
            return encode_response(cmd, Status.OK, self.flags,
                                   bytes([self.flags, self.rejects])
                                   + struct.pack("<H", MAX_PAYLOAD))
        if self.device is not None:
            return self._on_device(cmd, addr, p)
        space, faults = ((self.csr, self.csr_faults)
                         if cmd in (Command.CSR_WRITE, Command.CSR_READ)
                         else (self.mem, self.mem_faults))
        if cmd in (Command.CSR_WRITE, Command.MEM_WRITE):
            for word, lo, hi in _words(addr, len(p)):
                if word in faults:  # the words before took effect, none after
                    return encode_response(cmd, Status.BUS_ERROR, self.flags)
                space[lo:hi] = p[lo - addr:hi - addr]
            return encode_response(cmd, Status.OK, self.flags)
        n = 4 if cmd == Command.CSR_READ else int.from_bytes(p, "little")
        if any(word in faults for word, _, _ in _words(addr, n)):
            return encode_response(cmd, Status.BUS_ERROR, self.flags)
        return encode_response(cmd, Status.OK, self.flags, bytes(space[addr:addr + n]))


    def _on_device(self, cmd: int, addr: int, p: bytes) -> bytes:
        dev = self.device
        try:
            if cmd == Command.CSR_WRITE:
                dev.write_reg(addr, int.from_bytes(p, "little"))
                data = b""
            elif cmd == Command.CSR_READ:
                data = dev.read_reg(addr).to_bytes(4, "little")
            elif cmd == Command.MEM_WRITE:
                dev.write_mem(addr, p)
                data = b""
            else:
                data = dev.read_mem(addr, int.from_bytes(p, "little"))
        except ValueError:
            return encode_response(cmd, Status.BUS_ERROR, self.flags)
        return encode_response(cmd, Status.OK, self.flags, data)


def _words(addr: int, n: int):
    """``(word address, lo, hi)`` of each 32-bit word a byte range touches, in order."""
    a = addr
    while a < addr + n:
        word = a & ~3
        hi = min(word + 4, addr + n)
        yield word, a, hi
        a = hi


class ModelSerial:
    """A fake serial port with a :class:`BridgeModel` board behind it (host-side tests).

    Each ``write`` must carry whole request frames (as ``SerialDevice`` sends them).
    ``corrupt_next`` flips a bit in that many upcoming frames before the model sees
    them; ``mute`` makes the board silent; ``garble_next`` corrupts that many
    upcoming responses.
    """

    def __init__(self, model: BridgeModel | None = None):
        self.model = model or BridgeModel()
        self.out: deque[int] = deque()
        self.frames: list[bytes] = []
        self.corrupt_next = 0
        self.garble_next = 0
        self.mute = False
        self.now = 0.0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        i = 0
        while i < len(data):
            if data[i] != SYNC:
                i += 1
                continue
            n = int.from_bytes(data[i + 6:i + 8], "little")
            frame = bytearray(data[i:i + REQUEST_HEADER + n + 2])
            i += len(frame)
            self.frames.append(bytes(frame))
            if self.corrupt_next:
                self.corrupt_next -= 1
                frame[-3] ^= 0x10
            self.now += len(frame) * 10 / 1e6  # as if at 1 Mbaud
            if self.mute:
                continue
            resp = bytearray(self.model.execute(bytes(frame)))
            if self.garble_next:
                self.garble_next -= 1
                resp[3] ^= 0x01
            self.out.extend(resp)
        return len(data)

    def read(self, n: int) -> bytes:
        k = min(n, len(self.out))
        return bytes(self.out.popleft() for _ in range(k))

    def reset_input_buffer(self) -> None:
        self.out.clear()

    def clock(self) -> float:
        return self.now
