"""The tile-tag store: which scratchpad tiles still hold which DRAM data.

A ``load`` with ``tag=slot`` (slot 1..tag_slots) names its transfer by a key
(DRAM address, rows, bytes per row, resolved stride, absolute scratchpad base).
When the slot holds that key the transfer is skipped (a hit). On a miss the load
queue invalidates the slot before the transfer and sets it to the key after it,
so a failed transfer leaves the slot invalid. ``tinv slot`` invalidates one slot,
``tinv 0`` and the CSR's ``CTRL.tag_invalidate`` all of them. This is
``firmware.golden.Machine._op_load`` and ``tinv``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig

from .ports import DRAM_ADDR_BITS, N_BITS, sp_addr_bits

__all__ = ["SLOT_BITS", "TagStore", "tag_key_layout"]

SLOT_BITS = 6
"""Width of a tag-slot number (the ISA's tag fields)."""


def tag_key_layout(config: NPUConfig) -> data.StructLayout:
    """The key of a tagged load, as golden ``_op_load`` forms it.

    Fields and their order are those of :func:`hdl.ports.dma_command_layout`, so
    a resolved DMA command converts to its key bit for bit.

    Fields
    ------
    dram : 32
        DRAM address of the first row.
    stride : 32
        Resolved row stride in DRAM (``nbytes`` for a dense load).
    rows : 9
        Rows, 1..256.
    nbytes : 13
        Bytes per row, 1..4096.
    sp : sp_addr_bits
        Absolute scratchpad byte address of the first row.
    """
    return data.StructLayout({
        "dram": DRAM_ADDR_BITS,
        "stride": DRAM_ADDR_BITS,
        "rows": 9,
        "nbytes": N_BITS,
        "sp": sp_addr_bits(config),
    })


class TagStore(wiring.Component):
    """``tag_slots`` tile tags (slots 1..tag_slots), all invalid after reset.

    Lookups are registered: ``q_hit`` answers the ``q_slot``/``q_key`` of the
    cycle before, against the tags as that cycle's sets and invalidations left them
    (so a lookup is one cycle, and the load queue makes it as it takes an entry).
    Sets and invalidations take effect at the end of their cycle. When a set and an
    invalidation of the same slot (or ``inv_all``) meet in one cycle, the
    invalidation wins: a spurious miss only costs a transfer, a spurious hit
    would skip one. Slot 0 and slots above ``tag_slots`` never hit and are never
    set; ``inv_slot`` above ``tag_slots`` is ignored (the sequencer rejects such
    slots with BAD_OPERAND before they get here).

    Parameters
    ----------
    config : NPUConfig
        The NPU build (``tag_slots``, ``sp_bytes``).

    Members
    -------
    q_slot : In(6)
        Slot to look up.
    q_key : In(tag_key_layout(config))
        Key of the load.
    q_hit : Out(1)
        Last cycle's ``q_slot`` is a real slot, valid, and holds last cycle's
        ``q_key`` (after last cycle's updates).
    set_en, set_slot, set_key : In(1), In(6), In(tag_key_layout(config))
        Make ``set_slot`` valid with ``set_key`` (after a completed transfer).
    inv_en, inv_slot : In(1), In(6)
        Invalidate ``inv_slot``; slot 0 means every slot (``tinv``, and the
        load queue before a transfer).
    inv_all : In(1)
        Invalidate every slot (``CTRL.tag_invalidate`` from the CSR block).
    """

    def __init__(self, config: NPUConfig):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        key = tag_key_layout(config)
        super().__init__({
            "q_slot": In(SLOT_BITS),
            "q_key": In(key),
            "q_hit": Out(1),
            "set_en": In(1),
            "set_slot": In(SLOT_BITS),
            "set_key": In(key),
            "inv_en": In(1),
            "inv_slot": In(SLOT_BITS),
            "inv_all": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.config.tag_slots

        # Keys live in a small RAM indexed by slot (row 0 unused); the valid bits
        # are flops so that invalidating every slot takes one cycle.
        m.submodules.keys = keys = Memory(shape=tag_key_layout(self.config), depth=n + 1,
                                          init=[])
        rd = keys.read_port(domain="comb")
        wr = keys.write_port()
        valid = Signal(n + 1)  # bit 0 stays 0

        def real(slot):
            return (slot != 0) & (slot <= n)

        set_ok = self.set_en & real(self.set_slot)
        m.d.comb += [
            wr.en.eq(set_ok),
            wr.addr.eq(self.set_slot),
            wr.data.eq(self.set_key),
            rd.addr.eq(self.q_slot),
        ]

        hit_valid = Signal()
        with m.Switch(self.q_slot):
            for s in range(1, n + 1):
                with m.Case(s):
                    m.d.comb += hit_valid.eq(valid[s])
        # Registered: the compare of a key read from LUT RAM into the load queue's
        # next step was the board build's deepest path after the scratchpad's.
        # This cycle's set and invalidations of the slot decide, as they will for
        # the tags at the start of the next cycle.
        key = self.q_key.as_value()
        inv_every = self.inv_all | (self.inv_en & (self.inv_slot == 0))
        inv_q = inv_every | (self.inv_en & (self.inv_slot == self.q_slot))
        set_q = set_ok & (self.set_slot == self.q_slot)
        m.d.sync += self.q_hit.eq(~inv_q & Mux(set_q, self.set_key.as_value() == key,
                                               hit_valid & (rd.data.as_value() == key)))

        for s in range(1, n + 1):
            with m.If(set_ok & (self.set_slot == s)):
                m.d.sync += valid[s].eq(1)
            # later assignment wins: invalidation beats a same-cycle set
            with m.If(inv_every | (self.inv_en & (self.inv_slot == s))):
                m.d.sync += valid[s].eq(0)
        return m
