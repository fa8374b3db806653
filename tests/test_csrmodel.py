"""The CSR model (firmware/csrmodel.py) against the register map's contract.

The RTL is checked against this model by tests/cocotb_csr.py; these tests pin the
rules the golden device relies on without a simulator.
"""

import pytest

from firmware import csrmodel
from firmware import regs as regs_module
from firmware.config import CONFIGS
from firmware.csrmodel import OKAY, SLVERR, CSRModel, NPUSide, RunState
from firmware.regs import addresses, pack_fields, unpack_fields


class Ports(NPUSide):
    def __init__(self, config):
        self.state = RunState()
        self.counters = [0] * len(regs_module.counter_names(config))
        self.table = {}
        self.events = []

    def run_state(self):
        return self.state

    def trace_count(self):
        return 0

    def trace_head(self, field):
        raise AssertionError("the head is not read while the FIFO is empty")

    def scalar(self, index):
        return index

    def counter(self, index):
        return self.counters[index]

    def pt_entry(self, bank, pt_set, partition):
        return self.table.get((bank, pt_set, partition), (0, 0))

    def commands(self, names):
        self.events.append(names)

    def imem_write(self, bank, index, word):
        self.events.append(("imem", bank, index, word))

    def pt_write(self, bank, pt_set, partition, base, size):
        self.table[(bank, pt_set, partition)] = (base, size)
        self.events.append(("pt", bank, pt_set, partition, base, size))


@pytest.fixture
def csr():
    config = CONFIGS["small"]
    model = CSRModel(config, Ports(config))
    addr = addresses(config)
    model.rd = lambda name: model.read(addr[name])[0]
    model.wr = lambda name, value, strb=0xF: model.write(addr[name], value, strb)
    return model


def test_constructor_checks(monkeypatch):
    config = CONFIGS["small"]
    with pytest.raises(TypeError, match="NPUConfig"):
        CSRModel({"rows": 8}, Ports(config))
    extra = regs_module.Register("SHINY", 0xFF0, regs_module.Access.RO, "new")
    original = regs_module.registers
    monkeypatch.setattr(csrmodel, "registers", lambda cfg: (*original(cfg), extra))
    with pytest.raises(ValueError, match="SHINY"):
        CSRModel(config, Ports(config))


def test_unmapped_and_access_modes(csr):
    assert csr.read(0x3F0) == (0, SLVERR) and csr.write(0x3F0, 1) == SLVERR
    assert csr.rd("ID") == regs_module.ID_MAGIC
    assert csr.rd("CAPS_IMEM_DEPTH") == csr.config.imem_depth
    assert csr.rd("R5") == 5
    assert csr.wr("ID", 0) == OKAY and csr.rd("ID") == regs_module.ID_MAGIC  # RO ignores
    assert csr.wr("ARG3", 0x11223344) == OKAY
    csr.wr("ARG3", 0xAA << 16, strb=0b0100)
    assert csr.rd("ARG3") == 0x11AA3344 and csr.rw["ARG3"] == 0x11AA3344
    csr.wr("IRQ_ENABLE", 0xFFFF_FFFF)
    assert csr.rd("IRQ_ENABLE") == pack_fields("IRQ_ENABLE", done=1, error=1)
    csr.wr("IMEM_DATA_LO", 7)
    assert csr.rd("IMEM_DATA_LO") == 0 and csr.rd("CTRL") == 0


def test_commands_and_sticky_trace_overflow(csr):
    csr.wr("CTRL", pack_fields("CTRL", start=1, swap=1))
    csr.wr("CTRL", 0xFFFF_FFFF, strb=0b1110)  # lane 0 unstrobed: nothing
    csr.wr("TRACE_POP", 2)  # bit 0 clear: no pop
    csr.wr("TRACE_POP", 1)
    assert csr.npu.events == [("start", "swap"), ("trace_pop",)]
    for clear in ("counter_reset", "trace_clear"):
        csr.pulse("trace_overflow")
        csr.wr("CTRL", pack_fields("CTRL", tag_invalidate=1))
        assert unpack_fields("STATUS", csr.rd("STATUS"))["trace_overflow"] == 1
        csr.wr("CTRL", pack_fields("CTRL", **{clear: 1}))
        assert unpack_fields("STATUS", csr.rd("STATUS"))["trace_overflow"] == 0


def test_interrupts(csr):
    csr.pulse("run_done")
    assert csr.rd("IRQ_STATUS") == pack_fields("IRQ_STATUS", done=1) and not csr.irq
    csr.wr("IRQ_ENABLE", pack_fields("IRQ_ENABLE", error=1))
    assert not csr.irq
    csr.pulse("run_error")
    assert csr.irq
    csr.wr("IRQ_STATUS", pack_fields("IRQ_STATUS", error=1))
    assert not csr.irq and csr.rd("IRQ_STATUS") == pack_fields("IRQ_STATUS", done=1)
    with pytest.raises(ValueError, match="no input pulse"):
        csr.pulse("start")


def test_refusal_and_bounds(csr):
    depth = csr.config.imem_depth
    csr.npu.state = RunState(active_bank=0)
    csr.wr("IMEM_ADDR", pack_fields("IMEM_ADDR", bank=1, index=depth - 1))
    csr.wr("IMEM_DATA_LO", 0x12345678)
    assert csr.wr("IMEM_DATA_HI", 0x9ABCDEF0) == OKAY
    assert csr.wr("IMEM_DATA_HI", 1) == SLVERR  # past the bank: not written, index kept
    assert csr.rd("IMEM_ADDR") == pack_fields("IMEM_ADDR", bank=1, index=depth)
    assert csr.npu.events == [("imem", 1, depth - 1, 0x9ABCDEF0_12345678)]
    # the active bank, and either bank while a swap is pending, are refused
    for state, bank in ((RunState(active_bank=1), 1), (RunState(swap_pending=1), 0)):
        csr.npu.state = state
        csr.wr("IMEM_ADDR", pack_fields("IMEM_ADDR", bank=bank, index=3))
        assert csr.wr("IMEM_DATA_HI", 5) == OKAY
        assert csr.wr(f"BANK_VERSION{bank}", 5) == OKAY and csr.rd(f"BANK_VERSION{bank}") == 0
        status = unpack_fields("STATUS", csr.rd("STATUS"))
        assert status["refused"] == 1 and csr.rd("IMEM_ADDR") & 0xFFFF == 3
        csr.wr("IRQ_STATUS", pack_fields("IRQ_STATUS", done=1, error=1))  # not refused
        assert unpack_fields("STATUS", csr.rd("STATUS"))["refused"] == 1
        csr.wr("IRQ_STATUS", pack_fields("IRQ_STATUS", refused=1))
        assert unpack_fields("STATUS", csr.rd("STATUS"))["refused"] == 0
    # partition table: PT_SIZE commits the staged base; missing entries answer SLVERR
    csr.npu.state = RunState(active_bank=0)
    csr.npu.events = []
    csr.wr("PT_SELECT", pack_fields("PT_SELECT", bank=1, set=1, partition=2))
    csr.wr("PT_BASE", 0x100)
    assert csr.rd("PT_BASE") == 0
    assert csr.wr("PT_SIZE", 0x40) == OKAY
    assert (csr.rd("PT_BASE"), csr.rd("PT_SIZE")) == (0x100, 0x40)
    csr.wr("PT_SELECT", pack_fields("PT_SELECT", bank=1, set=csr.config.pt_sets))
    assert csr.wr("PT_SIZE", 0x40) == SLVERR
    assert csr.npu.events == [("pt", 1, 1, 2, 0x100, 0x40)]


def test_counter_latch(csr):
    names = csr.counter_names
    csr.npu.counters[0] = 5 << 32 | 1
    csr.npu.counters[1] = 7 << 32 | 2
    assert csr.rd(f"CNT_{names[0].upper()}_LO") == 1
    csr.npu.counters[0] += 1 << 32
    assert csr.rd(f"CNT_{names[0].upper()}_HI") == 5  # latched
    assert csr.rd(f"CNT_{names[1].upper()}_HI") == 7  # another counter: live
    csr.rd(f"CNT_{names[1].upper()}_LO")
    assert csr.rd(f"CNT_{names[0].upper()}_HI") == 6  # the latch moved on
