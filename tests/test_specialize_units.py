"""Counter-driven specialization in the adaptive runtime
(host/adaptive/specialize_units.py): trials planned from the bottleneck, kept or
reverted by measurement, validated in shadow, remembered per unit and profile."""

import pytest

from firmware.config import CONFIGS
from host.adaptive.bottleneck import classify
from host.adaptive.cache import CompileCache
from host.adaptive.engine import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.faults import corrupt_requant
from host.adaptive.specialize_units import KNOBS, Outcomes, SpecializeConfig, addresses
from host.cli import main, model_path
from host.compiler.variants import Variant
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from verif.model_scenarios import model_inputs

NAME = "fc_autoencoder"


def _runtime(cache=None, fault=None, **kw):
    graph = load_onnx(model_path(NAME), allow_cpu_fallback=True)
    rt = AdaptiveRuntime(NPUDriver(GoldenDevice(CONFIGS["default"])), graph, AdaptiveConfig(
        fuse_threshold=1e9, async_compile=False, decide_every=1, start_fused=True,
        specialize=SpecializeConfig(**kw)), cache=cache, fault=fault)
    rt.load()
    return rt, model_inputs(NAME, graph)


def _serve(rt, inputs, count):
    results = [rt.run(inputs[i % len(inputs)]) for i in range(count)]
    assert all(r.checked for r in results)  # check=True: every result equals the reference
    return results


def _events(rt, kind):
    return [e for e in rt.events if e.kind == kind]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """60 inferences with every result checked; the cache file it leaves behind."""
    path = tmp_path_factory.mktemp("specialize") / "cache.sqlite"
    rt, inputs = _runtime(CompileCache(path))
    results = _serve(rt, inputs, 60)
    rt.close()
    return rt, results, path


def test_a_memory_bound_unit_keeps_the_variant_that_measures_faster(served):
    rt, results, _ = served
    planned = [e for e in _events(rt, "specialize-planned") if e.units == (1,)]
    assert planned[0].detail.startswith("unit 1: memory-bound (load ")
    assert "-> step bytes 2048" in planned[0].detail
    assert _events(rt, "variant-validated")
    kept = _events(rt, "specialize-kept")
    assert (1,) in [e.units for e in kept]
    assert rt.variants[("/body/body.0/Gemm",)] == Variant(step_bytes=2048)
    trial = next(t for t in rt.report()["specializations"]
                 if t["unit"] == ["/body/body.0/Gemm"])
    assert trial["verdict"] == "kept"
    assert trial["cycles_after"] < trial["cycles_before"]
    assert trial["counters_after"]["busy_load"] < trial["counters_before"]["busy_load"]


def test_a_variant_that_measures_slower_is_reverted(served):
    """Units 7 and 8's larger steps are predicted faster and measure slower."""
    rt, results, _ = served
    reverted = _events(rt, "specialize-reverted")
    assert reverted and "measured" in reverted[0].detail
    reverted = [t for t in rt.report()["specializations"] if t["verdict"] == "reverted"]
    assert reverted
    if rt.changes.change is not None:  # the last way back has not landed yet
        reverted = reverted[:-1]
    for t in reverted:  # back to the variant before, never tried again
        assert rt.variants.get(tuple(t["unit"]), Variant()).describe() != t["variant"]
    assert min(r.cycles for r in results[1:]) < results[1].cycles


def test_a_variant_that_fails_validation_rolls_back():
    rt, inputs = _runtime(fault=corrupt_requant)
    _serve(rt, inputs, 10)
    assert rt.rollbacks >= 1
    trials = rt.report()["specializations"]
    assert trials[0]["verdict"] == "rolled back"
    assert rt.variants.get(tuple(trials[0]["unit"]), Variant()).describe() \
        != trials[0]["variant"]


def test_measurements_are_remembered_per_unit_and_profile(served):
    _, _, path = served
    again, inputs = _runtime(CompileCache(path))
    _serve(again, inputs, again.config.warmup + 30)  # unit 9, the hottest, comes first
    first = next(e for e in _events(again, "specialize-planned") if e.units == (1,))
    assert "step bytes 2048 (measured" in first.detail


_CAUSES = {"busy_load": 0, "busy_store": 0, "busy_array": 0, "busy_vector": 0,
           "sp_conflicts": 0}


@pytest.mark.parametrize("causes, variant, ok", [
    ({"busy_load": 90}, Variant(step_bytes=2048), True),
    ({"busy_store": 90}, Variant(stream_weights=True), False),
    ({"busy_load": 10}, Variant(m_tiles=1), True),
    ({"busy_array": 90, "sp_conflicts": 20}, Variant(m_tiles=2), False),
    ({"busy_array": 90}, Variant(), False),
    ({"busy_vector": 90}, Variant(way="bands"), True),
])
def test_the_knobs_that_address_a_bottleneck(causes, variant, ok):
    """Each class the counters classify into (100 cycles) has knobs of its own."""
    kind = classify(100, {**_CAUSES, **causes}).kind
    assert kind in KNOBS
    assert addresses(kind, variant) is ok


def test_specialize_needs_adaptive(capsys):
    assert main(["run", "mlp", "--specialize"]) != 0
    assert "--specialize" in capsys.readouterr().err


def test_outcomes_are_keyed_by_the_memory_the_host_knows_of(tmp_path):
    """default and slowmem are one build: their measurements are kept apart."""
    from firmware.bursts import DramLatency
    from host.profiles import measured_key

    fast = measured_key(CONFIGS["default"])
    slow = measured_key(CONFIGS["default"], DramLatency(64, 64))
    assert fast != slow and measured_key(CONFIGS["default"], DramLatency()) == fast
    outcomes = Outcomes(CompileCache(tmp_path / "c.sqlite"))
    outcomes.put("unit", slow, Variant(step_bytes=2048), 100.0)
    outcomes.put("unit", slow, Variant(), 120.0)
    assert Outcomes(CompileCache(tmp_path / "c.sqlite")).get("unit", slow) == {
        "step bytes 2048": 100.0, "default": 120.0}
    assert outcomes.get("unit", fast) == {}


def test_outcomes_of_a_fresh_run_are_all_kept(tmp_path):
    """--fresh reads nothing stored before, yet keeps every measurement of its run."""
    path = tmp_path / "c.sqlite"
    Outcomes(CompileCache(path)).put("unit", "p", Variant(m_tiles=2), 9.0)  # before the run
    outcomes = Outcomes(CompileCache(path, fresh=True))
    outcomes.put("unit", "p", Variant(m_tiles=4), 3.0)
    outcomes.put("unit", "p", Variant(), 4.0)
    assert outcomes.get("unit", "p") == {"m tiles 4": 3.0, "default": 4.0}
    assert Outcomes(CompileCache(path)).get("unit", "p") == {"m tiles 4": 3.0, "default": 4.0}


def test_outcomes_in_a_read_only_cache_stay_in_memory(tmp_path):
    path = tmp_path / "c.sqlite"
    with CompileCache(path) as writer:  # closing checkpoints the log into the file
        Outcomes(writer).put("unit", "p", Variant(m_tiles=2), 5.0)
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        cache = CompileCache(path)
        assert cache.read_only
        outcomes = Outcomes(cache)
        outcomes.put("unit", "p", Variant(m_tiles=4), 3.0)
        assert outcomes.get("unit", "p") == {"m tiles 2": 5.0, "m tiles 4": 3.0}
        assert path.read_bytes() == before
    finally:
        path.chmod(0o644)


def test_a_state_saved_behind_a_slow_memory_is_not_restored_on_a_fast_one():
    from firmware.bursts import DramLatency

    graph = load_onnx(model_path(NAME), allow_cpu_fallback=True)
    slow = AdaptiveRuntime(NPUDriver(GoldenDevice(CONFIGS["default"],
                                                  dram_latency=DramLatency(64, 64))),
                           graph, AdaptiveConfig(), dram_latency=DramLatency(64, 64))
    state = slow.state()
    fast = AdaptiveRuntime(NPUDriver(GoldenDevice(CONFIGS["default"])), graph,
                           AdaptiveConfig(), state=state)
    ignored = _events(fast, "state-ignored")
    assert ignored and "memory latency" in ignored[0].detail
