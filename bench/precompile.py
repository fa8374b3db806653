"""``make bench-precompile``: ``npu precompile`` serial vs a pool of compile processes.

The bundled quantized models and the MLPerf Tiny zoo (host/models/mlperf/, CPU
fallback for what the NPU lacks): every model's reachable plans
(:func:`~host.adaptive.cache.precompile_plans` and the speculative ones) are
compiled for the default profile into an empty cache file, as ``npu precompile``
does, once serially (``--jobs 1``) and once with the pool (:mod:`host.adaptive.pool`,
``--jobs`` processes for all models together). Figures: wall and CPU seconds of
each (CPU: the process's own and its compile processes'), the speedup, the
machine's load average (the cores are shared with other work: wall seconds depend
on it), the pool's CPU critical path (the parent's CPU seconds plus, per phase, the
busiest process's: the wall time of otherwise idle cores) and the serial CPU
seconds over it, plans and units lowered per model, and the check that both caches
hold the same entries (:func:`same_entries`).

``python -m bench.precompile --jobs N --model M ...`` picks other settings.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.common import report
from host.adaptive.cache import CompileCache, precompile_models
from host.adaptive.pool import cores
from host.cli import bundled_quantized, model_path
from host.compiler import CompiledModel, simplify
from host.compiler.units import UnitCode
from host.models import MLPERF_DIR
from host.onnx_import import load_onnx
from host.profiles import profile


def zoo() -> list[str]:
    return [str(p) for p in sorted(MLPERF_DIR.glob("*.onnx"))]


def contents(path: Path) -> dict:
    """Key -> what is stored under it, decoded (pickles of equal objects may differ in
    bytes): every plan's program, constants, partitions and units, every unit's code."""
    db = sqlite3.connect(path)
    try:
        plans = {tuple(r[:5]): pickle.loads(r[5]) for r in db.execute(
            "SELECT graph, names, plan, profile, specialization, blob FROM compiled")}
        units = {tuple(r[:3]): pickle.loads(r[3]) for r in db.execute(
            "SELECT unit, profile, variant, blob FROM units")}
    finally:
        db.close()
    out = {}
    for key, m in plans.items():
        out[key] = m if not isinstance(m, CompiledModel) else (
            m.program.to_bytes(), m.const_image(), m.partitions, m.result_regs, m.spans,
            [(u.id, u.nodes, u.instructions, u.resources) for u in m.units])
    for key, u in units.items():
        out[key] = u if not isinstance(u, UnitCode) else (
            u.words, u.lines, u.relocs, u.resources, u.results, u.symbols)
    return out


def same_entries(serial: dict, parallel: dict) -> bool:
    """The same plan entries, and every unit of the serial cache in the parallel one,
    equal. The pool lowers the units every plan shares before any plan stops at a
    refused unit, so it may hold units the serial loop never reached."""
    plans = {k for k in serial if len(k) == 5} | {k for k in parallel if len(k) == 5}
    return all(serial.get(k) == parallel.get(k) for k in plans) and \
        all(parallel.get(k) == v for k, v in serial.items() if len(k) == 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=cores())
    ap.add_argument("--model", nargs="+", help="default: the bundled models and the zoo")
    ap.add_argument("--profile", default="default")
    opts = ap.parse_args(argv)
    config = profile(opts.profile)
    names = opts.model or bundled_quantized() + zoo()
    per_model = {}
    load = os.getloadavg()[0]
    graphs = {Path(n).stem: simplify(load_onnx(model_path(n), allow_cpu_fallback=True))[0]
              for n in names}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        walls, cpus, results, busy = {}, {}, {}, []
        for workers in (1, opts.jobs):  # all models at once, as `npu precompile` does
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall, cpu = time.perf_counter(), time.process_time()
            with CompileCache(Path(tmp, f"{workers}.sqlite")) as cache:
                results[workers] = precompile_models(cache, list(graphs.values()), config,
                                                     workers, busy=busy)
            walls[workers] = time.perf_counter() - wall
            parent = time.process_time() - cpu
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[workers] = time.process_time() - cpu + (after.ru_utime + after.ru_stime) \
                - (children.ru_utime + children.ru_stime)
            print(f"{workers} process{'es' if workers > 1 else ''}: {walls[workers]:.2f} s "
                  f"wall, {cpus[workers]:.2f} s CPU", flush=True)
        # What two otherwise idle cores would take: the parent's CPU seconds, and per
        # phase those of the busiest compile process.
        critical = parent + sum(max(p.values(), default=0.0) for p in busy)
        same = same_entries(contents(Path(tmp, "1.sqlite")),
                            contents(Path(tmp, f"{opts.jobs}.sqlite")))
    for label, res in zip(graphs, results[1], strict=True):
        per_model[label] = {"plans": res.plans, "refused": res.refused, "units": res.units}
    s_wall, p_wall, s_cpu, p_cpu = walls[1], walls[opts.jobs], cpus[1], cpus[opts.jobs]
    figures = {
        "jobs": opts.jobs, "cores": cores(), "profile": opts.profile,
        "serial_s": round(s_wall, 2), "parallel_s": round(p_wall, 2),
        "speedup": round(s_wall / p_wall, 2),
        "serial_cpu_s": round(s_cpu, 2), "parallel_cpu_s": round(p_cpu, 2),
        "parallel_critical_path_cpu_s": round(critical, 2),
        "speedup_cpu_critical_path": round(s_cpu / critical, 2),
        "load_average_1min": [round(load, 1), round(os.getloadavg()[0], 1)],
        "same_cache_contents": same, "models": per_model}
    report("precompile", figures)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
