"""``make synth-hierarchy``: where the NPU's logic goes, block by block.

Synthesizes the NPU alone (no board SoC) with a family's flow, keeping the hierarchy
(``synth_ecp5 -noflatten``, ``synth_ice40 -dsp -noflatten``), and reports each
top-level block's cells, its submodules included, in
``<out>/hierarchy/<family>-<config>/report.md`` and ``report.json``. Yosys only:
minutes, where a routed board build takes an hour.

``--config floor`` (:data:`FLOOR`) measures the least logic the NPU's parameters can
give; with ``--family ice40`` that is the figure that rules out the iCE40 UP5K
(docs/fpga.md).

Kept hierarchical, constants do not cross block boundaries: logic that the NPU ties
off (say, the write side of a read-only scratchpad port) is still built, so the
blocks add up to a little more than the flat build does.

Usage: ``python -m tools.fpga.hierarchy [--family ecp5|ice40] [--config NAME|floor]
[--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from firmware.config import NPUConfig

from .report import COLUMNS, STAT_LINE, block_rows
from .synth import SynthError, board_config, npu_builds, run_logged, tool_env

__all__ = ["FLOOR", "FLOWS", "block_rtlil", "parse_module_stats", "by_block",
           "render_markdown", "run", "main"]

FLOOR = NPUConfig(rows=1, cols=1, sp_bytes=8, sp_banks=2, acc_rows=1, partitions=1, pt_sets=1,
                  tag_slots=1, imem_depth=16, bus_bytes=4, loop_depth=1, region_depth=1,
                  trace_depth=1, queue_depth=1)
"""Every ``NPUConfig`` parameter at its least (the instruction banks at 16): the NPU's
logic when no parameter can shrink it further (``--config floor``). It only sizes the
blocks; no program or model is compiled for it."""

FLOWS = {"ecp5": "synth_ecp5 -noflatten", "ice40": "synth_ice40 -dsp -noflatten"}
"""Yosys's synthesis command per FPGA family."""

# The NPU's submodule names (hdl.top.NPU) and what they are.
BLOCK_NAMES = {
    "vec": "vector unit", "sp": "scratchpad", "seq": "sequencer", "pt": "partition table",
    "csr": "CSR block", "gemm": "GEMM engine", "perf": "performance counters", "dma": "DMA",
    "acc": "accumulator", "trace": "trace FIFO", "cq": "compute queue", "tags": "tag store",
    "lq": "load queue", "sq": "store queue", "imem": "instruction memory",
    "top": "top-level glue",
}
_MODULE = re.compile(r"^=== (.+?) ===$", re.M)


def block_rtlil(component) -> str:
    """RTLIL of a component with every signal of its signature as a port (members
    tied to constants, such as fixed AXI fields, are not ports)."""
    from amaranth.back import rtlil
    from amaranth.hdl import Signal
    from amaranth.lib import data

    ports = []
    for _, _, v in component.signature.flatten(component):
        if isinstance(v, data.View):  # struct-shaped members: their underlying signal
            v = v.as_value()
        if isinstance(v, Signal):
            ports.append(v)
    return rtlil.convert(component, name="top", ports=ports)


def parse_module_stats(text: str) -> dict[str, dict[str, int]]:
    """Cells by type of every module in the last ``stat`` printout of a yosys log
    (each module's own cells, without its submodules')."""
    part = text.rsplit("Printing statistics", 1)[-1]
    heads = list(_MODULE.finditer(part))
    out: dict[str, dict[str, int]] = {}
    for head, nxt in zip(heads, heads[1:] + [None], strict=True):
        name = head.group(1)
        if name == "design hierarchy":  # totals: the modules are counted instead
            continue
        body = part[head.end(): nxt.start() if nxt else len(part)]
        out[name] = {cell: int(n) for n, cell in STAT_LINE.findall(body)}
    return out


def by_block(modules: dict[str, dict[str, int]], top: str = "top") -> dict[str, dict]:
    """Sum the modules into the NPU's top-level blocks (``top.vec.qa`` counts for
    ``vec``; the top module's own cells for ``top``)."""
    blocks: dict[str, dict[str, int]] = {}
    for name, cells in modules.items():
        parts = name.split(".")
        key = parts[1] if parts[0] == top and len(parts) > 1 else top
        acc = blocks.setdefault(key, {})
        for cell, n in cells.items():
            acc[cell] = acc.get(cell, 0) + n
    return blocks


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 else f"{n} bytes"


def render_markdown(report: dict) -> str:
    cols = [c for c, _ in COLUMNS[report["family"]]]
    cfg = report["npu_config"]
    out = [f"# Where the logic goes: the {report['npu_build']} NPU on {report['family']}", "",
           f"`{report['flow']}`, NPU config {cfg['rows']}x{cfg['cols']} "
           f"array, {cfg['bus_bytes'] * 8}-bit bus, {_size(cfg['sp_bytes'])} scratchpad. "
           "Each block with its submodules; kept hierarchical, so logic the NPU ties "
           "off is still counted.", "",
           "| block | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in report["blocks"]:
        b = r["block"]
        name = "**NPU**" if b == "NPU" else f"{BLOCK_NAMES.get(b, b)} (`{b}`)"
        out.append(f"| {name} | " + " | ".join(f"{r[c]:,}" for c in cols) + " |")
    out += ["", f"Yosys: {report['yosys_s']:.0f} s."]
    return "\n".join(out) + "\n"


def run(family: str, out: Path, config: str = "ulx3s") -> dict:
    """Synthesize the NPU build ``config`` (a name of
    :func:`~tools.fpga.synth.npu_builds` or ``"floor"``) hierarchically with
    ``family``'s flow; write and return the report."""
    from hdl.top import NPU  # elaborating needs the HDL; the parsers above do not

    if family not in FLOWS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FLOWS)}")
    npu_config = FLOOR if config == "floor" else board_config(config)
    tool_env()
    work = (out / "hierarchy" / f"{family}-{config}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "top.il").write_text(block_rtlil(NPU(npu_config)))
    t0 = time.monotonic()
    # yowasp tools see the working directory only: relative paths
    run_logged([os.environ["YOSYS"], "-q", "-l", "yosys.log", "-p",
                f"read_rtlil top.il; {FLOWS[family]} -top top; stat"], work, work / "run.log")
    log = (work / "yosys.log").read_text(errors="replace")
    report = {"family": family, "flow": FLOWS[family], "npu_build": config,
              "npu_config": npu_config.as_dict(), "work": str(work),
              "blocks": block_rows(by_block(parse_module_stats(log)), family, total="NPU"),
              "yosys_s": round(time.monotonic() - t0, 1)}
    (work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (work / "report.md").write_text(render_markdown(report))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fpga.hierarchy",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FLOWS), default="ecp5")
    ap.add_argument("--config", choices=npu_builds() + ["floor"], default="ulx3s",
                    help="the NPU build (default: the ULX3S's); floor: every parameter "
                         "at its least")
    ap.add_argument("--out", type=Path, default=Path("build/synth"))
    args = ap.parse_args(argv)
    try:
        report = run(args.family, args.out, args.config)
    except SynthError as e:
        print(f"synth-hierarchy: {e}", file=sys.stderr)
        return 1
    print(render_markdown(report), end="")
    print(f"report: {Path(report['work']) / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
