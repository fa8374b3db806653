"""``make synth-hierarchy BOARD=...``: where the NPU's logic goes, block by block.

Synthesizes the NPU alone (no board SoC) at a board's config (or another NPU build,
``--config``) with the board's family flow, keeping the hierarchy (``synth_ecp5
-noflatten``, ``synth_ice40 -dsp -noflatten``), and reports each top-level block's
cells, its submodules included, in ``<out>/hierarchy/<board>/report.md`` and
``report.json`` (``<board>-<config>`` with ``--config``). Yosys only: a few minutes,
where the whole board build takes hours. ``--config floor`` (:data:`FLOOR`) measures
the least logic the NPU's parameters can give: what no configuration of the present
blocks goes below.

Kept hierarchical, constants do not cross block boundaries: logic that the NPU ties
off (say, the write side of a read-only scratchpad port) is still built, so the
blocks add up to a little more than the flat build does.

Usage: ``python -m hdl.boards.hierarchy --board ulx3s|icebreaker [--config NAME]
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
from .seeds import stop_tools_on_sigterm
from .synth import BOARDS, board_config, npu_builds, tool_env

__all__ = ["FLOOR", "parse_module_stats", "by_block", "render_markdown", "run", "main"]

FLOOR = NPUConfig(rows=1, cols=1, sp_bytes=8, sp_banks=2, acc_rows=1, partitions=1, pt_sets=1,
                  tag_slots=1, imem_depth=16, bus_bytes=4, loop_depth=1, region_depth=1,
                  trace_depth=1, queue_depth=1)
"""Every ``NPUConfig`` parameter at its least (the instruction banks at 16): the NPU's
logic when no parameter can shrink it further (``--config floor``). It only sizes the
blocks; no program or model is compiled for it."""

# The NPU's submodule names (hdl.top.NPU) and what they are.
BLOCK_NAMES = {
    "vec": "vector unit", "sp": "scratchpad", "seq": "sequencer", "pt": "partition table",
    "csr": "CSR block", "gemm": "GEMM engine", "perf": "performance counters", "dma": "DMA",
    "acc": "accumulator", "trace": "trace FIFO", "cq": "compute queue", "tags": "tag store",
    "lq": "load queue", "sq": "store queue", "imem": "instruction memory",
    "top": "top-level glue",
}
_MODULE = re.compile(r"^=== (.+?) ===$", re.M)


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
    build = report.get("npu_build") or report["board"]
    out = [f"# Where the logic goes: the NPU at the {build} config", "",
           f"{report['device']}, `{report['flow']}`, NPU config {cfg['rows']}x{cfg['cols']} "
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


def run(board_name: str, out: Path, config: str | None = None) -> dict:
    """Synthesize the NPU at ``board_name``'s config hierarchically (``config``: another
    build, a name of :func:`~hdl.boards.synth.npu_builds` or ``"floor"``); write and
    return the report."""
    from hdl.top import NPU  # elaborating needs the HDL; the parsers above do not

    from .blocks import _run, block_rtlil

    board = BOARDS[board_name]
    mod = board.load()
    npu_config = (mod.CONFIG if config is None else FLOOR if config == "floor"
                  else board_config(config))
    tool_env()
    work = (out / "hierarchy" / (board_name if config is None
                                 else f"{board_name}-{config}")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "top.il").write_text(block_rtlil(NPU(npu_config)))
    flow = {"ecp5": "synth_ecp5 -noflatten", "ice40": "synth_ice40 -dsp -noflatten"}[mod.FAMILY]
    t0 = time.monotonic()
    # yowasp tools see the working directory only: relative paths
    _run([os.environ["YOSYS"], "-q", "-l", "yosys.log", "-p",
          f"read_rtlil top.il; {flow} -top top; stat"], work, "yosys")
    log = (work / "yosys.log").read_text(errors="replace")
    report = {"board": board_name, "device": board.device, "family": mod.FAMILY,
              "flow": flow, "npu_build": config, "npu_config": npu_config.as_dict(),
              "work": str(work),
              "blocks": block_rows(by_block(parse_module_stats(log)), mod.FAMILY, total="NPU"),
              "yosys_s": round(time.monotonic() - t0, 1)}
    (work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (work / "report.md").write_text(render_markdown(report))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--board", required=True, choices=sorted(BOARDS))
    ap.add_argument("--config", choices=npu_builds() + ["floor"],
                    help="another NPU build than the board's own; floor: every parameter "
                         "at its least")
    ap.add_argument("--out", type=Path, default=Path("build/synth"))
    args = ap.parse_args(argv)
    stop_tools_on_sigterm()
    try:
        report = run(args.board, args.out, args.config)
    except RuntimeError as e:
        print(f"synth-hierarchy: {e}", file=sys.stderr)
        return 1
    print(render_markdown(report), end="")
    print(f"report: {Path(report['work']) / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
