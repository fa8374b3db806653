"""A compiled model: the program and everything needed to run and read it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from firmware import asm
from firmware.config import NPUConfig

from ..ir import Graph, Subgraph
from .layout import Layout
from .lower import Placement


@dataclass
class CompiledModel:
    """One NPU program for one model on one hardware profile.

    Members
    -------
    graph : the simplified graph the program computes (run the reference on it).
    config : the hardware profile it was compiled for.
    program : the assembled program (words, symbols, source lines).
    source : the generated assembly text.
    units : the subgraphs, in program order, with instructions and resource use.
    place : DRAM offsets of activations (from the arena base, ``r2``) and of
        constant blobs (from the constants base, ``r1``), and scratchpad residency.
    layouts : device layout of every DRAM tensor.
    result_regs : scalar results (ArgMax tensors) -> register index.
    stages : top-level node -> stage (even: CPU, odd: NPU segment).
    partitions : the partition table the program expects.
    log : what the simplifier changed.
    fusion : what fusing decided (merged units, refused merges, predicted cycles);
        empty when the caller gave the plan.
    spans : unit id -> its instruction indices ``[start, end)`` in ``program``.
    pages : empty when the program fits one instruction bank; else the
        :class:`~host.compiler.pages.Page` runs it is split into, in the order they
        run, each assembled at instruction 0 (``program`` is their concatenation).
    """

    graph: Graph
    config: NPUConfig
    program: asm.Program
    source: str
    units: list[Subgraph]
    place: Placement
    layouts: dict[str, Layout]
    result_regs: dict[str, int]
    stages: dict[str, int]
    partitions: list[tuple[int, int]]
    log: list[str] = field(default_factory=list)
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    fusion: list[str] = field(default_factory=list)
    pages: list = field(default_factory=list)

    @property
    def regions(self) -> dict[int, Subgraph]:
        """Region id (as the trace reports it) -> unit."""
        return {u.id: u for u in self.units}

    @property
    def segments(self) -> int:
        return len({s for s in self.stages.values() if s % 2})

    @property
    def instructions(self) -> int:
        return len(self.program)

    def page_words(self, index: int) -> list[int]:
        """The words of page ``index`` (what goes into a bank)."""
        page = self.pages[index]
        return self.program.words[page.start:page.end]

    def const_image(self) -> bytes:
        """The constants region: every weight blob at its offset."""
        out = bytearray(self.place.const_bytes)
        for b in self.place.blobs.values():
            out[b.dram: b.dram + len(b.data)] = b.data
        return bytes(out)

    def resources(self) -> dict:
        """Program-wide resource use."""
        resident = [b for b in self.place.blobs.values() if b.slot]
        return {
            "instructions": len(self.program),
            "imem_depth": self.config.imem_depth,
            "pages": len(self.pages),
            "const_bytes": self.place.const_bytes,
            "arena_bytes": self.place.arena_bytes,
            "resident_weight_bytes": self.place.weights_bytes,
            "tag_slots": len(resident),
            "scratchpad_peak": max((u.resources.get("scratchpad_bytes", 0)
                                    for u in self.units), default=0),
        }

    def signature(self) -> str:
        """A digest of the program and its constants (what a cache keys on)."""
        h = hashlib.sha256(self.program.to_bytes())
        h.update(self.const_image())
        return h.hexdigest()[:16]

    def disasm(self, addresses: bool = True) -> str:
        """The program as assembly: the generated source with instruction indices."""
        out = [f"; {self.graph.name}: {len(self.program)} instructions, "
               f"{len(self.units)} units, compiled for {self.config}"]
        out.append(f"; partitions: {self.partitions}")
        for u in self.units:
            out.append(f"; region {u.id}: {', '.join(u.nodes)}")
        if not addresses:
            return "\n".join(out) + "\n" + self.source
        index_of_line = {line: i for i, line in enumerate(self.program.lines)}
        for no, text in enumerate(self.source.splitlines(), start=1):
            i = index_of_line.get(no)
            out.append(f"{i:5d}  {text}" if i is not None else f"       {text}")
        return "\n".join(out) + "\n"

    def read_tensor(self, raw: bytes, name: str, shape) -> np.ndarray:
        """Decode a DRAM tensor's bytes (int8, device layout) to its logical value."""
        flat = np.frombuffer(raw, dtype=np.int8)
        return self.layouts[name].from_device(flat, shape)
