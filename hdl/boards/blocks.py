"""Per-block timing on the ECP5: where the NPU's clock period goes.

``python -m hdl.boards.blocks [--blocks vector,gemm,...] [--freq 100] [--out build/synth]``

Each NPU block is synthesized alone (yosys ``synth_ecp5``) and placed and routed
out of context on the ULX3S's LFE5U-85F (nextpnr ``--out-of-context``: no IO
buffers, block ports left unconstrained), so a block's register-to-register fmax
and its critical path come in minutes instead of the whole board build's hours.
Paths that cross blocks (a ``ready`` that travels from the scratchpad arbiter into
a requester's pipeline enable, say) only show in the whole build; this is the
tool for finding and fixing the long paths inside each block.

Writes ``<out>/blocks/report.json`` and ``report.md``: per block the LUT/FF/DSP/BRAM
use, the routed fmax against the target, and the critical path summarized by the
source lines it runs through (``hdl/vector.py:482 x8``), with its logic and
routing delay. Each block's logs stay in ``<out>/blocks/<block>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from amaranth.hdl import Module
from amaranth.lib import wiring

from firmware.config import NPUConfig

from .report import parse_critical_path, parse_nextpnr_log, parse_yosys_stat
from .seeds import stop_tools_on_sigterm
from .synth import tool_env

__all__ = ["BLOCKS", "block_rtlil", "parse_critical_path", "time_block", "render_markdown", "main"]

DEVICE = ("--85k", "--package", "CABGA381", "--speed", "6")
"""The ULX3S's ECP5 (the board build's device)."""


def _blocks() -> dict[str, Callable[[NPUConfig], object]]:
    # Imported lazily: the module is importable (and its parsers testable) without
    # elaborating anything.
    from hdl.accumulator import Accumulator
    from hdl.array import GemmEngine
    from hdl.csr import CSRBlock
    from hdl.dma import DMA
    from hdl.imem import InstructionMemory
    from hdl.partition import PartitionTable
    from hdl.perf import PerfCounters, TraceFIFO
    from hdl.queues import ComputeQueue, LoadQueue, StoreQueue
    from hdl.scratchpad import Scratchpad
    from hdl.sequencer import NUM_CHECKS, Sequencer
    from hdl.tags import TagStore
    from hdl.top import NPU, SP_PORTS
    from hdl.vector import VectorUnit
    return {
        "gemm": GemmEngine, "vector": VectorUnit, "sequencer": Sequencer,
        "scratchpad": lambda c: Scratchpad(c, ports=len(SP_PORTS)), "dma": DMA,
        "csr": CSRBlock, "load_queue": LoadQueue, "compute_queue": ComputeQueue,
        "store_queue": StoreQueue, "partition": lambda c: PartitionTable(c, checks=NUM_CHECKS),
        "tags": TagStore, "accumulator": Accumulator, "counters": PerfCounters,
        "trace": TraceFIFO, "imem": InstructionMemory, "dispatch": Dispatch, "npu": NPU,
    }


BLOCKS = ("gemm", "vector", "sequencer", "scratchpad", "dma", "csr", "load_queue",
          "compute_queue", "store_queue", "partition", "tags", "accumulator", "counters",
          "trace", "imem", "dispatch", "npu")
"""Every block the tool knows, in the default order (``dispatch`` is the sequencer with
the partition table its checks run through; ``npu`` is the whole NPU, slow)."""


class Dispatch(wiring.Component):
    """The sequencer and the partition table, wired as in :class:`hdl.top.NPU`.

    The partition checks run from the sequencer through the table and back into the
    sequencer's CHECK step, a path that neither block has alone. Every other member
    of the two blocks is a port (``seq_*``, ``pt_*``; ``pt_bank`` is the active bank).
    """

    def __init__(self, config: NPUConfig):
        from hdl.partition import PartitionTable
        from hdl.sequencer import NUM_CHECKS, Sequencer
        self._seq = Sequencer(config)
        self._pt = PartitionTable(config, checks=NUM_CHECKS)
        members = {f"seq_{n}": mb for n, mb in self._seq.signature.members.items()
                   if n != "chk"}
        members |= {f"pt_{n}": mb for n, mb in self._pt.signature.members.items()
                    if n not in ("checks", "set")}
        super().__init__(members)

    def elaborate(self, platform):
        from hdl.top import connect_checks
        m = Module()
        m.submodules.seq, m.submodules.pt = seq, pt = self._seq, self._pt
        for prefix, inner in (("seq_", seq), ("pt_", pt)):
            for path, mb, outer in self.signature.flatten(self):
                name = path[0]
                if not name.startswith(prefix):
                    continue
                inner_v = getattr(inner, name[len(prefix):])
                for step in path[1:]:
                    inner_v = inner_v[step] if isinstance(step, int) else getattr(inner_v, step)
                if mb.flow == wiring.In:
                    m.d.comb += inner_v.eq(outer)
                else:
                    m.d.comb += outer.eq(inner_v)
        connect_checks(m, seq, pt)
        return m

def _run(cmd: list[str], cwd: Path, what: str):
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed ({' '.join(cmd[:1])}): {' / '.join(tail)}")


def block_rtlil(component) -> str:
    """RTLIL of a block with every signal of its signature as a port (members tied
    to constants, such as fixed AXI fields, are not ports)."""
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


def time_block(name: str, config: NPUConfig, out: Path, *, freq_mhz: float = 100.0,
               router: str = "router2") -> dict:
    """Synthesize, place and route block ``name`` alone; return its figures."""
    factories = _blocks()
    if name not in factories:
        raise ValueError(f"unknown block {name!r}; known: {', '.join(BLOCKS)}")
    tool_env()
    work = (out / name).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("top.json", "pnr.log", "yosys.log"):
        (work / stale).unlink(missing_ok=True)
    (work / "top.il").write_text(block_rtlil(factories[name](config)))
    t0 = time.monotonic()
    # The tools are $YOSYS and $NEXTPNR_ECP5 (default: yowasp, which sees the working
    # directory only: relative paths throughout).
    _run([os.environ["YOSYS"], "-q", "-l", "yosys.log", "-p",
          "read_rtlil top.il; synth_ecp5 -top top -json top.json; stat"], work, "yosys")
    t1 = time.monotonic()
    _run([os.environ["NEXTPNR_ECP5"], *DEVICE, "--out-of-context", "--json", "top.json",
          "--freq", str(freq_mhz), "--timing-allow-fail", "--router", router,
          "-l", "pnr.log", "-q"], work, "nextpnr")
    t2 = time.monotonic()
    log = (work / "pnr.log").read_text(errors="replace")
    pnr = parse_nextpnr_log(log)
    cells = parse_yosys_stat((work / "yosys.log").read_text(errors="replace"))
    achieved = min((a for a, _ in pnr["fmax"].values()), default=None)
    return {
        "block": name,
        "fmax_mhz": achieved,
        "target_mhz": freq_mhz,
        "met": None if achieved is None else achieved >= freq_mhz,
        "lut4": cells.get("LUT4", 0), "ff": cells.get("TRELLIS_FF", 0),
        "dsp": cells.get("MULT18X18D", 0), "bram": cells.get("DP16KD", 0),
        "lutram": cells.get("TRELLIS_DPR16X4", 0),
        "critical_path": parse_critical_path(log),
        "yosys_s": round(t1 - t0, 1), "nextpnr_s": round(t2 - t1, 1),
    }


def render_markdown(results: list[dict], config: NPUConfig) -> str:
    """The report table and each block's critical path."""
    lines = ["# Per-block timing (ECP5 LFE5U-85F, speed 6, out of context)", "",
             f"NPU config: {config.rows}x{config.cols} array, {config.bus_bytes * 8}-bit bus, "
             f"{config.sp_bytes // 1024} KiB scratchpad.", "",
             "| block | fmax (MHz) | target | LUT4 | FF | DSP | DP16KD | LUTRAM | critical path "
             "through |", "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        cp = r["critical_path"] or {}
        where = ", ".join(f"{loc} x{n}" if n > 1 else loc for loc, n in cp.get("sources", []))
        fmax = "-" if r["fmax_mhz"] is None else f"{r['fmax_mhz']:.1f}"
        verdict = ("no register-to-register path" if r["fmax_mhz"] is None
                   else "met" if r["met"] else "FAILED")
        lines.append(f"| {r['block']} | {fmax} | {r['target_mhz']:g} {verdict} | {r['lut4']} | "
                     f"{r['ff']} | {r['dsp']} | {r['bram']} | {r['lutram']} | {where or '-'} |")
    lines += ["", "Critical paths (logic + routing):", ""]
    for r in results:
        cp = r["critical_path"]
        if cp:
            lines.append(f"- **{r['block']}**: {cp['delay_ns']} ns ({cp['logic_ns']} logic, "
                         f"{cp['routing_ns']} routing), `{cp['from']}` -> `{cp['to']}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hdl.boards.blocks",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default=",".join(b for b in BLOCKS if b != "npu"),
                    help="comma-separated blocks (default: all but the whole 'npu')")
    ap.add_argument("--freq", type=float, default=100.0, help="target clock, MHz")
    ap.add_argument("--router", default="router2", choices=("router1", "router2"))
    ap.add_argument("--out", type=Path, default=Path("build/synth"))
    args = ap.parse_args(argv)
    stop_tools_on_sigterm()
    names = [b.strip() for b in args.blocks.split(",") if b.strip()]
    unknown = [b for b in names if b not in BLOCKS]
    if unknown:
        ap.error(f"unknown block(s) {', '.join(unknown)}; known: {', '.join(BLOCKS)}")
    # the 8x8 build: the per-block figures of docs/fpga-timing.md were measured on it
    from firmware.config import CONFIGS
    config = CONFIGS["default"]
    out = args.out / "blocks"
    results = []
    for name in names:
        try:
            r = time_block(name, config, out, freq_mhz=args.freq, router=args.router)
        except RuntimeError as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
        results.append(r)
        cp = r["critical_path"] or {}
        where = ", ".join(loc for loc, _ in cp.get("sources", [])[:4])
        fmax = "   none" if r["fmax_mhz"] is None else f"{r['fmax_mhz']:7.1f}"
        print(f"{name:14s} {fmax} MHz  LUT4 {r['lut4']:6d}  DSP {r['dsp']:3d}"
              f"  ({r['yosys_s'] + r['nextpnr_s']:.0f} s)  {where}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": "LFE5U-85F-6CABGA381", "npu_config": config.as_dict(),
              "blocks": results}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(results, config))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
