"""The configuration registers the sequencer's bounds checks read."""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from firmware import isa
from firmware.isa import CfgField

__all__ = ["BOUNDS_FIELDS", "SPAN_BITS", "BoundsConfig", "BoundsLayout"]

SPAN_BITS = 40
"""Width of a partition check's span (:func:`hdl.partition.pt_check_signature`'s
``nbytes``)."""

BOUNDS_FIELDS = (CfgField.GEMM_STRIDE, CfgField.IN_STRIDE, CfgField.OUT_STRIDE,
                 CfgField.POOL_COUNT, CfgField.POOL_STRIDE, CfgField.POOL_ISTRIDE)
"""The ``cfg`` fields whose values the bounds checks need (the vector unit keeps its
own copy of every field)."""

BoundsLayout = data.StructLayout({
    f.name.lower(): range(isa.CFG_RANGE[f][2] + 1)
    for f in BOUNDS_FIELDS})
"""One value per field of :data:`BOUNDS_FIELDS`, as wide as ``cfg`` accepts."""

_FIELD_BITS = isa.BY_MNEMONIC["cfg"].field("field").bits
_VALUE_BITS = isa.BY_MNEMONIC["cfg"].field("value").bits


class BoundsConfig(wiring.Component):
    """The sequencer's copy of the ``cfg`` registers its bounds checks read, and the
    pooling window's extent, ``(pool_count - 1) * pool_stride``.

    Each value remembers whether it is zero (a zero stride means dense), so the span
    arithmetic starts from registers. The extent changes with its two fields: the
    PRODUCTS and CHECK steps of every queue instruction multiply out both candidates
    (the new count by the stride and the count by the new stride, with ``field`` and
    ``value`` of the instruction in flight), and a ``cfg``'s write keeps the one it
    sets. So the extent is a register, ready for the next instruction's SPANS step.

    Members
    -------
    clear : In(1)
        Every field to its reset value (:data:`firmware.isa.CFG_RESET`).
    field : In(4), value : In(signed(32))
        The ``cfg`` operands of the instruction in flight (read whatever it is).
    products, resolve : In(1)
        Its PRODUCTS and CHECK steps: the extent's two pipeline stages.
    write : In(1)
        The ``cfg`` in flight fires: set ``field`` to ``value`` (if it is one of
        :data:`BOUNDS_FIELDS`). ``value`` is in the field's range (the sequencer
        faults a ``cfg`` whose value is not).
    values : Out(BoundsLayout)
        The fields' values.
    zero : Out(data.StructLayout) (one bit per field)
        Whether each value is zero.
    pool_extent : Out(SPAN_BITS)
        ``(pool_count - 1) * pool_stride``.
    """

    def __init__(self):
        super().__init__({
            "clear": In(1),
            "field": In(_FIELD_BITS), "value": In(signed(_VALUE_BITS)),
            "products": In(1), "resolve": In(1),
            "write": In(1),
            "values": Out(BoundsLayout),
            "zero": Out(data.StructLayout({f.name.lower(): 1 for f in BOUNDS_FIELDS})),
            "pool_extent": Out(SPAN_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        shadow_cfg = {
            fld: Signal(range(isa.CFG_RANGE[fld][2] + 1), name=f"cfg_{fld.name.lower()}",
                        init=isa.CFG_RESET[fld])
            for fld in BOUNDS_FIELDS
        }
        cfg_zero = {fld: Signal(name=f"cfg_{fld.name.lower()}_zero",
                                init=isa.CFG_RESET[fld] == 0) for fld in shadow_cfg}
        for fld in BOUNDS_FIELDS:
            m.d.comb += [getattr(self.values, fld.name.lower()).eq(shadow_cfg[fld]),
                         getattr(self.zero, fld.name.lower()).eq(cfg_zero[fld])]

        with m.If(self.clear):
            m.d.sync += [
                *[s.eq(isa.CFG_RESET[k]) for k, s in shadow_cfg.items()],
                *[z.eq(isa.CFG_RESET[k] == 0) for k, z in cfg_zero.items()],
            ]
        with m.If(self.write):
            for f, sig in shadow_cfg.items():
                with m.If(self.field == int(f)):
                    m.d.sync += [sig.eq(self.value), cfg_zero[f].eq(self.value == 0)]

        # The factors less one are registered in PRODUCTS, so that CHECK is a product
        # alone (a subtract before the multiplier was too deep for one cycle).
        pool_extent = self.pool_extent
        count_r, stride_r = shadow_cfg[CfgField.POOL_COUNT], shadow_cfg[CfgField.POOL_STRIDE]
        cfg_fld, cfg_value = self.field, self.value
        ext_new_count = Signal(SPAN_BITS)
        ext_new_stride = Signal(SPAN_BITS)
        value_less = Signal((cfg_value[:len(count_r)] - 1).shape())
        count_less = Signal((count_r - 1).shape())
        with m.If(self.products):
            m.d.sync += [value_less.eq(cfg_value[:len(count_r)] - 1), count_less.eq(count_r - 1)]
        with m.If(self.resolve):
            m.d.sync += [
                ext_new_count.eq(value_less * stride_r),
                ext_new_stride.eq(count_less * cfg_value[:len(stride_r)]),
            ]
        with m.If(self.clear):
            m.d.sync += pool_extent.eq(0)  # the reset count is 1
        with m.Elif(self.write):
            with m.If(cfg_fld == CfgField.POOL_COUNT):
                m.d.sync += pool_extent.eq(ext_new_count)
            with m.Elif(cfg_fld == CfgField.POOL_STRIDE):
                m.d.sync += pool_extent.eq(ext_new_stride)
        return m
