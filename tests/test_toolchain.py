"""Toolchain smoke test: Amaranth -> Verilog -> Verilator + cocotb, and Amaranth's simulator.

The same 8-bit counter, stimulus and reference model (``cocotb_toolchain``)
are checked under both simulators, and a deliberately wrong model must make
the pytest test fail.
"""

from pathlib import Path

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from cocotb_toolchain import WIDTH, reference, stimulus

from verif.sim import CocotbTestFailure, run_cocotb, sim_build_dir, to_verilog

COCOTB_MODULE = Path(__file__).with_name("cocotb_toolchain.py")
TOPLEVEL = "toolchain_counter"


class Counter(wiring.Component):
    """Counts enabled clock cycles, wrapping at ``2**WIDTH``."""

    en: In(1)
    count: Out(WIDTH)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.count.eq(self.count + 1)
        return m


def _run_verilator(**kwargs):
    build = sim_build_dir(TOPLEVEL)
    source = to_verilog(Counter(), TOPLEVEL, build / f"{TOPLEVEL}.v")
    return run_cocotb(TOPLEVEL, [source], COCOTB_MODULE, build, **kwargs)


@pytest.mark.rtl
def test_counter_verilator():
    results = _run_verilator()
    assert results.is_file()


@pytest.mark.rtl
def test_failing_cocotb_test_fails_pytest():
    with pytest.raises(CocotbTestFailure, match="counter_counts_only_when_enabled"):
        _run_verilator(extra_env={"TOOLCHAIN_MODEL_BIAS": "1"})


@pytest.mark.rtl
def test_quiet_run_keeps_tool_output_in_a_log(tmp_path, capfd):
    """Quiet (what ``npu --backend verilator`` and ``make demo`` use): the compiler's
    lines go to build.log, not the console; a failed build names that log and ends
    with its last lines."""
    build = tmp_path / "ok"
    source = to_verilog(Counter(), TOPLEVEL, build / f"{TOPLEVEL}.v")
    run_cocotb(TOPLEVEL, [source], COCOTB_MODULE, build, quiet=True)
    assert "Verilator: Built from" in (build / "build.log").read_text()
    assert "Verilator: Built from" not in capfd.readouterr().out
    bad = tmp_path / "bad.v"
    bad.write_text("module bad(input clk);\n  wire x = ;\nendmodule\n")
    with pytest.raises(RuntimeError, match=r"bad: the Verilator build failed .*log: .*build.log"
                                           r"(.|\n)*%Error"):
        run_cocotb("bad", [bad], COCOTB_MODULE, tmp_path / "bad", quiet=True)


def test_counter_amaranth_sim():
    dut = Counter()
    m = Module()
    m.domains.sync = sync = ClockDomain("sync")
    m.submodules.dut = dut

    stim = stimulus()
    expected = reference(stim)

    async def bench(ctx):
        # After ctx.tick() the design has settled past the rising edge, which
        # matches sampling on the falling edge in the cocotb test.
        for cycle, (rst, en) in enumerate(stim):
            got = ctx.get(dut.count)
            assert got == expected[cycle], f"cycle {cycle}: count={got}, expected {expected[cycle]}"
            ctx.set(sync.rst, rst)
            ctx.set(dut.en, en)
            await ctx.tick()
        assert ctx.get(dut.count) == expected[-1]

    sim = Simulator(m)
    sim.add_clock(10e-9)
    sim.add_testbench(bench)
    sim.run()


def test_source_digest_is_taken_once_per_process(tmp_path, monkeypatch):
    """A build key must describe the sources this process imported: an edit made
    while a test session runs must not re-label the design it already elaborated."""
    import verif.sim as sim

    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("A = 1\n")
    monkeypatch.setattr(sim, "REPO_ROOT", tmp_path)
    first = sim.source_digest("pkg")
    module.write_text("A = 2\n")
    assert sim.source_digest("pkg") == first
    # a process that starts after the edit sees it
    sim._source_digest.cache_clear()
    assert sim.source_digest("pkg") != first
