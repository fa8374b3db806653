"""The Verilator-built NPU as a host :class:`~host.device.Device`, over its real ports.

The host driver is ordinary blocking Python; cocotb runs the simulation. A host
function runs in a cocotb *bridge* thread, and each register or memory access
*resumes* a coroutine that drives the AXI4-Lite port with cocotbext-axi's
``AxiLiteMaster``. DRAM is cocotbext-axi's ``AxiRam`` on the NPU's AXI4 port: the
host reads and writes it directly, as a CPU shares memory with an accelerator, and
the NPU reaches it only through its DMA. Between host accesses the simulation runs
free; the host wakes on the interrupt line, never per cycle.

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
import random

from firmware.config import CONFIGS, NPUConfig
from host.device import Device

DRAM_BYTES = 1 << 20
CLOCK_NS = 10


def config_to_env(config: NPUConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


def config_from_env(text: str) -> NPUConfig:
    return NPUConfig(**json.loads(text))


class CocotbDevice(Device):
    """A :class:`Device` on the simulated NPU (call only from a bridge thread)."""

    def __init__(self, tb):
        from cocotb.task import resume

        self.tb = tb
        self._read = resume(tb.csr_read)
        self._write = resume(tb.csr_write)
        self._wait = resume(tb.wait_irq)
        self._cycles = resume(tb.cycles)

    def read_reg(self, addr: int) -> int:
        return self._read(addr)

    def write_reg(self, addr: int, value: int) -> None:
        self._write(addr, value)

    def read_mem(self, addr: int, size: int) -> bytes:
        return bytes(self.tb.ram.read(addr, size))

    def write_mem(self, addr: int, data: bytes) -> None:
        self.tb.ram.write(addr, bytes(data))

    def wait_irq(self, timeout_cycles: int) -> bool:
        return self._wait(timeout_cycles)

    def cycle(self) -> int:
        """The simulation's clock-cycle count (for figures such as swap stalls)."""
        return self._cycles()


class NpuTestbench:
    """Clock, reset, AXI4-Lite manager and AXI4 RAM around the NPU top (``dut``)."""

    def __init__(self, dut, dram_bytes: int = DRAM_BYTES, backpressure: bool = False,
                 seed: int = 0):
        import cocotb
        from cocotb.clock import Clock
        from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        self.csr = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "csr_"), dut.clk, dut.rst)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "axi_"), dut.clk, dut.rst, size=dram_bytes)
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
                 waves: bool = False):
    """Build the NPU for ``config`` and run the host function ``spec`` against it.

    ``spec`` is ``"package.module:function"``; the function receives a
    :class:`CocotbDevice` and the seed, and raises on a mismatch. Raises
    ``verif.sim.CocotbTestFailure`` when it fails.
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
           **(extra_env or {})}
    return run_cocotb("npu", [source], "verif.cocotb_npu", build, extra_env=env,
                      waves=waves, test_dir=build / _test_dir(spec, seed, backpressure))


def _config_name(config: NPUConfig) -> str:
    for name, c in CONFIGS.items():
        if c == config:
            return name
    return "cfg" + hashlib.sha1(config_to_env(config).encode()).hexdigest()[:10]


def _test_dir(spec: str, seed: int, backpressure: bool) -> str:
    tag = spec.rsplit(":", 1)[-1]
    return f"run_{tag}_{seed}{'_bp' if backpressure else ''}"
