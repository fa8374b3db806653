"""Run a hand-assembled gated two-expert MLP on the golden-model NPU (``make demo``).

This is the stand-in main job until the compiler and the adaptive runtime exist:
it assembles ``firmware/programs/gated_mlp.s``, loads random int8 weights into
DRAM, runs a batch of inputs one run each, checks every output against an
independent numpy computation, and prints per-run results, the counters and the
region trace. ``--program FILE.s`` instead runs any assembly file and prints its
registers and counters (``make sim``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from firmware import asm, isa
from firmware.golden import Machine
from firmware.quant import quantize_multiplier, requantize

PROGRAMS = Path(__file__).resolve().parent.parent / "firmware" / "programs"

# DRAM layout of the demo (byte addresses).
X, WG, W0, W1, BIAS, OUT = 0x0000, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000
PARTITIONS = [(0, 128), (128, 128), (256, 512), (768, 512), (1280, 128), (1408, 64)]


def make_model(rng):
    """Random int8 weights, int32 biases and fixed-point scales for the gated MLP."""
    wg = rng.integers(-64, 64, (64, 2), dtype=np.int8)
    w = [rng.integers(-64, 64, (64, 8), dtype=np.int8) for _ in range(2)]
    bg = rng.integers(-500, 500, 2).astype(np.int32)
    b = [rng.integers(-2000, 2000, 8).astype(np.int32) for _ in range(2)]
    gate_q = quantize_multiplier(1 / 600.0) + (0,)
    exp_q = quantize_multiplier(1 / 900.0) + (-20,)
    return wg, w, bg, b, gate_q, exp_q


def reference(x, model):
    """The gated MLP in plain numpy integer math, independent of the golden model."""
    wg, w, bg, b, (gm, gs, gz), (em, es, ez) = model
    logits = requantize(x.astype(np.int64) @ wg.astype(np.int64) + bg, gm, gs, gz)
    e = int(np.argmax(logits))
    y = requantize(x.astype(np.int64) @ w[e].astype(np.int64) + b[e], em, es, ez, lo=ez)
    return y, logits, e


def run_demo(n_inputs: int, seed: int, console: Console) -> bool:
    rng = np.random.default_rng(seed)
    model = make_model(rng)
    wg, w, bg, b, (gm, gs, gz), (em, es, ez) = model
    prog = asm.assemble(
        (PROGRAMS / "gated_mlp.s").read_text(),
        defines=dict(GATE_MUL=gm, GATE_SHIFT=gs, GATE_ZP=gz, EXP_MUL=em, EXP_SHIFT=es,
                     EXP_ZP=ez),
    )
    npu = Machine(dram_bytes=1 << 16)
    for addr, arr in [(WG, wg), (W0, w[0]), (W1, w[1]),
                      (BIAS, np.concatenate([bg, b[0], b[1]]).astype("<i4"))]:
        raw = arr.view(np.uint8).ravel()
        npu.dram[addr: addr + raw.size] = raw
    npu.write_program(prog)
    npu.set_partitions(PARTITIONS)
    npu.swap()
    console.print(f"[bold]gated_mlp.s[/]: {len(prog)} instructions, "
                  f"{len(prog) * 8} bytes; {n_inputs} inputs, seed {seed}")

    table = Table("input", "expert", "y (int8)", "logits", "cycles", "tag hits", "match")
    all_ok = True
    for i in range(n_inputs):
        x = rng.integers(-128, 128, 64, dtype=np.int8)
        npu.dram[X: X + 64] = x.view(np.uint8)
        hits_before = sum(npu.counters["tag_hits"])
        res = npu.run(args=(X, WG, W0, W1, BIAS, OUT))
        if not res.ok:
            console.print(f"[red]run {i} stopped: {res.error.name} at pc {res.pc}: {res.message}")
            return False
        y = npu.dram[OUT: OUT + 8].view(np.int8)
        logits = npu.dram[OUT + 8: OUT + 10].view(np.int8)
        y_ref, l_ref, e_ref = reference(x, model)
        regions = [r.region for r in list(npu.trace)[-2:]]
        expert = {2: 0, 3: 1}.get(regions[-1]) if regions else None
        ok = (np.array_equal(y, y_ref) and np.array_equal(logits, l_ref) and expert == e_ref
              and npu.regs[11] == e_ref)
        all_ok &= ok
        table.add_row(str(i), str(expert), " ".join(f"{v:4d}" for v in y),
                      " ".join(str(v) for v in logits), str(res.cycles),
                      str(sum(npu.counters["tag_hits"]) - hits_before),
                      "[green]yes" if ok else "[red]NO")
    console.print(table)
    _print_counters(npu, console)
    console.print("[bold]region trace of the last run[/]")
    _print_trace(list(npu.trace)[-2:], console)
    verdict = "[green]all outputs equal the numpy reference" if all_ok else "[red]MISMATCH"
    console.print(verdict)
    return all_ok


def run_program(path: Path, args, console: Console) -> bool:
    prog = asm.assemble(path.read_text())
    npu = Machine()
    npu.write_program(prog)
    npu.set_partitions([(i * 4096, 4096) for i in range(npu.config.partitions)])
    npu.swap()
    res = npu.run(args=args)
    console.print(asm.disassemble(prog, addresses=True))
    status = "[green]ok" if res.ok else f"[red]{res.error.name} at pc {res.pc}: {res.message}"
    console.print(f"{path.name}: {status}, {res.instructions} instructions, {res.cycles} cycles")
    console.print("registers: " + " ".join(f"r{i}={v:#x}" for i, v in enumerate(npu.regs) if v))
    _print_counters(npu, console)
    _print_trace(list(npu.trace), console)
    return res.ok


def _print_counters(npu: Machine, console: Console):
    c = npu.counters
    table = Table("counter", "value", title="counters (golden model)")
    for k, v in c.items():
        table.add_row(k, str(v))
    peak = npu.config.peak_macs_per_cycle * max(c["cycles"], 1)
    table.add_row("MAC utilization", f"{100 * c['macs'] / peak:.1f}% of "
                  f"{npu.config.peak_macs_per_cycle} MACs/cycle")
    console.print(table)


def _print_trace(records, console: Console):
    if not records:
        return
    table = Table("region", "start", "end", "cycles", "instrs", "MACs", "DRAM rd", "DRAM wr",
                  "hits", "misses")
    for r in records:
        table.add_row(*(str(v) for v in (r.region, r.start, r.end, r.cycles, r.instructions,
                                          r.macs, r.dram_read_bytes, r.dram_write_bytes,
                                          r.tag_hits, r.tag_misses)))
    console.print(table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=8, help="inputs to run (default 8)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--program", type=Path, help="run this assembly file instead")
    ap.add_argument("--args", type=lambda s: int(s, 0), nargs="*", default=[],
                    help=f"values for r1..r{isa.NUM_ARG_REGS} (with --program)")
    ns = ap.parse_args(argv)
    console = Console()
    if ns.program:
        return 0 if run_program(ns.program, ns.args, console) else 1
    return 0 if run_demo(ns.inputs, ns.seed, console) else 1


if __name__ == "__main__":
    raise SystemExit(main())
