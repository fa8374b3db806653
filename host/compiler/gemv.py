"""GEMV: a one-row GEMM with its input stationary in the array and its weights streaming.

At batch 1 the GEMM mapping of :mod:`.lower` (weights stationary, activation rows
streaming) uses each ``rows x cols`` weight tile for one ``gemm`` row: the array
waits for weight reloads and takes weights slower than the bus brings them. The
GEMV mapping turns the product around. For each reduction chunk ``c`` (``rows``
inputs), ``wload`` makes ``x[c*rows : +rows]`` a ``rows x 1`` column of the array,
and one ``gemm`` streams the chunk's transposed weights through it: row ``i`` is
``W[c*rows : +rows, i]``, so output ``i`` accumulates in accumulator row ``i``,
column 0, at one weight row (``rows`` bytes: the bus word on the default build) a
cycle. ``vreqb`` then adds each row's own bias and requantizes the column into
contiguous int8 bytes, the next layer's input as it is.

Outputs go in *blocks* of at most :data:`BLOCK_OUTPUTS` (and the accumulator
rows): every chunk of a block, then its ``vreqb``, then the next block on the same
accumulator rows. A block's ``vreqb`` then overlaps the loads of the next block,
and only the last block's waits at the end of the layer.

The blob (:class:`GemvBlob`) holds per block its chunks in reduction order (each
``nb x k`` int8, dense: a ``gemm`` reads it with its default row stride), then
its int32 biases. Weights that are resident stay in the weights partition; the
others stream in steps of whole chunks through three buffers
(:func:`emit_streamed`); a block's biases come with its last step.

The mapping needs one requantization for every output (``vreqb`` multiplies
by column: per-channel scales keep the GEMM mapping) and a single row; the
compiler takes it where its estimate (:func:`gemv_cycles` against
:func:`tiled_cycles`) is the smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware.config import NPUConfig

from ..ir import QGemm
from .lower import (
    ALIGN,
    MAX_ROW_BYTES,
    MAX_ROWS,
    P_WORK,
    Blob,
    CompileError,
    TooBig,
    align,
    ceil_div,
    gemm_tiles,
)

GEMM_OFF_LIMIT = 1 << 16  # the gemm's immediate offset field
WLOAD_OFF_LIMIT = 1 << 8  # the wload's
UNROLL = 4  # chunks per loop pass where the weights are on chip whole
STEP_BYTES = 1024  # weight bytes per streamed step (at least one chunk)
BLOCK_OUTPUTS = 320  # outputs per block
BUFFERS = 3  # a step's buffer is released at its last gemm's end, two steps ahead


@dataclass
class GemvBlob(Blob):
    """A GEMV blob: ``tiles[(b, c)]`` is chunk ``c`` of output block ``b``
    (``nb x k_c``), ``bias[b]`` the block's ``nb`` int32 biases (absent without
    bias); :attr:`chunks` the ``(start, k_c)`` reduction chunks, :attr:`blocks` the
    ``(first output, nb)`` blocks."""

    chunks: tuple = ()
    blocks: tuple = ()

    def block_end(self, b: int) -> int:
        """Where block ``b``'s bytes (chunks, then biases) end."""
        nb = self.blocks[b][1]
        if self.bias:
            return self.bias[b] + 4 * nb
        return self.tiles[(b, len(self.chunks) - 1)] + nb * self.chunks[-1][1]


def tiled_cycles(k: int, nn: int, m: int, config: NPUConfig) -> int:
    """Array-side estimate of the GEMM mapping: a weight tile per ``gemm`` of ``m``
    rows, a bank refilled only once the rows of the gemm two tiles back left the
    array (``m + rows + cols`` and the pipeline's few cycles, over two banks), and
    a bias and a requantization per column tile."""
    tiles = ceil_div(k, config.rows) * ceil_div(nn, config.cols)
    per_tile = max(m + config.rows, (m + config.rows + config.cols + 8) // 2)
    return tiles * per_tile + ceil_div(nn, config.cols) * (m + 26)


def output_blocks(nn: int, config: NPUConfig, most: int | None = None) -> tuple:
    """``(first output, nb)`` of each block: equal blocks of at most ``most``
    (default :data:`BLOCK_OUTPUTS`) outputs and the accumulator rows."""
    cap = min(most or BLOCK_OUTPUTS, config.acc_rows, (GEMM_OFF_LIMIT - 1) // config.rows)
    count = ceil_div(nn, cap)
    nb = ceil_div(nn, count)
    return tuple((o0, min(nb, nn - o0)) for o0 in range(0, nn, nb))


def gemv_cycles(k: int, nn: int, config: NPUConfig) -> int:
    """Array-side estimate of the GEMV mapping: per chunk and block, its weight rows
    and the ``rows`` reads of its ``wload`` (taken from the streaming ``gemm``); a
    ``vreqb`` per block, a row a cycle."""
    blocks = output_blocks(nn, config)
    return ceil_div(k, config.rows) * (nn + len(blocks) * config.rows) + nn + 14 * len(blocks)


def takes_gemv(n: QGemm, rows: int, config: NPUConfig) -> bool:
    """Whether node ``n`` (``rows`` activation rows) runs as a GEMV."""
    if rows != 1 or n.weight.ndim != 2 or n.requant is None or n.requant.per_channel:
        return False
    k, nn = n.weight.shape
    return gemv_cycles(k, nn, config) < tiled_cycles(k, nn, 1, config)


def gemv_blob(n: QGemm, config: NPUConfig, perm, block_outputs: int | None = None
              ) -> GemvBlob:
    """Pack ``n``'s weights (reduction rows permuted by ``perm``) as transposed chunks,
    block by block (blocks of at most ``block_outputs``: :func:`output_blocks`)."""
    w = n.weight if perm is None else n.weight[perm, :]
    k, nn = w.shape
    chunks = tuple(gemm_tiles(k, config.rows))
    blocks = output_blocks(nn, config, block_outputs)
    parts, tiles, bias, at = [], {}, {}, 0

    def put(raw: bytes):
        nonlocal at
        parts.append(raw)
        at += len(raw)

    for b, (o0, nb) in enumerate(blocks):
        for c, (r0, kc) in enumerate(chunks):
            tiles[(b, c)] = at
            put(np.ascontiguousarray(w[r0:r0 + kc, o0:o0 + nb].T, dtype=np.int8).tobytes())
        put(b"\0" * (align(at, 4) - at))
        if n.bias is not None:
            bias[b] = at
            put(np.asarray(n.bias[o0:o0 + nb], dtype="<i4").tobytes())
    data = b"".join(parts)
    rows = max(1, ceil_div(len(data), MAX_ROW_BYTES))
    if rows > MAX_ROWS:
        raise CompileError(f"{len(data)} bytes of constants exceed one DMA transfer "
                           f"({MAX_ROWS} x {MAX_ROW_BYTES})", n.name)
    row_bytes = ceil_div(len(data), rows)
    data += b"\0" * (rows * row_bytes - len(data))
    return GemvBlob(n.name, data, rows, row_bytes, tiles, bias, chunks=chunks, blocks=blocks)


class _Chunks:
    """Emits the ``wload``/``gemm`` pairs of a run of chunks of one block: the weights
    of chunk ``i`` of the run at ``wreg + i*nb*rows`` in ``part``, its inputs at
    ``xreg + i*rows``; and a block's ``vreqb``."""

    def __init__(self, low, blob: GemvBlob, part: str):
        self.e, self.blob, self.part = low.e, blob, part
        self.rows = low.config.rows

    def emit(self, b: int, first: int, count: int, wreg: str, xreg: str, push: str = ""):
        """``push``: a token the last ``gemm`` sends (its reads of the run are done)."""
        e, blob = self.e, self.blob
        nb = blob.blocks[b][1]
        base = blob.tiles[(b, first)]
        for i in range(count):
            c = first + i
            kc = blob.chunks[c][1]
            woff = blob.tiles[(b, c)] - base
            xoff = blob.chunks[c][0] - blob.chunks[first][0]
            e.compute(f"wload {P_WORK}, {xreg}, {kc}, 1, off={xoff}")
            mode = "overwrite" if c == 0 else "accumulate"
            e.compute(f"gemm.{mode} {self.part}, {wreg}, r0, {nb}, swap=1, off={woff}",
                      push=push if i == count - 1 else "")

    def per_pass(self, limit: int) -> int:
        """Chunks one run may cover with immediate offsets (at most ``limit``)."""
        nb, r = self.blob.blocks[0][1], self.rows
        return max(1, min(limit, (WLOAD_OFF_LIMIT - 1) // r + 1,
                          (GEMM_OFF_LIMIT - 1) // (nb * r) + 1))

    def finish(self, b: int, y: str, bias_reg: str, push: str = ""):
        """Block ``b``'s biases and requantization: its accumulator rows to int8 at ``y``."""
        nb = self.blob.blocks[b][1]
        if self.blob.bias:
            self.e.compute(f"vreqb {P_WORK}, {y}, r0, {nb}, 1, {self.part}, {bias_reg}",
                           push=push)
        else:
            self.e.compute(f"vreq {P_WORK}, {y}, r0, {nb}, 1", push=push)


def _prepare(low, n: QGemm):
    """cfg for a GEMV: dense chunk rows, one-byte output rows, the requantization."""
    e = low.e
    if e.cfg.get("gemm_stride") != 0:
        e.set_cfg("gemm_stride", 0)
    if e.cfg.get("out_stride") not in (0, 1):
        e.set_cfg("out_stride", 1)
    low._requant_cfg(n.requant)


def lower_whole(low, n: QGemm) -> int:
    """A GEMV whose blob is on chip (resident, or loaded whole by the unit)."""
    e = low.e
    _prepare(low, n)
    part, wsp, blob = low._weights(n)
    x_off, y_off = low.at(n.inputs[0]), low.out(n.outputs[0])
    wreg, xreg, yreg, breg = e.scratch(4)
    runner = _Chunks(low, blob, part)
    for b, (o0, _) in enumerate(blob.blocks):
        e.op(f"li {wreg}, {wsp + blob.tiles[(b, 0)]}")
        e.op(f"li {xreg}, {x_off}")
        _block_chunks(low, runner, b, wreg, xreg)
        e.op(f"li {yreg}, {y_off + o0}")
        if blob.bias:
            e.op(f"li {breg}, {wsp + blob.bias[b]}")
        runner.finish(b, yreg, breg)
    return int(np.prod(n.weight.shape))


def _block_chunks(low, runner: _Chunks, b: int, wreg: str, xreg: str):
    """Every chunk of block ``b`` from the blob on chip (registers at its chunk 0):
    the first alone (it overwrites), the full ones :data:`UNROLL` a loop pass."""
    e, blob, r = low.e, runner.blob, low.config.rows
    nb, total = blob.blocks[b][1], len(blob.chunks)
    u = runner.per_pass(UNROLL)
    full = sum(kc == r for _, kc in blob.chunks[1:])  # only the last may be partial
    passes = full // u if full >= 2 * u else 0
    at = 0  # the chunk the registers point at

    def move_to(c: int):
        nonlocal at
        if c != at:
            e.op(f"addi {wreg}, {wreg}, {blob.tiles[(b, c)] - blob.tiles[(b, at)]}")
            e.op(f"addi {xreg}, {xreg}, {blob.chunks[c][0] - blob.chunks[at][0]}")
            at = c

    runner.emit(b, 0, 1, wreg, xreg)
    c = 1
    if passes:
        move_to(1)
        end = e.new_label("chunks")
        e.op(f"loop {passes}, {end}")
        runner.emit(b, 1, u, wreg, xreg)
        e.op(f"addi {wreg}, {wreg}, {u * nb * r}")
        e.op(f"addi {xreg}, {xreg}, {u * r}")
        e.loop_end(end)
        c = at = 1 + passes * u
    while c < total:
        step = min(u, total - c)
        move_to(c)
        runner.emit(b, c, step, wreg, xreg)
        c += step


@dataclass(frozen=True)
class _Step:
    block: int
    first: int  # chunk
    count: int
    start: int  # blob offset
    size: int  # bytes of its transfer (the block's biases too, when it is its last)


def _steps(blob: GemvBlob, g: int) -> list[_Step]:
    total, out = len(blob.chunks), []
    for b in range(len(blob.blocks)):
        for c0 in range(0, total, g):
            cnt = min(g, total - c0)
            start = blob.tiles[(b, c0)]
            end = blob.tiles[(b, c0 + cnt)] if c0 + cnt < total else blob.block_end(b)
            out.append(_Step(b, c0, cnt, start, end - start))
    return out


def emit_streamed(low, u, n: QGemm) -> dict:
    """Unit ``u`` of one GEMV whose weights are not resident: the chunks stream in
    steps through :data:`BUFFERS` buffers (the variant's ``buffers``) while the
    array works on earlier steps.

    A step's buffer is free once its last ``gemm`` has completed (results in the
    accumulators, ``nb + rows + cols`` cycles after its first row), so with two
    buffers the load two steps ahead would wait for that and the bus would idle
    between steps; a third buffer keeps the load queue busy. Program order: the
    loads of steps 0..2, then per step ``s``: its compute (the last ``gemm``, or
    the block's ``vreqb`` when it reads biases from the buffer, releases the
    buffer), the load of step ``s + 3`` into it. Runs of steps whose code is the
    same become one hardware loop of three steps a pass (one per buffer).
    """
    from .stream import _Stats, pipe_regs, transfers  # stream imports lower

    e, cfg = low.e, low.config
    buffers = low.variant.buffers or BUFFERS  # steps in flight: the prefetch depth
    blob: GemvBlob = low.place.blobs[n.name]
    k, nn = n.weight.shape
    x, y = low.root(n.inputs[0]), low.root(n.outputs[0])
    work = e.work.snapshot()
    low._reset()
    runner = _Chunks(low, blob, P_WORK)
    chunk_bytes = blob.blocks[0][1] * cfg.rows
    total = len(blob.chunks)
    try:
        x_off, y_off = low.out(x), low.out(y)
        room = (low.work_limit() - low._top) // buffers // ALIGN * ALIGN
        step_bytes = low.variant.step_bytes or STEP_BYTES
        g = runner.per_pass(max(1, min(step_bytes // chunk_bytes,
                                       (room - 4 * blob.blocks[0][1]) // chunk_bytes,
                                       ceil_div(total, 4))))
        steps = _steps(blob, g)
        size = align(max(s.size for s in steps), 4)
        bufs = [low.alloc(size, f"weight buffer {i} of {n.name}") for i in range(buffers)]
    except TooBig as err:
        raise CompileError(f"{err} (a GEMV streams whole reduction chunks of "
                           f"{chunk_bytes} bytes through {buffers} buffers)") from None
    count = len(steps)
    low._begin(u, f" (GEMV, streamed weights: {count} steps of {g} chunks, "
                  f"{len(blob.blocks)} output blocks)")
    *bregs, ldram, xreg = pipe_regs(e, buffers + 2, n.name)
    low._load_tensor(x, "")
    for r, at in zip(bregs, bufs, strict=True):
        e.op(f"li {r}, {at}")
    e.op(f"addi {ldram}, r1, {blob.dram}")
    e.op(f"li {xreg}, {x_off}")

    def load(s, pop):
        st = steps[s]
        for i, (off, rows, row) in enumerate(transfers(st.size)):
            d, src = bregs[s % buffers], ldram
            if off:
                d, src = e.scratch(2)
                e.op(f"addi {d}, {bregs[s % buffers]}, {off}")
                e.op(f"addi {src}, {ldram}, {off}")
            last = off + rows * row == st.size
            e.op(f"load {P_WORK}, {d}, {src}, r0, {rows}, {row}",
                 pop=pop if i == 0 else "", push="next" if last else "", queue="load")
        if s + 1 < count:
            e.op(f"addi {ldram}, {ldram}, {steps[s + 1].start - st.start}")

    def block_last(s):
        return steps[s].first + steps[s].count == total

    def x_step(s):
        return (blob.chunks[steps[s + 1].first][0] - blob.chunks[steps[s].first][0]
                if s + 1 < count else 0)

    def step(s):
        st, buf = steps[s], bregs[s % buffers]
        ahead = s + buffers < count
        release = "prev" if ahead else ""
        e.pop_next_compute("prev")
        biased = block_last(s) and blob.bias
        runner.emit(st.block, st.first, st.count, buf, xreg, "" if biased else release)
        if block_last(s):
            yreg, breg = e.scratch(2)
            e.op(f"li {yreg}, {y_off + blob.blocks[st.block][0]}")
            if blob.bias:
                e.op(f"addi {breg}, {buf}, {blob.bias[st.block] - st.start}")
            # The vreqb reads the biases in the buffer: it releases the buffer.
            runner.finish(st.block, yreg, breg, release if biased else "")
        if ahead:
            load(s + buffers, "next")
        if x_step(s):
            e.op(f"addi {xreg}, {xreg}, {x_step(s)}")

    def signature(s):
        """What step ``s``'s code depends on besides its buffer, or None when it
        cannot share a loop body (first or last of its block, partial, no load
        after it)."""
        st = steps[s]
        if st.first == 0 or block_last(s) or st.count != g or s + buffers >= count:
            return None
        nxt = steps[s + buffers]
        adv = steps[s + buffers + 1].start - nxt.start if s + buffers + 1 < count else 0
        return (blob.blocks[st.block][1], st.size, nxt.size, adv, x_step(s))

    for s in range(min(buffers, count)):
        load(s, "")
    _prepare(low, n)  # dispatched while the first loads run
    sigs = [signature(s) for s in range(count)]
    s = 0
    while s < count:
        run = 0
        while sigs[s] is not None and s + run < count and sigs[s + run] == sigs[s]:
            run += 1
        passes = run // buffers  # a pass covers one step per buffer: the same code each pass
        if passes >= 2:
            e.forget()  # the body's code must not rely on what the first pass set
            end = e.new_label("steps")
            e.op(f"loop {passes}, {end}")
            for i in range(buffers):
                step(s + i)
            e.loop_end(end)
            s += passes * buffers
            continue
        step(s)
        s += 1
    e.push_after_last_compute("next")
    low._store_tensor(y)
    e.op(f"region.end {u.id}")
    return _Stats(k * nn, count).finish(low, e, work)
