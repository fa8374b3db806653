"""The sequencer's region stack, the meters region records are computed from, and the
records themselves."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.regs import TRACE_FIELDS

from .args import require_positive

__all__ = ["METERS", "TRACE_WORDS", "RegionMeters"]

TRACE_WORDS = len(TRACE_FIELDS)
"""Words of a region record (:data:`firmware.regs.TRACE_FIELDS`)."""

METERS = TRACE_FIELDS[3:]
"""The meters, in the record's order: a record is the region id, its start and end
cycle, then each meter's difference over the region."""
assert TRACE_FIELDS[:3] == ("region", "start", "end")

METER_WIDTHS = {"instructions": 1, "macs": 16, "dram_read_bytes": 16, "dram_write_bytes": 16,
                "tag_hits": 1, "tag_misses": 1, "stall_cycles": 1, "busy_load": 1,
                "busy_store": 1, "busy_array": 1, "busy_vector": 1, "sp_conflicts": 3}
"""Each meter's event input width (events per cycle)."""
assert tuple(METER_WIDTHS) == METERS

# Events that come from deep logic (the dispatch's stall, the queues' and engines'
# states, the scratchpad's grants) are registered before their meter's adder; the
# meter as of now includes the event in flight.
_REGISTERED = ("stall_cycles", "busy_load", "busy_store", "busy_array", "busy_vector",
               "sp_conflicts")


class RegionMeters(wiring.Component):
    """Region marks: the stack of open regions, the meters and the trace records.

    The meters count their events in every cycle, run or not, and wrap; a record
    holds differences, so only the meters' values at a region's begin and end
    matter. A begin pushes the region's id and snapshots the cycle count and the
    meters; the end of the innermost region pops it and emits its record in the same
    cycle. The snapshot is written the cycle after the begin, from the values as they
    were at the begin, so the next begin or end may come a cycle later at the
    earliest (the sequencer's marks are at least two cycles apart).

    Parameters
    ----------
    depth : int
        Regions that may be open at once (``NPUConfig.region_depth``).

    Members
    -------
    clear : In(1)
        Close every region (the start of a run). The meters keep counting.
    cycles : In(32)
        The run's cycle count: a record's start and end cycle.
    instructions, macs, dram_read_bytes, dram_write_bytes, tag_hits, tag_misses, \
    stall_cycles, busy_load, busy_store, busy_array, busy_vector, sp_conflicts : In
        Each meter's event count this cycle (:data:`METER_WIDTHS` bits). The stall,
        busy and conflict events are registered before their meters' adders (they
        come from the dispatch's deepest logic and from the engines), and a meter as
        of now includes its event in flight.
    id : In(16)
        The id the mark in flight names.
    full : Out(1)
        ``depth`` regions are open: a begin would overflow.
    mismatch : Out(1)
        No region is open, or the innermost one is not ``id``: an end does not match.
    open : Out(1)
        A region is open.
    begin : In(1)
        Open region ``id``.
    end : In(1)
        Close the innermost region and emit its record (``trace_*``) this cycle.
    trace_valid : Out(1), trace_record : Out(32).array(TRACE_WORDS)
        A region record in :data:`firmware.regs.TRACE_FIELDS` order, valid with
        ``end``; all zero otherwise.
    """

    def __init__(self, *, depth: int):
        require_positive(self, depth=depth)
        self.depth = depth
        super().__init__({
            "clear": In(1),
            "cycles": In(32),
            **{name: In(width) for name, width in METER_WIDTHS.items()},
            "id": In(16),
            "full": Out(1), "mismatch": Out(1), "open": Out(1),
            "begin": In(1), "end": In(1),
            "trace_valid": Out(1), "trace_record": Out(32).array(TRACE_WORDS),
        })

    def elaborate(self, platform):
        m = Module()
        rd_ = self.depth
        meters = {n: Signal(32, name=f"meter_{n}") for n in METERS}
        reg_id = Array(Signal(16, name=f"region_id{i}") for i in range(rd_))
        reg_sp = Signal(range(rd_ + 1))
        rtop = Signal(range(rd_))  # the innermost open region
        m.d.comb += rtop.eq(reg_sp - 1)
        # Each open region's snapshot (its start cycle and the meters): written by the
        # begin, read by the end, one slot at a time, so a memory read asynchronously
        # (LUT RAM on the ECP5) instead of flip-flops behind a multiplexer.
        snap_names = ("start", *meters)
        m.submodules.region_snaps = snaps = Memory(
            shape=32 * len(snap_names), depth=rd_, init=[])
        snap_w = snaps.write_port()
        snap_r = snaps.read_port(domain="comb")
        m.d.comb += snap_r.addr.eq(rtop)
        reg_snap = {n: snap_r.data[32 * i: 32 * i + 32] for i, n in enumerate(snap_names)}
        # A begin's snapshot is written the cycle after it (the write enable comes from
        # a register), from the meters and cycle count as they were at the begin.
        snap_en = Signal()
        snap_slot = Signal(range(rd_))
        meters_then = {n: Signal(32, name=f"meter_{n}_then") for n in meters}
        cycles_then = Signal(32)
        m.d.sync += [snap_en.eq(0), cycles_then.eq(self.cycles)]
        event_q = {n: Signal(METER_WIDTHS[n], name=f"{n}_q") for n in _REGISTERED}
        meters_now = dict(meters, **{n: meters[n] + q for n, q in event_q.items()})
        m.d.sync += [meters_then[n].eq(meter) for n, meter in meters_now.items()]
        m.d.comb += [
            snap_w.en.eq(snap_en),
            snap_w.addr.eq(snap_slot),
            snap_w.data.eq(Cat(cycles_then, *(meters_then[n] for n in meters))),
        ]

        for n, meter in meters.items():
            if n in event_q:
                m.d.sync += [event_q[n].eq(getattr(self, n)), meter.eq(meter + event_q[n])]
            else:
                m.d.sync += meter.eq(meter + getattr(self, n))

        m.d.comb += [
            self.full.eq(reg_sp >= rd_),
            self.mismatch.eq((reg_sp == 0) | (reg_id[rtop] != self.id)),
            self.open.eq(reg_sp != 0),
        ]
        with m.If(self.clear):
            m.d.sync += reg_sp.eq(0)
        slot = reg_sp[:max(1, ceil_log2(rd_))]
        with m.If(self.begin):
            m.d.sync += [reg_id[slot].eq(self.id), reg_sp.eq(reg_sp + 1),
                         snap_en.eq(1), snap_slot.eq(slot)]
        with m.If(self.end):
            m.d.sync += reg_sp.eq(reg_sp - 1)
            rec = self.trace_record
            m.d.comb += [
                self.trace_valid.eq(1),
                rec[0].eq(self.id), rec[1].eq(reg_snap["start"]), rec[2].eq(self.cycles),
            ]
            for i, n in enumerate(meters):  # in the record's order
                m.d.comb += rec[3 + i].eq(meters_now[n] - reg_snap[n])
        return m
