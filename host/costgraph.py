"""The cost graph of one inference: compute, data-transfer and host nodes, in cycles
and energy.

The NPU runs a plan's units one after another; each unit's region trace says what
it cost (cycles, MACs, DRAM bytes, instructions, busy cycles per engine). The graph
makes the data movement between units nodes of their own:

* a **unit** node per region: its measured cycles less the cycles its activation
  transfers left exposed (below), its MACs, the DRAM bytes its transfers do not
  carry (weights, halo re-reads), its instructions, and its scratchpad and
  accumulator bytes (:mod:`.costgraph_sram`); the cost model's prediction beside;
* a **transfer** node per tensor crossing a unit boundary through DRAM (written by
  one unit or by the host, read by the next units or by the host): its bytes, the
  cycles its DMA takes alone (one contiguous row at the bus width, with the
  profile's DRAM latency: :func:`dma_cycles`), and the part of them that is
  exposed, that is not hidden under the unit's compute. The counters bound the
  hidden part from below: a unit whose load channel was busy ``L`` cycles, whose
  busiest compute engine ``C`` cycles, in ``R`` cycles, overlapped at least
  ``L + C - R`` of its load cycles with compute; a transfer is exposed in the
  share the rest is of ``L`` (stores alike), and a unit's exposed transfers never
  exceed ``R - C``, the cycles its compute engines were idle;
* a **host** node per CPU operator (CPU fallbacks, the boundary Quantize /
  Dequantize): no NPU cycles (the NPU's cycle counter does not run between its
  runs); input and output transfers are transfer nodes whose host side moves
  bytes but takes no NPU cycles;
* one **outside** node: the cycles, instructions and bytes of the run outside
  every region mark (run start, code between units, the final drain).

Edges carry tensors (producer -> transfer -> consumer), weighted by the exposed
cycles of the write and of each read. Node cycles add up to the measured cycles of
the inference exactly (the NPU runs the nodes in program order), and MACs, DRAM
bytes and instructions to its counters; the critical path over the data edges
alone is what the dependencies force (branches of a residual block would run side
by side on two NPUs). Energy per node: :mod:`.costgraph_energy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from firmware.bursts import DramLatency, burst_plan
from firmware.golden import CostModel

from .compiler import CompiledModel
from .compiler.lower import scope_tensors
from .costgraph_energy import ENERGY_TERMS, EnergyCoefficients, energy_terms
from .costgraph_sram import OUTSIDE, SramBytes, SramCounts, count_sram

HOST = "host"
"""The node id of the host's inputs and outputs (graph inputs written, outputs read)."""


@dataclass
class Node:
    """One node of the graph (see the module text for what each kind holds).

    ``cycles`` are NPU cycles on the inference's timeline (a unit's: its
    ``region_cycles`` less its transfers' exposed cycles); ``dma_cycles`` (transfers)
    the NPU-side DMA cycles alone; ``host_bytes`` the bytes the host writes or
    reads; ``energy`` pJ per term of :data:`~.costgraph_energy.ENERGY_TERMS`.
    """

    id: str
    kind: str
    label: str
    cycles: float = 0.0
    runs: int = 0
    region_cycles: int = 0
    predicted: float | None = None
    macs: int = 0
    instructions: int = 0
    dram_read: int = 0
    dram_write: int = 0
    sram: SramBytes = field(default_factory=SramBytes)
    dma_cycles: int = 0
    host_bytes: int = 0
    bytes: int = 0
    energy: dict = field(default_factory=dict)

    @property
    def energy_pj(self) -> float:
        return sum(self.energy.values())


@dataclass
class Edge:
    src: str
    dst: str
    tensor: str
    cycles: float = 0.0


@dataclass
class CostGraph:
    """The nodes (in program order), the edges, and what they are checked against."""

    nodes: dict[str, Node]
    edges: list[Edge]
    measured_cycles: int
    coefficients: EnergyCoefficients
    sram_counted: bool
    sram_matches: bool

    @property
    def total_cycles(self) -> float:
        return sum(n.cycles for n in self.nodes.values())

    @property
    def energy_pj(self) -> float:
        return sum(n.energy_pj for n in self.nodes.values())

    def energy_by_term(self) -> dict[str, float]:
        return {t: sum(n.energy.get(t, 0.0) for n in self.nodes.values())
                for t in ENERGY_TERMS}

    def critical_path(self) -> tuple[float, list[str]]:
        """The longest path over the data edges (node cycles plus nothing else: the
        edges' cycles are their transfer nodes'), and its node ids."""
        succ: dict[str, list[str]] = {k: [] for k in self.nodes}
        indeg = dict.fromkeys(self.nodes, 0)
        for e in self.edges:
            succ[e.src].append(e.dst)
            indeg[e.dst] += 1
        best = {k: (self.nodes[k].cycles, [k]) for k in self.nodes}
        ready = [k for k, d in indeg.items() if d == 0]
        while ready:
            k = ready.pop()
            for s in succ[k]:
                cand = best[k][0] + self.nodes[s].cycles
                if cand > best[s][0] or (cand == best[s][0] and len(best[k][1]) >= len(best[s][1])):
                    best[s] = (cand, best[k][1] + [s])
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        return max(best.values(), key=lambda b: b[0], default=(0.0, []))

    def as_dict(self) -> dict:
        """A JSON-ready form (what :func:`.costgraph_report.print_costgraph` prints)."""
        path_cycles, path = self.critical_path()
        return {
            "measured_cycles": self.measured_cycles,
            "total_cycles": self.total_cycles,
            "critical_path_cycles": path_cycles,
            "critical_path": path,
            "energy_pj": self.energy_pj,
            "energy_by_term": self.energy_by_term(),
            "coefficients": self.coefficients.as_dict(),
            "sram_counted": self.sram_counted,
            "sram_matches": self.sram_matches,
            "nodes": [{"id": n.id, "kind": n.kind, "label": n.label, "cycles": n.cycles,
                       "runs": n.runs, "region_cycles": n.region_cycles,
                       "predicted": n.predicted, "macs": n.macs,
                       "instructions": n.instructions, "dram_read": n.dram_read,
                       "dram_write": n.dram_write, "sp_bytes": n.sram.sp,
                       "acc_read": n.sram.acc_read, "acc_write": n.sram.acc_write,
                       "bytes": n.bytes, "dma_cycles": n.dma_cycles,
                       "host_bytes": n.host_bytes, "energy": n.energy,
                       "energy_pj": n.energy_pj} for n in self.nodes.values()],
            "edges": [{"src": e.src, "dst": e.dst, "tensor": e.tensor, "cycles": e.cycles}
                      for e in self.edges],
        }


def dma_cycles(nbytes: int, addr: int, write: bool, bus_bytes: int,
               latency: DramLatency, cost: CostModel | None = None) -> int:
    """Cycles of one DMA transfer of ``nbytes`` at DRAM ``addr`` as one row: the
    golden model's load or store cost (latency, a beat a cycle, the memory's waits)."""
    if nbytes <= 0:
        return 0
    cost = cost or CostModel()
    bursts = [beats for _, beats in burst_plan(addr, nbytes, bus_bytes)]
    if write:
        data = latency.store_cycles(bursts) if latency.write else cost.store_data(bursts)
        return cost.store_latency + data
    return (cost.load_latency + cost.dma_beats(addr, nbytes, bus_bytes)
            + sum(latency.read_gaps(bursts)))


@dataclass
class _Region:
    """One region's trace records in the inference, summed."""

    runs: int = 0
    cycles: int = 0
    macs: int = 0
    instructions: int = 0
    dram_read: int = 0
    dram_write: int = 0
    busy_load: int = 0
    busy_store: int = 0
    busy_compute: int = 0

    def add(self, t) -> None:
        self.runs += 1
        self.cycles += t.cycles
        self.macs += t.macs
        self.instructions += t.instructions
        self.dram_read += t.dram_read_bytes
        self.dram_write += t.dram_write_bytes
        self.busy_load += t.busy_load
        self.busy_store += t.busy_store
        self.busy_compute += max(t.busy_array, t.busy_vector)

    def exposed_share(self, busy: int) -> float:
        """The share of a DMA channel's busy cycles the counters cannot prove hidden."""
        if busy <= 0:
            return 0.0
        hidden = max(0, busy + self.busy_compute - self.cycles)
        return max(0.0, 1.0 - hidden / busy)


def build(model: CompiledModel, inference, *, sram: SramCounts | None = None,
          dram_latency: DramLatency | None = None,
          predicted: dict[int, float] | None = None,
          coefficients: EnergyCoefficients | None = None) -> CostGraph:
    """The cost graph of ``inference`` (a :class:`~host.runtime.Inference` of
    ``model``): see the module text. ``sram``: the replay's SRAM counts (without
    them the SRAM terms are 0); ``predicted``: region id -> the cost model's cycles;
    ``coefficients``: pJ per event (default: those of ``model``'s build)."""
    regions: dict[int, _Region] = {}
    for t in inference.trace:
        regions.setdefault(t.region, _Region()).add(t)
    sram = sram or SramCounts()
    nodes = {HOST: Node(HOST, "host", "host: graph inputs and outputs")}
    producer: dict[str, str] = {name: HOST for name in model.graph.inputs}
    consumers: dict[str, list[str]] = {name: [HOST] for name in model.graph.outputs}
    for n in (n for _, n in model.graph.walk() if n.device == "cpu"):
        _add(nodes, producer, consumers, Node(f"cpu:{n.name}", "host",
                                              f"{n.op} {n.name} (CPU)"), n.inputs, n.outputs)
    units: dict[str, _Region] = {}
    for u in model.units:
        r = units[f"u{u.id}"] = regions.get(u.id, _Region())
        node = Node(f"u{u.id}", "unit", f"unit {u.id}: {', '.join(u.nodes)}", cycles=r.cycles,
                    region_cycles=r.cycles, runs=r.runs, predicted=(predicted or {}).get(u.id),
                    macs=r.macs, instructions=r.instructions, dram_read=r.dram_read,
                    dram_write=r.dram_write, sram=sram.regions.get(u.id, SramBytes()))
        _add(nodes, producer, consumers, node, u.inputs, u.outputs)
    edges = _transfers(model, nodes, units, producer, consumers,
                       dram_latency or DramLatency())
    nodes["outside"] = _outside(inference, units.values(), sram)
    coef = coefficients or EnergyCoefficients.for_config(model.config)
    for n in nodes.values():
        if n.kind != "host":
            n.energy = energy_terms(coef, macs=n.macs, sp_bytes=n.sram.sp,
                                    acc_read_bytes=n.sram.acc_read,
                                    acc_write_bytes=n.sram.acc_write,
                                    dram_bytes=n.dram_read + n.dram_write + n.host_bytes,
                                    instructions=n.instructions)
    return CostGraph(nodes, edges, inference.cycles, coef, bool(sram.regions), sram.matches)


def _add(nodes, producer, consumers, node: Node, inputs, outputs) -> None:
    nodes[node.id] = node
    for o in outputs:
        producer[o] = node.id
    for i in inputs:
        consumers.setdefault(i, []).append(node.id)


def _transfers(model: CompiledModel, nodes: dict[str, Node], units: dict[str, _Region],
               producer: dict[str, str], consumers: dict[str, list[str]],
               latency: DramLatency) -> list[Edge]:
    """Add a transfer node per DRAM tensor a unit writes or reads across its boundary;
    move its bytes and exposed cycles from its units to it; return the edges."""
    tensors = scope_tensors(model.graph)
    crossing = {}
    for tensor, addr in model.place.arena.items():
        ends = [(producer.get(tensor, HOST), True)] + [(d, False)
                                                      for d in consumers.get(tensor, [])]
        if len(ends) > 1 and any(e in units for e, _ in ends):
            crossing[tensor] = (addr, ends)  # else never read, or host to host
    # A unit's measured DRAM bytes are shared among its transfers in proportion to
    # their sizes, at most their sizes (a strided read takes part of a tensor; what
    # is left is the unit's own: weights, halo re-reads).
    planned: dict[tuple[str, bool], int] = {}
    for tensor, (_, ends) in crossing.items():
        for end in ends:
            planned[end] = planned.get(end, 0) + tensors[tensor].size
    shares = {(end, write): min(1.0, (nodes[end].dram_write if write else nodes[end].dram_read)
                                / total)
              for (end, write), total in planned.items() if end in units and total}

    edges: list[Edge] = []
    exposed_of: dict[str, list[tuple[Edge, Node, float]]] = {}
    for tensor, (addr, ends) in crossing.items():
        size = tensors[tensor].size
        src, dsts = ends[0][0], [d for d, _ in ends[1:]]
        node = Node(f"t:{tensor}", "transfer",
                    f"{tensor}: {_end(src)} -> {', '.join(map(_end, dsts))}", bytes=size)
        nodes[node.id] = node
        for end, write in ends:
            edge = Edge(end, node.id, tensor) if write else Edge(node.id, end, tensor)
            edges.append(edge)
            if end not in units:
                node.host_bytes += size
                continue
            unit, r = nodes[end], units[end]
            moved = int(size * shares[end, write])
            if write:
                node.dram_write += moved
                unit.dram_write -= moved
            else:
                node.dram_read += moved
                unit.dram_read -= moved
            alone = dma_cycles(moved, addr, write, model.config.bus_bytes, latency)
            node.dma_cycles += alone
            share = r.exposed_share(r.busy_store if write else r.busy_load)
            exposed_of.setdefault(end, []).append((edge, node, alone * share))
    for uid, parts in exposed_of.items():
        r = units[uid]
        cap = max(0, r.cycles - r.busy_compute)
        want = sum(p[2] for p in parts)
        scale = min(1.0, cap / want) if want else 0.0
        for edge, node, exposed in parts:
            edge.cycles = exposed * scale
            node.cycles += edge.cycles
            nodes[uid].cycles -= edge.cycles
    return edges


def _outside(inference, ran, sram: SramCounts) -> Node:
    """What the inference's counters hold beyond its units' region records."""
    ran = list(ran)
    counters = inference.counters
    node = Node("outside", "outside", "outside every region (run start, code between "
                "units, final drain)", sram=sram.regions.get(OUTSIDE, SramBytes()))
    node.cycles = inference.cycles - sum(r.cycles for r in ran)
    node.macs = counters["macs"] - sum(r.macs for r in ran)
    node.instructions = counters["instructions"] - sum(r.instructions for r in ran)
    node.dram_read = counters["dram_read_bytes"] - sum(r.dram_read for r in ran)
    node.dram_write = counters["dram_write_bytes"] - sum(r.dram_write for r in ran)
    return node


def _end(node_id: str) -> str:
    """A transfer's end as its label names it."""
    if node_id.startswith("cpu:"):
        return "CPU"
    return f"unit {node_id[1:]}" if node_id.startswith("u") else node_id


def explain(model: CompiledModel, inference, inputs: dict, *,
            dram_latency: DramLatency | None = None,
            predicted: dict[int, float] | None = None) -> CostGraph:
    """:func:`build` with the SRAM counts of a golden replay of ``inputs`` (the
    inputs of ``inference``; warm when the measured run hit every tag it checked)."""
    warm = not any(t.tag_misses for t in inference.trace)
    sram = count_sram(model, inputs, inference.trace, warm=warm)
    return build(model, inference, sram=sram, dram_latency=dram_latency, predicted=predicted)

