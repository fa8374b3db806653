"""Streaming lowering: units whose working set does not fit the scratchpad at once.

A unit of one GEMM or one convolution that neither fits whole nor splits into M
tiles (:mod:`.lower`) streams through the working partition in *steps*:

* a GEMM streams its weights: each step loads a group of output-column tiles
  (their reduction tiles and biases, contiguous in the blob) and computes those
  columns of every row; the activations stay on chip whole;
* a convolution streams its image: each step loads a band of input rows with
  the halo its kernel needs and computes a band of output rows, which leaves
  for DRAM while the next band computes; its weights load once (or are
  resident).

Steps are double-buffered and software-pipelined (:func:`pipeline`): the load of
step ``s + 2`` comes after the compute of step ``s`` in program order and writes
the buffer that compute has just released, so the load queue fetches ahead while
the array works. Steps whose code is the same (every step but those at the
image borders or a last, partial group) run in one hardware loop, so a layer's
program does not grow with its size. Dependency tokens are balanced inside the
loop body; the tokens the first passes pop come from the prologue.
"""

from __future__ import annotations

from dataclasses import dataclass

from firmware.isa import QTAB_ENTRY_BYTES

from ..ir import QAvgPool, QConv, QGemm
from . import convrows
from .cost import band_cycles
from .depthwise import engine_rows, on_engine
from .lower import (
    ALIGN,
    LOOP_TILES,
    MAX_ROW_BYTES,
    MAX_ROWS,
    P_WORK,
    PIPE_REGS,
    CompileError,
    TooBig,
    align,
    ceil_div,
    conv_tiles,
    gemm_tiles,
)
from .units import is_instruction
from .variants import refuse

STREAM_BYTES = 4096  # non-resident GEMM weights above this stream even when they fit
MORE_CONV_BANDS = 4  # band counts a dense convolution tries beyond the fewest that fit
TAPERS = (1, 2)  # first bands tried: as tall as the others (1), or 1 / taper of them


def free_pipe_regs(e) -> int:
    """How many of :data:`PIPE_REGS` the scalar results leave free."""
    return sum(r not in e.result_regs.values() for r in PIPE_REGS)


def pipe_regs(e, count: int, what: str) -> list[str]:
    free = [r for r in PIPE_REGS if r not in e.result_regs.values()]
    if len(free) < count:
        raise CompileError(f"{what}: streaming needs {count} free registers, "
                           f"{len(free)} are left besides the scalar results")
    for r in free[:count]:
        e.clobber(r)
    return free[:count]


def pipeline(e, n: int, load, compute, toggle, advance, same, same_tail=lambda s: False):
    """Emit ``n`` double-buffered steps.

    ``load(s, pop)`` emits step ``s``'s loads (the first pops ``pop``, the last
    pushes a token to compute); ``compute(s, push)`` emits its compute (the first
    instruction pops that token; with ``push`` the step ends by releasing its
    buffer to the load queue); ``toggle()`` switches the buffer register to the
    other buffer, ``advance()`` steps the compute's registers to the next step.
    ``same(s)`` says that step ``s``'s compute and step ``s + 2``'s load emit the
    code any other such step emits: runs of them become one hardware loop.
    ``same_tail(s)`` says the last two steps' computes (``s = n - 2``) emit the
    same code: they run in a loop of two.

    Program order: load 0, load 1, then per step ``s``: compute ``s``, load
    ``s + 2`` (which pops the token compute ``s`` pushed: it writes the buffer
    compute ``s`` read), toggle, advance. Every token pushed is popped.
    """
    load(0, "")
    if n > 1:
        toggle()
        load(1, "")
        toggle()
    # The longest run of steps that can share one loop body (each with a load after it).
    best, a = (0, 0), None
    for s in range(n - 1):
        ok = s + 2 < n and same(s)
        if ok and a is None:
            a = s
        if not ok and a is not None:
            best, a = max(best, (s - a, a)), None
    length, start = best
    s = 0
    while s < n:
        if s == start and length >= 2:
            s += _looped(e, length, lambda s=s: (compute(s, True), load(s + 2, "next")),
                         toggle, advance)
            continue
        if s == n - 2 and same_tail(s):
            _looped(e, 2, lambda s=s: compute(s, False), toggle, advance)
            break
        compute(s, s + 2 < n)
        if s + 2 < n:
            load(s + 2, "next")
        if s + 1 < n:
            toggle()
            advance()
        s += 1


def _looped(e, count: int, body, toggle, advance) -> int:
    """``count`` passes of ``body`` and the register steps in a hardware loop."""
    e.forget()  # the body's code must not rely on what the first pass set
    end = e.new_label("steps")
    e.op(f"loop {count}, {end}")
    body()
    toggle()
    advance()
    e.loop_end(end)
    return count


def transfers(nbytes: int) -> list[tuple[int, int, int]]:
    """DMA transfers (offset, rows, bytes per row) moving ``nbytes`` contiguous
    bytes: one ``rows x bytes`` transfer when ``nbytes`` factors so, else pieces."""
    for rows in range(1, MAX_ROWS + 1):
        if nbytes % rows == 0 and nbytes // rows <= MAX_ROW_BYTES:
            return [(0, rows, nbytes // rows)]
    out, at = [], 0
    while at < nbytes:
        rows = min(MAX_ROWS, max(1, (nbytes - at) // MAX_ROW_BYTES))
        row = min(MAX_ROW_BYTES, nbytes - at)
        out.append((at, rows, row))
        at += rows * row
    return out


@dataclass
class _Stats:
    macs: int
    steps: int

    def finish(self, low, e, work) -> dict:
        return {"macs": self.macs, "scratchpad_bytes": low._top, "m_tiles": 1,
                "streamed_steps": self.steps,
                "work": {**e.work.since(work), "streamed": self.steps}}


class NotStreamable(CompileError):
    """Streaming would not help this unit (another way's refusal says more)."""


def streamable(u, config, fits: bool = True) -> bool:
    """One GEMM, group-1 convolution or depthwise convolution on the depthwise engine
    (other grouped ones keep their tensors whole); when the unit does not fit whole
    (``fits`` False), any depthwise convolution (:mod:`.tiled2d`)."""
    n = u.nodes[0]
    return len(u.nodes) == 1 and (isinstance(n, QGemm) or isinstance(n, QConv) and (
        n.group == 1 or on_engine(n, config) or not fits and n.is_depthwise))


def with_prologue(u, config) -> bool:
    """A GEMM after a chain of depthwise convolutions on the depthwise engine, each
    reading the one before (MobileNet's depthwise + pointwise pairs): the chain runs
    whole on chip while the GEMM's first weight steps load, then its weights stream
    (:class:`_GemmStream`)."""
    *prologue, n = u.nodes
    if not prologue or not isinstance(n, QGemm) or u.outputs != [n.outputs[0]]:
        return False
    feeds = [m.inputs[0] for m in u.nodes[1:]]
    return all(isinstance(m, QConv) and m.is_depthwise and on_engine(m, config)
               and m.outputs[0] == f for m, f in zip(prologue, feeds, strict=True))


def streamed_chain(u, config, root=lambda t: t) -> bool:
    """GEMMs (at least two), depthwise convolutions on the depthwise engine and
    average pooling, each reading the one before, the last one's output the unit's
    only output (MobileNet's depthwise + pointwise pairs, several in one unit, up to
    its pooling and classifier): the GEMMs whose weights are not resident stream
    them (:class:`_ChainStream`). ``root`` resolves aliases (a Flatten between)."""
    if sum(isinstance(m, QGemm) for m in u.nodes) < 2 or \
            [root(t) for t in u.outputs] != [root(u.nodes[-1].outputs[0])]:
        return False
    feeds = [root(m.outputs[0]) for m in u.nodes[:-1]]
    return all(isinstance(m, QGemm) and m.weight.ndim == 2 or isinstance(m, QAvgPool)
               or isinstance(m, QConv) and m.is_depthwise and on_engine(m, config)
               for m in u.nodes) and \
        all(len(m.inputs) == 1 and root(m.inputs[0]) == f
            for m, f in zip(u.nodes[1:], feeds, strict=True))


def stream_unit(low, u, why: CompileError) -> dict:
    """Emit unit ``u`` (one GEMM or convolution, or a GEMM :func:`with_prologue`)
    as streamed steps; raise ``CompileError`` (saying ``why`` it had to stream)
    when even one step does not fit."""
    n = u.nodes[-1]
    try:
        if streamed_chain(u, low.config, low.root):
            return _ChainStream(low, u).emit()
        if isinstance(n, QGemm):
            from .gemv import GemvBlob, emit_streamed  # it builds on this module

            if isinstance(low.place.blobs[n.name], GemvBlob):
                if len(u.nodes) > 1:
                    raise NotStreamable("a GEMV streams alone")
                return emit_streamed(low, u, n)
            return _GemmStream(low, u, n).emit()
        # The image stream's refusal (the last) says more when neither fits. A
        # depthwise convolution on the depthwise engine streams its image only;
        # image and weights stream together (tiled2d) where neither fits alone.
        from . import tiled2d  # it builds on this module

        way = low.variant.way
        if n.group != 1 and not on_engine(n, low.config):  # channel-diagonal depthwise
            if way not in (None, "tiled"):
                raise refuse(low.variant, "a depthwise convolution streams tiled only")
            return fastest(low, tiled2d.ways(low, u, n))
        bands = lambda: _fewer_band_cycles(low, u, n)  # noqa: E731
        named = {"tiled": tiled2d.ways(low, u, n), "bands": [bands],
                 "weights": [_ConvWeightStream(low, u, n).emit] if n.group == 1 else []}
        if way is not None:
            if not named.get(way):
                raise refuse(low.variant, f"{n.name} does not stream this way")
            return fastest(low, named[way])
        return fastest(low, [*named["tiled"], *named["weights"], *named["bands"]])
    except NotStreamable:
        raise
    except CompileError as err:
        raise low._refuse(why, f"streaming: {err}") from None


def fastest(low, ways, predict=None) -> dict:
    """Emit each way (a function emitting the unit and returning its resource use)
    that fits, keep the one the cost model predicts fastest (``predict``: cycles
    from the resource use, where the cost model ranks the ways better than
    :meth:`.cost.CostModel.predict`), its instructions
    priced at ``low.instruction_price`` cycles each; when none fits, raise the
    last refusal. The outermost choice of a unit records its options' (cycles,
    instructions) in ``low.choices`` (what a program over its bank trades)."""
    from .cost import CostModel  # noqa: PLC0415 (cost imports nothing of ours)

    e, model = low.e, CostModel(low.config)
    start = e.checkpoint()
    len_at = len(e.lines)
    options, refusal = [], None
    low.choosing += 1
    try:
        for way in ways:
            try:
                stats = way()
            except CompileError as err:
                refusal = err
                e.rollback(start)
                continue
            size = sum(map(is_instruction, e.lines[len_at:]))
            options.append((stats, size, way))
            e.rollback(start)
    finally:
        low.choosing -= 1
    if not options:
        raise refusal
    # Ways that all carry a prediction of their own (``stats["cycles"]``: a
    # convolution whole or in bands, cost.conv_cycles) compare by it.
    own = all("cycles" in stats for stats, _, _ in options)
    rank = (lambda stats: stats["cycles"]) if own else predict or \
        (lambda stats: model.predict(stats["work"]))
    options = [(rank(stats), size, way) for stats, size, way in options]
    if not low.choosing:
        low.choices.append([(cycles, size) for cycles, size, _ in options])
    price = low.instruction_price
    return min(options, key=lambda o: o[0] + price * o[1])[2]()


class _GemmStream:
    """A GEMM whose weights stream through two buffers, a group of output-column
    tiles per step (see the module docstring), after the unit's other nodes (a
    chain :func:`with_prologue`), which run whole on chip first."""

    def __init__(self, low, u, n: QGemm):
        self.low, self.u, self.n = low, u, n
        self.e, self.cfg = low.e, low.config
        self.blob = low.place.blobs[n.name]

    def _prologue(self):
        """Load the unit's input and the prologue's constants (one token), run the
        prologue; return its MACs. Nothing is released: the weight steps' loads,
        which run ahead of the compute, must not land in buffers the prologue
        still reads."""
        low, e = self.low, self.e
        prologue = self.u.nodes[:-1]
        items = [(low._load_tensor, t) for t in self.u.inputs]
        items += [(low._load_blob, low.place.blobs[m.name]) for m in prologue
                  if m.name in low.place.blobs]
        for i, (load, what) in enumerate(items):
            load(what, "next" if i == len(items) - 1 else "")
        e.pop_next_compute()
        macs = 0
        for m in prologue:
            low._dead, low._to_dram = set(), set()
            macs += low.node(m)
        return macs

    def emit(self) -> dict:
        low, e, cfg, n, blob = self.low, self.e, self.cfg, self.n, self.blob
        k, nn = n.weight.shape
        x, y = low.root(n.inputs[0]), low.root(n.outputs[0])
        m = low.tensor[x].size // k
        if blob.slot:
            raise NotStreamable("its weights are resident: its rows do not fit")
        if m > min(cfg.acc_rows, 4096):
            raise CompileError(f"{m} rows with streamed weights exceed the "
                               f"{min(cfg.acc_rows, 4096)} accumulator rows (not built: "
                               "streaming weights and rows together)")
        work = e.work.snapshot()
        low._reset()
        try:
            x_off, y_off = low.out(x), low.out(y)
            g, pieces, bufs = column_groups(low, blob, nn, gemm_tiles(k, cfg.rows), n.name)
        except TooBig as err:
            raise CompileError(str(err)) from None
        steps = len(pieces)
        low._begin(self.u, f" (streamed weights: {steps} steps of {g} column tiles)")
        regs = self._regs(n, steps, g, m)
        if len(self.u.nodes) > 1:
            macs = self._prologue()
        else:
            low._load_tensor(x, "")
            macs = 0
        macs += self._steps(n, x_off, y_off, g, pieces, bufs, regs)
        e.push_after_last_compute("next")
        low._store_tensor(y)
        e.op(f"region.end {self.u.id}")
        return _Stats(macs, steps).finish(low, e, work)

    def _regs(self, n: QGemm, steps: int, g: int, m: int) -> list[str]:
        """The registers of ``n``'s steps (:func:`column_steps`): with two accumulator
        read ports a step's requantization runs beside the next step's GEMMs when the
        two steps take turns between two accumulator regions (two registers more)."""
        cfg, e = self.cfg, self.e
        alternate = (g == 1 and steps >= 2 and cfg.acc_ports == 2 and 2 * m <= cfg.acc_rows
                     and free_pipe_regs(e) >= 6)
        return pipe_regs(e, 6 if alternate else 4, n.name)

    def _steps(self, n: QGemm, x_off: int, y_off: int, g: int, pieces, bufs, regs) -> int:
        """Emit ``n``'s weight steps (``pieces`` through ``bufs``, registers ``regs``
        of :meth:`_regs`) from its input at ``x_off`` to its output at ``y_off``;
        return its MACs."""
        low, e, cfg = self.low, self.e, self.cfg
        blob = low.place.blobs[n.name]
        k, nn = n.weight.shape
        m = low.tensor[low.root(n.inputs[0])].size // k
        ibuf, isum, ldram, yreg, *turns = regs
        if m > 1:
            e.set_cfg("gemm_stride", k)
            e.set_cfg("out_stride", nn)
        low._requant_cfg(n.requant)

        def compute(s, push):
            j0, gj, _, _ = pieces[s]
            cols = min(gj * cfg.cols, nn - j0 * cfg.cols)
            e.pop_next_compute("prev")
            wo, xt, *regs = e.scratch(5)
            chain = low.gemm_chain(P_WORK, k, m, x_off, wo, xt, unroll=4)
            low._column_tiles(n, P_WORK, (ibuf, 0), blob, cols, m, (yreg, 0), chain, regs,
                              j0=j0, breg=wo, acc=(turns[0], 0) if turns else 0)
            if push:
                e.push_after_last_compute("prev")

        column_steps(e, pieces, g, nn, cfg.cols, (ibuf, isum, ldram, yreg),
                     (bufs, blob.dram, y_off), compute,
                     turns=(*turns, m) if turns else ())
        return m * k * nn


class _ChainStream(_GemmStream):
    """A chain of GEMMs, depthwise convolutions on the depthwise engine and average
    pooling, each reading the one before (:func:`streamed_chain`: MobileNet's
    depthwise + pointwise pairs, several in one unit), whose GEMMs with weights
    that are not resident stream them: the intermediates stay on chip.

    The GEMMs' steps take turns between two pairs of weight buffers, allocated
    before any tensor: a GEMM's first two loads, which pop no token, land in the
    pair of the streamed GEMM two before it, whose every step has completed once
    the load queue has passed the last load of the GEMM between (it pops the token
    of that GEMM's third step from the end). The other nodes' constants and the
    unit's input load first, with one token; a tensor no later node reads is
    released (only compute writes the space again, in order)."""

    def __init__(self, low, u):  # (the last node need not be a GEMM with a blob)
        self.low, self.u, self.n = low, u, u.nodes[-1]
        self.e, self.cfg = low.e, low.config

    def emit(self) -> dict:
        low, e, cfg, u = self.low, self.e, self.cfg, self.u
        streams = {m.name: self._pieces(m) for m in u.nodes if streams_weights(m, low)}
        order = list(streams)
        if any(len(streams[m][1]) < 3 for m in order[1:-1]):
            raise NotStreamable("a GEMM of fewer than three steps between two that stream")
        work = e.work.snapshot()
        low._reset()
        try:
            bufs = [[low.alloc(max(streams[m][-1] for m in order[i::2]),
                               f"weight buffer {j} of {order[i]}") for j in range(2)]
                    for i in range(min(2, len(order)))]
        except TooBig as err:
            raise CompileError(str(err)) from None
        low._begin(u, f" (a chain streaming the weights of {len(order)} GEMMs)")
        loads = [(low._load_tensor, t) for t in u.inputs]
        loads += [(low._load_blob, low.place.blobs[m.name]) for m in u.nodes
                  if m.name not in streams and m.name in low.place.blobs]
        # A first GEMM's first step pops the token of its weights' load, which comes
        # after these in the load queue.
        token = u.nodes[0].name not in streams
        for i, (load, what) in enumerate(loads):
            load(what, "next" if token and i == len(loads) - 1 else "")
        if token:
            e.pop_next_compute()
        macs = steps = 0
        for i, m in enumerate(u.nodes):
            later = {low.root(t) for x in u.nodes[i + 1:] for t in x.inputs}
            low._dead = {low.root(t) for t in m.inputs} - later - set(u.outputs)
            low._to_dram, low._later = set(), u.nodes[i + 1:]
            if m.name in streams:
                g, pieces = streams[m.name][:2]
                k, nn = m.weight.shape
                x = low.root(m.inputs[0])
                rows = low.tensor[x].size // k
                if rows > min(cfg.acc_rows, 4096):
                    raise CompileError(f"{rows} rows with streamed weights exceed the "
                                       f"{min(cfg.acc_rows, 4096)} accumulator rows")
                y_off = low.out(m.outputs[0])
                regs = self._regs(m, len(pieces), g, rows)
                j = order.index(m.name)
                macs += self._steps(m, low.at(x), y_off, g, pieces, bufs[j % 2], regs)
                steps += len(pieces)
            else:
                macs += low.node(m)
            low._release(low._dead)
        e.push_after_last_compute("next")
        low._store_tensor(low.root(u.outputs[0]))
        e.op(f"region.end {u.id}")
        return _Stats(macs, steps).finish(low, e, work)

    def _pieces(self, n: QGemm):
        """(column tiles per step, the steps' :func:`column_pieces`, their largest
        bytes) of GEMM ``n``."""
        cfg, blob = self.cfg, self.low.place.blobs[n.name]
        k, nn = n.weight.shape
        pieces = column_pieces(blob, ceil_div(nn, cfg.cols), nn, gemm_tiles(k, cfg.rows), 1,
                               cfg.cols)
        return 1, pieces, max(p[3] for p in pieces)


def streams_weights(n, low) -> bool:
    """Whether GEMM ``n`` streams its weights in a chain: they are not resident and
    larger than :data:`STREAM_BYTES`, and it is no GEMV (which streams alone)."""
    from .gemv import GemvBlob  # it builds on this module

    blob = low.place.blobs.get(n.name)
    return isinstance(n, QGemm) and blob is not None and not blob.slot \
        and len(blob.data) > STREAM_BYTES and not isinstance(blob, GemvBlob)


def _fewer_band_cycles(low, u, n: QConv, then: QGemm | None = None,
                       more_ways=None) -> dict:
    """Emit ``n`` (with ``then``: a band pair, :mod:`.bandpair`) streamed in bands:
    as few as fit plus each of ``more_ways`` (default: up to :data:`MORE_CONV_BANDS`
    more where the prediction knows the array), each as equal as they can be and
    tapered (:func:`band_sizes`), the bands :func:`.cost.band_cycles` (a pair:
    :func:`.bandpair.pair_cycles`) predicts fastest (shorter bands expose less of
    the first load and the last store, and add each band's fixed work), its
    instructions priced at ``low.instruction_price`` cycles each. Where
    instructions are free, the ways stop at their prediction and the fastest
    that emits is kept (emitting each costs a compile more time than it tells)."""
    e = low.e
    start = e.checkpoint()
    len_at = len(e.lines)
    options, refusal = [], None
    if more_ways is None:
        more_ways = range(MORE_CONV_BANDS + 1) if n.group == 1 else (0,)
    tapers = TAPERS
    if low.variant.extra_bands is not None:  # the variant pins the bands: even ones
        more_ways, tapers = (low.variant.extra_bands,), (1,)
    price = low.instruction_price
    for more, taper in [(m, t) for m in more_ways for t in tapers]:
        way = _ConvStream(low, u, n, more, then=then, taper=taper)
        way.plan_only = not price
        try:
            way.emit()
        except CompileError as err:
            if taper == 1 or refusal is None:  # (the even bands' refusal says more)
                refusal = err
        else:
            size = sum(map(is_instruction, e.lines[len_at:]))
            options.append((way.predicted + price * size, way))
        e.rollback(start)
    for _, way in sorted(options, key=lambda o: o[0]):
        way.plan_only = False
        try:
            return way.emit()
        except CompileError as err:  # (refused past its prediction)
            refusal = err
            e.rollback(start)
    raise refusal


class _ConvStream:
    """A convolution whose image streams in bands of output rows, each loaded with
    its input halo into one of two band buffers (see the module docstring).

    A band buffer holds ``HB`` padded input rows of ``wp * c`` bytes, each row's
    pixels ``max(PL, PR)`` in (its left pad is the right pad of the row above,
    :mod:`.convrows`). Real rows load ``wp * c`` bytes each from their start (the
    row and the first bytes of the next one), so one transfer moves a band; a
    ``vclip`` to the pad value then rewrites the pad columns those extra bytes
    landed in. Pad rows above the image are written once, before the first
    band; pad rows below it by the bands that reach them. By phase (a row stride
    and no pad rows above), the buffer holds a block of every ``SH``-th input row
    per phase a kernel row reads, each block loaded with a DRAM stride of ``SH``
    rows.

    With ``then`` (a pointwise convolution as its GEMM, reading the depthwise
    convolution ``n`` on the depthwise engine: :mod:`.bandpair`), each band's
    depthwise rows go to one buffer on chip and the GEMM turns them into the
    band's output rows: the intermediate never leaves the scratchpad.
    """

    def __init__(self, low, u, n: QConv, more: int = 0, then: QGemm | None = None,
                 taper: int = 1):
        self.low, self.u, self.n = low, u, n
        self.e, self.cfg = low.e, low.config
        self.more = more  # bands beyond the fewest that fit
        self.then = then
        self.taper = taper  # the first band 1 / taper as tall (see band_sizes)
        self.predicted = 0.0  # cycles band_cycles predicts (set by emit)
        self.plan_only = False  # emit stops once the prediction is known

    def _geometry(self):
        low, n = self.low, self.n
        bn, c, h, w = low.tensor[n.inputs[0]].shape
        oc, _, kh, kw = n.weight.shape
        _, _, oh, ow = low.tensor[n.outputs[0]].shape
        if bn != 1:
            raise CompileError(f"a batch of {bn} images (not built: streaming batches)")
        pt, pl, pb, pr = n.pads
        wp = w + pl + pr  # the widest a band's padded rows are
        if wp * c > MAX_ROW_BYTES or ow * oc > MAX_ROW_BYTES:
            raise CompileError(f"padded input rows of {wp * c} bytes or output rows of "
                               f"{ow * oc} bytes exceed one DMA row ({MAX_ROW_BYTES})")
        return c, h, w, oc, kh, oh, ow, pt, pl, pr, wp

    def emit(self) -> dict:
        low, e, n = self.low, self.e, self.n
        c, h, w, oc, kh, oh, ow, pt, pl, pr, wp = self._geometry()
        sh = n.strides[0]
        low._need_nhwc(n, n.inputs[0])
        then = self.then
        x, y = low.root(n.inputs[0]), low.root((then or n).outputs[0])
        blob = low.place.blobs[n.name]
        work = e.work.snapshot()
        low._reset()
        oc_out = then.weight.shape[1] if then else oc  # output bytes per pixel
        # A band's rows share their pad columns (one or more output rows per gemm).
        # With a row stride and no pad rows above, a band may hold its rows by phase
        # (a block of every SH-th row per phase a kernel row reads: one output row
        # is one buffer row of each block); depthwise bands keep their rows in order.
        dense = n.group == 1  # not on the depthwise engine (its rows are its own)
        rows = low.conv_rows(n, copied=True, phased=dense and sh > 1 and pt == 0,
                             wide=dense)  # bands go to DRAM
        skip = rows.phases  # input rows from one row of a block to the next
        used = min(kh, skip)  # blocks
        wp, lead = rows.wp, pl + rows.skew  # row pitch, pixels before a row's first
        # Buffer offset of band row 0: the pad fix-up starts at the end of a row above.
        row0 = (wp - w - lead) * c
        if wp * c > MAX_ROW_BYTES:
            raise CompileError(f"padded input rows of {wp * c} bytes exceed one DMA row")
        try:
            wpart, wsp = low._place_blob(blob)
            if then:
                tblob = low.place.blobs[then.name]
                tpart, tsp = low._place_blob(tblob)
            room = low.work_limit() - low._top
        except TooBig as err:
            raise CompileError(f"{err} (not built: streaming convolution weights)") from None

        def held(r):  # buffer rows of a band of r output rows
            return used * -(-((r - 1) * sh + kh) // skip)

        def out_bytes(r):
            return r * ow * oc_out if then else rows.out_bytes(r, ow, oc)

        def set_bytes(r):  # one buffer set: a band of input rows and its output rows
            return align(row0 + held(r) * wp * c + lead * c) + align(out_bytes(r))

        def mid_bytes(r):  # the band's depthwise rows, read by ``then`` (one buffer)
            return align(r * ow * oc) if then else 0

        fits = [r for r in range(1, min(oh, rows.per, MAX_ROWS) + 1)
                if 2 * set_bytes(r) + mid_bytes(r) <= room and (r - 1) * sh + kh <= MAX_ROWS]
        if not fits:
            raise CompileError(f"one output row of {n.name} needs {2 * set_bytes(1)} bytes "
                               f"of scratchpad (double-buffered), {max(0, room)} are left")
        steps = ceil_div(oh, max(fits)) + self.more
        if steps > oh or (self.more and ceil_div(oh, steps) == ceil_div(oh, steps - 1)):
            raise CompileError(f"{steps} bands of {oh} output rows")
        rb = ceil_div(oh, steps)  # bands as equal as they can be
        sizes = band_sizes(oh, rb, self.taper)
        steps = len(sizes)
        firsts = [sum(sizes[:s]) for s in range(steps)]
        hb = (rb - 1) * sh + kh  # input rows the tallest band spans (the buffers' layout)
        q = -(-hb // skip)  # rows of a block
        inb = align(row0 + held(rb) * wp * c + lead * c)
        sets = [low.alloc(set_bytes(rb), f"band buffers {i} of {n.name}") for i in range(2)]
        mid = low.alloc(mid_bytes(rb), f"band rows of {n.name}") if then else 0
        fill = n.pad_value

        def spans(s):  # input rows band s reads
            return (sizes[s] - 1) * sh + kh

        def band(s):
            nominal = firsts[s] * sh - pt  # input row at band row 0
            lo, hi = max(0, nominal), min(h, nominal + spans(s))
            return nominal, lo, hi, sizes[s]

        def block_rows(s, f):  # rows block f holds, up to its last real row, real rows
            nominal, lo, hi, _ = band(s)
            return (len(range(nominal + f, nominal + spans(s), skip)),
                    len(range(nominal + f, hi, skip)), len(range(max(lo, nominal + f), hi, skip)))

        if any(band(s)[1] > band(s)[0] for s in range(2, steps)):
            raise CompileError(f"top padding of {pt} rows spans more than two bands")
        _, lo, hi, _ = band(0)
        # What band_cycles (or for a pair bandpair.pair_cycles) predicts from.
        self.bands = [band(s)[3] for s in range(steps)]
        self.first_load = sum(block_rows(0, f)[2] for f in range(used)) * wp * c
        self.last_store = self.bands[-1] * ow * oc_out
        if then:
            from .bandpair import pair_cycles  # it builds on this module

            self.predicted = pair_cycles(self.cfg, n, then, self.bands, ow,
                                         self.first_load, self.last_store)
        else:
            self.predicted = band_cycles(
                self.cfg, convrows.plan(rows, self.bands, ow),
                len(conv_tiles(kh, n.weight.shape[3] * c, self.cfg.rows)), oc,
                self.first_load, self.last_store)
        if self.plan_only:
            return {}
        low._begin(self.u, f" (streamed image: {steps} bands of {rb} output rows"
                           f"{f', the first of {sizes[0]}' if sizes[0] != rb else ''})")
        ibuf, isum, ldram, sdram, stride, obuf, xq = pipe_regs(e, 7, n.name)
        e.op(f"li {ibuf}, {sets[0]}")
        e.op(f"li {isum}, {sets[0] + sets[1]}")
        e.op(f"addi {ldram}, r2, {low.place.arena[x] + (-pt) * w * c}")
        e.op(f"addi {sdram}, r2, {low.place.arena[y]}")
        e.op(f"li {stride}, {skip * w * c}")
        low._load_blob(blob, "")  # resident: a tag hit after the first run
        if then:
            low._load_blob(tblob, "")
        primed = steps >= 3  # every compute pops its output buffer's store token
        if primed:  # the first two take theirs from stores of one byte (rewritten later)
            for i in range(2):
                e.op(f"addi {obuf}, {ibuf}, {inb + i * (sets[1] - sets[0])}")
                e.op(f"store {P_WORK}, {obuf}, {sdram}, r0, 1, 1", push="prev",
                     queue="store")
        # Pad rows above the image, in the buffers of the bands that have them.
        for s in range(min(2, steps)):
            nominal, lo, _, _ = band(s)
            if lo > nominal:
                self._fill(sets[s] + row0, lo - nominal, wp * c)

        def load(s, pop):
            nominal, lo, hi, _ = band(s)
            parts = []  # (first input row, its buffer row, rows, bytes per row)
            for f in range(used):
                first = nominal + f + max(0, -(-(lo - nominal - f) // skip)) * skip
                real = [r for r in range(first, hi, skip)]
                wide = [r for r in real if r != h - 1 or wp == w]
                at = f * q + (first - nominal - f) // skip
                if wide:
                    parts.append((first, at, len(wide), wp * c))
                if len(wide) < len(real):  # the image's last row: no read past it
                    parts.append((h - 1, at + len(wide), 1, w * c))
            for i, (r, at, rows, nbytes) in enumerate(parts):
                d_off = row0 + at * wp * c + lead * c
                s_off = (r - nominal) * w * c
                d, imm = ibuf, d_off
                t1, t2 = e.scratch(2)
                if d_off >= 1 << 11:
                    e.op(f"addi {t1}, {ibuf}, {d_off}")
                    d, imm = t1, 0
                src = ldram
                if s_off:
                    e.op(f"addi {t2}, {ldram}, {s_off}")
                    src = t2
                strd = stride if rows > 1 and (nbytes != w * c or skip > 1) else "r0"
                e.op(f"load {P_WORK}, {d}, {src}, {strd}, {rows}, {nbytes}, off={imm}",
                     pop=pop if i == 0 else "", push="next" if i == len(parts) - 1 else "",
                     queue="load")
            e.op(f"addi {ldram}, {ldram}, {sizes[s] * sh * w * c}")

        def compute(s, push):
            nominal, lo, hi, nr = band(s)
            e.pop_next_compute("prev")
            if primed or s >= 2:
                e.pop_next_compute("next")
            for f in range(used):  # pad rows below the image
                need, end, _ = block_rows(s, f)
                if need > end and nominal + spans(s) > h:
                    e.op(f"addi {obuf}, {ibuf}, {row0 + (f * q + end) * wp * c}")
                    self._fill(obuf, need - end, wp * c, reg=True)
            refill_pad_columns(e, ibuf, held(rb) + 1, w, wp, c, fill)
            e.set_cfg("gemm_stride", n.strides[1] * c)
            e.set_cfg("out_stride", oc)
            low._requant_cfg(n.requant)
            e.op(f"addi {obuf}, {ibuf}, {inb}")
            if n.group != 1:  # depthwise, on the depthwise engine (streamable)
                engine_rows(low, n, wpart, wsp, blob, (ibuf, row0 + rows.skew * c), wp * c,
                            hb, 0, nr, mid if then else (obuf, 0))
                if then:
                    self._then(tpart, tsp, tblob, mid, nr * ow, obuf)
            else:
                wo, xo, ao, *cols = e.scratch(6)
                chain = low.conv_chain(n, wpart, rows, hb, nr, ow,
                                       (ibuf, row0 + rows.skew * c), (wo, xo, ao), xq)
                low._column_tiles(n, wpart, wsp, blob, oc, rows.acc_rows(nr, ow), (obuf, 0),
                                  chain, cols, split=rows.split(nr, ow, oc, (xo, ao)),
                                  breg=wo)
            e.marker(push="prev,next" if push else "next")
            pitch = ow * oc_out if then else rows.out_pitch(ow) * oc
            low.store_rows(obuf, sdram, nr, pitch, ow * oc_out, e.scratch(3),
                           pop="prev", push="prev" if s + 2 < steps else "")
            if s + 1 < steps:  # (in a loop's body every band is rb rows)
                e.op(f"addi {sdram}, {sdram}, {nr * ow * oc_out}")

        def toggle():
            e.op(f"sub {ibuf}, {isum}, {ibuf}")

        def advance():  # compute steps the store address past its band
            pass

        def uniform_load(s):
            nominal, lo, hi, nr = band(s)
            return nr == rb and lo == nominal and hi == nominal + hb and (hi < h or wp == w)

        def same(s):
            nominal, _, hi, nr = band(s)
            return nr == rb and hi == nominal + hb and uniform_load(s + 2) \
                and (primed or s >= 2)

        pipeline(e, steps, load, compute, toggle, advance, same)
        e.op(f"region.end {self.u.id}")
        macs = oh * ow * oc * n.weight.shape[1] * kh * n.weight.shape[3]
        if then:
            macs += oh * ow * oc * oc_out
        stats = _Stats(macs, steps).finish(low, e, work)
        if n.group == 1 and steps > 1:  # one band overlaps nothing: as whole
            stats["cycles"] = self.predicted
        return stats

    def _then(self, part: str, wsp: int, blob, mid: int, m: int, obuf: str):
        """The pointwise GEMM ``then`` of a band: ``m`` depthwise pixels at ``mid``
        to the band's output buffer at register ``obuf``."""
        low, e, then = self.low, self.e, self.then
        k, nn = then.weight.shape
        e.set_cfg("gemm_stride", k)
        e.set_cfg("out_stride", nn)
        low._requant_cfg(then.requant)
        wo, xt, *regs = e.scratch(5)
        chain = low.gemm_chain(part, k, m, mid, wo, xt, unroll=4)
        low._column_tiles(then, part, wsp, blob, nn, m, (obuf, 0), chain, regs, breg=wo)

    def _fill(self, at, rows: int, row_bytes: int, reg: bool = False):
        """Write the pad value over ``rows`` dense rows of ``row_bytes`` at ``at``
        (an offset, or a register holding it)."""
        fill_rows(self.e, at if reg else self.e.reg(at), rows, row_bytes, self.n.pad_value)


def band_sizes(oh: int, rb: int, taper: int) -> list[int]:
    """Output rows of each band of ``oh`` rows in bands of at most ``rb``: as equal
    as they can be (``taper`` 1), or a first band ``1 / taper`` as tall (its load,
    which no compute overlaps, is shorter) and the last band what is left."""
    if taper == 1:
        count = ceil_div(oh, rb)
        return [min(rb, oh - s * rb) for s in range(count)]
    first = ceil_div(rb, taper)
    rest = oh - first
    if min(rb, rest) <= first:  # (also: nothing left, or a band of 1 row)
        raise CompileError(f"bands of {rb} rows do not taper")
    return [first] + [min(rb, rest - s * rb) for s in range(ceil_div(rest, rb))]


def column_groups(low, blob, nn: int, red_tiles, name: str):
    """Groups of output-column tiles of ``blob`` that stream through two weight
    buffers in the room left: (column tiles per group, :func:`column_pieces`, the
    two buffers). One column tile a step: the first step's load, which nothing
    overlaps, is the shortest, and the steps run in a hardware loop whatever
    their count (MobileNetV1-0.25 measured 5,521 cycles faster than in groups
    sized for four steps)."""
    cols = low.config.cols
    ncol = ceil_div(nn, cols)
    js = blob.j_stride() if ncol > 1 else len(blob.data)
    room = (low.work_limit() - low._top) // 2 // ALIGN * ALIGN
    g = min(1, room // js)
    if g < 1:
        raise CompileError(f"one output-column tile of {name} ({js} bytes) "
                           f"exceeds half the {2 * room} bytes left (not built: "
                           "splitting the reduction into streamed pieces)")
    pieces = column_pieces(blob, ncol, nn, red_tiles, g, cols)
    size = max(p[3] for p in pieces)
    bufs = [low.alloc(size, f"weight buffer {i} of {name}") for i in range(2)]
    return g, pieces, bufs


def column_steps(e, pieces, g: int, nn: int, cols: int, regs, at, compute, turns=()):
    """Emit the double-buffered steps of streamed column groups (:func:`pipeline`):
    step ``s`` loads group ``pieces[s]`` into the buffer register ``ibuf`` points
    at, from ``ldram``, and ``compute(s, push)`` emits its columns into the output
    at ``yreg``. ``regs`` = (ibuf, isum: the sum of the two buffers' offsets,
    ldram, yreg), set here from ``at`` = (the two buffers, the blob's offset in
    the constants, the output's offset). ``turns`` = (areg, asum, rows): ``areg``
    toggles with the buffers between accumulator rows 0 and ``rows``."""
    ibuf, isum, ldram, yreg = regs
    bufs, dram, y_off = at
    e.op(f"li {ibuf}, {bufs[0]}")
    e.op(f"li {isum}, {bufs[0] + bufs[1]}")
    e.op(f"addi {ldram}, r1, {dram}")
    e.op(f"li {yreg}, {y_off}")
    if turns:
        areg, asum, rows = turns
        e.op(f"li {areg}, 0")
        e.op(f"li {asum}, {rows}")
    steps = len(pieces)
    step_bytes = pieces[1][2] - pieces[0][2] if steps > 1 else 0

    def load(s, pop):
        load_bytes(e, ibuf, ldram, pieces[s][3], pop)
        e.op(f"addi {ldram}, {ldram}, {step_bytes}")

    def toggle():
        e.op(f"sub {ibuf}, {isum}, {ibuf}")
        if turns:
            e.op(f"sub {areg}, {asum}, {areg}")

    def advance():
        e.op(f"addi {yreg}, {yreg}, {g * cols}")

    def same(s):
        return pieces[s][1] == g and pieces[s + 2][3] == pieces[0][3] \
            if s + 2 < steps else False

    def same_tail(s):
        return pieces[s][1] == pieces[s + 1][1] == g and \
            min(g * cols, nn - pieces[s + 1][0] * cols) == g * cols

    pipeline(e, steps, load, compute, toggle, advance, same, same_tail)


def fill_rows(e, reg: str, rows: int, row_bytes: int, fill: int):
    """Write ``fill`` over ``rows`` dense rows of ``row_bytes`` at the scratchpad
    offset in ``reg`` (a ``vclip`` to the one value)."""
    for name, v in (("clip_lo", fill), ("clip_hi", fill), ("in_stride", 0),
                    ("out_stride", 0)):
        e.set_cfg(name, v)
    e.compute(f"vclip {P_WORK}, {reg}, {P_WORK}, {reg}, {rows}, {row_bytes}")


def refill_pad_columns(e, buf: str, rows: int, w: int, wp: int, c: int, fill: int):
    """Write the pad value over the pad columns (``wp - w`` per row of ``wp * c``
    bytes) of ``rows`` rows at ``buf``: the wide rows' extra bytes land there."""
    if wp == w:
        return
    for name, v in (("clip_lo", fill), ("clip_hi", fill),
                    ("in_stride", wp * c), ("out_stride", wp * c)):
        e.set_cfg(name, v)
    e.compute(f"vclip {P_WORK}, {buf}, {P_WORK}, {buf}, {rows}, {(wp - w) * c}")


def load_bytes(e, dst: str, src: str, nbytes: int, pop: str):
    """Load ``nbytes`` contiguous bytes from DRAM at register ``src`` to the working
    area at register ``dst`` (:func:`transfers`); the first transfer pops ``pop``,
    the last pushes a token to compute."""
    parts = transfers(nbytes)
    for i, (off, rows, row) in enumerate(parts):
        d, s_ = dst, src
        if off:
            d, s_ = e.scratch(2)
            e.op(f"addi {d}, {dst}, {off}")
            e.op(f"addi {s_}, {src}, {off}")
        e.op(f"load {P_WORK}, {d}, {s_}, r0, {rows}, {row}",
             pop=pop if i == 0 else "", push="next" if i == len(parts) - 1 else "",
             queue="load")


def column_pieces(blob, ncol: int, nn: int, red_tiles, g: int, cols: int):
    """(first column tile, column tiles, blob offset, bytes) of each group of ``g``
    output-column tiles of ``blob``: its weight tiles, biases and requantization
    table are contiguous, so a group is one transfer. The last group ends where
    its content does (the blob is padded to whole DMA rows after it)."""
    last = ncol - 1
    n_last = nn - last * cols
    if blob.qtab:
        data_end = blob.qtab[last] + QTAB_ENTRY_BYTES * n_last
    elif blob.bias:
        data_end = blob.bias[last] + 4 * n_last
    else:
        data_end = blob.tiles[(last, len(red_tiles) - 1)] + red_tiles[-1][1] * n_last
    data_end = align(data_end, 4)
    pieces = []
    for j0 in range(0, ncol, g):
        start = blob.tiles[(j0, 0)]
        end = blob.tiles[(j0 + g, 0)] if j0 + g < ncol else data_end
        pieces.append((j0, min(g, ncol - j0), start, end - start))
    return pieces


class _ConvWeightStream:
    """A convolution whose weights stream through two buffers, a group of
    output-column tiles per step, while its image stays on chip whole (loaded
    and padded once; the output leaves at the end). For layers whose weights
    are too large to leave room for bands of image rows of a useful height."""

    def __init__(self, low, u, n: QConv):
        self.low, self.u, self.n = low, u, n
        self.e, self.cfg = low.e, low.config

    def emit(self) -> dict:
        low, e, cfg, n = self.low, self.e, self.cfg, self.n
        blob = low.place.blobs[n.name]
        if blob.slot:
            raise CompileError("its weights are resident")
        bn, c, h, w = low.tensor[n.inputs[0]].shape
        oc, _, kh, kw = n.weight.shape
        _, _, oh, ow = low.tensor[n.outputs[0]].shape
        sh, sw = n.strides
        low._need_nhwc(n, n.inputs[0])
        x, y = low.root(n.inputs[0]), low.root(n.outputs[0])
        work = e.work.snapshot()
        low._reset()
        low._to_dram = {y}
        rows = low.conv_rows(n, copied=True, wide=low.wide_ok(n))
        red = conv_tiles(kh, kw * c, cfg.rows)
        loops = kw * c >= LOOP_TILES * cfg.rows
        low._begin(self.u, " (streamed weights)")
        ibuf, isum, ldram, yreg, *xq = pipe_regs(e, 5 if loops else 4, n.name)
        spare = [r for r in PIPE_REGS if r not in e.result_regs.values()
                 and r not in (ibuf, isum, ldram, yreg, *xq)]
        try:
            if not low._load_padded(n, rows, "next"):
                low._load_tensor(x, "next")
            e.marker(pop="prev")  # the padding reads the input
            xp, hp, img = low._padded_rows(n, x, rows)
            low._dead = {x}
            low._reuse_input(n, xp, rows)
            low.conv_out(n, rows)
            g, pieces, bufs = column_groups(low, blob, oc, red, n.name)
        except TooBig as err:
            raise CompileError(str(err)) from None
        steps = len(pieces)
        e.comment(f"{steps} steps of {g} column tiles")

        def compute(s, push):
            j0, gj, _, _ = pieces[s]
            cols = min(gj * cfg.cols, oc - j0 * cfg.cols)
            e.pop_next_compute("prev")
            e.set_cfg("gemm_stride", sw * c)
            e.set_cfg("out_stride", oc)
            low._requant_cfg(n.requant)
            wo, xo, ao, *regs = e.scratch(6)
            def group(nr, x_at, y_at):
                chain = low.conv_chain(n, P_WORK, rows, hp, nr, ow, x_at, (wo, xo, ao),
                                       xq[0] if xq else None)
                low._column_tiles(n, P_WORK, (ibuf, 0), blob, cols, rows.acc_rows(nr, ow),
                                  y_at, chain, regs, j0=j0,
                                  split=rows.split(nr, ow, oc, (xo, ao)), breg=wo)

            for b in range(bn):
                low.conv_groups(n, rows, xp + b * img,
                                (yreg, b * oh * rows.out_pitch(ow) * oc), group, spare)
            if push:
                e.push_after_last_compute("prev")

        column_steps(e, pieces, g, oc, cfg.cols, (ibuf, isum, ldram, yreg),
                     (bufs, blob.dram, low.at(y)), compute)
        e.push_after_last_compute("next")
        low._store_tensor(y)
        e.op(f"region.end {self.u.id}")
        return _Stats(bn * oh * ow * oc * c * kh * kw, steps).finish(low, e, work)
