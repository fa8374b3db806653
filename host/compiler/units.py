"""Units compiled on their own: relocatable code, and the store the linker reads.

A unit's code depends on three kinds of facts:

* its own nodes, tensors and constants (the unit signature);
* facts of the model that every plan of it agrees on (its :func:`unit context
  <host.compiler.compile.unit_context>`: the residency of its weight blobs, the
  size of the working partition, the layouts of its DRAM tensors, the scalar
  result registers already in use);
* facts of the plan: its region id (merged units get plan-made ids), the DRAM
  offsets of its activations in the arena (``r2``) and of its constants
  (``r1``), and where it sits in the program (branch and loop targets).

:func:`relocatable` turns a unit lowered on its own into :class:`UnitCode` in which
the plan's facts are symbols, and :meth:`UnitCode.link` fills them in: ``@id``
the region id, ``@aN+D`` byte ``D`` of the unit's Nth DRAM tensor, ``@cN+D`` byte
``D`` of its Nth constants blob, and every label gets the unit's prefix. The
lowering emits each symbolic address with one ``addi`` whatever its value, so the
linked code equals the code lowered in place (``tests/test_units.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from firmware import asm, isa

from .plan import CompileError

SYMBOL_SPACING = 1 << 24
"""The least spacing of stand-in DRAM offsets while a unit lowers alone: symbol N
is ``(N + 1) * spacing``, and an address within half a spacing of it is symbol N
plus that difference. :func:`symbol_spacing` widens it for large tensors."""
IMMEDIATE_LIMIT = 1 << 31  # addi immediates are signed 32-bit
TARGET_LIMIT = 1 << 16  # branch and loop targets are 16-bit instruction indices

_ADDR = re.compile(r"^(\s*addi r\d+, )(r1|r2)(, )(-?\d+)(.*)$")
_REGION = re.compile(r"^(\s*region\.(?:begin|end) )(\d+)(.*)$")
_LABEL = re.compile(r"^([A-Za-z_][\w.]*):$")
_SYMBOL = re.compile(r"@([ac])(\d+)([+-]\d+)|@id\b")


def symbol_spacing(largest: int) -> int:
    """The stand-in spacing for a unit whose largest DRAM tensor or blob has
    ``largest`` bytes: a power of two (alignment stays what the plan gives) that
    keeps every address within a tensor nearer its own stand-in than any other."""
    return max(SYMBOL_SPACING, 1 << (4 * max(largest, 1) - 1).bit_length())


def stand_in(n: int, spacing: int = SYMBOL_SPACING) -> int:
    """The stand-in DRAM offset of symbol ``n`` at ``spacing``."""
    most = IMMEDIATE_LIMIT // spacing - 2
    if not 0 <= n < most:
        raise CompileError(f"a unit with more than {most} DRAM tensors or weight blobs "
                           f"of up to {spacing // 4} bytes cannot be compiled on its own")
    return (n + 1) * spacing


@dataclass
class UnitCode:
    """One unit's code with the plan's facts left as symbols.

    Members
    -------
    lines : assembly lines (``@id``, ``@aN+D``, ``@cN+D`` symbols, unit-local labels).
    labels : the labels the lines define (renamed per unit when linked).
    resources : the lowering's resource use (what ``Subgraph.resources`` shows).
    results : scalar result tensor -> register (the unit's ArgMax results).
    words : the code assembled at instruction 0 (symbols at their stand-in values).
    word_lines : index in ``lines`` of each word.
    symbols : label -> instruction index from the unit's start.
    relocs : the fields the linker fills, :class:`Reloc` per field.
    choices : the competing ways of lowering it, as ``Lowering.choices`` records
        them (what pricing instructions trades when a program outgrows the bank).
    """

    lines: list[str]
    labels: list[str]
    resources: dict
    results: dict[str, str] = field(default_factory=dict)
    words: list[int] = field(default_factory=list)
    word_lines: list[int] = field(default_factory=list)
    symbols: dict[str, int] = field(default_factory=dict)
    relocs: list[Reloc] = field(default_factory=list)
    choices: list = field(default_factory=list)

    def link_words(self, at: int, region: int, tensors: list[int], blobs: list[int]
                   ) -> list[int]:
        """The words placed at instruction ``at`` with the symbols filled in."""
        words = list(self.words)
        bases = {"a": tensors, "c": blobs}
        for r in self.relocs:
            f = _FIELDS[r.mnemonic][r.field]
            if r.kind == "t":
                value = at + r.addend
            elif r.kind == "id":
                value = region
            else:
                value = bases[r.kind][r.n] + r.addend
            words[r.word] = words[r.word] & ~(f.mask << f.lo) | f.pack(value)
        return words

    def link(self, region: int, tensors: list[int], blobs: list[int]) -> list[str]:
        """The lines with the symbols filled in: ``region`` id, the DRAM offset of each
        of the unit's tensors (in :func:`dram_tensors` order) and of its blobs."""
        bases = {"a": tensors, "c": blobs}

        def value(m: re.Match) -> str:
            if m.group(1) is None:
                return str(region)
            return str(bases[m.group(1)][int(m.group(2))] + int(m.group(3)))

        out = [_SYMBOL.sub(value, ln) if "@" in ln else ln for ln in self.lines]
        if self.labels:
            local = re.compile(r"\b(" + "|".join(map(re.escape, self.labels)) + r")\b")
            prefix = f"u{region}_"
            out = [local.sub(lambda m: prefix + m.group(1), ln) for ln in out]
        return out


class Reloc(NamedTuple):
    """One field the linker fills: ``kind`` "t" (a branch or loop target: the unit's
    start plus ``addend``), "id" (the region id), "a"/"c" (DRAM offset of the unit's
    tensor/blob ``n`` plus ``addend``)."""

    word: int
    mnemonic: str
    field: str
    kind: str
    n: int = 0
    addend: int = 0


_FIELDS = {spec.mnemonic: {f.name: f for f in spec.fields} for spec in isa.SPECS}
_SYM = re.compile(r"@([ac])(\d+)([+-]\d+)")


def is_instruction(line: str) -> bool:
    """Whether an assembly line is an instruction (not a label, comment or blank)."""
    text = line.split(";", 1)[0].strip()
    return bool(text) and not text.endswith(":")


def assemble_unit(lines: list[str], symbolic: list[str], labels: list[str], resources: dict,
                  results: dict) -> UnitCode:
    """Assemble a unit lowered with stand-ins (``lines``; ``symbolic`` is
    :func:`relocatable`'s form of them) into :class:`UnitCode`."""
    length = sum(map(is_instruction, lines))
    if length > TARGET_LIMIT:  # its own loops could not reach their ends
        raise CompileError(f"a unit of {length} instructions is beyond the {TARGET_LIMIT} "
                           "that branch and loop targets address")
    try:
        program = asm.assemble("\n".join(lines) + "\n")
    except asm.AsmError as err:  # a compiler bug, never the user's model
        raise RuntimeError(f"the compiler wrote invalid assembly: {err}") from err
    relocs = []
    word_lines = [no - 1 for no in program.lines]
    for i, (word, ln) in enumerate(zip(program.words, word_lines, strict=True)):
        instr = isa.decode(word)
        m = instr.mnemonic
        for f in instr.spec.fields:
            if f.kind is isa.Kind.TARGET:
                relocs.append(Reloc(i, m, f.name, "t", 0, int(instr.ops[f.name])))
        text = symbolic[ln]
        if "@id" in text:
            relocs.append(Reloc(i, m, "id", "id"))
        elif (s := _SYM.search(text)) is not None:
            relocs.append(Reloc(i, m, "imm", s.group(1), int(s.group(2)), int(s.group(3))))
    return UnitCode(symbolic, labels, resources, results, program.words, word_lines,
                    dict(program.symbols), relocs)


class Chunk(NamedTuple):
    """A unit's code in a program being linked: ``lines[start:end]`` are its linked
    text; the values fill its symbols."""

    start: int
    end: int
    code: UnitCode
    region: int
    tensors: list[int]
    blobs: list[int]


def link_program(lines: list[str], chunks: list[Chunk]) -> asm.Program:
    """Assemble the program ``lines`` whose unit code is already assembled in
    ``chunks``: only the lines between them (segment dispatch, branches, ``end``)
    are assembled here; the units' words are placed and patched."""
    by_start = {c.start: c for c in chunks}
    items, labels, pc, i = [], {}, 0, 0  # items: (pc, line index, text | Chunk)
    while i < len(lines):
        c = by_start.get(i)
        if c is not None:
            for name, at in c.code.symbols.items():
                labels[f"u{c.region}_{name}"] = pc + at
            items.append((pc, i, c))
            pc += len(c.code.words)
            i = c.end
            continue
        text = lines[i].split(";", 1)[0].strip()
        m = _LABEL.match(text)
        if m:
            labels[m.group(1)] = pc
        elif text:
            items.append((pc, i, text))
            pc += 1
        i += 1
    words, where = [], []
    for at, i, what in items:
        if isinstance(what, Chunk):
            words += what.code.link_words(at, what.region, what.tensors, what.blobs)
            where += [i + 1 + k for k in what.code.word_lines]
        else:
            try:
                words += asm.assemble(what + "\n", defines=labels).words
            except asm.AsmError as err:
                raise RuntimeError(f"the compiler wrote invalid assembly: {err}") from err
            where.append(i + 1)
    return asm.Program(words, labels, where, "\n".join(lines) + "\n")


def relocatable(lines: list[str], region: int, tensors: int, blobs: int, *,
                check: bool = True, spacing: int = SYMBOL_SPACING) -> tuple[list, list]:
    """Lines lowered with stand-in offsets -> (symbolic lines, labels).

    ``tensors`` and ``blobs`` count the stand-ins given to the unit; an ``r1``/``r2``
    address that is no stand-in is a compiler bug (its value would not relocate).
    ``spacing`` is the one :func:`stand_in` was given. ``check=False``: lines
    lowered in place (real offsets), only labels are found.
    """
    counts = {"r2": ("a", tensors), "r1": ("c", blobs)}
    out, labels = [], []
    for ln in lines:
        m = _ADDR.match(ln) if check else None
        if m:
            kind, count = counts[m.group(2)]
            v = int(m.group(4))
            n = (v + spacing // 2) // spacing - 1
            d = v - (n + 1) * spacing
            if not 0 <= n < count:
                raise RuntimeError(f"unit {region}: the address {ln.strip()!r} is not "
                                   "relative to one of its tensors or blobs")
            ln = f"{m.group(1)}{m.group(2)}{m.group(3)}@{kind}{n}{d:+d}{m.group(5)}"
        else:
            m = _REGION.match(ln)
            if m and int(m.group(2)) == region:
                ln = f"{m.group(1)}@id{m.group(3)}"
            else:
                m = _LABEL.match(ln)
                if m:
                    labels.append(m.group(1))
        out.append(ln)
    return out, labels


class UnitStore(Protocol):
    """Where the compiler finds and keeps units compiled on their own.

    ``nodes`` names the unit's nodes in ``graph``; ``context`` is its
    :func:`~host.compiler.compile.unit_context`. ``get`` returns None when it has no
    entry and raises the stored :class:`CompileError` of a refused unit.
    """

    def get(self, graph, nodes: list[str], context: tuple) -> UnitCode | None: ...

    def put(self, graph, nodes: list[str], context: tuple,
            result: UnitCode | CompileError) -> None: ...


class UnitMemo:
    """An in-process :class:`UnitStore` keyed by node names and context (one graph).

    Members
    -------
    compiled : units compiled through it (``put`` calls).
    """

    def __init__(self):
        self._entries: dict = {}
        self.compiled = 0

    def get(self, graph, nodes, context):
        found = self._entries.get((tuple(nodes), repr(context)))
        if isinstance(found, CompileError):
            raise found
        return found

    def put(self, graph, nodes, context, result):
        self.compiled += 1
        self._entries[(tuple(nodes), repr(context))] = result
