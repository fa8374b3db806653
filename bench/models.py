"""``make bench-models``: every zoo model on the default config (``--config``: another
hardware profile of host/profiles.py), against its roofline.

The models: the bundled digit models (``host/models/``) and the MLPerf Tiny reference
architectures (``host/models/mlperf/``). Each is imported as ``npu run
--cpu-fallback`` does (what the NPU lacks runs on the CPU), compiled for the default
configuration and run on the golden model with every inference checked against the
reference interpreter. Per model:

* MACs of the whole model (an ``If`` counts its costlier branch) and the MACs the
  NPU ran (its units' own, by the regions of the trace; the MACS counter, which
  counts every product of a weight tile, zeros of a depthwise layer's diagonal
  tiles too, is ``array_macs``); NPU and CPU node counts and the CPU's operators (a
  ``Quantize`` of the input and ``Dequantize`` of the outputs are always there);
* cycles per inference (the CYCLES counter; the first, cold run, which loads the
  weights, and the mean of the later ones) and MAC utilization, NPU MACs / (cycles x
  rows x cols);
* the roofline bound in cycles, max(MACs / peak, minimal DRAM bytes / bus bytes per
  cycle), where the minimal DRAM bytes are the weights, the input and the output
  once (:mod:`verif.zoo.workload`): the time form of min(peak, bus x intensity);
* DRAM bytes read and written per inference and where the cycles went (load,
  compute and store queues busy, sequencer stalls), from the counters;
* the plan: its units (the fused static plan, :mod:`host.compiler.fuse`), the
  compile time, and the cycles of the per-layer plan (one unit per layer) next to
  it, so each model's gain from fusion shows;
* issue 37's target cycles next to each MLPerf model, and whether it is met: only
  when nothing fell back to the CPU (cycles count the NPU alone);
* the program's instructions and, where it is larger than an instruction bank (on
  ``small`` most models), the pages it runs in (:mod:`host.pager`), the CSR writes
  an inference costs the host and the page runs that ended before the host had
  staged the next page (``late_pages``; 0 means the NPU never waited for code);
* for a model the compiler cannot map onto the default config, the reason.

``--rtl`` runs the same models on the Verilator NPU too (the fast simulation
library, ``verif.fastsim``; its first build takes a minute or more): outputs equal
the reference, every exact counter equals the golden model's, and the RTL's cycles
go next to the golden model's estimate.

``--config slowmem`` runs the default build behind a slow DRAM (its latency is the
memory's: the models are compiled for the build alone, and the golden model and the
Verilator NPU's DRAM wait as that memory does).

Writes ``bench/results/models.json`` (another profile: ``models-NAME.json``). Run with
``python -m bench.models [--rtl] [--config NAME]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from bench.common import refuse_unknown, report
from firmware.bursts import DramLatency
from firmware.config import CONFIGS
from host.cli import model_path
from host.compiler import CompileError, compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.ir import CpuOp
from host.models import MODEL_NAMES as DIGIT_MODELS
from host.onnx_import import load_onnx
from host.profiles import PROFILES, dram_latency, profile
from host.runtime import Session
from verif.model_scenarios import model_inputs
from verif.zoo import MLPERF_NAMES
from verif.zoo.workload import workload

CONFIG = "default"
#: Issue 37's targets: cycles per inference, default config, batch 1.
TARGETS = {"resnet8": 280_000, "fc_autoencoder": 40_000, "ds_cnn": 70_000,
           "mobilenet_v1_025": 190_000}
MODELS = (*DIGIT_MODELS, *MLPERF_NAMES)


def placement(graph) -> dict:
    """NPU and CPU node counts, and the CPU's operators by ONNX type."""
    nodes = [n for _, n in graph.walk()]
    cpu = Counter()
    for n in nodes:
        if n.device != "cpu":
            continue
        if isinstance(n, CpuOp):
            proto = onnx.NodeProto.FromString(n.onnx_node)
            cpu[proto.op_type] += 1
        else:
            cpu[n.op] += 1
    return {"npu_nodes": sum(n.device != "cpu" for n in nodes),
            "cpu_nodes": sum(cpu.values()),
            "cpu_ops": ", ".join(f"{op} x{k}" for op, k in sorted(cpu.items())),
            # beyond the input's Quantize and the outputs' Dequantize
            "cpu_fallback_nodes": sum(isinstance(n, CpuOp) for n in nodes)}


def _per_inference(runs: list, key: str) -> float:
    """Mean of a counter over the warm runs (all but the first, when there are more)."""
    warm = runs[1:] or runs
    return float(np.mean([r.counters[key] for r in warm]))


def golden_figures(name: str, graph, compiled, config,
                   latency: DramLatency | None = None) -> dict:
    """Run ``name`` on the golden model (behind a DRAM of ``latency``), every inference
    checked; its figures."""
    session = Session(NPUDriver(GoldenDevice(config, dram_latency=latency)), compiled,
                      check=True)
    session.load()
    machine = session.driver.device.machine
    runs = [session.run(x) for x in model_inputs(name, graph)]
    warm = runs[1:] or runs
    cycles = _per_inference(runs, "cycles")
    # The units' own MACs, by the regions each run went through: the MACS counter
    # counts every product of a weight tile, which for a depthwise layer's diagonal
    # tiles is cols per MAC of the layer.
    macs = float(np.mean([sum(compiled.regions[t.region].resources["macs"] for t in r.trace)
                          for r in warm]))
    return {
        "inputs": len(runs),
        "checked": all(r.checked for r in runs),
        "cycles_first": runs[0].cycles,
        "cycles": round(cycles),
        "npu_macs": round(macs),
        "array_macs": round(_per_inference(runs, "macs")),
        "mac_utilization": macs / (cycles * config.peak_macs_per_cycle),
        "dram_read_bytes": round(_per_inference(runs, "dram_read_bytes")),
        "dram_write_bytes": round(_per_inference(runs, "dram_write_bytes")),
        "busy_load": round(_per_inference(runs, "busy_load")),
        "busy_compute": round(_per_inference(runs, "busy_compute")),
        "busy_store": round(_per_inference(runs, "busy_store")),
        "stall_cycles": round(_per_inference(runs, "stall_cycles")),
        # A program larger than a bank runs in pages (host/pager.py): its instructions,
        # the CSR writes an inference costs the host, and page runs that ended before
        # the next page was staged.
        "instructions": compiled.instructions,
        "pages": len(compiled.pages),
        "host_writes": round(float(np.mean([r.host_writes for r in warm]))),
        "late_pages": sum(r.late_pages for r in runs),
        # Why the golden model's cycles of a run are an estimate (RunResult.inexact_cause):
        # the runs each cause made inexact first, and how often each fired in all.
        "golden_inexact_runs": machine.inexact_runs,
        "golden_runs": machine.counters["runs"],
        "golden_inexact_first": dict(machine.inexact_firsts),
        "golden_inexact_fired": dict(machine.inexact_fired),
    }


def measure(name: str, config=CONFIGS[CONFIG], targets=TARGETS, paging: bool = True,
            latency: DramLatency | None = None) -> tuple[dict, object | None]:
    """One model's figures on the golden model (behind a DRAM of ``latency``), and its
    compiled model (None when the compiler refuses it); ``targets``: cycles per model to
    compare with; ``paging``: a program larger than a bank may run in pages."""
    path = model_path(name)
    work = workload(path)
    peak, bus = config.peak_macs_per_cycle, config.bus_bytes
    row = {"macs": work.macs, "min_dram_bytes": work.min_dram_bytes,
           "bound_cycles": round(work.bound_cycles(peak, bus)),
           "bound_by": "compute" if work.macs / peak >= work.min_dram_bytes / bus else "bus",
           "target_cycles": targets.get(name)}
    graph = load_onnx(path, allow_cpu_fallback=True)
    row.update(placement(graph))
    try:
        start = time.perf_counter()
        compiled = compile_model(graph, config, paging=paging)
        row["compile_seconds"] = round(time.perf_counter() - start, 2)
    except CompileError as err:
        row.update(status="does not compile", reason=str(err).splitlines()[0])
        return row, None
    row.update(placement(compiled.graph))  # the compiler's layout ops (FoldRows) too
    row.update(golden_figures(name, graph, compiled, config, latency))
    per_layer = compile_model(graph, config, fuse=False, paging=paging)
    row.update(units=len(compiled.units), per_layer_units=len(per_layer.units),
               per_layer_cycles=golden_figures(name, graph, per_layer, config,
                                               latency)["cycles"],
               fusion=compiled.fusion)
    row["npu_mac_share"] = row["npu_macs"] / work.macs
    row["fraction_of_bound"] = row["bound_cycles"] / row["cycles"]
    row["status"] = "runs, part on the CPU" if row["cpu_fallback_nodes"] else "runs on the NPU"
    if row["target_cycles"] is not None:
        # The targets count NPU cycles; a model with a CPU node (the zoo's Softmax) is
        # not whole on the NPU, so it meets its target only in cycles.
        row["cycles_meet_target"] = row["cycles"] <= row["target_cycles"]
        row["meets_target"] = row["cycles_meet_target"] and row["status"] == "runs on the NPU"
    return row, compiled


def rtl_figures(names: list[str], config=CONFIG,
                latency: DramLatency | None = None) -> dict[str, dict]:
    """RTL cycles of ``names`` (each runs its inputs on the Verilator NPU beside the
    golden model, both behind a DRAM of ``latency``: outputs, exact counters and trace
    agree) by model."""
    from verif.fastsim import run_scenario

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        run_scenario("verif.model_scenarios:bench_models_rtl", config, dram_latency=latency,
                     extra_env={"NPU_MODELS": ",".join(names), "NPU_BENCH_OUT": str(out)})
        return json.loads(out.read_text())


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{100 * v:.1f}%"
    return f"{v:,}" if isinstance(v, int) else str(v)


def print_table(rows: dict[str, dict]) -> None:
    """The figures as two tables (the README's), one model a line; the RTL's cycles
    when ``--rtl`` measured them."""
    with_rtl = any("rtl_cycles" in r for r in rows.values())
    head = ("model", "MACs", "bound", "target", "cycles", "per-layer", "units", "util",
            "of bound", "DRAM B", "NPU/CPU nodes", "status")
    lines = [head + (("RTL cycles", "= golden every run") if with_rtl else ())]
    for name, r in rows.items():
        dram = (r["dram_read_bytes"] + r["dram_write_bytes"]) if "cycles" in r else None
        line = (name, _cell(r["macs"]), _cell(r["bound_cycles"]),
                _cell(r["target_cycles"]), _cell(r.get("cycles")),
                _cell(r.get("per_layer_cycles")),
                f"{r['units']}/{r['per_layer_units']}" if "units" in r else "-",
                _cell(r.get("mac_utilization")), _cell(r.get("fraction_of_bound")),
                _cell(dram), f"{r['npu_nodes']}/{r['cpu_nodes']}", r["status"])
        if with_rtl:
            equal = r.get("rtl_cycles_equal_golden")
            line += (_cell(r.get("rtl_cycles")), "-" if equal is None else
                     "yes" if equal else "no")
        lines.append(line)
    _print_lines(lines)
    print()
    lines = [("model", "cycles", "busy load", "busy compute", "busy store", "stalls",
              "DRAM read", "DRAM written", "CPU ops")]
    lines += [(name, *(_cell(r[k]) for k in ("cycles", "busy_load", "busy_compute",
                                            "busy_store", "stall_cycles", "dram_read_bytes",
                                            "dram_write_bytes")), r["cpu_ops"])
              for name, r in rows.items() if "cycles" in r]
    _print_lines(lines)
    if any(r.get("pages") for r in rows.values()):
        print()
        lines = [("model", "instructions", "pages", "host CSR writes", "late pages")]
        lines += [(name, _cell(r["instructions"]), _cell(r["pages"]), _cell(r["host_writes"]),
                   _cell(r["late_pages"])) for name, r in rows.items() if "cycles" in r]
        _print_lines(lines)
    if opts_causes := [n for n, r in rows.items() if r.get("golden_inexact_runs")]:
        print("\nruns whose cycles the golden model estimates, by first cause (in "
              "parentheses how often it fired in all; a DMA overlap is looked for only "
              "until a run is flagged, so it counts at most once a run):")
        for name in opts_causes:
            r = rows[name]
            causes = ", ".join(f"{c} {k} ({r['golden_inexact_fired'].get(c, 0)})"
                               for c, k in r["golden_inexact_first"].items())
            print(f"  {name}: {r['golden_inexact_runs']} of {r['golden_runs']}: {causes}")
    for name, r in rows.items():
        if "reason" in r:
            print(f"{name}: {r['reason']}")


def _print_lines(lines: list[tuple[str, ...]]) -> None:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__)
    ap.add_argument("--rtl", action="store_true", help="also run on the Verilator NPU")
    ap.add_argument("--config", choices=list(PROFILES), default=CONFIG,
                    help=f"the hardware profile (default {CONFIG}; issue 37's targets "
                         "are for it alone; slowmem: the default build behind a slow DRAM)")
    ap.add_argument("--imem-depth", type=int, metavar="N",
                    help="instruction-bank depth instead of the configuration's")
    ap.add_argument("--no-paging", action="store_true",
                    help="a program larger than an instruction bank is priced into one "
                         "bank or refused, never paged")
    ap.add_argument("--acc-ports", type=int, choices=(1, 2), metavar="N",
                    help="accumulator read ports instead of the configuration's (1: the "
                         "array and the vector unit take turns)")
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models to measure (default: all of {', '.join(MODELS)})")
    opts = ap.parse_args(argv)
    refuse_unknown(ap, opts.models, MODELS)
    names = opts.models or list(MODELS)
    config, latency = profile(opts.config), dram_latency(opts.config)
    if opts.imem_depth:
        config = dataclasses.replace(config, imem_depth=opts.imem_depth)
    out_name = "models" if opts.config == CONFIG else f"models-{opts.config}"
    if opts.acc_ports and opts.acc_ports != config.acc_ports:
        config = dataclasses.replace(config, acc_ports=opts.acc_ports)
        out_name += f"-acc-ports-{opts.acc_ports}"  # beside, not instead of, the build's
    targets = TARGETS if opts.config == CONFIG else {}
    rows = {}
    for name in names:
        print(f"{name}...", flush=True)
        rows[name], _ = measure(name, config, targets, paging=not opts.no_paging,
                                latency=latency)
    if opts.rtl:
        runnable = [n for n in names if "cycles" in rows[n]]
        for name, rtl in rtl_figures(runnable, config, latency).items():
            rows[name].update(rtl)
    print_table(rows)
    # Another configuration's figures go to a file of their own (models-small.json).
    report(out_name,
           {"config": opts.config, "rows": config.rows, "cols": config.cols,
            "bus_bytes": config.bus_bytes, "sp_bytes": config.sp_bytes,
            "imem_depth": config.imem_depth, "acc_ports": config.acc_ports,
            "dram_read_latency": latency.read, "dram_write_latency": latency.write,
            "backend": "golden + verilator" if opts.rtl else "golden", "models": rows},
           quiet=True)


if __name__ == "__main__":
    main()
