"""Scratchpad and accumulator bytes per region, counted by a golden-model replay.

The NPU counts DRAM bytes and MACs but not its on-chip SRAM accesses, so the cost
graph replays the inference on the golden model with a :class:`CountingMachine`:
the golden model already names every scratchpad span an instruction reads or writes
(it tells its timeline which banks each one uses), and each compute instruction's
operands say which accumulator rows and columns it reads and writes. The counts do
not depend on timing, so one replay serves every backend and memory; the replay's
MACs and DRAM bytes per region are compared with the measured run's
(:attr:`SramCounts.matches`) to show it ran what the device ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.golden import Machine
from firmware.isa import GemmMode

from .compiler import CompiledModel
from .device import GoldenDevice
from .driver import NPUDriver
from .runtime import Session

OUTSIDE = -1
"""The region key of accesses made outside every region mark."""


@dataclass
class SramBytes:
    """Bytes one region moved through the on-chip memories (the scratchpad's in whole
    words of ``bus_bytes``, as its SRAM banks are accessed)."""

    sp_read: int = 0
    sp_write: int = 0
    acc_read: int = 0
    acc_write: int = 0

    def add(self, other: SramBytes) -> None:
        self.sp_read += other.sp_read
        self.sp_write += other.sp_write
        self.acc_read += other.acc_read
        self.acc_write += other.acc_write

    @property
    def sp(self) -> int:
        return self.sp_read + self.sp_write


@dataclass
class SramCounts:
    """A replay's counts: region id (:data:`OUTSIDE` for none) -> bytes, and the
    replay's own MACs and DRAM bytes per region (its trace) to compare."""

    regions: dict[int, SramBytes] = field(default_factory=dict)
    replay: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    matches: bool = False


def _span_bytes(spans, word: int) -> int:
    """Bytes of the scratchpad words ``spans`` (rows' addresses, bytes per row) touch:
    the SRAM is read and written a whole word at a time, so a short or unaligned row
    costs every word it reaches into."""
    total = 0
    for rows, n in spans:
        first = np.atleast_1d(rows).astype(np.int64) // word
        last = (np.atleast_1d(rows).astype(np.int64) + n - 1) // word
        total += int((last - first + 1).sum()) * word
    return total


class CountingMachine(Machine):
    """The golden model, counting scratchpad and accumulator bytes per open region."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sram: dict[int, SramBytes] = {}

    def _here(self) -> SramBytes:
        rid = self.regions[-1][0] if self.regions else OUTSIDE
        return self.sram.setdefault(rid, SramBytes())

    def _uses(self, reads=(), writes=()):
        here = self._here()
        here.sp_read += _span_bytes(reads, self.config.bus_bytes)
        here.sp_write += _span_bytes(writes, self.config.bus_bytes)
        super()._uses(reads, writes)

    def _exec(self, ins, pc):
        nxt = super()._exec(ins, pc)
        m, o = ins.mnemonic, ins.ops
        here = self._here()
        if m == "gemm":
            words = o["m"] * self.wdims[self.w_active][1]
            here.acc_write += 4 * words
            here.acc_read += 4 * words * (o["mode"] == GemmMode.ACCUMULATE)
        elif m == "dwconv":
            words = o["h"] * o["m"] * o["n"]
            here.acc_write += 4 * words
            here.acc_read += 4 * words * (o["mode"] == GemmMode.ACCUMULATE)
        elif m == "vbias":
            here.acc_read += 4 * o["m"] * o["n"]
            here.acc_write += 4 * o["m"] * o["n"]
        elif m in ("vreq", "vreqb"):
            here.acc_read += 4 * o["m"] * o["n"]
        return nxt


class _CountingDevice(GoldenDevice):
    def __init__(self, config, dram_latency=None):
        super().__init__(config, dram_latency=dram_latency)
        self.machine = self.side.machine = CountingMachine(
            config, dram_bytes=len(self.machine.dram), dram_latency=self.dram_latency)


def count_sram(model: CompiledModel, inputs: dict, measured_trace=(), *,
               warm: bool = True) -> SramCounts:
    """Replay one inference of ``model`` on ``inputs`` and count its SRAM bytes.

    ``warm``: run it once before (the weights then hit their tags, as in a steady
    state run). ``measured_trace``: the trace records of the run being explained;
    :attr:`SramCounts.matches` says whether the replay's MACs and DRAM bytes per
    region equal them.
    """
    dev = _CountingDevice(model.config)
    session = Session(NPUDriver(dev), model, check=False)
    session.load()
    if warm:
        session.run(inputs)
    dev.machine.sram = {}
    inf = session.run(inputs)
    out = SramCounts(regions=dev.machine.sram, replay=_per_region(inf.trace))
    out.matches = out.replay == _per_region(measured_trace)
    return out


def _per_region(trace) -> dict[int, tuple[int, int, int]]:
    sums: dict[int, tuple[int, int, int]] = {}
    for t in trace:
        a, b, c = sums.get(t.region, (0, 0, 0))
        sums[t.region] = (a + t.macs, b + t.dram_read_bytes, c + t.dram_write_bytes)
    return sums
