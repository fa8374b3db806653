"""Co-simulation of a board: ``hdl.boards.soc.BoardSoC`` under Verilator, driven by the
real host stack over its UART pins.

The board SoC (NPU + on-chip RAM standing in for DRAM + UART bridge) is built for
the ULX3S NPU configuration. The host side is the code path ``npu run --backend
serial`` takes on a board, unchanged: :class:`host.serial_device.SerialDevice` on a
simulated serial line (:func:`verif.bridge_link.uart_stream`, cocotbext-uart on the
``rx``/``tx`` pins), under :class:`host.driver.NPUDriver` (which learns the NPU
configuration from CAPS over the link), the compiler and :class:`host.runtime.Session`.
Nothing reaches the design except through the UART.

The cocotb test :func:`board_runs_model` (run it with :func:`run_board_cosim`) loads
a bundled model, runs held-out digits, and checks every inference against the
reference interpreter (``Session(check=True)``) and against the golden model running
the same model beside it: outputs, the exact counters (``EXACT_COUNTERS``) and the
exact region-trace fields. Then it injects damage on the line: a memory write with
a garbled CRC that would have zeroed the model's weights (the bridge must answer
BAD_CRC, pulse ``error``, count it in POLL and write nothing), and a request
corrupted in the middle of an inference (SerialDevice gets BAD_CRC and resends it);
the inference after that must still agree with the golden model.

Environment of the simulation: ``BOARD_MODEL`` (bundled model name or .onnx path),
``BOARD_INPUTS`` (digits run before the damage; one more runs after it),
``BOARD_SEED``, ``BOARD_CONFIG`` (the NPU configuration, JSON).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time

import cocotb
import numpy as np

from firmware.config import NPUConfig

__all__ = [
    "CLOCK_NS", "CLK_FREQ", "DIVISOR", "BAUD", "RAM_BYTES", "board_config", "build_board_soc",
    "run_board_cosim", "board_runs_model",
]

CLOCK_NS = 10
"""Simulated clock period (100 MHz, the ULX3S NPU clock)."""

CLK_FREQ = 1_000_000_000 // CLOCK_NS

DIVISOR = 4
"""Clock cycles per UART bit: the bridge's minimum. The run is UART-bound (nearly every
simulated cycle is spent moving bytes), so the fastest line halves its time against
the 8 of the bridge's own tests; the UART's timing margins are tested there."""

BAUD = CLK_FREQ // DIVISOR

RAM_BYTES = 64 * 1024
"""On-chip RAM of the simulated board (the bundled mlp needs a few KiB)."""

TOPLEVEL = "board_soc"


def board_config() -> NPUConfig:
    """The NPU configuration of the ULX3S build (``hdl.boards.ulx3s.CONFIG``)."""
    from hdl.boards.ulx3s import CONFIG

    return CONFIG


def _params(config: NPUConfig, ram_bytes: int) -> dict:
    return {"config": dataclasses.asdict(config), "ram_bytes": ram_bytes,
            "clk_freq": CLK_FREQ, "baud": BAUD}


def build_board_soc(config: NPUConfig | None = None, ram_bytes: int = RAM_BYTES):
    """Verilog of ``BoardSoC(config, ram_bytes, CLK_FREQ, BAUD)`` (module ``board_soc``).

    Returns ``(verilog_path, build_dir)``. The Verilog is cached on the sources of
    hdl/ and firmware/ and the parameters; the build directory is
    ``build/sim/board_soc`` for the board configuration and RAM size, a variant
    directory otherwise (so Verilator's own cache holds for each).
    """
    import hashlib

    from hdl.boards.soc import BoardSoC
    from verif.sim import sim_build_dir, source_digest, to_verilog_cached

    config = board_config() if config is None else config
    params = _params(config, ram_bytes)
    text = json.dumps(params, sort_keys=True)
    if config == board_config() and ram_bytes == RAM_BYTES:
        name = TOPLEVEL
    else:
        name = f"{TOPLEVEL}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    build = sim_build_dir(name)
    key = source_digest("hdl", "firmware") + text
    source = to_verilog_cached(lambda: BoardSoC(config, ram_bytes, CLK_FREQ, BAUD),
                               TOPLEVEL, build / f"{TOPLEVEL}.v", key)
    return source, build


def run_board_cosim(model: str = "mlp", inputs: int = 1, *, seed: int = 0,
                    config: NPUConfig | None = None, ram_bytes: int = RAM_BYTES,
                    waves: bool = False):
    """Build the board SoC (cached) and run :func:`board_runs_model` on it.

    ``inputs`` digits run before the injected damage, one after it. Returns the
    cocotb results file; raises ``verif.sim.CocotbTestFailure`` on any mismatch.
    """
    from verif.sim import run_cocotb

    config = board_config() if config is None else config
    source, build = build_board_soc(config, ram_bytes)
    env = {"BOARD_MODEL": model, "BOARD_INPUTS": str(inputs), "BOARD_SEED": str(seed),
           "BOARD_CONFIG": json.dumps(dataclasses.asdict(config))}
    tag = os.path.basename(model).removesuffix(".onnx")
    return run_cocotb(TOPLEVEL, [source], "verif.board_cosim", build, extra_env=env,
                      waves=waves, test_dir=build / f"run_{tag}_{seed}")


# ---- the cocotb side ---------------------------------------------------------------


class _Garble:
    """Wraps a stream's ``write``: the ``at``-th frame written (0-based) goes out with a
    flipped bit in its last CRC byte, as line noise would leave it."""

    def __init__(self, link, at: int):
        self.link, self.at, self.seen = link, at, 0
        self.original = link.write
        self.garbled: bytes | None = None
        link.write = self

    def __call__(self, data: bytes) -> int:
        data = bytes(data)
        if self.seen == self.at:
            self.garbled = data
            data = data[:-1] + bytes([data[-1] ^ 0x10])
        self.seen += 1
        return self.original(data)

    def remove(self) -> None:
        self.link.write = self.original


def _agree(what: str, rtl, gold) -> None:
    """The board's inference equals the golden model's: outputs, exact counters, trace."""
    from verif.scenarios import assert_same_inference

    assert rtl.checked and gold.checked, f"{what}: not checked against the reference"
    # The board's memory is not the simulation's AxiRam whose latencies the golden
    # model's cycles are measured with: cycles are not compared.
    assert_same_inference(what, rtl, gold, device="board", cycles=False)


@cocotb.test()
async def board_runs_model(dut):
    """A bundled model runs on the board SoC through the UART exactly as on the golden
    model; a garbled frame is rejected unexecuted and the board keeps working."""
    from cocotb.clock import Clock
    from cocotb.task import bridge
    from cocotb.triggers import ClockCycles, RisingEdge

    from firmware import bridge as proto
    from firmware.bridge import Status
    from host.cli import model_path
    from host.compiler import compile_model
    from host.datasets import load_digits_split
    from host.device import GoldenDevice
    from host.driver import NPUDriver
    from host.onnx_import import load_onnx
    from host.runtime import Session
    from host.serial_device import SerialDevice
    from verif.bridge_link import uart_stream

    name = os.environ.get("BOARD_MODEL", "mlp")
    count = int(os.environ.get("BOARD_INPUTS", "1"))
    seed = int(os.environ.get("BOARD_SEED", "0"))
    config = NPUConfig(**json.loads(os.environ["BOARD_CONFIG"]))
    log = dut._log

    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    link = uart_stream(dut, BAUD)  # drives rx idle-high from here on
    pulses = [0]

    async def count_errors():
        while True:  # one-cycle pulses, far apart (one per rejected frame at most)
            await RisingEdge(dut.error)
            pulses[0] += 1

    dut.rst.value = 1
    await ClockCycles(dut.clk, 5)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 5)
    cocotb.start_soon(count_errors())

    def cycle() -> int:
        return round(link.clock() * CLK_FREQ)

    def moved() -> int:
        return link.bytes_written + link.bytes_read

    def host():
        rng = random.Random(seed)
        wall = time.monotonic()
        dev = SerialDevice(link, clock_hz=CLK_FREQ)
        drv = NPUDriver(dev)
        assert drv.config == config, f"CAPS over the UART say {drv.config}, built {config}"
        graph = load_onnx(model_path(name))
        model = compile_model(graph, drv.config)
        session = Session(drv, model, check=True)
        need = session.arena_base + model.place.arena_bytes
        assert need <= RAM_BYTES, f"{name} needs {need} bytes of DRAM, the board has {RAM_BYTES}"
        c0, b0 = cycle(), moved()
        session.load()
        golden = Session(NPUDriver(GoldenDevice(config)), model, check=True)
        golden.load()
        print(f"{name} on the board SoC ({config.rows}x{config.cols} array, {RAM_BYTES // 1024} "
              f"KiB RAM, UART at {CLK_FREQ // BAUD} cycles per bit): {len(model.program)} "
              f"instructions, {model.place.const_bytes} constant bytes; loaded in "
              f"{cycle() - c0} cycles, {moved() - b0} bytes over the UART")

        split = load_digits_split(seed=0)
        shape = graph.tensors[graph.inputs[0]].shape
        picks = np.random.default_rng(seed).choice(len(split.x_test), size=count + 1,
                                                   replace=False)

        def infer(i, what):
            inputs = {graph.inputs[0]: split.x_test[i].reshape(shape).astype(np.float32)}
            c, b = cycle(), moved()
            rtl = session.run(inputs)
            gold = golden.run(inputs)
            _agree(f"{name} digit #{i} {what}", rtl, gold)
            out = next(iter(rtl.outputs.values()))
            print(f"{name} digit #{i}{what}: predicted {int(np.argmax(out))} (label "
                  f"{split.y_test[i]}), {rtl.cycles} NPU cycles (golden estimate "
                  f"{gold.cycles}); {cycle() - c} cycles and {moved() - b} bytes over the "
                  "UART; equals the reference and the golden model")

        for i in picks[:count]:
            infer(int(i), "")

        # 1. A garbled frame: a write that would zero the first constants (the weights),
        #    its payload damaged on the line. Rejected as BAD_CRC, unexecuted.
        size = min(64, model.place.const_bytes)
        image = model.const_image()
        assert any(image[:size]), "the constants start with zeros: the write would not show"
        before_poll = dev.poll().rejected
        frame = bytearray(proto.mem_write(session.const_base, bytes(size)))
        frame[proto.REQUEST_HEADER + rng.randrange(size)] ^= 1 << rng.randrange(8)
        errors = pulses[0]
        link.write(bytes(frame))
        head = link.read(proto.RESPONSE_HEADER)
        assert len(head) == proto.RESPONSE_HEADER and head[0] == proto.RSYNC, \
            f"no response to the garbled frame ({head.hex()})"
        resp = proto.decode_response(head + link.read(proto.response_length(head)
                                                      - proto.RESPONSE_HEADER))
        assert resp.status == Status.BAD_CRC and resp.payload == b"", resp
        assert dev.poll().rejected == (before_poll + 1) & 0xFF, "POLL did not count it"
        assert pulses[0] == errors + 1, f"{pulses[0] - errors} error pulses, not 1"
        assert dev.read_mem(session.const_base, size) == image[:size], \
            "the rejected write reached the RAM"
        print(f"garbled MEM_WRITE over the weights: {resp.status.name}, one error pulse, "
              "RAM unchanged")

        # 2. A request damaged in the middle of an inference: the bridge answers BAD_CRC,
        #    SerialDevice resends it, and the inference still agrees with the golden model.
        garble = _Garble(link, at=rng.randrange(3, 40))
        try:
            infer(int(picks[count]), " (one request garbled and resent)")
        finally:
            garble.remove()
        assert garble.garbled is not None, "the inference sent too few frames to garble one"
        assert pulses[0] == errors + 2, f"{pulses[0] - errors} error pulses, not 2"
        assert dev.poll().rejected == (before_poll + 2) & 0xFF
        print(f"request {garble.at} of the inference ({garble.garbled[1]:#04x} command) "
              "garbled: rejected, resent, results still exact")
        print(f"total: {cycle()} cycles ({link.clock() * 1e3:.2f} ms simulated), "
              f"{link.bytes_written} bytes to the board, {link.bytes_read} back; "
              f"{time.monotonic() - wall:.1f} s wall")
        dev.close()

    await bridge(host)()
    log.info("board co-simulation passed")
