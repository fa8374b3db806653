"""IR graph -> one linked NPU program (see :func:`compile_model`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading

import numpy as np

from firmware import asm
from firmware.config import NPUConfig

from ..ir import ArgMax, Equal, Graph, If, Node, QAvgPool, QConv, QGemm, Subgraph
from .cost import CostModel
from .depthwise import avgpool_blob, grouped_blob
from .emit import RESULT_REGS, SEGMENT, Emitter
from .estimate import check_fits
from .foldrows import fold_rows
from .fuse import fuse_units
from .gemv import gemv_blob, takes_gemv
from .layout import Layout
from .lower import (
    Blob,
    Lowering,
    Placement,
    align,
    conv_blob,
    device_layout,
    gemm_blob,
    is_alias,
    scope_tensors,
)
from .pages import PAGE_BREAK_CYCLES, Page, choose_breaks, link_pages
from .plan import (
    CompileError,
    UnitInfo,
    check_supported,
    check_unit_shape,
    has_npu_work,
    initial_units,
    simplify,
    stages,
)
from .program import CompiledModel
from .units import (
    Chunk,
    UnitCode,
    UnitStore,
    assemble_unit,
    is_instruction,
    link_program,
    relocatable,
    stand_in,
    symbol_spacing,
)
from .variants import Variant, variant_of

DRAM_ALIGN = 64  # a bus burst never straddles two tensors


class ProgramTooLong(CompileError):
    """The program does not fit one instruction bank."""


_blobs = threading.local()  # .memo: (id(node), profile, row order) -> (node, blob)


@contextlib.contextmanager
def blobs_remembered():
    """Within it, this thread packs each node's constants once per profile and row
    order (compiling many plans of one model packs the same blobs again and again).
    The graphs' nodes must not change meanwhile."""
    outer = getattr(_blobs, "memo", None)
    _blobs.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _blobs.memo = outer


def _packed(n: Node, key: tuple, pack) -> Blob:
    """``pack()``, remembered under ``key`` for node ``n`` (see :func:`blobs_remembered`);
    a copy each time, since placement fills in its offsets."""
    memo = getattr(_blobs, "memo", None)
    if memo is None:
        return pack()
    key = (id(n), *key)
    if key not in memo or memo[key][0] is not n:
        memo[key] = (n, pack())
    return dataclasses.replace(memo[key][1])


def compile_model(graph: Graph, config: NPUConfig, units: list | None = None, *,
                  fuse: bool = True, simplified: bool = False,
                  weight_budget: int | None = None, relocatable: bool = False,
                  unit_store: UnitStore | None = None, paging: bool = False,
                  variants: dict[tuple, Variant] | None = None,
                  share_consts: SharedConsts | None = None) -> CompiledModel:
    """Compile ``graph`` for ``config`` into one program.

    Parameters
    ----------
    graph : a validated IR graph (import with :func:`host.onnx_import.load_onnx`).
    config : the hardware profile (read from the device's CAPS by the driver).
    units : how to cut the graph: :class:`~host.ir.Subgraph` records or lists of
        node names of the *simplified* graph (``CompiledModel.graph``); default
        the fused plan (``fuse``). The adaptive runtime passes its units here.
    fuse : without ``units``, merge neighbouring units where the cost model predicts
        the merged unit faster (:func:`~host.compiler.fuse.fuse_units`; what it
        decided is ``CompiledModel.fusion``); False: one unit per anchor operator
        (:func:`~host.compiler.plan.initial_units`), the per-layer plan.
    simplified : ``graph`` is already simplified (a ``CompiledModel.graph``).
    weight_budget : bytes of scratchpad for resident weights (default half).
    relocatable : lower each unit as if on its own: nothing known at its start, no
        tensor or constant at DRAM offset 0 (so every address is one instruction).
        The units then link into any plan (:mod:`host.compiler.units`); the program
        costs each unit the ``cfg`` writes and register loads it needs.
    unit_store : compile each unit on its own into relocatable code kept in this
        store, taking the units it already holds, and link them; the program equals
        the one ``relocatable`` lowers in place.
    paging : a program that does not fit one instruction bank may run at full
        speed in pages that each do (:mod:`host.compiler.pages`,
        ``CompiledModel.pages``; the runtime pages them through the shadow bank):
        where pricing its instructions cannot make it fit, or costs more cycles
        than the page breaks do. Without it such a program is priced into the
        bank or raises :class:`ProgramTooLong`.
    variants : per unit (its node names, a tuple) the :class:`~.variants.Variant`
        overriding the compiler's choices; a unit not named takes its own choices.
        With ``units`` only (the fused plan's units are not known in advance).
    share_consts : lay the constants out around another program's of the same model
        (:class:`SharedConsts`; with ``units``, lowered in place).

    Raises :class:`~host.compiler.plan.CompileError` (a ``ModelError``) naming the
    node or unit that does not fit, and ``UnsupportedOpError`` for NPU-placed
    operators the compiler cannot lower.
    """
    log: list[str] = []
    if not simplified:
        graph, log = simplify(graph)
    graph = fold_rows(graph, config, log)
    check_supported(graph)
    check_fits(graph, config, paging)  # before lowering: refuse hopeless work fast
    reloc = relocatable or unit_store is not None
    if variants and units is None:
        raise ValueError("variants name units: pass the plan's units with them")
    if share_consts is not None and units is None and fuse:
        raise ValueError("shared constants lay out a given plan: pass its units with them")
    if units is not None or not fuse:
        plan = initial_units(graph) if units is None else units
        return _Compiler(graph, config, _records(plan), log, weight_budget, unit_store,
                         reloc, paging, variants, share_consts).run()
    with blobs_remembered():
        try:
            fused = fuse_units(graph, config, weight_budget=weight_budget)
        except CompileError:  # the per-layer plan below says why in its own words
            fused = None
        note = []
        if fused is not None:
            try:
                model = _Compiler(graph, config, _records(fused.units), log, weight_budget,
                                  unit_store, reloc, paging).run()
                model.fusion = fused.log()
                return model
            except CompileError as err:  # the linked program outgrew the estimate
                note = [f"the fused plan does not compile ({err}): per-layer plan"]
        model = _Compiler(graph, config, _records(initial_units(graph)), log, weight_budget,
                          unit_store, reloc, paging).run()
        model.fusion = note
        return model


def _records(units: list) -> list[Subgraph]:
    """Fresh records of a plan: the compiled model owns its units (callers' records,
    shared between plans and threads, are never written)."""
    return [Subgraph(u.id, list(u.nodes)) if isinstance(u, Subgraph)
            else Subgraph(i + 1, list(u)) for i, u in enumerate(units)]


def plan_units(graph: Graph, config: NPUConfig, units: list, *,
               weight_budget: int | None = None) -> UnitPlanner:
    """The units of a plan of the simplified ``graph``, analysed but not lowered: what
    a pool of compile processes needs to compile them one by one
    (:class:`UnitPlanner`). Raises :class:`CompileError` as :func:`compile_model`."""
    check_supported(graph)
    check_fits(graph, config)
    comp = _Compiler(graph, config, _records(units), [], weight_budget, relocatable=True)
    comp.analyse()
    return UnitPlanner(comp)


class UnitPlanner:
    """A plan's units in program order, each with what its code depends on.

    Members
    -------
    graph : the graph.
    units : ``(unit, taken)`` in program order; ``taken`` counts the scalar result
        registers the units before it use.
    """

    def __init__(self, comp: _Compiler):
        self._comp = comp
        self.graph = comp.g
        self.units = comp.program_order()

    def context(self, unit: UnitInfo, taken: int) -> tuple:
        """See :meth:`_Compiler.unit_context`."""
        return self._comp.unit_context(unit, taken)

    def lower(self, unit: UnitInfo, taken: int) -> UnitCode:
        """Compile one unit on its own (raises :class:`CompileError`)."""
        return self._comp.lower_alone(unit, taken)


def prices_to_fit(choices, length: int, depth: int) -> list[float]:
    """Cycles to price an instruction at, cheapest first, so that a program of
    ``length`` instructions lowered at price 0 fits ``depth``: each unit whose
    ways of lowering compete (``choices``: per unit its options' predicted
    cycles and instructions) takes the option cheapest at that price; the
    first price listed is the lowest the options' sizes say fits, the later
    ones are fallbacks."""

    def size(price):
        return sum(min(opts, key=lambda o: o[0] + price * o[1])[1] for opts in choices)

    flips = sorted({(b[0] - a[0]) / (a[1] - b[1]) * (1 + 1e-9) + 1e-9
                    for opts in choices for a in opts for b in opts
                    if a[1] > b[1] and b[0] >= a[0]})
    base = size(0.0)
    fits = [p for p in flips if length - base + size(p) <= depth]
    return [p for p in flips if p >= fits[0]] + [1e9] if fits else [1e9]


@dataclasses.dataclass(frozen=True)
class SharedConsts:
    """Constants laid out to coexist with another program's (a guarded variant that
    the host switches to and from per input).

    A blob whose bytes equal the other program's blob of the same node takes its DRAM
    offset, tag slot and scratchpad place, so its tag stays valid across switches;
    any other blob goes at ``tail_at`` onwards (beyond the other program's
    constants and arena) into the other's slot and place when it fits there (a tag
    names its DRAM address, so it misses once after each switch), else unpinned.
    The other program's constants stay in DRAM as they are; only the blobs from
    ``tail_at`` on are this program's own (``CompiledModel.const_image()`` holds
    zeros between).
    """

    place: Placement
    tail_at: int


class _Compiler:
    def __init__(self, graph, config, subs, log, weight_budget, unit_store=None,
                 relocatable=False, paging=False, variants=None,
                 share: SharedConsts | None = None):
        self.g, self.config, self.subs, self.log = graph, config, subs, log
        self.share = share
        self.store, self.reloc, self.paging = unit_store, relocatable, paging
        self._paged = False  # emitting pages: see _emit_pages
        self.variants = dict(variants or {})
        self.price = 0.0  # cycles an instruction is priced at (see run)
        self.weight_budget = config.sp_bytes // 2 if weight_budget is None else weight_budget
        self.tensors = scope_tensors(graph)
        self.prod: dict[str, Node] = {}
        self.scope_of: dict[str, Graph] = {}
        self._index_scopes(graph)
        self.top_stage = stages(graph)

    def _index_scopes(self, g: Graph):
        for n in g.nodes:
            if n.name in self.scope_of:
                raise CompileError("node name used in two scopes", n.name)
            self.scope_of[n.name] = g
            for o in n.outputs:
                self.prod[o] = n
            if isinstance(n, If):
                self._index_scopes(n.then_graph)
                self._index_scopes(n.else_graph)

    def root(self, t: str) -> str:
        p = self.prod.get(t)
        while p is not None and is_alias(p):
            t = p.inputs[0]
            p = self.prod.get(t)
        return t

    # ---- analysis ----------------------------------------------------------------------
    def analyse(self):
        """Units, DRAM storage, layouts and placement: everything but code."""
        self.units = self._unit_infos()
        self._storage()
        self._layouts: dict[str, Layout] = {}
        self.place_ = self._place()

    def program_order(self) -> list[tuple[UnitInfo, int]]:
        """The units as :meth:`run` emits them, each with the number of scalar result
        registers in use before it."""
        by_node = {n.name: u for u in self.units for n in u.nodes}
        order: list[UnitInfo] = []

        def walk(g: Graph, take=lambda n: True):
            for n in g.nodes:
                if not take(n):
                    continue
                u = by_node.get(n.name)
                if u is not None and u not in order:
                    order.append(u)
                elif isinstance(n, If) and n.device == "npu" and has_npu_work(n):
                    walk(n.then_graph)
                    walk(n.else_graph)

        for s in sorted({s for s in self.top_stage.values() if s % 2}):
            walk(self.g, lambda n, s=s: self.top_stage[n.name] == s)
        out, taken = [], 0
        for u in order:
            out.append((u, taken))
            taken += len(u.results)
        return out

    def _emit(self, place, price: float):
        """The program's source and words, lowering at ``price`` cycles an instruction."""
        e = Emitter()
        low = Lowering(self.config, e, place, self.tensors, self.root, self.layout, price)
        low.variants = self.variants
        self.low, self.e, self.emitted, self.price = low, e, set(), price
        self.done_roots: set[str] = set()
        self._line_spans: dict[int, tuple[int, int]] = {}
        self._chunks: list[Chunk] = []
        npu_stages = sorted({s for s in self.top_stage.values() if s % 2})
        seg_labels = [f"segment_{k}" for k in range(len(npu_stages))]
        self._items: list[list[tuple[int, Node]]] = []  # paged: per segment (line, node)
        self._stage_ends: list[int] = []
        self._page_starts: list[tuple[int, int]] = []  # paged: (line, segment)
        if len(npu_stages) > 1 and not self._paged:  # a page is one segment's run
            e.comment("entry: r3 selects the NPU segment (the host runs CPU nodes between)")
            for k in range(1, len(npu_stages)):
                e.op(f"br.eq {SEGMENT}, {e.reg(k)}, {seg_labels[k]}")
        for k, s in enumerate(npu_stages):
            self._items.append([])
            self._page_starts.append((len(e.lines), k))
            e.label(seg_labels[k])
            e.run_start()
            self._emit_scope(self.g, lambda n, s=s: self.top_stage[n.name] == s)
            e.op("end")
            self._stage_ends.append(len(e.lines))
        missing = [u.id for u in self.units if u.id not in self.emitted]
        if missing:
            raise CompileError(f"units {missing} are not reachable in program order")
        source = e.text()
        if self._paged:
            program, self._page_ranges = link_pages(
                e.lines, [a for a, _ in self._page_starts],
                self._chunks if self.store is not None else None)
        elif self.store is not None:
            program = link_program(e.lines, self._chunks)
        else:
            try:
                program = asm.assemble(source)
            except asm.AsmError as err:  # a compiler bug, never the user's model
                raise RuntimeError(f"the compiler wrote invalid assembly: {err}") from err
        return source, program

    def run(self) -> CompiledModel:
        self.analyse()
        place = self.place_
        # Where ways of lowering a unit differ in speed and size, the fastest wins
        # unless the program outgrows the bank: then each instruction is priced in
        # cycles, the least that makes it fit.
        depth = self.config.imem_depth
        source, program = self._emit(place, 0.0)
        pages: list[Page] = []
        if len(program) > depth:
            source, program, pages = self._fit(place, len(program))
        spans = self._spans(program)
        for u, sub in zip(self.units, self.subs, strict=True):
            sub.inputs, sub.outputs = list(u.inputs), list(u.outputs)
        layouts = {r: self.layout(r) for r in place.arena}
        wb = place.weights_bytes
        parts = [(0, wb), (wb, self.config.sp_bytes - wb)]
        return CompiledModel(self.g, self.config, program, source, self.subs, place, layouts,
                             {t: int(r[1:]) for t, r in self.e.result_regs.items()},
                             self.top_stage, parts, self.log, spans, pages=pages)

    def _fit(self, place, length: int) -> tuple[str, asm.Program, list[Page]]:
        """A program of ``length`` instructions at full speed outgrows the bank: the
        cheapest priced program that fits one bank, or (with ``paging``) the full
        speed program in pages, whichever the cost model predicts faster (a page
        break costs :data:`~host.compiler.pages.PAGE_BREAK_CYCLES`)."""
        depth = self.config.imem_depth
        fitted = None  # (predicted cycles, price)
        for price in prices_to_fit(self.low.choices, length, depth):
            source, program = self._emit(place, price)
            length = len(program)
            if length <= depth:
                fitted = (self._predicted(), price)
                break
        if fitted is not None and not self.paging:
            return source, program, []
        if self.paging:
            try:
                paged = self._emit_pages(place)
            except ProgramTooLong:
                if fitted is None:
                    raise
            else:
                breaks = len(paged[2]) - len({p.segment for p in paged[2]})
                if fitted is None or self._predicted() + PAGE_BREAK_CYCLES * breaks < fitted[0]:
                    return paged
        if fitted is None:
            raise ProgramTooLong(f"the program has {length} instructions; an instruction "
                                 f"bank holds {depth}")
        self._paged = False
        source, program = self._emit(place, fitted[1])
        return source, program, []

    def _predicted(self) -> float:
        """Cost-model cycles of the units as last emitted."""
        cost = CostModel(self.config)
        return sum(cost.predict(s.resources["work"]) for s in self.subs
                   if "work" in s.resources)

    def _emit_pages(self, place) -> tuple[str, asm.Program, list[Page]]:
        """The program at full speed (price 0) in pages that each fit a bank.

        Every top-level unit (or ``If``) opens with its own setup, so its code is the
        same wherever a page breaks; a first pass measures them, the second breaks
        the segments where :func:`~host.compiler.pages.choose_breaks` says.
        """
        self._paged, self._breaks = True, set()
        self._emit(place, 0.0)
        room = self.config.imem_depth - 1  # each page ends with ``end``
        for k, items in enumerate(self._items):
            lines = self.e.lines
            bounds = [a for a, _ in items] + [self._stage_ends[k] - 1]
            bounds[0] = self._page_starts[k][0]  # the segment's label with its first item
            sizes = [sum(map(is_instruction, lines[a:b])) for a, b in zip(bounds, bounds[1:],
                                                                          strict=False)]
            try:
                found = choose_breaks(sizes, self._live(items), room)
            except ValueError as err:
                raise ProgramTooLong(f"segment {k} cannot be split into pages of "
                                     f"{self.config.imem_depth} instructions: {err}") from None
            self._breaks.update((k, i) for i in found)
        source, program = self._emit(place, 0.0)
        too_long = [b - a for a, b in self._page_ranges if b - a > self.config.imem_depth]
        if too_long:  # the breaks moved code: a compiler bug
            raise RuntimeError(f"pages of {too_long} instructions exceed the bank")
        units_of = {u.id: u for u in self.units}
        pages = []
        for p, ((a, k), (start, end)) in enumerate(zip(self._page_starts, self._page_ranges,
                                                       strict=True)):
            b = self._page_starts[p + 1][0] if p + 1 < len(self._page_starts) else len(
                self.e.lines)
            ids = [uid for uid, (x, _) in self._line_spans.items() if a <= x < b]
            results = tuple(t for uid in ids for t in units_of[uid].results)
            pages.append(Page(k, start, end, results))
        return source, program, pages

    def _live(self, items: list[tuple[int, Node]]) -> list[bool]:
        """Per item of a segment: whether a scalar result made before it is read by a
        branch at or after it (the registers do not survive a page break)."""
        made, reads = [], []
        for _, n in items:
            names = {n.name}
            read = set()
            if isinstance(n, If):
                names |= {m.name for b in (n.then_graph, n.else_graph) for _, m in b.walk()}
                read = {self.root(self.prod[n.inputs[0]].inputs[0])}
            made.append({t for u in self.units if any(m.name in names for m in u.nodes)
                         for t in u.results})
            reads.append(read)
        return [bool(set().union(*made[:i]) & set().union(*reads[i:]))
                for i in range(len(items))]

    def _spans(self, program) -> dict[int, tuple[int, int]]:
        """Unit id -> its instruction indices ``[start, end)`` in the program."""
        spans = {}
        for uid, (a, b) in self._line_spans.items():
            idx = [i for i, no in enumerate(program.lines) if a < no <= b]
            spans[uid] = (idx[0], idx[-1] + 1) if idx else (0, 0)
        return spans

    def _unit_infos(self) -> list[UnitInfo]:
        infos, owner = [], {}
        ids = set()
        for sub in self.subs:
            if sub.id in ids or not 0 < sub.id < 1 << 16:
                raise CompileError(f"unit id {sub.id} is duplicated or outside 1..65535")
            ids.add(sub.id)
            if not sub.nodes:
                raise CompileError(f"unit {sub.id} has no nodes")
            scope = self.scope_of.get(sub.nodes[0])
            if scope is None:
                raise CompileError(f"unit {sub.id}: no node {sub.nodes[0]!r} in the graph")
            nodes = check_unit_shape(scope, sub.nodes)
            for n in nodes:
                if n.name in owner:
                    raise CompileError(f"node in units {owner[n.name]} and {sub.id}", n.name)
                owner[n.name] = sub.id
            infos.append(UnitInfo(sub.id, nodes, scope))
        for _, n in self.g.walk():
            if n.device == "npu" and not is_alias(n) and not isinstance(n, (If, Equal)) \
                    and n.name not in owner:
                raise CompileError("NPU node belongs to no unit", n.name)
        self.owner = owner
        return infos

    def _storage(self):
        """Decide which tensors cross DRAM: everything read outside its producer's unit."""
        readers: dict[str, set] = {}

        def read(t: str, who):
            readers.setdefault(self.root(t), set()).add(who)

        for _g, n in self.g.walk():
            if is_alias(n) or isinstance(n, If):
                continue
            who = self.owner.get(n.name, "cpu" if n.device == "cpu" else "ctl")
            for t in n.inputs:
                read(t, who)
        for _g, n in self.g.walk():
            if isinstance(n, If):
                for branch in (n.then_graph, n.else_graph):
                    for o in branch.outputs:
                        read(o, "out")
                for o in n.outputs:
                    if any(w not in ("cpu", "out", "ctl") for w in readers.get(o, ())):
                        raise CompileError("an If output read on the NPU (the branches "
                                           "would have to agree on its buffer)", n.name)
        for o in self.g.outputs:
            read(o, "out")
        self.dram: list[str] = []
        by_id = {u.id: u for u in self.units}
        for r, who in readers.items():
            p = self.prod.get(r)
            t = self.tensors.get(r)
            if isinstance(p, ArgMax) and p.device == "npu":
                bad = [w for w in who if w not in ("ctl", "out", "cpu")]
                if bad:
                    raise CompileError("an ArgMax result can only drive branches or leave "
                                       "the NPU", p.name)
                continue
            units_reading = {w for w in who if isinstance(w, int)}
            if p is not None and p.name in self.owner:
                home = self.owner[p.name]
                if who - {home}:
                    self.dram.append(r)
                    by_id[home].outputs.append(r)
                    for uid in units_reading - {home}:
                        by_id[uid].inputs.append(r)
            elif units_reading:
                if t is None or t.is_const:
                    raise CompileError(f"constant {r!r} used as an activation on the NPU")
                self.dram.append(r)
                for uid in units_reading:
                    by_id[uid].inputs.append(r)
        for u in self.units:
            u.inputs.sort(key=list(readers).index)
            u.results = [n.outputs[0] for n in u.nodes if isinstance(n, ArgMax)]

    def layout(self, t: str) -> Layout:
        r = self.root(t)
        if r not in self._layouts:
            self._layouts[r] = device_layout(self.prod.get(r), self.tensors[r], self.layout)
        return self._layouts[r]

    def _place(self) -> Placement:
        # Relocatable: no tensor or blob sits at offset 0, so each address is one
        # ``addi`` from its base whatever the plan.
        place = Placement()
        self._tail_at = align(self.share.tail_at, DRAM_ALIGN) if self.share else 0
        at = base = DRAM_ALIGN if self.reloc else 0
        for r in self.dram:
            place.arena[r] = at
            at = align(at + self.tensors[r].size, DRAM_ALIGN)
        place.arena_bytes = at
        const_at, sp_at, slot = base, 0, 0
        for u in self.units:
            variant = variant_of(self.variants, u.nodes)
            pin = not variant.stream_weights
            for n in u.nodes:
                if isinstance(n, QGemm):
                    x = self.tensors[n.inputs[0]]
                    rows = x.size // n.weight.shape[0]
                    try:
                        perm = self.layout(n.inputs[0]).row_permutation(rows)
                    except ValueError as err:
                        raise CompileError(str(err), n.name) from None
                    order = None if perm is None else np.asarray(perm).tobytes()
                    gemv = takes_gemv(n, rows, self.config)
                    most = variant.block_outputs if gemv else None
                    blob = _packed(n, (self.config, order, gemv, most),
                                   lambda n=n, perm=perm, gemv=gemv, most=most:
                                   gemv_blob(n, self.config, perm, most) if gemv
                                   else gemm_blob(n, self.config, perm))
                elif isinstance(n, QConv):
                    blob = _packed(n, (self.config,), lambda n=n: conv_blob(n, self.config)
                                   if n.group == 1 else grouped_blob(n, self.config))
                elif isinstance(n, QAvgPool):
                    channels = self.tensors[n.inputs[0]].shape[1]
                    blob = _packed(n, (self.config, channels), lambda n=n, c=channels:
                                   avgpool_blob(n, c, self.config))
                else:
                    continue
                if self.share is not None:
                    place.blobs[n.name] = self._share_blob(n.name, blob)
                    continue
                blob.dram = const_at
                const_at = align(const_at + len(blob.data), DRAM_ALIGN)
                size = align(len(blob.data))
                if pin and slot < self.config.tag_slots and sp_at + size <= self.weight_budget:
                    slot += 1
                    blob.slot, blob.sp = slot, sp_at
                    sp_at += size
                place.blobs[n.name] = blob
        place.const_bytes = const_at
        place.weights_bytes = sp_at
        if self.share is not None:
            place.const_bytes = max(self._tail_at, self.share.place.const_bytes)
            place.weights_bytes = self.share.place.weights_bytes
        return place

    def _share_blob(self, name: str, blob):
        """Place ``blob`` as :class:`SharedConsts` says."""
        share = self.share
        other = share.place.blobs.get(name)
        if other is not None and other.data == blob.data:
            blob.dram, blob.slot, blob.sp = other.dram, other.slot, other.sp
            return blob
        blob.dram = self._tail_at
        self._tail_at = align(blob.dram + len(blob.data), DRAM_ALIGN)
        if other is not None and other.slot and len(blob.data) <= align(len(other.data)):
            blob.slot, blob.sp = other.slot, other.sp
        return blob

    # ---- emission ------------------------------------------------------------------------
    def _emit_scope(self, g: Graph, take=lambda n: True):
        by_node = {n.name: u for u in self.units for n in u.nodes}
        for n in g.nodes:
            if not take(n):
                continue
            u = by_node.get(n.name)
            if u is not None and u.id not in self.emitted:
                self._item_start(g, n)
                self._emit_unit(u)
            elif isinstance(n, If) and n.device == "npu" and has_npu_work(n):
                self._item_start(g, n)
                self._emit_if(n)

    def _item_start(self, g: Graph, n: Node):
        """Paged: a top-level unit or ``If`` starts; break the page here if chosen,
        and set up from nothing (the item's code is then the same either way)."""
        if not self._paged or g is not self.g:
            return
        k, items = len(self._items) - 1, self._items[-1]
        if (k, len(items)) in self._breaks:
            self.e.op("end")
            self._page_starts.append((len(self.e.lines), k))
            self.e.comment(f"page {len(self._page_starts) - 1}: segment {k} continued")
            self.e.run_start()
        self.e.begin_unit()
        items.append((len(self.e.lines), n))

    def _emit_unit(self, u: UnitInfo):
        for r in u.inputs:
            p = self.prod.get(r)
            if p is not None and p.name in self.owner and r not in self.done_roots:
                raise CompileError(f"unit {u.id} reads {r!r} before unit "
                                   f"{self.owner[p.name]} writes it (units must be "
                                   "contiguous in program order)")
        start = len(self.e.lines)
        if not self.reloc:
            resources = self.low.unit(u)
        elif self.store is None:
            self.e.begin_unit()
            start = len(self.e.lines)
            # Labels as a unit compiled on its own names them: the same source.
            outer, self.e._labels = self.e._labels, 0
            resources = self.low.unit(u)
            self.e._labels = outer
            code = UnitCode(self.e.lines[start:], [], {})
            code.labels = relocatable(code.lines, u.id, 0, 0, check=False)[1]
            self.e.lines[start:] = code.link(u.id, [], [])
        else:
            self.e.begin_unit()
            resources = self._link_unit(u)
        if self.reloc:
            self.e.begin_unit()  # the code after it knows nothing either way
        self._line_spans[u.id] = (start, len(self.e.lines))
        sub = next(s for s in self.subs if s.id == u.id)
        sub.instructions = [ln.strip() for ln in self.e.lines[start:]]
        sub.resources = {**resources,
                         "instructions": sum(map(is_instruction, sub.instructions))}
        self.done_roots.update(u.outputs)
        self.emitted.add(u.id)

    # ---- units compiled on their own ------------------------------------------------------
    def dram_tensors(self, u: UnitInfo) -> list[str]:
        """The unit's DRAM tensors in symbol order (``@aN``): inputs, then outputs."""
        return list(dict.fromkeys([*u.inputs, *u.outputs]))

    def unit_blobs(self, u: UnitInfo) -> list:
        """The unit's constants blobs in symbol order (``@cN``)."""
        return [self.place_.blobs[n.name] for n in u.nodes if n.name in self.place_.blobs]

    def unit_context(self, u: UnitInfo, taken: int) -> tuple:
        """What the code of ``u`` depends on beyond its own nodes (plain values whose
        ``repr`` is stable: what a cache key digests).

        Its node and tensor names (named in its code's comments), its DRAM tensors
        with their layouts, its blobs with their residency (tag slot, place in the
        weights partition) but not their DRAM offsets, the size of the weights
        partition, and how many scalar result registers are in use before it.
        """
        # A blob's tile offsets follow from its node, the profile and its row
        # order, as its bytes do: the bytes' digest stands for all of them.
        blobs = [(b.node, hashlib.sha256(b.data).hexdigest(), b.rows, b.row_bytes, b.slot,
                  b.sp) for b in self.unit_blobs(u)]
        tensors = [(t, self.layout(t).src_shape, self.layout(t).axes)
                   for t in self.dram_tensors(u)]
        context = (tuple(n.name for n in u.nodes), tuple(u.inputs), tuple(u.outputs),
                   tuple(u.results), tensors, blobs, self.place_.weights_bytes, taken,
                   self.price)
        variant = variant_of(self.variants, u.nodes)
        return context if variant.is_default else (*context, variant.key())

    def _link_unit(self, u: UnitInfo) -> dict:
        taken = len(self.e.result_regs)
        names = [n.name for n in u.nodes]
        context = self.unit_context(u, taken)
        code = self.store.get(self.g, names, context)
        if code is None:
            try:
                code = self.lower_alone(u, taken)
            except CompileError as err:
                self.store.put(self.g, names, context, err)
                raise
            self.store.put(self.g, names, context, code)
        arena = [self.place_.arena[t] for t in self.dram_tensors(u)]
        blobs = [b.dram for b in self.unit_blobs(u)]
        start = len(self.e.lines)
        self.e.lines.extend(code.link(u.id, arena, blobs))
        self._chunks.append(Chunk(start, len(self.e.lines), code, u.id, arena, blobs))
        self.e.result_regs.update(code.results)
        self.low.choices.extend(code.choices)
        if len(self.e.result_regs) != taken + len(u.results):  # program_order counts so
            raise RuntimeError(f"unit {u.id} took {len(code.results)} result registers "
                               f"for {len(u.results)} scalar results")
        return code.resources

    def lower_alone(self, u: UnitInfo, taken: int) -> UnitCode:
        """Lower ``u`` into an emitter of its own, with stand-in DRAM offsets."""
        e = Emitter()
        e.result_regs = {f"@{i}": r for i, r in enumerate(RESULT_REGS[:taken])}
        tensors, blobs = self.dram_tensors(u), self.unit_blobs(u)
        spacing = symbol_spacing(max([self.tensors[t].size for t in tensors]
                                     + [len(b.data) for b in blobs], default=0))
        place = Placement(arena={t: stand_in(i, spacing) for i, t in enumerate(tensors)},
                          blobs={b.node: dataclasses.replace(b, dram=stand_in(i, spacing))
                                 for i, b in enumerate(blobs)},
                          weights_bytes=self.place_.weights_bytes)
        low = Lowering(self.config, e, place, self.tensors, self.root, self.layout,
                       self.price)
        low.variants = self.variants
        e.begin_unit()
        resources = low.unit(u)
        lines, labels = relocatable(e.lines, u.id, len(tensors), len(blobs),
                                    spacing=spacing)
        results = {t: r for t, r in e.result_regs.items() if not t.startswith("@")}
        code = assemble_unit(e.lines, lines, labels, resources, results)
        code.choices = list(low.choices)
        return code

    def _emit_if(self, n: If):
        e = self.e
        eq = self.prod[n.inputs[0]]
        src = self.root(eq.inputs[0])
        if src not in e.result_regs:
            raise CompileError(f"the branch condition reads {src!r} before the NPU "
                               "computes it", n.name)
        reg = e.result_regs[src]
        other, end = e.new_label("else"), e.new_label("endif")
        e.comment(f"{n.name}: if {src} == {eq.value}")
        if -(1 << 31) <= eq.value < 1 << 31:
            e.op(f"br.ne {reg}, {e.reg(eq.value)}, {other}")
        else:  # a 32-bit register would alias it to an index: it equals none
            e.op(f"jmp {other}")
        self._emit_scope(n.then_graph)
        e.op(f"jmp {end}")
        e.label(other)
        self._emit_scope(n.else_graph)
        e.label(end)
