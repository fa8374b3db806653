"""cocotb tests of ``hdl.bridge.UartBridge`` (run by tests/test_bridge.py under Verilator).

The UART pins are driven by cocotbext-uart through :class:`verif.bridge_link.SimSerial`;
the CSR and memory ports end in cocotbext-axi ``AxiLiteRam`` models that can be told
to answer SLVERR for chosen words and that log every write they take. The scoreboard
is :class:`verif.bridge_tb.BridgeModel`. ``BRIDGE_SEED`` seeds the stimulus and
``BRIDGE_OPS`` sets the length of the random test.
"""

from __future__ import annotations

import itertools
import logging
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiLiteBus, AxiLiteRam

from firmware import bridge as proto
from firmware.bridge import MAX_PAYLOAD, Command, Status
from host.serial_device import BridgeError, BusError, SerialDevice
from verif.bridge_link import uart_stream
from verif.bridge_tb import (
    BAUD,
    BUS_TIMEOUT,
    CLK_FREQ,
    CLOCK_NS,
    FRAME_TIMEOUT_BITS,
    MEM_ADDR_WIDTH,
    BridgeModel,
)

SEED = int(os.environ.get("BRIDGE_SEED", "1"))
OPS = int(os.environ.get("BRIDGE_OPS", "300"))
BIT_NS = 1_000_000_000 // BAUD
MEM_SIZE = 1 << MEM_ADDR_WIDTH


def rng_for(test: str) -> random.Random:
    return random.Random(f"{SEED}:{test}")


class FaultyRam:
    """An ``AxiLiteRam`` whose ``faults`` word addresses answer SLVERR, logging writes."""

    def __init__(self, dut, prefix: str, size: int):
        self.ram = AxiLiteRam(AxiLiteBus.from_prefix(dut, prefix), dut.clk, dut.rst, size=size)
        self.faults: set[int] = set()
        self.writes: list[tuple[int, bytes]] = []
        for side in (self.ram.write_if, self.ram.read_if):
            side.log.setLevel(logging.WARNING)
        write, read = self.ram.write_if._write, self.ram.read_if._read

        async def faulty_write(address, data):
            if address & ~3 in self.faults:
                raise OSError(f"fault at {address:#x}")  # the model answers SLVERR
            self.writes.append((address, bytes(data)))
            await write(address, data)

        async def faulty_read(address, length):
            if address & ~3 in self.faults:
                raise OSError(f"fault at {address:#x}")
            return await read(address, length)

        self.ram.write_if._write = faulty_write
        self.ram.read_if._read = faulty_read

    def channels(self):
        w, r = self.ram.write_if, self.ram.read_if
        return (w.aw_channel, w.w_channel, w.b_channel, r.ar_channel, r.r_channel)

    def backpressure(self, rng: random.Random | None):
        """Random stalls on every channel (``None``: none)."""
        for ch in self.channels():
            if rng is None:
                ch.set_pause_generator(None)
                ch.pause = False
            else:
                ch.set_pause_generator(rng.random() < 0.3 for _ in itertools.count())


class TB:
    """Clock, reset, UART link, bus models, an error-pulse counter and the model."""

    def __init__(self, dut, test: str):
        self.dut = dut
        self.rng = rng_for(test)
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        dut.irq.value = 0
        self.link = uart_stream(dut, BAUD)
        self.csr = FaultyRam(dut, "csr_", proto.CSR_SPACE)
        self.mem = FaultyRam(dut, "mem_", MEM_SIZE)
        self.model = BridgeModel(MEM_ADDR_WIDTH)
        self.model.csr_faults = self.csr.faults
        self.model.mem_faults = self.mem.faults
        self.errors = 0
        cocotb.start_soon(self._count_errors())

    async def _count_errors(self):
        while True:  # error pulses are one cycle long and far apart
            await RisingEdge(self.dut.error)
            self.errors += 1

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 5)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 5)

    def fill(self):
        """Random contents in both RAMs, mirrored into the model."""
        data = self.rng.randbytes(proto.CSR_SPACE)
        self.csr.ram.write(0, data)
        self.model.csr[:] = data
        data = self.rng.randbytes(MEM_SIZE)
        self.mem.ram.write(0, data)
        self.model.mem[:] = data

    def check_rams(self, what: str):
        assert self.csr.ram.read(0, proto.CSR_SPACE) == bytes(self.model.csr), \
            f"{what}: CSR RAM differs from the model"
        assert self.mem.ram.read(0, MEM_SIZE) == bytes(self.model.mem), \
            f"{what}: memory RAM differs from the model"

    async def send(self, data: bytes):
        await self.link.source.write(bytes(data))

    async def response(self) -> bytes:
        """One whole response frame (fails on a timeout or a stray byte)."""
        head = await self.link._aread(proto.RESPONSE_HEADER)
        assert len(head) == proto.RESPONSE_HEADER, f"no response (got {head.hex()})"
        assert head[0] == proto.RSYNC, f"response starts {head.hex()}"
        rest = await self.link._aread(proto.response_length(head) - proto.RESPONSE_HEADER)
        return head + rest

    async def request(self, frame: bytes) -> proto.Response:
        """Send ``frame``; check its response and the RAMs against the model."""
        expected = self.model.execute(frame)
        await self.send(frame)
        got = await self.response()
        assert got == expected, (f"request {frame.hex()}: response {got.hex()}, model "
                                 f"{expected.hex()}")
        return proto.decode_response(got)

    async def silence(self, bits: int = FRAME_TIMEOUT_BITS + 30):
        """Nothing more comes back (no second response)."""
        await Timer(bits * BIT_NS, unit="ns")
        assert self.link.sink.empty(), f"unexpected bytes {self.link.sink.read_nowait().hex()}"


def random_request(rng: random.Random) -> bytes:
    kind = rng.choice(["csr_w", "csr_r", "mem_w", "mem_r", "mem_w", "mem_r", "poll"])
    if kind == "csr_w":
        return proto.csr_write(rng.randrange(0, proto.CSR_SPACE, 4), rng.getrandbits(32))
    if kind == "csr_r":
        return proto.csr_read(rng.randrange(0, proto.CSR_SPACE, 4))
    n = rng.choice([1, 2, 3, 4, 5, 7, 8, rng.randint(1, MAX_PAYLOAD), MAX_PAYLOAD])
    addr = rng.choice([rng.randrange(MEM_SIZE - n + 1), MEM_SIZE - n, 0])
    if kind == "mem_w":
        return proto.mem_write(addr, rng.randbytes(n))
    if kind == "mem_r":
        return proto.mem_read(addr, n)
    return proto.poll()


@cocotb.test()
async def random_requests(dut):
    """Random CSR and memory reads and writes (any alignment, 1..256 bytes) and polls
    answer as the model says and leave the RAMs as the model says, under bus stalls;
    every response carries the irq line."""
    tb = TB(dut, "random")
    tb.fill()
    await tb.reset()
    seen = set()
    for i in range(OPS):
        # Bus stalls on a quarter of the requests (a stall generator costs a coroutine
        # step per clock cycle).
        stall = tb.rng if i % 4 == 0 else None
        tb.csr.backpressure(stall)
        tb.mem.backpressure(stall)
        if tb.rng.random() < 0.1:
            tb.model.irq = not tb.model.irq
            dut.irq.value = int(tb.model.irq)
        frame = random_request(tb.rng)
        resp = await tb.request(frame)
        assert resp.status == Status.OK, f"op {i}: {resp}"
        seen.add(resp.cmd)
    tb.check_rams("after the random requests")
    assert seen == set(Command), f"commands not exercised: {set(Command) - seen}"
    assert tb.errors == 0


@cocotb.test()
async def bad_frames_rejected(dut):
    """Each kind of bad frame answers its status, pulses error, counts as rejected in
    POLL, and writes nothing on either bus; the next good frame works."""
    tb = TB(dut, "bad")
    tb.fill()
    await tb.reset()
    rng = tb.rng
    good = proto.mem_write(0x100, b"\x11\x22\x33\x44\x55")

    def short_by_one() -> bytes:
        """A 17-byte write whose last two bytes are no sync byte (they become junk)."""
        for fill in range(256):
            frame = proto.mem_write(0x40, bytes([fill]) * 17)
            if proto.SYNC not in frame[-2:]:
                return frame
        raise AssertionError("unreachable")

    def flip(frame: bytes, pos: int, bit: int = 0) -> bytes:
        b = bytearray(frame)
        b[pos] ^= 1 << bit
        return bytes(b)

    cases = [
        # (name, frame, status)
        ("crc in payload", flip(proto.csr_write(0x10, 0xDEADBEEF), 9, 3), Status.BAD_CRC),
        ("crc in address", flip(proto.mem_write(0x20, b"abcdefgh"), 3, 7), Status.BAD_CRC),
        ("crc in crc", flip(proto.mem_write(0x40, bytes(64)), -1, 0), Status.BAD_CRC),
        # 17 -> 16: the bridge takes the first CRC byte for the last data byte
        ("crc in length", flip(short_by_one(), 6, 0), Status.BAD_CRC),
        ("unknown command", proto.encode_request(0x77, 0x10, b"\x01\x02\x03\x04"),
         Status.BAD_COMMAND),
        ("command 0", proto.encode_request(0, 0, b""), Status.BAD_COMMAND),
        ("csr write 3 bytes", proto.encode_request(Command.CSR_WRITE, 0x10, b"abc"),
         Status.BAD_LENGTH),
        ("csr read with payload", proto.encode_request(Command.CSR_READ, 0x10, b"x"),
         Status.BAD_LENGTH),
        ("mem write 0 bytes", proto.encode_request(Command.MEM_WRITE, 0x10, b""),
         Status.BAD_LENGTH),
        ("mem read count 0", proto.mem_read(0x10, 0), Status.BAD_LENGTH),
        ("mem read count too big", proto.mem_read(0x10, MAX_PAYLOAD + 1), Status.BAD_LENGTH),
        ("mem read 3-byte payload", proto.encode_request(Command.MEM_READ, 0, b"\x04\0\0"),
         Status.BAD_LENGTH),
        ("poll with payload", proto.encode_request(Command.POLL, 0, b"\0"), Status.BAD_LENGTH),
        ("csr misaligned", proto.csr_write(0x12, 1), Status.BAD_ADDRESS),
        ("csr outside window", proto.csr_read(proto.CSR_SPACE), Status.BAD_ADDRESS),
        ("mem past the end", proto.mem_write(MEM_SIZE - 3, b"abcd"), Status.BAD_ADDRESS),
        ("mem read past the end", proto.mem_read(MEM_SIZE - 8, 9), Status.BAD_ADDRESS),
        ("mem far address", proto.mem_read(0xFFFF_FFF0, 4), Status.BAD_ADDRESS),
    ]
    rng.shuffle(cases)
    rejected = 0
    for name, frame, status in cases:
        before = (len(tb.csr.writes), len(tb.mem.writes), tb.errors)
        resp = await tb.request(frame)
        rejected += 1
        assert resp.status == status, f"{name}: {resp.status.name}, expected {status.name}"
        assert resp.payload == b"", f"{name}: payload {resp.payload.hex()}"
        await ClockCycles(dut.clk, 2)
        assert (len(tb.csr.writes), len(tb.mem.writes)) == before[:2], f"{name}: bus write"
        assert tb.errors == before[2] + 1, f"{name}: no error pulse"
        await tb.silence()

    # Oversize length: the frame's end is unknown, so the bridge swallows it and answers
    # once the line idles; the 0xA5 bytes inside the payload must not start frames.
    oversize = proto.encode_request(Command.MEM_WRITE, 0x200, bytes([proto.SYNC]) * 300)
    await tb.send(oversize)
    resp = proto.decode_response(await tb.response())
    rejected += 1
    assert resp.status == Status.BAD_LENGTH, f"oversize: {resp.status.name}"
    await tb.silence()

    # A frame cut short: the idle gap inside it ends it with TIMEOUT.
    await tb.send(good[:7])
    resp = proto.decode_response(await tb.response())
    rejected += 1
    assert resp.status == Status.TIMEOUT and resp.cmd == 0, resp  # no whole header yet
    await tb.send(good[:10])  # cut inside the payload
    resp = proto.decode_response(await tb.response())
    rejected += 1
    assert resp.status == Status.TIMEOUT and resp.cmd == Command.MEM_WRITE, resp
    await tb.silence()

    # A UART framing error (stop bit low) inside a frame: the frame is corrupt even
    # though its bytes' CRC would match.
    frame = proto.csr_write(0x20, 0x12345678)
    await tb.send(frame[:4])
    await tb.link.source.wait()
    await bit_bang(dut, frame[4], stop=0)
    await tb.send(frame[5:])
    resp = proto.decode_response(await tb.response())
    rejected += 1
    assert resp.status == Status.BAD_CRC, f"framing error: {resp.status.name}"
    assert tb.errors == len(cases) + 4
    tb.model.rejects = (tb.model.rejects + 4) & 0xFF  # the four frames the model did not see

    assert not tb.csr.writes and not tb.mem.writes, "a rejected frame wrote to a bus"
    tb.check_rams("after the bad frames")
    # Good frames still work, and POLL reports every rejection.
    assert (await tb.request(good)).status == Status.OK
    resp = await tb.request(proto.poll())
    assert resp.payload[1] == rejected, f"POLL counts {resp.payload[1]} rejected, not {rejected}"
    tb.check_rams("after the good frame")


async def bit_bang(dut, byte: int, stop: int = 1):
    """Drive one 8N1 character onto rx by hand (a low ``stop`` is a framing error)."""
    for level in [0, *((byte >> i) & 1 for i in range(8)), stop]:
        dut.rx.value = level
        await Timer(BIT_NS, unit="ns")
    dut.rx.value = 1
    await Timer(BIT_NS, unit="ns")


@cocotb.test()
async def resynchronizes(dut):
    """Garbage between frames is skipped; a stray sync byte costs one rejected frame
    (TIMEOUT or BAD_CRC), after which the next frame is executed."""
    tb = TB(dut, "resync")
    tb.fill()
    await tb.reset()
    rng = tb.rng
    # A start-bit glitch shorter than half a bit is not a byte.
    dut.rx.value = 0
    await Timer(2 * CLOCK_NS, unit="ns")
    dut.rx.value = 1
    await Timer(2 * BIT_NS, unit="ns")
    for round_ in range(12):
        junk = bytes(b for b in rng.randbytes(rng.randint(1, 40)) if b != proto.SYNC)
        await tb.send(junk)
        await tb.silence(20)
        resp = await tb.request(random_request(rng))
        assert resp.status == Status.OK, f"round {round_}: {resp}"
    # A stray sync byte followed by silence: TIMEOUT, then back to normal.
    await tb.send(bytes([proto.SYNC, 0x03, 0x00]))
    resp = proto.decode_response(await tb.response())
    assert resp.status == Status.TIMEOUT, resp
    tb.model.rejects += 1
    # A stray sync byte right before a frame: the frame is taken as that frame's body;
    # here its bytes make a length of 0x400, so the bridge drains it and answers
    # BAD_LENGTH once the line idles. The following frame is executed.
    await tb.send(bytes([proto.SYNC]) + proto.csr_write(0x40, 0xCAFEF00D))
    resp = proto.decode_response(await tb.response())
    assert resp.status == Status.BAD_LENGTH, resp
    tb.model.rejects += 1
    await tb.silence()
    assert (await tb.request(proto.csr_write(0x40, 0xCAFEF00D))).status == Status.OK
    assert (await tb.request(proto.poll())).payload[1] == 2
    tb.check_rams("after resync")


@cocotb.test()
async def bus_errors(dut):
    """SLVERR on either bus answers BUS_ERROR: a burst's words before the failing one
    are written, none after; a read returns no data. A bus that never answers is cut off
    by the watchdog, and the bridge keeps working."""
    tb = TB(dut, "bus")
    tb.fill()
    await tb.reset()
    tb.csr.faults.add(0x80)
    resp = await tb.request(proto.csr_write(0x80, 0x1234))
    assert resp.status == Status.BUS_ERROR
    resp = await tb.request(proto.csr_read(0x80))
    assert resp.status == Status.BUS_ERROR and resp.payload == b""
    assert (await tb.request(proto.csr_read(0x84))).status == Status.OK
    tb.mem.faults.add(0x1010)
    resp = await tb.request(proto.mem_write(0x1002, tb.rng.randbytes(40)))
    assert resp.status == Status.BUS_ERROR
    assert {a & ~3 for a, _ in tb.mem.writes} == {0x1000, 0x1004, 0x1008, 0x100C}, \
        f"writes {[hex(a) for a, _ in tb.mem.writes]}"
    resp = await tb.request(proto.mem_read(0x1001, 100))
    assert resp.status == Status.BUS_ERROR and resp.payload == b""
    assert (await tb.request(proto.mem_read(0x1014, 100))).status == Status.OK
    tb.check_rams("after bus errors")
    assert tb.errors == 0, "a bus error is not a rejected frame"

    # A mute bus: every channel of the memory RAM stalls for good.
    for ch in tb.mem.channels():
        ch.pause = True
    for frame in (proto.mem_read(0x40, 4), proto.mem_write(0x40, b"zzzz")):
        await tb.send(frame)
        start = get_sim_time(unit="ns")
        resp = proto.decode_response(await tb.response())
        assert resp.status == Status.BUS_ERROR, resp
        assert get_sim_time(unit="ns") - start > BUS_TIMEOUT * CLOCK_NS
    for ch in tb.mem.channels():
        ch.pause = False
    await ClockCycles(dut.clk, 20)
    assert not tb.mem.writes[4:], "the timed-out write landed"
    tb.mem.writes.clear()
    assert (await tb.request(proto.mem_read(0x40, 8))).status == Status.OK
    assert (await tb.request(proto.csr_write(0x40, 7))).status == Status.OK


@cocotb.test()
async def serial_device(dut):
    """host.serial_device.SerialDevice, the real host transport, over the simulated UART:
    registers, chunked unaligned memory transfers, irq waits, retry after a corrupted
    request, and clear errors."""
    tb = TB(dut, "serial")
    tb.fill()
    await tb.reset()
    rng = tb.rng
    link = tb.link

    async def raise_irq_after(cycles):
        await ClockCycles(dut.clk, cycles)
        dut.irq.value = 1

    async def schedule_irq(cycles):
        cocotb.start_soon(raise_irq_after(cycles))

    def host():
        dev = SerialDevice(link, clock_hz=CLK_FREQ)
        assert dev.max_payload == MAX_PAYLOAD
        for _ in range(40):
            a = rng.randrange(0, proto.CSR_SPACE, 4)
            if rng.random() < 0.5:
                v = rng.getrandbits(32)
                dev.write_reg(a, v)
                tb.model.csr[a:a + 4] = v.to_bytes(4, "little")
            else:
                assert dev.read_reg(a) == int.from_bytes(tb.model.csr[a:a + 4], "little")
        for _ in range(6):
            n = rng.choice([1, 3, MAX_PAYLOAD, MAX_PAYLOAD + 1, rng.randint(1, 3 * MAX_PAYLOAD)])
            a = rng.randrange(MEM_SIZE - n)
            data = rng.randbytes(n)
            dev.write_mem(a, data)
            tb.model.mem[a:a + n] = data
            assert dev.read_mem(a, n) == data
        assert dev.read_mem(0, 0) == b""
        tb.check_rams("after SerialDevice transfers")

        # The irq: a timeout when it stays low, True once it rises.
        t0 = link.clock()
        assert dev.wait_irq(2000) is False
        assert link.clock() - t0 >= 2000 / CLK_FREQ
        resume_irq(2000)
        assert dev.wait_irq(1_000_000) is True
        assert dev.irq

        # A request corrupted on the way is rejected by the bridge and sent again.
        sent = link.bytes_written
        original = link.write
        hits = []

        def corrupt_once(data):
            if not hits:
                hits.append(data)
                data = bytearray(data)
                data[-3] ^= 0x04
            return original(bytes(data))

        link.write = corrupt_once
        dev.write_reg(0x44, 0xA5A5_0001)
        link.write = original
        tb.model.csr[0x44:0x48] = (0xA5A5_0001).to_bytes(4, "little")
        assert hits and link.bytes_written == sent + 2 * len(hits[0])  # sent twice
        assert dev.read_reg(0x44) == 0xA5A5_0001
        assert dev.poll().rejected == 1

        # Errors name the request.
        tb.mem.faults.add(0x2000)
        try:
            dev.write_mem(0x1FF0, bytes(64))
        except BusError as e:
            assert e.status == Status.BUS_ERROR and e.command == Command.MEM_WRITE
        else:
            raise AssertionError("no BusError")
        tb.model.mem[0x1FF0:0x2000] = bytes(16)
        tb.mem.faults.clear()
        try:
            dev.read_reg(0x1002)
        except BridgeError as e:
            assert e.status == Status.BAD_ADDRESS
        else:
            raise AssertionError("no BridgeError")
        tb.check_rams("after SerialDevice errors")
        dev.close()

    resume_irq = cocotb.task.resume(schedule_irq)
    dut.irq.value = 0
    await bridge(host)()
