"""The sequencer's FIRE step: a resolved instruction waits for what it needs, then
is dispatched."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig

from ..queues import compute_entry_layout, load_entry_layout, store_entry_layout
from .args import require_config

__all__ = ["Dispatch", "Needs"]

Needs = data.StructLayout({"idle": 1, "load_idle": 1, "load": 1, "compute": 1, "store": 1})
"""What an instruction waits for before it fires: every queue idle, the load queue
idle, or room in the load, compute or store queue (the queue it goes to)."""


class Dispatch(wiring.Component):
    """Hold the instruction resolved in CHECK until it can fire, then send it.

    CHECK (``resolve``) registers the instruction's queue entries, what it needs and
    whether it faults, and arms the step (unless the run has ``expired``). From the
    next cycle on the instruction fires (``fire``) in the first cycle its needs are
    met, unless it faults, or a bus ``error`` comes; a queue instruction's entry is
    ``valid`` on its queue's stream in that cycle. ``fire`` is a register and the
    queues' readies and idle flags, a few gates deep; the idle flags are taken a
    cycle late (they come from the engines through the queues), which is safe
    because a dispatch shows in its queue's idle flag the next cycle, before a later
    instruction can look.

    Parameters
    ----------
    config : NPUConfig
        The NPU build (the queue entries' layouts).

    Members
    -------
    resolve : In(1)
        The CHECK step of the instruction in flight.
    needs : In(Needs)
        What it waits for (read at ``resolve``).
    fault : In(1)
        It faults (read at ``resolve``): it is never dispatched.
    load_entry, compute_entry, store_entry : In(entry layouts of hdl.queues)
        Its entry for each queue (read at ``resolve``).
    expired : In(1)
        The run's budget has run out: ``resolve`` does not arm.
    expire : In(1)
        The budget runs out at the next cycle: disarm.
    error : In(1)
        A bus error: no fire, disarm.
    fire : Out(1)
        The armed instruction is dispatched this cycle.
    bad : Out(1)
        The instruction resolved last faults (registered at ``resolve``).
    waiting : Out(1)
        The armed instruction does not fire this cycle for want of its needs (a stall).
    waiting_room : Out(1)
        ``waiting``, and the queue it goes to is full (the ``stall_out_seq`` counter).
    idle : Out(1)
        Every queue was idle in the previous cycle.
    load, compute, store : Out(stream.Signature(entry layout))
        The queues.
    load_idle, compute_idle, store_idle : In(1)
        The queues are idle.
    """

    def __init__(self, config: NPUConfig):
        require_config(self, config)
        self.config = config
        layouts = {"load": load_entry_layout(config), "compute": compute_entry_layout(config),
                   "store": store_entry_layout(config)}
        super().__init__({
            "resolve": In(1), "needs": In(Needs), "fault": In(1),
            **{f"{q}_entry": In(lay) for q, lay in layouts.items()},
            "expired": In(1), "expire": In(1), "error": In(1),
            "fire": Out(1), "bad": Out(1), "waiting": Out(1), "waiting_room": Out(1),
            "idle": Out(1),
            **{q: Out(stream.Signature(lay)) for q, lay in layouts.items()},
            "load_idle": In(1), "compute_idle": In(1), "store_idle": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        fire, bad = self.fire, self.bad
        armed = Signal()
        needs_q = {n: Signal(name=f"needs_{n}_q") for n in Needs.members}
        idle_q = Signal(init=1)
        load_idle_q = Signal(init=1)
        all_idle = self.load_idle & self.compute_idle & self.store_idle
        m.d.sync += [idle_q.eq(all_idle), load_idle_q.eq(self.load_idle)]
        m.d.comb += self.idle.eq(idle_q)

        with m.If(self.resolve):
            m.d.sync += [q.eq(self.needs[n]) for n, q in needs_q.items()]
            m.d.sync += [self.load.payload.eq(self.load_entry),
                         self.compute.payload.eq(self.compute_entry),
                         self.store.payload.eq(self.store_entry)]
            m.d.sync += bad.eq(self.fault)
        full = ((needs_q["load"] & ~self.load.ready) | (needs_q["store"] & ~self.store.ready)
                | (needs_q["compute"] & ~self.compute.ready))
        wait = (needs_q["idle"] & ~idle_q) | (needs_q["load_idle"] & ~load_idle_q) | full
        m.d.comb += [
            fire.eq(armed & ~bad & ~wait & ~self.error),
            self.waiting.eq(armed & ~bad & ~fire),
            self.waiting_room.eq(armed & ~bad & full),
            self.load.valid.eq(fire & needs_q["load"]),
            self.compute.valid.eq(fire & needs_q["compute"]),
            self.store.valid.eq(fire & needs_q["store"]),
        ]
        # Armed next cycle: a CHECK that has not run out of budget arms, and the step
        # stays armed until the fire or a fault; a bus error or the budget running out
        # ends the run. A faulting instruction arms too, though it never fires: left
        # out here, its checks (CHECK's deepest logic) would feed this register.
        m.d.sync += armed.eq(~self.error & ~self.expire
                             & ((self.resolve & ~self.expired) | (armed & ~fire & ~bad)))
        return m
