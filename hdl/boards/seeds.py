"""Run a build's tools, and place and route one netlist with several nextpnr seeds
side by side, keeping the fastest.

nextpnr's placement starts from a random state: the same netlist routed with another
``--seed`` lands a few MHz faster or slower (on the small ULX3S build, 61.85 against
67.38 MHz). ``make synth`` runs the lines of amaranth's build script itself: Yosys
once, then the nextpnr line as it is (nextpnr's default seed, its outputs in the build
folder) and, with ``SEEDS=2,3``, side by side with it the same line for each seed (its
outputs in ``seed<N>/``), as many at once as there are cores (nextpnr's WebAssembly build uses
one), and keeps the best run: every clock met first, then the fastest NPU clock. The
kept run's outputs are copied over the build's own and the bitstream is packed from
them, so the report, ``hdl.boards.endpoints`` and the bitstream all describe the same
placement. While a tool runs, what its log says it is doing is printed once a minute
(:func:`progress`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

__all__ = ["NEXTPNR_OUTPUTS", "PROGRESS_EVERY_S", "parse_seeds", "script_commands",
           "seed_command", "tool_command", "default_jobs", "progress", "run_step", "route_seeds",
           "stop_tools_on_sigterm"]

NEXTPNR_OUTPUTS = ("--log", "--report", "--textcfg", "--asc")
"""nextpnr's options that name a file it writes (redirected into a seed's folder)."""


PROGRESS_EVERY_S = 60.0
"""How often a running tool's progress is printed (a build runs for tens of minutes
with its output in log files)."""

_ROUTER1 = re.compile(r"^Info:\s+\d+ \|.*\|\s*(\d+)\|[^|]*\|\s*$")
_HEAP = re.compile(r"^Info:\s+at iteration #(\d+), type ")
_ANNEAL = re.compile(r"^Info:\s+at iteration #(\d+): temp = ")
_YOSYS_PASS = re.compile(r"^[\d.]+ Executing (\S+) pass")


def progress(log_text: str) -> str | None:
    """What a running Yosys or nextpnr is doing, from the end of its log:
    ``"routing: 125,662 arcs left"``, ``"placing (analytical, iteration 18)"``,
    ``"placing (annealing, iteration 5)"``, ``"synthesis: ABC9"``; None when the
    last lines say nothing known."""
    for line in reversed(log_text.splitlines()[-40:]):
        if m := _ROUTER1.match(line):
            return f"routing: {int(m.group(1)):,} arcs left"
        if line.startswith("Info: Routing complete"):
            return "routed; timing analysis and output files"
        if line.startswith("Info: Routing") or line.startswith("Info: Setting up routing"):
            return "routing: starting"
        if m := _ANNEAL.match(line):
            return f"placing (annealing, iteration {m.group(1)})"
        if m := _HEAP.match(line):
            return f"placing (analytical, iteration {m.group(1)})"
        if line.startswith("Info: Packing"):
            return "packing"
        if m := _YOSYS_PASS.match(line):
            return f"synthesis: {m.group(1)}"
    return None


def stop_tools_on_sigterm() -> None:
    """Make SIGTERM end this process as Ctrl-C does, by an exception, so the tools it
    runs are killed on the way out. Python's default ends the process at once, and a
    ``kill`` or a job's timeout then left Yosys or nextpnr running, for up to an hour.
    Call from the main thread (a command's ``main``); the exit status stays 128 + 15."""
    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def _tail(path: Path, size: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _run_watched(argv: list[str], cwd: Path, logfile: Path | None, who: str, log,
                 every: float, stop: threading.Event | None = None) -> int | None:
    """Run ``argv`` in ``cwd``; every ``every`` seconds until it ends, print what its
    log says it is doing (:func:`progress`). Returns its exit code, or None when
    ``stop`` was set (the build failed elsewhere) and the tool was killed; an
    interruption kills it too."""
    t0 = time.monotonic()
    next_report = t0 + every
    with subprocess.Popen(argv, cwd=cwd) as proc:
        try:
            while True:
                try:
                    return proc.wait(timeout=min(every, 1.0))
                except subprocess.TimeoutExpired:
                    pass
                if stop is not None and stop.is_set():
                    proc.kill()
                    proc.wait()
                    return None
                if time.monotonic() >= next_report:
                    next_report += every
                    state = progress(_tail(logfile)) if logfile is not None else None
                    minutes = (time.monotonic() - t0) / 60
                    log(f"synth: {who}: {state or 'running'} ({minutes:.0f} min)")
        except BaseException:  # interrupted: do not leave the tool running
            proc.kill()
            raise


def _log_of(args: list[str], cwd: Path) -> Path | None:
    """The log file a tool's arguments name (``--log F`` for nextpnr, ``-l F`` for Yosys)."""
    for opt in ("--log", "-l"):
        if opt in args[:-1]:
            return cwd / args[args.index(opt) + 1]
    return None


def parse_seeds(text: str) -> list[int]:
    """``"2,3"`` -> ``[2, 3]``: the extra seeds, positive and distinct."""
    seeds = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"seed {part!r}: seeds are positive integers, e.g. SEEDS=2,3")
        if int(part) in seeds:
            raise ValueError(f"seed {part} is listed twice")
        seeds.append(int(part))
    if not seeds:
        raise ValueError("no seed given: e.g. SEEDS=2,3")
    return seeds


def script_commands(script: str) -> dict[str, list[str]]:
    """The tool lines of amaranth's build script, by the variable naming the tool:
    ``{"NEXTPNR_ECP5": [args...], "ECPPACK": [...]}`` (the tool itself left out)."""
    commands = {}
    for line in script.splitlines():
        if line.startswith('"$'):
            words = shlex.split(line)
            commands[words[0].lstrip("$")] = words[1:]
    return commands


def seed_command(args: list[str], seed: int, folder: str) -> list[str]:
    """nextpnr's arguments with ``--seed seed`` and the files it writes in ``folder``
    (inputs stay where they are; any seed and heatmap options are dropped)."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in ("--seed", "--router2-heatmap"):
            skip = True
            continue
        if i and args[i - 1] in NEXTPNR_OUTPUTS:
            arg = f"{folder}/{arg}"
        out.append(arg)
    return out + ["--seed", str(seed)]


def tool_command(var: str) -> str:
    """The command a build script's ``$VAR`` runs: the environment's, else the script's
    own default (``NEXTPNR_ECP5`` -> nextpnr-ecp5)."""
    return os.environ.get(var, var.lower().replace("_", "-"))


def default_jobs() -> int:
    """How many seeds route at once by default: the cores this process may use
    (nextpnr's WebAssembly build runs on one core, so seeds parallelize well)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _run_all(argvs: dict, cwd: Path, jobs: int, log, every: float) -> dict:
    """Run each seed's command, at most ``jobs`` at once; ``{seed: (exit code, wall
    seconds)}``. Once one fails the build has failed, so the others are stopped
    (code None)."""
    stop = threading.Event()

    def run(seed):
        if stop.is_set():  # queued behind a run that failed
            return None, 0.0
        t0 = time.monotonic()
        where = "its default seed" if seed is None else f"seed {seed} (into seed{seed}/)"
        log(f"synth: placing and routing with {where}...")
        who = "nextpnr" if len(argvs) == 1 else ("nextpnr, default seed" if seed is None
                                                 else f"nextpnr, seed {seed}")
        code = _run_watched(argvs[seed], cwd, _log_of(argvs[seed], cwd), who, log, every,
                            stop)
        if code:
            stop.set()
        return code, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {seed: pool.submit(run, seed) for seed in argvs}
        try:
            for f in as_completed(futures.values()):
                f.result()  # a run that raised stops the build at once
            return {seed: f.result() for seed, f in futures.items()}
        except BaseException:  # Ctrl-C, or a run that raised: stop the others' tools too
            stop.set()
            for f in futures.values():
                f.cancel()
            raise


def run_step(build_dir: Path, script: str, var: str, log=print,
             every: float = PROGRESS_EVERY_S) -> None:
    """Run the build script's line for tool ``$var`` (e.g. ``YOSYS``) in ``build_dir``,
    printing its progress every ``every`` seconds; raises ``RuntimeError`` when the
    script has no such line or the tool fails."""
    commands = script_commands(script)
    if var not in commands:
        raise RuntimeError(f"the build script has no ${var} line")
    _run_tool(build_dir, var, commands[var], log, every)


def _run_tool(build_dir: Path, var: str, args: list[str], log, every: float) -> None:
    who = Path(tool_command(var)).name
    code = _run_watched([tool_command(var)] + args, build_dir, _log_of(args, build_dir), who,
                        log, every)
    if code:
        raise RuntimeError(f"{tool_command(var)} failed (exit {code})")


def route_seeds(build_dir: Path, script: str, seeds: list[int],
                score: Callable[[Path], tuple], log=print, jobs: int | None = None,
                every: float = PROGRESS_EVERY_S) -> list[dict]:
    """Place and route the synthesized netlist with nextpnr's default seed and each of
    ``seeds`` (none: the default run alone), side by side, keep the best run and pack
    its bitstream.

    ``script`` is the build script's text (its synthesis step has run in
    ``build_dir``); ``score(folder)`` ranks a finished run from the files in
    ``folder`` (higher is better; the default run's are in ``build_dir``). ``jobs``
    runs go at once (None: :func:`default_jobs`); each prints its progress every
    ``every`` seconds through ``log``. Returns one entry per run, the
    default first (``seed`` None): ``{"seed", "score", "kept", "wall_s"}`` (a lone run
    is not scored: its score is None; ``wall_s`` is nextpnr's wall time). The kept run's
    outputs end up in ``build_dir`` with the bitstream packed from them. Raises
    ``RuntimeError`` when a tool fails.
    """
    commands = script_commands(script)
    pnr = next((k for k in commands if k.startswith("NEXTPNR")), None)
    pack = next((k for k in commands if k.endswith("PACK")), None)
    if pnr is None or pack is None:
        raise RuntimeError("the build script has no nextpnr or pack line to run")
    outputs = [a for i, a in enumerate(commands[pnr]) if i and
               commands[pnr][i - 1] in NEXTPNR_OUTPUTS]
    argvs = {None: [tool_command(pnr)] + commands[pnr]}
    for seed in seeds:
        folder = f"seed{seed}"
        (build_dir / folder).mkdir(exist_ok=True)
        for name in outputs:
            (build_dir / folder / name).unlink(missing_ok=True)
        argvs[seed] = [tool_command(pnr)] + seed_command(commands[pnr], seed, folder)
    done = _run_all(argvs, build_dir, jobs or default_jobs(), log, every)
    for seed, (code, _) in done.items():  # None: stopped because another run failed
        if code:
            which = "its default seed" if seed is None else f"seed {seed}"
            raise RuntimeError(f"nextpnr with {which} failed (exit {code}; see "
                               f"{build_dir if seed is None else build_dir / f'seed{seed}'})")
    if len(done) == 1:  # nothing to rank (scoring reads nextpnr's 12 MB report)
        runs = [{"seed": None, "score": None}]
    else:
        runs = [{"seed": seed,
                 "score": score(build_dir if seed is None else build_dir / f"seed{seed}")}
                for seed in done]
    for r in runs:
        r["wall_s"] = round(done[r["seed"]][1], 1)
    best = max(runs, key=lambda r: r["score"])  # the first of equals: the default
    for r in runs:
        r["kept"] = r is best
    if best["seed"] is not None:
        for name in outputs:
            shutil.copyfile(build_dir / f"seed{best['seed']}" / name, build_dir / name)
    try:
        _run_tool(build_dir, pack, commands[pack], log, every)
    except RuntimeError as e:
        raise RuntimeError(f"packing the bitstream of the kept run failed: {e}") from None
    return runs
