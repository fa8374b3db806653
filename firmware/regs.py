"""The NPU's CSR map (AXI4-Lite, 32-bit registers): the one definition.

The RTL's CSR block, the CSR model that the golden device and the CSR testbench
share (firmware/csrmodel.py), the host driver's register constants and
docs/registers.md all come from `registers()` in firmware/regs.py (`make docs`
writes the doc).
Counters are 64 bits wide and appear as `_LO`/`_HI` pairs; reading `_LO`
latches `_HI` so a pair reads atomically.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from .config import NPUConfig

ID_MAGIC = 0x4E50_5531  # "NPU1"
HW_VERSION = 1


class Access(enum.Enum):
    RO = "ro"  # read only
    RW = "rw"  # read/write
    WO = "wo"  # write only (reads return 0)
    W1C = "w1c"  # write 1 to clear
    W1S = "w1s"  # write 1 to trigger (self-clearing)


@dataclass(frozen=True)
class BitField:
    name: str
    lo: int
    bits: int
    doc: str


@dataclass(frozen=True)
class Register:
    name: str
    addr: int
    access: Access
    doc: str
    fields: tuple[BitField, ...] = ()


COUNTERS: tuple[tuple[str, str], ...] = (
    ("cycles", "clock cycles while running"),
    ("instructions", "instructions executed (dispatched)"),
    ("macs", "useful multiply-accumulates (m * k * n per gemm)"),
    ("dram_read_bytes", "bytes the DMA read from DRAM"),
    ("dram_write_bytes", "bytes the DMA wrote to DRAM"),
    ("regions", "region.begin marks executed"),
    ("misspeculations", "misspec instructions executed"),
    ("runs", "runs started"),
    ("errors", "runs stopped by an error"),
    ("swaps", "bank swaps performed"),
    ("trace_overflows", "region records dropped because the trace FIFO was full"),
    ("busy_load", "cycles the load queue was executing"),
    ("busy_compute", "cycles the compute queue was executing"),
    ("busy_store", "cycles the store queue was executing"),
    ("stall_cycles", "cycles the sequencer could not dispatch"),
)

_CAUSES: tuple[tuple[str, str], ...] = (
    ("busy_array", "cycles the GEMM or depthwise engine held work"),
    ("busy_vector", "cycles the vector unit held work"),
    ("stall_in_seq", "sequencer stall cycles waiting for a register or a drain"),
    ("stall_out_seq", "sequencer stall cycles waiting for room in a queue"),
    ("stall_in_load", "cycles the load DMA was busy and moved no data (DRAM latency)"),
    ("stall_out_load", "cycles the load queue's head waited for compute's token"),
    ("stall_in_array", "cycles an array command waited for the load queue's token"),
    ("stall_out_array", "cycles an array command waited for the store queue's token"),
    ("stall_in_vector", "cycles a vector command waited for the load queue's token"),
    ("stall_out_vector", "cycles a vector command waited for the store queue's token"),
    ("stall_in_store", "cycles the store queue's head waited for compute's token"),
    ("stall_out_store", "cycles the store DMA was busy and moved no data (DRAM acceptance)"),
    ("sp_conflicts", "scratchpad port-cycles refused because another port held the bank"),
    ("dram_read_bursts", "AXI read bursts issued (AR handshakes)"),
    ("dram_write_bursts", "AXI write bursts issued (AW handshakes)"),
)
COUNTERS += _CAUSES
"""Global counters, in CSR order; per-partition tag counters follow them."""

CAUSE_COUNTERS = tuple(name for name, _ in _CAUSES)
"""The counters by cause (busy and stall cycles per engine, scratchpad bank conflicts,
DRAM bursts): the golden model counts them as the RTL does on every run whose cycles
it counts exactly (``RunResult.cycles_exact``)."""


def counter_names(config: NPUConfig) -> list[str]:
    """Every counter in CSR order: the globals, then tag_hits_p*, then tag_misses_p*."""
    names = [n for n, _ in COUNTERS]
    names += [f"tag_hits_p{p}" for p in range(config.partitions)]
    names += [f"tag_misses_p{p}" for p in range(config.partitions)]
    return names


TRACE_FIELDS = (
    "region", "start", "end", "instructions", "macs", "dram_read_bytes",
    "dram_write_bytes", "tag_hits", "tag_misses", "stall_cycles",
    "busy_load", "busy_store", "busy_array", "busy_vector", "sp_conflicts",
)
"""Words of one region-trace record, in CSR order (firmware.golden.TraceRecord)."""

CAPS_BASE = 0x010
CTRL_BASE = 0x080
ARG_BASE = 0x0C0
IMEM_BASE = 0x100
PT_BASE = 0x120
TRACE_BASE = 0x140
REGS_BASE = 0x200
COUNTER_BASE = 0x400


def _caps() -> list[Register]:
    return [
        Register(f"CAPS_{f.name.upper()}", CAPS_BASE + 4 * i, Access.RO,
                 f"NPUConfig.{f.name} of this build")
        for i, f in enumerate(dataclasses.fields(NPUConfig))
    ]


def registers(config: NPUConfig | None = None) -> tuple[Register, ...]:
    """The full register list for a configuration (counters depend on ``partitions``)."""
    config = config or NPUConfig()
    regs = [
        Register("ID", 0x000, Access.RO, f"magic {ID_MAGIC:#010x} ('NPU1')"),
        Register("VERSION", 0x004, Access.RO, "ISA and hardware version",
                 (BitField("hw", 0, 16, "hardware version"),
                  BitField("isa", 16, 16, "ISA version (firmware.isa.ISA_VERSION)"))),
        *_caps(),
        Register("CTRL", CTRL_BASE, Access.W1S, "commands (write 1 to trigger)",
                 (BitField("start", 0, 1, "start a run on the active bank"),
                  BitField("swap", 1, 1, "swap banks at the next run boundary"),
                  BitField("counter_reset", 2, 1, "clear every counter"),
                  BitField("tag_invalidate", 3, 1, "invalidate all tile tags"),
                  BitField("trace_clear", 4, 1, "empty the trace FIFO"))),
        Register("STATUS", CTRL_BASE + 0x04, Access.RO, "run state",
                 (BitField("busy", 0, 1, "a run is in progress"),
                  BitField("active_bank", 1, 1, "bank the next/current run executes"),
                  BitField("swap_pending", 2, 1, "a swap waits for the run boundary"),
                  BitField("error", 3, 1, "the last run stopped with an error"),
                  BitField("refused", 4, 1, "a write aimed at the active bank was refused "
                           "(sticky; cleared by IRQ_STATUS.refused)"),
                  BitField("trace_overflow", 5, 1, "a trace record was dropped (sticky)"))),
        Register("ERROR", CTRL_BASE + 0x08, Access.RO, "error code of the last run "
                 "(firmware.isa.ErrorCode)"),
        Register("ERROR_PC", CTRL_BASE + 0x0C, Access.RO, "pc of the failing instruction"),
        Register("ERROR_ADDR", CTRL_BASE + 0x10, Access.RO,
                 "address involved (DRAM row of a bus error, offset of a bounds error)"),
        Register("IRQ_ENABLE", CTRL_BASE + 0x14, Access.RW, "interrupt enables",
                 (BitField("done", 0, 1, "run finished"),
                  BitField("error", 1, 1, "run stopped with an error"))),
        Register("IRQ_STATUS", CTRL_BASE + 0x18, Access.W1C, "interrupt causes",
                 (BitField("done", 0, 1, "run finished"),
                  BitField("error", 1, 1, "run stopped with an error"),
                  BitField("refused", 2, 1, "refused write (clears STATUS.refused)"))),
        Register("CYCLE_BUDGET", CTRL_BASE + 0x1C, Access.RW,
                 "cycles a run may take before it stops with TIMEOUT (0: unlimited)"),
        Register("BANK_VERSION0", CTRL_BASE + 0x20, Access.RW,
                 "host-chosen version tag of bank 0 (refused while bank 0 is active)"),
        Register("BANK_VERSION1", CTRL_BASE + 0x24, Access.RW,
                 "host-chosen version tag of bank 1 (refused while bank 1 is active)"),
        *[Register(f"ARG{i}", ARG_BASE + 4 * i, Access.RW, f"initial value of r{i + 1}")
          for i in range(7)],
        Register("IMEM_ADDR", IMEM_BASE, Access.RW, "instruction write pointer",
                 (BitField("index", 0, 16, "instruction index"),
                  BitField("bank", 31, 1, "target bank; the active bank is refused"))),
        Register("IMEM_DATA_LO", IMEM_BASE + 0x04, Access.WO, "instruction bits 31:0"),
        Register("IMEM_DATA_HI", IMEM_BASE + 0x08, Access.WO,
                 "instruction bits 63:32; writing it stores the word and increments index"),
        Register("PT_SELECT", PT_BASE, Access.RW, "partition-table entry to write",
                 (BitField("partition", 0, 3, "partition p"),
                  BitField("set", 8, 2, "table set"),
                  BitField("bank", 31, 1, "bank; the active bank is refused"))),
        Register("PT_BASE", PT_BASE + 0x04, Access.RW, "base byte address of the entry"),
        Register("PT_SIZE", PT_BASE + 0x08, Access.RW,
                 "size in bytes; writing it commits base and size"),
        Register("TRACE_COUNT", TRACE_BASE, Access.RO, "records in the trace FIFO"),
        Register("TRACE_POP", TRACE_BASE + 0x04, Access.W1S, "write 1: drop the head record"),
        *[Register(f"TRACE_{n.upper()}", TRACE_BASE + 0x10 + 4 * i, Access.RO,
                   f"head record: {n} (low 32 bits)")
          for i, n in enumerate(TRACE_FIELDS)],
        *[Register(f"R{i}", REGS_BASE + 4 * i, Access.RO, f"scalar register r{i} "
                   "(valid when not busy)") for i in range(16)],
    ]
    for i, name in enumerate(counter_names(config)):
        regs.append(Register(f"CNT_{name.upper()}_LO", COUNTER_BASE + 8 * i, Access.RO,
                             f"counter {name}, bits 31:0 (latches the high half)"))
        regs.append(Register(f"CNT_{name.upper()}_HI", COUNTER_BASE + 8 * i + 4, Access.RO,
                             f"counter {name}, bits 63:32 (as latched)"))
    _check(regs)
    return tuple(regs)


def _check(regs):
    seen = {}
    for r in regs:
        if r.addr % 4 or r.addr in seen:
            raise AssertionError(f"{r.name} at {r.addr:#x} collides with {seen.get(r.addr)}")
        seen[r.addr] = r.name
    assert max(seen) < 0x1000, "the CSR window is 4 KiB"


def addresses(config: NPUConfig | None = None) -> dict[str, int]:
    """Register name -> byte address (what the host driver uses)."""
    return {r.name: r.addr for r in registers(config)}


def field_mask(register: str, field: str) -> int:
    """Mask of ``field`` in ``register`` (e.g. ``field_mask("STATUS", "busy")``).

    Host code takes bit positions from here, never from hand-copied constants.
    """
    for f in _fields(register):
        if f.name == field:
            return ((1 << f.bits) - 1) << f.lo
    raise KeyError(f"{register} has no field {field!r}")


def _fields(register: str) -> tuple[BitField, ...]:
    for r in registers():
        if r.name == register:
            return r.fields
    raise KeyError(f"no register {register!r}")


def pack_fields(register: str, **values: int) -> int:
    """The register value with the named fields set (others zero)."""
    fields = {f.name: f for f in _fields(register)}
    word = 0
    for name, v in values.items():
        if name not in fields:
            raise KeyError(f"{register} has no field {name!r}")
        f = fields[name]
        if not 0 <= v < 1 << f.bits:
            raise ValueError(f"{register}.{name} = {v} does not fit {f.bits} bits")
        word |= v << f.lo
    return word


def unpack_fields(register: str, value: int) -> dict[str, int]:
    """Every field of ``register`` read out of ``value``."""
    return {f.name: (value >> f.lo) & ((1 << f.bits) - 1) for f in _fields(register)}


def caps_to_config(values: dict[str, int]) -> NPUConfig:
    """Rebuild the NPUConfig from CAPS_* register values read off a device."""
    kwargs = {f.name: values[f"CAPS_{f.name.upper()}"] for f in dataclasses.fields(NPUConfig)}
    return NPUConfig(**kwargs)
