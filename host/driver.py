"""The NPU driver: one code path for every backend, through a :class:`Device`.

It learns the hardware from the device's own CAPS registers, writes programs and
partition tables into the shadow bank, swaps, starts runs, waits for them, and reads
results, registers, counters and the region trace. It never reaches around the
register map.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from firmware import isa
from firmware.config import NPUConfig
from firmware.golden import TraceRecord
from firmware.isa import ErrorCode
from firmware.regs import (
    ID_MAGIC,
    TRACE_FIELDS,
    addresses,
    caps_to_config,
    counter_names,
    field_mask,
    pack_fields,
)

from .device import Device, OutsideDRAM
from .limits import LimitExceeded, RunLimits, wait_irq_within

CTRL_START = field_mask("CTRL", "start")
CTRL_SWAP = field_mask("CTRL", "swap")
CTRL_COUNTER_RESET = field_mask("CTRL", "counter_reset")
CTRL_TAG_INVALIDATE = field_mask("CTRL", "tag_invalidate")
CTRL_TRACE_CLEAR = field_mask("CTRL", "trace_clear")
STATUS_BUSY = field_mask("STATUS", "busy")
STATUS_BANK = field_mask("STATUS", "active_bank")
STATUS_SWAP_PENDING = field_mask("STATUS", "swap_pending")
STATUS_ERROR = field_mask("STATUS", "error")
STATUS_REFUSED = field_mask("STATUS", "refused")
STATUS_TRACE_OVERFLOW = field_mask("STATUS", "trace_overflow")
IRQ_DONE = field_mask("IRQ_STATUS", "done")
IRQ_ERROR = field_mask("IRQ_STATUS", "error")
IRQ_REFUSED = field_mask("IRQ_STATUS", "refused")


class DeviceError(RuntimeError):
    """The device did not behave as the register map promises."""


@dataclass(frozen=True)
class RunStatus:
    """How a run ended, as the NPU reports it."""

    error: ErrorCode
    pc: int
    addr: int

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE

    def check(self) -> RunStatus:
        if not self.ok:
            raise DeviceError(f"NPU error {self.error.name} at pc {self.pc} "
                               f"(address {self.addr:#x})")
        return self


class NPUDriver:
    """Drive one NPU through a :class:`Device`.

    Parameters
    ----------
    device : Device
        The transport. The driver reads CAPS to learn the configuration.
    """

    def __init__(self, device: Device):
        self.device = device
        base = addresses(NPUConfig())
        magic = device.read_reg(base["ID"])
        if magic != ID_MAGIC:
            raise DeviceError(f"ID register reads {magic:#010x}, expected {ID_MAGIC:#010x}")
        caps = {n: device.read_reg(a) for n, a in base.items() if n.startswith("CAPS_")}
        self.config: NPUConfig = caps_to_config(caps)
        # What a Session bounds each run by (None figures: derived from its program).
        self.limits = RunLimits()
        # What this driver wrote into each instruction bank (None: unknown), and the
        # instruction words written so far (the cost of program changes).
        self._imem: list[list[int] | None] = [None, None]
        self.imem_words_written = 0
        self.imem_words_whole = 0  # what writing every program whole would have cost
        self.reg_writes = 0  # CSR writes so far (what the host port carries)
        self._tables: dict[tuple[int, int], list] = {}  # (bank, set) -> table written
        self.addr = addresses(self.config)
        self._counters = counter_names(self.config)
        self.write("IRQ_ENABLE", field_mask("IRQ_ENABLE", "done")
                   | field_mask("IRQ_ENABLE", "error"))

    # ---- registers --------------------------------------------------------------------
    def read(self, name: str) -> int:
        return self.device.read_reg(self.addr[name])

    def write(self, name: str, value: int) -> None:
        self.reg_writes += 1
        self.device.write_reg(self.addr[name], value & 0xFFFF_FFFF)

    def status(self) -> int:
        return self.read("STATUS")

    @property
    def active_bank(self) -> int:
        return int(bool(self.status() & STATUS_BANK))

    @property
    def shadow_bank(self) -> int:
        return 1 - self.active_bank

    # ---- programs, tables, swaps ----------------------------------------------------------
    def write_program(self, words, version: int | None = None, *,
                      changed_only: bool = False) -> int:
        """Write a program (words or an ``asm.Program``) into the shadow bank.

        A zero word follows the program (when it fits), so running off its end is an
        illegal instruction, as in the golden model. ``changed_only``: write only
        the runs of words that differ from what this driver last wrote into that
        bank (all of them when it does not know: the first write, or after a
        refused one); a hot swap between plans of one model then rewrites only the
        units that changed or moved. Returns the bank written. Raises
        ``ValueError`` when the program does not fit, ``DeviceError`` when the
        device refused the write.
        """
        words = list(getattr(words, "words", words))
        depth = self.config.imem_depth
        if len(words) > depth:
            raise ValueError(f"program of {len(words)} instructions exceeds the "
                             f"{depth}-instruction bank")
        if len(words) < depth:
            words = words + [0]
        bank = self.shadow_bank
        self.imem_words_whole += len(words)
        held = self._imem[bank] if changed_only else None
        self._imem[bank] = None  # unknown until the write is through
        for start, end in _changed_runs(held, words):
            self.write("IMEM_ADDR", pack_fields("IMEM_ADDR", index=start, bank=bank))
            for w in words[start:end]:
                self.write("IMEM_DATA_LO", w & 0xFFFF_FFFF)
                self.write("IMEM_DATA_HI", w >> 32)
            self.imem_words_written += end - start
        if version is not None:
            self.write(f"BANK_VERSION{bank}", version)
        self._check_not_refused("program")
        self._imem[bank] = words if held is None else words + held[len(words):]
        return bank

    def forget_programs(self) -> None:
        """Forget what the banks hold (the next ``changed_only`` write is whole): for
        whoever writes the instruction memory by other means, or resets the NPU."""
        self._imem = [None, None]
        self._tables.clear()

    def set_partitions(self, table, pt_set: int = 0, *, changed_only: bool = False) -> None:
        """Write one partition table ``[(base, size), ...]`` of the shadow bank.

        Unlisted partitions are disabled (size 0). ``changed_only``: write nothing
        when this driver last wrote the same table there.
        """
        table = [(int(b), int(s)) for b, s in table]
        if len(table) > self.config.partitions:
            raise ValueError(f"{len(table)} partitions given, the NPU has "
                             f"{self.config.partitions}")
        if not 0 <= pt_set < self.config.pt_sets:
            raise ValueError(f"pt_set={pt_set}: the NPU has {self.config.pt_sets} sets")
        bank = self.shadow_bank
        table += [(0, 0)] * (self.config.partitions - len(table))
        if changed_only and self._tables.get((bank, pt_set)) == table:
            return
        self._tables.pop((bank, pt_set), None)  # unknown until the write is through
        for p, (base, size) in enumerate(table):
            self.write("PT_SELECT", pack_fields("PT_SELECT", partition=p, set=pt_set, bank=bank))
            self.write("PT_BASE", base)
            self.write("PT_SIZE", size)
        self._check_not_refused("partition table")
        self._tables[(bank, pt_set)] = table

    def _check_not_refused(self, what: str):
        if self.status() & STATUS_REFUSED:
            self.write("IRQ_STATUS", IRQ_REFUSED)
            raise DeviceError(f"the NPU refused the {what} write (aimed at the active bank)")

    def bank_version(self, bank: int) -> int:
        return self.read(f"BANK_VERSION{bank}")

    def swap(self, wait: bool = True) -> None:
        """Request a swap; it lands at the next run boundary (at once when idle)."""
        self.write("CTRL", CTRL_SWAP)
        if wait:
            self._wait_status_clear(STATUS_SWAP_PENDING, "swap")

    def _wait_status_clear(self, bit: int, what: str, polls: int = 100_000) -> None:
        for _ in range(polls):
            if not self.status() & bit:
                return
        raise DeviceError(f"{what} did not complete")

    def load(self, program, partitions, version: int | None = None, pt_sets=None) -> None:
        """Program + partition table(s) into the shadow bank, then swap them in."""
        self.write_program(program, version)
        self.set_partitions(partitions)
        for s, table in enumerate(pt_sets or (), start=1):
            self.set_partitions(table, pt_set=s)
        self.swap()

    # ---- runs ------------------------------------------------------------------------------
    def start(self, args=()) -> None:
        """Set ARG0.. and start a run (queued if one is in progress)."""
        if len(args) > isa.NUM_ARG_REGS:
            raise ValueError(f"{len(args)} args given, at most {isa.NUM_ARG_REGS}")
        for i, a in enumerate(args):
            self.write(f"ARG{i}", int(a))
        self.write("CTRL", CTRL_START)

    def wait(self, timeout_cycles: int | None = 50_000_000,
             timeout_s: float | None = None) -> RunStatus:
        """Wait for the run to finish (interrupt), acknowledge it, return its status.

        Raises ``DeviceError`` after ``timeout_cycles`` NPU cycles and
        :class:`~host.limits.LimitExceeded` after ``timeout_s`` wall-clock seconds
        without the interrupt (None or 0: no such limit); the run is then still in
        progress (its CYCLE_BUDGET, when set, stops it on the device).
        """
        ran_out = wait_irq_within(self.device, timeout_cycles or None, timeout_s)
        if ran_out == "cycles":
            raise DeviceError(f"no interrupt within {timeout_cycles} cycles")
        if ran_out == "seconds":
            raise LimitExceeded(f"the run did not end within its timeout of {timeout_s:g} s "
                                "(wall clock)", option="--timeout")
        self.write("IRQ_STATUS", IRQ_DONE | IRQ_ERROR)
        return self.last_status()

    def last_status(self) -> RunStatus:
        return RunStatus(ErrorCode(self.read("ERROR")), self.read("ERROR_PC"),
                         self.read("ERROR_ADDR"))

    def run(self, args=(), cycle_budget: int = 0) -> RunStatus:
        """Start one run and wait for it."""
        self.write("CYCLE_BUDGET", cycle_budget)
        self.start(args)
        return self.wait()

    # ---- state --------------------------------------------------------------------------------
    def regs(self) -> list[int]:
        return [self.read(f"R{i}") for i in range(isa.NUM_REGS)]

    def counters(self) -> dict:
        """Every counter, with tag hits/misses as per-partition lists (golden layout)."""
        out = {}
        for name in self._counters:
            lo = self.read(f"CNT_{name.upper()}_LO")
            hi = self.read(f"CNT_{name.upper()}_HI")
            out[name] = (hi << 32) | lo
        parts = self.config.partitions
        for kind in ("tag_hits", "tag_misses"):
            out[kind] = [out.pop(f"{kind}_p{p}") for p in range(parts)]
        return out

    def reset_counters(self) -> None:
        self.write("CTRL", CTRL_COUNTER_RESET)

    def invalidate_tags(self) -> None:
        self.write("CTRL", CTRL_TAG_INVALIDATE)

    def read_trace(self) -> list[TraceRecord]:
        """Pop every record in the region-trace FIFO."""
        out = []
        for _ in range(self.read("TRACE_COUNT")):
            words = [self.read(f"TRACE_{n.upper()}") for n in TRACE_FIELDS]
            out.append(TraceRecord(*words))
            self.write("TRACE_POP", 1)
        return out

    # ---- memory --------------------------------------------------------------------------------
    def write_mem(self, addr: int, data) -> None:
        data = bytes(memoryview(data).cast("B"))
        with _memory_of_the_device():
            self.device.write_mem(addr, data)

    def read_mem(self, addr: int, size: int) -> bytes:
        with _memory_of_the_device():
            return self.device.read_mem(addr, size)


@contextlib.contextmanager
def _memory_of_the_device():
    """A device refuses (OutsideDRAM) a range beyond its DRAM: for the host that is a
    model whose constants and tensors need more memory than the device has."""
    try:
        yield
    except OutsideDRAM as err:
        raise DeviceError(f"{err}: the model needs more DRAM than this device has") from None


def _changed_runs(held: list[int] | None, words: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of ``words`` that differ from ``held`` (all when None)."""
    if held is None:
        return [(0, len(words))] if words else []
    runs, start = [], None
    for i, w in enumerate(words):
        same = i < len(held) and held[i] == w
        if not same and start is None:
            start = i
        elif same and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(words)))
    return runs
