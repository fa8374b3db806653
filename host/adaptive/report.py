"""Running a model adaptively from the CLI, and the report it leaves behind.

``npu run MODEL --adaptive`` streams the runtime's events as they happen and ends
with :func:`print_report`; the report (``AdaptiveRuntime.report()`` plus per
inference figures) is saved as JSON next to the compile cache (:mod:`.saved`),
where ``npu report MODEL`` finds it again.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def stream_figures(results) -> dict:
    """Per-inference figures of an adaptive run (its :class:`~.records.AdaptiveInference`
    results; JSON-ready lists and summaries)."""
    cycles = [int(r.cycles) for r in results]
    half = len(cycles) // 2
    # The baseline: inferences on the plan the stream started with (warm ones:
    # the first run fills the tags), measured in the same run.
    first = results[0].plan if results else ()
    base = [c for r, c in zip(results[1:], cycles[1:], strict=True) if r.plan == first]
    spec = [r.speculation for r in results if r.speculation]
    return {
        "initial_plan_cycles": float(np.mean(base)) if base else None,
        "speedup_second_half_over_initial": (float(np.mean(base) / np.mean(cycles[half:]))
                                             if base and cycles[half:] else None),
        "misspeculation_rate": spec.count("miss") / len(spec) if spec else None,
        "cycles": cycles,
        "dram_bytes": [int(r.counters["dram_read_bytes"] + r.counters["dram_write_bytes"])
                       for r in results],
        "host_ms": [round(1000 * r.host_seconds, 3) for r in results],
        "plans": [list(r.plan) for r in results],
        "mean_cycles_first_half": float(np.mean(cycles[:half])) if half else None,
        "mean_cycles_second_half": float(np.mean(cycles[half:])) if cycles else None,
        "checked": int(sum(r.checked for r in results)),
    }


def _halves(fig: dict) -> str:
    """Mean cycles of the stream's two halves; a one-inference stream has no first half."""
    second = f"{fig['mean_cycles_second_half']:.0f}"
    if fig["mean_cycles_first_half"] is None:
        return second
    return f"{fig['mean_cycles_first_half']:.0f} (first half), {second} (second half)"


def print_report(rep: dict, console: Console) -> None:
    """The units (with their histories), the plan, and the loop's figures."""
    table = Table("unit", "kind", "state", "nodes", "runs", "history",
                  title=f"{rep['model']}: units of the adaptive run (plan {rep['plan']})")
    for u in rep["units"]:
        hist = "; ".join(f"{e['inference']}: {e['kind']}" for e in u["history"][-4:])
        table.add_row(str(u["id"]), u["kind"], u["state"], ", ".join(u["nodes"]),
                      str(u["exec_count"]), hist)
    console.print(table)
    err = rep["cost_model_error"]
    cache = rep["cache"]
    if rep.get("restored_plan"):
        console.print(f"started on the plan of an earlier run {rep['restored_plan']} "
                      "(restored from the saved state, not swapped in)", highlight=False)
    console.print(
        f"{rep['inferences']} inferences, {rep['swaps']} swaps, {rep['rollbacks']} "
        f"rollbacks, {rep['compiles']} plan changes compiled ({cache['compiles']} compiles, "
        f"{cache['hits']} cache hits); cost model error {100 * err['profile']:.1f}% before "
        f"measuring (golden timeline), {100 * err['refit']:.1f}% refit", highlight=False)
    words = rep.get("program_words")
    if words and words["whole"]:
        console.print(f"program changes wrote {words['written']} instruction words, "
                      f"{words['whole']} as whole programs (only the runs that changed "
                      "are written)", highlight=False)
    spec = rep.get("speculation")
    if spec:
        rate = spec["misspeculations"] / spec["bets"] if spec["bets"] else 0.0
        line = (f"speculation: {spec['bets']} bets, {spec['misspeculations']} "
                f"mis-speculations ({100 * rate:.0f}%), threshold "
                f"{100 * spec['threshold']:.0f}%")
        if spec.get("active"):
            a = spec["active"]
            line += (f"; betting on {escape(a['branch'])} (unit {a['unit']}): hit rate "
                     f"{100 * a['hit_rate']:.0f}%, break-even {100 * a['break_even']:.0f}%")
        console.print(line, highlight=False)
    if rep.get("batch_variants"):
        console.print(escape("batch variants: " + ", ".join(
            f"B={b}: {v}" for b, v in rep["batch_variants"].items())), highlight=False)
    fig = rep.get("stream")
    if fig and fig["cycles"]:
        console.print(
            f"cycles per inference: {_halves(fig)}; host time "
            f"{np.mean(fig['host_ms']):.1f} ms per inference; {fig['checked']}/"
            f"{len(fig['cycles'])} results equal the reference", highlight=False)
        if fig.get("initial_plan_cycles"):
            line = (f"[bold]speedup: {fig['speedup_second_half_over_initial']:.2f}x[/] "
                    f"(second half {fig['mean_cycles_second_half']:.0f} cycles per inference "
                    f"vs {fig['initial_plan_cycles']:.0f} on the initial plan)")
            if fig.get("misspeculation_rate") is not None:
                line += f"; mis-speculation rate {100 * fig['misspeculation_rate']:.1f}%"
            console.print(line, highlight=False)
    print_specializations(rep.get("specializations") or [], console)
    print_sparsity(rep.get("sparsity"), console)
    if rep.get("costgraph"):
        from ..costgraph_report import print_costgraph

        print_costgraph(rep["costgraph"], console, title=f"cost graph of plan {rep['plan']}")
    quarantined = [u for u in rep["units"] if u["state"] == "quarantined"]
    for u in quarantined:
        console.print(f"[red]unit {u['id']} quarantined: {u['history'][-1]['reason']}")


def print_specializations(trials: list[dict], console: Console) -> None:
    """The variants the specializer tried: the counters before and after each."""
    if not trials:
        return

    def causes(counts, cycles):
        if not counts:
            return "-"
        return ", ".join(f"{k.removeprefix('busy_')} {100 * v / max(cycles, 1):.0f}%"
                         for k, v in counts.items() if k.startswith("busy_"))

    table = Table("unit", "bottleneck", "variant", "cycles before", "after", "busy before",
                  "busy after", "verdict", title="specialization trials")
    for t in trials:
        after = t["cycles_after"]
        table.add_row(escape(", ".join(t["unit"])), t["bottleneck"],
                      escape(f"{t['previous']} -> {t['variant']}"), f"{t['cycles_before']:.0f}",
                      "-" if after is None else f"{after:.0f}",
                      causes(t["counters_before"], t["cycles_before"]),
                      causes(t["counters_after"], after or 0), t["verdict"] or "measuring")
    console.print(table)


def print_sparsity(sp: dict | None, console: Console) -> None:
    """The inputs' zero profile, the sparsity trials and the share on the fast path."""
    if not sp:
        return
    for p in sp["inputs"]:
        rates = p["element_zero_rate"]
        always = sum(r >= 0.999 for r in rates)
        tiles = ", ".join(f"{100 * r:.0f}%" for r in p["tile_zero_rate"])
        console.print(escape(f"input {p['input']!r}: {always} of {p['k']} elements zero in "
                             f"every input seen; aligned K-tiles all zero: {tiles}"),
                      highlight=False)
    for t in sp["trials"]:
        console.print(escape(f"sparsity {t['variant']}: {t['skipped']} elements, "
                             f"{t['tiles_saved']} K-tiles fewer: {t['cycles']:.0f} cycles per "
                             f"inference against {t['generic_cycles'] or 0:.0f}: "
                             f"{t['verdict']}"), highlight=False)
    if sp.get("clamps") is not None:
        console.print(f"clamps narrower than int8: {len(sp['clamps'])}", highlight=False)
    if sp["guarded"]:
        console.print(f"sparsity fast path: {sp['fast_path']} of {sp['guarded']} guarded "
                      f"inputs ({100 * sp['fast_path'] / sp['guarded']:.0f}%)", highlight=False)
