"""Test-only compiler fault injection: break one unit of a compiled plan.

Shadow validation must catch a unit that computes a wrong result. These helpers
make such a unit on purpose, by editing the generated assembly of one region and
reassembling it, so tests can prove the rollback path (``AdaptiveRuntime(...,
fault=corrupt_requant)``). Nothing outside tests and benchmarks uses them.
"""

from __future__ import annotations

import copy
import re

from firmware import asm

from ..compiler import CompiledModel

_QZP = re.compile(r"^(\s*cfg\.qzp\s+)(-?\d+)(.*)$")


def corrupt_requant(model: CompiledModel, unit_id: int, delta: int = 3) -> CompiledModel:
    """A copy of ``model`` whose unit ``unit_id`` requantizes with its output zero
    point moved by ``delta`` (every result of that unit is off by ``delta``, before
    clipping). Raises ``ValueError`` when the region sets no zero point.
    """
    lines = model.source.splitlines()
    inside, changed = False, 0
    for i, line in enumerate(lines):
        text = line.split(";")[0].strip()
        if text.startswith("region.begin") and int(text.split()[1], 0) == unit_id:
            inside = True
        elif text.startswith("region.end") and int(text.split()[1], 0) == unit_id:
            inside = False
        elif inside:
            m = _QZP.match(line)
            if m:
                zp = max(-128, min(127, int(m.group(2)) + delta))
                if zp == int(m.group(2)):
                    zp -= 2 * delta
                lines[i] = f"{m.group(1)}{zp}{m.group(3)}"
                changed += 1
    if not changed:
        raise ValueError(f"region {unit_id} sets no requantization zero point")
    source = "\n".join(lines) + "\n"
    broken = copy.copy(model)
    broken.source = source
    broken.program = asm.assemble(source)
    return broken
