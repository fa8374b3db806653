"""Energy per event of the NPU, from published 45 nm figures, for the cost graph.

The NPU has no process node of its own (it runs in simulation and on FPGAs), so
the estimate takes the figures of M. Horowitz, "Computing's energy problem (and
what we can do about it)", ISSCC 2014, 45 nm at 0.9 V, as they are, without
scaling to another node: they rank where an inference's energy goes (MACs,
on-chip SRAM, DRAM, instruction fetch); they are not a power sign-off.

The figures used (pJ):

* 8-bit integer multiply 0.2, 32-bit integer add 0.1: an int8 x int8 -> int32
  multiply-accumulate is one of each, 0.3;
* a 64-bit SRAM access: 10 for 8 KB, 20 for 32 KB, 100 for 1 MB;
* a 64-bit DRAM access: 1,300 to 2,600; the midpoint, 1,950, is used.

An SRAM between two published sizes is interpolated linearly in log2(size); one
below 8 KB takes the 8 KB figure (an overestimate: there is no smaller point). A
64-bit access moves 8 bytes, so a byte costs an eighth of an access. Which SRAM a
count falls on: a scratchpad access goes to one bank (``sp_bytes / sp_banks``);
the accumulator buffer holds ``acc_rows x cols`` int32 words and, with two read
ports, is held twice, so each accumulator write costs ``acc_ports`` writes; an
instruction fetch reads one 64-bit word of a bank of ``imem_depth`` words.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import pairwise

from firmware.config import NPUConfig
from firmware.isa import WORD_BITS

SOURCE = ("M. Horowitz, \"Computing's energy problem (and what we can do about it)\", "
          "ISSCC 2014, 45 nm, 0.9 V")
"""Where every coefficient comes from."""

MULT8_PJ = 0.2
ADD32_PJ = 0.1
SRAM_ACCESS_PJ = ((8 * 1024, 10.0), (32 * 1024, 20.0), (1024 * 1024, 100.0))
"""(SRAM bytes, pJ per 64-bit access), the published points."""
DRAM_ACCESS_PJ = (1300.0 + 2600.0) / 2
ACCESS_BYTES = 8  # the published memory figures are per 64-bit access


def sram_access_pj(size_bytes: int) -> float:
    """pJ of one 64-bit access to an SRAM of ``size_bytes`` (see the module text)."""
    if size_bytes < 1:
        raise ValueError(f"size_bytes={size_bytes!r}: an SRAM holds at least a byte")
    points = SRAM_ACCESS_PJ
    if size_bytes <= points[0][0]:
        return points[0][1]
    # the published pair around the size (beyond 1 MB: the last slope, extended)
    (s0, e0), (s1, e1) = next((p for p in pairwise(points) if size_bytes <= p[1][0]),
                              points[-2:])
    f = (math.log2(size_bytes) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
    return e0 + f * (e1 - e0)

@dataclass(frozen=True)
class EnergyCoefficients:
    """pJ per counted event.

    Members
    -------
    mac : an int8 multiply-accumulate into int32.
    sp_byte : a scratchpad byte read or written (a DMA's side of a transfer too).
    acc_byte : an accumulator byte read; a write costs ``acc_byte * acc_copies``.
    acc_copies : copies of the accumulator buffer a write updates (its read ports).
    dram_byte : a DRAM byte read or written.
    fetch : an instruction fetched.
    """

    mac: float
    sp_byte: float
    acc_byte: float
    acc_copies: int
    dram_byte: float
    fetch: float

    @classmethod
    def for_config(cls, config: NPUConfig) -> EnergyCoefficients:
        """The coefficients of ``config``'s memories (sizes as the module text says)."""
        acc_bytes = config.acc_rows * config.cols * 4
        return cls(mac=MULT8_PJ + ADD32_PJ,
                   sp_byte=sram_access_pj(config.sp_bytes // config.sp_banks) / ACCESS_BYTES,
                   acc_byte=sram_access_pj(acc_bytes) / ACCESS_BYTES,
                   acc_copies=config.acc_ports,
                   dram_byte=DRAM_ACCESS_PJ / ACCESS_BYTES,
                   fetch=sram_access_pj(config.imem_depth * WORD_BITS // 8)
                   * WORD_BITS / 64)

    def as_dict(self) -> dict:
        return {**asdict(self), "source": SOURCE}


ENERGY_TERMS = ("mac", "sp", "acc", "dram", "fetch")
"""The terms an energy estimate is the sum of (:func:`energy_terms`)."""


def energy_terms(coef: EnergyCoefficients, *, macs: int = 0, sp_bytes: int = 0,
                 acc_read_bytes: int = 0, acc_write_bytes: int = 0, dram_bytes: int = 0,
                 instructions: int = 0) -> dict[str, float]:
    """pJ per term of :data:`ENERGY_TERMS` for the given counts."""
    return {"mac": macs * coef.mac,
            "sp": sp_bytes * coef.sp_byte,
            "acc": (acc_read_bytes + acc_write_bytes * coef.acc_copies) * coef.acc_byte,
            "dram": dram_bytes * coef.dram_byte,
            "fetch": instructions * coef.fetch}
