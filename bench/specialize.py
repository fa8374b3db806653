"""``make bench-specialize``: counter-driven specialization against the default fused
plan and an offline exhaustive search over the same variant library.

Per hardware profile (``default``, ``small``, ``slowmem``: ``default`` behind a
slow DRAM the compiler does not know of) and MLPerf Tiny model (ResNet-8,
DS-CNN, MobileNetV1-0.25, FC autoencoder), on the golden model at batch 1:

* ``default``: warm cycles per inference of the compiler's fused plan (what ``npu
  run`` runs), and each unit's bottleneck class from its cause counters;
* ``exhaustive``: every legal variant of every unit
  (:func:`host.compiler.variants.enumerate_variants`) measured on the fused plan,
  the others at their defaults; the best of each unit combined into one plan
  and measured (units interact only through weight residency: the combined plan
  is measured, not summed; largest gain first, a variant that no longer
  compiles beside the others is left out). The per-unit search is exhaustive;
  the joint one over all units is not (the product of the libraries);
* ``specialized``: the adaptive runtime started on the same fused plan with
  fusion off (``fuse_threshold`` out of reach: the gain is specialization's
  alone) and the specializer on, run for ``--inferences`` inputs and on until no
  trial is under way (inline compiles, deterministic); its last plan's warm
  cycles, the variants it kept, and the inference by which the last kept
  variant landed. The runtime links
  units compiled on their own (a few ``cfg`` writes more than the fused plan
  lowered in place), so its speedup is over its own first plan.

The speedups are over the default plan; ``specialized_vs_exhaustive`` is the
specialized plan's cycles over the exhaustive plan's (issue 39's target: at most
1.05, with a speedup of at least 1.3 on two models). Writes
``bench/results/specialize.json``. Run with ``python -m bench.specialize [--models
...] [--profiles ...] [--inferences N]``.
"""

from __future__ import annotations

import argparse
import resource
import time

from bench.common import RESULTS, report
from firmware.bursts import MAX_BURST_BEATS, PAGE
from host.adaptive.bottleneck import CAUSE_FIELDS, classify
from host.adaptive.engine import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.specialize_units import SpecializeConfig
from host.cli import model_path
from host.compiler import CompileError, compile_model
from host.compiler.variants import DEFAULT, compile_with, enumerate_variants
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.profiles import PROFILES as KNOWN_PROFILES
from host.profiles import dram_latency
from host.profiles import profile as profile_config
from host.runtime import Session
from verif.model_scenarios import model_inputs
from verif.zoo.workload import workload

MODELS = ("resnet8", "ds_cnn", "mobilenet_v1_025", "fc_autoencoder")
PROFILES = ("default", "small", "slowmem")


def measure(model, config, x, latency=None) -> tuple[int, dict]:
    """Warm cycles of one inference of ``model`` and its regions' records."""
    r = warm_run(model, config, x, latency)
    return int(r.cycles), {rec.region: rec for rec in r.trace}


def warm_run(model, config, x, latency=None):
    """The second of two inferences of ``model`` (the first loads the resident weights)."""
    s = Session(NPUDriver(GoldenDevice(config, dram_latency=latency)), model, check=False)
    s.load()
    s.run(x)
    return s.run(x)


COUNTERS = ("cycles", "busy_load", "busy_store", "busy_array", "busy_vector",
            "stall_in_array", "stall_in_load", "stall_in_store", "stall_out_seq",
            "sp_conflicts", "dram_read_bytes", "dram_write_bytes", "dram_read_bursts",
            "dram_write_bursts")
"""The default plan's counters the headroom analysis reads."""


def headroom(name: str, model, config, run, x, latency=None) -> dict:
    """Where the default plan's cycles go and how far any plan could take them.

    ``bound_cycles`` is bench.models' roofline (the array at peak, or the model's
    fewest DRAM bytes over the bus). Behind a slow DRAM, ``slow_bound_cycles`` adds
    what those bytes pay in latency at the longest bursts (the memory serves one
    burst at a time), and ``latency_cycles`` is what the latency costs the default
    plan: its cycles minus the same program's without it.
    """
    work = workload(model_path(name))
    peak, bus = config.peak_macs_per_cycle, config.bus_bytes
    c = run.counters
    out = {"bound_cycles": round(work.bound_cycles(peak, bus)),
           "bound_by": "compute" if work.macs / peak >= work.min_dram_bytes / bus else "bus",
           "macs": work.macs, "min_dram_bytes": work.min_dram_bytes,
           "pages": len(model.pages), "counters": {k: int(c[k]) for k in COUNTERS},
           "traffic_cycles": round((c["dram_read_bytes"] + c["dram_write_bytes"]) / bus)}
    best = run.cycles / out["bound_cycles"]
    if latency is not None and (latency.read or latency.write):
        fast = warm_run(model, config, x).cycles
        longest = min(MAX_BURST_BEATS * bus, PAGE)
        out["fast_memory_cycles"] = int(fast)
        out["latency_cycles"] = int(run.cycles - fast)
        out["burst_latency_cycles"] = int(c["dram_read_bursts"] * latency.read
                                          + c["dram_write_bursts"] * latency.write)
        out["slow_bound_cycles"] = round(max(
            work.macs / peak,
            work.min_dram_bytes / bus + -(-work.min_dram_bytes // longest) * latency.read))
        out["hidden_latency_speedup"] = run.cycles / fast
        best = run.cycles / out["slow_bound_cycles"]
    out["bound_speedup"] = best
    return out


def bottleneck(rec) -> str:
    return classify(rec.cycles, {f: getattr(rec, f) for f in CAUSE_FIELDS}).describe()


def exhaustive(model, config, x, base_cycles: int, latency=None) -> dict:
    """Every unit's variants measured; the best of each combined."""
    units, best = [], {}
    for u in model.units:
        key = tuple(u.nodes)
        rows = []
        for o in enumerate_variants(model, u, paging=True):
            cycles, regions = measure(o.model, config, x, latency)
            rows.append({"variant": o.variant.describe(), "predicted": round(o.predicted),
                         "unit_cycles": int(regions[u.id].cycles) if u.id in regions else None,
                         "cycles": cycles})
            if cycles < best.get(key, (base_cycles, DEFAULT))[0]:
                best[key] = (cycles, o.variant)
        units.append({"unit": u.id, "nodes": list(u.nodes), "variants": rows,
                      "best": best.get(key, (base_cycles, DEFAULT))[1].describe()})
    # Largest gain first; a variant that no longer compiles beside the others
    # (residency moves blobs) is left out.
    chosen: dict = {}
    for key, (_, v) in sorted(best.items(), key=lambda kv: kv[1][0]):
        try:
            compile_with(model, {**chosen, key: v}, paging=True)
        except CompileError:
            continue
        chosen[key] = v
    combined = (measure(compile_with(model, chosen, paging=True), config, x, latency)[0]
                if chosen
                else base_cycles)
    single = min([c for c, _ in best.values()], default=base_cycles)
    return {"units": units, "cycles": min(combined, single), "combined_cycles": combined,
            "best_single_unit_cycles": single, "variants_measured":
            sum(len(u["variants"]) for u in units),
            "chosen": {"|".join(k): v.describe() for k, v in chosen.items()}}


def specialized(graph, config, inputs, count: int, latency=None) -> dict:
    """The adaptive runtime, fusion off, specializer on, over ``count`` inferences."""
    device = GoldenDevice(config, dram_latency=latency)
    rt = AdaptiveRuntime(NPUDriver(device), graph, AdaptiveConfig(
        fuse_threshold=1e9, async_compile=False, check=False, decide_every=1,
        specialize=SpecializeConfig(), start_fused=True), dram_latency=latency)
    rt.load()
    cycles: list[int] = []
    # At least ``count`` inferences, then on until no trial or change is under way
    # (the plan left is the one the specializer keeps), at most three times more.
    while len(cycles) < count or busy(rt) and len(cycles) < 4 * count:
        cycles.append(int(rt.run(inputs[len(cycles) % len(inputs)]).cycles))
    cycles.append(int(rt.run(inputs[0]).cycles))  # on the plan the last change left
    kept = [e for e in rt.events if e.kind == "specialize-kept"]
    landed = [e.inference for e in rt.events if e.kind == "swapped-in"]
    rt.close()
    return {"inferences": len(cycles), "initial_cycles": cycles[1], "cycles": cycles[-1],
            "speedup_over_own_start": cycles[1] / cycles[-1],
            "trials": len(rt.specializer.trials), "kept": len(kept),
            "rollbacks": rt.rollbacks,
            "last_swap_at": landed[-1] if landed else None,
            "variants": {"|".join(k): v.describe() for k, v in rt.variants.items()},
            "decisions": [f"{e.kind} {e.detail}" for e in rt.events
                          if e.kind.startswith("specialize-")]}


def specialized_or_why(graph, config, inputs, count: int, latency=None) -> dict:
    """:func:`specialized`, or ``{"failed": why}`` when the runtime refuses the model
    (a program that runs only paged cannot be hot-swapped: ``ProgramTooLong``, a
    :class:`CompileError`). Any other error is a bug and propagates."""
    try:
        return specialized(graph, config, inputs, count, latency)
    except CompileError as err:
        return {"failed": f"{type(err).__name__}: {err}"}


def busy(rt) -> bool:
    """Whether a variant is on trial or a plan change is under way."""
    t = rt.specializer.trial
    return rt.changes.change is not None or t is not None and not t.verdict


def one(name: str, profile: str, count: int, search: bool = True) -> dict:
    config, latency = profile_config(profile), dram_latency(profile)
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    try:
        model = compile_model(graph, config, paging=True)
    except CompileError as err:
        return {"refused": str(err)}
    inputs = model_inputs(name, graph)
    x = inputs[0]
    t0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    run = warm_run(model, config, x, latency)
    base, regions = int(run.cycles), {rec.region: rec for rec in run.trace}
    room = headroom(name, model, config, run, x, latency)
    necks = {u.id: bottleneck(regions[u.id]) for u in model.units if u.id in regions}
    if not search:
        return {"default_cycles": base, "bottlenecks": necks, "headroom": room}
    ex = exhaustive(model, config, x, base, latency)
    t1 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    out = {"default_cycles": base, "bottlenecks": necks, "headroom": room,
           "exhaustive_cycles": ex["cycles"], "exhaustive_speedup": base / ex["cycles"],
           "exhaustive": ex}
    sp = specialized_or_why(graph, config, inputs, count, latency)
    if "failed" in sp:
        out["specialized"] = sp
        return out
    t2 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    # The runtime's plans link relocatable units: its gain is measured over its
    # own start and applied to the default plan.
    spec_cycles = base / sp["speedup_over_own_start"]
    out.update({"specialized_cycles": round(spec_cycles),
                "specialized_speedup": sp["speedup_over_own_start"],
                "specialized_vs_exhaustive": spec_cycles / ex["cycles"], "specialized": sp,
                "cpu_seconds": {"exhaustive": round(t1 - t0, 1),
                                "specialized": round(t2 - t1, 1)}})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=sorted(KNOWN_PROFILES))
    ap.add_argument("--inferences", type=int, default=160)
    ap.add_argument("--name", default="specialize", help="results file name (bench/results/)")
    ap.add_argument("--combine", nargs="+", metavar="NAME", default=[],
                    help="measure nothing: write the rows of these results files "
                    "(bench/results/NAME.json, later files win) as --name, JSON and PNG")
    ap.add_argument("--headroom-only", action="store_true",
                    help="the default plan and its headroom only (no search, no runtime)")
    opts = ap.parse_args(argv)
    if opts.combine:
        import json

        figures = {}
        for name in opts.combine:
            figures.update(json.loads((RESULTS / f"{name}.json").read_text())["figures"])
        save(opts.name, figures, quiet=False)
        return
    figures: dict = {}
    for profile in opts.profiles:
        for name in opts.models:
            t = time.perf_counter()
            r = one(name, profile, opts.inferences, search=not opts.headroom_only)
            figures[f"{profile}/{name}"] = r
            if "refused" in r:
                print(f"{profile:8s} {name:18s} does not compile: {r['refused']}")
                continue
            room = r["headroom"]
            if opts.headroom_only:
                print(f"{profile:8s} {name:18s} default {r['default_cycles']:>9,} bound "
                      f"{room.get('slow_bound_cycles', room['bound_cycles']):>9,} (at most "
                      f"{room['bound_speedup']:.2f}x) [{time.perf_counter() - t:.0f} s]",
                      flush=True)
                save(opts.name, figures)
                continue
            spec = (f"specialized {r['specialized_cycles']:>8,} "
                    f"({r['specialized_speedup']:.4f}x, "
                    f"{r['specialized_vs_exhaustive']:.4f} of exhaustive)"
                    if "specialized_cycles" in r else
                    f"specialized: {r['specialized']['failed']}")
            print(f"{profile:8s} {name:18s} default {r['default_cycles']:>9,} "
                  f"exhaustive {r['exhaustive_cycles']:>9,} ({r['exhaustive_speedup']:.4f}x) "
                  f"{spec} bound {room.get('slow_bound_cycles', room['bound_cycles']):>9,} "
                  f"(at most {room['bound_speedup']:.2f}x) "
                  f"[{time.perf_counter() - t:.0f} s]", flush=True)
            for k, v in r["specialized"].get("variants", {}).items():
                print(f"    specialized {k}: {v}")
            for k, v in r["exhaustive"]["chosen"].items():
                print(f"    exhaustive  {k}: {v}")
            save(opts.name, figures)  # after every row: a long run keeps what it measured
    save(opts.name, figures, quiet=False)


def save(name: str, figures: dict, quiet: bool = True) -> None:
    """Write the results so far (JSON and PNG)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = plot(figures, RESULTS / f"{name}.png")
    chosen = side_by_side(figures) if not quiet else side_by_side(figures, echo=False)
    report(name, {"figures": figures, "chosen_by_profile": chosen,
                  "plot": str(png.relative_to(RESULTS.parent.parent))}, quiet=True)


def plot(figures: dict, path):
    """Speedups over the default plan per profile and model: exhaustive,
    specialized, and the bound (log scale), with the 1.3x target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(k, r) for k, r in figures.items() if "refused" not in r and "exhaustive" in r]
    if not rows:
        rows = [(k, r) for k, r in figures.items() if "refused" not in r]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    width = 0.27
    for i, (label, key) in enumerate((("exhaustive", "exhaustive_speedup"),
                                      ("specialized", "specialized_speedup"),
                                      ("bound (roofline)", None))):
        values = [r["headroom"]["bound_speedup"] if key is None else r.get(key, 0.0)
                  for _, r in rows]
        ax.bar([j + (i - 1) * width for j in range(len(rows))], values, width, label=label)
    ax.axhline(1.3, color="k", linestyle="--", linewidth=1, label="target 1.3x")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), [k.replace("/", "\n") for k, _ in rows], fontsize=8)
    ax.set_ylabel("speedup over the default plan (x)")
    ax.set_title("Unit variants at batch 1 (golden model)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def side_by_side(figures: dict, echo: bool = True) -> dict:
    """Per model and unit, the variant each profile's exhaustive search and
    specializer chose (``default`` where it kept the compiler's choice)."""
    out: dict = {}
    for where, r in figures.items():
        if "refused" in r:
            continue
        profile, name = where.split("/")
        for u in r.get("exhaustive", {}).get("units", []):
            unit = "|".join(u["nodes"])
            row = out.setdefault(name, {}).setdefault(unit, {})
            row[profile] = {"exhaustive": u["best"], "specialized": r["specialized"].get(
                "variants", {}).get(unit, "default")}
    for name, units in out.items():
        for unit, row in units.items():
            if echo and len({v["exhaustive"] for v in row.values()}) > 1:
                print(f"{name} {unit}: " + "; ".join(f"{p} {v['exhaustive']}"
                                                    for p, v in row.items()))
    return out


if __name__ == "__main__":
    main()
