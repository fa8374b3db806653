"""Band-pipelined depthwise + pointwise pairs: the intermediate stays on chip.

MobileNet's 48x48 and 24x24 depthwise + pointwise pairs are too large to run
whole in the working partition, and their intermediates (18 to 37 KB) would
cross DRAM between two streamed units. Fused, the pair walks the image in bands
of output rows (:class:`.stream._ConvStream` with ``then``): each band loads its
input rows with the depthwise kernel's halo into one of two band buffers, the
depthwise engine writes the band's depthwise rows to one buffer on chip, and
the pointwise GEMM (weights resident) turns them into the band's output rows,
which leave for DRAM while the next band computes.

How many bands: more, shorter bands let the pointwise GEMM's column tiles take
accumulator rows of their own (a tile's requantization runs beside the next
tile's GEMMs) and the depthwise strips fit the engine's rows, at the price of
each band's fixed work; a first band half as tall as the others starts the
compute sooner (:func:`.stream.band_sizes`). :func:`pair_cycles` predicts each
count that fits, with even bands and with the short first one.
"""

from __future__ import annotations

from ..ir import QConv, QGemm
from .cost import BAND_DMA_LATENCY, BAND_FIXED, conv_cycles
from .depthwise import engine_rows_cycles, on_engine
from .lower import CompileError

MORE_BANDS = 6  # band counts tried beyond the fewest that fit


def band_pair(u, config) -> bool:
    """A depthwise convolution on the depthwise engine and the pointwise one (as
    its GEMM) reading it, the unit's only output."""
    if len(u.nodes) != 2:
        return False
    n, then = u.nodes
    return isinstance(n, QConv) and n.is_depthwise and on_engine(n, config) \
        and isinstance(then, QGemm) and then.inputs == [n.outputs[0]] \
        and u.outputs == [then.outputs[0]]


def pair_cycles(config, n: QConv, then: QGemm, bands: list[int], ow: int,
                first_load: int, last_store: int) -> float:
    """Predicted cycles of the pair in ``bands`` (output rows of each): per band
    the depthwise engine's strips and requantization per channel group, then the
    pointwise GEMM (:func:`.cost.conv_cycles`), and the fixed work; the first
    band's load and the last one's store overlap nothing."""
    k, nn = then.weight.shape
    ktiles = -(-k // config.rows)
    total = 0.0
    for nr in bands:
        m = nr * ow
        total += engine_rows_cycles(config, n, nr, ow)
        total += conv_cycles(config, [(m, 1, m, 1, m)], ktiles, nn) + BAND_FIXED
    bus = config.bus_bytes
    return total + -(-first_load // bus) + -(-last_store // bus) + BAND_DMA_LATENCY


def stream_pair(low, u, why: CompileError) -> dict:
    """Emit a :func:`band_pair` unit in the number of bands :func:`pair_cycles`
    predicts fastest, up to :data:`MORE_BANDS` beyond the fewest that fit, or the
    unit's variant's ``extra_bands``; raise ``CompileError`` (saying ``why`` it had
    to stream) when no band fits."""
    from .stream import _fewer_band_cycles  # it builds on lower, which imports this module

    n, then = u.nodes
    try:
        return _fewer_band_cycles(low, u, n, then, range(MORE_BANDS + 1))
    except CompileError as refusal:
        raise low._refuse(why, f"streaming in bands: {refusal}") from None
