"""The UART bridge: protocol (firmware/bridge.py), UART (hdl/uart.py), bridge RTL
(hdl/bridge.py) and the serial host transport (host/serial_device.py).

* The UART under Amaranth's simulator: bytes round-trip at several divisors, a
  sender a few percent off the baud rate, framing errors, breaks, false starts.
* The bridge under Verilator (``verif/bridge_cocotb.py``): random requests against
  :class:`verif.bridge_tb.BridgeModel`, every bad-frame kind, resync, bus errors, and
  ``SerialDevice`` driving the RTL over a simulated UART.
* ``SerialDevice`` against the Python model of a board (fast): chunking, retries,
  errors, and the unchanged host runtime running a bundled model over the protocol.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from firmware import bridge as proto
from firmware.bridge import MAX_PAYLOAD, Command, Status
from hdl.bridge import UartBridge, crc16_step
from hdl.uart import UartRx, UartTx, uart_divisor
from host.serial_device import BridgeError, BusError, LinkError, SerialDevice
from verif.bridge_tb import BridgeModel, ModelSerial, run_bridge_tests

# ---- protocol ---------------------------------------------------------------------------------


def test_crc16_check_value():
    assert proto.crc16(b"123456789") == 0x29B1  # the catalogue's check value
    assert proto.crc16(b"") == 0xFFFF
    assert proto.crc16(b"6789", proto.crc16(b"12345")) == 0x29B1


def test_frames_round_trip(seed):
    rng = random.Random(seed)
    for _ in range(200):
        cmd, addr = rng.choice(list(Command)), rng.getrandbits(32)
        payload = rng.randbytes(rng.randint(0, MAX_PAYLOAD))
        frame = proto.encode_request(cmd, addr, payload)
        assert len(frame) == proto.REQUEST_HEADER + len(payload) + proto.CRC_BYTES
        assert proto.decode_request(frame) == proto.Request(cmd, addr, payload)
        bad = bytearray(frame)
        bad[rng.randrange(1, len(bad))] ^= 1 << rng.randrange(8)
        with pytest.raises(proto.FrameError):
            proto.decode_request(bytes(bad))
        status, flags = rng.choice(list(Status)), rng.getrandbits(8)
        resp = proto.encode_response(cmd, status, flags, payload)
        assert proto.response_length(resp[:proto.RESPONSE_HEADER]) == len(resp)
        assert proto.decode_response(resp) == proto.Response(cmd, status, flags, payload)
    with pytest.raises(ValueError, match="32 bits"):
        proto.encode_request(Command.POLL, 1 << 32)


@pytest.mark.parametrize("req, status", [
    (proto.Request(Command.CSR_WRITE, 0x10, b"abcd"), Status.OK),
    (proto.Request(Command.CSR_WRITE, 0x10, b"abc"), Status.BAD_LENGTH),
    (proto.Request(Command.CSR_WRITE, 0x11, b"abcd"), Status.BAD_ADDRESS),
    (proto.Request(Command.CSR_READ, 0x1000, b""), Status.BAD_ADDRESS),
    (proto.Request(Command.MEM_WRITE, 0xFFFF, b"a"), Status.OK),
    (proto.Request(Command.MEM_WRITE, 0xFFFF, b"ab"), Status.BAD_ADDRESS),
    (proto.Request(Command.MEM_WRITE, 0, bytes(MAX_PAYLOAD + 1)), Status.BAD_LENGTH),
    (proto.Request(Command.MEM_READ, 0, b"\x00\x01"), Status.OK),
    (proto.Request(Command.MEM_READ, 0, b"\x01\x01"), Status.BAD_LENGTH),
    (proto.Request(Command.POLL, 0, b""), Status.OK),
    (proto.Request(0x42, 0, b""), Status.BAD_COMMAND),
])
def test_check_request(req, status):
    assert proto.check_request(req, 16) == status


def test_crc16_step_rtl_matches(seed):
    """The RTL's flattened CRC step equals the bitwise reference on random inputs."""
    rng = random.Random(seed)
    crc, byte = Signal(16), Signal(8)
    out = Signal(16)
    m = Module()
    m.d.comb += out.eq(crc16_step(crc, byte))
    cases = [(rng.getrandbits(16), rng.getrandbits(8)) for _ in range(300)]

    async def bench(ctx):
        for c, b in cases:
            ctx.set(crc, c)
            ctx.set(byte, b)
            assert ctx.get(out) == proto.crc16(bytes([b]), c), (hex(c), hex(b))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


# ---- UART under Amaranth's simulator ------------------------------------------------------------


def test_uart_divisor():
    assert uart_divisor(100_000_000, 12_500_000) == 8
    assert uart_divisor(25_000_000, 115_200) == 217
    assert uart_divisor(12_000_000, 115_200) == 104
    with pytest.raises(ValueError, match="at least 4"):
        uart_divisor(12_000_000, 4_000_000)
    with pytest.raises(ValueError, match="off"):
        uart_divisor(10_000_000, 1_900_000)  # 5.26 rounds to 5: 5% fast
    with pytest.raises(ValueError, match="divisor must be"):
        UartRx(3)
    with pytest.raises(ValueError, match="divisor must be"):
        UartTx(2)


@pytest.mark.parametrize("divisor", [4, 5, 8, 13])
def test_uart_round_trip(divisor, seed):
    """Random bytes through UartTx -> UartRx, back to back and with idle gaps; the
    transmitter's start bit plus zero bits last exactly 9 bit periods."""
    rng = random.Random(seed)
    data = [0x00, 0xFF, 0x55, 0xA5] + [rng.getrandbits(8) for _ in range(24)]
    gaps = [rng.choice([0, 0, 1, divisor, 3 * divisor]) for _ in data]
    m = Module()
    m.submodules.tx = tx = UartTx(divisor)
    m.submodules.rx = rx = UartRx(divisor)
    m.d.comb += rx.rx.eq(tx.tx)
    got, low_runs = [], []

    async def sender(ctx):
        for byte, gap in zip(data, gaps, strict=True):
            ctx.set(tx.inp.payload, byte)
            ctx.set(tx.inp.valid, 1)
            await ctx.tick().until(tx.inp.ready)
            ctx.set(tx.inp.valid, 0)
            await ctx.tick().repeat(gap + 1)

    async def receiver(ctx):
        run = 0  # cycles the line has been low
        async for _, _, line, valid, byte, err in ctx.tick().sample(
                tx.tx, rx.out.valid, rx.out.payload.data, rx.out.payload.error):
            if not line:
                run += 1
            elif run:
                low_runs.append(run)
                run = 0
            if valid:
                assert not err, f"framing error on byte {len(got)}"
                got.append(byte)

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_process(receiver)
    sim.add_testbench(sender)
    sim.add_testbench(_drain(lambda: len(got) == len(data), 20 * divisor * len(data)))
    sim.run()
    assert got == data
    assert low_runs[0] == 9 * divisor  # 0x00: start bit and eight zeros


def _drain(done, cycles):
    async def bench(ctx):
        for _ in range(cycles):
            if done():
                break
            await ctx.tick()
        await ctx.tick().repeat(30)
    return bench


def _levels(chars, period, tail=True):
    """Line level per clock cycle for ``chars`` = [(byte, stop_level, idle_bits)],
    then (``tail``) four idle bit periods."""
    out, t = [], 0.0
    for byte, stop, idle in chars:
        bits = [0, *((byte >> i) & 1 for i in range(8)), stop] + [1] * idle
        for b in bits:
            t += period
            while len(out) < round(t):
                out.append(b)
    return out + [1] * int(4 * period) * tail


def _drive_rx(divisor, levels):
    """Drive ``levels`` into a UartRx; the (data, error) pairs it reports."""
    m = Module()
    m.submodules.rx = rx = UartRx(divisor)
    got = []

    async def bench(ctx):
        for level in levels:
            ctx.set(rx.rx, level)
            await ctx.tick()
            if ctx.get(rx.out.valid):
                got.append((ctx.get(rx.out.payload.data), ctx.get(rx.out.payload.error)))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


@pytest.mark.parametrize("skew", [0.97, 1.0, 1.03])
def test_uart_rx_tolerates_baud_error(skew, seed):
    rng = random.Random(seed)
    data = [rng.getrandbits(8) for _ in range(12)]
    got = _drive_rx(8, _levels([(b, 1, rng.choice([0, 1, 3])) for b in data], 8 * skew))
    assert got == [(b, 0) for b in data]


def test_uart_rx_framing_error_and_break():
    """A low stop bit delivers the byte flagged; a break (line held low) is one error,
    not a run of zero bytes; the next character after the line recovers is fine."""
    levels = (_levels([(0x3C, 0, 0)], 8, tail=False) + [0] * 200 + [1] * 20
              + _levels([(0x81, 1, 2)], 8))
    assert _drive_rx(8, levels) == [(0x3C, 1), (0x81, 0)]


def test_uart_rx_false_start():
    """A low glitch shorter than half a bit is not a start bit."""
    for width in (1, 2, 3):
        levels = [1] * 10 + [0] * width + [1] * 30 + _levels([(0x5A, 1, 1)], 8)
        assert _drive_rx(8, levels) == [(0x5A, 0)], width


# ---- the bridge RTL under Verilator -----------------------------------------------------------


def test_bridge_constructor_checks():
    with pytest.raises(ValueError, match="at least 4"):
        UartBridge(10_000_000, 5_000_000, 16)
    with pytest.raises(ValueError, match="mem_addr_width"):
        UartBridge(100_000_000, 1_000_000, 33)
    with pytest.raises(ValueError, match="max_payload"):
        UartBridge(100_000_000, 1_000_000, 16, max_payload=MAX_PAYLOAD + 1)
    with pytest.raises(ValueError, match="frame_timeout_bits"):
        UartBridge(100_000_000, 1_000_000, 16, frame_timeout_bits=5)


@pytest.mark.rtl
def test_bridge_verilator(seed, regress):
    """All of verif/bridge_cocotb.py (random requests, bad frames, resync, bus errors,
    SerialDevice over the simulated UART)."""
    print(f"cocotb seed (BRIDGE_SEED): {seed}")
    run_bridge_tests(seed=seed, ops=400 if regress else 60)


# ---- SerialDevice against the Python model of a board ------------------------------------------


def test_serial_device_on_model(seed):
    rng = random.Random(seed)
    link = ModelSerial()
    model = link.model
    dev = SerialDevice(link, clock_hz=1_000_000)
    assert dev.max_payload == MAX_PAYLOAD
    for _ in range(50):
        a = rng.randrange(0, proto.CSR_SPACE, 4)
        v = rng.getrandbits(32)
        dev.write_reg(a, v)
        assert dev.read_reg(a) == v == int.from_bytes(model.csr[a:a + 4], "little")
    for _ in range(20):
        n = rng.randint(0, 3 * MAX_PAYLOAD)
        a = rng.randrange(len(model.mem) - n)
        data = rng.randbytes(n)
        frames = len(link.frames)
        dev.write_mem(a, data)
        assert len(link.frames) - frames == -(-n // MAX_PAYLOAD)  # bursts of MAX_PAYLOAD
        assert bytes(model.mem[a:a + n]) == data
        assert dev.read_mem(a, n) == data


def test_serial_device_retries_once():
    link = ModelSerial()
    dev = SerialDevice(link)
    link.corrupt_next = 1
    dev.write_reg(0x20, 0x1234_5678)
    assert link.model.csr[0x20:0x24] == (0x1234_5678).to_bytes(4, "little")
    assert link.model.rejects == 1 and link.frames[-1] == link.frames[-2]
    link.corrupt_next = 2
    with pytest.raises(BridgeError, match="BAD_CRC") as e:
        dev.write_reg(0x24, 1)
    assert e.value.status == Status.BAD_CRC and link.model.csr[0x24:0x28] == bytes(4)
    dev.retries = 0
    link.corrupt_next = 1
    with pytest.raises(BridgeError, match="BAD_CRC"):
        dev.read_reg(0x24)


def test_serial_device_errors():
    link = ModelSerial()
    dev = SerialDevice(link)
    link.model.mem_faults.add(0x100)
    with pytest.raises(BusError, match="MEM_WRITE at 0xf0: BUS_ERROR") as e:
        dev.write_mem(0xF0, bytes(32))
    assert e.value.command == Command.MEM_WRITE
    with pytest.raises(BridgeError, match="BAD_ADDRESS"):
        dev.read_reg(0x1001)
    with pytest.raises(BridgeError, match="BAD_ADDRESS"):
        dev.read_mem(len(link.model.mem) - 2, 4)
    link.garble_next = 1
    with pytest.raises(LinkError, match="garbled"):
        dev.read_reg(0)
    link.mute = True
    with pytest.raises(LinkError, match="no response"):
        dev.read_reg(0)
    with pytest.raises(LinkError):
        SerialDevice(link)


def test_serial_device_wait_irq():
    link = ModelSerial()
    dev = SerialDevice(link, clock_hz=1_000_000)
    t0 = link.clock()
    assert dev.wait_irq(5_000) is False
    assert link.clock() - t0 >= 5e-3  # 5000 cycles at 1 MHz, on the stream's clock
    link.model.irq = True
    assert dev.wait_irq(5_000) is True


def test_host_runtime_over_serial_protocol():
    """``npu run`` over the serial transport, with the golden NPU behind the protocol:
    the driver and Session run unchanged and the results check against the reference."""
    from firmware.config import CONFIGS
    from host.cli import _parser, info_on_device, run_on_device
    from host.device import GoldenDevice

    golden = GoldenDevice(CONFIGS["small"], dram_bytes=1 << 20)
    link = ModelSerial(BridgeModel(mem_addr_width=20, device=golden))
    dev = SerialDevice(link)
    assert info_on_device(dev, _parser().parse_args(["info"]))
    assert run_on_device(dev, _parser().parse_args(["run", "mlp", "--digits", "2"]))
    assert link.model.rejects == 0 and len(link.frames) > 100


def test_cli_serial_backend_on_a_pty():
    """``npu info --backend serial --port PTY``: pyserial on a pseudo-terminal whose other
    end answers as a board (the protocol model with the golden NPU behind it)."""
    import os
    import threading
    import tty

    from firmware.config import CONFIGS
    from host.cli import main
    from host.device import GoldenDevice

    master, slave = os.openpty()
    tty.setraw(slave)
    link = ModelSerial(BridgeModel(device=GoldenDevice(CONFIGS["small"], dram_bytes=1 << 16)))
    stop = threading.Event()

    def board():
        buf = b""
        while not stop.is_set():
            try:
                buf += os.read(master, 4096)
            except OSError:
                return
            while len(buf) >= proto.REQUEST_HEADER:  # whole frames to the model
                n = proto.REQUEST_HEADER + int.from_bytes(buf[6:8], "little") + 2
                if len(buf) < n:
                    break
                link.write(buf[:n])
                buf = buf[n:]
                os.write(master, link.read(1 << 16))

    thread = threading.Thread(target=board, daemon=True)
    thread.start()
    try:
        assert main(["info", "--backend", "serial", "--port", os.ttyname(slave),
                     "--baud", "115200"]) == 0
        assert main(["info", "--backend", "serial"]) == 2  # no --port
    finally:
        stop.set()
        os.close(slave)
        os.close(master)
    assert len(link.frames) >= 15 and link.model.rejects == 0  # ID, CAPS, bank
