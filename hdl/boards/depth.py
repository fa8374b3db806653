"""Logic depth of a synthesized ECP5 netlist: its deepest register-to-register paths.

nextpnr names a build's critical path only after routing, which takes hours for the
ULX3S. The depth of the mapped netlist is known minutes after Yosys and ranks the
same paths well enough to say where to pipeline: each path's cost is counted in LUT
levels (a LUT4, or the entry into a carry chain, is one level; a carry bit, an
in-slice wide-mux stage, a DSP or a block RAM's read are weighted by their delay
relative to a LUT plus its routing on the ECP5's -6 grade). Routing congestion, the
global nets and placement are not in the count.

    python -m hdl.boards.depth --board ulx3s         # Yosys on the board top, then count
    python -m hdl.boards.depth --netlist build/synth/ulx3s/top.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .synth import BOARDS, board_top, npu_builds, tool_options

# Delay of each combinational cell, in LUT levels (a LUT4 and the net after it).
LUT = 1.0
WIDE_MUX = 0.25  # PFUMX / L6MUX21: a mux inside the slice, next to its LUTs
CARRY_BIT = 0.1  # CIN -> COUT of a CCU2C (two bits)
DSP = 5.0  # MULT18X18D with no input or output registers
LUTRAM_READ = 1.0  # TRELLIS_DPR16X4 read address -> data out
BRAM_CLK_TO_OUT = 3.0  # DP16KD without its output register: data leaves late

# Parts of the net names Yosys derives from mapped cells (not RTL signal names).
_DERIVED = ("_LUT4_", "_TRELLIS_", "_CCU2C_", "_PFUMX_", "_L6MUX21_", "_DP16KD_", "_MULT18X18D_",
            "$")
_CLOCKS = {"CLK", "WCK", "CLKA", "CLKB", "CLKI", "CLKFB"}
# Cells that start and end paths: their outputs are sources, their inputs sinks.
# (Yosys maps the NPU's multipliers to MULT18X18D without their registers, so a DSP
# is a combinational cell here.)
_SEQUENTIAL = {"TRELLIS_FF", "DP16KD", "EHXPLLL", "TRELLIS_IO", "DCCA", "$scopeinfo"}


@dataclass(frozen=True)
class RegPath:
    """A sink's deepest path: its depth and the named nets it runs through."""

    depth: float
    end: str  # the register written (an FF's signal) or a cell input
    end_signal: str  # the register as a whole (all its bits): paths group by it
    nets: tuple[str, ...]  # the signals it passes, from the source to the sink


class Netlist:
    """A flat Yosys JSON netlist (``write_json``) of one module, indexed by net bit."""

    def __init__(self, module: dict):
        self.cells = module["cells"]
        self.driver: dict[int, tuple[str, str]] = {}
        for name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for b in bits:
                        if isinstance(b, int):
                            self.driver[b] = (name, port)
        # a bit has many names after flattening: prefer an RTL signal's to the names
        # Yosys derives from mapped cells (..._LUT4_Z, ..._TRELLIS_FF_Q_3)
        self.names: dict[int, tuple[str, int]] = {}
        rank: dict[int, tuple] = {}
        for name, net in module["netnames"].items():
            derived = any(tag in name for tag in _DERIVED)
            for i, b in enumerate(net["bits"]):
                if not isinstance(b, int):
                    continue
                key = (net.get("hide_name", 0), derived, len(name))
                if b not in rank or key < rank[b]:
                    rank[b] = key
                    self.names[b] = (name, i if len(net["bits"]) > 1 else -1)

    def label(self, bit: int) -> str | None:
        """The bit's name as ``signal[i]`` (or ``signal`` for a one-bit signal)."""
        if bit not in self.names:
            return None
        name, i = self.names[bit]
        return name if i < 0 else f"{name}[{i}]"

    def anchor(self, bit: int) -> str | None:
        """The RTL signal a bit's name starts from (a derived name cut at its first
        cell tag): what a path passes through, as far as the netlist still says."""
        if bit not in self.names:
            return None
        name = self.names[bit][0]
        cut = min((i for tag in _DERIVED if (i := name.find(tag)) > 0), default=len(name))
        return name[:cut]

    @classmethod
    def load(cls, path: Path) -> Netlist:
        data = json.loads(Path(path).read_text())
        tops = [m for m, v in data["modules"].items() if v.get("attributes", {}).get("top")]
        if len(tops) != 1:
            raise ValueError(f"{path}: expected one top module, found {tops or 'none'}")
        return cls(data["modules"][tops[0]])


def _inputs(cell: dict) -> list[tuple[str, int]]:
    return [(p, b) for p, bits in cell["connections"].items()
            if cell["port_directions"].get(p) == "input" for b in bits if isinstance(b, int)]


def _delay(cell: dict, in_port: str) -> float | None:
    """Delay from ``in_port`` to the cell's outputs in LUT levels; None: no
    combinational arc (every input of a combinational cell reaches every output)."""
    kind = cell["type"]
    if kind == "LUT4":
        return LUT
    if kind in ("PFUMX", "L6MUX21"):
        return WIDE_MUX
    if kind == "CCU2C":
        return CARRY_BIT if in_port == "CIN" else LUT
    if kind == "TRELLIS_DPR16X4":
        return LUTRAM_READ if in_port.startswith("RAD") else None
    if kind == "MULT18X18D":
        return DSP if in_port[:1] in ("A", "B") and in_port[1:].isdigit() else None
    return None


def analyse(net: Netlist) -> list[RegPath]:
    """Every sink's deepest path, deepest first."""
    arrival: dict[int, tuple[float, int | None]] = {}  # bit -> (depth, previous bit)
    visiting: set[int] = set()  # bits whose inputs are being computed

    def arrive(bit: int) -> float:
        # iterative: paths run thousands of cells deep through carry chains
        stack = [(bit, False)]
        while stack:
            b, expanded = stack.pop()
            if b in arrival:
                continue
            drv = net.driver.get(b)
            cell = net.cells[drv[0]] if drv else None
            if cell is None or cell["type"] in _SEQUENTIAL:
                start = BRAM_CLK_TO_OUT if cell and cell["type"] == "DP16KD" else 0.0
                arrival[b] = (start, None)
                continue
            arcs = [(ib, d) for ip, ib in _inputs(cell)
                    if (d := _delay(cell, ip)) is not None]
            if not expanded:
                stack.append((b, True))
                for ib, _ in arcs:
                    if ib not in arrival:
                        if ib in visiting:
                            raise ValueError(f"combinational loop through {drv[0]}")
                        stack.append((ib, False))
                visiting.add(b)
                continue
            visiting.discard(b)
            best, prev = 0.0, None
            for ib, d in arcs:
                if arrival[ib][0] + d > best:
                    best, prev = arrival[ib][0] + d, ib
            arrival[b] = (best, prev)
        return arrival[bit][0]

    ends = []
    for cname, cell in net.cells.items():
        if cell["type"] not in _SEQUENTIAL or cell["type"] == "$scopeinfo":
            continue
        q = cell["connections"].get("Q", [None])[0] if cell["type"] == "TRELLIS_FF" else None
        for port, b in _inputs(cell):
            if port in _CLOCKS:
                continue
            if q is not None and net.label(q):
                # group the bits of a register, and the registers Yosys put before a
                # block RAM's ports (named after the port: ..._DIA10, ..._ADA1)
                end = net.label(q)
                group = re.sub(r"_(DI|DO|AD|CE|WE|OCE|CS)[AB]\d*$", "", net.anchor(q))
            else:
                end, group = f"{cname}.{port}", cname
            ends.append((arrive(b), end, group, b))
    ends.sort(key=lambda e: -e[0])
    paths = []
    for depth, end, group, b in ends:
        nets = []
        while b is not None:
            name = net.anchor(b)
            if name and (not nets or nets[-1] != name):
                nets.append(name)
            b = arrival[b][1]
        paths.append(RegPath(depth, end, group, tuple(reversed(nets))))
    return paths


def worst_per_signal(paths: list[RegPath], limit: int) -> list[RegPath]:
    """The deepest path into each register (its bits together), deepest first;
    registers fed straight from a register or a constant are left out."""
    seen, out = set(), []
    for p in paths:
        if p.depth > 0 and p.end_signal not in seen:
            seen.add(p.end_signal)
            out.append(p)
            if len(out) >= limit:
                break
    return out


def netlist(board_name: str, out: Path, config: str | None = None) -> Path:
    """Run Yosys alone on ``board_name``'s whole top (around the NPU build ``config``
    names; None: the board's own), with the script ``make synth`` uses, and return the
    flat netlist (``<out>/depth/<board>/top.json``)."""
    from .blocks import _run

    # Checked before board_top, which makes the build directory.
    family = BOARDS[board_name].load().FAMILY if board_name in BOARDS else None
    if family not in (None, "ecp5"):
        raise ValueError(f"{board_name}: the depth count knows ECP5 cells only "
                         f"({family} is not supported)")
    _, mod, top, work = board_top(board_name, out / "depth" / board_name, config=config)
    plan = mod.platform().prepare(top, name="top", **tool_options(mod))
    plan.extract(work)
    _run([os.environ["YOSYS"], "-q", "-l", "top.rpt", "top.ys"], work, "yosys")
    return work / "top.json"


def render_markdown(paths: list[RegPath], source: str) -> str:
    out = [f"# Deepest register-to-register paths: {source}", "",
           "Logic levels (a LUT and its net is one; see `hdl/boards/depth.py` for the "
           "weights), the deepest path into each register.", "",
           "| levels | register | from | through |", "|---:|---|---|---|"]
    for p in paths:
        via = " > ".join(p.nets[1:]) or "-"
        out.append(f"| {p.depth:.1f} | `{p.end}` | `{p.nets[0] if p.nets else '?'}` | {via} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hdl.boards.depth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--netlist", type=Path, help="a flat Yosys JSON netlist (top.json)")
    src.add_argument("--board", choices=sorted(BOARDS),
                     help="run Yosys on this board's top first (ECP5 boards: ulx3s)")
    ap.add_argument("--out", type=Path, default=Path("build/synth"),
                    help="build directory for --board (default build/synth)")
    ap.add_argument("--config", choices=npu_builds(),
                    help="with --board: build it around another NPU build (see make synth)")
    ap.add_argument("--top", type=int, default=20, help="how many registers to list")
    args = ap.parse_args(argv)
    try:
        path = args.netlist or netlist(args.board, args.out, args.config)
    except (ValueError, RuntimeError) as e:
        print(f"depth: {e}", file=sys.stderr)
        return 1
    paths = worst_per_signal(analyse(Netlist.load(path)), args.top)
    for p in paths:
        print(f"{p.depth:5.1f}  {p.end}  <-  {p.nets[0] if p.nets else '?'}")
        if len(p.nets) > 1:
            print("       via " + " > ".join(p.nets[1:]))
    report = path.parent / "depth.md"
    report.write_text(render_markdown(paths, str(path)))
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
