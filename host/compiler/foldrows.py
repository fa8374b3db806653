"""Rows folded into channels for a convolution with a row stride on a host input.

A convolution's reduction tile is a chunk of one kernel row's ``KW * C`` window
bytes, so a kernel row shorter than the array's rows leaves rows idle: DS-CNN's
first convolution (10x4 kernel, one channel, stride 2) fills 4 of 8 rows in each
of its 10 tiles. With a row stride ``s``, kernel rows ``j*s .. j*s + s - 1`` of
output row ``r`` read the ``s`` input rows ``(r + j) * s + p`` (padded rows), so
with the input's rows folded into its channels ``s`` at a time (row ``i``,
channel ``p * C + c`` holding padded row ``i * s + p``) the same outputs are a
convolution of ``ceil(KH / s)`` kernel rows of ``s * KW * C`` bytes at row
stride 1: DS-CNN's in 5 tiles of 8 rows.

Where a kernel row is short and the kernel taller than the stride (MobileNet's
stem: 3x3, three channels, stride 2: a kernel row of 9 bytes, two tiles of 8
and 1), the fold may take every kernel row at once, ``KH`` rows ``s`` apart
(rows read twice): output row ``r`` is then one folded row of ``KH * KW * C``
bytes, row stride 1, in 4 tiles instead of 6 for MobileNet's stem. Whichever
fold needs fewer tiles is taken (the plain one on a tie: it copies no row
twice).

The fold is a :class:`~host.ir.FoldRows` node on the CPU, so it is taken only
where the convolution's input comes from the host (a graph input or a CPU
node's output) and nothing else reads it: the host writes the input in the
order the array reads it, as it already writes NCHW tensors channels-last.
"""

from __future__ import annotations

import copy

import numpy as np

from firmware.config import NPUConfig

from ..ir import FoldRows, Graph, QConv, Tensor
from .lower import conv_tiles


def fold_rows(graph: Graph, config: NPUConfig, log: list[str]) -> Graph:
    """``graph``, or a copy with the rows of each foldable convolution's input
    folded (:func:`foldable`); what changed is appended to ``log``."""
    todo = [n.name for n in graph.nodes if foldable(graph, n, config)]
    if not todo:
        return graph
    g = copy.deepcopy(graph)
    for name in todo:
        n = g.node(name)
        log.append(_fold(g, n, config))
    g.validate()
    return g


def foldable(g: Graph, n, config: NPUConfig) -> bool:
    """Whether folding the rows of ``n``'s input saves reduction tiles: ``n`` a
    dense NPU convolution with a row stride, its input from the host (graph input
    or CPU node) and read by ``n`` alone."""
    if not isinstance(n, QConv) or n.device != "npu" or n.group != 1 \
            or n.requant is None or n.strides[0] < 2:
        return False
    x = n.inputs[0]
    producer = g.producer(x)
    if x in g.outputs or g.consumers(x) != [n] \
            or (producer is not None and producer.device != "cpu"):
        return False
    return _best_fold(g.tensors[x].shape, n, config) is not None


def _tiles(n: QConv, c: int, config: NPUConfig, fold: int) -> int:
    """Reduction tiles per column tile of ``n`` on ``c`` channels, its rows folded
    by ``fold`` (1: not folded; KH: every kernel row at once)."""
    _, _, kh, kw = n.weight.shape
    return len(conv_tiles(-(-kh // fold), fold * kw * c, config.rows))


def _best_fold(shape, n: QConv, config: NPUConfig) -> int | None:
    """The fold of ``n``'s input with the fewest reduction tiles, fewer than
    unfolded: the stride (``s``), every kernel row (``KH``, rows ``s`` apart), or
    None."""
    _, c, _, _ = shape
    kh, s = n.weight.shape[2], n.strides[0]
    options = []
    if _geometry(shape, n) is not None:
        options.append((_tiles(n, c, config, s), 0, s))
    if kh > s and _overlap_bottom(shape, n) >= 0:
        options.append((_tiles(n, c, config, kh), 1, kh))
    best = min(options, default=None)
    return best[2] if best and best[0] < _tiles(n, c, config, 1) else None


def _overlap_bottom(shape, n: QConv) -> int:
    """Fill rows below the image that folding every kernel row needs (negative
    where the last rows are never read: then it does not fold)."""
    _, _, h, _ = shape
    kh, s, pt = n.weight.shape[2], n.strides[0], n.pads[0]
    oh = (h + pt + n.pads[2] - kh) // s + 1
    bottom = (oh - 1) * s + kh - pt - h
    return bottom if bottom <= n.pads[2] else -1


def _geometry(shape, n: QConv):
    """(top fill rows, bottom fill rows, folded rows, top pad, bottom pad) of the
    folded convolution, or None where it would need a negative bottom pad."""
    _, _, h, _ = shape
    kh = n.weight.shape[2]
    s = n.strides[0]
    pt = n.pads[0]
    oh = (h + pt + n.pads[2] - kh) // s + 1
    first, last = pt // s, (pt + h - 1) // s  # folded rows holding real rows
    rows = last - first + 1
    top = pt - first * s
    bottom = rows * s - top - h
    pb = oh + -(-kh // s) - 1 - rows - first
    if pb < 0:
        return None
    return top, bottom, rows, first, pb


def _fold(g: Graph, n: QConv, config: NPUConfig) -> str:
    x = g.tensors[n.inputs[0]]
    if _best_fold(x.shape, n, config) != n.strides[0]:
        return _fold_kernel_rows(g, n, config)
    bn, c, h, w = x.shape
    oc, _, kh, kw = n.weight.shape
    s = n.strides[0]
    top, bottom, rows, pt, pb = _geometry(x.shape, n)
    folded = np.zeros((oc, s * c, -(-kh // s), kw), dtype=n.weight.dtype)
    for k in range(kh):  # kernel row k reads folded row k // s, channels of phase k % s
        folded[:, (k % s) * c:(k % s + 1) * c, k // s] = n.weight[:, :, k]
    name = g.add_tensor(Tensor(f"{x.name}/rows_folded", (bn, s * c, rows, w), "int8",
                               quant=x.quant)).name
    g.nodes.insert(g.nodes.index(n), FoldRows(
        f"{n.name}/fold_rows", [x.name], [name], device="cpu", factor=s, top=top,
        bottom=bottom, fill=n.pad_value))
    tiles = len(conv_tiles(kh, kw * c, config.rows))
    n.inputs = [name] + n.inputs[1:]
    n.weight = folded
    n.strides = (1, n.strides[1])
    n.pads = (pt, n.pads[1], pb, n.pads[3])
    return (f"folded the rows of {x.name} by {s} into channels for {n.name}: "
            f"{len(conv_tiles(folded.shape[2], s * kw * c, config.rows))} reduction tiles "
            f"per column tile instead of {tiles}")


def _fold_kernel_rows(g: Graph, n: QConv, config: NPUConfig) -> str:
    """Fold every kernel row of ``n`` into channels: folded row ``r`` holds the
    ``KH`` padded rows ``r * s ..`` output row ``r`` reads."""
    x = g.tensors[n.inputs[0]]
    bn, c, h, w = x.shape
    oc, _, kh, kw = n.weight.shape
    s = n.strides[0]
    top, bottom = n.pads[0], _overlap_bottom(x.shape, n)
    folded = np.ascontiguousarray(
        n.weight.transpose(0, 2, 1, 3).reshape(oc, kh * c, 1, kw))
    rows = (top + h + bottom - kh) // s + 1
    name = g.add_tensor(Tensor(f"{x.name}/rows_folded", (bn, kh * c, rows, w), "int8",
                               quant=x.quant)).name
    g.nodes.insert(g.nodes.index(n), FoldRows(
        f"{n.name}/fold_rows", [x.name], [name], device="cpu", factor=kh, top=top,
        bottom=bottom, fill=n.pad_value, step=s))
    tiles = len(conv_tiles(kh, kw * c, config.rows))
    n.inputs = [name] + n.inputs[1:]
    n.weight = folded
    n.strides = (1, n.strides[1])
    n.pads = (0, n.pads[1], 0, n.pads[3])
    return (f"folded the rows of {x.name}, {kh} at a time {s} apart, into channels for "
            f"{n.name}: {_tiles(n, kh * c, config, 1)} reduction tiles per column tile "
            f"instead of {tiles}")
