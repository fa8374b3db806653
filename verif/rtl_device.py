"""The Verilator-built NPU as a host :class:`~host.device.Device`, over its real ports.

The host driver is ordinary blocking Python; cocotb runs the simulation. A host
function runs in a cocotb *bridge* thread, and each register or memory access
*resumes* a coroutine that drives the AXI4-Lite port with cocotbext-axi's
``AxiLiteMaster``. DRAM is cocotbext-axi's ``AxiRam`` on the NPU's AXI4 port: the
host reads and writes it directly, as a CPU shares memory with an accelerator, and
the NPU reaches it only through its DMA. Between host accesses the simulation runs
free; the host wakes on the interrupt line, never per cycle.

CSR writes are posted: :class:`CocotbDevice` queues them and issues the queue as one
pipelined burst of AXI4-Lite writes, in order, before the next read, memory access,
interrupt wait or clock query (and every 256 writes). The NPU sees the same writes in
the same order, relative to every read, as with one blocking write at a time; only
the thread hand-offs are saved (most of the cost of loading a program).

DRAM can answer bus errors: :meth:`CocotbDevice.set_bus_faults` declares address
windows whose beats answer SLVERR or DECERR (:class:`FaultyAxiRam`);
``GoldenDevice.set_bus_faults`` declares the same windows to the golden model. It can
be slow: a :class:`~firmware.bursts.DramLatency` delays read bursts and write responses
(:func:`delay_answers`), as the fast library's DRAM and the golden model do.

Use :func:`run_scenario` from pytest: it builds the NPU for a configuration (cached
per configuration), and runs ``module:function`` inside the simulator with a
:class:`CocotbDevice`; the function does its own checking (it can run the golden
model beside the RTL, in the same process).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import random
from pathlib import Path

from firmware.bursts import DramLatency
from firmware.config import CONFIGS, NPUConfig
from host.device import PostedWrites, fault_windows

DRAM_BYTES = 1 << 20
CLOCK_NS = 10
PUBLIC_SIGNALS = Path(__file__).with_name("cocotb_npu.vlt")
"""The signals the testbench reaches; the rest stay private to Verilator's optimizer."""


def config_to_env(config: NPUConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


def config_from_env(text: str) -> NPUConfig:
    return NPUConfig(**json.loads(text))


def _overlaps(lo: int, hi: int, addr: int, size: int) -> bool:
    return addr < hi and lo < addr + size


class FaultyAxiRam:
    """cocotbext-axi ``AxiRam`` whose ``faults`` windows answer bus errors.

    ``faults`` is a list of ``(lo, hi, resp)``: byte range ``[lo, hi)`` and the AXI
    response code (``host.device.RESP_SLVERR`` or ``RESP_DECERR``). A read beat whose bus
    word touches a window returns zeros with that response; a write beat's bytes in
    a window are dropped and the burst's B response carries the code. Keep windows
    aligned to the bus width, so "a row touches the window" means the same to the
    RTL (bus words) and to the golden model (bytes).
    """

    def __init__(self, bus, clock, reset, size: int):
        from cocotbext.axi import AxiRamRead, AxiRamWrite
        from cocotbext.axi.memory import Memory

        faults: list[tuple[int, int, int]] = []
        self.faults = faults

        class Read(AxiRamRead):
            async def _read(self, address, length):
                for lo, hi, resp in faults:
                    if _overlaps(lo, hi, address, length):
                        self.resp = resp
                        return bytes(length)
                return await super()._read(address, length)

        class Write(AxiRamWrite):
            async def _write(self, address, data):
                for lo, hi, resp in faults:
                    if _overlaps(lo, hi, address, len(data)):
                        self.resp = self.resp or resp
                        return
                await super()._write(address, data)

        self.memory = Memory(size)
        self.write_if = Write(bus.write, clock, reset, mem=self.memory.mem)
        self.read_if = Read(bus.read, clock, reset, mem=self.memory.mem)
        for side, channel, field in ((self.read_if, self.read_if.r_channel, "rresp"),
                                     (self.write_if, self.write_if.b_channel, "bresp")):
            side.resp = 0
            _answer_with_resp(side, channel, field)

    def read(self, addr: int, size: int) -> bytes:
        return self.memory.read(addr, size)

    def write(self, addr: int, data: bytes) -> None:
        self.memory.write(addr, data)


def delay_answers(ram: FaultyAxiRam, clock, latency: DramLatency, period_ns: int) -> None:
    """Make ``ram`` a slow DRAM (see :class:`~firmware.bursts.DramLatency`): its read
    process starts a burst's beats ``latency.read`` cycles after taking the burst up,
    its write process sends a burst's response ``latency.write`` cycles after its last
    beat. Each wait is two triggers (a timer to the middle of the cycle before, then
    the edge), not one per cycle; waking on that edge after the channel models did,
    the process queues as it does when a queue wakes it (the fast library's order)."""
    from cocotb.triggers import RisingEdge, Timer

    period_ps = period_ns * 1000

    async def cycles(n: int) -> None:
        if n:
            await Timer(n * period_ps - period_ps // 2, unit="ps")
            await RisingEdge(clock)

    recv, send = ram.read_if.ar_channel.recv, ram.write_if.b_channel.send

    async def recv_then_wait():
        burst = await recv()
        await cycles(latency.read)
        return burst

    async def wait_then_send(beat):
        await cycles(latency.write)
        await send(beat)

    ram.read_if.ar_channel.recv = recv_then_wait
    ram.write_if.b_channel.send = wait_then_send


def _answer_with_resp(side, channel, field: str) -> None:
    """Make ``channel.send`` put ``side.resp`` (if set, then cleared) into ``field``."""
    send = channel.send

    async def send_with_resp(beat):
        if side.resp:
            setattr(beat, field, side.resp)
            side.resp = 0
        await send(beat)

    channel.send = send_with_resp


class CocotbDevice(PostedWrites):
    """A :class:`Device` on the simulated NPU (call only from a bridge thread).

    Beyond the :class:`Device` contract it offers what only a simulation can:
    :meth:`cycle`, :meth:`set_bus_faults` and :meth:`watch_runs` /
    :meth:`run_events`; ``dram_latency`` is its DRAM's (the testbench's).
    """

    def __init__(self, tb):
        from cocotb.task import resume

        super().__init__()
        self.tb = tb
        self.dram_latency = tb.dram_latency
        self._read = resume(tb.csr_read)
        self._csr_write_many = resume(tb.csr_write_many)
        self._wait = resume(tb.wait_irq)
        self._cycles = resume(tb.cycles)
        self._watch = resume(tb.watch_runs)

    def _write_many(self, ops: list[tuple[int, int]]) -> None:
        self._csr_write_many(ops)

    def read_reg(self, addr: int) -> int:
        self._flush()
        return self._read(addr)

    def read_mem(self, addr: int, size: int) -> bytes:
        self._flush()
        return bytes(self.tb.ram.read(addr, size))

    def write_mem(self, addr: int, data: bytes) -> None:
        self._flush()
        self.tb.ram.write(addr, bytes(data))

    def wait_irq(self, timeout_cycles: int) -> bool:
        self._flush()
        return self._wait(timeout_cycles)

    def cycle(self) -> int:
        """The simulation's clock-cycle count (for figures such as swap stalls)."""
        self._flush()
        return self._cycles()

    def set_bus_faults(self, windows) -> None:
        """Make DRAM answer bus errors: ``windows`` is ``[(lo, hi, resp), ...]``.

        ``resp`` is ``host.device.RESP_SLVERR`` or ``RESP_DECERR``; ``[]`` clears them.
        """
        self._flush()
        self.tb.ram.faults[:] = fault_windows(windows)

    def watch_runs(self, on: bool = True) -> None:
        """Start (or stop) recording the cycles at which runs start and finish."""
        self._flush()
        self._watch(on)

    def run_events(self) -> list[tuple[int, str]]:
        """``(cycle, "start" | "done")`` of every run boundary seen while watching.

        "start" is the cycle the sequencer begins a run (``run_start``), "done" the
        cycle it reports the run finished (``done``).
        """
        self._flush()
        return list(self.tb.run_events)


class NpuTestbench:
    """Clock, reset, AXI4-Lite manager and AXI4 RAM around the NPU top (``dut``); the
    RAM as slow as ``dram_latency`` says (none by default)."""

    def __init__(self, dut, dram_bytes: int = DRAM_BYTES, backpressure: bool = False,
                 seed: int = 0, dram_latency: DramLatency | None = None):
        import cocotb
        from cocotb.clock import Clock
        from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster

        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        self.csr = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "csr_"), dut.clk, dut.rst)
        self.ram = FaultyAxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst,
                                size=dram_bytes)
        # One log line per burst and CSR access costs more than simulating it.
        for side in (self.csr.write_if, self.csr.read_if, self.ram.write_if, self.ram.read_if):
            side.log.setLevel(logging.WARNING)
        self.dram_latency = dram_latency or DramLatency()
        if self.dram_latency:
            delay_answers(self.ram, dut.clk, self.dram_latency, CLOCK_NS)
        self.run_events: list[tuple[int, str]] = []
        self._watchers: list = []
        self.backpressure = backpressure  # the memory pauses at random (wait states)
        if backpressure:
            rng = random.Random(seed)

            def pauses():
                while True:
                    yield rng.random() < 0.3

            for ch in (self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                       self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                       self.ram.read_if.r_channel):
                ch.set_pause_generator(pauses())
        self._cycle = 0

    async def reset(self):
        from cocotb.triggers import ClockCycles

        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 5)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def csr_read(self, addr: int) -> int:
        return int.from_bytes((await self.csr.read(addr, 4)).data, "little")

    async def csr_write(self, addr: int, value: int) -> None:
        await self.csr.write(addr, int(value & 0xFFFF_FFFF).to_bytes(4, "little"))

    async def csr_write_many(self, ops) -> None:
        """Issue ``[(addr, value), ...]`` as pipelined AXI4-Lite writes, in order."""
        done = [self.csr.init_write(addr, int(value & 0xFFFF_FFFF).to_bytes(4, "little"))
                for addr, value in ops]
        for event in done:  # every response is in before a later read is issued
            await event.wait()

    async def watch_runs(self, on: bool) -> None:
        """Record run starts and ends into :attr:`run_events` (see CocotbDevice)."""
        import cocotb
        from cocotb.triggers import RisingEdge

        for task in self._watchers:
            task.cancel()
        self._watchers = []
        if not on:
            return

        async def watch(signal, kind):
            while True:
                await RisingEdge(signal)
                self.run_events.append((await self.cycles(), kind))

        # the sequencer's run boundaries, public in the build (cocotb_npu.vlt)
        self._watchers = [cocotb.start_soon(watch(self.dut.run_start, "start")),
                          cocotb.start_soon(watch(self.dut.done, "done"))]

    async def wait_irq(self, timeout_cycles: int) -> bool:
        from cocotb.triggers import ClockCycles, First, RisingEdge

        if int(self.dut.irq.value):
            return True
        timer = ClockCycles(self.dut.clk, timeout_cycles)
        fired = await First(RisingEdge(self.dut.irq), timer)
        return fired is not timer

    async def cycles(self) -> int:
        from cocotb.utils import get_sim_time

        return int(get_sim_time(unit="ns")) // CLOCK_NS


def scenario_function(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def run_scenario(spec: str, config: NPUConfig | str = "default", *, seed: int = 0,
                 backpressure: bool = False, extra_env: dict | None = None,
                 waves: bool = False, quiet: bool = False,
                 dram_latency: DramLatency | None = None):
    """Build the NPU for ``config`` and run the host function ``spec`` against it.

    ``spec`` is ``"package.module:function"``; the function receives a
    :class:`CocotbDevice` and the seed, and raises on a mismatch. ``dram_latency``
    makes the testbench's DRAM slow (:class:`~firmware.bursts.DramLatency`). Raises
    ``verif.sim.CocotbTestFailure`` when it fails. ``quiet``: see
    :func:`verif.sim.run_cocotb`.
    """
    from hdl.top import NPU
    from verif.sim import run_cocotb, sim_build_dir, source_digest, to_verilog_cached

    if isinstance(config, str):
        config = CONFIGS[config]
    name = _config_name(config)
    build = sim_build_dir(f"npu_{name}")
    key = source_digest("hdl", "firmware") + config_to_env(config)
    source = to_verilog_cached(lambda: NPU(config), "npu", build / "npu.v", key)
    env = {"NPU_SCENARIO": spec, "NPU_CONFIG": config_to_env(config),
           "NPU_SCENARIO_SEED": str(seed), "NPU_BACKPRESSURE": "1" if backpressure else "0",
           **dram_latency_env(dram_latency), **(extra_env or {})}
    test_dir = _test_dir(spec, seed, backpressure) + _latency_tag(dram_latency)
    return run_cocotb("npu", [PUBLIC_SIGNALS, source], "verif.cocotb_npu", build,
                      extra_env=env, build_args=["--no-public-flat-rw"], waves=waves,
                      test_dir=build / test_dir, quiet=quiet)


def dram_latency_env(latency: DramLatency | None) -> dict[str, str]:
    """The environment that tells the simulator's testbench its DRAM latency."""
    return {"NPU_DRAM_LATENCY": f"{latency.read},{latency.write}"} if latency else {}


def dram_latency_from_env(env) -> DramLatency:
    read, _, write = env.get("NPU_DRAM_LATENCY", "0,0").partition(",")
    return DramLatency(int(read), int(write))


def _latency_tag(latency: DramLatency | None) -> str:
    return f"_dram{latency.read}_{latency.write}" if latency else ""


def _config_name(config: NPUConfig) -> str:
    for name, c in CONFIGS.items():
        if c == config:
            return name
    return "cfg" + hashlib.sha1(config_to_env(config).encode()).hexdigest()[:10]


def _test_dir(spec: str, seed: int, backpressure: bool) -> str:
    tag = spec.rsplit(":", 1)[-1]
    return f"run_{tag}_{seed}{'_bp' if backpressure else ''}"
