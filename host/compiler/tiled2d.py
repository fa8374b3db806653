"""Convolutions that stream their image and their weights together.

A convolution whose padded image does not fit the working partition beside its
weights, and whose weights do not fit beside a band of its image, runs in
*weight groups* x *image bands*: an outer hardware loop over groups of
output-column tiles loads one group's weights (their reduction tiles, biases and
requantization table: one contiguous piece of the blob) into a weight buffer,
then streams the whole image through two band buffers, a band of output rows
with its input halo per step (:func:`.stream.pipeline`, the uniform bands in a
hardware loop). Each band computes the group's output channels of its rows and
stores them into the output's channel slice (a DRAM stride of the output's
channels per pixel). The program is O(1) in the layer's size: two nested loops
of the same code whatever the image height and the channel count.

The image is read once per weight group and the weights once (not built: the
other order, each band loaded once and the weights re-read per band). Bands are
as tall as the room left beside one group's weights allows; which group size
and which mapping of a band's rows is fastest the cost model says
(:func:`.stream.fastest` over the candidates :func:`ways` lists).

Tokens per group (the outer loop body is balanced, so it loops): the group's
weight load pops a compute-to-load token from the previous group's last compute
(every read of the weight and band buffers done; a marker before the loop
primes the first, a one-byte load after it takes the last) and rides with band
0's load token; the bands' tokens are those of :func:`.stream.pipeline`, with
the first two bands' store tokens from two one-byte stores the real stores
overwrite.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import QConv
from .convrows import ConvRows, candidates
from .depthwise import on_engine
from .lower import (
    MAX_ROW_BYTES,
    MAX_ROWS,
    P_WORK,
    CompileError,
    TooBig,
    align,
    ceil_div,
    conv_tiles,
)
from .stream import (
    _Stats,
    column_pieces,
    fill_rows,
    pipe_regs,
    pipeline,
    refill_pad_columns,
    transfers,
)


def ways(low, u, n: QConv) -> list:
    """Emitters of ``n`` streamed both ways, one per weight-group size (a divisor of
    the output-column tiles) and mapping of a band's rows (the fastest, and the
    compact one), for :func:`.stream.fastest`; a size that leaves no room for a
    band refuses before it emits anything."""
    if n.group != 1 and (not n.is_depthwise or on_engine(n, low.config)):
        return []
    cols = low.config.cols
    oc = n.weight.shape[0]
    ncol = ceil_div(oc, cols)
    sizes = [g for g in range(ncol, 0, -1) if ncol % g == 0]
    return [ConvTiles(low, u, n, g, compact).emit for compact in (False, True)
            for g in sizes]


@dataclass
class _Plan:
    """Where a :class:`ConvTiles` stream keeps what, and how it steps.

    Members
    -------
    rows : the mapping of a band's output rows (:class:`~.convrows.ConvRows`).
    row0 : buffer offset of band row 0 (the pad fix-up starts a row above it).
    lead : pixels before a padded row's first real one.
    groups, gc : weight groups, output channels of each.
    part, wbuf : where a group's weights are (a buffer, or resident in ``p0``).
    wfirst : the first group's offset in the blob.
    wbytes, wstep : bytes of one group's weights, and from one group's to the next's.
    steps, rb, hb : bands, output rows and input rows of a full band.
    inb : offset of a band's output within its buffer set.
    sets : the two buffer sets (input band, then output band).
    """

    rows: ConvRows
    row0: int
    lead: int
    groups: int
    gc: int
    part: str
    wbuf: int
    wfirst: int
    wbytes: int
    wstep: int
    steps: int
    rb: int
    hb: int
    inb: int
    sets: list


class ConvTiles:
    """A convolution run as groups of ``g`` output-column tiles x bands of output
    rows (see the module docstring). ``compact``: a band's rows as one ``gemm`` per
    reduction tile, which loops the reduction (a shorter program); else the
    mapping :mod:`.convrows` predicts fastest (a ``gemm`` per output row unrolls
    the reduction: the loops nest too deep otherwise)."""

    def __init__(self, low, u, n: QConv, g: int, compact: bool):
        self.low, self.u, self.n, self.g, self.compact = low, u, n, g, compact
        self.e, self.cfg = low.e, low.config
        self.blob = low.place.blobs[n.name]
        self.diagonal = n.group != 1  # depthwise: channel-diagonal weight tiles
        _, self.c, self.h, self.w = low.tensor[n.inputs[0]].shape
        _, self.oc, self.oh, self.ow = low.tensor[n.outputs[0]].shape

    def emit(self) -> dict:
        low, e, n = self.low, self.e, self.n
        x, y = low.root(n.inputs[0]), low.root(n.outputs[0])
        work = e.work.snapshot()
        low._reset()
        p = self._plan()
        low._begin(self.u, f" (streamed image and weights: {p.groups} weight "
                           f"group{'s' if p.groups > 1 else ''} of {p.gc} output channels x "
                           f"{p.steps} bands of {p.rb} output rows)")
        # The reduction loops over a kernel row's full tiles with one more register
        # (within the loop depth: weight groups, bands, column tiles, reduction).
        kw = n.weight.shape[3]
        loops = kw * self.c >= 8 * self.cfg.rows and not self.diagonal \
            and (p.rows.kind == "long" or p.groups == 1)
        # A depthwise group reads its own input channels: one more register steps them.
        chans = self.diagonal and p.groups > 1
        regs = pipe_regs(e, 6 if loops or chans else 5, n.name)
        self.regs = dict(zip(("ibuf", "isum", "ldram", "sdram", "wdram"), regs, strict=False))
        self.xq = regs[5] if loops else None
        self.chan = regs[5] if chans else None
        if self.chan:
            e.op(f"li {self.chan}, 0")
        e.op(f"addi {self.regs['sdram']}, r2, {low.place.arena[y]}")
        e.op(f"addi {self.regs['wdram']}, r1, {self.blob.dram + p.wfirst}")
        if p.groups > 1:
            e.marker(push="prev")  # the first group's weight load pops it
            end = e.new_label("wgroups")
            e.op(f"loop {p.groups}, {end}")
            self._group(p, x)
            e.loop_end(end)
            # The last group's token: a one-byte load after every compute.
            t = e.scratch(1)[0]
            e.op(f"li {t}, {p.wbuf}")
            e.op(f"load {P_WORK}, {t}, r1, r0, 1, 1", pop="next", queue="load")
        else:
            self._group(p, x)
        e.op(f"region.end {self.u.id}")
        kh, kw = n.weight.shape[2:]
        macs = self.oh * self.ow * self.oc * kh * kw * (1 if self.diagonal else self.c)
        return _Stats(macs, p.steps * p.groups).finish(low, e, work)

    def _plan(self) -> _Plan:
        """The stream's layout in the working partition; raise ``CompileError`` when
        it does not fit or is not built."""
        low, cfg, n, g, blob = self.low, self.cfg, self.n, self.g, self.blob
        c, w, oc, oh, ow = self.c, self.w, self.oc, self.oh, self.ow
        kh, kw = n.weight.shape[2:]
        sh = n.strides[0]
        pl = n.pads[1]
        if low.tensor[n.inputs[0]].shape[0] != 1:
            raise CompileError("a batch of images (not built: streaming batches)")
        ncol = ceil_div(oc, cfg.cols)
        if blob.slot and (g < ncol or not self.diagonal):
            raise CompileError("its weights are resident (the image streams alone)")
        if oc % cfg.cols and (g < ncol or self.diagonal):
            raise CompileError(f"{oc} output channels are not whole column tiles "
                               "(not built: a partial last weight group)")
        groups, gc = ncol // g, min(oc, g * cfg.cols)
        low._need_nhwc(n, n.inputs[0])
        rows = None if self.diagonal else low.conv_rows(n, copied=True, phased=False)
        if not self.compact and (rows is None or rows.kind == "long"):
            raise CompileError("the other mapping of its rows is the same")
        if self.compact:
            rows = self._long_rows(c, oh, ow, kh, w)
        wp, lead = rows.wp, pl + rows.skew
        row0 = (wp - w - lead) * c
        if wp * c > MAX_ROW_BYTES or ow * oc > MAX_ROW_BYTES:
            raise CompileError(f"padded input rows of {wp * c} bytes or output rows of "
                               f"{ow * oc} bytes exceed one DMA row ({MAX_ROW_BYTES})")
        red = [(t * cfg.cols, cfg.cols) for t in range(kh * kw)] if self.diagonal else \
            conv_tiles(kh, kw * c, cfg.rows)
        pieces = column_pieces(blob, ncol, oc, red, g, cfg.cols)
        wbytes = pieces[0][3]
        if any(piece[3] != wbytes for piece in pieces):
            raise CompileError("weight groups of different sizes (not built)")
        wstep = pieces[1][2] - pieces[0][2] if groups > 1 else 0
        try:
            # Resident weights stay in their partition (one group: no weight loads).
            part, wbuf = low._place_blob(blob) if blob.slot else \
                (P_WORK, low.alloc(wbytes, f"weight buffer of {n.name}"))
        except TooBig as err:
            raise CompileError(str(err)) from None
        room = low.work_limit() - low._top
        # A group's output band is one DMA transfer: ow * oc bytes a row when the
        # group is every channel, else a gc-byte row per pixel (at most MAX_ROWS).
        sliced = gc < oc

        def set_bytes(r):  # one buffer set: a band of input rows and its output
            hb = (r - 1) * sh + kh
            return align(row0 + hb * wp * c + lead * c) + align(r * ow * gc)

        fits = [r for r in range(1, min(oh, rows.per, MAX_ROWS) + 1)
                if 2 * set_bytes(r) <= room and (r - 1) * sh + kh <= MAX_ROWS
                and (not sliced or r * ow <= MAX_ROWS)]
        if not fits:
            raise CompileError(f"one output row of {n.name} with {gc} output channels needs "
                               f"{2 * set_bytes(1)} bytes of scratchpad (double-buffered) "
                               f"beside {wbytes} bytes of weights, {max(0, room)} are left")
        steps = ceil_div(oh, max(fits))
        rb = ceil_div(oh, steps)  # bands as equal as they can be
        hb = (rb - 1) * sh + kh
        inb = align(row0 + hb * wp * c + lead * c)
        sets = [low.alloc(set_bytes(rb), f"band buffers {i} of {n.name}") for i in range(2)]
        p = _Plan(rows, row0, lead, groups, gc, part, wbuf, pieces[0][2], wbytes, wstep,
                  steps, rb, hb, inb, sets)
        if any(self._band(p, s)[1] > self._band(p, s)[0] for s in range(2, steps)):
            raise CompileError(f"top padding of {n.pads[0]} rows spans more than two bands")
        return p

    def _band(self, p: _Plan, s: int):
        """Band ``s``: (input row at its row 0, first and end real input rows, output
        rows)."""
        nominal = s * p.rb * self.n.strides[0] - self.n.pads[0]
        lo, hi = max(0, nominal), min(self.h, nominal + p.hb)
        return nominal, lo, hi, min(p.rb, self.oh - s * p.rb)

    def _group(self, p: _Plan, x: str):
        """One weight group: its weights, then the image in bands (:func:`pipeline`)."""
        e, r, wp = self.e, self.regs, p.rows.wp
        e.forget()  # a loop body: nothing known from the pass before
        e.op(f"li {r['ibuf']}, {p.sets[0]}")
        e.op(f"li {r['isum']}, {p.sets[0] + p.sets[1]}")
        e.op(f"addi {r['ldram']}, r2, {self.low.place.arena[x] - self.n.pads[0] * self.w * self.c}")
        primed = p.steps >= 3  # every compute pops its output buffer's store token
        if primed:  # the first two computes' store tokens
            t = e.scratch(1)[0]
            for i in range(2):
                e.op(f"li {t}, {p.sets[i] + p.inb}")
                e.op(f"store {P_WORK}, {t}, {r['sdram']}, r0, 1, 1", push="prev",
                     queue="store")
        for s in range(min(2, p.steps)):  # pad rows above the image
            nominal, lo, _, _ = self._band(p, s)
            if lo > nominal:
                self._fill(e.reg(p.sets[s] + p.row0), lo - nominal, wp * self.c)

        def uniform_load(s):
            nominal, lo, hi, _ = self._band(p, s)
            return lo == nominal and hi == nominal + p.hb and (hi < self.h or wp == self.w)

        def same(s):
            nominal, _, hi, nr = self._band(p, s)
            return nr == p.rb and hi == nominal + p.hb and uniform_load(s + 2) \
                and (primed or s >= 2)

        pipeline(e, p.steps, lambda s, pop: self._load(p, s, pop),
                 lambda s, push: self._compute(p, s, push, primed),
                 lambda: e.op(f"sub {r['ibuf']}, {r['isum']}, {r['ibuf']}"),
                 lambda: e.op(f"addi {r['sdram']}, {r['sdram']}, "
                              f"{p.rb * self.ow * self.oc}"), same)
        if p.groups > 1:  # the next group's weight load waits for this group's reads
            e.push_after_last_compute("prev")
            e.op(f"addi {r['sdram']}, {r['sdram']}, "
                 f"{p.gc - (p.steps - 1) * p.rb * self.ow * self.oc}")
            e.op(f"addi {r['wdram']}, {r['wdram']}, {p.wstep}")
            if self.chan:
                e.op(f"addi {self.chan}, {self.chan}, {p.gc}")

    def _load(self, p: _Plan, s: int, pop: str):
        """Band ``s``'s input rows (after the group's weights for band 0); the last
        transfer pushes the token its compute pops."""
        e, r, c, h, w = self.e, self.regs, self.c, self.h, self.w
        wp = p.rows.wp
        if s == 0 and self.blob.slot:  # a tag hit after the first run
            self.low._load_blob(self.blob, "")
        elif s == 0:  # the group's weights, ready with band 0
            for i, (off, count, nbytes) in enumerate(transfers(p.wbytes)):
                t1, t2 = e.scratch(2)
                e.op(f"li {t1}, {p.wbuf + off}")
                e.op(f"addi {t2}, {r['wdram']}, {off}")
                e.op(f"load {P_WORK}, {t1}, {t2}, r0, {count}, {nbytes}",
                     pop="next" if i == 0 and p.groups > 1 else "", queue="load")
        nominal, lo, hi, _ = self._band(p, s)
        wide_hi = hi if (hi < h or wp == w) else hi - 1
        parts = []
        if wide_hi > lo:
            parts.append((lo, wide_hi - lo, wp * c))
        if wide_hi < hi:
            parts.append((hi - 1, 1, w * c))
        for i, (row, count, nbytes) in enumerate(parts):
            d_off = p.row0 + (row - nominal) * wp * c + p.lead * c
            s_off = (row - nominal) * w * c
            t1, t2, t3 = e.scratch(3)
            e.op(f"addi {t1}, {r['ibuf']}, {d_off}")
            src = r["ldram"]
            if s_off:
                e.op(f"addi {t2}, {r['ldram']}, {s_off}")
                src = t2
            strd = "r0"
            if count > 1 and nbytes != w * c:
                e.op(f"li {t3}, {w * c}")
                strd = t3
            e.op(f"load {P_WORK}, {t1}, {src}, {strd}, {count}, {nbytes}",
                 pop=pop if i == 0 else "", push="next" if i == len(parts) - 1 else "",
                 queue="load")
        e.op(f"addi {r['ldram']}, {r['ldram']}, {p.rb * self.n.strides[0] * w * c}")

    def _compute(self, p: _Plan, s: int, push: bool, primed: bool):
        """Band ``s``'s output rows of the group's channels, and their store."""
        e, n, r, c, ow, oc = self.e, self.n, self.regs, self.c, self.ow, self.oc
        wp, ibuf, fill = p.rows.wp, r["ibuf"], n.pad_value
        nominal, lo, hi, nr = self._band(p, s)
        e.pop_next_compute("prev")
        if primed or s >= 2:
            e.pop_next_compute("next")
        if hi < nominal + p.hb:  # pad rows below the image
            t = e.scratch(1)[0]
            e.op(f"addi {t}, {ibuf}, {p.row0 + (hi - nominal) * wp * c}")
            self._fill(t, nominal + p.hb - hi, wp * c)
        refill_pad_columns(e, ibuf, p.hb + 1, self.w, wp, c, fill)
        e.set_cfg("gemm_stride", n.strides[1] * c)
        e.set_cfg("out_stride", p.gc)
        self.low._requant_cfg(n.requant)
        x_at, y_at = (ibuf, p.row0 + p.rows.skew * c), (ibuf, p.inb)
        if self.diagonal:
            self._diagonal(p.rows, (p.part, p.wbuf), self.blob, x_at, y_at, nr, p.gc,
                           self.chan)
        else:
            wo, xo, ao, *regs = e.scratch(6)
            chain = self.low.conv_chain(n, p.part, p.rows, p.hb, nr, ow, x_at,
                                        (wo, xo, ao), self.xq)
            self.low._column_tiles(n, p.part, p.wbuf, self.blob, p.gc,
                                   p.rows.acc_rows(nr, ow), y_at, chain, regs,
                                   split=p.rows.split(nr, ow, p.gc, (xo, ao)))
        e.marker(push="prev,next" if push else "next")
        t1, t2 = e.scratch(2)
        e.op(f"addi {t1}, {ibuf}, {p.inb}")
        if p.gc < oc:  # the group's channel slice: a row of gc bytes per pixel
            e.op(f"li {t2}, {oc}")
            shape = f"{t2}, {nr * ow}, {p.gc}"
        else:
            shape = f"r0, {nr}, {ow * oc}"
        e.op(f"store {P_WORK}, {t1}, {r['sdram']}, {shape}", pop="prev",
             push="prev" if s + 2 < p.steps else "", queue="store")

    def _long_rows(self, c, oh, ow, kh, w) -> ConvRows:
        """A band's rows as one ``gemm`` per reduction tile over the padded width
        (:mod:`.convrows`, "long")."""
        sh, sw = self.n.strides
        pl, pr = self.n.pads[1], self.n.pads[3]
        longs = [m for m in candidates((c, oh, ow, kh, sh, sw, w, pl, pr),
                                       self.cfg.acc_rows, True, False) if m.kind == "long"]
        if not longs:
            raise CompileError(f"an output row of {ow} positions exceeds the "
                               f"{self.cfg.acc_rows} accumulator rows", self.n.name)
        return longs[0]

    def _diagonal(self, rows: ConvRows, weights, blob, x_at, y_at, nr: int, gc: int,
                  chan: str | None):
        """A band's ``nr`` output rows of the group's ``gc`` channels, one channel
        tile after the other (a hardware loop): per kernel tap a diagonal
        ``wload`` and one ``gemm`` over every output row (``cfg.gemm_stride`` steps
        the window), then bias and requantization of the rows' real positions.
        ``weights``: (partition, offset) of the group's weight tiles; ``chan``: the
        register holding the group's first input channel (None: channel 0)."""
        e, cfg, n = self.e, self.cfg, self.n
        c = self.low.tensor[n.inputs[0]].shape[1]
        _, _, kh, kw = n.weight.shape
        ow = self.low.tensor[n.outputs[0]].shape[3]
        cols, sh = cfg.cols, n.strides[0]
        m = rows.gemm_rows(nr, ow)
        part, wbuf = weights
        wj, xj, yj, wt, ra, ry = e.scratch(6)
        e.op(f"li {wj}, {wbuf}")
        e.point(xj, x_at)
        if chan:
            e.op(f"add {xj}, {xj}, {chan}")
        e.point(yj, y_at)

        def tile():
            e.op(f"addi {wt}, {wj}, 0")
            for t in range(kh * kw):
                ky, kx = divmod(t, kw)
                e.compute(f"wload {part}, {wt}, {cols}, {cols}")
                mode = "accumulate" if t else "overwrite"
                off = rows.kernel_row_at(ky, c, 0, sh) + kx * c
                e.compute(f"gemm.{mode} {P_WORK}, {xj}, r0, {m}, swap=1, off={off}")
                if t + 1 < kh * kw:
                    e.op(f"addi {wt}, {wt}, {cols * cols}")
            split = rows.split(nr, ow, gc, (ra, ry))
            self.low.requant_tile(part, blob, 0, wj, "r0", m, cols, yj, split)

        def step():
            e.op(f"addi {wj}, {wj}, {blob.j_stride()}")
            e.op(f"addi {xj}, {xj}, {cols}")
            e.op(f"addi {yj}, {yj}, {cols}")

        count = gc // cols
        if count >= 2:
            end = e.new_label("chans")
            e.op(f"loop {count}, {end}")
            tile()
            step()
            e.loop_end(end)
        else:
            tile()

    def _fill(self, reg: str, rows: int, row_bytes: int):
        """Write the pad value over ``rows`` dense rows of ``row_bytes`` at ``reg``."""
        fill_rows(self.e, reg, rows, row_bytes, self.n.pad_value)

