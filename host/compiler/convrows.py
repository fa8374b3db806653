"""How a convolution's output pixels map onto GEMM rows.

A convolution runs, per group of output rows and per reduction tile (a kernel
row's chunk of ``KW * C`` window bytes), one ``wload`` and ``gemm`` rows that each
read one output pixel's window. Two mappings (:class:`ConvRows`):

* ``rows``: one ``gemm`` of ``OW`` rows per output row. Short GEMMs leave the
  array idle while the next ``wload`` waits for the rows before it to leave.
* ``long`` ("implicit GEMM over the padded width"): with the input's pad columns
  present, output pixel ``(r, c)`` reads its kernel-row window at byte
  ``x_step * r + sw * C * c``, so one ``gemm`` with ``cfg.gemm_stride = sw * C``
  covers a whole group of output rows, ``pitch = x_step / (sw * C)`` GEMM rows
  per output row. The ``pitch - OW`` rows at the end of each output row read
  across the row's end; their accumulator rows are never requantized.

A padded buffer the lowering fills itself (a "copied" input: loaded from DRAM
or copied on chip) shares one run of ``max(PL, PR)`` pad columns between the
right of a row and the left of the next, widens its rows to whole column
strides where needed, and with a row stride ``sh > 1`` may store its rows by
phase (``row % sh``: ``phases > 1``), so that one output row is one padded row
of its phase and ``pitch = Wp / sw`` instead of ``sh * Wp / sw`` (a streamed
image band too, when no pad rows lie above the image).

:func:`choose` keeps the mapping :func:`host.compiler.cost.conv_cycles` predicts
fastest.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from .cost import conv_cycles

GEMM_ROWS = 4096  # rows of one gemm


@dataclass(frozen=True)
class ConvRows:
    """One way to run a convolution's output rows on the array.

    Members
    -------
    kind : ``"rows"`` (a ``gemm`` per output row) or ``"long"`` (a ``gemm`` per
        group of output rows).
    wp : width of the padded input rows the code reads, in pixels (wider than the
        padding needs when a phased layout wants a multiple of the column stride).
    phases : input rows stored by phase of the row stride (1: in order).
    pitch : GEMM and accumulator rows from one output row to the next.
    per : output rows per group (the accumulators hold a group).
    skew : pixels from a padded row's start to the window of output column 0 (a
        copied input shares one run of pad columns between the right of a row and
        the left of the next: ``max(PL, PR)`` pixels, placed before each row).
    wide : the output rows are written ``pitch`` pixels apart, every accumulator
        row of a group requantized by one ``vreq`` (the pixels past a row's end
        land where the next row starts and are overwritten when it is stored:
        :meth:`out_pitch`); otherwise a ``vreq`` per output row writes them dense.
    """

    kind: str
    wp: int
    phases: int
    pitch: int
    per: int
    skew: int = 0
    wide: bool = False

    def gemm_rows(self, nr: int, ow: int) -> int:
        """Rows of each ``gemm`` (and accumulator rows) of a group of ``nr`` output rows."""
        return ow if self.kind == "rows" else (nr - 1) * self.pitch + ow

    def acc_rows(self, nr: int, ow: int) -> int:
        """Accumulator rows a group of ``nr`` output rows uses."""
        return nr * ow if self.kind == "rows" else self.gemm_rows(nr, ow)

    def split(self, nr: int, ow: int, oc: int, regs):
        """How a group's requantization drops the rows past each output row's end
        (``Lowering.requant_tile``'s ``split``; None when no row is dropped)."""
        if self.wide or self.acc_rows(nr, ow) == nr * ow:
            return None
        return nr, self.pitch, ow, ow * oc, regs

    def out_pitch(self, ow: int) -> int:
        """Output pixels from one output row to the next in the output buffer."""
        return self.pitch if self.wide else ow

    def out_bytes(self, oh: int, ow: int, oc: int) -> int:
        """Bytes of the output buffer of ``oh`` output rows."""
        return ((oh - 1) * self.out_pitch(ow) + ow) * oc

    def x_step(self, c: int, sh: int) -> int:
        """Input bytes from one output row's windows to the next's."""
        return self.wp * c * (sh if self.phases == 1 else 1)

    def phase_rows(self, hp: int, sh: int) -> int:
        """Padded rows per phase (all of them when not phased)."""
        return hp if self.phases == 1 else -(-hp // sh)

    def kernel_row_at(self, kr: int, c: int, hp: int, sh: int) -> int:
        """Byte offset of kernel row ``kr``'s window of output row 0, from the buffer's start."""
        if self.phases == 1:
            return kr * self.wp * c
        phase, row = kr % sh, kr // sh
        return (phase * self.phase_rows(hp, sh) + row) * self.wp * c


def groups(oh: int, per: int) -> list[tuple[int, int]]:
    """(first output row, rows) of balanced groups of at most ``per`` rows."""
    count = -(-oh // per)
    base, extra = divmod(oh, count)
    out, r0 = [], 0
    for g in range(count):
        nr = base + (g < extra)
        out.append((r0, nr))
        r0 += nr
    return out


def _per(pitch: int, ow: int, oh: int, acc_rows: int) -> int:
    """Output rows per group: ``(per - 1) * pitch + ow`` accumulator rows fit."""
    limit = min(acc_rows, GEMM_ROWS)
    if ow > limit:
        return 0
    return min(oh, (limit - ow) // pitch + 1)


def candidates(geom, acc_rows: int, copied: bool, phased: bool = True,
               wide: bool = False) -> list[ConvRows]:
    """Every mapping the geometry allows. ``geom`` = (C, OH, OW, KH, SH, SW, W, PL,
    PR); ``copied``: the lowering fills the input's padded buffer itself, so its
    rows share their pad columns and may be widened, and stored by phase when
    ``phased``; otherwise the rows are ``W + PL + PR`` pixels wide. ``wide``: the
    output goes straight to DRAM, so long mappings write it at their pitch
    (:attr:`ConvRows.wide`)."""
    c, oh, ow, kh, sh, sw, w, pl, pr = geom
    wp, skew = (w + max(pl, pr), max(pl, pr) - pl) if copied else (w + pl + pr, 0)
    out = []
    per = _per(ow, ow, oh, acc_rows)
    if per:
        out.append(ConvRows("rows", wp, 1, ow, per, skew))
    # A copied input's rows may be widened so that a row holds whole column strides.
    unit = sw // gcd(sh, sw) if copied else 1
    wl = -(-wp // unit) * unit
    if (sh * wl) % sw == 0:
        pitch = sh * wl // sw
        per = _per(pitch, ow, oh, acc_rows)
        if per:
            out.append(ConvRows("long", wl, 1, pitch, per, skew, wide and pitch > ow))
    if copied and phased and sh > 1:
        wq = -(-wp // sw) * sw
        pitch = wq // sw
        per = _per(pitch, ow, oh, acc_rows)
        if per:
            out.append(ConvRows("long", wq, sh, pitch, per, skew, wide and pitch > ow))
    return out


def plan(m: ConvRows, sizes, ow: int) -> list[tuple]:
    """:func:`host.compiler.cost.conv_cycles`'s plan of mapping ``m`` for groups of
    ``sizes`` output rows."""
    out = []
    for nr in sizes:
        if m.kind == "rows":
            out.append((ow, nr, nr * ow, 1, nr * ow))
        else:
            rows = m.gemm_rows(nr, ow)
            vreqs = 1 if m.pitch == ow or m.wide else nr
            out.append((rows, 1, rows, vreqs, nr * ow))
    return out


def predict(m: ConvRows, geom, tiles: int, oc: int, config, copy_bytes: int = 0) -> float:
    """Predicted cycles of mapping ``m`` (:func:`host.compiler.cost.conv_cycles`)."""
    oh, ow = geom[1], geom[2]
    plain = geom[6] + geom[7] + geom[8]  # W + PL + PR: the rows as they come
    return conv_cycles(config, plan(m, [nr for _, nr in groups(oh, m.per)], ow), tiles, oc,
                       copy_bytes if m.phases > 1 or m.wp != plain else 0)


def choose(geom, tiles: int, oc: int, config, copied: bool, phased: bool = True,
           copy_bytes: int = 0, wide: bool = False) -> ConvRows | None:
    """The mapping with the fewest predicted cycles (None when no output row fits
    the accumulators). ``tiles``: reduction tiles per output-column tile;
    ``copy_bytes``: bytes a layout by phase or of widened rows copies that the
    rows as they come do not need; ``wide``: as :func:`candidates`."""
    options = candidates(geom, config.acc_rows, copied, phased, wide)
    if not options:
        return None
    return min(options, key=lambda m: predict(m, geom, tiles, oc, config, copy_bytes))
