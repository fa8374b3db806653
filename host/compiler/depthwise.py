"""Grouped and depthwise convolution, average pooling: channel-diagonal GEMMs.

A depthwise output channel reads one input channel, so no activation is shared
between output columns and a dense weight tile has nothing to multiply. The
array still streams a channels-last pixel (``cols`` channels, one row) per cycle:
with the weight tile ``diag(w[c0:c0+cols, tap])`` each column multiplies its own
channel, and ``gemm.accumulate`` over the kernel taps sums the window in the
accumulators. That uses ``1/cols`` of the array's MACs (one MAC per column per
cycle) and needs no ISA change; bias and requantization are those of a
convolution.

Code, per group of output rows that fits the accumulators::

    loop channel groups                  ; weights, input and output step by cols
      loop kernel rows, loop kernel columns
        wload diag(w[group, tap])        ; overlaps the previous tap's GEMMs
        loop output rows
          gemm OW pixels                 ; cfg.gemm_stride = stride * C
      vbias, vreq                        ; all rows of the group, cfg.out_stride = C

so the program is O(1) in the image and channel sizes. Average pooling is the
same with identity weights loaded once per group (the taps share them), a bias
of ``-zero_point * count`` and ``1/count`` folded into the requantization
multiplier. Global average pooling (one output pixel) streams every pixel's
channel groups as rows of one GEMM (``cfg.gemm_stride = cols``), accumulating
pixel after pixel in a hardware loop.

Other grouped convolutions (several channels per group) run as the dense
convolution with block-diagonal weights: the array's columns then hold real
outputs, which beats a diagonal tile as soon as a group has more than one
channel; the MAC count reported is the grouped one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from firmware.config import NPUConfig
from firmware.isa import DW_BIAS_WINDOW, DW_KERNEL, DW_LOAD_WINDOWS, DW_PAD_WINDOW

from ..ir import QAvgPool, QConv
from .cost import VREQ_EXTRA
from .lower import MAX_ROW_BYTES, P_WORK, Blob, CompileError, _blob, ceil_div, conv_blob


def dense_equivalent(n: QConv) -> QConv:
    """The group-1 convolution with block-diagonal weights that computes ``n``."""
    oc, cg, kh, kw = n.weight.shape
    og = oc // n.group
    dense = np.zeros((oc, cg * n.group, kh, kw), dtype=n.weight.dtype)
    for g in range(n.group):
        dense[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = n.weight[g * og:(g + 1) * og]
    return dataclasses.replace(n, weight=dense, group=1)


def _diagonal_blob(name: str, taps: np.ndarray, bias, config: NPUConfig,
                   requant=None) -> Blob:
    """Pack per-channel tap weights ``taps`` (T, C) as diagonal tiles.

    Column tile ``j`` holds, for each tap ``t``, a ``cols x n_j`` tile whose first
    ``n_j`` rows are ``diag(taps[t, j*cols : j*cols + n_j])``: read as a dense
    ``n_j x n_j`` tile (``wload`` k = n = n_j) it is exactly the diagonal.
    """
    t, c = taps.shape
    cols = config.cols
    w2d = np.zeros((t * cols, c), dtype=np.int8)
    ch = np.arange(c)
    for tap in range(t):
        w2d[tap * cols + ch % cols, ch] = taps[tap]
    return _blob(name, w2d, [(tap * cols, cols) for tap in range(t)], bias, cols, requant)


def on_engine(n: QConv, config: NPUConfig) -> bool:
    """Whether the depthwise engine (``dwconv``) runs ``n``: a build with the engine,
    a kernel of at most 3x3, the same stride (1 or 2) on both axes, pads of at most
    2."""
    _, _, kh, kw = n.weight.shape
    sh, sw = n.strides
    return (n.is_depthwise and config.dw_rows > 0 and kh <= DW_KERNEL and kw <= DW_KERNEL
            and sh == sw and sh in (1, 2) and max(n.pads) < DW_KERNEL)


def _engine_blob(n: QConv, config: NPUConfig) -> Blob:
    """Per channel group: its ``dwload`` windows (tap ``3i + 3-kw+c`` of lane ``j``
    at byte ``tap * cols + j``: the kernel right-aligned in the 3x3 frame; the pad
    value; the biases, which the engine adds itself), then its requantization
    entries."""
    oc, _, kh, kw = n.weight.shape
    cols = config.cols
    groups = ceil_div(oc, cols)
    taps = np.zeros((DW_LOAD_WINDOWS, groups * cols), dtype=np.int8)
    for i in range(kh):
        for c in range(kw):
            taps[i * DW_KERNEL + DW_KERNEL - kw + c, :oc] = n.weight[:, 0, i, c]
    taps[DW_PAD_WINDOW, ::cols] = n.pad_value  # the input zero point, around the image
    bias = np.zeros(groups * cols, dtype="<i4")
    if n.bias is not None:
        bias[:oc] = n.bias
    # each group's biases: its 4*cols bytes as 4 windows of cols bytes
    raw = bias.view(np.int8).reshape(groups, 4, cols)
    taps[DW_BIAS_WINDOW:] = raw.transpose(1, 0, 2).reshape(4, groups * cols)
    return _blob(n.name, taps, [(0, DW_LOAD_WINDOWS)], None, cols, n.requant)


def grouped_blob(n: QConv, config: NPUConfig) -> Blob:
    """Constants of a grouped convolution in the order its code reads them."""
    if not n.is_depthwise:
        return conv_blob(dense_equivalent(n), config)
    if on_engine(n, config):
        return _engine_blob(n, config)
    oc, _, kh, kw = n.weight.shape
    bias = n.bias if n.bias is not None and n.bias.any() else None  # no vbias for zeros
    return _diagonal_blob(n.name, n.weight.reshape(oc, kh * kw).T, bias, config, n.requant)


def avgpool_blob(n: QAvgPool, channels: int, config: NPUConfig) -> Blob:
    """The identity tiles every channel group shares (column tile 0 for full groups,
    the next for a partial last one) and the bias ``-zero_point * count`` (none for
    a zero point of 0): the constants do not grow with the channels."""
    kh, kw = n.kernel
    cols = config.cols
    widths = ([cols] if channels >= cols else []) + ([channels % cols] if channels % cols else [])
    ones = np.ones((1, sum(widths)), dtype=np.int8)
    bias = np.full(sum(widths), -n.zero_point * kh * kw, dtype=np.int32) \
        if n.zero_point else None
    return _diagonal_blob(n.name, ones, bias, config)



# ---- code --------------------------------------------------------------------------------


def lower_grouped(low, n: QConv) -> int:
    """Emit a grouped convolution; return its MAC count."""
    if not n.is_depthwise:
        return low.qconv(dense_equivalent(n)) // n.group
    if on_engine(n, low.config):
        return _engine_conv(low, n)
    return _windowed(low, n, n.weight.shape[2:], n.strides, n.pads, n.pad_value, n.requant,
                     shared=False)


def lower_avgpool(low, n: QAvgPool) -> int:
    """Emit an average pooling; return its MAC count (window additions)."""
    bn, c, h, w = low.tensor[n.inputs[0]].shape
    _, _, oh, ow = low.tensor[n.outputs[0]].shape
    if (oh, ow) == (1, 1) and not any(n.pads):
        return _global(low, n)
    return _windowed(low, n, n.kernel, n.strides, n.pads, n.zero_point, n.requant,
                     shared=True)


def _groups(e, c: int, cols: int, body, step):
    """``body(n_j)`` for each channel group (full groups in a loop), ``step()`` between."""
    full, rem = divmod(c, cols)
    if full >= 2:
        end = e.new_label("groups")
        e.op(f"loop {full}, {end}")
        body(cols)
        step()
        e.loop_end(end)
    elif full == 1:
        body(cols)
        if rem:
            step()
    if rem:
        body(rem)


def _windowed(low, n, kernel, strides, pads, fill: int, requant, *, shared: bool) -> int:
    """Depthwise window sums (``shared``: one weight tile for every tap)."""
    cfg, e = low.config, low.e
    bn, c, h, w = low.tensor[n.inputs[0]].shape
    _, _, oh, ow = low.tensor[n.outputs[0]].shape
    (kh, kw), (sh, sw) = kernel, strides
    low._need_nhwc(n, n.inputs[0])
    xp, hp, wp = low._padded(n, n.inputs[0], (bn, h, w, c), pads, fill)
    y = low.out(n.outputs[0])
    part, wsp, blob = low._weights(n)
    rows = min(cfg.acc_rows, 4096)  # accumulator rows one vreq can cover
    if ow > rows:
        raise CompileError(f"an output row of {ow} positions exceeds the {rows} "
                           "accumulator rows one vreq covers", n.name)
    e.set_cfg("gemm_stride", sw * c)
    e.set_cfg("out_stride", c)
    low._requant_cfg(requant)
    wj, xj, yj, wt, xt, acc = e.scratch(6)
    tile = cfg.cols  # rows of every tap tile (cols x n_j, its first n_j rows the diagonal)
    row_step = sh * wp * c  # input bytes between output rows
    per = min(oh, rows // ow)
    # Column tile of a partial last group: after one tile per full group, or after
    # the one tile all full groups share (average pooling's identity).
    last = (1 if c >= cfg.cols else 0) if shared else c // cfg.cols
    for b in range(bn):
        for r0 in range(0, oh, per):
            nr = min(per, oh - r0)
            e.comment(f"{n.name}: image {b}, output rows {r0}..{r0 + nr - 1}")
            e.op(f"li {wj}, {wsp + blob.tiles[(0, 0)]}")
            e.op(f"li {xj}, {xp + (b * hp + r0 * sh) * wp * c}")
            e.op(f"li {yj}, {y + (b * oh + r0) * ow * c}")

            def group(n_j, nr=nr):
                if shared and n_j != cfg.cols:  # the partial group's own identity tile
                    e.op(f"li {wj}, {wsp + blob.tiles[(last, 0)]}")
                e.op(f"addi {wt}, {wj}, 0")
                e.op(f"addi {xt}, {xj}, 0")
                if shared:
                    e.compute(f"wload {part}, {wt}, {n_j}, {n_j}")

                back = (nr - 1) * row_step  # the rows loop leaves xt on the last row

                def tap(mode: str, first: bool, x_next: int):
                    """One tap: its weights, its GEMM on every output row, then the
                    step to the next tap (a loop body never ends on an inner loop)."""
                    if not shared:
                        e.compute(f"wload {part}, {wt}, {n_j}, {n_j}")
                    e.op(f"li {acc}, 0")
                    swap = 1 if first or not shared else 0
                    e.compute(f"gemm.{mode} {P_WORK}, {xt}, {acc}, {ow}, swap={swap}")

                    def next_row():
                        e.op(f"addi {xt}, {xt}, {row_step}")
                        e.op(f"addi {acc}, {acc}, {ow}")
                        e.compute(f"gemm.{mode} {P_WORK}, {xt}, {acc}, {ow}, swap=0")
                    e.repeat(nr - 1, next_row)
                    e.op(f"addi {xt}, {xt}, {x_next - back}")
                    if not shared:
                        e.op(f"addi {wt}, {wt}, {tile * n_j}")

                along, down = c, (wp - kw + 1) * c  # to the next tap in the row, row below

                def kernel_row(first: bool):
                    tap("overwrite" if first else "accumulate", first, along if kw > 1 else down)
                    e.repeat(kw - 2, lambda: tap("accumulate", False, along))
                    if kw > 1:
                        tap("accumulate", False, down)
                kernel_row(True)
                e.repeat(kh - 1, lambda: kernel_row(False))
                low.requant_tile(part, blob, 0 if n_j == cfg.cols else last, wj, "r0",
                                 nr * ow, n_j, yj)

            def step():
                if not shared:
                    e.op(f"addi {wj}, {wj}, {blob.j_stride()}")
                e.op(f"addi {xj}, {xj}, {cfg.cols}")
                e.op(f"addi {yj}, {yj}, {cfg.cols}")
            _groups(e, c, cfg.cols, group, step)
    return bn * oh * ow * c * kh * kw


def _engine_conv(low, n: QConv) -> int:
    """A depthwise convolution on the depthwise engine, its tensors whole in the
    working partition (the engine pads: no padded copy): the output rows in passes
    that fit the accumulator."""
    cfg = low.config
    bn, c, h, w = low.tensor[n.inputs[0]].shape
    _, _, oh, ow = low.tensor[n.outputs[0]].shape
    _, _, kh, kw = n.weight.shape
    low._need_nhwc(n, n.inputs[0])
    x, y = low.at(n.inputs[0]), low.out(n.outputs[0])
    part, wsp, blob = low._weights(n)
    per = min(oh, cfg.acc_rows // ow)  # output rows per pass through the accumulator
    # An input written at a long convolution's pitch (low._wide) is read as it is.
    pitch = low._wide.get(low.root(n.inputs[0]), (0, w * c))[1]
    for b in range(bn):
        for r0 in range(0, oh, per):
            nr = min(per, oh - r0)
            low.e.comment(f"{n.name}: image {b}, output rows {r0}..{r0 + nr - 1}")
            engine_rows(low, n, part, wsp, blob, x + b * h * pitch, pitch, h, r0, nr,
                        y + (b * oh + r0) * ow * c, n.pads, width=w)
    return bn * oh * ow * c * kh * kw


DWLOAD_CYCLES = 18  # a dwload's 14 tap windows and its latency (docs/isa.md)
DWCONV_EXTRA = 6  # a dwconv beyond its window reads and rows: latency, handoff


def engine_rows_cycles(config: NPUConfig, n: QConv, nr: int, ow: int) -> float:
    """Predicted cycles of :func:`engine_rows` for ``nr`` output rows of ``ow``
    pixels: per channel group its dwload and strips, and its requantization,
    which runs beside the next group's depthwise passes where the groups take
    turns (:func:`turns`)."""
    _, _, kh, kw = n.weight.shape
    s = n.strides[0]
    groups = ceil_div(n.weight.shape[0], config.cols)
    tallest = (config.dw_rows - kh) // s + 1
    engine = DWLOAD_CYCLES + sum(((hh - 1) * s + kh) * ((ow - 1) * s + kw) + hh + DWCONV_EXTRA
                                 for hh in _strips(nr, tallest))
    vreq = nr * ow + VREQ_EXTRA
    if not turns(config, groups, nr * ow):
        return groups * (engine + vreq)
    return groups * engine + vreq + (groups - 1) * max(0, vreq - engine)


def turns(config: NPUConfig, groups: int, rows: int) -> bool:
    """Whether :func:`engine_rows`' channel groups of ``rows`` accumulator rows
    take turns on two halves of the accumulator (two read ports: a group's
    depthwise passes run beside the requantization of the group before)."""
    return config.acc_ports == 2 and groups > 1 and 2 * rows <= config.acc_rows


def _strips(nr: int, tallest: int) -> list[int]:
    """Heights of the dwconv strips of ``nr`` output rows: at most ``tallest`` each,
    one where that holds them all (each strip reads ``kh - s`` rows of the one
    before again), else the first and last apart (so that the code does not depend
    on the image's height), the middle ones equal."""
    if nr <= tallest:
        return [nr]
    count = max(2, ceil_div(nr, tallest))
    while True:
        hs = ceil_div(nr, count)
        if nr - (count - 1) * hs >= 1:
            return [hs] * (count - 1) + [nr - (count - 1) * hs]
        count += 1


def engine_rows(low, n: QConv, part: str, wsp: int, blob: Blob, x, row_bytes: int,
                h_in: int, r0: int, nr: int, y, pads=(0, 0, 0, 0), width: int = 0):
    """Output rows ``r0 .. r0+nr-1`` of the depthwise convolution ``n`` on the
    depthwise engine: per channel group its taps, pad value and biases, strips of
    output rows (as many as the engine's rows allow; the engine reads the pad value
    around the input and adds the biases), then the requantization of every row of
    the group. Where two groups' rows fit the accumulator, the groups take turns
    on two halves of it, so that a group's depthwise passes run beside the
    requantization of the group before (two accumulator read ports).

    ``x`` is input row 0 (``h_in`` rows ``row_bytes`` apart, of ``width`` pixels:
    by default all of them), ``y`` output row ``r0`` (dense): offsets in the
    working partition, or ``(register, offset)``. ``pads`` (top, left, bottom,
    right) are the convolution's, around those ``h_in`` rows.
    """
    cfg, e = low.config, low.e
    _, c, _, w = low.tensor[n.inputs[0]].shape
    _, _, _, ow = low.tensor[n.outputs[0]].shape
    _, _, kh, kw = n.weight.shape
    s = n.strides[0]
    if nr * ow > cfg.acc_rows:
        raise CompileError(f"{nr} output rows of {ow} positions exceed the "
                           f"{cfg.acc_rows} accumulator rows", n.name)
    pad_t, pad_l = pads[0], pads[1]
    cols_in = (ow - 1) * s + kw
    pr = max(0, cols_in - pad_l - (width or row_bytes // c))  # pad columns it reaches
    e.set_cfg("gemm_stride", c)  # pixel to pixel
    e.set_cfg("in_stride", row_bytes)  # row to row
    e.set_cfg("out_stride", c)
    low._requant_cfg(n.requant)
    wj, xj, yj, xt, at, ab = e.scratch(6)
    e.point(xj, x)
    e.point(yj, y)
    e.op(f"li {wj}, {wsp + blob.tiles[(0, 0)]}")
    # the group's first accumulator row: 0, or taking turns, the other half's
    alternate = turns(cfg, ceil_div(c, cfg.cols), nr * ow)
    half = cfg.acc_rows // 2
    if alternate:
        e.op(f"li {ab}, 0")
    else:
        ab = "r0"
    heights = _strips(nr, (cfg.dw_rows - kh) // s + 1)
    strips, at_row = [], r0
    for hh in heights:  # (height, input offset, accumulator row, pt, pb) of each
        start = at_row * s - pad_t  # the input row of the window's first row
        end = start + (hh - 1) * s + kh
        strips.append((hh, max(0, start) * row_bytes, (at_row - r0) * ow,
                       max(0, -start), max(0, end - h_in)))
        at_row += hh
    middle = strips[1:-1]
    if any(st[3] or st[4] for st in middle):
        raise CompileError(f"the input padding reaches past the first and last strips of "
                           f"{nr} output rows", n.name)
    last_j = c // cfg.cols  # column tile of a partial last group

    def group(n_j):
        e.compute(f"dwload {part}, {wj}")

        def strip(hh, pt, pb):
            e.compute(f"dwconv.overwrite {P_WORK}, {xt}, {at}, {ow}, {hh}, {s}, {kh}, {kw}, "
                      f"{n_j}, pt={pt}, pb={pb}, pl={pad_l}, pr={pr}")

        for st in (strips[:1] if len(strips) > 1 else strips):
            e.op(f"addi {xt}, {xj}, {st[1]}")
            e.op(f"addi {at}, {ab}, {st[2]}")
            strip(st[0], st[3], st[4])
        if len(strips) > 1:
            hs = heights[1] if middle else 1
            first = middle[0] if middle else strips[-1]
            e.op(f"addi {xt}, {xj}, {first[1]}")
            e.op(f"addi {at}, {ab}, {first[2]}")
            end = e.new_label("strips")  # (a loop even for none: code of one size)
            e.op(f"loop {len(middle)}, {end}")
            strip(hs, 0, 0)
            e.op(f"addi {xt}, {xt}, {hs * s * row_bytes}")
            e.op(f"addi {at}, {at}, {hs * ow}")
            e.loop_end(end)
            last = strips[-1]  # where the loop leaves xt and at
            strip(last[0], last[3], last[4])
        low.requant_tile(part, blob, 0 if n_j == cfg.cols else last_j, wj, ab,
                         nr * ow, n_j, yj)

    def step():
        if alternate:
            e.op(f"li {xt}, {half}")
            e.op(f"sub {ab}, {xt}, {ab}")
        e.op(f"addi {wj}, {wj}, {blob.j_stride()}")
        e.op(f"addi {xj}, {xj}, {cfg.cols}")
        e.op(f"addi {yj}, {yj}, {cfg.cols}")
    _groups(e, c, cfg.cols, group, step)


def _global(low, n: QAvgPool) -> int:
    """One window over the whole output (global pooling, or a kernel that leaves the
    last rows or columns out): per pixel of the window, one GEMM row per channel
    group, accumulating in a hardware loop."""
    cfg, e = low.config, low.e
    bn, c, h, w = low.tensor[n.inputs[0]].shape
    kh, kw = n.kernel
    low._need_nhwc(n, n.inputs[0])
    x, y = low.at(n.inputs[0]), low.out(n.outputs[0])
    part, wsp, blob = low._weights(n)
    full, rem = divmod(c, cfg.cols)
    if full > cfg.acc_rows:
        raise CompileError(f"{full} channel groups exceed the {cfg.acc_rows} accumulator "
                           "rows", n.name)
    if c > MAX_ROW_BYTES:
        raise CompileError(f"{c} channels exceed a vector row", n.name)
    low._requant_cfg(n.requant)
    e.set_cfg("gemm_stride", cfg.cols)
    e.set_cfg("out_stride", cfg.cols)
    wt, xt, yt = e.scratch(3)
    # (column tile of the blob, first channel, group width, groups): the full groups
    # share tile 0, a partial last group has the next.
    passes = [p for p in ((0, 0, cfg.cols, full), (1 if full else 0, full * cfg.cols, rem, 1))
              if p[2] and p[3]]
    if kw == w:  # whole rows: the window's pixels are contiguous
        kh, kw = 1, kh * kw
    along, down = c, (w - kw + 1) * c  # to the next pixel in the row, the row below
    for b in range(bn):
        for j0, c0, k, m in passes:
            e.op(f"li {wt}, {wsp + blob.tiles[(j0, 0)]}")
            e.op(f"li {xt}, {x + b * h * w * c + c0}")
            e.op(f"li {yt}, {y + b * c + c0}")
            e.compute(f"wload {part}, {wt}, {k}, {k}")

            def pixel(step: int, mode="accumulate", swap=0, m=m):
                e.compute(f"gemm.{mode} {P_WORK}, {xt}, r0, {m}, swap={swap}")
                e.op(f"addi {xt}, {xt}, {step}")  # after: a loop never ends on a loop

            def window_row(first: bool):
                if first:
                    pixel(along if kw > 1 else down, "overwrite", 1)
                else:
                    pixel(along if kw > 1 else down)
                e.repeat(kw - 2, lambda: pixel(along))
                if kw > 1:
                    pixel(down)
            window_row(True)
            e.repeat(kh - 1, lambda: window_row(False))
            low.requant_tile(part, blob, j0, wt, "r0", m, k, yt)
    return bn * kh * kw * c
