"""Compiler back half: tensors to addresses, operators to instructions.

Every unit becomes one region of code::

    region.begin ID
    load  ...            ; unit inputs from DRAM, weight blobs (tagged: resident)
    cfg / wload / gemm / vbias / vreq / vclip / vmax / vadd / vargmax ...
    store ...            ; unit outputs to DRAM
    region.end ID

Loads run ahead of compute and stores behind it, synchronized only by dependency
tokens: each node waits for the load group that brings its data, and each stored
tensor leaves as soon as its last compute instruction completes. Tensors produced
and consumed inside a unit never cross DRAM (that is what fusing units buys).

Scratchpad: partition ``p0`` holds the resident weight blobs of the whole model
(one tag slot each, the same in every program of the model, so a swap between
fusion plans keeps them resident); ``p1`` is the working area each unit
allocates from its start. Convolution and pooling run channels-last
(:mod:`.layout`).

A unit that does not fit at once (working partition, accumulator rows, 4096
``gemm`` rows) is emitted again as M tiles when its nodes work on independent
rows (GEMMs, element-wise adds and clips): tiles of rows stream through double
buffers, every node of the unit runs on a tile before the next (fused
intermediates stay on chip), weights are loaded once. The tiles are unrolled,
so a long M costs instructions. A convolution runs its output rows in groups
that fit the accumulators, one ``gemm`` per reduction tile covering a whole
group over the padded width (:mod:`.convrows`); a pointwise one is a GEMM. A
GEMM or convolution that neither fits nor splits into M tiles streams its
weights or its image in double-buffered steps, the uniform ones in one hardware
loop (:mod:`.stream`); a convolution that fits is emitted whole and streamed,
and the cost model keeps the faster.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from firmware.config import NPUConfig
from firmware.isa import QTAB_ENTRY_BYTES

from ..ir import ArgMax, Clip, Graph, If, MaxPool, Node, QAdd, QAvgPool, QConv, QGemm, Requant
from .convrows import ConvRows, groups
from .convrows import choose as choose_rows
from .convrows import plan as plan_rows
from .cost import whole_conv_cycles
from .emit import Emitter
from .layout import Layout
from .plan import ALIASES, CompileError, UnitInfo
from .variants import DEFAULT, refuse, variant_of

P_WEIGHTS, P_WORK = "p0", "p1"
ALIGN = 8
WORK_LIMIT = 1 << 16  # working-area offsets travel in 16-bit immediates (gemm, vreq)
MAX_ROW_BYTES = 4096  # load/store bytes per row, vector n
MAX_ROWS = 256  # load/store rows
LOOP_REGS = ("r15", "r14", "r7")  # for a convolution's reduction loop (not a result)
# Registers a convolution's row-group loop may step besides (r3 selects the segment
# only at the program's entry; the others hold vargmax results when a model has them).
PIPE_REGS = ("r3", "r4", "r5", "r6", "r7", "r14", "r15")
LOOP_TILES = 8  # full reduction tiles per kernel row from which they loop
# A GEMM that fits whole may still run as M tiles whose loads and stores overlap
# the compute: the counts tried, and the fewest rows a tile may have (shorter
# tiles pay a weight tile's load for too few rows).
OVERLAP_TILE_COUNTS = (2, 3, 4, 6, 8)
MIN_OVERLAP_ROWS = 48


class TooBig(CompileError):
    """A unit's working set does not fit at once: the scratchpad's working
    partition, the accumulator rows, or one ``gemm`` (4096 rows). The lowering
    then splits the unit's rows into M tiles when it can."""


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def tile_sizes(rows: int, count: int) -> list[int]:
    """``rows`` split into ``count`` tiles as equal as they can be (longer first)."""
    base, extra = divmod(rows, count)
    return [base + 1] * extra + [base] * (count - extra)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- weight blobs --------------------------------------------------------------------------


@dataclass
class Blob:
    """A node's constants packed in the order its code reads them.

    For each output-column tile ``j``: its weight tiles (dense ``k x n`` int8, in
    reduction order), then its int32 biases, then (per-channel requantization) its
    ``vqtab`` entries. Full column tiles all have the same size, so code can step
    from one to the next with one register.

    Members
    -------
    node : node name.
    data : the bytes, padded to ``rows * row_bytes``.
    rows, row_bytes : the one DMA transfer that moves it.
    tiles : byte offset of each weight tile, by ``(j, i)``.
    bias : byte offset of column tile ``j``'s biases (empty without bias).
    qtab : byte offset of column tile ``j``'s requantization table (empty when the
        node requantizes per tensor).
    dram : offset in the constants region.
    slot : tag slot (0: not resident, loaded into the working area each time).
    sp : offset in the weights partition when resident.
    """

    node: str
    data: bytes
    rows: int
    row_bytes: int
    tiles: dict
    bias: dict
    qtab: dict = field(default_factory=dict)
    dram: int = 0
    slot: int = 0
    sp: int = 0

    def j_stride(self) -> int:
        """Bytes from column tile 0 to column tile 1."""
        return self.tiles.get((1, 0), len(self.data)) - self.tiles[(0, 0)]


def qtab_entries(requant: Requant) -> bytes:
    """The ``vqtab`` entries of a per-channel requantization, one per output channel:
    the int32le multiplier, the shift byte, zero padding (``firmware.isa``)."""
    entries = np.zeros((len(requant.mult), QTAB_ENTRY_BYTES), dtype=np.uint8)
    entries[:, :4] = np.asarray(requant.mult, dtype="<i4").view(np.uint8).reshape(-1, 4)
    entries[:, 4] = requant.shift
    return entries.tobytes()


def _blob(node: str, w2d: np.ndarray, red_tiles: list[tuple[int, int]], bias,
          cols: int, requant: Requant | None = None) -> Blob:
    """Pack ``w2d`` (reduction x outputs) as column tiles of ``red_tiles`` (start, k)."""
    parts: list[bytes] = []
    tiles, biases, qtabs, at = {}, {}, {}, 0
    table = qtab_entries(requant) if requant is not None and requant.per_channel else None
    nn = w2d.shape[1]
    for j in range(ceil_div(nn, cols)):
        for i, (r0, k) in enumerate(red_tiles):
            raw = np.ascontiguousarray(w2d[r0:r0 + k, j * cols:(j + 1) * cols],
                                       dtype=np.int8).tobytes()
            tiles[(j, i)] = at
            parts.append(raw)
            at += len(raw)
        if bias is not None:
            pad = align(at, 4) - at
            parts.append(b"\0" * pad)
            at += pad
            raw = np.asarray(bias[j * cols:(j + 1) * cols], dtype="<i4").tobytes()
            biases[j] = at
            parts.append(raw)
            at += len(raw)
        if table is not None:
            raw = table[j * cols * QTAB_ENTRY_BYTES:(j + 1) * cols * QTAB_ENTRY_BYTES]
            qtabs[j] = at
            parts.append(raw)
            at += len(raw)
        pad = align(at, 4) - at  # keep every column tile's start 4-aligned
        parts.append(b"\0" * pad)
        at += pad
    data = b"".join(parts)
    rows = max(1, ceil_div(len(data), MAX_ROW_BYTES))
    if rows > MAX_ROWS:
        raise CompileError(f"{len(data)} bytes of constants exceed one DMA transfer "
                           f"({MAX_ROWS} x {MAX_ROW_BYTES})", node)
    row_bytes = ceil_div(len(data), rows)
    data += b"\0" * (rows * row_bytes - len(data))
    return Blob(node, data, rows, row_bytes, tiles, biases, qtabs)


def _shift(at, delta: int):
    """An address (an offset, or ``(register, offset)``) ``delta`` bytes on."""
    return (at[0], at[1] + delta) if isinstance(at, tuple) else at + delta


def gemm_tiles(k: int, rows: int) -> list[tuple[int, int]]:
    """Reduction tiles (start, size) of a K-long reduction on a ``rows``-deep array."""
    return [(t * rows, min(rows, k - t * rows)) for t in range(ceil_div(k, rows))]


def conv_tiles(kh: int, red: int, rows: int) -> list[tuple[int, int]]:
    """Reduction tiles per kernel row: each row's KW*C window bytes, tiled."""
    return [(r * red + t0, k) for r in range(kh) for t0, k in gemm_tiles(red, rows)]


def gemm_blob(n: QGemm, config: NPUConfig, perm) -> Blob:
    w = n.weight if perm is None else n.weight[perm, :]
    return _blob(n.name, w, gemm_tiles(w.shape[0], config.rows), n.bias, config.cols,
                 n.requant)


def conv_blob(n: QConv, config: NPUConfig) -> Blob:
    """Rows ordered (kh, kw, c): a window row of a channels-last input is contiguous."""
    oc, c, kh, kw = n.weight.shape
    w2d = n.weight.transpose(2, 3, 1, 0).reshape(kh * kw * c, oc)
    return _blob(n.name, w2d, conv_tiles(kh, kw * c, config.rows), n.bias, config.cols,
                 n.requant)


# ---- the program ---------------------------------------------------------------------------


@dataclass
class Placement:
    """Where every DRAM tensor and constant lives (offsets from r2 / r1)."""

    arena: dict[str, int] = field(default_factory=dict)
    arena_bytes: int = 0
    blobs: dict[str, Blob] = field(default_factory=dict)
    const_bytes: int = 0
    weights_bytes: int = 0  # size of the resident-weights partition


class Lowering:
    """Generates the code of units into an :class:`Emitter`.

    ``tensor`` maps every visible tensor name to its :class:`~host.ir.Tensor`;
    ``root`` resolves aliases (Flatten/Reshape) to the tensor holding the bytes;
    ``layout`` gives each root's device layout; ``instruction_price`` is what an
    instruction of the bank costs, in cycles, where ways of lowering a unit
    compete (:func:`.stream.fastest`).
    """

    def __init__(self, config: NPUConfig, emit: Emitter, place: Placement, tensor, root,
                 layout, instruction_price: float = 0.0):
        self.config = config
        self.e = emit
        self.place = place
        self.tensor = tensor
        self.root = root
        self.layout = layout
        self.work_size = config.sp_bytes - place.weights_bytes
        # Cycles an instruction is worth where ways of lowering a unit compete,
        # and each competition's options: (predicted cycles, instructions).
        self.instruction_price = instruction_price
        self.choices: list[list[tuple[float, int]]] = []
        self.choosing = 0  # nesting depth of stream.fastest
        self.variants: dict = {}  # unit node names -> variants.Variant (compile_model's)
        self.variant = DEFAULT  # the current unit's

    # ---- one unit ---------------------------------------------------------------------
    def unit(self, u: UnitInfo) -> dict:
        """Emit unit ``u``; return its resource use.

        A unit whose working set fits is emitted whole (every tensor on chip at
        once). Otherwise its rows are split into M tiles streamed through the
        working partition (:meth:`_unit_tiled`), or a GEMM's weights or a
        convolution's image or weights stream through it (:mod:`.stream`); a
        unit that cannot be split raises :class:`CompileError` saying why. A GEMM
        whose weights are not resident and larger than :data:`STREAM_BYTES`
        streams them even when they would fit: their loads then overlap its
        compute. A convolution alone in its unit is emitted whole (when it fits)
        and streamed, and :func:`.stream.fastest` keeps the faster. Pointwise
        convolutions are lowered as the GEMMs they are (:meth:`gemm_view`).
        """
        from .bandpair import band_pair, stream_pair  # it builds on this module

        self.variant = v = variant_of(self.variants, u.nodes)
        if v.m_tiles is not None:
            return self._unit_m_tiles(u, v.m_tiles)
        checkpoint = self.e.checkpoint()
        viewed = dataclasses.replace(u, nodes=[self.gemm_view(n) for n in u.nodes])
        if band_pair(viewed, self.config):
            # A depthwise + pointwise pair too large for the other ways streams
            # its image in bands, the intermediate on chip.
            try:
                return self._unit_ways(u, viewed, checkpoint)
            except CompileError as err:
                self.e.rollback(checkpoint)
                return stream_pair(self, viewed, err)
        return self._unit_ways(u, viewed, checkpoint)

    def _unit_ways(self, u: UnitInfo, viewed: UnitInfo, checkpoint) -> dict:
        """:meth:`unit`'s ways but the band-streamed pair."""
        from .stream import (  # they build on this module
            STREAM_BYTES,
            NotStreamable,
            stream_unit,
            streamable,
            streamed_chain,
            streams_weights,
            with_prologue,
        )

        if viewed.nodes != u.nodes and streamable(u, self.config) \
                and not self._fits_whole(viewed):
            # A pointwise convolution too large to sit on chip whole streams its
            # image in bands, in a hardware loop (the GEMM's M tiles are unrolled).
            try:
                return self._conv_unit(u)
            except CompileError:
                self.e.rollback(checkpoint)
        u = viewed
        if streamable(u, self.config) and isinstance(u.nodes[0], QConv):
            return self._conv_unit(u)
        gemm = self.place.blobs.get(u.nodes[-1].name)
        if (streamable(u, self.config) and isinstance(u.nodes[0], QGemm)
                or with_prologue(u, self.config)) and not gemm.slot \
                and len(gemm.data) > STREAM_BYTES \
                or streamed_chain(u, self.config, self.root) \
                and any(streams_weights(n, self) for n in u.nodes):
            try:
                return stream_unit(self, u, CompileError("weights stream"))
            except CompileError:
                self.e.rollback(checkpoint)
        best = self._gemm_tile_count(u, 1)
        if best > 1:
            # M tiles overlap the loads of the next tile and the stores of the last
            # with the compute, at the price of running every weight tile once per
            # M tile: the cost model says how many, if any.
            try:
                return self._gemm_tilings(u, CompileError(f"unit {u.id}"), [1, best])
            except CompileError:
                self.e.rollback(checkpoint)
        try:
            return self._unit_whole(u)
        except TooBig as err:
            self.e.rollback(checkpoint)
            try:
                return self._gemm_tilings(u, err, [0, self._gemm_tile_count(u, 0)])
            except CompileError as tiled:
                if not streamable(u, self.config, fits=False):
                    raise
                self.e.rollback(checkpoint)
                try:
                    return stream_unit(self, u, err)
                except NotStreamable:
                    raise tiled from None

    def _unit_m_tiles(self, u: UnitInfo, count: int) -> dict:
        """Emit ``u`` in ``count`` M tiles (1: whole), as its variant asks."""
        viewed = dataclasses.replace(u, nodes=[self.gemm_view(n) for n in u.nodes])
        if count == 1:
            return self._unit_whole(viewed)
        why = refuse(self.variant, "M tiles")
        try:
            rows, _ = self._row_split(viewed)
        except CompileError as err:
            raise self._refuse(why, str(err)) from None
        if count > rows:
            raise self._refuse(why, f"{rows} rows")
        return self._gemm_tilings(viewed, why, [count])

    def _conv_unit(self, u: UnitInfo) -> dict:
        """Emit a unit of one convolution whole or streamed: a convolution that
        fits whole may still be faster streamed (its loads and stores overlap its
        compute), the cost model says (or the unit's variant's way)."""
        from .stream import fastest, stream_unit  # they build on this module

        refused = []

        def whole():
            try:
                return self._unit_whole(u)
            except TooBig as err:
                refused.append(err)
                raise

        def streamed():
            return stream_unit(self, u, refused[0] if refused else CompileError(f"unit {u.id}"))

        way = self.variant.way
        return fastest(self, [whole] if way == "whole" else [streamed] if way else
                       [whole, streamed])

    def _fits_whole(self, u: UnitInfo) -> bool:
        """Whether unit ``u`` fits the working partition whole (emitted and rolled
        back)."""
        checkpoint = self.e.checkpoint()
        try:
            self._unit_whole(u)
        except TooBig:
            return False
        finally:
            self.e.rollback(checkpoint)
        return True

    def gemm_view(self, n: Node) -> Node:
        """``n``, or for a pointwise convolution (1x1, stride 1, no padding, one
        group) on a channels-last input the GEMM it is: ``N*H*W`` pixel rows of
        ``C`` bytes times ``C x OC`` weights, whose blob is the convolution's. The
        unit then takes the GEMM paths: one long ``gemm`` per weight tile, M tiling,
        streamed weights."""
        if not isinstance(n, QConv) or n.group != 1 or n.weight.shape[2:] != (1, 1) \
                or tuple(n.strides) != (1, 1) or any(n.pads):
            return n
        lay = self.layout(n.inputs[0])
        if lay.axes != (0, 2, 3, 1) or lay.src_shape != self.tensor[n.inputs[0]].shape:
            return n
        return QGemm(n.name, list(n.inputs), list(n.outputs), device=n.device,
                     weight=np.ascontiguousarray(n.weight[:, :, 0, 0].T), bias=n.bias,
                     requant=n.requant)

    def _reset(self):
        self.sp: dict[str, int] = {}
        self._padded_at: dict = {}  # (input root, mapping) -> its padded buffer
        self._loaded_padded: set[str] = set()  # inputs loaded straight into it
        self._dead: set[str] = set()  # the current node's inputs nothing reads after it
        self._top = 0
        self._sizes: dict[int, int] = {}  # allocated offset -> its bytes
        self._free: list[tuple[int, int]] = []  # (offset, bytes) of released buffers
        self._blob_at: dict[str, tuple[str, int]] = {}
        self._tile: tuple[int, int] | None = None  # (rows M, rows of this tile)
        self._to_dram: set[str] = set()  # the current node's outputs only stored after it
        self._later: list[Node] = []  # the nodes of a whole unit after the current one
        self._conv_plan = None  # (conv_cycles plan, tiles, OC) of the last convolution
        # Outputs held at a row pitch wider than their rows: (rows, pitch bytes, row bytes).
        self._wide: dict[str, tuple[int, int, int]] = {}

    def _begin(self, u: UnitInfo, note: str = ""):
        self.e.op(f"region.begin {u.id}")
        self.e.comment("unit " + ", ".join(f"{n.op} {n.name}" for n in u.nodes) + note)

    def _unit_whole(self, u: UnitInfo) -> dict:
        e = self.e
        work = e.work.snapshot()
        self._reset()
        self._begin(u)
        stats = {"macs": 0}  # DMA bytes and the rest: stats["work"]
        # Load groups: unit inputs with the first node's constants, then one group
        # per later node that has constants; each group ends in a token.
        groups: list[list] = [[("tensor", t) for t in u.inputs]]
        first_of = {}
        for i, n in enumerate(u.nodes):
            blob = self.place.blobs.get(n.name)
            if blob is not None:
                if i == 0:
                    groups[0].append(("blob", blob))
                else:
                    groups.append([("blob", blob)])
                    first_of[n.name] = len(groups) - 1
        if groups[0]:
            first_of[u.nodes[0].name] = 0
        padded = self._input_to_pad(u)
        for g in groups:
            for i, (kind, what) in enumerate(g):
                push = "next" if i == len(g) - 1 else ""
                if kind == "tensor":
                    if not (padded and padded[0] == what
                            and self._load_padded(u.nodes[0], padded[1], push)):
                        self._load_tensor(what, push)
                else:
                    self._load_blob(what, push)
        stored = set(u.outputs)
        for i, n in enumerate(u.nodes):
            if n.name in first_of:
                e.pop_next_compute()
            later = {self.root(t) for m in u.nodes[i + 1:] for t in m.inputs}
            self._dead = {self.root(t) for t in n.inputs} - later - stored
            self._to_dram = {self.root(o) for o in n.outputs} & stored - later
            self._later = u.nodes[i + 1:]
            stats["macs"] += self.node(n)
            self._release(self._dead)
            for o in n.outputs:
                r = self.root(o)
                if r in stored:
                    e.push_after_last_compute("next")
                    self._store_tensor(r)
                    stored.discard(r)
        if stored:
            raise CompileError(f"unit {u.id}: outputs {sorted(stored)} are never produced")
        e.op(f"region.end {u.id}")
        stats["scratchpad_bytes"] = self._top
        stats["m_tiles"] = 1
        stats["work"] = e.work.since(work)
        if len(u.nodes) == 1 and self._conv_plan is not None:  # a convolution alone
            stats["cycles"] = whole_conv_cycles(self.config, *self._conv_plan, stats["work"])
        return stats

    def _input_to_pad(self, u: UnitInfo):
        """(input root, mapping) when the unit's first node is a convolution whose
        input comes from DRAM for it alone: it can load straight into its padded
        buffer (:meth:`_load_padded`). None otherwise."""
        n = u.nodes[0]
        if not isinstance(n, QConv) or n.group != 1:
            return None
        x = self.root(n.inputs[0])
        lay = self.layout(x)
        if x not in u.inputs or x in u.outputs or \
                lay.axes != (0, 2, 3, 1) or lay.src_shape != self.tensor[x].shape or \
                any(self.root(t) == x for m in u.nodes[1:] for t in m.inputs):
            return None
        later = {self.root(t) for m in u.nodes[1:] for t in m.inputs}
        self._to_dram = {self.root(o) for o in n.outputs} & set(u.outputs) - later
        return x, self.conv_rows(n, copied=True, wide=self.wide_ok(n))

    # ---- M tiling -----------------------------------------------------------------------
    def _row_split(self, u: UnitInfo) -> tuple[int, dict[str, int]]:
        """The unit's independent rows ``M`` and the bytes per row of every tensor
        it touches (by root). Raises ``CompileError`` saying why rows are not
        independent."""
        for n in u.nodes:
            if not isinstance(n, (QGemm, QAdd, Clip)):
                raise CompileError(f"{n.op} {n.name!r} does not work on independent rows "
                                   "(only GEMMs and element-wise adds and clips split)")
        gemms = [n for n in u.nodes if isinstance(n, QGemm)]
        if gemms:
            ms = {self.tensor[self.root(n.inputs[0])].size // n.weight.shape[0]
                  for n in gemms}
            if len(ms) > 1:
                raise CompileError(f"its GEMMs have different row counts {sorted(ms)}")
            rows = ms.pop()
        else:  # element-wise only: every byte is a row
            rows = self.tensor[self.root(u.nodes[0].inputs[0])].size
        row_bytes = {}
        for n in u.nodes:
            for t in (*n.inputs, *n.outputs):
                r = self.root(t)
                size = self.tensor[r].size
                if size % rows:
                    raise CompileError(f"tensor {r!r} ({size} bytes) is not {rows} rows")
                row_bytes[r] = size // rows
        return rows, row_bytes

    def _one_gemm(self, u: UnitInfo):
        """(rows, k, n, bytes of weights loaded each run) of a unit of one GEMM that
        is not a GEMV, else None."""
        from . import gemv  # it builds on this module

        n = u.nodes[0]
        blob = self.place.blobs.get(n.name)
        if len(u.nodes) != 1 or not isinstance(n, QGemm) or isinstance(blob, gemv.GemvBlob):
            return None
        k, nn = n.weight.shape
        const = 0 if blob is None or blob.slot else len(blob.data)
        return self.tensor[self.root(n.inputs[0])].size // k, k, nn, const

    def _gemm_cycles(self, u: UnitInfo, count: int) -> float:
        from .cost import m_tiled_cycles

        rows, k, nn, const = self._one_gemm(u)
        return m_tiled_cycles(self.config, tile_sizes(rows, count), k, nn, k, nn, const)

    def _gemm_tile_count(self, u: UnitInfo, fewest: int) -> int:
        """How many M tiles a unit of one GEMM (not a GEMV) runs fastest in by
        :func:`.cost.m_tiled_cycles`: ``fewest`` (0: as few as fit) or one of
        :data:`OVERLAP_TILE_COUNTS` (tiles of at least :data:`MIN_OVERLAP_ROWS`
        rows). ``fewest`` for other units."""
        gemm = self._one_gemm(u)
        if gemm is None or gemm[0] <= 1:
            return fewest
        counts = [c for c in OVERLAP_TILE_COUNTS if gemm[0] >= c * MIN_OVERLAP_ROWS]
        return min([fewest, *counts],
                   key=lambda c: self._gemm_cycles(u, max(c, 1)) if c else float("inf"))

    def _gemm_tilings(self, u: UnitInfo, why: CompileError, counts: list[int]) -> dict:
        """Emit ``u`` (one GEMM) whole (count 1) or as M tiles (at least the count;
        0: as few as fit), the fastest of ``counts`` by :func:`.cost.m_tiled_cycles`
        (:func:`.stream.fastest`: more tiles take more instructions)."""
        from .stream import fastest  # it builds on this module

        if self._one_gemm(u) is None:  # (a chain of GEMMs, adds and clips)
            return self._unit_tiled(u, why, counts[0])

        def way(count):
            if count == 1:
                return self._unit_whole(u)
            return self._unit_tiled(u, why, count)

        return fastest(self, [lambda c=c: way(c) for c in dict.fromkeys(counts)],
                       lambda stats: self._gemm_cycles(u, stats["m_tiles"]))

    def _unit_tiled(self, u: UnitInfo, why: CompileError, count: int = 0) -> dict:
        """Emit ``u`` as M tiles (at least ``count``): rows of its inputs stream
        through the working partition, every node runs on a tile (weights stay
        where they are: loaded once, resident or in the working area), and the
        tile's outputs leave. More tiles than fit overlap more of the loads and
        stores with the compute (:meth:`_gemm_tilings`).

        Inputs and stored outputs are double-buffered; in program order tile
        ``t + 1``'s loads come before tile ``t``'s compute, so they overlap it.
        Tokens (never inside a hardware loop): load>compute per tile (its
        inputs, with tile 0 also the constants); compute>load when a tile is done
        with its input buffers (tile ``t + 2`` reuses them); compute>store per
        stored tensor; store>compute when a tile's stores are done (tile ``t + 2``
        writes their buffers). Intermediates have one buffer (compute is in order).
        """
        e = self.e
        try:
            rows, row_bytes = self._row_split(u)
        except CompileError as err:
            raise self._refuse(why, f"M tiling cannot split unit {u.id}: {err}") from None
        work = e.work.snapshot()
        self._reset()
        blobs = [self.place.blobs[n.name] for n in u.nodes if n.name in self.place.blobs]
        try:
            for b in blobs:
                self._place_blob(b)
        except TooBig as err:
            raise self._refuse(why, f"M tiling: {err}") from None
        loaded = list(u.inputs)
        stored = list(u.outputs)
        mids = [r for r in row_bytes
                if r not in loaded and r not in stored and r in self._produced(u)]
        bufs = [(r, 2) for r in loaded + stored] + [(r, 1) for r in mids]
        per_row = sum(k * row_bytes[r] for r, k in bufs)
        room = self.work_limit() - self._top - ALIGN * sum(k for _, k in bufs)
        cap = max(0, room) // per_row
        if any(isinstance(n, QGemm) for n in u.nodes):
            cap = min(cap, self.config.acc_rows, 4096)
        if cap < 1:
            raise self._refuse(why, f"M tiling: one row of unit {u.id} needs {per_row} bytes "
                               f"of scratchpad (double-buffered), the working partition "
                               f"has {max(0, room)} left after the constants")
        count = max(count, ceil_div(rows, cap))
        sizes = tile_sizes(rows, count)
        starts = list(itertools.accumulate(sizes, initial=0))
        tile = sizes[0]
        buffers = {r: [self.alloc(tile * row_bytes[r], r) for _ in range(k)] for r, k in bufs}

        def use(t: int):
            self._tile = (rows, sizes[t])
            for r, b in buffers.items():
                self.sp[r] = b[t % len(b)]

        def load(t: int) -> bool:
            use(t)
            items = [("blob", b) for b in blobs] if t == 0 else []
            items += [("tensor", r) for r in loaded]
            for i, (kind, what) in enumerate(items):
                push = "next" if i == len(items) - 1 else ""
                if kind == "blob":
                    self._load_blob(what, push)
                else:  # buffer t % 2 was read by tile t - 2
                    self._load_tensor(what, push, start=starts[t] * row_bytes[what],
                                      pop="next" if i == 0 and t >= 2 else "")
            return bool(items)

        self._begin(u, f" (M tiled: {count} tiles of {tile} rows or fewer, {rows} rows)")
        stats = {"macs": 0}
        has_load = [load(0)]
        for t in range(count):
            if t + 1 < count:
                has_load.append(load(t + 1))
            use(t)
            if has_load[t]:
                e.pop_next_compute("prev")
            if t >= 2 and stored:  # tile t - 2's stores freed the output buffers
                e.pop_next_compute("next")
            left = list(stored)
            for n in u.nodes:
                stats["macs"] += self.node(n)
                for o in n.outputs:
                    r = self.root(o)
                    if r in left:
                        left.remove(r)
                        e.push_after_last_compute("next")
                        last = not left and t + 2 < count
                        self._store_tensor(r, start=starts[t] * row_bytes[r],
                                           push="prev" if last else "")
            if left:
                raise CompileError(f"unit {u.id}: outputs {sorted(left)} are never produced")
            if t + 2 < count and loaded:  # tile t + 2 may load into these input buffers
                e.push_after_last_compute("prev")
        e.op(f"region.end {u.id}")
        self._tile = None
        stats["scratchpad_bytes"] = self._top
        stats["m_tiles"] = count
        # Loads and stores overlap the tiles' compute as a streamed unit's steps do.
        stats["work"] = {**e.work.since(work), "streamed": count if count > 1 else 0}
        return stats

    def _produced(self, u: UnitInfo) -> set[str]:
        return {self.root(o) for n in u.nodes for o in n.outputs}

    @staticmethod
    def _refuse(why: CompileError, reason: str) -> CompileError:
        err = CompileError(f"{why} ({reason})")
        err.node = why.node
        return err

    # ---- scratchpad allocation ---------------------------------------------------------
    def work_limit(self) -> int:
        """Bytes of the working partition a unit can address."""
        return min(self.work_size, WORK_LIMIT)

    def alloc(self, nbytes: int, what: str) -> int:
        size = align(nbytes)
        for i, (at, room) in enumerate(self._free):
            if room >= size:  # a released buffer: only compute wrote and read it
                self._free[i] = (at + size, room - size)
                self._sizes[at] = size
                return at
        at = self._top
        self._sizes[at] = size
        self._top = align(at + nbytes)
        if self._top > self.work_limit():
            raise TooBig(f"{what}: the unit needs {self._top} bytes of scratchpad, "
                         f"the working partition has {self.work_limit()}")
        return at

    def _release(self, dead: set[str]):
        """Give the buffers of ``dead`` tensors (a whole unit's intermediates and
        inputs no later node reads, never a stored one) and their padded copies
        back to :meth:`alloc`. Their last readers are on the compute queue, which
        runs in order, so a later compute instruction may write there; the
        unit's loads were all issued before its first node."""
        # in name order: a set's order varies by process, and so would the program
        gone = [self.sp.pop(r) for r in sorted(dead) if r in self.sp]
        gone += [self._padded_at.pop(k) for k in list(self._padded_at) if k[0] in dead]
        live = set(self.sp.values()) | set(self._padded_at.values())
        self._free += [(at, self._sizes[at]) for at in dict.fromkeys(gone) if at not in live]

    def size(self, tensor: str) -> int:
        """Bytes of ``tensor`` the current code covers: all of it, or in an M tile
        its rows of the tile."""
        t = self.tensor[self.root(tensor)]
        if self._tile is None:
            return t.size
        rows, tile_rows = self._tile
        return t.size // rows * tile_rows

    def at(self, tensor: str) -> int:
        r = self.root(tensor)
        if r not in self.sp:
            raise CompileError(f"tensor {r!r} is not on chip in this unit")
        return self.sp[r]

    def out(self, tensor: str) -> int:
        r = self.root(tensor)
        if r not in self.sp:
            self.sp[r] = self.alloc(self.tensor[r].size, r)
        return self.sp[r]

    # ---- DMA ------------------------------------------------------------------------------
    def _pieces(self, size: int, max_rows: int = MAX_ROWS):
        """(offset, rows, bytes) pieces covering ``size`` contiguous bytes: DMA
        transfers (at most ``MAX_ROWS`` rows) or vector operations (4096 rows)."""
        out, at = [], 0
        while at < size:
            left = size - at
            if left <= MAX_ROW_BYTES:
                out.append((at, 1, left))
                break
            rows = min(max_rows, left // MAX_ROW_BYTES)
            out.append((at, rows, MAX_ROW_BYTES))
            at += rows * MAX_ROW_BYTES
        return out

    def _sp_reg(self, offset: int, imm_bits: int) -> tuple[str, int]:
        if offset < 1 << imm_bits:
            return "r0", offset
        return self.e.reg(offset), 0

    def _load_tensor(self, name: str, push: str, *, start: int = 0, pop: str = ""):
        """Load ``size(name)`` bytes of ``name`` from byte ``start`` in DRAM; the
        first transfer pops ``pop``, the last pushes ``push``."""
        sp = self.out(name)
        pieces = self._pieces(self.size(name))
        for i, (off, rows, nbytes) in enumerate(pieces):
            dram = self.e.reg(self.place.arena[name] + start + off, base="r2")
            reg, imm = self._sp_reg(sp + off, 11)
            self.e.op(f"load {P_WORK}, {reg}, {dram}, r0, {rows}, {nbytes}, off={imm}",
                      pop=pop if i == 0 else "",
                      push=push if i == len(pieces) - 1 else "", queue="load")

    def _place_blob(self, b: Blob) -> tuple[str, int]:
        """Where blob ``b`` lives in this unit (allocated in the working area the
        first time when it is not resident)."""
        if b.node not in self._blob_at:
            if b.slot:
                self._blob_at[b.node] = (P_WEIGHTS, b.sp)
            else:
                self._blob_at[b.node] = (P_WORK, self.alloc(len(b.data),
                                                            f"constants of {b.node}"))
        return self._blob_at[b.node]

    def _load_blob(self, b: Blob, push: str):
        part, sp = self._place_blob(b)
        tag = f", tag={b.slot}" if b.slot else ""
        dram = self.e.reg(b.dram, base="r1")
        reg, imm = self._sp_reg(sp, 11)
        self.e.op(f"load {part}, {reg}, {dram}, r0, {b.rows}, {b.row_bytes}, off={imm}{tag}",
                  push=push, queue="load")

    def _store_tensor(self, name: str, *, start: int = 0, push: str = ""):
        """Store ``size(name)`` bytes of ``name`` to byte ``start`` in DRAM; the
        first transfer pops the compute token, the last pushes ``push``."""
        sp = self.at(name)
        if name in self._wide:
            rows, pitch, row_bytes = self._wide[name]
            at, dram, *temps = self.e.scratch(5)
            self.e.point(at, sp)
            self.e.point(dram, ("r2", self.place.arena[name] + start))
            self.store_rows(at, dram, rows, pitch, row_bytes, temps, pop="prev", push=push)
            return
        pieces = self._pieces(self.size(name))
        for i, (off, rows, nbytes) in enumerate(pieces):
            dram = self.e.reg(self.place.arena[name] + start + off, base="r2")
            reg, imm = self._sp_reg(sp + off, 11)
            self.e.op(f"store {P_WORK}, {reg}, {dram}, r0, {rows}, {nbytes}, off={imm}",
                      pop="prev" if i == 0 else "",
                      push=push if i == len(pieces) - 1 else "", queue="store")

    def store_rows(self, sp: str, dram: str, rows: int, pitch: int, row_bytes: int,
                   temps, pop: str = "", push: str = ""):
        """Store ``rows`` rows of ``row_bytes`` held ``pitch`` bytes apart at register
        ``sp`` densely to DRAM at register ``dram``: all but the last as rows of
        ``pitch`` bytes with a DRAM stride of ``row_bytes`` (each row's extra bytes
        land on the next row, which the DMA writes after them), then the last
        alone (three ``temps`` registers; transfers of at most ``MAX_ROWS`` rows).
        The first transfer pops ``pop``, the last pushes ``push``."""
        e = self.e
        if rows == 1 or pitch == row_bytes:
            e.op(f"store {P_WORK}, {sp}, {dram}, r0, {rows}, {row_bytes}", pop=pop,
                 push=push, queue="store")
            return
        stride, ta, tb = temps  # read at dispatch: free again after each store
        e.op(f"li {stride}, {row_bytes}")
        pieces = [(r, min(MAX_ROWS, rows - 1 - r), pitch) for r in range(0, rows - 1, MAX_ROWS)]
        pieces.append((rows - 1, 1, row_bytes))
        for i, (r, count, nbytes) in enumerate(pieces):
            at, to = sp, dram
            if r:
                at, to = ta, tb
                e.op(f"addi {ta}, {sp}, {r * pitch}")
                e.op(f"addi {tb}, {dram}, {r * row_bytes}")
            e.op(f"store {P_WORK}, {at}, {to}, {stride if count > 1 else 'r0'}, {count}, "
                 f"{nbytes}", pop=pop if i == 0 else "",
                 push=push if i == len(pieces) - 1 else "", queue="store")

    def conv_out(self, n: QConv, rows: ConvRows) -> int:
        """Offset of ``n``'s output buffer (allocated the first time), at the row
        pitch of mapping ``rows``."""
        y = self.root(n.outputs[0])
        bn, oc, oh, ow = self.tensor[y].shape
        if not rows.wide:
            return self.out(y)
        if y not in self.sp:  # the images one after the other, every row at the pitch
            self.sp[y] = self.alloc(rows.out_bytes(bn * oh, ow, oc), y)
        self._wide[y] = (bn * oh, rows.out_pitch(ow) * oc, ow * oc)
        return self.sp[y]

    # ---- operators --------------------------------------------------------------------
    def node(self, n: Node) -> int:
        """Emit one node's compute code; return its MAC count."""
        if isinstance(n, QGemm):
            return self.qgemm(n)
        if isinstance(n, QConv) and n.group == 1:
            return self.qconv(n)
        if isinstance(n, (QConv, QAvgPool)):
            from . import depthwise  # it builds on this module

            return depthwise.lower_grouped(self, n) if isinstance(n, QConv) else \
                depthwise.lower_avgpool(self, n)
        if isinstance(n, MaxPool):
            self.maxpool(n)
        elif isinstance(n, Clip):
            self.clip(n)
        elif isinstance(n, QAdd):
            self.qadd(n)
        elif isinstance(n, ArgMax):
            self.argmax(n)
        else:
            raise CompileError(f"no lowering for {n.op}", n.name)
        return 0

    def _requant_cfg(self, r):
        """The cfg writes of a requantization (a per-channel one's multipliers and
        shifts come from the blob's table, ``vqtab`` per column tile)."""
        scale = () if r.per_channel else (("qmul", r.mult), ("qshift", r.shift))
        for name, v in (*scale, ("qzp", r.zp), ("clip_lo", r.lo), ("clip_hi", r.hi)):
            self.e.set_cfg(name, v)

    def _weights(self, n: Node) -> tuple[str, int, Blob]:
        part, sp = self._blob_at[n.name]
        return part, sp, self.place.blobs[n.name]

    def requant_tile(self, part: str, blob: Blob, j: int, wj: str, acc: str, m: int,
                     n_j: int, y: str, split=None, breg: str | None = None):
        """Bias and requantization of column tile ``j`` (its constants at register
        ``wj``): ``m`` accumulator rows from ``acc`` to int8 at ``y``. With ``split``
        = (output rows, accumulator pitch, positions, output row bytes, two free
        registers) only the first positions of each output row's accumulator rows
        are requantized, one dense output row after the other (a long convolution
        GEMM's rows past an output row's end are dropped).

        With a free register ``breg`` the bias is added while requantizing
        (``vreqb ... col=1``, ``breg`` pointing at the tile's biases): one pass of
        the vector unit over the rows instead of a ``vbias`` pass and a ``vreq``
        pass, which the array waits for."""
        e, bus = self.e, self.config.bus_bytes
        # Split, each output row's vreqb reads the bias words again: fused only
        # where that costs less than a vbias pass over every accumulator row.
        words = -(-4 * n_j // bus)
        passes = split[0] if split else 1
        fused = bool(blob.bias) and breg is not None and passes * words < m + words + 6
        if fused:
            e.op(f"addi {breg}, {wj}, {blob.bias[j] - blob.tiles[(j, 0)]}")
        elif blob.bias:
            e.compute(f"vbias {part}, {wj}, {acc}, {m}, {n_j}, "
                      f"off={blob.bias[j] - blob.tiles[(j, 0)]}")
        tab = ""
        if blob.qtab:  # this column tile's multipliers and shifts
            e.compute(f"vqtab {part}, {wj}, {n_j}, off={blob.qtab[j] - blob.tiles[(j, 0)]}")
            tab = ", tab=1"

        def requant(dst: str, first: str, rows: int):
            if fused:
                e.compute(f"vreqb {P_WORK}, {dst}, {first}, {rows}, {n_j}, {part}, {breg}"
                          f"{tab}, col=1")
            else:
                e.compute(f"vreq {P_WORK}, {dst}, {first}, {rows}, {n_j}{tab}")

        if split is None:
            requant(y, acc, m)
            return
        nr, pitch, ow, row_bytes, (ra, ry) = split
        e.op(f"addi {ra}, {acc}, 0")
        e.op(f"addi {ry}, {y}, 0")
        end = e.new_label("vreq")
        e.op(f"loop {nr}, {end}")
        requant(ry, ra, ow)
        e.op(f"addi {ra}, {ra}, {pitch}")
        e.op(f"addi {ry}, {ry}, {row_bytes}")
        e.loop_end(end)

    def _column_tiles(self, n: Node, part: str, wsp, blob: Blob, nn: int, m: int,
                      y_off, chain, regs, j0: int = 0, split=None, breg: str | None = None,
                      acc=0):
        """For each output-column tile: ``chain`` (the GEMMs into ``m`` accumulator
        rows), bias, requantization to ``y_off + j*cols`` (row pitch cfg.out_stride;
        ``split``: only some rows, ``breg``: a register the chain leaves free, see
        :meth:`requant_tile`).

        ``wsp``, ``y_off`` and ``acc`` (the first accumulator row) are offsets, or
        ``(register, offset)`` where a base register holds part of the address; ``j0``
        is the blob's first column tile here (streamed weights hold a group of column
        tiles, ``wsp`` at its start).
        Full column tiles run in a hardware loop stepping three registers.
        """
        cfg, e = self.config, self.e
        if m > cfg.acc_rows:
            raise TooBig(f"{m} output rows exceed the {cfg.acc_rows} accumulator rows",
                         n.name)
        full, rem = divmod(nn, cfg.cols)
        stepping = (full + (rem > 0)) * m <= cfg.acc_rows
        # With two accumulator read ports a tile's requantization runs beside the next
        # tile's GEMMs when their rows differ: where the tiles cannot each have rows
        # of their own, they take turns between two regions (the loop runs two tiles
        # a pass).
        alternate = (not stepping and cfg.acc_ports == 2 and 2 * m <= cfg.acc_rows
                     and full + (rem > 0) >= 2)
        wj, yj, aj = regs
        e.point(wj, wsp if isinstance(wsp, tuple) else wsp + blob.tiles[(0, 0)])
        e.point(yj, y_off)
        e.point(aj, acc)

        def one(j: int, n_j: int):
            chain(wj, aj, n_j)
            j += j0
            self.requant_tile(part, blob, j, wj, aj, m, n_j, yj, split, breg)

        def step(acc_step: int = m if stepping else 0):
            e.op(f"addi {wj}, {wj}, {blob.j_stride()}")
            e.op(f"addi {yj}, {yj}, {cfg.cols}")
            if acc_step:
                e.op(f"addi {aj}, {aj}, {acc_step}")

        if alternate:
            def pair():
                one(0, cfg.cols)
                step(m)
                one(0, cfg.cols)
                step(-m)

            e.repeat(full // 2, pair, "cols")
            if full % 2:
                one(0, cfg.cols)
                if rem:
                    step(m)
        elif full >= 2:
            def single():
                one(0, cfg.cols)
                step()

            e.repeat(full, single, "cols")
        elif full == 1:
            one(0, cfg.cols)
            if rem:
                step()
        if rem:
            one(full, rem)

    def gemm_chain(self, part: str, k: int, m: int, x_off: int, wo: str, xt: str,
                   unroll: int = 1):
        """The GEMM chain of one output-column tile: a function of (weight register,
        accumulator register, columns) emitting every reduction tile's ``wload`` and
        ``gemm`` of ``m`` rows read at ``x_off`` in the working area. The loop over
        full reduction tiles runs ``unroll`` tiles a pass (immediate offsets),
        where the ``wload`` offsets allow: fewer instructions to dispatch."""
        cfg, e = self.config, self.e
        tiles = gemm_tiles(k, cfg.rows)

        def chain(wj, aj, n_j):
            k0 = tiles[0][1]
            e.compute(f"wload {part}, {wj}, {k0}, {n_j}")
            e.compute(f"gemm.overwrite {P_WORK}, r0, {aj}, {m}, swap=1, off={x_off}")
            if len(tiles) == 1:
                return
            e.op(f"addi {wo}, {wj}, {k0 * n_j}")
            e.op(f"li {xt}, {x_off + tiles[1][0]}")
            uniform = [t for t in tiles[1:] if t[1] == cfg.rows]
            u = max(1, min(unroll, len(uniform) // 2, 256 // (cfg.rows * n_j)))

            def body(count):
                for i in range(count):
                    wo_off = f", off={i * cfg.rows * n_j}" if i else ""
                    x_imm = f", off={i * cfg.rows}" if i else ""
                    e.compute(f"wload {part}, {wo}, {cfg.rows}, {n_j}{wo_off}")
                    e.compute(f"gemm.accumulate {P_WORK}, {xt}, {aj}, {m}, swap=1{x_imm}")
                e.op(f"addi {wo}, {wo}, {count * cfg.rows * n_j}")
                e.op(f"addi {xt}, {xt}, {count * cfg.rows}")

            passes, left = divmod(len(uniform), u)
            if passes >= 2:
                end = e.new_label("k")
                e.op(f"loop {passes}, {end}")
                body(u)
                e.loop_end(end)
            else:
                left += passes * u
            if u > 1 and left:
                body(left)
            else:
                for _ in range(left):
                    body(1)
            if len(uniform) < len(tiles) - 1:  # a last, partial reduction tile
                e.compute(f"wload {part}, {wo}, {tiles[-1][1]}, {n_j}")
                e.compute(f"gemm.accumulate {P_WORK}, {xt}, {aj}, {m}, swap=1")

        return chain

    def qgemm(self, n: QGemm) -> int:
        from . import gemv  # it builds on this module

        if isinstance(self.place.blobs[n.name], gemv.GemvBlob):
            return gemv.lower_whole(self, n)
        e = self.e
        k, nn = n.weight.shape
        m = self.size(n.inputs[0]) // k
        if m > 4096:
            raise TooBig(f"{m} rows exceed one gemm (4096)", n.name)
        x_off, y_off = self.at(n.inputs[0]), self.out(n.outputs[0])
        part, wsp, blob = self._weights(n)
        if m > 1:
            e.set_cfg("gemm_stride", k)
            e.set_cfg("out_stride", nn)
        self._requant_cfg(n.requant)
        wo, xt, *cols = e.scratch(5)
        for r0, rows in self._row_pieces(m, k, nn):
            chain = self.gemm_chain(part, k, rows, x_off + r0 * k, wo, xt)
            self._column_tiles(n, part, wsp, blob, nn, rows, y_off + r0 * nn, chain, cols,
                               breg=wo)
        return m * k * nn

    def _row_pieces(self, m: int, k: int, nn: int) -> list[tuple[int, int]]:
        """(first row, rows) of the pieces a resident-weights GEMM of ``m`` rows runs
        in: whole, or where its column tiles cannot take turns between two
        accumulator regions of ``m`` rows (so each tile's requantization waits for
        the array and the next tile for it), in pieces short enough for two regions
        when :func:`.cost.gemm_tile_cycles` says the requantizations then hidden
        beside the GEMMs outweigh the weight tiles loaded once per piece."""
        from .cost import gemm_tile_cycles

        cfg = self.config
        half = cfg.acc_rows // 2
        if cfg.acc_ports != 2 or m <= half or nn <= cfg.cols or \
                ceil_div(nn, cfg.cols) * m <= cfg.acc_rows:
            return [(0, m)]
        sizes = tile_sizes(m, ceil_div(m, half))
        if sum(gemm_tile_cycles(cfg, t, k, nn) for t in sizes) >= \
                gemm_tile_cycles(cfg, m, k, nn):
            return [(0, m)]
        starts = itertools.accumulate([0, *sizes[:-1]])
        return list(zip(starts, sizes, strict=True))

    def qconv(self, n: QConv) -> int:
        cfg, e = self.config, self.e
        x = self.tensor[n.inputs[0]]
        bn, c, h, w = x.shape
        oc, _, kh, kw = n.weight.shape
        _, _, oh, ow = self.tensor[n.outputs[0]].shape
        sh, sw = n.strides
        pt, pl, pb, pr = n.pads
        self._need_nhwc(n, n.inputs[0])
        rows = self.conv_rows(n, copied=True, wide=self.wide_ok(n))
        xp, hp, img = self._padded_rows(n, n.inputs[0], rows)
        self._reuse_input(n, xp, rows)
        y_off = self.conv_out(n, rows)
        part, wsp, blob = self._weights(n)
        e.set_cfg("gemm_stride", sw * c)
        e.set_cfg("out_stride", oc)
        self._requant_cfg(n.requant)
        wo, xo, ao, *cols = e.scratch(6)
        # Long kernel rows (wide windows of many channels) loop over their
        # reduction tiles when a register is free for it: a shorter program.
        free = [r for r in LOOP_REGS if r not in e.result_regs.values()]
        xq = free[0] if free and kw * c >= LOOP_TILES * cfg.rows else None
        spare = [r for r in PIPE_REGS if r not in e.result_regs.values() and r != xq]

        sizes = [nr for _, nr in groups(oh, rows.per)] * bn
        self._conv_plan = (plan_rows(rows, sizes, ow), len(conv_tiles(kh, kw * c, cfg.rows)), oc)

        def group(nr, x_at, y_at):
            chain = self.conv_chain(n, part, rows, hp, nr, ow, x_at, (wo, xo, ao), xq)
            self._column_tiles(n, part, wsp, blob, oc, rows.acc_rows(nr, ow), y_at, chain,
                               cols, split=rows.split(nr, ow, oc, (xo, ao)), breg=wo)

        for b in range(bn):
            self.conv_groups(n, rows, xp + b * img, y_off + b * oh * rows.out_pitch(ow) * oc,
                             group, spare)
        return bn * oh * ow * oc * c * kh * kw

    def conv_groups(self, n: QConv, rows: ConvRows, x_at, y_at, emit, spare: list[str]):
        """``emit(nr, x_at, y_at)`` for each group of output rows of one image
        (:func:`.convrows.groups`), from input ``x_at`` and output ``y_at`` (offsets,
        or ``(register, offset)``). Runs of equal groups step two ``spare``
        registers in a hardware loop when there are two: a shorter program."""
        e = self.e
        c, sh = self.tensor[n.inputs[0]].shape[1], n.strides[0]
        _, oc, oh, ow = self.tensor[n.outputs[0]].shape
        sizes = [nr for _, nr in groups(oh, rows.per)]
        x_at = _shift(x_at, rows.skew * c)
        for nr, run in itertools.groupby(sizes):
            count = len(list(run))
            dx, dy = nr * rows.x_step(c, sh), nr * rows.out_pitch(ow) * oc
            if count >= 2 and len(spare) >= 2:
                xg, yg = spare[:2]
                for reg, at in ((xg, x_at), (yg, y_at)):
                    e.clobber(reg)
                    e.point(reg, at)
                end = e.new_label("groups")
                e.op(f"loop {count}, {end}")
                emit(nr, (xg, 0), (yg, 0))
                e.op(f"addi {xg}, {xg}, {dx}")
                e.op(f"addi {yg}, {yg}, {dy}")
                e.loop_end(end)
                x_at, y_at = _shift(x_at, count * dx), _shift(y_at, count * dy)
                continue
            for _ in range(count):
                emit(nr, x_at, y_at)
                x_at, y_at = _shift(x_at, dx), _shift(y_at, dy)

    def _reuse_input(self, n: QConv, xp: int, rows: ConvRows):
        """Let ``n``'s output (mapped as ``rows``) take its input's buffer when the
        input was copied into a padded one (``xp``) and nothing reads it after
        ``n``: the copy completes before any requantization writes (the compute
        queue runs in order)."""
        x, y = self.root(n.inputs[0]), self.root(n.outputs[0])
        if x not in self.sp:  # loaded straight into its padded buffer
            return
        bn, oc, oh, ow = self.tensor[y].shape
        if xp != self.at(x) and x in self._dead and y not in self.sp \
                and rows.out_bytes(bn * oh, ow, oc) <= self.tensor[x].size:
            self.sp[y] = self.sp[x]

    def wide_ok(self, n: QConv) -> bool:
        """Whether ``n``'s output may be written at a long mapping's pitch: whole
        (not M tiled), and only stored, or read on chip by depthwise convolutions
        on the depthwise engine alone (which read rows at any pitch)."""
        from .depthwise import on_engine  # it builds on this module

        y = self.root(n.outputs[0])
        readers = [m for m in self._later if y in {self.root(t) for t in m.inputs}]
        return self._tile is None and (bool(readers) or y in self._to_dram) and all(
            isinstance(m, QConv) and m.is_depthwise and on_engine(m, self.config)
            for m in readers)

    def conv_rows(self, n: QConv, copied: bool, phased: bool = True,
                  wide: bool = False) -> ConvRows:
        """The mapping of ``n``'s output rows the cost model predicts fastest
        (:mod:`.convrows`); ``copied``: the lowering fills its input's padded
        buffer (:meth:`_padded_rows`, an image band), by phase if ``phased``;
        else the rows are read ``W + PL + PR`` pixels wide. ``wide``: the output
        only goes to DRAM (:attr:`.convrows.ConvRows.wide`)."""
        bn, c, h, w = self.tensor[n.inputs[0]].shape
        oc, _, kh, kw = n.weight.shape
        _, _, oh, ow = self.tensor[n.outputs[0]].shape
        sh, sw = n.strides
        pt, pl, pb, pr = n.pads
        geom = (c, oh, ow, kh, sh, sw, w, pl, pr)
        tiles = len(conv_tiles(kh, kw * c, self.config.rows))
        # Without padding the rows as they come need no buffer; a layout by phase
        # or of widened rows fills one with the rows its kernel rows read.
        copy = 0 if any(n.pads) else bn * h * w * c * min(kh, sh) // sh
        rows = choose_rows(geom, tiles, oc, self.config, copied, phased, copy, wide)
        if rows is not None and rows.wide and rows.pitch * oc > MAX_ROW_BYTES:  # too wide
            rows = choose_rows(geom, tiles, oc, self.config, copied, phased, copy)
        if rows is None:
            raise CompileError(f"an output row of {ow} positions exceeds the "
                               f"{self.config.acc_rows} accumulator rows", n.name)
        return rows

    def conv_chain(self, n: QConv, part: str, rows: ConvRows, hp: int, nr: int, ow: int,
                   x_at, regs, xq: str | None = None):
        """The chain of one output-column tile of a convolution: ``nr`` output rows
        of ``ow`` positions mapped as ``rows`` says (:mod:`.convrows`): every
        reduction tile (a ``wload`` and a ``gemm``) once for all of them, or once
        per output row in a hardware loop. The input window rows start at
        ``x_at`` (an offset, or ``(register, offset)``), ``hp`` padded rows of
        ``rows.wp`` pixels. With a fourth register ``xq`` the full reduction
        tiles of each kernel row run in a hardware loop (a shorter program)."""
        cfg, e = self.config, self.e
        oc, c, kh, kw = n.weight.shape
        sh = n.strides[0]
        red = kw * c
        tiles = conv_tiles(kh, red, cfg.rows)
        # Device offset of reduction row (r, t0) of a window: kernel row r is an
        # input row further down (in its phase); within it, (kw, c) bytes are
        # contiguous.
        rel = [rows.kernel_row_at(r0 // red, c, hp, sh) + r0 % red for r0, _ in tiles]
        m = rows.gemm_rows(nr, ow)
        passes = nr if rows.kind == "rows" else 1
        wo, xo, ao = regs

        def unrolled(n_j, first, last):
            for i in range(first, last):
                k_t, off = tiles[i][1], rel[i]
                e.compute(f"wload {part}, {wo}, {k_t}, {n_j}")
                mode = "accumulate" if i else "overwrite"
                e.compute(f"gemm.{mode} {P_WORK}, {xo}, {ao}, {m}, swap=1, off={off}")
                if i < len(tiles) - 1:
                    e.op(f"addi {wo}, {wo}, {k_t * n_j}")

        def looped(n_j):
            per_row = len(tiles) // kh
            for r in range(kh):
                first, last = r * per_row, (r + 1) * per_row
                if r == 0:  # the overwriting tile
                    unrolled(n_j, 0, 1)
                    first = 1
                full = [i for i in range(first, last) if tiles[i][1] == cfg.rows]
                if len(full) < 2:
                    unrolled(n_j, first, last)
                    continue
                e.op(f"addi {xq}, {xo}, {rel[full[0]]}")
                end = e.new_label("red")
                e.op(f"loop {len(full)}, {end}")
                e.compute(f"wload {part}, {wo}, {cfg.rows}, {n_j}")
                e.compute(f"gemm.accumulate {P_WORK}, {xq}, {ao}, {m}, swap=1")
                e.op(f"addi {wo}, {wo}, {cfg.rows * n_j}")
                e.op(f"addi {xq}, {xq}, {cfg.rows}")
                e.loop_end(end)
                unrolled(n_j, full[-1] + 1, last)

        def chain(wj, aj, n_j):
            # One pass per output row (the rows mapping) or one for them all.
            e.point(xo, x_at)
            e.op(f"addi {ao}, {aj}, 0")
            end = e.new_label("rows") if passes >= 2 else None
            if end:
                e.op(f"loop {passes}, {end}")
            e.op(f"addi {wo}, {wj}, 0")
            if xq is None:
                unrolled(n_j, 0, len(tiles))
            else:
                looped(n_j)
            if passes >= 2:
                e.op(f"addi {xo}, {xo}, {rows.x_step(c, sh)}")
                e.op(f"addi {ao}, {ao}, {ow}")
            if end:
                e.loop_end(end)

        return chain

    def _need_nhwc(self, n: Node, tensor: str):
        lay = self.layout(tensor)
        if lay.axes != (0, 2, 3, 1) or lay.src_shape != self.tensor[tensor].shape:
            raise CompileError(f"input {tensor!r} is not channels-last on the NPU", n.name)

    def _padded(self, n, tensor, nhwc, pads, fill) -> tuple[int, int, int]:
        """Offset, padded height and width of ``tensor`` (NHWC), padding it if needed."""
        bn, h, w, c = nhwc
        pt, pl, pb, pr = pads
        src = self.at(tensor)
        if not any(pads):
            return src, h, w
        hp, wp = h + pt + pb, w + pl + pr
        if wp * c > MAX_ROW_BYTES or w * c > MAX_ROW_BYTES:
            raise CompileError(f"padded rows of {wp * c} bytes exceed a vector row", n.name)
        dst = self.alloc(bn * hp * wp * c, f"padded input of {n.name}")
        e = self.e
        # Fill the pad bytes with the pad value, then copy the rows in with the
        # source and destination pitches.
        inside = (pl * c, (pl + w) * c)
        self._fill_pads(dst, [inside if pt <= p < pt + h else None
                              for _ in range(bn) for p in range(hp)], wp * c, fill)
        e.set_cfg("clip_lo", -128)
        e.set_cfg("clip_hi", 127)
        e.set_cfg("in_stride", w * c)
        e.set_cfg("out_stride", wp * c)
        for b in range(bn):
            to = e.reg(dst + ((b * hp + pt) * wp + pl) * c)
            frm = e.reg(src + b * h * w * c)
            e.compute(f"vclip {P_WORK}, {to}, {P_WORK}, {frm}, {h}, {w * c}")
        return dst, hp, wp

    def _fill_pads(self, dst: int, rows: list, pitch: int, fill: int, tail: int = 0):
        """Write ``fill`` over the pad bytes of ``len(rows)`` rows of ``pitch`` bytes
        at ``dst`` and the ``tail`` bytes after them: all of a row that is None,
        the bytes outside ``(lo, hi)`` otherwise. Pad bytes that touch merge into
        runs; runs of one length one row apart (a row's right pad and the next
        one's left) take one strided ``vclip``, the others dense ones."""
        runs: list[list[int]] = []  # [start, length]

        def pad(start, length):
            if length <= 0:
                return
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1][1] += length
            else:
                runs.append([start, length])

        for i, inside in enumerate(rows):
            at = dst + i * pitch
            lo, hi = inside or (pitch, pitch)
            pad(at, lo)
            pad(at + hi, pitch - hi)
        pad(dst + len(rows) * pitch, tail)
        e = self.e
        e.set_cfg("clip_hi", fill)
        e.set_cfg("clip_lo", fill)
        i = 0
        while i < len(runs):
            start, length = runs[i]
            j = i + 1
            while j < len(runs) and runs[j][1] == length and \
                    runs[j][0] - runs[j - 1][0] == pitch and j - i < 4096:
                j += 1
            if j - i >= 2 and length <= MAX_ROW_BYTES:
                e.set_cfg("in_stride", pitch)
                e.set_cfg("out_stride", pitch)
                d = e.reg(start)
                e.compute(f"vclip {P_WORK}, {d}, {P_WORK}, {d}, {j - i}, {length}")
            else:
                j = i + 1
                e.set_cfg("in_stride", 0)
                e.set_cfg("out_stride", 0)
                for off, nrows, nb in self._flat(length):
                    d = e.reg(start + off)
                    e.compute(f"vclip {P_WORK}, {d}, {P_WORK}, {d}, {nrows}, {nb}")
            i = j

    def _padded_rows(self, n: QConv, tensor, rows: ConvRows) -> tuple[int, int, int]:
        """Offset, padded height and image bytes of ``tensor`` (NHWC) as mapping
        ``rows`` reads it: the input itself when it needs no padding, else in a
        padded buffer (:meth:`_padded_layout`), loaded there from DRAM
        (:meth:`_load_padded`, the pad bytes the wide rows brought rewritten
        here) or copied there now."""
        bn, c, h, w = self.tensor[tensor].shape
        pt, pl, pb, pr = n.pads
        ph = rows.phases
        layout = self._padded_layout(n, tensor, rows)
        if layout is None:
            return self.at(tensor), h, h * w * c
        dst, hp, hq, used, img = layout
        wq, lead = rows.wp, max(pl, pr)
        inside = (lead * c, (lead + w) * c)
        self._fill_pads(dst, [inside if pt <= q * ph + f < pt + h else None
                              for _ in range(bn) for f in range(used) for q in range(hq)],
                        wq * c, n.pad_value, lead * c)
        if self.root(tensor) in self._loaded_padded:
            return dst, hp, img
        src = self.at(tensor)
        e = self.e
        e.set_cfg("clip_lo", -128)
        e.set_cfg("clip_hi", 127)
        e.set_cfg("in_stride", ph * w * c)
        e.set_cfg("out_stride", wq * c)
        for b in range(bn):
            for f in range(used):
                s0 = (f - pt) % ph  # the first source row of phase f
                if s0 >= h:
                    continue
                count = len(range(s0, h, ph))
                to = e.reg(dst + b * img + (f * hq + (s0 + pt) // ph) * wq * c + lead * c)
                frm = e.reg(src + (b * h + s0) * w * c)
                e.compute(f"vclip {P_WORK}, {to}, {P_WORK}, {frm}, {count}, {w * c}")
        return dst, hp, img

    def _padded_layout(self, n: QConv, tensor, rows: ConvRows):
        """(offset, padded height, rows per phase, phases stored, image bytes) of
        ``tensor``'s padded buffer for mapping ``rows`` (allocated the first time;
        None when the input needs no padding). Each padded row is ``rows.wp``
        pixels, its pixels ``max(PL, PR)`` in: the pad columns after one row are
        the ones before the next (a tail after the last row). By phase
        (``rows.phases`` > 1): for each phase ``f`` of the row stride a kernel row
        reads, the padded rows ``f, f + SH, ...``, one after the other."""
        bn, c, h, w = self.tensor[tensor].shape
        pt, pl, pb, pr = n.pads
        ph, wq = rows.phases, rows.wp
        if not any(n.pads) and ph == 1 and wq == w:
            return None
        if wq * c > MAX_ROW_BYTES:
            raise CompileError(f"padded rows of {wq * c} bytes exceed a vector row", n.name)
        hp = h + pt + pb
        hq = rows.phase_rows(hp, ph)
        used = min(n.weight.shape[2], ph)
        img = used * hq * wq * c
        key = (self.root(tensor), dataclasses.replace(rows, wide=False))
        if key not in self._padded_at:
            self._padded_at[key] = self.alloc(bn * img + max(pl, pr) * c,
                                              f"padded input of {n.name}")
        return self._padded_at[key], hp, hq, used, img

    def _load_padded(self, n: QConv, rows: ConvRows, push: str) -> bool:
        """Load ``n``'s input from DRAM straight into its padded buffer (no copy
        on chip), when it needs one: each real row loads ``rows.wp * C`` bytes from
        its start (the row and the first bytes of the next, which land in pad
        columns the fill rewrites), a phase's rows in one transfer with the DRAM
        stride of ``SH`` rows; the image's last row loads alone, ``W * C`` bytes
        (no read past the tensor). The last transfer pushes ``push``."""
        x = self.root(n.inputs[0])
        layout = self._padded_layout(n, x, rows)
        if layout is None:
            return False
        dst, hp, hq, used, img = layout
        bn, c, h, w = self.tensor[x].shape
        pt, pl, pb, pr = n.pads
        ph, wq, lead = rows.phases, rows.wp, max(pl, pr)
        parts = []  # (source row, rows, bytes per row, DRAM stride, scratchpad offset)
        for b in range(bn):
            for f in range(used):
                first = (f - pt) % ph
                srcs = list(range(first, h, ph))
                to = dst + b * img + (f * hq + (first + pt) // ph) * wq * c + lead * c
                wide = [r for r in srcs if r != h - 1]
                for i in range(0, len(wide), MAX_ROWS):
                    chunk = wide[i:i + MAX_ROWS]
                    parts.append((b * h + chunk[0], len(chunk), wq * c, ph * w * c,
                                  to + i * wq * c))
                if h - 1 in srcs:
                    parts.append((b * h + h - 1, 1, w * c, 0, to + len(wide) * wq * c))
        e = self.e
        for i, (row, count, nbytes, stride, to) in enumerate(parts):
            dram = e.reg(self.place.arena[x] + row * w * c, base="r2")
            reg, imm = self._sp_reg(to, 11)
            strd = e.reg(stride) if count > 1 and stride != nbytes else "r0"
            e.op(f"load {P_WORK}, {reg}, {dram}, {strd}, {count}, {nbytes}, off={imm}",
                 push=push if i == len(parts) - 1 else "", queue="load")
        self._loaded_padded.add(x)
        return True

    def maxpool(self, n: MaxPool):
        e = self.e
        x = self.tensor[n.inputs[0]]
        bn, c, h, w = x.shape
        _, _, oh, ow = self.tensor[n.outputs[0]].shape
        (kh, kw), (sh, sw) = n.kernel, n.strides
        self._need_nhwc(n, n.inputs[0])
        xp, hp, wp = self._padded(n, n.inputs[0], (bn, h, w, c), n.pads, -128)
        y = self.out(n.outputs[0])
        if ow * c > MAX_ROW_BYTES:
            raise CompileError(f"pooled rows of {ow * c} bytes exceed a vector row", n.name)
        e.set_cfg("out_stride", 0)
        # Along W: every padded row of pixels, windows of kw pixels (channels-last).
        if kw == 1 and sw == 1:
            tmp = xp
        else:
            tmp = self.alloc(bn * hp * ow * c, f"pooling rows of {n.name}")
            e.set_cfg("pool_count", kw)
            e.set_cfg("pool_stride", c)
            e.set_cfg("pool_istride", sw * c)
            if wp == ow * sw:
                e.compute(f"vmax {P_WORK}, {e.reg(tmp)}, {P_WORK}, {e.reg(xp)}, "
                          f"{bn * hp * ow}, {c}")
            else:
                for r in range(bn * hp):
                    e.compute(f"vmax {P_WORK}, {e.reg(tmp + r * ow * c)}, {P_WORK}, "
                              f"{e.reg(xp + r * wp * c)}, {ow}, {c}")
        # Along H: windows of kh pooled rows.
        e.set_cfg("pool_count", kh)
        e.set_cfg("pool_stride", ow * c)
        e.set_cfg("pool_istride", sh * ow * c)
        for b in range(bn):
            e.compute(f"vmax {P_WORK}, {e.reg(y + b * oh * ow * c)}, {P_WORK}, "
                      f"{e.reg(tmp + b * hp * ow * c)}, {oh}, {ow * c}")

    def _flat(self, size: int):
        return self._pieces(size, max_rows=4096)

    def clip(self, n: Clip):
        e = self.e
        src, dst = self.at(n.inputs[0]), self.out(n.outputs[0])
        for name, v in (("clip_lo", n.lo), ("clip_hi", n.hi), ("in_stride", 0),
                        ("out_stride", 0)):
            e.set_cfg(name, v)
        for off, rows, nb in self._flat(self.size(n.inputs[0])):
            e.compute(f"vclip {P_WORK}, {e.reg(dst + off)}, {P_WORK}, {e.reg(src + off)}, "
                      f"{rows}, {nb}")

    def qadd(self, n: QAdd):
        e = self.e
        if self.layout(n.inputs[0]) != self.layout(n.inputs[1]):
            raise CompileError("the two inputs of an add have different layouts on the "
                               "NPU", n.name)
        a, b, y = self.at(n.inputs[0]), self.at(n.inputs[1]), self.out(n.outputs[0])
        for name, v in (("add_mul_a", n.mul_a), ("add_mul_b", n.mul_b), ("add_zp_a", n.zp_a),
                        ("add_zp_b", n.zp_b), ("qshift", n.shift), ("qzp", n.zp),
                        ("clip_lo", n.lo), ("clip_hi", n.hi), ("in_stride", 0),
                        ("out_stride", 0)):
            e.set_cfg(name, v)
        for off, rows, nb in self._flat(self.size(n.inputs[0])):
            e.compute(f"vadd {P_WORK}, {e.reg(y + off)}, {P_WORK}, {e.reg(a + off)}, "
                      f"{P_WORK}, {e.reg(b + off)}, {rows}, {nb}")

    def argmax(self, n: ArgMax):
        x = self.tensor[n.inputs[0]]
        if x.size > 4096:
            raise CompileError(f"argmax over {x.size} elements exceeds vargmax (4096)", n.name)
        lay = self.layout(n.inputs[0])
        if not lay.is_row_major and sum(d > 1 for d in lay.src_shape) > 1:
            raise CompileError(f"argmax input {x.name!r} is not row-major on the NPU", n.name)
        reg, imm = self._sp_reg(self.at(n.inputs[0]), 16)
        rd = self.e.result_reg(n.outputs[0])
        self.e.compute(f"vargmax {rd}, {P_WORK}, {reg}, {x.size}, off={imm}")


def scope_tensors(graph: Graph) -> dict:
    """Every tensor of the graph and of its branch bodies, by name."""
    out = dict(graph.tensors)
    for _g, n in graph.walk():
        if isinstance(n, If):
            out.update(n.then_graph.tensors)
            out.update(n.else_graph.tensors)
    return out


def is_alias(n: Node) -> bool:
    return isinstance(n, ALIASES) and n.device == "npu"


def device_layout(n: Node | None, tensor, input_layout) -> Layout:
    """The layout a producer gives its output (``input_layout`` for pass-through ops)."""
    if isinstance(n, (QConv, MaxPool, QAvgPool)):
        return Layout.nhwc(tensor.shape)
    if isinstance(n, (QAdd, Clip)):
        return input_layout(n.inputs[0])
    if n is None or n.device == "cpu":
        return Layout.nhwc(tensor.shape) if len(tensor.shape) == 4 else \
            Layout.row_major(tensor.shape)
    return Layout.row_major(tensor.shape)
