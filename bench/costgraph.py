"""``make bench-costgraph``: the cost graph (host/costgraph.py) of every MLPerf Tiny
model, on the golden model, for the fused and the per-layer plan, on the ``default``
profile and behind the ``slowmem`` profile's DRAM.

Each model runs its sample inputs, every inference checked against the reference
interpreter; the graph is the last inference's (warm: its weights' tags hit where
they can), as ``npu run MODEL --cpu-fallback [--per-layer] [--profile slowmem]``
prints it. Per model, plan and profile:

* the measured cycles, the sum over the graph's nodes and the critical path over its
  data edges;
* the transfer nodes, their DMA cycles alone and the cycles they left exposed;
* the cost model's cycles for the units' regions against the measured ones: as
  ``npu run`` predicts them (from the plan's golden timeline, which does not know
  a slow memory's latency) and from its formulas alone;
* the energy per inference and its terms (MACs, scratchpad, accumulator, DRAM,
  instruction fetch), and whether the golden replay that counted the SRAM bytes ran
  what the measured run ran.

Writes ``bench/results/costgraph.json``. Run with ``python -m bench.costgraph
[MODEL ...]``.
"""

from __future__ import annotations

import argparse

from bench.common import refuse_unknown, report
from host.adaptive.timeline import attach_timeline
from host.cli import model_path
from host.compiler import compile_model
from host.costgraph import explain
from host.costgraph_report import predictions
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.profiles import dram_latency, profile
from host.runtime import Session
from verif.model_scenarios import model_inputs
from verif.zoo import MLPERF_NAMES

PROFILES = ("default", "slowmem")


def figures(name: str, profile_name: str, fuse: bool) -> dict:
    """The cost graph's figures of ``name``'s last sample inference."""
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    config, latency = profile(profile_name), dram_latency(profile_name)
    model = compile_model(graph, config, fuse=fuse, paging=True)
    session = Session(NPUDriver(GoldenDevice(config, dram_latency=latency)), model, check=True)
    session.load()
    inputs = model_inputs(name, graph)
    runs = [session.run(x) for x in inputs]
    linear = predictions(model)  # the cost model's formulas alone
    attach_timeline(model)  # what npu run predicts from: the plan's golden timeline
    cg = explain(model, runs[-1], inputs[-1], dram_latency=latency,
                 predicted=predictions(model))
    path_cycles, _ = cg.critical_path()
    transfers = [n for n in cg.nodes.values() if n.kind == "transfer"]
    units = [n for n in cg.nodes.values() if n.kind == "unit" and n.runs]
    return {
        "units": len(model.units),
        "checked": all(r.checked for r in runs),
        "measured_cycles": runs[-1].cycles,
        "graph_cycles": round(cg.total_cycles, 3),
        "critical_path_cycles": round(path_cycles),
        "outside_cycles": cg.nodes["outside"].cycles,
        "transfers": len(transfers),
        "transfer_dma_cycles": sum(n.dma_cycles for n in transfers),
        "transfer_exposed_cycles": round(sum(n.cycles for n in transfers)),
        "predicted_region_cycles": round(sum(n.predicted * n.runs for n in units
                                             if n.predicted is not None)),
        "linear_model_region_cycles": round(sum(linear[int(n.id[1:])] * n.runs
                                                for n in units
                                                if int(n.id[1:]) in linear)),
        "measured_region_cycles": sum(n.region_cycles for n in units),
        "energy_uj": cg.energy_pj / 1e6,
        "energy_share": {t: v / cg.energy_pj for t, v in cg.energy_by_term().items()},
        "sram_replay_matches": cg.sram_matches,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.costgraph", description=__doc__)
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models (default: all of {', '.join(MLPERF_NAMES)})")
    opts = ap.parse_args(argv)
    refuse_unknown(ap, opts.models, MLPERF_NAMES)
    rows: dict[str, dict] = {}
    print(f"{'model':<18} {'profile':<8} {'plan':<9} {'measured':>9} {'graph':>9} "
          f"{'crit.path':>9} {'xfers':>5} {'exposed':>8} {'predicted':>9} {'linear':>9} "
          f"{'uJ':>7}  "
          "largest energy terms")
    for name in opts.models or list(MLPERF_NAMES):
        for prof in PROFILES:
            for plan, fuse in (("fused", True), ("per-layer", False)):
                row = figures(name, prof, fuse)
                rows[f"{name}/{prof}/{plan}"] = row
                top = sorted(row["energy_share"].items(), key=lambda kv: -kv[1])[:2]
                print(f"{name:<18} {prof:<8} {plan:<9} {row['measured_cycles']:>9,} "
                      f"{row['graph_cycles']:>9,.0f} {row['critical_path_cycles']:>9,} "
                      f"{row['transfers']:>5} {row['transfer_exposed_cycles']:>8,} "
                      f"{row['predicted_region_cycles']:>9,} "
                      f"{row['linear_model_region_cycles']:>9,} {row['energy_uj']:>7.1f}  "
                      + ", ".join(f"{k} {100 * v:.0f}%" for k, v in top), flush=True)
    report("costgraph", {"backend": "golden", "profiles": list(PROFILES), "runs": rows},
           quiet=True)


if __name__ == "__main__":
    main()
