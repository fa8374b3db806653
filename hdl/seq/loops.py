"""The sequencer's hardware loop stack."""

from __future__ import annotations

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .args import require_positive

__all__ = ["LoopStack"]


class LoopStack(wiring.Component):
    """The open hardware loops, innermost on top: their start, end and passes left.

    A ``loop`` (or ``loopr``) at pc ``p`` with a nonzero count opens a loop over
    ``[p + 1, end)``; the pc after the last instruction of its body is its start
    again while passes remain, and the loop closes after the last pass. A taken
    branch out of the innermost loop closes it.

    Updates follow the sequencer's steps: in the CHECK step of an instruction
    (``resolve``) the stack decides what that instruction's fire will do (push, pop,
    count a pass) and registers it, and ``fire`` applies it. Nothing else changes the
    stack between the two.

    Parameters
    ----------
    depth : int
        Loops that may be open at once (``NPUConfig.loop_depth``).
    pc_bits : int
        Width of a pc.

    Members
    -------
    clear : In(1)
        Close every loop (the start of a run).
    pc : In(pc_bits)
        The pc of the instruction in flight.
    advance : Out(pc_bits)
        Where an instruction at ``pc`` that goes on in sequence goes: the innermost
        loop's start when ``pc + 1`` is its end and more than one pass remains, else
        ``pc + 1``.
    full : Out(1)
        ``depth`` loops are open: a push would overflow.
    end : In(pc_bits), count : In(32)
        The loop instruction in flight: the end of its body and its pass count.
    nests_badly : Out(1)
        A loop is open and ``end`` is not before its end: a loop ending at ``end``
        would not nest inside it.
    target : In(pc_bits), sample : In(1)
        A branch's target; ``sample`` registers ``leaves`` and ``leaves_two`` for it.
    leaves : Out(1)
        Registered by ``sample``: a loop is open and ``target`` is outside the
        innermost one.
    leaves_two : Out(1)
        Registered by ``sample``: two or more loops are open and ``target`` is outside
        the second innermost one too.
    resolve : In(1)
        The CHECK step of the instruction in flight: register what its fire does,
        from ``advances``, ``push`` and ``pop``.
    advances : In(1)
        It goes on to ``advance`` (counting a pass, or closing the loop after the
        last).
    push : In(1)
        It is a loop with a nonzero count: push ``(pc + 1, end, count)``.
    pop : In(1)
        It is a taken branch out of the innermost loop: close that loop.
    fire : In(1)
        The instruction in flight fires: apply what ``resolve`` registered.
    """

    def __init__(self, *, depth: int, pc_bits: int):
        require_positive(self, depth=depth, pc_bits=pc_bits)
        self.depth = depth
        self.pc_bits = pc_bits
        super().__init__({
            "clear": In(1),
            "pc": In(pc_bits), "advance": Out(pc_bits),
            "full": Out(1),
            "end": In(pc_bits), "count": In(32), "nests_badly": Out(1),
            "target": In(pc_bits), "sample": In(1),
            "leaves": Out(1), "leaves_two": Out(1),
            "resolve": In(1), "advances": In(1), "push": In(1), "pop": In(1),
            "fire": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        ld, pc_bits = self.depth, self.pc_bits
        loop_start = Array(Signal(pc_bits, name=f"loop_start{i}") for i in range(ld))
        loop_end = Array(Signal(pc_bits, name=f"loop_end{i}") for i in range(ld))
        loop_rem = Array(Signal(32, name=f"loop_rem{i}") for i in range(ld))
        loop_sp = Signal(range(ld + 1))
        top = Signal(range(ld))
        m.d.comb += top.eq(loop_sp - 1)
        in_loop = loop_sp != 0

        seq_next = self.pc + 1
        loop_back = in_loop & (seq_next == loop_end[top])
        m.d.comb += [
            self.advance.eq(Mux(loop_back & (loop_rem[top] > 1), loop_start[top], seq_next)),
            self.full.eq(loop_sp >= ld),
            self.nests_badly.eq(in_loop & (self.end >= loop_end[top])),
        ]

        # The branch's compares are registered when it is sampled: the stack changes
        # only at a fire, so they hold until the branch fires.
        target = self.target
        inside = (target >= loop_start[top]) & (target < loop_end[top])
        inside2 = ((target >= loop_start[top - 1]) & (target < loop_end[top - 1]))
        with m.If(self.sample):
            m.d.sync += [self.leaves.eq(in_loop & ~inside),
                         self.leaves_two.eq((loop_sp > 1) & ~inside2)]

        # What the fire does is decided in CHECK and registered, so that `fire` (from
        # the queues' readies) only selects it: the decode behind `fire` was too deep
        # for the enables of `loop_rem`.
        loop_dec_q = Signal()  # count a pass
        loop_pop_q = Signal()
        loop_push_q = Signal()
        with m.If(self.resolve):
            more = loop_rem[top] > 1
            m.d.sync += [loop_dec_q.eq(self.advances & loop_back & more),
                         loop_pop_q.eq((self.advances & loop_back & ~more) | self.pop),
                         loop_push_q.eq(self.push)]

        with m.If(self.clear):
            m.d.sync += loop_sp.eq(0)
        push_at = loop_sp[:max(1, ceil_log2(ld))]  # the free stack entry
        with m.If(self.fire & loop_push_q):
            m.d.sync += [
                loop_start[push_at].eq(self.pc + 1),
                loop_end[push_at].eq(self.end),
                loop_rem[push_at].eq(self.count),
            ]
        # A push and a pop or a pass never come together: a loop does not advance.
        with m.If(self.fire):
            with m.If(loop_push_q):
                m.d.sync += loop_sp.eq(loop_sp + 1)
            with m.Elif(loop_pop_q):
                m.d.sync += loop_sp.eq(loop_sp - 1)
            with m.If(loop_dec_q):
                m.d.sync += loop_rem[top].eq(loop_rem[top] - 1)
        return m
