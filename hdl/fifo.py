"""A FIFO whose head is a register and whose latency is one cycle."""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal
from amaranth.lib.fifo import FIFOInterface, SyncFIFO

__all__ = ["HeadRegisterFIFO"]


class HeadRegisterFIFO(Elaboratable, FIFOInterface):
    """A synchronous FIFO with :class:`amaranth.lib.fifo.SyncFIFO`'s interface whose
    ``r_data`` comes from a register, as :class:`~amaranth.lib.fifo.SyncFIFOBuffered`'s
    does, but one cycle sooner: an entry written into an empty queue is at the head
    (``r_rdy``) the next cycle. The entries behind the head wait in a ``SyncFIFO`` of
    ``depth - 1`` (asynchronous reads: LUT RAM on an FPGA that has it), or in a
    register when that is one entry.

    The vector unit's response queues use it: the scratchpad's read data arrives a
    cycle after its block RAM's output was registered, and this queue gives that
    cycle back, so that the vector ops take the cycles they took before. The DMA's
    scratchpad-side queues use it so that the requests the scratchpad arbitrates
    start from a register, not a LUT RAM read, in the same cycles as a ``SyncFIFO``.

    Attributes
    ----------
    level : Signal(range(depth + 1)), out
        Entries in the queue, the head included.
    """

    def __init__(self, *, width: int, depth: int):
        if not isinstance(depth, int) or depth < 2:
            self._MustUse__silence = True  # never elaborated: no warning about it
            raise ValueError(f"depth={depth!r}: must be an integer of at least 2")
        super().__init__(width=width, depth=depth)
        self.level = Signal(range(depth + 1))

    def elaborate(self, platform):
        m = Module()
        m.submodules.tail = tail = (_OneEntry(self.width) if self.depth == 2 else
                                    SyncFIFO(width=self.width, depth=self.depth - 1))
        # The head register takes a new entry whenever it is empty or being read: the
        # oldest waiting one, or, when none waits, the one written now. The tail is
        # empty whenever the head is, so a write always has room then.
        load = ~self.r_rdy | self.r_en
        bypass = load & ~tail.r_rdy
        m.d.comb += [
            self.w_rdy.eq(tail.w_rdy),
            tail.w_en.eq(self.w_en & ~bypass),
            tail.w_data.eq(self.w_data),
            tail.r_en.eq(load),
            self.level.eq(tail.level + self.r_rdy),
            self.w_level.eq(self.level),
            self.r_level.eq(self.level),
        ]
        with m.If(load):
            m.d.sync += [self.r_data.eq(Mux(tail.r_rdy, tail.r_data, self.w_data)),
                         self.r_rdy.eq(tail.r_rdy | self.w_en)]
        return m


class _OneEntry(Elaboratable):
    """A one-entry queue with ``SyncFIFO``'s ports, as a register: ``SyncFIFO(depth=1)``
    has zero-width pointers, which Verilator's lint reports (``[-1:0]`` ranges)."""

    def __init__(self, width: int):
        self.w_en, self.w_rdy = Signal(), Signal()
        self.w_data = Signal(width)
        self.r_en, self.r_rdy = Signal(), Signal()
        self.r_data = Signal(width)
        self.level = Signal(range(2))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.w_rdy.eq(~self.r_rdy), self.level.eq(self.r_rdy)]
        with m.If(self.w_en & self.w_rdy):  # only into an empty entry, as SyncFIFO's
            m.d.sync += [self.r_data.eq(self.w_data), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        return m
