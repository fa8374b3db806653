"""Where a routing run congests, by NPU block, from nextpnr's router2 heatmaps.

A whole ULX3S build has not routed to the end on this project's machine: router2
brings the overused wires down for some iterations and then stalls. Which logic
the stalled wires belong to is what a fix has to change. ``make synth BOARD=ulx3s
ROUTER=router2 HEATMAP=1`` has router2 write, every iteration, how much each net
overuses (``heat_congestion_by_net_<N>.csv``) and where on the die
(``heat_congestion_by_coordinate_<N>.csv``); the files stay when the run is
stopped. This module sums them up::

    python -m hdl.boards.congestion build/synth/ulx3s

gives, per iteration, the total overuse, and for the last iteration the overuse
per block (``soc.npu.<block>``; the bridge, the RAM and the constant nets apart),
the worst nets and the die's hottest area, as markdown.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["block_of", "iterations", "summarize", "render_markdown"]

_NET_CSV = re.compile(r"heat_congestion_by_net_(\d+)\.csv$")


def block_of(net: str) -> str:
    """The block a net belongs to: ``soc.npu.sp.x`` -> ``sp``, ``soc.bridge.y`` ->
    ``bridge``; nextpnr's constant nets are ``(constants)``."""
    if net.startswith("$PACKER_"):
        return "(constants)"
    parts = net.split(".")
    if parts[0] == "soc":
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "npu":
        parts = parts[1:]
        if "__" in parts[0]:  # an interface member of the NPU's top (``arr_cmd__payload``)
            return "(npu top)"
    return parts[0] if len(parts) > 1 else "(top)"


def iterations(folder: Path) -> list[int]:
    """The router2 iterations with a per-net heatmap in ``folder``, in order."""
    found = (_NET_CSV.search(p.name) for p in Path(folder).glob("heat_congestion_by_net_*.csv"))
    return sorted(int(m.group(1)) for m in found if m)


def _net_overuse(path: Path) -> dict[str, int]:
    out = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) >= 2 and row[1].strip().isdigit():
                out[row[0]] = int(row[1])
    return out


def _hot_area(path: Path, size: int = 16) -> tuple[int, int, float] | None:
    """(x, y, share): the ``size`` x ``size`` tile window holding the largest share
    of the die's congestion (coordinates of its corner)."""
    if not path.exists():
        return None
    with open(path, newline="") as f:
        grid = [[int(float(v)) for v in row if v.strip()] for row in csv.reader(f)]
    total = sum(map(sum, grid))
    if not total:
        return None
    best = (0, 0, 0)
    for x in range(0, max(len(grid) - size, 0) + 1, size // 2):
        for y in range(0, max(len(grid[0]) - size, 0) + 1, size // 2):
            s = sum(sum(r[y:y + size]) for r in grid[x:x + size])
            if s > best[2]:
                best = (x, y, s)
    return best[0], best[1], best[2] / total


def summarize(folder: Path, top: int = 10) -> dict:
    """The congestion figures of the router2 heatmaps in ``folder`` (see the module
    text). Raises ``FileNotFoundError`` when there are none."""
    folder = Path(folder)
    its = iterations(folder)
    if not its:
        raise FileNotFoundError(f"no router2 heatmaps (heat_congestion_by_net_*.csv) in "
                                f"{folder}: build with ROUTER=router2 HEATMAP=1")
    per_iter = {i: sum(_net_overuse(folder / f"heat_congestion_by_net_{i}.csv").values())
                for i in its}
    last = its[-1]
    nets = _net_overuse(folder / f"heat_congestion_by_net_{last}.csv")
    blocks = Counter()
    for net, n in nets.items():
        blocks[block_of(net)] += n
    total = sum(nets.values())
    return {
        "iterations": per_iter,
        "last": last,
        "total": total,
        "blocks": dict(blocks.most_common()),
        "nets": sorted(nets.items(), key=lambda kv: (-kv[1], kv[0]))[:top],
        "hot_area": _hot_area(folder / f"heat_congestion_by_coordinate_{last}.csv"),
    }


def render_markdown(s: dict, source: str) -> str:
    out = [f"# Routing congestion: {source}", "",
           "Overuse summed over nets (router2's heatmaps), per iteration: " +
           ", ".join(f"{i}: {n:,}" for i, n in s["iterations"].items()) + ".", "",
           f"## By block, iteration {s['last']}", "", "| block | overuse | share |",
           "|---|---:|---:|"]
    for b, n in s["blocks"].items():
        out.append(f"| {b} | {n:,} | {100 * n / max(s['total'], 1):.1f} % |")
    out += ["", "## Worst nets", "", "| overuse | net |", "|---:|---|"]
    out += [f"| {n:,} | `{net}` |" for net, n in s["nets"]]
    if s["hot_area"]:
        x, y, share = s["hot_area"]
        out += ["", f"The hottest 16 x 16 tile window starts at x={x}, y={y} and holds "
                f"{100 * share:.0f} % of the die's congestion."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hdl.boards.congestion",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a build folder with router2 heatmaps "
                    "(make synth ... ROUTER=router2 HEATMAP=1 -> build/synth/BOARD)")
    ap.add_argument("--top", type=int, default=10, help="worst nets to list (default 10)")
    args = ap.parse_args(argv)
    try:
        s = summarize(args.folder, args.top)
    except FileNotFoundError as e:
        print(f"congestion: {e}", file=sys.stderr)
        return 1
    text = render_markdown(s, str(args.folder))
    (args.folder / "congestion.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
