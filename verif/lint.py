"""Verilator lint of the generated Verilog: ``python -m verif.lint [--config C] [--block B]``.

Every block that can be a Verilog toplevel on its own, and the NPU top (which
contains every block, including the load and store queues, whose
``always_ready`` completion streams cannot be ports), is converted to Verilog for
each configuration of :data:`firmware.config.CONFIGS` and checked with
``verilator --lint-only -Wall``. The waivers for patterns of Amaranth's (Yosys's)
Verilog that ``-Wall`` flags without being bugs live in ``verif/verilator_lint.vlt``,
each with the reason it is safe; everything else is a finding to fix in ``hdl/``.

One line is printed per (block, configuration) with its warning count; the exit
status is 1 when any warning or error remains (``make lint`` runs ``--config all``).
Full Verilator output is kept in ``build/lint/<config>/<block>.log``.

Generated Verilog is cached: a block is only re-elaborated when the sources of
``hdl/`` and ``firmware/`` (or the configuration) change. The NPU shares its file
and cache key with :func:`verif.rtl_device.run_scenario`, so linting after a
simulation (or the other way round) does not elaborate the NPU again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from firmware.config import CONFIGS, NPUConfig

from .sim import REPO_ROOT, sim_build_dir, source_digest, to_verilog_cached, verilator_env

__all__ = [
    "BLOCKS",
    "LINT_ROOT",
    "WAIVERS",
    "Block",
    "LintMessage",
    "LintResult",
    "lint",
    "lint_verilog",
    "main",
    "verilog_for",
]

LINT_ROOT: Path = REPO_ROOT / "build" / "lint"
"""Where block Verilog and Verilator logs go (``<config>/<block>.v`` and ``.log``)."""

WAIVERS: Path = Path(__file__).with_name("verilator_lint.vlt")
"""The Verilator configuration file holding the lint waivers."""


@dataclasses.dataclass(frozen=True)
class Block:
    """A design linted on its own.

    Attributes
    ----------
    name : str
        Block name on the command line and in reports; also the Verilog module name.
    make : callable
        ``make(config)`` returns a fresh :class:`amaranth.lib.wiring.Component`.
    """

    name: str
    make: Callable[[NPUConfig], object]


def _npu(config):
    from hdl.top import NPU

    return NPU(config)


def _accumulator(config):
    from hdl.accumulator import Accumulator

    return Accumulator(config)


def _array(config):
    from hdl.array import GemmEngine

    return GemmEngine(config)


def _vector(config):
    from hdl.vector import VectorUnit

    return VectorUnit(config)


def _scratchpad(config):
    from hdl.scratchpad import Scratchpad
    from hdl.top import SP_PORTS

    return Scratchpad(config, ports=len(SP_PORTS))


def _partition(config):
    from hdl.partition import PartitionTable
    from hdl.sequencer import NUM_CHECKS

    return PartitionTable(config, checks=NUM_CHECKS)


def _tags(config):
    from hdl.tags import TagStore

    return TagStore(config)


def _dma(config):
    # DMA's load_done/store_done are always_ready streams: the shell makes them ports.
    from hdl.dma import DMAShell

    return DMAShell(config)


def _perf(config):
    from hdl.perf import PerfCounters

    return PerfCounters(config)


def _trace(config):
    from hdl.perf import TraceFIFO

    return TraceFIFO(config)


def _csr(config):
    from hdl.csr import CSRBlock

    return CSRBlock(config)


def _imem(config):
    from hdl.imem import InstructionMemory

    return InstructionMemory(config)


def _sequencer(config):
    from hdl.sequencer import Sequencer

    return Sequencer(config)


def _compute_queue(config):
    from hdl.queues import ComputeQueue

    return ComputeQueue(config)


def _depthwise(config):
    # A build without the engine (dw_rows = 0) lints it with the default's rows.
    from firmware.config import NPUConfig
    from hdl.depthwise import DepthwiseEngine

    rows = config.dw_rows or NPUConfig().dw_rows
    return DepthwiseEngine(dataclasses.replace(config, dw_rows=rows))


BLOCKS: dict[str, Block] = {b.name: b for b in (
    Block("npu", _npu),
    Block("array", _array),
    Block("accumulator", _accumulator),
    Block("vector", _vector),
    Block("scratchpad", _scratchpad),
    Block("partition", _partition),
    Block("tags", _tags),
    Block("dma", _dma),
    Block("perf", _perf),
    Block("trace", _trace),
    Block("csr", _csr),
    Block("imem", _imem),
    Block("sequencer", _sequencer),
    Block("compute_queue", _compute_queue),
    Block("depthwise", _depthwise),
)}
"""Linted designs, the NPU top first. ``hdl.queues.LoadQueue``/``StoreQueue`` are
linted inside ``npu`` only (their ``dma_done`` members are ``always_ready`` streams)."""


def _config_json(config: NPUConfig) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def verilog_for(block: str, config_name: str) -> Path:
    """Return the Verilog file of ``block`` for ``CONFIGS[config_name]``, elaborating if stale.

    The NPU goes where :func:`verif.rtl_device.run_scenario` puts it
    (``build/sim/npu_<config>/npu.v``, same cache key); other blocks go to
    ``build/lint/<config>/<block>.v``.

    Raises
    ------
    KeyError
        Unknown block or configuration name.
    """
    spec, config = BLOCKS[block], CONFIGS[config_name]
    if block == "npu":
        from .rtl_device import config_to_env

        path = sim_build_dir(f"npu_{config_name}") / "npu.v"
        key = source_digest("hdl", "firmware") + config_to_env(config)
    else:
        path = LINT_ROOT / config_name / f"{block}.v"
        key = source_digest("hdl", "firmware") + _config_json(config) + block
    return to_verilog_cached(lambda: spec.make(config), block, path, key)


# --------------------------------------------------------------------------
# Running Verilator
# --------------------------------------------------------------------------

_MESSAGE = re.compile(r"^%(Warning|Error)(?:-([A-Z0-9_]+))?:\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class LintMessage:
    """One Verilator diagnostic.

    Attributes
    ----------
    severity : str
        ``"Warning"`` or ``"Error"``.
    rule : str
        Verilator's code (``WIDTHTRUNC``, ``UNUSEDSIGNAL`` ...), empty for plain errors.
    text : str
        The first line after ``%Warning-RULE:`` (location and message).
    source : str
        The Amaranth source location (``hdl/x.py:123``) of the flagged Verilog line
        when the design carries one in a ``src`` attribute, else empty.
    """

    severity: str
    rule: str
    text: str
    source: str = ""

    def __str__(self) -> str:
        where = f" [{self.source}]" if self.source else ""
        return f"%{self.severity}{'-' + self.rule if self.rule else ''}: {self.text}{where}"


@dataclasses.dataclass
class LintResult:
    """The outcome of linting one Verilog file.

    Attributes
    ----------
    block, config : str
        What was linted.
    messages : list of LintMessage
        Every diagnostic, in Verilator's order.
    returncode : int
        Verilator's exit status (run with ``-Wno-fatal``: non-zero means an error).
    log : pathlib.Path or None
        Where the full output was written.
    """

    block: str
    config: str
    messages: list[LintMessage]
    returncode: int
    log: Path | None = None

    @property
    def warnings(self) -> list[LintMessage]:
        return [m for m in self.messages if m.severity == "Warning"]

    @property
    def errors(self) -> list[LintMessage]:
        return [m for m in self.messages if m.severity == "Error"]

    @property
    def clean(self) -> bool:
        """No warning, no error and a zero exit status."""
        return not self.messages and self.returncode == 0

    def summary(self) -> str:
        """One report line: block, config, warning count and the rules involved."""
        rules = Counter(m.rule or m.severity for m in self.messages)
        detail = ", ".join(f"{r} x{n}" for r, n in sorted(rules.items()))
        status = "ok" if self.clean else "FAIL"
        line = (f"{self.block:<14} {self.config:<8} {len(self.warnings):>5} warning(s)"
                f"  {status}")
        if self.errors:
            line += f"  {len(self.errors)} error(s)"
        elif self.returncode:
            line += f"  (verilator exit status {self.returncode})"
        return line + (f"  ({detail})" if detail else "")


def _parse(output: str, verilog: Path) -> list[LintMessage]:
    try:
        lines = verilog.read_text().splitlines()
    except OSError:
        lines = []
    messages = []
    for raw in output.splitlines():
        match = _MESSAGE.match(raw)
        if not match:
            continue
        severity, rule, text = match.group(1), match.group(2) or "", match.group(3)
        if severity == "Error" and text.startswith("Exiting due to"):
            continue  # the summary of the errors already listed
        source = ""
        loc = re.match(r"(\S+?):(\d+):", text)
        if loc and Path(loc.group(1)).name == verilog.name and lines:
            line_no = int(loc.group(2))
            if 0 < line_no <= len(lines):
                src = re.search(r'src = "([^"]+)"', lines[line_no - 1])
                if src:
                    source = src.group(1).replace(str(REPO_ROOT) + "/", "")
        messages.append(LintMessage(severity, rule, text, source))
    return messages


def lint_verilog(verilog: Path, top: str, *, waivers: Path | None = WAIVERS,
                 extra_args: Sequence[str] = ()) -> tuple[list[LintMessage], int, str]:
    """Run ``verilator --lint-only -Wall`` on one file.

    Parameters
    ----------
    verilog : pathlib.Path
        The Verilog source.
    top : str
        Its toplevel module.
    waivers : pathlib.Path or None
        Verilator configuration file with the waivers (``None``: no waivers).
    extra_args : sequence of str
        More Verilator arguments.

    Returns
    -------
    (messages, returncode, output)
        The parsed diagnostics, Verilator's exit status and its raw output.
    """
    env = {**os.environ, **verilator_env()}
    exe = Path(env["VERILATOR_ROOT"]) / "bin" / "verilator"
    cmd = [str(exe), "--lint-only", "-Wall", "-Wno-fatal", "--top-module", top,
           *extra_args, *([str(waivers)] if waivers is not None else []), str(verilog)]
    proc = subprocess.run(cmd, env=env, cwd=verilog.parent, capture_output=True, text=True,
                          check=False)
    output = proc.stdout + proc.stderr
    return _parse(output, verilog), proc.returncode, output


def lint(block: str, config_name: str) -> LintResult:
    """Elaborate (if stale) and lint ``block`` for ``CONFIGS[config_name]``.

    The full Verilator output is written to ``build/lint/<config>/<block>.log``.
    """
    source = verilog_for(block, config_name)
    messages, code, output = lint_verilog(source, block)
    log = LINT_ROOT / config_name / f"{block}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(output)
    return LintResult(block, config_name, messages, code, log)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; return the exit status (0: every design is clean)."""
    parser = argparse.ArgumentParser(
        prog="python -m verif.lint",
        description="verilator --lint-only -Wall of the Verilog generated from hdl/, per "
                    "block and configuration, with the waivers of verif/verilator_lint.vlt.")
    parser.add_argument("--config", default="all", choices=[*CONFIGS, "all"],
                        help="configuration to lint (default: all)")
    parser.add_argument("--block", action="append", choices=list(BLOCKS), metavar="NAME",
                        help=f"lint only this block (repeatable): {', '.join(BLOCKS)}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every remaining warning, with its Amaranth source line")
    args = parser.parse_args(argv)

    configs = list(CONFIGS) if args.config == "all" else [args.config]
    blocks = args.block or list(BLOCKS)
    failed = 0
    for config_name in configs:
        for block in blocks:
            result = lint(block, config_name)
            print(result.summary(), flush=True)
            if not result.clean:
                failed += 1
                shown = result.messages if args.verbose else result.messages[:5]
                for message in shown:
                    print(f"    {message}")
                if len(shown) < len(result.messages):
                    print(f"    ... {len(result.messages) - len(shown)} more in {result.log}"
                          " (-v prints them all)")
    total = len(configs) * len(blocks)
    print(f"verilator lint: {total - failed} of {total} clean"
          f" (waivers: {WAIVERS.relative_to(REPO_ROOT)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
