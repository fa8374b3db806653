"""A unit's variants: knob overrides at the compiler's own choice points.

The lowering chooses, per unit, how many M tiles a GEMM runs in, whether a
convolution is emitted whole or streamed (its image in bands, its weights, or
both: :mod:`.tiled2d`), how many bands beyond the fewest that fit, how many
weight bytes a streamed GEMV moves a step, how many steps it keeps in flight and
how many outputs a block of it holds, and whether a blob is pinned in a tag
slot. It picks each by its cost model. A :class:`Variant` fixes some of those
choices for one unit; a knob left ``None`` is the compiler's own choice, so
:data:`DEFAULT` (every knob ``None``) leaves every program byte for byte as the
compiler writes it without variants.

:func:`enumerate_variants` lists a unit's legal variants (those that compile and
change its code), each ranked by the cost model's prediction: what ``npu
compile MODEL --variants`` prints and what the specialization engine
(:mod:`host.adaptive.specialize_units`) draws from.

```python
model = compile_model(graph, config)
for option in enumerate_variants(model, model.units[0]):
    print(option.variant.describe(), option.predicted)
faster = compile_model(model.graph, config, [u.nodes for u in model.units],
                       simplified=True,
                       variants={tuple(model.units[0].nodes): Variant(extra_bands=1)})
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir import QConv, QGemm
from .cost import CostModel
from .plan import CompileError

WAYS = ("whole", "bands", "weights", "tiled")
"""A convolution's ways: on chip whole, its image streamed in bands, its weights
streamed, image and weights streamed together (:mod:`.tiled2d`)."""

M_TILE_COUNTS = (1, 2, 3, 4, 6, 8)
EXTRA_BANDS = (0, 1, 2, 3)
STEP_BYTES = (256, 512, 1024, 2048, 4096)
BLOCK_OUTPUTS = (64, 128, 256)


@dataclass(frozen=True)
class Variant:
    """Overrides of a unit's lowering choices (``None``: the compiler chooses).

    Members
    -------
    m_tiles : M tiles of a unit whose rows split (1: whole, never tiled; a
        GEMM whose weights would stream keeps them on chip and tiles instead).
    way : a convolution's way (one of :data:`WAYS`).
    extra_bands : bands beyond the fewest that fit, for a convolution whose
        image streams (shorter bands expose less of the first load and last
        store and pay more per-band work).
    step_bytes : weight bytes a streamed GEMV loads per step (the prefetch
        granularity: larger steps, fewer transfers and loop passes).
    stream_weights : True: the unit's weight blobs get no tag slot and load on
        every run (the slots and the weights partition go to other units).
    buffers : steps of a streamed GEMV's weights in flight (the prefetch depth:
        more buffers, loads further ahead of the array, smaller steps in the
        same scratchpad).
    block_outputs : most outputs of a GEMV's output block (the block size: a
        block's reduction chunk is ``block_outputs x rows`` bytes of one DRAM
        row, so it sets the length of the weight bursts).
    """

    m_tiles: int | None = None
    way: str | None = None
    extra_bands: int | None = None
    step_bytes: int | None = None
    stream_weights: bool | None = None
    buffers: int | None = None
    block_outputs: int | None = None

    def __post_init__(self):
        if self.way is not None and self.way not in WAYS:
            raise ValueError(f"way must be one of {', '.join(WAYS)}, got {self.way!r}")
        for name in ("m_tiles", "step_bytes", "block_outputs"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.extra_bands is not None and self.extra_bands < 0:
            raise ValueError(f"extra_bands must be >= 0, got {self.extra_bands}")
        if self.buffers is not None and self.buffers < 2:
            raise ValueError(f"buffers must be >= 2, got {self.buffers}")

    @property
    def is_default(self) -> bool:
        return self == DEFAULT

    def key(self) -> tuple:
        """The knobs set, as ``(name, value)`` pairs (what a cache key digests)."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                     if getattr(self, f.name) is not None)

    def describe(self) -> str:
        """The knobs set, e.g. ``way bands, extra_bands 1`` (``default`` for none)."""
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.key()) or "default"

    @classmethod
    def parse(cls, text: str) -> Variant:
        """The variant :meth:`describe` wrote."""
        if text == "default":
            return DEFAULT
        knobs = {}
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for part in text.split(", "):
            name, _, value = part.rpartition(" ")
            name = name.replace(" ", "_")
            if name not in types:
                raise ValueError(f"no knob {name!r} in {text!r}")
            knobs[name] = value if "str" in types[name] else \
                value == "True" if "bool" in types[name] else int(value)
        return cls(**knobs)


DEFAULT = Variant()

UnitKey = tuple  # a unit's node names in graph order


def variant_of(variants: Mapping[UnitKey, Variant] | None, nodes) -> Variant:
    """The variant ``variants`` gives the unit of ``nodes`` (names or nodes)."""
    if not variants:
        return DEFAULT
    names = tuple(n if isinstance(n, str) else n.name for n in nodes)
    return variants.get(names, DEFAULT)


def refuse(variant: Variant, why: str) -> CompileError:
    """The compiler's refusal of a variant it cannot honour for this unit."""
    return CompileError(f"variant {variant.describe()}: {why}")


# ---- the library of a unit ---------------------------------------------------------------


def candidates(graph, nodes: list[str]) -> list[Variant]:
    """Every variant worth trying for the unit of ``nodes`` (some may not compile):
    its knobs by the kind of work it does."""
    by_name = {n.name: n for _, n in graph.walk()}
    ns = [by_name[name] for name in nodes]
    out: list[Variant] = []
    has_weights = any(isinstance(n, (QGemm, QConv)) for n in ns)
    if len(ns) == 1 and isinstance(ns[0], QConv):
        for way in WAYS:
            out.append(Variant(way=way))
        out += [Variant(way="bands", extra_bands=b) for b in EXTRA_BANDS[1:]]
    if all(isinstance(n, QGemm) for n in ns) or not any(isinstance(n, QConv) for n in ns):
        out += [Variant(m_tiles=c) for c in M_TILE_COUNTS]
    if len(ns) == 1 and isinstance(ns[0], QGemm):
        out += [Variant(step_bytes=s) for s in STEP_BYTES]
        # ``buffers`` is not drawn: deeper prefetch measured no gain on any profile
        # (the load channel is busy back to back at the compiler's 3 buffers).
        out += [Variant(block_outputs=b) for b in BLOCK_OUTPUTS]
        # Blocks whose chunks a long step carries whole: fewer, longer bursts.
        out += [Variant(step_bytes=STEP_BYTES[-2], block_outputs=b) for b in BLOCK_OUTPUTS]
    if has_weights:
        out += [dataclasses.replace(v, stream_weights=True) for v in [DEFAULT, *out]]
    return out


@dataclass
class Option:
    """A legal variant of a unit and what compiling it says.

    Members
    -------
    variant : the knobs.
    predicted : cycles the cost model predicts for the unit (before any run).
    instructions : the unit's instructions.
    model : the whole program compiled with it (the other units as they were).
    """

    variant: Variant
    predicted: float
    instructions: int
    model: object


def predicted_cycles(resources: dict, cost: CostModel) -> float:
    """The compiler's own prediction of a compiled unit's cycles: the ranking
    prediction of its way when it has one, the cost model's otherwise."""
    if "cycles" in resources:
        return float(resources["cycles"])
    return cost.predict(resources["work"])


def unit_code(model, key: UnitKey) -> tuple:
    """What tells two variants of a unit apart: its instructions in ``model`` (a
    compiled model) and the weights partition's size (residency moves other
    units' blobs)."""
    sub = next(s for s in model.units if tuple(s.nodes) == key)
    return (tuple(ln for ln in sub.instructions if not ln.startswith(";")),
            model.place.weights_bytes)


def compile_with(model, variants: Mapping[UnitKey, Variant], **kw):
    """``model``'s plan compiled again with ``variants`` (a compiled model)."""
    from .compile import compile_model  # it imports this module

    return compile_model(model.graph, model.config, [list(u.nodes) for u in model.units],
                         simplified=True, variants=dict(variants), **kw)


def enumerate_variants(model, unit, base: Mapping[UnitKey, Variant] | None = None,
                       **kw) -> list[Option]:
    """The legal variants of ``unit`` (a ``Subgraph`` of ``model``, a compiled
    model), ranked by predicted cycles, fastest first. A variant is legal when
    the plan compiles with it and the unit's code differs from the compiler's own
    choice (``DEFAULT``, or ``base``'s variant of the unit, always listed) and
    every other variant listed; ``base`` gives the variants of the other units;
    ``kw`` go to :func:`compile_with` (``paging``, ``unit_store``)."""
    cost = CostModel(model.config)
    key = tuple(unit.nodes)
    base = dict(base or {})
    mine = base.get(key, DEFAULT)
    out: list[Option] = []
    seen: set[tuple] = set()
    for v in [mine, *(c for c in candidates(model.graph, unit.nodes) if c != mine)]:
        try:
            m = compile_with(model, {**base, key: v}, **kw)
        except CompileError:
            continue
        sub = next(s for s in m.units if tuple(s.nodes) == key)
        sig = unit_code(m, key)
        if sig in seen:
            continue
        seen.add(sig)
        out.append(Option(v, predicted_cycles(sub.resources, cost),
                          sub.resources["instructions"], m))
    return sorted(out, key=lambda o: o.predicted)
