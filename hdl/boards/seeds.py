"""Place and route one netlist with several nextpnr seeds and keep the fastest.

nextpnr's placement starts from a random state: the same netlist routed with another
``--seed`` lands a few MHz faster or slower (on the small ULX3S build, 61.85 against
67.38 MHz). ``make synth`` runs the lines of amaranth's build script itself: Yosys
once, then the nextpnr line as it is (nextpnr's default seed, its outputs in the build
folder) and, with ``SEEDS=2,3``, side by side with it the same line for each seed (its
outputs in ``seed<N>/``), as many at once as there are cores (nextpnr's WebAssembly build uses
one), and keeps the best run: every clock met first, then the fastest NPU clock. The
kept run's outputs are copied over the build's own and the bitstream is packed from
them, so the report, ``hdl.boards.endpoints`` and the bitstream all describe the same
placement.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["NEXTPNR_OUTPUTS", "parse_seeds", "script_commands", "seed_command", "tool_command",
           "default_jobs", "run_step", "route_seeds"]

NEXTPNR_OUTPUTS = ("--log", "--report", "--textcfg", "--asc")
"""nextpnr's options that name a file it writes (redirected into a seed's folder)."""


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


def _run_all(argvs: dict, cwd: Path, jobs: int, log) -> dict:
    """Run each seed's command, at most ``jobs`` at once; their exit codes by seed."""
    def run(seed):
        where = "its default seed" if seed is None else f"seed {seed} (into seed{seed}/)"
        log(f"synth: placing and routing with {where}...")
        return subprocess.run(argvs[seed], cwd=cwd).returncode

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(argvs, pool.map(run, argvs), strict=True))


def run_step(build_dir: Path, script: str, var: str) -> None:
    """Run the build script's line for tool ``$var`` (e.g. ``YOSYS``) in ``build_dir``;
    raises ``RuntimeError`` when the script has no such line or the tool fails."""
    commands = script_commands(script)
    if var not in commands:
        raise RuntimeError(f"the build script has no ${var} line")
    _run_tool(build_dir, var, commands[var])


def _run_tool(build_dir: Path, var: str, args: list[str]) -> None:
    done = subprocess.run([tool_command(var)] + args, cwd=build_dir)
    if done.returncode:
        raise RuntimeError(f"{tool_command(var)} failed (exit {done.returncode})")


def route_seeds(build_dir: Path, script: str, seeds: list[int],
                score: Callable[[Path], tuple], log=print, jobs: int | None = None) -> list[dict]:
    """Place and route the synthesized netlist with nextpnr's default seed and each of
    ``seeds`` (none: the default run alone), side by side, keep the best run and pack
    its bitstream.

    ``script`` is the build script's text (its synthesis step has run in
    ``build_dir``); ``score(folder)`` ranks a finished run from the files in
    ``folder`` (higher is better; the default run's are in ``build_dir``). ``jobs``
    runs go at once (None: :func:`default_jobs`). Returns one entry per run, the
    default first (``seed`` None): ``{"seed", "score", "kept"}``. The kept run's
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
    codes = _run_all(argvs, build_dir, jobs or default_jobs(), log)
    runs = []
    for seed, code in codes.items():
        if code:
            which = "its default seed" if seed is None else f"seed {seed}"
            raise RuntimeError(f"nextpnr with {which} failed (exit {code}; see "
                               f"{build_dir if seed is None else build_dir / f'seed{seed}'})")
        runs.append({"seed": seed, "score": score(build_dir if seed is None
                                                  else build_dir / f"seed{seed}")})
    best = max(runs, key=lambda r: r["score"])  # the first of equals: the default
    for r in runs:
        r["kept"] = r is best
    if best["seed"] is not None:
        for name in outputs:
            shutil.copyfile(build_dir / f"seed{best['seed']}" / name, build_dir / name)
    try:
        _run_tool(build_dir, pack, commands[pack])
    except RuntimeError as e:
        raise RuntimeError(f"packing the bitstream of the kept run failed: {e}") from None
    return runs
