"""``make bench-adaptive``: the gated MoE on the NPU over a stream whose class mix
shifts phase by phase, under three plans.

* **unfused**: the compiler's initial plan (one unit per anchor operator);
* **static**: for each phase, the best plan the runtime could reach (every merge
  combination and speculative merge ``npu precompile`` knows), chosen offline on
  the golden model with the phase's inputs known in advance, and installed at the
  phase boundary;
* **adaptive**: :class:`host.adaptive.AdaptiveRuntime`, learning as it serves.

It prints and saves (``bench/results/adaptive.json`` and ``adaptive.png``, cycles
per inference over the stream with phase boundaries and swaps marked): cycles and
DRAM bytes per inference, the steady-state speedup of adaptive over unfused (last
half of each phase), the gap to the static plan per phase, inferences to converge
after each shift, stall cycles per swap (the first run after a swap against a
re-run of the same input on the same plan), the mis-speculation rate and what a
miss costs, host overhead per inference.

Runs on the Verilator NPU (the default; the first build takes a minute or two) or with
``--golden`` on the golden model. Every result is checked against the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, report

PHASES = ["012", "3456", "789"]
PER_PHASE = 40
BATCH = 8  # inputs per call when serving in batches
MODEL = "moe"
WINDOW = 5  # rolling mean for convergence
CONVERGED = 0.05  # within 5% of the static plan's steady state


def _inputs(graph, stream):
    inp = graph.inputs[0]
    shape = graph.tensors[inp].shape
    return [{inp: s.x.reshape(shape).astype(np.float32)} for s in stream]


def _static_plans(graph, config, phase_inputs, cache):
    """Per phase, the reachable plan with the fewest cycles on that phase (golden)."""
    from host.adaptive.cache import precompile_plans, speculative_plans
    from host.device import GoldenDevice
    from host.driver import NPUDriver
    from host.runtime import Session

    plans = [(label, graph, plan) for label, plan in precompile_plans(graph)]
    plans += speculative_plans(graph)
    best = []
    for xs in phase_inputs:
        scored = []
        for label, g, plan in plans:
            model, _ = cache.get_or_compile(g, plan, config)
            s = Session(NPUDriver(GoldenDevice(config)), model)
            s.load()
            for x in xs:  # warm the tags
                s.run(x)
            scored.append((float(np.mean([s.run(x).cycles for x in xs])), label, model))
        scored.sort(key=lambda t: t[0])
        best.append(scored[0])
    return best


def scenario(device, config, seed):
    """The three plans on ``device``; figures to ``$NPU_BENCH_OUT`` (JSON)."""
    from host.adaptive import AdaptiveConfig, AdaptiveRuntime
    from host.adaptive.cache import CompileCache
    from host.cli import model_path
    from host.compiler import compile_model
    from host.datasets import class_mix_stream
    from host.driver import NPUDriver
    from host.onnx_import import load_onnx
    from host.runtime import Session

    per_phase = int(os.environ.get("NPU_BENCH_PER_PHASE", PER_PHASE))
    phases = [{int(c): 1.0 for c in ph} for ph in PHASES]
    stream = list(class_mix_stream(per_phase * len(phases), phases, seed))
    graph = load_onnx(model_path(MODEL))
    cache = CompileCache(None)
    base = compile_model(graph, config, fuse=False)  # the unfused plan
    xs = _inputs(base.graph, stream)
    phase_of = [s.phase for s in stream]
    by_phase = [[x for x, p in zip(xs, phase_of, strict=True) if p == k]
                for k in range(len(phases))]
    t0 = time.perf_counter()
    static = _static_plans(base.graph, config, by_phase, cache)
    oracle_seconds = time.perf_counter() - t0
    drv = NPUDriver(device)
    out = {"phases": PHASES, "per_phase": per_phase, "phase_of": phase_of,
           "static_plans": [label for _, label, _ in static],
           "static_golden_cycles": [c for c, _, _ in static],
           "oracle_seconds": oracle_seconds}

    def serve(session, pick=None):
        cycles, dram = [], []
        for i, x in enumerate(xs):
            if pick is not None and (i == 0 or phase_of[i] != phase_of[i - 1]):
                session.install(pick(phase_of[i]))
            r = session.run(x)
            assert r.checked
            cycles.append(r.cycles)
            dram.append(r.counters["dram_read_bytes"] + r.counters["dram_write_bytes"])
        return cycles, dram

    s = Session(drv, base, check=True)
    s.load()
    out["unfused_cycles"], out["unfused_dram"] = serve(s)
    s = Session(drv, base, check=True)
    s.load()
    out["static_cycles"], out["static_dram"] = serve(s, lambda k: static[k][2])

    rt = AdaptiveRuntime(drv, graph, AdaptiveConfig(async_compile=False), cache=cache)
    rt.load()
    cycles, dram, overhead, stalls, spec = [], [], [], [], []
    for x in xs:
        r = rt.run(x)
        assert r.checked
        cycles.append(r.cycles)
        dram.append(r.counters["dram_read_bytes"] + r.counters["dram_write_bytes"])
        overhead.append(r.overhead_seconds)
        spec.append(r.speculation)
        if any(e.kind == "swapped-in" for e in r.events) and r.index < len(xs):
            # The next inference is the first on the new plan: run it, then again
            # on the same plan; a swap stall would make the first one longer.
            nxt = xs[r.index]
            first = rt.session.run(nxt).cycles
            again = rt.session.run(nxt).cycles
            stalls.append(first - again)
    out.update(adaptive_cycles=cycles, adaptive_dram=dram,
               adaptive_overhead_ms=[1000 * o for o in overhead], swap_stalls=stalls,
               speculation=spec, events=[e.as_dict() for e in rt.events], swaps=rt.swaps,
               rollbacks=rt.rollbacks, final_plan=rt.report()["plan"])
    # Serving in batches of BATCH: the adaptive runtime's routed batch variants
    # against, per phase, the best bet chosen offline (no re-betting).
    best_bets = _static_bets(base.graph, config, by_phase, cache)
    out["static_batched_bets"] = [name for name, _ in best_bets]

    def serve_batched(rt, pick=None):
        cycles, spec, overhead = [], [], []
        for i in range(0, len(xs), BATCH):
            if pick is not None:
                rt.batches.use(pick(phase_of[i]))
            for r in rt.run_batch(xs[i:i + BATCH]):
                assert r.checked
                cycles.append(r.cycles)
                spec.append(r.speculation)
                overhead.append(1000 * (r.host_seconds if r.plan and str(r.plan[0]).startswith(
                    "route") else r.overhead_seconds))
        return cycles, spec, overhead

    rt = AdaptiveRuntime(drv, graph, AdaptiveConfig(async_compile=False, warmup=10**9,
                                                    rebet=False), cache=cache)
    rt.load()
    out["static_batched_cycles"], _, _ = serve_batched(rt, lambda k: best_bets[k][1])
    rt = AdaptiveRuntime(drv, graph, AdaptiveConfig(async_compile=False), cache=cache)
    rt.load()
    (out["adaptive_batched_cycles"], out["adaptive_batched_speculation"],
     _) = serve_batched(rt)
    out["batched_events"] = [e.as_dict() for e in rt.events]
    Path(os.environ["NPU_BENCH_OUT"]).write_text(json.dumps(out))


def _static_bets(graph, config, phase_inputs, cache):
    """Per phase, the routed batch variant whose bet costs the fewest cycles per
    inference on that phase (golden model; misses run on the generic plan)."""
    import itertools

    from host.adaptive import AdaptiveConfig, AdaptiveRuntime
    from host.adaptive.routed import branch_leaves, routed_variant
    from host.device import GoldenDevice
    from host.driver import NPUDriver

    leaves = branch_leaves(graph)
    variants = []
    for k in range(1, len(leaves) + 1):
        for bet in itertools.combinations(leaves, k):
            variants.append(routed_variant(
                graph, config, list(bet), BATCH,
                lambda g, u, bet=bet: cache.get_or_compile(
                    g, u, config, specialization=f"route{BATCH}:" + ";".join(
                        lf.describe() for lf in bet))[0]))
    best = []
    for xs in phase_inputs:
        scored = []
        for v in variants:
            rt = AdaptiveRuntime(NPUDriver(GoldenDevice(config)), graph,
                                 AdaptiveConfig(async_compile=False, warmup=10**9,
                                                rebet=False, check=False), cache=cache)
            rt.load()
            rt.batches.use(v)
            cyc = [r.cycles for i in range(0, len(xs) - BATCH + 1, BATCH)
                   for r in rt.run_batch(xs[i:i + BATCH])]
            scored.append((float(np.mean(cyc)), v.name, v))
        scored.sort(key=lambda t: t[0])
        best.append((scored[0][1], scored[0][2]))
    return best


def figures(raw: dict) -> dict:
    """The benchmark's figures from the raw per-inference series."""
    phase_of = np.array(raw["phase_of"])
    plans = ("unfused", "static", "adaptive")
    cyc = {p: np.array(raw[f"{p}_cycles"], dtype=float) for p in plans}
    dram = {p: np.array(raw[f"{p}_dram"], dtype=float) for p in plans}
    steady = np.zeros(len(phase_of), dtype=bool)
    starts = []
    for k in range(len(raw["phases"])):
        idx = np.flatnonzero(phase_of == k)
        starts.append(int(idx[0]))
        steady[idx[len(idx) // 2:]] = True
    f = {"model": MODEL, "phases": "|".join(raw["phases"]), "inferences": len(phase_of)}
    for p in plans:
        f[f"{p}_cycles_per_inference"] = float(cyc[p].mean())
        f[f"{p}_dram_bytes_per_inference"] = float(dram[p].mean())
        f[f"{p}_steady_cycles_per_inference"] = float(cyc[p][steady].mean())
    f["steady_speedup_adaptive_over_unfused"] = (f["unfused_steady_cycles_per_inference"]
                                                 / f["adaptive_steady_cycles_per_inference"])
    f["speedup_target"] = 1.5
    gaps, converge = [], []
    for k in range(len(raw["phases"])):
        m = (phase_of == k) & steady
        gaps.append(float(cyc["adaptive"][m].mean() / cyc["static"][m].mean() - 1))
        if k:
            target = cyc["static"][m].mean() * (1 + CONVERGED)
            seg = cyc["adaptive"][phase_of == k]
            roll = np.convolve(seg, np.ones(WINDOW) / WINDOW, mode="valid")
            hit = np.flatnonzero(roll <= target)
            converge.append(int(hit[0]) if len(hit) else None)
    for k, g in enumerate(gaps):
        f[f"gap_to_static_phase{k}"] = g
    f["gap_target"] = 0.05
    for k, c in enumerate(converge, start=1):
        f[f"inferences_to_converge_after_shift{k}"] = c
    f["converge_target"] = 20
    f["swaps"] = raw["swaps"]
    f["rollbacks"] = raw["rollbacks"]
    f["max_stall_cycles_per_swap"] = max(raw["swap_stalls"], default=0)
    f["stall_target"] = 0
    spec = np.array(raw["speculation"])
    bets = int(np.sum(spec != ""))
    misses = spec == "miss"
    f["speculative_bets"] = bets
    f["misspeculation_rate"] = float(misses.sum() / bets) if bets else 0.0
    # What a miss cost: its cycles over the unfused plan's on the same input.
    f["misspeculation_cost_cycles"] = float(
        (cyc["adaptive"][misses] - cyc["unfused"][misses]).mean()) if misses.any() else 0.0
    f["host_overhead_ms_per_inference"] = float(np.mean(raw["adaptive_overhead_ms"]))
    # Serving in batches of BATCH (a routed batch variant per call).
    bat = {p: np.array(raw[f"{p}_batched_cycles"], dtype=float) for p in ("static", "adaptive")}
    for p in ("static", "adaptive"):
        f[f"{p}_batched_steady_cycles_per_inference"] = float(bat[p][steady].mean())
    f["batch"] = BATCH
    f["steady_speedup_adaptive_batched_over_unfused"] = (
        f["unfused_steady_cycles_per_inference"]
        / f["adaptive_batched_steady_cycles_per_inference"])
    for k in range(len(raw["phases"])):
        m = (phase_of == k) & steady
        f[f"batched_gap_to_static_phase{k}"] = float(bat["adaptive"][m].mean()
                                                     / bat["static"][m].mean() - 1)
    for k in range(1, len(raw["phases"])):
        m = phase_of == k
        target = bat["static"][m & steady].mean() * (1 + CONVERGED)
        roll = np.convolve(bat["adaptive"][m], np.ones(WINDOW) / WINDOW, mode="valid")
        hit = np.flatnonzero(roll <= target)
        f[f"batched_inferences_to_converge_after_shift{k}"] = int(hit[0]) if len(hit) else None
    bspec = np.array(raw["adaptive_batched_speculation"])
    f["batched_misspeculation_rate"] = float(np.mean(bspec == "miss"))
    bmiss = bspec == "miss"
    f["batched_misspeculation_cost_cycles"] = float(
        (bat["adaptive"][bmiss] - bat["adaptive"][~bmiss].mean()).mean()) if bmiss.any() else 0.0
    f["static_batched_bets"] = "; ".join(raw["static_batched_bets"])
    f["static_plans"] = "; ".join(raw["static_plans"])
    f["final_adaptive_plan"] = str(raw["final_plan"])
    return f


def plot(raw: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for p, style in (("unfused", ":"), ("static", "--"), ("adaptive", "-")):
        ax.plot(raw[f"{p}_cycles"], style, label=p, linewidth=1.2)
    for p, style in (("static_batched", "--"), ("adaptive_batched", "-")):
        ax.plot(raw[f"{p}_cycles"], style, label=f"{p.replace('_', ' ')} (B={BATCH})",
                linewidth=1.0, alpha=0.8)
    phase_of = raw["phase_of"]
    for i in range(1, len(phase_of)):
        if phase_of[i] != phase_of[i - 1]:
            ax.axvline(i - 0.5, color="k", alpha=0.4)
    colors = {"swapped-in": "tab:green", "rollback": "tab:red", "defuse-planned": "tab:purple"}
    for e in raw["events"]:
        if e["kind"] in colors:
            ax.axvline(e["inference"] - 1, color=colors[e["kind"]], alpha=0.3, linestyle="-.")
    ax.set_xlabel("inference (phases: " + " | ".join(raw["phases"]) + "; green: swap, "
                  "purple: de-fuse planned)")
    ax.set_ylabel("NPU cycles")
    ax.set_title(f"{MODEL}: cycles per inference, one at a time and {BATCH} per call")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", action="store_true", help="the golden model, not the RTL")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-phase", type=int, default=PER_PHASE)
    opts = ap.parse_args(argv)
    wall = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.json"
        env = {"NPU_BENCH_OUT": str(out), "NPU_BENCH_PER_PHASE": str(opts.per_phase)}
        if opts.golden:
            from firmware.config import CONFIGS
            from host.device import GoldenDevice

            os.environ.update(env)
            scenario(GoldenDevice(CONFIGS["default"]), CONFIGS["default"], opts.seed)
        else:
            from verif.fastsim import run_scenario

            run_scenario("bench.adaptive:scenario", "default", seed=opts.seed, extra_env=env)
        raw = json.loads(out.read_text())
    f = figures(raw)
    f["backend"] = "golden" if opts.golden else "verilator"
    f["wall_seconds"] = round(time.time() - wall, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    f["plot"] = str(plot(raw, RESULTS / "adaptive.png").relative_to(RESULTS.parent.parent))
    report("adaptive", f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
