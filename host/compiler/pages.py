"""Programs larger than an instruction bank, split into pages that each fit one.

A page is one run of the NPU: units of one NPU segment, in program order, then
``end``. Pages break only between top-level units (a unit, or a whole ``If``), and
the code after a break sets up its own cfg and registers (``Emitter.begin_unit``),
since every run starts from the reset state. A break may not separate a scalar
result (an ArgMax's register) from the branch that reads it: the registers reset at
the next run's start.

The runtime writes page i+1 into the shadow bank while page i runs and requests
the swap, which lands at the run boundary (``host/runtime.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from firmware import asm

from .units import Chunk, link_program

PAGE_BREAK_CYCLES = 18
"""Cycles a page break adds to an inference: the run's queues drain, the next run
starts and its first unit sets up its cfg. Measured on ``small`` against one deep
enough bank (``python -m bench.models --config small`` and ``--imem-depth 8192``):
ResNet-8 32 cycles for 2 breaks, DS-CNN 18 for 1, MobileNetV1-0.25 14 for 3."""


class Page(NamedTuple):
    """One page: ``program.words[start:end]`` of a paged model, assembled at
    instruction 0, run for NPU segment ``segment``; ``results`` are the scalar
    result tensors its units leave in registers."""

    segment: int
    start: int
    end: int
    results: tuple[str, ...] = ()


def choose_breaks(sizes: list[int], live: list[bool], room: int) -> list[int]:
    """Where to break a segment of items of ``sizes`` instructions into pages of at
    most ``room`` instructions: the indices of the items that open a new page.

    ``live[i]``: a break before item i is not allowed (a scalar result made before
    it is read at or after it). Each page is filled as far as it goes. Raises
    ``ValueError`` naming the item that fits no page.
    """
    breaks, start, used = [], 0, 0
    i = 0
    while i < len(sizes):
        if sizes[i] > room:
            raise ValueError(f"item {i} alone has {sizes[i]} instructions, a page holds "
                             f"{room}")
        if used + sizes[i] <= room:
            used += sizes[i]
            i += 1
            continue
        at = next((j for j in range(i, start, -1) if not live[j]), None)
        if at is None:
            raise ValueError(f"items {start}..{i} share a scalar result and fit no page "
                             "together")
        breaks.append(at)
        start, used, i = at, 0, at
    return breaks


def link_pages(lines: list[str], starts: list[int], chunks: list[Chunk] | None
               ) -> tuple[asm.Program, list[tuple[int, int]]]:
    """Assemble each page ``lines[starts[p]:starts[p + 1]]`` at instruction 0 and
    concatenate them into one :class:`asm.Program` whose ``lines`` and ``symbols``
    refer to ``lines`` as a whole; also each page's word range ``[start, end)``.

    ``chunks``: the units' code already assembled (``units.link_program``), None to
    assemble the text.
    """
    bounds = [*starts, len(lines)]
    words, where, symbols, ranges = [], [], {}, []
    for a, b in zip(bounds, bounds[1:], strict=False):
        text = lines[a:b]
        if chunks is None:
            try:
                prog = asm.assemble("\n".join(text) + "\n")
            except asm.AsmError as err:  # a compiler bug, never the user's model
                raise RuntimeError(f"the compiler wrote invalid assembly: {err}") from err
        else:
            mine = [c._replace(start=c.start - a, end=c.end - a) for c in chunks
                    if a <= c.start < b]
            prog = link_program(text, mine)
        at = len(words)
        ranges.append((at, at + len(prog)))
        words += prog.words
        where += [no + a for no in prog.lines]
        symbols.update({name: pc + at for name, pc in prog.symbols.items()})
    return asm.Program(words, symbols, where, "\n".join(lines) + "\n"), ranges
