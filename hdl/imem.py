"""The double-buffered instruction memory."""

from __future__ import annotations

from amaranth.hdl import Cat, Module
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig

from .sequencer import PREDECODE, predecode


class InstructionMemory(wiring.Component):
    """Two banks of ``imem_depth`` 64-bit instructions, each stored with its
    :func:`hdl.sequencer.predecode` (computed here, on the write port; its read
    slots in a memory of their own).

    The host writes through ``w_*`` (the CSR block refuses writes aimed at the
    active bank before they get here); the sequencer fetches from the active bank
    through ``r_*`` with one cycle of latency. Bank selection is just the top
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
        rest = {name: shape for name, shape in PREDECODE.members.items() if name != "slots"}
        entry = data.StructLayout({"word": 64, "pre": data.StructLayout(rest)})
        m.submodules.mem = mem = Memory(shape=entry, depth=2 * depth, init=[])
        # The registers the word's read slots name, stored a second time in LUT RAM
        # where the device has it (ECP5): read behind a flip-flop, they start the
        # sequencer's register-file read from a register instead of a block RAM's
        # output (5.83 ns of clock-to-out; the fetch into the operand registers was
        # one of the two slowest paths of the routed ULX3S build, docs/fpga.md).
        # Same address, enable and latency as ``mem``, which holds the rest.
        lut_ram = getattr(platform, "family", None) == "ecp5"
        m.submodules.slots = slots = Memory(
            shape=PREDECODE.members["slots"], depth=2 * depth, init=[],
            attrs={"ram_style": "distributed"} if lut_ram else None)
        pre = predecode(m, self.w_data, self.config)
        w_en = self.w_en & (self.w_index < depth)
        w_addr = Cat(self.w_index[:ibits], self.w_bank)
        r_addr = Cat(self.r_index, self.r_bank)
        wr, rd = mem.write_port(), mem.read_port()
        slots_wr, slots_rd = slots.write_port(), slots.read_port()
        m.d.comb += [
            wr.en.eq(w_en), wr.addr.eq(w_addr),
            wr.data.word.eq(self.w_data),
            *[wr.data.pre[name].eq(pre[name]) for name in rest],
            slots_wr.en.eq(w_en), slots_wr.addr.eq(w_addr), slots_wr.data.eq(pre.slots),
            rd.en.eq(self.r_en), rd.addr.eq(r_addr),
            slots_rd.en.eq(self.r_en), slots_rd.addr.eq(r_addr),
            self.r_data.eq(rd.data.word),
            *[self.r_pre[name].eq(rd.data.pre[name]) for name in rest],
            self.r_pre.slots.eq(slots_rd.data),
        ]
        return m
