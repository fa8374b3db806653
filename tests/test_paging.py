"""Programs larger than an instruction bank, paged through the shadow bank.

* where breaks go: pages filled as far as they go, never between a scalar result
  and the branch that reads it, and a refusal naming an item no page holds;
* a paged program computes what the unpaged one does (outputs and scalar results
  equal, every inference checked against the reference interpreter), one run and
  one swap per page, its cycles the sum of its pages' runs; without paging the
  same compile stops with ``ProgramTooLong``;
* the host stages every page while the page before it runs (no late page), and two
  pages stay resident: after the first inference no instruction is rewritten;
* a paged model leaves no shadow bank for hot swaps: ``Session.stage`` refuses it,
  and so does ``npu run --adaptive``, in one line naming the way out;
* every MLPerf Tiny model runs on ``small`` as built (``--regress``), and DS-CNN's
  two pages run on the Verilator NPU as on the golden model, page run by page run
  (``--regress``).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from firmware.config import CONFIGS
from host.cli import ExitCode, main, model_path
from host.compiler import compile_model
from host.compiler.compile import ProgramTooLong
from host.compiler.pages import choose_breaks
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.limits import LimitExceeded
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.fastsim import run_scenario
from verif.model_scenarios import model_inputs
from verif.zoo import MLPERF_NAMES


def shallow(depth: int):
    """The default configuration with ``depth``-instruction banks."""
    return dataclasses.replace(CONFIGS["default"], imem_depth=depth)


def session(graph, config, **kw) -> Session:
    s = Session(NPUDriver(GoldenDevice(config)), compile_model(graph, config, **kw),
                check=True)
    s.load()
    return s


def test_breaks_fill_pages_and_keep_results_with_their_branch():
    assert choose_breaks([3, 3, 3, 3], [False] * 4, 6) == [2]
    assert choose_breaks([3, 3, 3, 3], [False] * 4, 12) == []
    # a break before item 2 would separate a result from its branch: break before 1
    assert choose_breaks([3, 3, 3, 3], [False, False, True, False], 6) == [1, 3]
    with pytest.raises(ValueError, match="item 1 alone has 7 instructions"):
        choose_breaks([3, 7], [False, False], 6)
    with pytest.raises(ValueError, match="share a scalar result"):
        choose_breaks([4, 4], [False, True], 6)


def test_paged_program_computes_what_the_unpaged_one_does():
    graph = load_onnx(model_path("cnn"))
    config = shallow(100)
    with pytest.raises(ProgramTooLong):
        compile_model(graph, config)
    paged = session(graph, config, paging=True, fuse=False)
    whole = session(graph, CONFIGS["default"], paging=True, fuse=False)
    pages = paged.model.pages
    assert len(pages) == 3 and not whole.model.pages
    assert all(p.end - p.start <= config.imem_depth for p in pages)
    paged.count_pages = True
    for x in model_inputs("cnn", graph)[:3]:
        got, want = paged.run(x), whole.run(x)
        assert got.checked and all((got.outputs[k] == v).all() for k, v in want.outputs.items())
        # late_pages is 0 on the golden device by construction (it stays busy until
        # the host waits); the RTL test below is where lateness is measured.
        assert got.page_runs == 3 and got.late_pages == 0
        assert got.counters["runs"] == 3 and got.counters["swaps"] == 3
        assert got.cycles == sum(c["cycles"] for c in got.page_counters)
        assert [t.region for t in got.trace] == [t.region for t in want.trace]


def test_two_pages_stay_resident():
    graph = load_onnx(model_path("mlp"))
    s = session(graph, shallow(40), paging=True)
    assert len(s.model.pages) == 2
    inputs = model_inputs("mlp", graph)
    s.run(inputs[0])
    written = s.driver.imem_words_written
    second = s.run(inputs[1])
    assert s.driver.imem_words_written == written
    # per page run: budget, 3 arguments, start, swap, interrupt acknowledgement and
    # one trace pop per unit
    assert second.host_writes == 2 * 7 + len(second.trace)


def test_scalar_results_stay_with_the_branch_that_reads_them():
    graph = load_onnx(model_path("early_exit"))
    paged = session(graph, shallow(128), paging=True)
    whole = session(graph, CONFIGS["default"])
    pages = paged.model.pages
    assert len(pages) == 2 and pages[1].results == ("path",)
    taken = set()
    for x in model_inputs("early_exit", graph):
        got, want = paged.run(x), whole.run(x)
        assert got.checked and got.scalars == want.scalars
        taken.add(got.scalars["path"])
    assert len(taken) == 2  # both branches ran


def test_an_inference_stopped_part_way_leaves_the_next_one_running():
    graph = load_onnx(model_path("mlp"))
    s = session(graph, shallow(40), paging=True)
    inputs = model_inputs("mlp", graph)
    s.driver.limits = dataclasses.replace(s.driver.limits, cycle_budget=50)
    with pytest.raises(LimitExceeded):
        s.run(inputs[0])  # the first page stops at its budget, the second is staged
    assert s.pager.active == 1
    s.driver.limits = dataclasses.replace(s.driver.limits, cycle_budget=None)
    assert s.run(inputs[0]).checked


def test_a_paged_program_cannot_be_staged():
    graph = load_onnx(model_path("mlp"))
    s = session(graph, shallow(40), paging=True)
    with pytest.raises(ValueError, match="pages through the shadow bank"):
        s.stage(s.model)


def test_a_paged_run_refuses_to_stage_while_it_runs():
    graph = load_onnx(model_path("mlp"))
    s = session(graph, shallow(40), paging=True)
    with pytest.raises(ValueError, match="pages through the shadow bank"):
        s.run(model_inputs("mlp", graph)[0], while_running=lambda: None)


def test_partition_tables_are_written_only_when_they_change():
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    table = [(0, 1024), (1024, 4096)]
    drv.set_partitions(table, changed_only=True)
    before = drv.reg_writes
    drv.set_partitions(table, changed_only=True)
    assert drv.reg_writes == before
    drv.set_partitions([(0, 512)], changed_only=True)
    assert drv.reg_writes == before + 3 * drv.config.partitions


def test_adaptive_refuses_a_program_that_needs_paging(capsys):
    code = main(["run", "ds_cnn", "--config", "small", "--adaptive", "--cpu-fallback",
                 "--no-cache", "--inline-compile"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert len(err.strip().splitlines()) == 1
    assert "does not fit one bank" in err and "--config default" in err


@pytest.mark.slow
@pytest.mark.parametrize("name", MLPERF_NAMES)
def test_zoo_runs_on_small_as_built(name):
    """Every MLPerf Tiny model on ``small``'s 1024-instruction banks, paged where its
    program is larger, every output equal to the reference interpreter."""
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    s = session(graph, CONFIGS["small"], paging=True)
    for x in model_inputs(name, graph)[:2]:
        r = s.run(x)
        assert r.checked and r.late_pages == 0
        assert r.page_runs == len(s.model.pages)


@pytest.mark.rtl
@pytest.mark.slow
def test_pages_run_on_the_rtl_as_on_the_golden_model(seed, tmp_path):
    """DS-CNN on ``small``: 2 pages; each page run's exact counters (and cycles, where
    the golden model counts them exactly) equal the golden model's, no page is late."""
    out = tmp_path / "figures.json"
    run_scenario("verif.model_scenarios:bench_models_rtl", "small", seed=seed,
                 extra_env={"NPU_MODELS": "ds_cnn", "NPU_INPUTS": "2",
                            "NPU_BENCH_OUT": str(out)})
    row = json.loads(out.read_text())["ds_cnn"]
    assert row["rtl_pages"] == 2 and row["rtl_late_pages"] == 0
