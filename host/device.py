"""Device transports: how the host reaches an NPU (registers, memory, interrupt).

The host knows the NPU only through this interface, exactly as it would know a board:
32-bit CSR reads and writes (the map of firmware/regs.py), DRAM reads and writes, and
waiting for the interrupt. Every backend implements it:

* :class:`GoldenDevice`: the golden model in-process, behind an emulation of the
  CSR map (fast; the reference for everything else);
* ``verif.rtl_device.CocotbDevice``: the Verilator-built RTL over its real
  AXI4-Lite and AXI4 ports (cocotbext-axi);
* a serial bridge to an FPGA board (planned with the FPGA issue).
"""

from __future__ import annotations

import abc

import numpy as np

from firmware import isa
from firmware.config import NPUConfig
from firmware.golden import Machine
from firmware.regs import (
    HW_VERSION,
    ID_MAGIC,
    TRACE_FIELDS,
    addresses,
    counter_names,
    pack_fields,
    unpack_fields,
)


class Device(abc.ABC):
    """A transport to one NPU."""

    @abc.abstractmethod
    def read_reg(self, addr: int) -> int:
        """Read the 32-bit CSR at byte address ``addr``."""

    @abc.abstractmethod
    def write_reg(self, addr: int, value: int) -> None:
        """Write the 32-bit CSR at byte address ``addr``."""

    @abc.abstractmethod
    def read_mem(self, addr: int, size: int) -> bytes:
        """Read ``size`` bytes of DRAM at ``addr``."""

    @abc.abstractmethod
    def write_mem(self, addr: int, data: bytes) -> None:
        """Write bytes into DRAM at ``addr``."""

    @abc.abstractmethod
    def wait_irq(self, timeout_cycles: int) -> bool:
        """Wait until the interrupt line is high; False if ``timeout_cycles`` passed."""

    def close(self) -> None:  # noqa: B027 - optional hook, most transports hold nothing
        """Release the transport."""


class GoldenDevice(Device):
    """The golden model behind an emulation of the NPU's CSR map.

    Runs execute synchronously when START is written (the golden model has no
    notion of concurrency), so STATUS.busy is never seen set. Everything else
    follows the register semantics of firmware/regs.py, including refusal of writes
    aimed at the active bank, swaps landing at the run boundary, and the IRQ bits.
    """

    def __init__(self, config: NPUConfig | None = None, dram_bytes: int = 1 << 22):
        self.config = config = config or NPUConfig()
        self.machine = Machine(config, dram_bytes=dram_bytes)
        self.addr = addresses(config)
        self._by_addr = {a: n for n, a in self.addr.items()}
        self._counter_names = counter_names(config)
        self.args = [0] * isa.NUM_ARG_REGS
        self.irq_enable = 0
        self.irq_status = 0
        self.refused = False
        self.cycle_budget = 0
        self.bank_version = [0, 0]
        self.imem_bank, self.imem_index, self.imem_lo = 0, 0, 0
        self.pt_sel = (0, 0, 0)  # (bank, set, partition)
        self.pt_base = 0
        self.last_error = (0, 0, 0)
        self._latched_hi = 0

    # ---- registers ------------------------------------------------------------------
    def read_reg(self, addr: int) -> int:
        name = self._by_addr.get(addr)
        if name is None:
            raise ValueError(f"no CSR at {addr:#x}")
        mc, cfg = self.machine, self.config
        if name == "ID":
            return ID_MAGIC
        if name == "VERSION":
            return pack_fields("VERSION", isa=isa.ISA_VERSION, hw=HW_VERSION)
        if name.startswith("CAPS_"):
            return getattr(cfg, name[5:].lower())
        if name == "STATUS":
            return pack_fields("STATUS", active_bank=mc.active_bank,
                               error=int(self.last_error[0] != 0), refused=int(self.refused),
                               trace_overflow=int(mc.counters["trace_overflows"] != 0))
        if name == "ERROR":
            return self.last_error[0]
        if name == "ERROR_PC":
            return self.last_error[1]
        if name == "ERROR_ADDR":
            return self.last_error[2] & 0xFFFF_FFFF
        if name == "IRQ_ENABLE":
            return self.irq_enable
        if name == "IRQ_STATUS":
            return self.irq_status
        if name == "CYCLE_BUDGET":
            return self.cycle_budget
        if name.startswith("BANK_VERSION"):
            return self.bank_version[int(name[-1])]
        if name.startswith("ARG"):
            return self.args[int(name[3:])]
        if name == "IMEM_ADDR":
            return pack_fields("IMEM_ADDR", index=self.imem_index, bank=self.imem_bank)
        if name == "PT_SELECT":
            bank, s, p = self.pt_sel
            return pack_fields("PT_SELECT", partition=p, set=s, bank=bank)
        if name in ("PT_BASE", "PT_SIZE"):
            bank, s, p = self.pt_sel
            base, size = mc.ptables[bank][s][p]
            return base if name == "PT_BASE" else size
        if name == "TRACE_COUNT":
            return len(mc.trace)
        if name.startswith("TRACE_") and name[6:].lower() in TRACE_FIELDS:
            if not mc.trace:
                return 0
            return getattr(mc.trace[0], name[6:].lower()) & 0xFFFF_FFFF
        if name.startswith("R") and name[1:].isdigit():
            return mc.regs[int(name[1:])]
        if name.startswith("CNT_"):
            cname, half = name[4:-3].lower(), name[-2:]
            value = self._counter(cname)
            if half == "LO":
                self._latched_hi = (value >> 32) & 0xFFFF_FFFF
                return value & 0xFFFF_FFFF
            return self._latched_hi
        return 0  # write-only registers read as zero

    def _counter(self, name: str) -> int:
        c = self.machine.counters
        for kind in ("tag_hits", "tag_misses"):
            if name.startswith(kind + "_p"):
                return c[kind][int(name[len(kind) + 2:])]
        return c[name]

    def write_reg(self, addr: int, value: int) -> None:
        name = self._by_addr.get(addr)
        if name is None:
            raise ValueError(f"no CSR at {addr:#x}")
        mc = self.machine
        value &= 0xFFFF_FFFF
        if name == "CTRL":
            cmd = unpack_fields("CTRL", value)
            if cmd["swap"]:  # lands at once: no run is in progress
                mc.swap()
            if cmd["counter_reset"]:
                mc.reset_counters()
            if cmd["tag_invalidate"]:
                mc.invalidate_tags()
            if cmd["trace_clear"]:
                mc.trace.clear()
            if cmd["start"]:
                self._run()
        elif name == "IRQ_ENABLE":
            self.irq_enable = value & pack_fields("IRQ_ENABLE", done=1, error=1)
        elif name == "IRQ_STATUS":
            self.irq_status &= ~value
            if unpack_fields("IRQ_STATUS", value)["refused"]:
                self.refused = False
        elif name == "CYCLE_BUDGET":
            self.cycle_budget = value
        elif name.startswith("BANK_VERSION"):
            bank = int(name[-1])
            if self._refuse(bank):
                return
            self.bank_version[bank] = value
        elif name.startswith("ARG"):
            self.args[int(name[3:])] = value
        elif name == "IMEM_ADDR":
            f = unpack_fields("IMEM_ADDR", value)
            self.imem_index, self.imem_bank = f["index"], f["bank"]
        elif name == "IMEM_DATA_LO":
            self.imem_lo = value
        elif name == "IMEM_DATA_HI":
            if not self._refuse(self.imem_bank):
                if self.imem_index < self.config.imem_depth:
                    mc.imem[self.imem_bank][self.imem_index] = (value << 32) | self.imem_lo
                self.imem_index = (self.imem_index + 1) & 0xFFFF
        elif name == "PT_SELECT":
            f = unpack_fields("PT_SELECT", value)
            self.pt_sel = (f["bank"], f["set"], f["partition"])
        elif name == "PT_BASE":
            self.pt_base = value
        elif name == "PT_SIZE":
            bank, s, p = self.pt_sel
            if not self._refuse(bank) and s < self.config.pt_sets and p < self.config.partitions:
                mc.ptables[bank][s][p] = (self.pt_base, value)
        elif name == "TRACE_POP":
            if value & 1 and mc.trace:
                mc.trace.popleft()

    def _refuse(self, bank: int) -> bool:
        if bank == self.machine.active_bank:
            self.refused = True
            self.irq_status |= pack_fields("IRQ_STATUS", refused=1)
            return True
        return False

    def _run(self):
        res = self.machine.run(args=self.args, max_cycles=self.cycle_budget or None)
        self.last_error = (int(res.error), res.pc, res.error_addr)
        self.irq_status |= pack_fields("IRQ_STATUS", done=1, error=int(res.error != 0))

    # ---- memory and interrupt --------------------------------------------------------
    def read_mem(self, addr: int, size: int) -> bytes:
        self._check_mem(addr, size)
        return self.machine.dram[addr:addr + size].tobytes()

    def write_mem(self, addr: int, data: bytes) -> None:
        self._check_mem(addr, len(data))
        self.machine.dram[addr:addr + len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)

    def _check_mem(self, addr, size):
        if addr < 0 or addr + size > len(self.machine.dram):
            raise ValueError(f"DRAM [{addr:#x}, +{size}) outside {len(self.machine.dram)} bytes")

    def wait_irq(self, timeout_cycles: int) -> bool:
        """Whether an enabled interrupt is pending. Runs finish when START is written,
        so waiting could not change the answer: no timeout is spent."""
        return bool(self.irq_status & self.irq_enable)

    def set_bus_faults(self, windows) -> None:
        """Make DRAM ranges answer bus errors (a test hook, mirroring the RTL testbench).

        ``windows`` is ``[(lo, hi, resp), ...]``: byte range ``[lo, hi)`` and the AXI
        response code, which the golden model ignores (both codes are BUS_ERROR).
        ``[]`` clears them.
        """
        self.machine.bus_faults = [(int(lo), int(hi)) for lo, hi, _ in windows]
