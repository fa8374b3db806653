"""The cost graph as ``npu run`` and ``npu report`` print it (from its JSON form,
:meth:`~host.costgraph.CostGraph.as_dict`, so a saved report prints the same)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def program_order(graph: dict) -> list[dict]:
    """The nodes as the inference meets them: each unit after the transfers it
    reads, then the transfers left (outputs), the CPU operators, and the rest."""
    nodes = {n["id"]: n for n in graph["nodes"]}
    into: dict[str, list[str]] = {}
    for e in graph["edges"]:
        if e["src"].startswith("t:"):
            into.setdefault(e["dst"], []).append(e["src"])
    order: list[str] = []
    for nid, n in nodes.items():
        if n["kind"] == "unit":
            order += [t for t in into.get(nid, []) if t not in order]
            order.append(nid)
    order += [k for k, n in nodes.items() if n["kind"] == "transfer" and k not in order]
    order += [k for k, n in nodes.items() if n["kind"] == "host" and k != "host"]
    order += [k for k in nodes if k not in order and k != "host"]
    return [nodes[k] for k in order]


def _hidden(node: dict) -> str:
    """The share of a transfer's DMA cycles hidden under its units' compute."""
    if node["kind"] != "transfer" or not node["dma_cycles"]:
        return ""
    return f"{100 * (1 - node['cycles'] / node['dma_cycles']):.0f}%"


def _count(v) -> str:
    return f"{v:,.0f}" if v else ""


def print_costgraph(graph: dict, console: Console, title: str = "cost graph") -> None:
    """A row per node (cycles on the NPU's timeline, energy), then the inference's
    totals against its measured cycles and the energy by term."""
    table = Table("node", "kind", "cycles", "region", "predicted", "DMA alone", "hidden",
                  "MACs", "DRAM B", "SRAM B", "energy nJ", title=f"{title} (one inference)")
    for n in program_order(graph):
        host = n["kind"] == "host"
        table.add_row(escape(n["label"]), n["kind"], "" if host else f"{n['cycles']:,.0f}",
                      _count(n["region_cycles"]),
                      "" if n["predicted"] is None else f"{n['predicted']:,.0f}",
                      _count(n["dma_cycles"]), _hidden(n), _count(n["macs"]),
                      _count(n["dram_read"] + n["dram_write"] + n["host_bytes"]),
                      _count(n["sp_bytes"] + n["acc_read"] + n["acc_write"]),
                      "" if host else f"{n['energy_pj'] / 1000:,.1f}")
    console.print(table)
    measured, total = graph["measured_cycles"], graph["total_cycles"]
    console.print(
        f"cost graph: {total:,.0f} cycles over its nodes, measured {measured:,} "
        f"({_diff(total, measured)}); critical path over the data edges "
        f"{graph['critical_path_cycles']:,.0f} cycles "
        f"({100 * graph['critical_path_cycles'] / max(measured, 1):.1f}% of the measured)",
        highlight=False)
    units = [n for n in graph["nodes"] if n["kind"] == "unit" and n["predicted"] is not None
             and n["runs"]]
    if units:
        pred = sum(n["predicted"] * n["runs"] for n in units)
        region = sum(n["region_cycles"] for n in units)
        console.print(f"cost model: {pred:,.0f} cycles predicted for the units' regions, "
                      f"measured {region:,} ({_diff(pred, region)})", highlight=False)
    terms = graph["energy_by_term"]
    total_pj = graph["energy_pj"]
    parts = ", ".join(f"{k} {100 * v / total_pj:.0f}%" for k, v in terms.items()) \
        if total_pj else "none"
    coef = graph["coefficients"]
    console.print(
        f"energy: {_energy(total_pj)} per inference ({parts}); pJ per MAC "
        f"{coef['mac']:g}, scratchpad byte {coef['sp_byte']:g}, accumulator byte "
        f"{coef['acc_byte']:g} (a write x{coef['acc_copies']}), DRAM byte "
        f"{coef['dram_byte']:g}, instruction {coef['fetch']:g} ({escape(coef['source'])}; "
        "docs/runtime.md, \"Cost graph\")", highlight=False)
    if not graph["sram_counted"]:
        console.print("SRAM bytes: not counted (no golden replay)", highlight=False)
    elif not graph["sram_matches"]:
        console.print("note: the golden replay that counted the SRAM bytes did not run what "
                      "the device ran (its MACs or DRAM bytes per region differ)",
                      highlight=False)


def _diff(a: float, b: float) -> str:
    if round(a) == b:
        return "equal"
    return f"{100 * (a - b) / max(b, 1):+.2f}%"



def costgraph_of(model, inference, inputs: dict, device) -> dict:
    """The cost graph (JSON form) of ``inference``, a run of ``model`` on ``inputs``
    on ``device``; the predictions are the cost model's as the golden timeline
    calibrates it."""
    from .costgraph import explain

    return explain(model, inference, inputs, predicted=predictions(model),
                   dram_latency=getattr(device, "dram_latency", None)).as_dict()


def predictions(model) -> dict[int, float]:
    """Unit id -> the cost model's cycles, as it calibrates itself on ``model`` (on
    its golden timeline where one is attached, else its formulas alone)."""
    from .compiler.cost import CostModel

    cost = CostModel(model.config)
    cost.calibrate(model)
    return {u.id: cost.predict(u.resources["work"]) for u in model.units
            if "work" in u.resources}


def run_costgraph(model, inference, inputs: dict, device, console: Console) -> dict:
    """:func:`costgraph_of`, printed."""
    graph = costgraph_of(model, inference, inputs, device)
    print_costgraph(graph, console)
    return graph


def adaptive_costgraph(results, batch: list[dict], device) -> dict | None:
    """The cost graph of an adaptive run's last inference on a plan of units (a
    batch variant's runs are not the plan's units), or None."""
    for r, inputs in zip(reversed(results), reversed(batch), strict=False):
        if r.model is not None and not any(isinstance(p, str) for p in r.plan):
            return costgraph_of(r.model, r, inputs, device)
    return None


def _energy(pj: float) -> str:
    return f"{pj / 1e6:,.1f} uJ" if pj >= 1e6 else f"{pj / 1e3:,.1f} nJ"
