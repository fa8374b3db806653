"""The cost graph (host/costgraph.py): its totals are the golden model's counters, its
energy is the documented coefficients times the counts, and ``npu`` shows it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from firmware.bursts import DramLatency
from firmware.config import CONFIGS
from firmware.golden import CostModel
from host import cli
from host.adaptive import saved
from host.adaptive.timeline import zero_inputs
from host.compiler import compile_model
from host.costgraph import HOST, build, dma_cycles, explain
from host.costgraph_energy import ENERGY_TERMS, EnergyCoefficients, energy_terms, sram_access_pj
from host.costgraph_sram import count_sram
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session

DEFAULT = CONFIGS["default"]


def measured(name: str, device=None):
    """A compiled bundled model, a warm inference of it on zero inputs (on ``device``,
    the golden model by default), and those inputs."""
    graph = load_onnx(cli.model_path(name), allow_cpu_fallback=True)
    model = compile_model(graph, DEFAULT, paging=True)
    session = Session(NPUDriver(device or GoldenDevice(model.config)), model)
    session.load()
    x = zero_inputs(model)
    session.run(x)
    return model, session.run(x), x


def measured_graph(name: str):
    model, inf, x = measured(name)
    return name, model, inf, x, explain(model, inf, x)


@pytest.fixture(scope="module", params=["resnet8", "cnn"])
def case(request):
    return measured_graph(request.param)


def test_node_totals_are_the_counters(case):
    """Cycles, MACs, DRAM bytes and instructions summed over the NPU's nodes equal the
    inference's counter deltas; each unit's region cycles its trace records' sum."""
    _, model, inf, _, graph = case
    check_totals(model, inf, graph)


@pytest.mark.rtl
@pytest.mark.parametrize("name", ["cnn", "resnet8"])
def test_graph_of_an_rtl_run_sums_to_its_counters(name):
    """On the Verilator NPU too; the golden replay that counts the SRAM bytes ran what
    the RTL ran (MACs and DRAM bytes per region equal)."""
    from verif.fastsim import open_device

    device = open_device(DEFAULT)
    try:
        model, inf, x = measured(name, device)
    finally:
        device.close()
    check_totals(model, inf, explain(model, inf, x, dram_latency=device.dram_latency))


def test_a_slow_memory_lengthens_the_transfers():
    """Behind the slowmem profile's DRAM the graph still sums to the counters, and
    every transfer's DMA alone takes the memory's latency on top."""
    from host.profiles import dram_latency

    slow = dram_latency("slowmem")
    model, inf, x = measured("cnn", GoldenDevice(DEFAULT, dram_latency=slow))
    graph = explain(model, inf, x, dram_latency=slow)
    check_totals(model, inf, graph)
    _, _, fast_inf, _, fast = measured_graph("cnn")
    assert inf.cycles > fast_inf.cycles
    for t in (n for n in graph.nodes.values() if n.kind == "transfer" and n.dma_cycles):
        assert t.dma_cycles > fast.nodes[t.id].dma_cycles, t.id


def check_totals(model, inf, graph):
    npu = [n for n in graph.nodes.values() if n.kind != "host"]
    assert sum(n.cycles for n in npu) == pytest.approx(inf.counters["cycles"], abs=1e-6)
    assert graph.total_cycles == pytest.approx(inf.cycles, abs=1e-6)
    for field, key in (("macs", "macs"), ("instructions", "instructions"),
                       ("dram_read", "dram_read_bytes"), ("dram_write", "dram_write_bytes")):
        assert sum(getattr(n, field) for n in npu) == inf.counters[key], field
    # The outside node takes what no region covers, so the sums above hold by
    # construction; each unit's own figures are its region records', and outside the
    # regions run no MACs and move no DRAM bytes.
    for u in model.units:
        recs = [t for t in inf.trace if t.region == u.id]
        node = graph.nodes[f"u{u.id}"]
        assert node.region_cycles == sum(t.cycles for t in recs)
        assert node.macs == sum(t.macs for t in recs)
        assert node.instructions == sum(t.instructions for t in recs)
    outside = graph.nodes["outside"]
    assert outside.macs == outside.dram_read == outside.dram_write == 0
    assert 0 <= outside.cycles < 0.01 * inf.cycles
    assert graph.sram_counted and graph.sram_matches
    assert all(n.cycles >= 0 for n in graph.nodes.values())


def test_transfers_sit_between_their_units(case):
    """Every tensor crossing a unit boundary is a transfer node on the edge from its
    producer to its consumers, and its exposed cycles never exceed its DMA alone."""
    name, model, _, _, graph = case
    transfers = [n for n in graph.nodes.values() if n.kind == "transfer"]
    assert transfers
    for t in transfers:
        assert 0 <= t.cycles <= t.dma_cycles + 1e-9, t.id
        ins = [e for e in graph.edges if e.dst == t.id]
        outs = [e for e in graph.edges if e.src == t.id]
        assert len(ins) == 1 and outs, t.id
    # the host writes each graph input's quantized tensor and reads each output's
    units = {f"u{u.id}" for u in model.units}
    assert any(e.src.startswith("cpu:") or e.src == HOST for e in graph.edges
               if graph.nodes[e.dst].kind == "transfer")
    if name == "resnet8":  # units 1..10: a transfer between each unit and the next
        between = [t for t in transfers
                   if any(e.src in units for e in graph.edges if e.dst == t.id)
                   and any(e.dst in units for e in graph.edges if e.src == t.id)]
        assert len(between) == 9


def test_critical_path_follows_the_data(case):
    """The critical path over the data edges is a chain of producers and consumers no
    longer than the sum; ResNet-8's shortcut unit is off it (it runs beside unit 7)."""
    name, _, _, _, graph = case
    cycles, path = graph.critical_path()
    edges = {(e.src, e.dst) for e in graph.edges}
    assert all((a, b) in edges for a, b in zip(path, path[1:], strict=False))
    assert cycles == pytest.approx(sum(graph.nodes[k].cycles for k in path))
    assert cycles <= graph.total_cycles + 1e-6
    if name == "resnet8":
        assert "u8" not in path and "u7" in path and cycles < graph.total_cycles


def tiny_gemm():
    """One unit: an 8x8 int8 input times an 8x8 weight tile (weights, zero bias),
    compiled for ``default`` and run twice on zeros (the first run loads the
    weights, the second finds them in their tag slot). Its figures, by hand:

    * MACs: 8 rows x 8 x 8 = 512;
    * DRAM, warm: the input's 64 bytes written by the host and read by the DMA,
      the output's 64 written by the DMA and read by the host = 256 bytes; cold,
      96 more (the 64-byte weight tile and 8 int32 biases);
    * accumulator: 8 rows x 8 int32 words = 256 bytes written (into both copies
      of ``default``'s two read ports) and 256 read by the requantization;
    * scratchpad, warm: reads 64 (the weight tile, ``wload``) + 64 (input rows,
      ``gemm``) + 32 (biases, ``vreqb``) + 64 (output, store DMA) = 224; writes
      64 (input, load DMA) + 64 (output, ``vreqb``) = 128;
    * instructions: the straight-line program's 18, each fetched once."""
    from host.builder import GraphBuilder

    b = GraphBuilder("tiny")
    x = b.input("x", (8, 8), scale=0.02, zp=0)
    w = (np.arange(64).reshape(8, 8) % 7 - 3).astype(np.int8)
    b.output(b.qgemm(x, w, np.zeros(8, np.int32), w_scale=0.01, out_scale=0.05))
    model = compile_model(b.build(), DEFAULT)
    session = Session(NPUDriver(GoldenDevice(model.config)), model)
    session.load()
    zeros = zero_inputs(model)
    cold = session.run(zeros)
    return model, cold, session.run(zeros), zeros


# pJ of tiny_gemm's warm run on ``default`` (coefficients: 0.3 a MAC, 1.25 a
# scratchpad byte of an 8 KiB bank, 2.5 an accumulator byte of 32 KiB, 243.75 a
# DRAM byte, 15 an instruction from a 16 KiB bank).
TINY_WARM_PJ = {"mac": 512 * 0.3, "sp": (224 + 128) * 1.25, "acc": (256 + 2 * 256) * 2.5,
                "dram": 256 * 243.75, "fetch": 18 * 15.0}


def test_energy_of_a_tiny_gemm_is_its_hand_counted_figures():
    """Every term of a one-tile GEMM's warm inference is the pJ its counts (worked out
    by hand in :func:`tiny_gemm`) cost; the total is their sum, and zeroing one
    coefficient takes exactly that term away."""
    model, _, warm, zeros = tiny_gemm()
    assert warm.counters["instructions"] == 18 and warm.counters["macs"] == 512
    graph = explain(model, warm, zeros)
    assert graph.sram_matches
    assert all(TINY_WARM_PJ[t] > 0 for t in ENERGY_TERMS)
    assert graph.energy_by_term() == pytest.approx(TINY_WARM_PJ)
    assert graph.energy_pj == pytest.approx(65_183.6)
    coef = graph.coefficients
    sram = count_sram(model, zeros, warm.trace)
    zeroed = {"mac": "mac", "sp": "sp_byte", "acc": "acc_byte", "dram": "dram_byte",
              "fetch": "fetch"}
    for term, field in zeroed.items():
        less = build(model, warm, sram=sram,
                     coefficients=dataclasses.replace(coef, **{field: 0.0}))
        assert graph.energy_pj - less.energy_pj == pytest.approx(TINY_WARM_PJ[term]), term


def test_energy_grows_with_the_dram_bytes():
    """The cold run moves the weights and biases too (96 DRAM bytes more): its DRAM
    term is larger by their price, and so is its total."""
    model, cold, warm, zeros = tiny_gemm()
    assert cold.counters["dram_read_bytes"] == warm.counters["dram_read_bytes"] + 96
    hot, first = explain(model, warm, zeros), explain(model, cold, zeros)
    assert first.energy_by_term()["dram"] - hot.energy_by_term()["dram"] == \
        pytest.approx(96 * 243.75)
    assert first.energy_pj > hot.energy_pj + 96 * 243.75 - 1e-6


def test_coefficients_follow_the_published_figures():
    """Horowitz, ISSCC 2014 (45 nm): 0.2 pJ 8-bit multiply + 0.1 pJ 32-bit add per MAC;
    10 / 20 / 100 pJ per 64-bit access of an 8 KB / 32 KB / 1 MB SRAM; 1.3-2.6 nJ per
    64-bit DRAM access (the midpoint)."""
    assert sram_access_pj(8 * 1024) == 10.0 and sram_access_pj(32 * 1024) == 20.0
    assert sram_access_pj(1024 * 1024) == 100.0
    assert sram_access_pj(16 * 1024) == pytest.approx(15.0)  # halfway in log2(size)
    assert sram_access_pj(1024) == 10.0  # below the smallest figure: that figure
    c = EnergyCoefficients.for_config(DEFAULT)  # 8 KiB banks, 32 KiB accumulators
    assert (c.mac, c.sp_byte, c.acc_byte, c.acc_copies) == (pytest.approx(0.3), 1.25, 2.5, 2)
    assert c.dram_byte == 1950 / 8 and c.fetch == pytest.approx(15.0)  # 16 KiB bank
    small = EnergyCoefficients.for_config(CONFIGS["small"])
    assert small.acc_copies == 1 and small.acc_byte == 10.0 / 8  # 4 KiB: the 8 KB figure
    terms = energy_terms(c, macs=10, sp_bytes=8, acc_read_bytes=4, acc_write_bytes=4,
                         dram_bytes=8, instructions=1)
    assert terms == pytest.approx({"mac": 3.0, "sp": 10.0, "acc": 30.0, "dram": 1950.0,
                                   "fetch": 15.0})


def test_dma_alone_is_the_golden_models_transfer_cost():
    """One row at the bus width: latency plus a beat a cycle; a slow memory adds its
    read latency before the first burst and its write latency after each."""
    cost, bus = CostModel(), DEFAULT.bus_bytes
    assert dma_cycles(64, 0, False, bus, DramLatency()) == cost.load_latency + 8
    assert dma_cycles(64, 0, True, bus, DramLatency()) == cost.store_latency + 8
    slow = DramLatency(read=64, write=64)
    assert dma_cycles(64, 0, False, bus, slow) == cost.load_latency + 8 + 64
    assert dma_cycles(64, 0, True, bus, slow) == cost.store_latency + 8 + 64
    assert dma_cycles(0, 0, False, bus, slow) == 0


def test_sram_counts_name_every_byte_of_a_gemm_unit():
    """The replay counts the accumulator: every MAC row of a GEMM writes its words."""
    model, inf, x = measured("mlp")
    sram = count_sram(model, x, inf.trace)
    assert sram.matches
    unit = sram.regions[model.units[0].id]
    assert unit.acc_write > 0 and unit.acc_read > 0 and unit.sp_read > 0
    # every MAC's activation byte is read from the scratchpad at least once per 8 columns
    assert unit.sp_read >= inf.counters["macs"] / DEFAULT.cols


def test_npu_run_and_report_show_the_graph(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["run", "mlp", "--digits", "2"]) == cli.ExitCode.OK
    out = capsys.readouterr().out
    assert "cost graph (one inference)" in out and "CPU -> unit 1" in out
    assert "measured" in out and "(equal)" in out and "per inference (mac" in out
    assert cli.main(["run", "mlp", "--adaptive", "--inline-compile", "--digits", "2"]) == 0
    assert "cost graph of plan" in capsys.readouterr().out
    assert cli.main(["report", "mlp"]) == cli.ExitCode.OK
    assert "cost graph of plan" in capsys.readouterr().out
    assert cli.main(["report", "mlp", "--json"]) == cli.ExitCode.OK
    rep = json.loads(capsys.readouterr().out)
    graph = rep["costgraph"]
    assert graph["total_cycles"] == pytest.approx(graph["measured_cycles"])
    assert {n["kind"] for n in graph["nodes"]} >= {"unit", "transfer", "host", "outside"}
    # a damaged graph in the saved report is the one line of any damaged report
    path = saved.report_path(cli.MODELS / "mlp.onnx", DEFAULT)
    del graph["nodes"][1]["cycles"]
    path.write_text(json.dumps(rep))
    assert cli.main(["report", "mlp"]) == cli.ExitCode.USAGE
    line, = capsys.readouterr().err.strip().splitlines()
    assert str(path) in line and "--fresh" in line, line


def test_bench_figures_add_up():
    """make bench-costgraph's figures for one model, plan and profile."""
    from bench.costgraph import figures

    row = figures("fc_autoencoder", "slowmem", fuse=True)
    assert row["checked"] and row["sram_replay_matches"]
    assert row["graph_cycles"] == pytest.approx(row["measured_cycles"])
    assert row["critical_path_cycles"] <= row["measured_cycles"]
    assert 0 < row["transfer_exposed_cycles"] <= row["transfer_dma_cycles"]
    # the timeline predicts for a memory without latency: behind slowmem, too few
    assert row["predicted_region_cycles"] < row["measured_region_cycles"]
    assert sum(row["energy_share"].values()) == pytest.approx(1.0)
