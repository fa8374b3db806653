"""The synthesis report: nextpnr's and Yosys's figures read back, and the report
written from them (``report.json`` and ``report.md``, see docs/fpga.md).

:func:`summarize` builds the JSON object from parsed figures, :func:`render_markdown`
the markdown; the parsers read nextpnr's ``--report`` JSON, its log (critical path,
fmax, utilization) and Yosys's ``stat`` printout. :mod:`tools.fpga.synth` runs the
build and calls these; :mod:`tools.fpga.hierarchy` reuses the cell tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from firmware.config import NPUConfig

__all__ = ["parse_nextpnr_report", "parse_nextpnr_log", "parse_critical_path",
           "critical_path_blocks", "parse_yosys_stat", "fit_problems", "timing_lines",
           "retry_freq_mhz", "retry_hint", "npu_clock_of", "timing_met", "summarize",
           "render_markdown", "write_failure", "STAT_LINE", "block_of",
           "cells_by_block", "block_rows", "block_table", "COLUMNS", "SORT_BY", "ICE40_FFS"]

ICE40_FFS = ("SB_DFF", "SB_DFFE", "SB_DFFSR", "SB_DFFR", "SB_DFFS", "SB_DFFESR", "SB_DFFER",
             "SB_DFFES", "SB_DFFSS", "SB_DFFESS")
"""Yosys's iCE40 flip-flop cell types."""
COLUMNS = {
    "ecp5": (
        ("LUT4", {"LUT4": 1}),
        ("LUT4 + carry", {"LUT4": 1, "CCU2C": 2}),  # a CCU2C carry cell holds two LUTs
        ("FF", {"TRELLIS_FF": 1}),
        ("MULT18X18D", {"MULT18X18D": 1}),
        ("DP16KD", {"DP16KD": 1}),
        ("LUTRAM (DPR16X4)", {"TRELLIS_DPR16X4": 1}),
    ),
    "ice40": (
        ("LUT4", {"SB_LUT4": 1}),
        ("FF", dict.fromkeys(ICE40_FFS, 1)),
        ("SB_CARRY", {"SB_CARRY": 1}),
        ("SB_MAC16", {"SB_MAC16": 1}),
        ("SB_RAM40_4K", {"SB_RAM40_4K": 1}),
        ("SB_SPRAM256KA", {"SB_SPRAM256KA": 1}),
    ),
}
"""Per family, the columns of a table of cells by block (``make synth-hierarchy``, the
build report's cells by block): (name, {yosys cell type: how many it counts})."""
SORT_BY = {"ecp5": "LUT4 + carry", "ice40": "LUT4"}


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
STAT_LINE = re.compile(r"^\s+(\d+)\s+([A-Z][A-Z0-9_]*)\s*$", re.M)


def parse_yosys_stat(text: str) -> dict[str, int]:
    """Cell counts by type from the last ``stat`` printout of a yosys log."""
    part = text.rsplit("Printing statistics", 1)[-1]
    counts: dict[str, int] = {}
    for n, cell in STAT_LINE.findall(part):
        counts[cell] = max(counts.get(cell, 0), int(n))
    return counts


def block_of(cell: str) -> str:
    """The NPU block a netlist name belongs to: ``soc.npu.sp.x`` -> ``sp``,
    ``soc.bridge.y`` -> ``bridge``; an interface member of the NPU's top
    (``soc.npu.arr_cmd__payload``) -> ``(npu top)``; nextpnr's constants ->
    ``(constants)``."""
    if cell.startswith("$PACKER_"):
        return "(constants)"
    parts = cell.split(".")
    if parts[0] == "soc":
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "npu":
        parts = parts[1:]
        if "__" in parts[0]:
            return "(npu top)"
    return parts[0] if len(parts) > 1 else "(top)"


def cells_by_block(netlist: dict) -> dict[str, dict[str, int]]:
    """A synthesized netlist's cells (Yosys's ``write_json``, flattened) by type, summed
    by the block each belongs to, named as :func:`block_of`
    names them (``soc.npu.sp.x`` -> ``sp``; logic named after a signal between the
    NPU's blocks under that signal, ``(npu) counters``). Where a flat build's logic
    went, as it was mapped (``make synth-hierarchy`` synthesizes each block apart);
    :func:`block_rows` makes the table."""
    blocks: dict[str, dict[str, int]] = {}
    for module in netlist.get("modules", {}).values():
        for name, cell in module.get("cells", {}).items():
            block = "(unnamed)" if name.startswith("$") else block_of(name)
            if block == "(npu top)":  # logic named after a signal between blocks, e.g.
                # the counters the CSR block reads: name it by that signal
                parts = name.split(".")
                block = "(npu) " + parts[parts.index("npu") + 1].split("__")[0]
            acc = blocks.setdefault(block, {})
            acc[cell["type"]] = acc.get(cell["type"], 0) + 1
    return blocks


def block_rows(blocks: dict[str, dict[str, int]], family: str, total: str) -> list[dict]:
    """One row per block in ``family``'s :data:`COLUMNS`, largest first (then by
    name), and a last row named ``total`` that sums them."""
    cols = COLUMNS[family]
    rows = [{"block": b, **{c: sum(cells.get(t, 0) * k for t, k in kinds.items())
                            for c, kinds in cols}}
            for b, cells in blocks.items()]
    rows = [r for r in rows if any(r[c] for c, _ in cols)]  # blocks of wires alone
    rows.sort(key=lambda r: (-r[SORT_BY[family]], r["block"]))
    rows.append({"block": total, **{c: sum(r[c] for r in rows) for c, _ in cols}})
    return rows


def block_table(rows: list[dict], limit: int = 12) -> list[str]:
    """Markdown lines for :func:`block_rows`'s rows: the first ``limit`` blocks, the
    rest summed as one line, and the total row."""
    if not rows:
        return []
    cols = [k for k in rows[0] if k != "block"]
    *blocks, total = rows
    shown = blocks[:limit]
    if len(blocks) > limit:
        rest = blocks[limit:]
        shown = shown + [{"block": f"{len(rest)} others",
                          **{c: sum(r[c] for r in rest) for c in cols}}]
    out = ["| block | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    out += [f"| {r['block']} | " + " | ".join(f"{r[c]:,}" for c in cols) + " |"
            for r in shown + [{**total, "block": f"**{total['block']}**"}]]
    return out


def _resources(util: dict) -> dict[str, dict]:
    """The ECP5 figures that matter, as ``{name: {"used": n, "available": m}}``."""

    def pick(kind):
        used, avail = util.get(kind, (0, 0))
        return {"used": used, "available": avail}

    return {
        "LUT": pick("TRELLIS_COMB"),
        "FF": pick("TRELLIS_FF"),
        "DSP (MULT18X18D)": pick("MULT18X18D"),
        "BRAM (DP16KD)": pick("DP16KD"),
        "LUTRAM (TRELLIS_RAMW)": pick("TRELLIS_RAMW"),
        "IO": pick("TRELLIS_IO"),
    }


def fit_problems(board, cells: dict[str, int]) -> list[str]:
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
        "utilization": _resources(pnr["utilization"]),
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
    out += ["", "## Utilization", "", "| resource | used | available | % |", "|---|---:|---:|---:|"]
    for name, v in r["utilization"].items():
        pct = f"{100 * v['used'] / v['available']:.1f}" if v["available"] else "-"
        out.append(f"| {name} | {v['used']} | {v['available']} | {pct} |")
    if r.get("cells_by_block"):
        out += ["", "## Cells by block (Yosys netlist)", ""] + block_table(r["cells_by_block"])
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
    if r.get("tools"):
        out += ["", "Tools: " + ", ".join(r["tools"].values()) + "."]
    commands = {k: v for k, v in (r.get("tool_commands") or {}).items() if v}
    if commands:
        out += ["", "Commands:", ""] + [f"- {k}: `{v}`" for k, v in commands.items()]
    if r.get("wall_time_s") is not None:
        out += ["", f"Build wall time: {r['wall_time_s'] / 60:.1f} min "
                "(yosys + nextpnr + pack)."]
    return "\n".join(out) + "\n"


def write_failure(build_dir: Path, board, top, cells, reason: str, wall: float,
                  by_block: list[dict] | None = None):
    """``report.json`` and ``report.md`` of a build that failed: the reason, what the
    netlist needs against what ``board`` (a :class:`tools.fpga.synth.Board`) has, and
    ``by_block`` (:func:`cells_by_block`) when Yosys got that far."""
    report = {
        "board": board.name, "device": board.device, "status": "failed", "reason": reason,
        "yosys_cells": dict(sorted(cells.items())), "npu_config": top.config.as_dict(),
        "macs_per_cycle": top.config.peak_macs_per_cycle,
        "npu_clock_target_mhz": round(top.clk_freq / 1e6, 3),
        "wall_time_s": round(wall, 1),
        "cells_by_block": by_block or None,
    }
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# Synthesis report: {board.name} ({board.device})", "",
             f"build: FAILED: {reason}", "", "timing: not analysed (no placed design)", "",
             "## Needed vs available (yosys netlist)", "", "| resource | needed | available |",
             "|---|---:|---:|"]
    for res, kinds, avail in board.capacity:
        lines.append(f"| {res} | {sum(cells.get(k, 0) for k in kinds)} | {avail} |")
    if by_block:
        lines += ["", "## Cells by block (Yosys netlist)", ""] + block_table(by_block)
    cfg = top.config.as_dict()
    lines += ["", "## NPU", "", "| parameter | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in cfg.items()]
    lines += ["", f"Wall time until the failure: {wall:.0f} s."]
    (build_dir / "report.md").write_text("\n".join(lines) + "\n")
