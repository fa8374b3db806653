"""The double-buffered instruction memory."""

from __future__ import annotations

from amaranth.hdl import Cat, Module
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig

from .sequencer import PREDECODE, predecode

YOSYS_SCRIPT = "setparam -set COLLISION_X_MASK 1'1 *.npu.imem/t:$memrd_v2"
"""Yosys commands for a board build (after reading the design): the fetch never reads
the address being written (:class:`InstructionMemory` writes only the other bank), so
what it would read then is left undefined. Without this Yosys keeps the memory's
read-old-data rule, which the block RAMs do not guarantee across their two ports, by
delaying every write a cycle and bypassing it to the read: about a hundred flip-flops
and a multiplexer behind the fetch. (Amaranth always emits the mask as 0.)"""


class InstructionMemory(wiring.Component):
    """Two banks of ``imem_depth`` 64-bit instructions, each stored with its
    :func:`hdl.sequencer.predecode` (computed here, on the write port).

    The host writes through ``w_*`` (the CSR block refuses writes aimed at the
    active bank before they get here, and the write enable excludes the bank read
    through ``r_bank``); the sequencer fetches from the active bank through ``r_*``
    with one cycle of latency. Bank selection is just the top
    address bit, so a swap is a one-bit change that costs no cycle.

    Members
    -------
    w_en, w_bank, w_index, w_data : In
        Write one instruction.
    r_bank, r_index, r_en : In
        Fetch address (``r_en`` low holds ``r_data``).
    r_data : Out(64)
    r_pre : Out(hdl.sequencer.PREDECODE)
        The fetched word's predecode (all zero, like an illegal word, where nothing
        was written).
    """

    def __init__(self, config: NPUConfig):
        self.config = config
        ibits = max(1, ceil_log2(config.imem_depth))
        super().__init__({
            "w_en": In(1), "w_bank": In(1), "w_index": In(16), "w_data": In(64),
            "r_en": In(1), "r_bank": In(1), "r_index": In(ibits), "r_data": Out(64),
            "r_pre": Out(PREDECODE),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.config.imem_depth
        ibits = max(1, ceil_log2(depth))
        entry = data.StructLayout({"word": 64, "pre": PREDECODE})
        m.submodules.mem = mem = Memory(shape=entry, depth=2 * depth, init=[])
        wr = mem.write_port()
        rd = mem.read_port()
        m.d.comb += [
            # Never the bank being fetched from (the CSR block already refuses such
            # writes): so no cycle reads and writes one address, which the board builds
            # tell Yosys (YOSYS_SCRIPT) instead of having it emulate a rule for it.
            wr.en.eq(self.w_en & (self.w_index < depth) & (self.w_bank != self.r_bank)),
            wr.addr.eq(Cat(self.w_index[:ibits], self.w_bank)),
            wr.data.word.eq(self.w_data),
            wr.data.pre.eq(predecode(m, self.w_data, self.config)),
            rd.en.eq(self.r_en),
            rd.addr.eq(Cat(self.r_index, self.r_bank)),
            self.r_data.eq(rd.data.word),
            self.r_pre.eq(rd.data.pre),
        ]
        return m
