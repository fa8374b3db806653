"""The sequencer's dispatch-time dependency-token counts."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from firmware import isa
from firmware.isa import Queue, Token

__all__ = ["QUEUES", "QueueFlags", "TokenCounters"]

QUEUES = (Queue.LOAD, Queue.COMPUTE, Queue.STORE)
"""The queues that take token flags, in the order of :data:`QueueFlags`' fields."""

QueueFlags = data.StructLayout({q.value: 1 for q in QUEUES})
"""One flag per queue (``load``, ``compute``, ``store``)."""

_POPS = (Token.POP_PREV, Token.POP_NEXT)


class TokenCounters(wiring.Component):
    """Pushes minus pops dispatched so far on each token channel.

    The counts are the golden model's token deques at dispatch: a pop on a channel
    whose count is zero can never be satisfied (TOKEN_DEADLOCK). Only the flags a
    queue may use (:data:`firmware.isa.LEGAL_TOKENS`) count for its instructions.

    An instruction's counts are worked out in its CHECK step (``resolve``) and taken
    at its fire, so that ``fire`` only selects them.

    Members
    -------
    clear : In(1)
        Zero every count (the start of a run).
    flags : In(firmware.isa.TOKENS_BITS)
        The token flags of the instruction in flight.
    deadlock : Out(QueueFlags)
        Per queue: an instruction of that queue with ``flags`` pops a channel whose
        count is zero.
    queue : In(QueueFlags)
        The queue of the instruction in flight (none for a sequencer instruction).
    resolve : In(1)
        Its CHECK step: register the counts as it leaves them.
    fire : In(1)
        It fires: take the registered counts.
    counts : Out(16).array(len(firmware.isa.TOKEN_CHANNELS))
        The count of each channel, in :data:`firmware.isa.TOKEN_CHANNELS` order.
    """

    def __init__(self):
        super().__init__({
            "clear": In(1),
            "flags": In(isa.TOKENS_BITS),
            "deadlock": Out(QueueFlags),
            "queue": In(QueueFlags),
            "resolve": In(1),
            "fire": In(1),
            "counts": Out(16).array(len(isa.TOKEN_CHANNELS)),
        })

    def elaborate(self, platform):
        m = Module()
        chan = {name: Signal(16, name="disp_" + name.replace(">", "_"))
                for name in isa.TOKEN_CHANNELS}
        chan_after = {name: Signal.like(c, name=f"{c.name}_after") for name, c in chan.items()}
        m.d.comb += [self.counts[i].eq(chan[name])
                     for i, name in enumerate(isa.TOKEN_CHANNELS)]
        toks = self.flags

        def has(flag):
            return (toks & flag) != 0

        for q in QUEUES:
            pops = [has(f) & (chan[isa.token_channel(q, f)] == 0)
                    for f in _POPS if isa.LEGAL_TOKENS[q] & f]
            m.d.comb += getattr(self.deadlock, q.value).eq(Cat(pops).any())

        # Several flags of one instruction touch different channels (prev/next), so the
        # updates below never collide.
        with m.If(self.resolve):
            m.d.sync += [chan_after[name].eq(c) for name, c in chan.items()]
            for q in QUEUES:
                with m.If(getattr(self.queue, q.value)):
                    for flag in Token:
                        if isa.LEGAL_TOKENS[q] & flag:
                            name = isa.token_channel(q, flag)
                            delta = -1 if flag in _POPS else 1
                            with m.If(has(flag)):
                                m.d.sync += chan_after[name].eq(chan[name] + delta)
        with m.If(self.clear):
            m.d.sync += [c.eq(0) for c in chan.values()]
        with m.If(self.fire):
            m.d.sync += [c.eq(chan_after[name]) for name, c in chan.items()]
        return m

