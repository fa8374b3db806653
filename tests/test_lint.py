"""Verilator lint (``verif.lint``) of the generated Verilog.

The NPU top (small configuration) and two datapath blocks in both configurations must
lint clean under ``-Wall`` with the waivers of ``verif/verilator_lint.vlt``; a design
with real findings must fail, and the waivers must be what silences Amaranth's
harmless patterns (so a clean result is not an artefact of a broken parser).
"""

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from verif import lint
from verif.sim import to_verilog

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


def _show(result: lint.LintResult) -> str:
    return "\n".join([result.summary(), *map(str, result.messages[:20])])


def test_npu_small_is_clean():
    result = lint.lint("npu", "small")
    assert result.clean, _show(result)


@pytest.mark.parametrize("config", ["small", "default"])
@pytest.mark.parametrize("block", ["array", "dma"])
def test_datapath_block_is_clean(block, config):
    result = lint.lint(block, config)
    assert result.clean, _show(result)


class _Flawed(wiring.Component):
    """Two real findings: half of an input is dropped, and a comparison is constant."""

    a: In(8)
    b: In(4)
    low: Out(4)
    always: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.low.eq(self.a), self.always.eq(self.b >= 0)]
        return m


def test_real_findings_are_reported(tmp_path):
    src = to_verilog(_Flawed(), "flawed", tmp_path / "flawed.v")
    messages, code, output = lint.lint_verilog(src, "flawed")
    rules = {m.rule for m in messages}
    assert "UNSIGNED" in rules, output
    unused = [m for m in messages if m.rule == "UNUSEDSIGNAL"]
    assert any("'a'[7:4]" in m.text for m in unused), output
    # The Amaranth line behind a finding is named, so it can be fixed at the source.
    assert any(m.source.endswith(f"test_lint.py:{_Flawed.elaborate.__code__.co_firstlineno + 2}")
               for m in messages if m.rule == "UNSIGNED"), messages
    assert code == 0  # -Wno-fatal: warnings are counted, not fatal


def test_waivers_silence_amaranth_patterns_only():
    source = lint.verilog_for("tags", "small")
    raw, _, _ = lint.lint_verilog(source, "tags", waivers=None)
    waived, code, output = lint.lint_verilog(source, "tags")
    assert {m.rule for m in raw} >= {"PROCASSINIT", "WIDTHEXPAND", "UNUSEDSIGNAL"}, raw
    assert waived == [] and code == 0, output


def test_main_exit_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lint, "LINT_ROOT", tmp_path)
    monkeypatch.setitem(lint.BLOCKS, "flawed", lint.Block("flawed", lambda config: _Flawed()))
    assert lint.main(["--config", "small", "--block", "flawed"]) == 1
    out = capsys.readouterr().out
    assert "flawed" in out and "FAIL" in out and "UNSIGNED" in out
    assert (tmp_path / "small" / "flawed.log").is_file()
    assert lint.main(["--config", "small", "--block", "tags"]) == 0
    assert "1 of 1 clean" in capsys.readouterr().out
