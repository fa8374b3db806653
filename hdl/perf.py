"""Performance monitor: the 64-bit global counters and the region-trace FIFO.

Counter order and names come from :func:`firmware.regs.counter_names`, and the
words of a trace record from :data:`firmware.regs.TRACE_FIELDS`, so the CSR block
(:mod:`hdl.csr`) can expose both without a second list.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from firmware.config import NPUConfig
from firmware.regs import TRACE_FIELDS, counter_names

__all__ = ["TRACE_RECORD_LAYOUT", "default_counter_widths", "PerfCounters", "TraceFIFO"]

TRACE_RECORD_LAYOUT = data.StructLayout({name: unsigned(32) for name in TRACE_FIELDS})
"""One region-trace record: a 32-bit word per :data:`firmware.regs.TRACE_FIELDS` entry
(the low 32 bits of the matching :class:`firmware.golden.TraceRecord` field)."""

# Counters that may advance by more than one per cycle (DMA bytes per beat or per row).
_BYTE_COUNTERS = ("dram_read_bytes", "dram_write_bytes")
_BYTE_WIDTH = 13  # one DMA row of up to 4096 bytes (hdl.ports.N_BITS)


def _check_config(config, component=None):
    if not isinstance(config, NPUConfig):
        if component is not None:
            component._MustUse__silence = True  # a failed construction is not unused
        raise TypeError(f"config must be an NPUConfig, not {config!r}")


def default_counter_widths(config: NPUConfig) -> dict[str, int]:
    """Return the default increment width of every counter of ``config``.

    1 bit for event and cycle counters, 13 bits for the DRAM byte counters,
    ``bits_for(rows * cols)`` for ``macs`` (a full array wave per cycle).
    """
    _check_config(config)
    widths = {name: 1 for name in counter_names(config)}
    for name in _BYTE_COUNTERS:
        widths[name] = _BYTE_WIDTH
    widths["macs"] = bits_for(config.rows * config.cols)
    return widths


class PerfCounters(wiring.Component):
    """The global performance counters, 64 bits each, in ``counter_names(config)`` order.

    Counter ``name`` adds ``inc.name`` (wrapping modulo ``2**64``) one cycle after it
    is presented: the increments are registered first, so each 64-bit adder starts
    from flip-flops whatever logic computes its increment (the sequencer's decode, the
    queues' state), which is what kept the whole ECP5 build slow. ``reset`` clears
    every counter and drops the increments not yet counted, those presented in its
    cycle and the cycle before (the counters read zero on the next cycle).

    Parameters
    ----------
    config : NPUConfig
        Selects the per-partition tag counters (``partitions``) and the ``macs`` width.
    widths : dict of str to int, optional
        Increment width per counter name, overriding :func:`default_counter_widths`
        for the names given (1..64 bits).

    Members
    -------
    inc : In(StructLayout)
        One unsigned field per counter, named as in ``counter_names(config)``:
        the amount to add this cycle.
    reset : In(1)
        Clear every counter (the CSR block's ``counter_reset``).
    values : Out(64).array(len(counter_names(config)))
        Current counter values, in CSR order (register outputs).
    """

    def __init__(self, config: NPUConfig, widths: dict[str, int] | None = None):
        _check_config(config, self)
        self.config = config
        self.names = counter_names(config)
        self.widths = default_counter_widths(config)
        for name, width in (widths or {}).items():
            if name not in self.widths:
                self._MustUse__silence = True
                raise ValueError(f"widths: unknown counter {name!r} "
                                 f"(counters: {', '.join(self.names)})")
            if not isinstance(width, int) or not 1 <= width <= 64:
                self._MustUse__silence = True
                raise ValueError(f"widths[{name!r}]={width!r}: must be an int in 1..64")
            self.widths[name] = width
        super().__init__({
            "inc": In(data.StructLayout({n: unsigned(self.widths[n]) for n in self.names})),
            "reset": In(1),
            "values": Out(64).array(len(self.names)),
        })

    def index(self, name: str) -> int:
        """Return the position of counter ``name`` in :attr:`values`."""
        return self.names.index(name)

    def elaborate(self, platform):
        m = Module()
        for i, name in enumerate(self.names):
            inc = getattr(self.inc, name)
            pending = Signal(len(inc), name=f"{name}_inc")
            with m.If(self.reset):
                m.d.sync += [self.values[i].eq(0), pending.eq(0)]
            with m.Else():
                m.d.sync += [self.values[i].eq(self.values[i] + pending), pending.eq(inc)]
        return m


class TraceFIFO(wiring.Component):
    """The region-trace FIFO: ``config.trace_depth`` records of ``TRACE_RECORD_LAYOUT``.

    A pushed record is registered first and enters the FIFO in the next cycle, so
    the memory's write enable and data start from flip-flops rather than from the
    sequencer's dispatch (its ``fire`` and the record's subtractions), which was
    among the slowest paths of the ECP5 build. Per cycle, in this order: ``clear``
    empties the FIFO and drops the record pushed in the cycle before, ``pop`` drops
    the head record (ignored when empty), then the record pushed in the cycle
    before is appended if there is room. One that finds the FIFO full (after the
    pop of the same cycle) is dropped and raises ``overflow`` in that cycle, like
    the golden model's region trace; the caller counts ``trace_overflows`` from it.
    Seen from outside, the FIFO is the unregistered one a cycle late: a record
    shows up in ``count`` and ``head`` two cycles after its push, and a record
    pushed in the cycle of a ``clear`` survives it.

    Parameters
    ----------
    config : NPUConfig
        ``trace_depth`` is the capacity in records.

    Members
    -------
    push : In(stream.Signature(TRACE_RECORD_LAYOUT))
        A finished region record from the sequencer (``valid`` + ``payload``).
        ``ready`` is always 1: a record that does not fit is dropped, not stalled.
        It counts in the FIFO from the second cycle after it is presented.
    pop : In(1)
        Drop the head record (the CSR block's ``trace_pop``).
    clear : In(1)
        Empty the FIFO (the CSR block's ``trace_clear``).
    count : Out(range(trace_depth + 1))
        Records held.
    head : Out(TRACE_RECORD_LAYOUT)
        The oldest record, valid when ``count > 0``; it follows the FIFO state with
        no extra latency (two cycles after a push into an empty FIFO, it is there).
    overflow : Out(1)
        Pulses in the cycle a pushed record found the FIFO full (the cycle after
        its push).
    """

    def __init__(self, config: NPUConfig):
        _check_config(config, self)
        self.config = config
        self.depth = config.trace_depth
        super().__init__({
            "push": In(stream.Signature(TRACE_RECORD_LAYOUT)),
            "pop": In(1),
            "clear": In(1),
            "count": Out(range(self.depth + 1)),
            "head": Out(TRACE_RECORD_LAYOUT),
            "overflow": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        m.submodules.mem = mem = Memory(shape=TRACE_RECORD_LAYOUT, depth=depth, init=[])
        wr = mem.write_port()
        # Transparent: a record written this cycle at the next head address shows up
        # on `head` next cycle (push into an empty FIFO, or pop+push at count 1).
        rd = mem.read_port(transparent_for=(wr,))

        # The push, registered: `valid` is dropped by a clear in the cycle after it.
        pend_valid = Signal()
        pend = Signal(TRACE_RECORD_LAYOUT)
        m.d.sync += [pend_valid.eq(self.push.valid), pend.eq(self.push.payload)]

        def succ(p):
            return Mux(p == depth - 1, 0, p + 1)

        rptr = Signal(range(depth))
        wptr = Signal(range(depth))
        # count == 0 and count == depth, kept as registers so that the push decision
        # needs no arithmetic on `count`
        empty = Signal(init=1)
        full = Signal()
        do_pop = Signal()
        rptr_next = Signal(range(depth))
        accept = Signal()
        no_room = Signal()  # full after this cycle's pop

        m.d.comb += [
            do_pop.eq(self.pop & ~empty & ~self.clear),
            no_room.eq(full & ~do_pop),
            self.push.ready.eq(1),
            accept.eq(pend_valid & ~self.clear & ~no_room),
            self.overflow.eq(pend_valid & ~self.clear & no_room),
            wr.addr.eq(wptr),
            wr.data.eq(pend),
            wr.en.eq(accept),
            rd.addr.eq(rptr_next),
            self.head.eq(rd.data),
        ]
        with m.If(self.clear):
            m.d.comb += rptr_next.eq(wptr)
        with m.Elif(do_pop):
            m.d.comb += rptr_next.eq(succ(rptr))
        with m.Else():
            m.d.comb += rptr_next.eq(rptr)
        m.d.sync += rptr.eq(rptr_next)

        one = self.count == 1
        almost = self.count == depth - 1
        with m.If(self.clear):
            m.d.sync += [self.count.eq(0), empty.eq(1), full.eq(0)]
        with m.Elif(accept & ~do_pop):
            m.d.sync += [self.count.eq(self.count + 1), empty.eq(0), full.eq(almost)]
        with m.Elif(do_pop & ~accept):
            m.d.sync += [self.count.eq(self.count - 1), empty.eq(one), full.eq(0)]
        with m.If(accept):
            m.d.sync += wptr.eq(succ(wptr))
        return m
