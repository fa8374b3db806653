"""What each register of the CSR map does: the one behavioural model of firmware/regs.py.

:class:`CSRModel` answers register reads and writes the way the RTL's CSR block
(hdl/csr.py) does, one bus transaction at a time: the golden device
(``host.device.GoldenDevice``) serves the host's register traffic with it, and the
CSR testbench (tests/cocotb_csr.py) uses it as the scoreboard of the RTL. What the
rest of the NPU shows the block, and what the block's writes make it do, goes
through an :class:`NPUSide`; the golden device puts the golden model there, the
testbench a record of the ports it drives and expects.

Behaviour follows the register's access mode, with named registers adding their
own rules:

* ``ro``: the value comes from :class:`NPUSide` or the build (ID, VERSION, CAPS,
  STATUS, ERROR*, TRACE_*, R*, CNT_*); writes are ignored.
* ``rw``: a stored word of the register's fields (all 32 bits when it has none),
  written through the byte strobes. BANK_VERSIONn can be refused; PT_BASE stages
  the base of the next PT_SIZE write and reads the selected entry's base; PT_SIZE
  commits the selected entry and reads its size.
* ``wo``: reads 0. IMEM_DATA_LO stages bits 31:0 of an instruction; IMEM_DATA_HI
  writes it and advances IMEM_ADDR.index.
* ``w1s``: reads 0; every strobed 1 is a command (a field's name, or the register's
  own name in lower case when it has no fields).
* ``w1c``: IRQ_STATUS, set by run events and refusals, cleared by strobed 1s.

A write aimed at a bank that is live or about to be (the active bank, or either
bank while a swap is pending) is refused: it answers OKAY, does nothing, and sets
the sticky IRQ_STATUS.refused (also STATUS.refused). An IMEM_DATA_HI write past the
bank, or a PT_SIZE write naming a set or partition the build lacks, answers SLVERR
and does nothing. Reading CNT_x_LO latches bits 63:32 of counter x; CNT_x_HI
returns the latch while the last LO read was of counter x, the live bits otherwise.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import NamedTuple

from .config import NPUConfig
from .isa import ISA_VERSION
from .regs import HW_VERSION, ID_MAGIC, TRACE_FIELDS, Access, Register, counter_names, registers

__all__ = ["CSRModel", "NPUSide", "RunState", "OKAY", "SLVERR"]

OKAY = 0
"""AXI response: the access was performed (or, for a refused bank write, ignored)."""
SLVERR = 2
"""AXI response: no register at that address, or a write the build cannot hold."""

M32 = 0xFFFF_FFFF
WORDS = 1 << 10
"""The block decodes byte-address bits 11:2: 1024 words, the 4 KiB window."""


class RunState(NamedTuple):
    """The run state the NPU shows in STATUS and ERROR* (CSRBlock's input ports)."""

    busy: int = 0
    active_bank: int = 0
    swap_pending: int = 0
    error: int = 0
    error_code: int = 0
    error_pc: int = 0
    error_addr: int = 0


class NPUSide(abc.ABC):
    """The rest of the NPU as the CSR block sees it: CSRBlock's ports, per transaction.

    The query methods are the block's inputs at the moment of a read or write; the
    action methods are its output pulses and write ports.
    """

    @abc.abstractmethod
    def run_state(self) -> RunState:
        """Return the run state now."""

    @abc.abstractmethod
    def trace_count(self) -> int:
        """Return the number of records in the trace FIFO."""

    @abc.abstractmethod
    def trace_head(self, field: str) -> int:
        """Return word ``field`` (a name in ``TRACE_FIELDS``) of the oldest trace record."""

    @abc.abstractmethod
    def scalar(self, index: int) -> int:
        """Return scalar register ``r<index>``."""

    @abc.abstractmethod
    def counter(self, index: int) -> int:
        """Return the 64-bit counter ``counter_names(config)[index]``."""

    @abc.abstractmethod
    def pt_entry(self, bank: int, pt_set: int, partition: int) -> tuple[int, int]:
        """Return ``(base, size)`` of a partition-table entry as stored."""

    @abc.abstractmethod
    def commands(self, names: tuple[str, ...]) -> None:
        """Perform the commands one W1S write raised together, in register-field order.

        The names are CTRL's field names and ``trace_pop``.
        """

    @abc.abstractmethod
    def imem_write(self, bank: int, index: int, word: int) -> None:
        """Store a 64-bit instruction word."""

    @abc.abstractmethod
    def pt_write(self, bank: int, pt_set: int, partition: int, base: int, size: int) -> None:
        """Store a partition-table entry."""


def state_mask(reg: Register) -> int:
    """Return the bits of ``reg`` that hold state: its fields, or all 32 without fields."""
    if not reg.fields:
        return M32
    return sum(((1 << f.bits) - 1) << f.lo for f in reg.fields)


_LANES = tuple(sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1) for strb in range(16))
"""The 32-bit mask of the byte lanes each 4-bit strobe selects."""


class CSRModel:
    """The CSR block of one build, at the level of bus transactions.

    Parameters
    ----------
    config : NPUConfig
        The build: CAPS values, counter list, table and memory bounds.
    npu : NPUSide
        What the registers read from and what writes act on.

    Raises
    ------
    ValueError
        If the map of ``config`` has a read-only or write-only register this model
        has no rule for.

    Attributes
    ----------
    rw : dict[str, int]
        The stored read/write registers by name (CYCLE_BUDGET, ARGn and
        BANK_VERSIONn are also the block's output ports).
    irq_status : int
        The IRQ_STATUS word.
    trace_overflow : int
        The sticky STATUS.trace_overflow bit.
    """

    def __init__(self, config: NPUConfig, npu: NPUSide):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.npu = npu
        self.map = registers(config)
        self.counter_names = counter_names(config)
        self._regs = {r.name: r for r in self.map}
        self._fields = {(r.name, f.name): (f.lo, (1 << f.bits) - 1)
                        for r in self.map for f in r.fields}
        # PT_BASE and PT_SIZE are windows onto the table, not stored words
        self.rw = {r.name: 0 for r in self.map
                   if r.access == Access.RW and r.name not in ("PT_BASE", "PT_SIZE")}
        self.irq_status = 0
        self.trace_overflow = 0
        self.imem_lo = 0
        self.pt_base = 0
        self._latch: tuple[int, int] | None = None  # (counter index, bits 63:32)
        self._readers = self._read_rules()
        self._writers = self._write_rules()
        missing = [r.name for r in self.map
                   if (r.access == Access.RO and r.name not in self._readers)
                   or (r.access == Access.WO and r.name not in self._writers)]
        if missing:
            raise ValueError(f"CSRModel has no behaviour for registers {missing}")
        # by word address; a read-only register's write is ignored
        self._read_at = {r.addr >> 2: self._readers[r.name] for r in self.map}
        self._write_at = {r.addr >> 2: self._writers.get(r.name, _ignore) for r in self.map}

    # ---- the bus ---------------------------------------------------------------------
    def read(self, addr: int) -> tuple[int, int]:
        """Read the register at byte address ``addr``: ``(value, response)``."""
        rule = self._read_at.get((addr >> 2) % WORDS)
        if rule is None:
            return 0, SLVERR
        return rule() & M32, OKAY

    def write(self, addr: int, data: int, strb: int = 0xF) -> int:
        """Write ``data`` to the byte lanes ``strb`` of the register at ``addr``; the response."""
        rule = self._write_at.get((addr >> 2) % WORDS)
        if rule is None:
            return SLVERR
        return rule(data & M32, _LANES[strb & 0xF])

    def pulse(self, name: str) -> None:
        """Take an input pulse: ``run_done``, ``run_error`` or ``trace_overflow``."""
        if name == "trace_overflow":
            self.trace_overflow = 1
        elif name in ("run_done", "run_error"):
            self.irq_status |= self.put("IRQ_STATUS", **{name[4:]: 1})
        else:
            raise ValueError(f"no input pulse {name!r}")

    @property
    def irq(self) -> int:
        """The interrupt line: an IRQ_STATUS cause whose IRQ_ENABLE bit is set."""
        enable = self.rw["IRQ_ENABLE"]
        return int(any(self.get("IRQ_ENABLE", f.name, enable)
                       and self.get("IRQ_STATUS", f.name, self.irq_status)
                       for f in self._regs["IRQ_ENABLE"].fields))

    # ---- fields ------------------------------------------------------------------------
    def get(self, register: str, field: str, word: int) -> int:
        """Return field ``field`` of ``register`` read out of ``word``."""
        lo, mask = self._field(register, field)
        return (word >> lo) & mask

    def put(self, register: str, **values: int) -> int:
        """Return the word of ``register`` with the named fields set (others zero)."""
        word = 0
        for name, value in values.items():
            lo, mask = self._field(register, name)
            word |= (int(value) & mask) << lo
        return word

    def _field(self, register, name):
        try:
            return self._fields[register, name]
        except KeyError:
            raise KeyError(f"{register} has no field {name!r}") from None

    # ---- reads ----------------------------------------------------------------------------
    def _read_rules(self) -> dict[str, Callable[[], int]]:
        npu = self.npu
        rules: dict[str, Callable[[], int]] = {
            "ID": lambda: ID_MAGIC,
            "VERSION": lambda: self.put("VERSION", hw=HW_VERSION, isa=ISA_VERSION),
            "STATUS": self._status,
            "ERROR": lambda: npu.run_state().error_code,
            "ERROR_PC": lambda: npu.run_state().error_pc,
            "ERROR_ADDR": lambda: npu.run_state().error_addr,
            "IRQ_STATUS": lambda: self.irq_status,
            "PT_BASE": lambda: npu.pt_entry(*self._pt_selected())[0],
            "PT_SIZE": lambda: npu.pt_entry(*self._pt_selected())[1],
            "TRACE_COUNT": npu.trace_count,
        }
        for f in dataclasses.fields(NPUConfig):
            value = getattr(self.config, f.name)
            rules[f"CAPS_{f.name.upper()}"] = lambda value=value: value
        for field in TRACE_FIELDS:
            rules[f"TRACE_{field.upper()}"] = lambda field=field: (
                npu.trace_head(field) if npu.trace_count() else 0)
        for i in range(16):
            rules[f"R{i}"] = lambda i=i: npu.scalar(i)
        for i, name in enumerate(self.counter_names):
            rules[f"CNT_{name.upper()}_LO"] = lambda i=i: self._counter_lo(i)
            rules[f"CNT_{name.upper()}_HI"] = lambda i=i: self._counter_hi(i)
        for r in self.map:
            if r.access == Access.RW and r.name not in rules:
                rules[r.name] = lambda name=r.name: self.rw[name]
            elif r.access in (Access.WO, Access.W1S):
                rules[r.name] = lambda: 0
        return rules

    def _status(self) -> int:
        s = self.npu.run_state()
        return self.put("STATUS", busy=s.busy, active_bank=s.active_bank,
                        swap_pending=s.swap_pending, error=s.error,
                        refused=self.get("IRQ_STATUS", "refused", self.irq_status),
                        trace_overflow=self.trace_overflow)

    def _counter_lo(self, i: int) -> int:
        value = self.npu.counter(i)
        self._latch = (i, (value >> 32) & M32)
        return value

    def _counter_hi(self, i: int) -> int:
        if self._latch is not None and self._latch[0] == i:
            return self._latch[1]
        return self.npu.counter(i) >> 32

    # ---- writes ---------------------------------------------------------------------------
    def _write_rules(self) -> dict[str, Callable[[int, int], int]]:
        rules: dict[str, Callable[[int, int], int]] = {
            "BANK_VERSION0": lambda data, mask: self._write_bank_version(0, data, mask),
            "BANK_VERSION1": lambda data, mask: self._write_bank_version(1, data, mask),
            "PT_BASE": self._write_pt_base,
            "PT_SIZE": self._write_pt_size,
            "IMEM_DATA_LO": self._write_imem_lo,
            "IMEM_DATA_HI": self._write_imem_hi,
        }
        for r in self.map:
            if r.name in rules:
                continue
            if r.access == Access.RW:
                rules[r.name] = lambda data, mask, r=r: self._store(r, data, mask)
            elif r.access == Access.W1S:
                rules[r.name] = lambda data, mask, r=r: self._command(r, data & mask)
            elif r.access == Access.W1C:
                rules[r.name] = lambda data, mask: self._clear_irq(data & mask)
        return rules

    def _store(self, reg: Register, data: int, mask: int) -> int:
        old = self.rw[reg.name]
        self.rw[reg.name] = ((old & ~mask) | (data & mask)) & state_mask(reg)
        return OKAY

    def _command(self, reg: Register, ones: int) -> int:
        if reg.fields:
            names = tuple(f.name for f in reg.fields if (ones >> f.lo) & 1)
        else:
            names = (reg.name.lower(),) if ones & 1 else ()
        if "counter_reset" in names or "trace_clear" in names:
            self.trace_overflow = 0
        if names:
            self.npu.commands(names)
        return OKAY

    def _clear_irq(self, ones: int) -> int:
        self.irq_status &= ~ones
        return OKAY

    def _live(self, bank: int) -> bool:
        s = self.npu.run_state()
        return bank == s.active_bank or bool(s.swap_pending)

    def _refuse(self) -> int:
        self.irq_status |= self.put("IRQ_STATUS", refused=1)
        return OKAY

    def _write_bank_version(self, bank: int, data: int, mask: int) -> int:
        if self._live(bank):
            return self._refuse()
        return self._store(self._regs[f"BANK_VERSION{bank}"], data, mask)

    def _write_imem_lo(self, data: int, mask: int) -> int:
        self.imem_lo = (self.imem_lo & ~mask) | (data & mask)
        return OKAY

    def _write_imem_hi(self, data: int, mask: int) -> int:
        addr = self.rw["IMEM_ADDR"]
        bank, index = self.get("IMEM_ADDR", "bank", addr), self.get("IMEM_ADDR", "index", addr)
        if self._live(bank):
            return self._refuse()
        if index >= self.config.imem_depth:
            return SLVERR
        self.npu.imem_write(bank, index, (data & mask) << 32 | self.imem_lo)
        self.rw["IMEM_ADDR"] = self.put("IMEM_ADDR", bank=bank, index=index + 1)
        return OKAY

    def _pt_selected(self) -> tuple[int, int, int]:
        sel = self.rw["PT_SELECT"]
        return (self.get("PT_SELECT", "bank", sel), self.get("PT_SELECT", "set", sel),
                self.get("PT_SELECT", "partition", sel))

    def _write_pt_base(self, data: int, mask: int) -> int:
        self.pt_base = (self.pt_base & ~mask) | (data & mask)
        return OKAY

    def _write_pt_size(self, data: int, mask: int) -> int:
        bank, pt_set, part = entry = self._pt_selected()
        if self._live(bank):
            return self._refuse()
        if pt_set >= self.config.pt_sets or part >= self.config.partitions:
            return SLVERR
        size = (self.npu.pt_entry(*entry)[1] & ~mask) | (data & mask)
        self.npu.pt_write(bank, pt_set, part, self.pt_base, size)
        return OKAY


def _ignore(data: int, mask: int) -> int:
    return OKAY
