"""Device transports: how the host reaches an NPU (registers, memory, interrupt).

The host knows the NPU only through this interface, exactly as it would know a board:
32-bit CSR reads and writes (the map of firmware/regs.py), DRAM reads and writes, and
waiting for the interrupt. Every backend implements it:

* :class:`GoldenDevice`: the golden model in-process, behind the CSR model of
  firmware/csrmodel.py (fast; the reference for everything else);
* :class:`host.verilator_device.VerilatorDevice`: the Verilator-built RTL over its
  real AXI4-Lite and AXI4 ports, in-process (a C++ DRAM and driver; ``npu --backend
  verilator``);
* ``verif.rtl_device.CocotbDevice``: the same RTL under cocotb (cocotbext-axi's
  AxiRam and AXI4-Lite master), for the testbenches;
* ``host.serial_device.SerialDevice``: a board's NPU over its UART bridge.
"""

from __future__ import annotations

import abc

import numpy as np

from firmware import isa
from firmware.bursts import DramLatency
from firmware.config import NPUConfig
from firmware.csrmodel import CSRModel, NPUSide, RunState
from firmware.golden import Machine
from firmware.regs import counter_names


class OutsideDRAM(ValueError):
    """A memory access beyond (or before) the device's DRAM: for the host, a model
    whose constants and tensors need more memory than the device has."""


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


class PostedWrites(Device):
    """A transport whose CSR writes are posted, for links where a round trip is dear.

    :meth:`write_reg` queues the write; the queue goes out in order, as one batch
    (:meth:`_write_many`), before the next read, memory access or interrupt wait
    (subclasses call :meth:`_flush` first in each) and every :data:`POSTED_WRITES`
    writes. The NPU sees the same writes in the same order, relative to every read,
    as with one blocking write at a time.
    """

    POSTED_WRITES = 256

    def __init__(self):
        self._posted: list[tuple[int, int]] = []

    @abc.abstractmethod
    def _write_many(self, ops: list[tuple[int, int]]) -> None:
        """Issue ``[(addr, value), ...]`` in order, each answered before returning."""

    def _flush(self) -> None:
        if self._posted:
            ops, self._posted = self._posted, []
            self._write_many(ops)

    def write_reg(self, addr: int, value: int) -> None:
        self._posted.append((addr, value & 0xFFFF_FFFF))
        if len(self._posted) >= self.POSTED_WRITES:
            self._flush()


RESP_SLVERR, RESP_DECERR = 2, 3


def fault_windows(windows) -> list[tuple[int, int, int]]:
    """Bus-fault windows ``[(lo, hi, resp), ...]`` checked for a simulated DRAM:
    byte range ``[lo, hi)`` answering :data:`RESP_SLVERR` or :data:`RESP_DECERR`."""
    windows = [tuple(int(x) for x in w) for w in windows]
    for lo, hi, resp in windows:
        if not 0 <= lo < hi or resp not in (RESP_SLVERR, RESP_DECERR):
            raise ValueError(f"bad fault window {(lo, hi, resp)!r}")
    return windows


class GoldenDevice(Device):
    """The golden model behind the NPU's CSR map.

    Register reads and writes go through :class:`firmware.csrmodel.CSRModel`, the
    model the RTL's CSR block is checked against, so refusals of writes aimed at the
    active bank, the IRQ bits and the counter latch behave as on the hardware. The
    golden model has no clock of its own: writing START begins a run, and the run's
    time passes only while the host waits for it. ``wait_irq(n)`` advances the run by
    up to ``n`` cycles (its cycles as the cost model counts them) and answers False if
    it has not finished by then, exactly as the RTL would: the run stays in progress
    (STATUS.busy) and a later wait continues it, so an endless program costs a wait its
    timeout, not the golden model's instruction limit. While a run is in progress a
    swap is pending until it ends, and a START ends it first (the RTL queues it);
    other accesses see the run where it stands. An address outside the map raises
    ``ValueError``; a write the build cannot hold (an instruction past the bank, a
    partition it lacks) answers SLVERR on the bus, which this transport, like the
    others, does not report.

    ``dram_latency`` models a slow memory's extra cycles (a
    :class:`~firmware.bursts.DramLatency`; none by default), as the simulated
    devices' ``dram_latency`` does.
    """

    def __init__(self, config: NPUConfig | None = None, dram_bytes: int = 1 << 22,
                 dram_latency: DramLatency | None = None):
        self.config = config = config or NPUConfig()
        self.machine = Machine(config, dram_bytes=dram_bytes, dram_latency=dram_latency)
        self.dram_latency = self.machine.dram_latency
        self.side = _GoldenSide(self)
        self.csr = CSRModel(config, self.side)
        self._mapped = {r.addr for r in self.csr.map}

    def read_reg(self, addr: int) -> int:
        if addr not in self._mapped:
            raise ValueError(f"no CSR at {addr:#x}")
        return self.csr.read(addr)[0]

    def write_reg(self, addr: int, value: int) -> None:
        if addr not in self._mapped:
            raise ValueError(f"no CSR at {addr:#x}")
        self.csr.write(addr, value)

    # ---- memory and interrupt --------------------------------------------------------
    def read_mem(self, addr: int, size: int) -> bytes:
        self._check_mem(addr, size)
        return self.machine.dram[addr:addr + size].tobytes()

    def write_mem(self, addr: int, data: bytes) -> None:
        self._check_mem(addr, len(data))
        self.machine.dram[addr:addr + len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)

    def _check_mem(self, addr, size):
        if addr < 0 or size < 0 or addr + size > len(self.machine.dram):
            raise OutsideDRAM(f"DRAM [{addr:#x}, +{size}) outside {len(self.machine.dram)} bytes")

    def wait_irq(self, timeout_cycles: int) -> bool:
        """Advance a run in progress by up to ``timeout_cycles`` cycles; whether an
        enabled interrupt is then pending."""
        self.side.advance(max(0, int(timeout_cycles)))
        return bool(self.csr.irq)

    def set_bus_faults(self, windows) -> None:
        """Make DRAM ranges answer bus errors (a test hook, mirroring the RTL testbench).

        ``windows`` is ``[(lo, hi, resp), ...]``: byte range ``[lo, hi)`` and the AXI
        response code, which the golden model ignores (both codes are BUS_ERROR).
        ``[]`` clears them.
        """
        self.machine.bus_faults = [(int(lo), int(hi)) for lo, hi, _ in windows]


class _GoldenSide(NPUSide):
    """The golden model as the rest of the NPU behind a GoldenDevice's CSR block."""

    def __init__(self, device: GoldenDevice):
        self.device = device
        self.machine = device.machine
        self.counter_names = counter_names(device.config)
        self.last_error = (0, 0, 0)  # (code, pc, address) of the last run
        self.busy = False     # a run was started and has not raised its interrupt
        self.waited = 0       # cycles of the run in progress the host has waited through
        self.ended = None     # its RunResult once the machine finished it
        self.swap_pending = False

    def run_state(self) -> RunState:
        code, pc, addr = self.last_error
        return RunState(busy=int(self.busy), active_bank=self.machine.active_bank,
                        swap_pending=int(self.swap_pending), error=int(code != 0),
                        error_code=code, error_pc=pc, error_addr=addr & 0xFFFF_FFFF)

    def trace_count(self) -> int:
        return len(self.machine.trace)

    def trace_head(self, field: str) -> int:
        return getattr(self.machine.trace[0], field)

    def scalar(self, index: int) -> int:
        return self.machine.regs[index]

    def counter(self, index: int) -> int:
        name, c = self.counter_names[index], self.machine.counters
        for kind in ("tag_hits", "tag_misses"):
            if name.startswith(kind + "_p"):
                return c[kind][int(name[len(kind) + 2:])]
        return c[name]

    def pt_entry(self, bank: int, pt_set: int, partition: int) -> tuple[int, int]:
        return self.machine.ptables[bank][pt_set][partition]

    def commands(self, names: tuple[str, ...]) -> None:
        mc = self.machine
        if "swap" in names:  # lands at the run boundary: at once when idle
            if self.busy:
                self.swap_pending = True
            else:
                mc.swap()
        if "counter_reset" in names:
            mc.reset_counters()
        if "tag_invalidate" in names:
            mc.invalidate_tags()
        if "trace_clear" in names:
            mc.trace.clear()
        if "trace_pop" in names and mc.trace:
            mc.trace.popleft()
        if "start" in names:
            if self.busy:  # the RTL queues this START behind the run in progress
                self.advance(None)
            self._begin()

    def _begin(self) -> None:
        csr = self.device.csr
        self.dropped = self.machine.counters["trace_overflows"]
        self.machine.begin(args=[csr.rw[f"ARG{i}"] for i in range(isa.NUM_ARG_REGS)],
                           max_cycles=csr.rw["CYCLE_BUDGET"] or None)
        self.busy, self.waited, self.ended = True, 0, None

    def advance(self, cycles: int | None) -> None:
        """Let the run in progress take up to ``cycles`` more cycles (None: to its end);
        raise the interrupt if it ends within them."""
        if not self.busy:
            return
        until = None if cycles is None else self.waited + cycles
        if self.ended is None:
            self.ended = self.machine.advance(until)
        if self.ended is None or (until is not None and self.ended.cycles > until):
            self.waited = until
            return
        res, csr, mc = self.ended, self.device.csr, self.machine
        self.busy, self.ended = False, None
        self.last_error = (int(res.error), res.pc, res.error_addr)
        if self.swap_pending:
            self.swap_pending = False
            mc.swap()
        csr.pulse("run_done")
        if res.error:
            csr.pulse("run_error")
        if mc.counters["trace_overflows"] != self.dropped:
            csr.pulse("trace_overflow")

    def imem_write(self, bank: int, index: int, word: int) -> None:
        self.machine.imem[bank][index] = word

    def pt_write(self, bank: int, pt_set: int, partition: int, base: int, size: int) -> None:
        self.machine.ptables[bank][pt_set][partition] = (base, size)
