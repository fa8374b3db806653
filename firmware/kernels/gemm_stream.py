"""Kernel template: a tiled int8 GEMM that streams A and B from DRAM.

``C = requant(A @ B)`` with ``A`` (M x K), ``B`` (K x N) and ``C`` (M x N) int8,
row-major and dense in DRAM. :func:`gemm_stream` returns the assembly and the
partition table; the program needs no arguments (addresses are immediates).

Tiling (``R x Cc`` is the array, rows x cols)
---------------------------------------------
* An *m-block* of ``mb`` rows of A is what one ``gemm`` streams against one
  ``R x Cc`` weight tile: every weight tile is loaded into the array once per
  m-block, so a long ``mb`` keeps the array streaming (a ``wload`` costs ``R``
  scratchpad cycles that the streaming gemm loses).
* A *group* is ``ng`` adjacent n-tiles of one m-block; their ``ng * mb``
  accumulator rows stay in the accumulator for the whole K reduction, then four
  ``vreq`` write the int8 block into the scratchpad and one ``store`` moves it out.
  The B columns of a group (``K x ng*Cc``, one dense ``K x Cc`` panel per n-tile,
  i.e. ``K / R`` stacked weight tiles) are loaded once per group.
* A *chunk* is ``kc`` k-tiles of the m-block's A rows (``mb x kc*R`` bytes);
  the group's gemms run chunk by chunk.

Overlap: A chunks and B groups are double-buffered in the scratchpad; the load
of the next chunk (and of the next group's B) is issued one step ahead of the
compute that needs it, and dependency tokens order everything: a load pushes
"data ready" to compute, compute pushes "buffer free" back (the last gemm of a
chunk frees its A buffer, the last wload of a group its B buffer, except in the
last-but-one group, since the last group loads no B; ``cfg`` instructions at the
start push the initial credits, one for the second A buffer and, when there is more
than one group, one for the second B buffer), the last ``vreq`` of a group
pushes to the store, and the store pushes "C buffer free" back (popped from the
third group on). In the array, each ``wload`` fills the shadow weights while the
previous ``gemm`` streams (``swap=1`` on every gemm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware import asm
from firmware.config import NPUConfig
from firmware.quant import requantize

__all__ = ["Requant", "Tiling", "GemmKernel", "choose_tiling", "gemm_stream", "reference"]

MAX_DMA_ROWS = 256  # rows of one load/store instruction
MAX_DMA_BYTES = 4096  # bytes per row of one load/store instruction
MAX_M = 4096  # rows of one gemm / vreq
ALIGN = 64  # partition bases and buffer sizes are kept to this granularity


@dataclass(frozen=True)
class Requant:
    """Requantization of the int32 accumulators to int8 (the ``vreq`` formula).

    ``y = clamp(qzp + rshift_rne(acc * qmul, qshift), clip_lo, clip_hi)``; see
    :func:`firmware.quant.requantize`.
    """

    qmul: int
    qshift: int
    qzp: int = 0
    clip_lo: int = -128
    clip_hi: int = 127


@dataclass(frozen=True)
class Tiling:
    """How the GEMM is cut: ``mb`` rows per gemm, ``ng`` n-tiles per group, ``kc``
    k-tiles per A chunk (see the module docstring)."""

    mb: int
    ng: int
    kc: int


@dataclass
class GemmKernel:
    """A generated GEMM program.

    Attributes
    ----------
    source : the assembly text.
    program : the assembled program.
    partitions : the partition table ``[(base, size), ...]`` (p0: A chunks,
        p1: B groups, p2: C blocks, each double-buffered).
    tiling : the tiling used.
    macs : ``M * K * N``.
    min_dram_bytes : the bytes any GEMM must move (A and B read once, C written once).
    dram_read_bytes, dram_write_bytes : what this program moves.
    """

    source: str
    program: asm.Program
    partitions: list
    tiling: Tiling
    macs: int
    min_dram_bytes: int
    dram_read_bytes: int
    dram_write_bytes: int


def _round_up(x: int, n: int) -> int:
    return -(-x // n) * n


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _buffers(config: NPUConfig, M: int, K: int, t: Tiling) -> tuple[int, int, int]:
    """Bytes of one A chunk, B group and C block buffer (rounded to ALIGN)."""
    R, C = config.rows, config.cols
    a = _round_up(t.mb * t.kc * R, ALIGN)
    b = _round_up(K * t.ng * C, ALIGN)
    c = _round_up(t.mb * t.ng * C, ALIGN)
    return a, b, c


def _fits(config: NPUConfig, M: int, K: int, N: int, t: Tiling) -> bool:
    R, C = config.rows, config.cols
    a, b, c = _buffers(config, M, K, t)
    return (M % t.mb == 0 and (K // R) % t.kc == 0 and (N // C) % t.ng == 0
            and t.mb <= min(MAX_M, config.acc_rows) and t.ng * t.mb <= config.acc_rows
            and t.kc * R <= MAX_DMA_BYTES and t.ng * C <= MAX_DMA_BYTES
            and 2 * (a + b + c) <= config.sp_bytes)


def choose_tiling(M: int, K: int, N: int, config: NPUConfig) -> Tiling:
    """The tiling :func:`gemm_stream` uses by default.

    Longest m-block first (it sets how long each weight tile streams), then the
    most n-tiles per group that fit the accumulator and scratchpad, then A chunks of
    up to ``4 * bus_bytes`` bytes per row (long DMA bursts, small buffers).
    Raises ``ValueError`` when nothing fits.
    """
    R, C = config.rows, config.cols
    kt, nt = K // R, N // C
    chunk_cap = max(1, (4 * config.bus_bytes) // R)
    for mb in _divisors_desc(M):
        for ng in _divisors_desc(nt):
            for kc in [d for d in _divisors_desc(kt) if d <= chunk_cap] or [1]:
                t = Tiling(mb, ng, kc)
                if _fits(config, M, K, N, t):
                    return t
    raise ValueError(f"no tiling of {M}x{K}x{N} fits {config}")


def reference(a: np.ndarray, b: np.ndarray, rq: Requant) -> np.ndarray:
    """What the kernel computes, in numpy: int32 (wrapping) ``a @ b``, requantized."""
    acc = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    return requantize(acc, rq.qmul, rq.qshift, rq.qzp, rq.clip_lo, rq.clip_hi)


class _Emitter:
    def __init__(self):
        self.lines: list[str] = []
        self.labels = 0

    def __call__(self, line: str):
        self.lines.append("    " + line)

    def label(self, name: str):
        self.lines.append(f"{name}:")

    def new_label(self, stem: str) -> str:
        self.labels += 1
        return f"{stem}{self.labels}"


def _tokens(*flags: str) -> str:
    flags = [f for f in flags if f]
    return "".join(", " + f for f in flags)


def gemm_stream(M: int, K: int, N: int, config: NPUConfig, requant: Requant,
                a_addr: int, b_addr: int, c_addr: int,
                tiling: Tiling | None = None) -> GemmKernel:
    """Generate the streaming GEMM ``C = requant(A @ B)`` for one configuration.

    Parameters
    ----------
    M, K, N : matrix sizes; ``K`` must be a multiple of the array rows and ``N`` of
        the array cols (pad otherwise).
    config : the NPU configuration.
    requant : the requantization of the int32 results.
    a_addr, b_addr, c_addr : DRAM byte addresses of A (M x K), B (K x N), C (M x N),
        row-major and dense.
    tiling : override :func:`choose_tiling` (tests use it to force several m-blocks).

    Raises
    ------
    ValueError
        For sizes the template does not handle, a tiling that does not fit, or a
        program longer than the instruction bank.
    """
    R, C = config.rows, config.cols
    for name, v in (("M", M), ("K", K), ("N", N)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    if K % R:
        raise ValueError(f"K={K} is not a multiple of the array rows ({R})")
    if N % C:
        raise ValueError(f"N={N} is not a multiple of the array cols ({C})")
    for name, v in (("a_addr", a_addr), ("b_addr", b_addr), ("c_addr", c_addr)):
        if not 0 <= v < 1 << 32:
            raise ValueError(f"{name}={v!r}: not a 32-bit DRAM address")
    t = tiling or choose_tiling(M, K, N, config)
    if not _fits(config, M, K, N, t):
        raise ValueError(f"tiling {t} does not fit {M}x{K}x{N} on {config}")

    kt, nt = K // R, N // C
    chunks = kt // t.kc  # chunks per group
    groups = nt // t.ng  # groups per m-block
    total = groups * (M // t.mb)  # groups in the whole program
    abuf, bbuf, cbuf = _buffers(config, M, K, t)
    partitions = [(0, 2 * abuf), (2 * abuf, 2 * bbuf), (2 * (abuf + bbuf), 2 * cbuf)]
    arow = t.kc * R  # bytes per A chunk row
    crow = t.ng * C  # bytes per C block row
    e = _Emitter()

    # Registers. "next" = the group after the current one (the current one while
    # the prologue runs). r9..r15 are scratch.
    nA, nB, cC, nG, left, aD, aPar, bPar = (f"r{i}" for i in range(1, 9))
    wC, acc, tmp, sp, dram, stride, aC = (f"r{i}" for i in range(9, 16))

    def other_half(reg_par: str, size: int):
        """sp = (1 - par) * size: the buffer the next transfer fills."""
        e(f"li {sp}, {size}")
        e(f"mul {tmp}, {sp}, {reg_par}")
        e(f"sub {sp}, {sp}, {tmp}")

    def dma(op: str, part: int, rows: int, nbytes: int, src: str, row_stride: int,
            sp_row: int, first: str = "", last: str = ""):
        """load/store of ``rows`` rows (split at MAX_DMA_ROWS) between p``part``
        at ``sp`` and DRAM at ``src`` with row stride ``row_stride``."""
        e(f"li {stride}, {row_stride}")
        pieces = range(0, rows, MAX_DMA_ROWS)
        for j, r0 in enumerate(pieces):
            n = min(MAX_DMA_ROWS, rows - r0)
            e(f"addi {dram}, {src}, {r0 * row_stride}")
            e(f"addi {tmp}, {sp}, {r0 * sp_row}")
            toks = _tokens(first if j == 0 else "", last if j == len(pieces) - 1 else "")
            e(f"{op} p{part}, {tmp}, {dram}, {stride}, {n}, {nbytes}{toks}")

    def load_a(src: str, pop: bool):
        other_half(aPar, abuf)
        dma("load", 0, t.mb, arow, src, K, arow, "pop=next" if pop else "", "push=next")

    def load_b(pop: bool, dst_other: bool):
        if dst_other:
            other_half(bPar, bbuf)
        else:
            e(f"li {sp}, 0")
        for n in range(t.ng):
            e(f"addi {aC}, {nB}, {n * C}")  # aC is free outside chunk code
            e(f"addi {sp}, {sp}, {n * K * C}" if n == 0 else f"addi {sp}, {sp}, {K * C}")
            dma("load", 1, K, C, aC, N, C, "pop=next" if pop and n == 0 else "")

    def chunk(first: bool, last: bool):
        """One A chunk: prefetch the next chunk, then every (n-tile, k-tile) gemm."""
        skip = None
        if last:  # the next chunk is the next group's first (if there is one)
            skip = e.new_label("nochunk")
            e(f"br.eq {left}, r0, {skip}")
            load_a(nA, pop=True)
        else:
            load_a(aD, pop=True)
            e(f"addi {aD}, {aD}, {arow}")
        if skip:
            e.label(skip)
        e(f"li {aC}, {abuf}")
        e(f"mul {aC}, {aC}, {aPar}")
        for n in range(t.ng):
            e(f"li {acc}, {n * t.mb}")
            e(f"addi {tmp}, {wC}, {n * K * C}")
            for k in range(t.kc):
                final = n == t.ng - 1 and k == t.kc - 1
                woff = k * R * C
                wreg = tmp
                if woff > 255:  # wload's immediate is 8 bits
                    e(f"addi {sp}, {tmp}, {woff}")
                    wreg, woff = sp, 0
                pop = "pop=prev" if n == 0 and k == 0 else ""
                if last and final and total > 1:
                    # Free the B buffer, except in the last-but-one group: the last
                    # group loads no B, and an unconsumed credit here would hand every
                    # later A-chunk load the credit of the buffer before its own.
                    keep, done = e.new_label("keep_b"), e.new_label("wl_done")
                    e(f"li {acc}, 1")
                    e(f"br.eq {left}, {acc}, {keep}")
                    e(f"wload p1, {wreg}, {R}, {C}, off={woff}{_tokens(pop, 'push=prev')}")
                    e(f"br.always r0, r0, {done}")
                    e.label(keep)
                    e(f"wload p1, {wreg}, {R}, {C}, off={woff}{_tokens(pop)}")
                    e.label(done)
                    e(f"li {acc}, {n * t.mb}")
                else:
                    e(f"wload p1, {wreg}, {R}, {C}, off={woff}{_tokens(pop)}")
                mode = "overwrite" if first and k == 0 else "accumulate"
                gt = _tokens("push=prev" if final else "")
                e(f"gemm.{mode} p0, {aC}, {acc}, {t.mb}, swap=1, off={k * R}{gt}")
        e(f"addi {wC}, {wC}, {t.kc * R * C}")
        e(f"cmp.eq {aPar}, {aPar}, r0")  # toggle

    # ---- prologue ------------------------------------------------------------------------
    # The initial "buffer free" credits: one for the second A buffer, and one for the
    # second B buffer when a later group loads B (a single group loads none: a credit
    # left for it would let the third A chunk overwrite the first before its gemms).
    e(f"cfg.gemm_stride {arow}, push=prev")
    e(f"cfg.out_stride {crow}{_tokens('push=prev' if total > 1 else '')}")
    e(f"cfg.qmul {requant.qmul}")
    e(f"cfg.qshift {requant.qshift}")
    e(f"cfg.qzp {requant.qzp}")
    e(f"cfg.clip_lo {requant.clip_lo}")
    e(f"cfg.clip_hi {requant.clip_hi}")
    e(f"li {nA}, {a_addr}")
    e(f"li {nB}, {b_addr}")
    e(f"li {cC}, {c_addr}")
    e(f"li {nG}, 0")
    e(f"li {left}, {total - 1}")
    e(f"li {aPar}, 1")  # so that load_a fills buffer 0
    e(f"li {bPar}, 0")
    load_b(pop=False, dst_other=False)
    load_a(nA, pop=False)
    e(f"li {aPar}, 0")

    # ---- one group per iteration ---------------------------------------------------------
    gend = e.new_label("groups_end")
    e(f"loop {total}, {gend}")
    e(f"addi {aD}, {nA}, {arow}")  # chunk 1 of this group
    same = e.new_label("same_mblock")
    e(f"addi {nG}, {nG}, 1")  # advance "next" to the following group
    e(f"addi {nB}, {nB}, {crow}")
    e(f"li {tmp}, {groups}")
    e(f"br.ne {nG}, {tmp}, {same}")
    e(f"li {nG}, 0")
    e(f"li {nB}, {b_addr}")
    e(f"addi {nA}, {nA}, {t.mb * K}")
    e.label(same)
    nob = e.new_label("nob")
    e(f"br.eq {left}, r0, {nob}")
    load_b(pop=True, dst_other=True)
    e.label(nob)
    e(f"li {wC}, {bbuf}")
    e(f"mul {wC}, {wC}, {bPar}")
    chunk(first=True, last=chunks == 1)
    if chunks > 2:
        cend = e.new_label("chunks_end")
        e(f"loop {chunks - 2}, {cend}")
        chunk(first=False, last=False)
        e.label(cend)
    if chunks > 1:
        chunk(first=False, last=True)
    # requantize the group into C buffer bPar, then store it
    e(f"li {sp}, {cbuf}")
    e(f"mul {sp}, {sp}, {bPar}")

    def vreq(n: int, toks: str):
        e(f"li {acc}, {n * t.mb}")
        e(f"vreq p2, {sp}, {acc}, {t.mb}, {C}, off={n * C}{toks}")

    push_last = "push=next"
    if total > 2:  # from the third group on, wait for the store of group - 2
        nopop, vdone = e.new_label("nopop"), e.new_label("vdone")
        e(f"li {tmp}, {total - 3}")
        e(f"br.ltu {tmp}, {left}, {nopop}")
        vreq(0, _tokens("pop=next", push_last if t.ng == 1 else ""))
        e(f"br.always r0, r0, {vdone}")
        e.label(nopop)
        vreq(0, _tokens(push_last if t.ng == 1 else ""))
        e.label(vdone)
    else:
        vreq(0, _tokens(push_last if t.ng == 1 else ""))
    for n in range(1, t.ng):
        vreq(n, _tokens(push_last if n == t.ng - 1 else ""))
    dma("store", 2, t.mb, crow, cC, N, crow, "pop=prev", "push=prev")
    nxt = e.new_label("same_row")
    e(f"addi {cC}, {cC}, {crow}")
    e(f"br.ne {nG}, r0, {nxt}")
    e(f"addi {cC}, {cC}, {t.mb * N - N}")
    e.label(nxt)
    e(f"cmp.eq {bPar}, {bPar}, r0")
    e(f"addi {left}, {left}, -1")
    e.label(gend)
    e("end")

    source = "\n".join(e.lines) + "\n"
    program = asm.assemble(source)
    if len(program) >= config.imem_depth:
        raise ValueError(f"the program has {len(program)} instructions; the bank holds "
                         f"{config.imem_depth} (choose a tiling with fewer k-tiles per chunk)")
    mblocks = M // t.mb
    return GemmKernel(
        source=source, program=program, partitions=partitions, tiling=t,
        macs=M * K * N, min_dram_bytes=M * K + K * N + M * N,
        dram_read_bytes=M * K * groups + K * N * mblocks, dram_write_bytes=M * N,
    )
