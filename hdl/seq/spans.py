"""The byte spans of the sequencer's partition checks."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from firmware.config import NPUConfig

from ..partition import pt_check_signature
from .args import require_config, require_positive
from .bounds import SPAN_BITS

__all__ = ["SECOND_PRODUCT", "SpanChecker", "span_layout"]


def span_layout(config: NPUConfig) -> data.StructLayout:
    """One check's request: ``a * b + add`` bytes (plus the pooling window's extent
    when ``extra``) at ``offset`` in partition ``p``."""
    chk = pt_check_signature(config).members
    return data.StructLayout({
        "p": chk["p"].shape, "offset": chk["offset"].shape,
        "a": 14, "b": 21, "add": 13, "extra": 1,
    })


SECOND_PRODUCT = data.StructLayout({"a": 4, "b": 21})
"""Check 0's second product, ``a * b`` bytes more (``dwconv``: its input rows)."""


class SpanChecker(wiring.Component):
    """Partition range checks whose span is a product and a sum, in three steps.

    SPANS (``sample``) registers each request's partition, offset and factors, and
    sums its addend (``add``, plus ``pool_extent`` when ``extra``). From the next cycle
    on the partition table looks the partition up and takes the offset and addend off
    its size, while PRODUCTS (``multiply``) registers ``a * b``; the next cycle (CHECK)
    the table compares the product with that room, and ``chk[i].error`` and
    ``chk[i].addr`` are the outcome. The requests hold from one ``sample`` to the next,
    so ``chk[i].offset`` does too.

    Parameters
    ----------
    config : NPUConfig
        The NPU build (the partition table's widths).
    checks : int
        How many checks an instruction can make.

    Members
    -------
    span : In(span_layout(config)).array(checks)
        The requests of the instruction in flight. A request not driven checks
        ``1 * 1`` byte at offset 0 of partition 0.
    second : In(SECOND_PRODUCT)
        A second product that check 0 adds to its span (0 when not driven).
    pool_extent : In(SPAN_BITS)
        The pooling window's extent (:class:`hdl.seq.bounds.BoundsConfig`).
    sample, multiply : In(1)
        The SPANS and PRODUCTS steps.
    chk : Out(hdl.partition.pt_check_signature(config)).array(checks)
        The checks, to the partition table.
    """

    def __init__(self, config: NPUConfig, *, checks: int):
        require_config(self, config)
        require_positive(self, checks=checks)
        self.config = config
        self.checks = checks
        super().__init__({
            "span": In(span_layout(config), init={"a": 1, "b": 1}).array(checks),
            "second": In(SECOND_PRODUCT),
            "pool_extent": In(SPAN_BITS),
            "sample": In(1), "multiply": In(1),
            "chk": Out(pt_check_signature(config)).array(checks),
        })

    def elaborate(self, platform):
        m = Module()
        chk = self.chk
        spans = self.span
        # The addend is summed in SPANS, so that PRODUCTS is a product alone.
        init = {"p": 0, "offset": 0, "a": 1, "b": 1}  # as the requests'
        spans_q = [{k: Signal(span[k].shape(), name=f"span{i}_{k}_q", init=init[k])
                    for k in init} for i, span in enumerate(spans)]
        second = Signal(SECOND_PRODUCT)
        for i, q in enumerate(spans_q):
            q["addend"] = Signal(SPAN_BITS, name=f"span{i}_addend_q")
        with m.If(self.sample):
            for span, q in zip(spans, spans_q, strict=True):
                m.d.sync += [q[k].eq(span[k]) for k in ("p", "offset", "a", "b")]
                m.d.sync += q["addend"].eq(span.add + Mux(span.extra, self.pool_extent, 0))
            m.d.sync += second.eq(self.second)
        with m.If(self.multiply):
            for i, (c, q) in enumerate(zip(chk, spans_q, strict=True)):
                more = second.a * second.b if i == 0 else 0
                m.d.sync += c.nbytes.eq(q["a"] * q["b"] + more)
        for c, q in zip(chk, spans_q, strict=True):
            m.d.comb += [c.p.eq(q["p"]), c.offset.eq(q["offset"]), c.addend.eq(q["addend"])]
        return m
