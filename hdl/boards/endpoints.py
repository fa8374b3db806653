"""The slowest register inputs of a routed build, from nextpnr's detailed timing report.

nextpnr's log names one critical path per clock: fix it, route again (15 to 40
minutes for the small ULX3S build) and the next one shows up. The report that
``make synth`` asks for (``--report nextpnr-report.json --detailed-timing-report``)
also lists, for every net that feeds a register, block RAM or pin, each such input's
latest arrival time after the clock edge (routing included; the input's own setup
time is not). Ranking those inputs by register names every register that misses the
clock, slowest first, from one run::

    make synth-endpoints BOARD=ulx3s       # python -m hdl.boards.endpoints build/synth/ulx3s
    make synth-endpoints BOARD=ulx3s FREQ=100   # what misses 100 MHz (--freq 100)

A register is its flip-flops' name without the packer's suffix
(``soc.npu.tags.valid_TRELLIS_FF_Q_3`` -> ``soc.npu.tags.valid``), and a memory
is its block RAMs' or LUT RAM cells' name without their tile numbers
(``soc.npu.sp.bank3.0.1``, ``soc.npu.trace.mem.0.83$DPRAM_COMB2`` ->
``soc.npu.sp.bank3``, ``soc.npu.trace.mem``), with the flip-flops yosys's memory
mapping names after a tile's data pin (``soc.npu.sp.bank3.0.1_DOB9_TRELLIS_FF_Q``);
other cells (multipliers, pins) stand for themselves. For each: the worst arrival,
the pin it arrives at (``DI``/``M`` data, ``CE`` enable, ``LSR`` set/reset; a RAM's
port names), how many of its inputs miss the clock's period, and its NPU block;
first, how many registers of each block miss it. Also written to ``endpoints.md``
beside the report.

Then the multipliers (:func:`multipliers`): the arrival at the registers a DSP block
(``MULT18X18D``) feeds with no logic between. Yosys's ECP5 flow maps multipliers
without the DSP's own input and output registers, so when the DSP's inputs come from
flip-flops such a path is a route in, the multiply and a route out: nothing the RTL
can shorten short of another cycle or those registers, and a period below it is out
of reach whatever else is cut.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .congestion import block_of

__all__ = ["Endpoint", "Multiplier", "slowest", "multipliers", "render_markdown",
           "register_table"]

REPORT = "nextpnr-report.json"
_FF_SUFFIX = re.compile(r"_TRELLIS_FF_Q(_\d+)?$")
_MEM_TILE = re.compile(r"(\.\d+)+(\$DPRAM_COMB\d+)?$")  # yosys's memory tiles, LUT RAM cells
_MEM_OUT = re.compile(r"(\.\d+)+_D[IO][AB]\d+$")  # flip-flops named after a tile's data pin
_DSP_OUT = re.compile(r"^P\d+$")  # a MULT18X18D's product pins


@dataclass(frozen=True)
class Endpoint:
    """A register (or memory, multiplier, pin) and its slowest input."""

    register: str
    block: str
    arrival_ns: float  # the latest arrival at any of its inputs (setup not included)
    pin: str  # the input that arrival is at
    net: str  # the net feeding that input
    late: int  # how many of its inputs arrive after the period (0 without a period)
    inputs: int  # how many of its inputs the report times


@dataclass(frozen=True)
class Multiplier:
    """A DSP block and the latest arrival at a register it feeds directly."""

    cell: str
    block: str
    arrival_ns: float  # at the latest register fed straight from the DSP's product
    register: str  # that register


def register_of(cell: str) -> str:
    """``soc.npu.x.y_TRELLIS_FF_Q_2`` -> ``soc.npu.x.y``; ``soc.npu.x.mem.0.3`` (a
    memory's tile) -> ``soc.npu.x.mem``; other cells stand for themselves."""
    reg, n = _FF_SUFFIX.subn("", cell)
    return _MEM_OUT.sub("", reg) if n else _MEM_TILE.sub("", cell)


def _pin_kind(port: str) -> str:
    return re.sub(r"\d+$", "", port)  # DOA12 -> DOA: one entry per port bus


def slowest(report: dict, period_ns: float | None = None) -> list[Endpoint]:
    """Every clocked input in a nextpnr ``--detailed-timing-report`` JSON, grouped by
    register, slowest first. ``period_ns`` counts the inputs arriving after it."""
    timings = report.get("detailed_net_timings")
    if timings is None:
        raise ValueError("the report has no detailed_net_timings (nextpnr was run "
                         "without --detailed-timing-report)")
    worst: dict[str, list] = {}
    for net in timings:
        for ep in net.get("endpoints", []):
            if not str(ep.get("event", "")).startswith(("posedge", "negedge")):
                continue  # an unclocked sink (a pin's output): no setup to meet
            arrival = float(ep["delay"][-1])  # [min, max] arrival after the edge
            reg = register_of(ep["cell"])
            entry = worst.setdefault(reg, [arrival, ep["port"], net["net"], 0, 0])
            if arrival > entry[0]:
                entry[:3] = [arrival, ep["port"], net["net"]]
            entry[3] += period_ns is not None and arrival > period_ns
            entry[4] += 1
    out = [Endpoint(reg, block_of(reg), round(a, 3), _pin_kind(pin), net, late, n)
           for reg, (a, pin, net, late, n) in worst.items()]
    return sorted(out, key=lambda e: (-e.arrival_ns, e.register))


def multipliers(report: dict) -> list[Multiplier]:
    """The DSP blocks (``MULT18X18D``) of a ``--detailed-timing-report`` JSON whose
    product feeds a register directly, slowest first: the arrival there is the path
    through the multiplier alone (the route in, the multiply, the route out)."""
    worst: dict[str, tuple[float, str]] = {}
    for net in report.get("detailed_net_timings", []):
        cell = str(net.get("driver", ""))
        if "MULT18X18D" not in cell or not _DSP_OUT.match(str(net.get("port", ""))):
            continue
        for ep in net.get("endpoints", []):
            if not _FF_SUFFIX.search(ep["cell"]):
                continue  # into logic (an adder of partial products): not the DSP alone
            arrival = float(ep["delay"][-1])
            if cell not in worst or arrival > worst[cell][0]:
                worst[cell] = (arrival, register_of(ep["cell"]))
    out = [Multiplier(cell, block_of(cell), round(a, 3), reg)
           for cell, (a, reg) in worst.items()]
    return sorted(out, key=lambda d: (-d.arrival_ns, d.cell))


def render_multipliers(dsps: list[Multiplier], period_ns: float | None, limit: int) -> str:
    """The ``limit`` slowest multipliers' direct paths as markdown ("" without any)."""
    if not dsps:
        return ""
    late = sum(period_ns is not None and d.arrival_ns > period_ns for d in dsps)
    head = f"{len(dsps)} multipliers (DSP blocks) feed registers directly"
    if period_ns is not None:
        head += (f"; at {late} of them the register's input misses the {period_ns:.2f} ns "
                 "period with no logic after the DSP")
    head += (". Yosys maps them without the DSP's own registers, so the path is what feeds "
             "the DSP, the multiply and a route out.")
    out = [head, "", "| arrival (ns) | register fed | block | DSP |", "|---:|---|---|---|"]
    out += [f"| {d.arrival_ns:.2f} | `{d.register}` | {d.block} | `{d.cell}` |"
            for d in dsps[:limit]]
    return "\n".join(out) + "\n"


def render_markdown(endpoints: list[Endpoint], period_ns: float | None, limit: int) -> str:
    """The ``limit`` slowest registers as a markdown table."""
    late = [e for e in endpoints if period_ns is not None and e.arrival_ns > period_ns]
    head = (f"{len(late)} of {len(endpoints)} registers have an input arriving after the "
            f"{period_ns:.2f} ns period" if period_ns is not None
            else f"{len(endpoints)} registers")
    out = [f"{head} (arrival after the clock edge, routing included, setup not).", ""]
    if late:
        # Where the late registers are: one path to cut, or the whole design.
        by_block: dict[str, list[float]] = {}
        for e in late:
            by_block.setdefault(e.block, []).append(e.arrival_ns)
        out += ["| block | late registers | slowest (ns) |", "|---|---:|---:|"]
        out += [f"| {b} | {len(a)} | {max(a):.2f} |" for b, a in
                sorted(by_block.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
        out.append("")
    out += register_table([dataclasses.asdict(e) for e in endpoints[:limit]])
    return "\n".join(out) + "\n"


def register_table(rows: list[dict], net: bool = True) -> list[str]:
    """Markdown lines of a table of :class:`Endpoint` fields (``dataclasses.asdict``
    rows, as the synth report stores them); ``net``: with the feeding net's column."""
    head = "| arrival (ns) | register | block | pin | late inputs |"
    rule = "|---:|---|---|---|---:|"
    out = [head + " net |" if net else head, rule + "---|" if net else rule]
    for e in rows:
        line = (f"| {e['arrival_ns']:.2f} | `{e['register']}` | {e['block']} | {e['pin']} | "
                f"{e['late']}/{e['inputs']} |")
        out.append(line + f" `{e['net']}` |" if net else line)
    return out


def period_of(report: dict) -> float | None:
    """The tightest constrained clock's period in ns (None: no clock constrained)."""
    targets = [float(v["constraint"]) for v in report.get("fmax", {}).values()
               if v.get("constraint")]
    return 1000.0 / max(targets) if targets else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hdl.boards.endpoints", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path,
                    help=f"a board's build folder (with {REPORT}) or the report itself")
    ap.add_argument("--top", type=int, default=30, help="how many registers to list")
    ap.add_argument("--freq", type=float, default=None, metavar="MHZ",
                    help="count what misses this clock instead of the build's own target "
                    "(e.g. --freq 100: what stands between a 60 MHz build and 100 MHz)")
    args = ap.parse_args(argv)
    if args.freq is not None and args.freq <= 0:
        ap.error(f"--freq {args.freq}: a clock in MHz, above 0")
    path = args.build / REPORT if args.build.is_dir() else args.build
    try:
        report = json.loads(path.read_text())
        period = period_of(report) if args.freq is None else 1000.0 / args.freq
        eps = slowest(report, period)
    except (OSError, ValueError, KeyError) as e:
        print(f"endpoints: {path}: {e}", file=sys.stderr)
        return 1
    text = render_markdown(eps, period, args.top)
    dsp_text = render_multipliers(multipliers(report), period, min(args.top, 10))
    if dsp_text:
        text += "\n## Multipliers\n\n" + dsp_text
    print(text, end="")
    (path.parent / "endpoints.md").write_text(f"# Slowest registers: {path}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
