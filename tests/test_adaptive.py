"""The adaptive runtime on the golden NPU: fusion, hot swap, validation, rollback,
de-fusion, the compile cache across runtimes, and its refusals.

The golden model is deterministic and takes the RTL's cycles where it says exact,
so the cycle figures asserted here are properties of the plans, not timings.
tests/test_adaptive_rtl.py runs the same loop on the Verilator NPU.
"""

import copy
from concurrent.futures import Future

import numpy as np
import pytest

from firmware import asm
from firmware.config import CONFIGS
from host.adaptive import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.cache import CompileCache
from host.adaptive.changes import PlanState
from host.adaptive.faults import corrupt_requant
from host.adaptive.fusion import locality, refusal
from host.adaptive.timeline import attach_timeline
from host.adaptive.units import QUARANTINED, UnitGraph
from host.cli import model_path
from host.compiler import CompileError, compile_model
from host.compiler.cost import CostModel
from host.datasets import class_mix_stream
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import Session

ALL = {c: 1.0 for c in range(10)}


def _runtime(name, config=None, **kw):
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    rt = AdaptiveRuntime(drv, load_onnx(model_path(name)),
                         config or AdaptiveConfig(async_compile=False), **kw)
    rt.load()
    return rt


def _stream(rt, n, phases, seed):
    inp = rt.graph.inputs[0]
    shape = rt.graph.tensors[inp].shape
    for s in class_mix_stream(n, phases, seed):
        yield {inp: s.x.reshape(shape).astype(np.float32)}


def test_mlp_fuses_validates_and_gets_faster(seed):
    rt = _runtime("mlp")
    results = [rt.run(x) for x in _stream(rt, 24, [ALL], seed)]
    assert all(r.checked for r in results)
    kinds = [e.kind for e in rt.events]
    assert kinds[:4] == ["fuse-planned", "compiled", "swapped-in", "merge-validated"], kinds
    assert rt.swaps >= 1 and rt.rollbacks == 0
    first, last = results[0].plan, results[-1].plan
    assert len(last) < len(first)
    # The merged plan keeps the hidden activation on chip: fewer DRAM bytes and
    # cycles per inference on the same input than the initial plan.
    x = next(_stream(rt, 1, [ALL], seed))
    merged = rt.run(x)
    base = _runtime("mlp", AdaptiveConfig(async_compile=False, warmup=10**9)).run(x)
    assert merged.counters["dram_write_bytes"] < base.counters["dram_write_bytes"]
    assert merged.cycles < base.cycles
    for u in rt.units.active():
        assert any(e.kind == "validated" for e in u.history) or u.kind == "original"


def test_every_result_equals_the_reference(seed):
    rt = _runtime("moe")
    for x in _stream(rt, 30, [ALL], seed):
        r = rt.run(x)
        want = run_reference(rt.graph, x)
        for k, v in want.items():
            assert np.array_equal(r.outputs[k], v)


def test_injected_fault_rolls_back_and_quarantines(seed):
    rt = _runtime("mlp", fault=corrupt_requant)
    xs = list(_stream(rt, 20, [ALL], seed))
    for x in xs:
        r = rt.run(x)
        want = run_reference(rt.graph, x)
        for k, v in want.items():
            assert np.array_equal(r.outputs[k], v), "a wrong result escaped validation"
    kinds = [e.kind for e in rt.events]
    assert "rollback" in kinds, kinds
    bad = [u for u in rt.units.units.values() if u.state == QUARANTINED]
    assert len(bad) == 1 and "shadow validation failed" in bad[0].history[-1].reason
    assert [u.id for u in rt.model.units] == [u.id for u in rt.units.active()]
    after = kinds.index("rollback") + 1
    assert not [e for e in rt.events[after:]
                if e.kind == "fuse-planned" and e.units == bad[0].parts]


def test_defusion_after_phase_shift(seed):
    """An expert merged while hot is split back once its phase is over."""
    cfg = AdaptiveConfig(async_compile=False, fuse_threshold=0.25, defuse_threshold=0.1,
                         settle=8)
    rt = _runtime("moe", cfg)
    stream = list(_stream(rt, 120, [{0: 1, 1: 1, 2: 1}, {7: 1, 8: 1, 9: 1}], seed))
    for x in stream:
        rt.run(x)
    splits = [e for e in rt.events if e.kind == "defuse-planned"]
    assert splits, [str(e) for e in rt.events]
    splits = [e for e in splits if "cold" in e.detail]  # (not bets that stopped paying)
    # A split planned at the last inference has not landed yet; the others have.
    landed = [e.units[0] for e in splits if e.inference < rt.n]
    assert landed
    for uid in landed:
        assert any(e.kind == "swapped-out" for e in rt.units[uid].history)


def test_cache_makes_a_second_runtime_warm(tmp_path, seed):
    cache_file = tmp_path / "compile.sqlite"
    xs = None
    plans = []
    for _ in range(2):
        cache = CompileCache(cache_file)
        rt = _runtime("mlp", cache=cache)
        xs = xs or list(_stream(rt, 16, [ALL], seed))
        for x in xs:
            rt.run(x)
        plans.append(rt.report()["plan"])
        stats = cache.stats()
        cache.close()
    assert plans[0] == plans[1]
    assert stats["compiles"] == 0 and stats["hits"] >= 2, stats


def test_async_compile_swaps_without_blocking(seed):
    rt = _runtime("mlp", AdaptiveConfig(async_compile=True))
    xs = list(_stream(rt, 30, [ALL], seed))
    for x in xs[:8]:
        rt.run(x)
    rt.wait_idle()
    for x in xs[8:]:
        assert rt.run(x).checked
    assert rt.swaps >= 1
    rt.close()


@pytest.mark.parametrize("name", ["cnn", "moe"])
def test_golden_timeline_predicts_each_unit(name, seed):
    """Before the device runs a plan, the cost model has each unit's golden cycles
    (exact on the golden backend); a unit inside a branch the zero-input run did not
    take is predicted by the linear model calibrated on the others' timelines."""
    model = attach_timeline(compile_model(load_onnx(model_path(name)), CONFIGS["default"]))
    works = {uid: r.resources["work"] for uid, r in model.regions.items()}
    cost = CostModel(model.config)
    cost.calibrate(model)
    session = Session(NPUDriver(GoldenDevice(CONFIGS["default"])), model, check=False)
    session.load()
    inp = model.graph.inputs[0]
    shape = model.graph.tensors[inp].shape
    warm: dict[int, list] = {}
    for s in class_mix_stream(30, [ALL], seed):
        for t in session.run({inp: s.x.reshape(shape).astype(np.float32)}).trace:
            if not t.tag_misses:
                warm.setdefault(t.region, []).append(t.cycles)
    timed = [uid for uid, w in works.items() if "timeline" in w]
    assert timed and set(warm) >= set(timed)
    for uid, cycles in warm.items():
        predicted = cost.predict(works[uid])
        if uid in timed:
            assert set(cycles) == {predicted}, (uid, predicted, cycles)
        else:
            assert abs(predicted - np.mean(cycles)) < 0.1 * np.mean(cycles), (uid, predicted)
    if name == "moe":
        assert len(timed) < len(works)  # the experts the zero input did not route to


def test_a_plan_that_faults_on_the_golden_model_is_refused():
    """The timeline run doubles as a check: a compiled plan whose program faults
    (here a weight read outside its partition) is a compile error, never swapped in."""
    model = compile_model(load_onnx(model_path("mlp")), CONFIGS["default"])
    broken = copy.copy(model)
    # the first GEMV's weight rows (its gemm's scratchpad operand)
    broken.source = model.source.replace("li r8, 0\n", "li r8, 100000\n", 1)
    assert broken.source != model.source
    broken.program = asm.assemble(broken.source)
    with pytest.raises(CompileError, match="faults on the golden model: NPU error"):
        attach_timeline(broken)


def test_runtime_cost_model_is_right_before_it_measures(seed):
    rt = _runtime("moe")
    for x in _stream(rt, 16, [ALL], seed):
        rt.run(x)
    before, after = rt.cost_error()
    assert before < 0.03 and after < 0.03, (before, after)


def test_refusals():
    rt = _runtime("moe")
    units = rt.units
    # gate (1) and an expert's first layer (2) live in different scopes
    assert "crosses a branch" in refusal(units, (1, 2), {})
    assert "repeats" in refusal(units, (2, 2), {})
    assert "not in the running plan" in refusal(units, (2, 99), {})
    assert refusal(units, (2, 3), {}) is None
    assert locality(rt.model, units, (2, 3)) == (64, 2)  # 32 B written + read once
    assert locality(rt.model, units, (1,)) == (0, 0)


def test_compile_refusal_is_remembered(seed, monkeypatch):
    """A merge the compiler refuses is reported with its reason and not retried."""
    from host.adaptive import cache
    from host.compiler.plan import CompileError

    def refuse(graph, config, units=None, **kw):
        if units is not None and len(units) < 2:  # mlp: the two layers merged
            raise CompileError("the merged unit's working set does not fit the partition")
        return compile_model(graph, config, units, **kw)

    monkeypatch.setattr(cache, "compile_model", refuse)  # what the runtime's cache calls
    rt = _runtime("mlp")
    for x in _stream(rt, 24, [ALL], seed):
        assert rt.run(x).checked
    refused = [e for e in rt.events if e.kind == "compile-refused"]
    assert len(refused) == 1 and "does not fit" in refused[0].detail
    assert rt.swaps == 0


def test_unit_graph_ids_are_stable():
    m = compile_model(load_onnx(model_path("moe")), CONFIGS["default"], fuse=False)
    a, b = UnitGraph(m), UnitGraph(m)
    ua, ub = a.merged((4, 5), 0, "x"), b.merged((4, 5), 7, "y")
    assert ua.id == ub.id and ua.parts == (4, 5)
    assert a.merged((4, 5), 1, "again") is ua
    plan = a.plan_with(ua)
    assert [s.id for s in plan] == [1, 2, 3, ua.id, 6, 7, 8, 9]
    a.adopt(plan, 1, "test")
    assert [s.id for s in a.plan_without(ua)] == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_precompiled_cache_serves_the_runtime(seed):
    """`npu precompile` fills exactly the plans the runtime asks for (same region ids)."""
    from host.adaptive.cache import precompile

    cache = CompileCache(None)
    base = compile_model(load_onnx(model_path("moe")), CONFIGS["default"])
    precompile(cache, base.graph, CONFIGS["default"])
    filled = cache.compiles
    rt = _runtime("moe", cache=cache)
    for x in _stream(rt, 40, [{0: 1, 1: 1, 2: 1}], seed):
        rt.run(x)
    assert rt.swaps >= 1
    assert cache.compiles == filled, "the runtime compiled a plan precompile should have made"


# ---- speculative merges ------------------------------------------------------------------------


def test_hoisting_a_branch_keeps_the_results(seed):
    from host.adaptive.speculate import hoist, leaves

    g = compile_model(load_onnx(model_path("moe")), CONFIGS["default"]).graph
    found = leaves(g)
    assert [lf.npu_nodes for lf in found] == [
        (f"e{k}_fc1", f"e{k}_fc2") for k in range(4)]
    assert found[3].path == (("route0", False), ("route1", False), ("route2", False))
    rng = np.random.default_rng(seed)
    for lf in found:
        h = hoist(g, lf)
        assert set(lf.npu_nodes) <= {n.name for n in h.nodes}
        for _ in range(5):
            x = {"input": rng.random((1, 64), dtype=np.float32) * 16}
            want, got = run_reference(g, x), run_reference(h, x)
            for k in want:
                assert np.array_equal(want[k], got[k])


def _bet_events(rt):
    return [e for e in rt.events if e.kind.startswith("speculate")]


def test_speculation_bets_on_the_hot_expert_and_pays_on_hits(seed):
    """Digits of one class (6) all route to expert 0: the runtime hoists that expert
    into the gate's unit; a hit then costs fewer cycles than the unfused plan on the
    same input, and every result (hits and misses) equals the reference."""
    rt = _runtime("moe")
    xs = list(_stream(rt, 40, [{6: 1}], seed))
    for x in xs:
        r = rt.run(x)
        assert r.checked
    kinds = [e.kind for e in _bet_events(rt)]
    assert "speculate-planned" in kinds and "speculate-validated" in kinds, \
        [str(e) for e in rt.events]
    spec = rt.report()["speculation"]
    assert spec["bets"] > 0
    # Compare a hit with the unfused plan on the same input (deterministic model).
    bet_model = next(r.model for r in [rt.run(x) for x in xs[-6:]]
                     if any(u.id >= 16384 for u in r.model.units))
    base = compile_model(rt.graph, CONFIGS["default"], simplified=True)
    hits = []
    for model in (base, bet_model):
        from host.runtime import Session

        s = Session(NPUDriver(GoldenDevice(CONFIGS["default"])), model, check=True)
        s.load()
        for x in xs[:3]:
            s.run(x)  # warm the tags
        hits.append([s.run(x) for x in xs[-5:]])
    compared = 0
    for a, b in zip(*hits, strict=True):
        if len(b.trace) == 1:  # a hit: only the speculative region ran
            assert b.cycles < a.cycles
            compared += 1
    assert compared, "no hit among the inputs compared"  # (class 6 always hits)


def test_misspeculation_falls_back_and_a_losing_bet_is_split(seed):
    """After the shift the bet loses: the fallback path gives correct results, the
    runtime counts the mis-speculations, splits the unit and raises its threshold."""
    rt = _runtime("moe")
    stream = list(_stream(rt, 90, [{6: 1}, ALL], seed))
    for x in stream:
        r = rt.run(x)
        for k, v in run_reference(rt.graph, x).items():
            assert np.array_equal(r.outputs[k], v)
    spec = rt.report()["speculation"]
    assert spec["misspeculations"] > 0
    splits = [e for e in rt.events if e.kind == "defuse-planned"
              and "bet stops paying" in e.detail]
    assert splits, [str(e) for e in rt.events]
    assert spec["threshold"] > AdaptiveConfig().spec_threshold


def test_a_broken_speculative_unit_is_rolled_back(seed):
    rt = _runtime("moe", fault=corrupt_requant)
    for x in _stream(rt, 30, [{6: 1}], seed):
        r = rt.run(x)
        for k, v in run_reference(rt.graph, x).items():
            assert np.array_equal(r.outputs[k], v)
    assert rt.rollbacks >= 1
    assert any(u.state == QUARANTINED and u.kind == "speculative"
               for u in rt.units.units.values())


# ---- the specializer in the loop -----------------------------------------------------------------


def test_batches_get_a_guarded_batch_variant(seed):
    rt = _runtime("mlp")
    xs = list(_stream(rt, 48, [ALL], seed))
    per_inf = []
    for i in range(0, 48, 8):
        rs = rt.run_batch(xs[i:i + 8])
        assert len(rs) == 8 and all(r.checked for r in rs)
        for r, x in zip(rs, xs[i:i + 8], strict=True):
            for k, v in run_reference(rt.graph, x).items():
                assert np.array_equal(r.outputs[k], v)
        per_inf.append(rs[0].cycles)
    kinds = [e.kind for e in rt.events]
    assert "specialized" in kinds and "specialize-validated" in kinds, kinds
    assert rs[0].plan == ("batch8",)
    assert per_inf[-1] * 2 < per_inf[0], per_inf  # weight tiles serve 8 rows
    # A batch the guard rejects (another size of one input) runs on the generic plan.
    bad = [dict(x) for x in xs[:8]]
    bad[3] = {k: v.reshape(-1) for k, v in bad[3].items()}
    with pytest.raises(ValueError):
        rt.run_batch(bad)  # the generic plan refuses the malformed input too
    assert any(e.kind == "guard-failed" for e in rt.events)
    # Single inferences after batches: the generic plan comes back, still correct.
    r = rt.run(xs[0])
    assert r.checked and r.plan != ("batch8",)


class _HeldPool:
    """A compile pool whose jobs finish only when the test says so."""

    def __init__(self):
        self.jobs = []

    def submit(self, fn, *args):
        fut = Future()
        self.jobs.append((fut, fn, args))
        return fut

    def release(self):
        for fut, fn, args in self.jobs:
            fut.set_result(fn(*args))
        self.jobs = []

    def shutdown(self, wait=True):
        pass


def test_a_fusion_compiled_while_batches_run_lands_and_the_variant_follows(seed):
    """The batch variant is built on the plan of its time; a fusion whose compile
    finishes later still lands (on generic runs) and the variant is rebuilt on it."""
    rt = _runtime("mlp", AdaptiveConfig(async_compile=True))
    rt._pool.shutdown()
    rt._pool = pool = _HeldPool()
    xs = list(_stream(rt, 40, [ALL], seed))
    rt.run_batch(xs[:8])  # singly: the profile plans a fusion, its compile is held
    assert [e.kind for e in rt.events] == ["fuse-planned"] and pool.jobs
    old = rt.run_batch(xs[8:16])  # the variant of the unfused plan serves this batch
    assert old[0].plan == ("batch8",) and rt.batches.variants[8].plan == (1, 2)
    pool.release()
    landing = rt.run_batch(xs[16:24])  # generic runs: the fusion lands and validates
    assert all(r.plan == (1090,) for r in landing[1:]), [r.plan for r in landing]
    assert rt.changes.state is PlanState.SERVING
    new = rt.run_batch(xs[24:32])
    assert new[0].plan == ("batch8",) and rt.batches.variants[8].plan == (1090,)
    rebuilt = [e for e in rt.events if e.kind == "specialized"][-1]
    assert rebuilt.detail.endswith("rebuilt: the plan is now [1090]"), rebuilt.detail
    assert all(r.checked for r in old + landing + new)
    assert new[0].cycles < old[0].cycles, (new[0].cycles, old[0].cycles)


def test_routed_batches_bet_on_the_hot_branches(seed):
    """The MoE cannot be batched as is (per-input routing): the runtime builds a
    routed batch variant, first on every expert, then on the experts that took
    route_cover of the inputs; inputs routed elsewhere run alone on the generic
    plan. Every result equals the reference, and batching pays."""
    rt = _runtime("moe")
    xs = list(_stream(rt, 96, [{0: 1, 1: 1, 6: 1, 7: 1}, ALL], seed))
    per_inf = []
    for i in range(0, 96, 8):
        rs = rt.run_batch(xs[i:i + 8])
        for r, x in zip(rs, xs[i:i + 8], strict=True):
            assert r.checked
            for k, v in run_reference(rt.graph, x).items():
                assert np.array_equal(r.outputs[k], v)
        per_inf.append(np.mean([r.cycles for r in rs]))
    specialized = [e.detail for e in rt.events if e.kind == "specialized"]
    assert specialized[0].startswith("route8[e0_fc1,e1_fc1,e2_fc1,e3_fc1]"), specialized
    # classes 0, 1, 6, 7 go to experts 0 and 1: the bet narrows to those two
    assert any(d.startswith("route8[e0_fc1,e1_fc1]") for d in specialized), specialized
    base = _runtime("moe", AdaptiveConfig(async_compile=False, warmup=10**9))
    single = np.mean([base.run(x).cycles for x in xs[:16]])
    assert min(per_inf) * 1.5 < single, (per_inf, single)
    # after the shift to every class, inputs miss the two-expert bet: counted, answered
    assert rt.misspeculations > 0


def test_a_saved_state_starts_the_next_run_warm(seed):
    cache = CompileCache(None)
    rt = _runtime("mlp", cache=cache)
    xs = list(_stream(rt, 16, [ALL], seed))
    for x in xs:
        rt.run(x)
    state = rt.state()
    plan = rt.report()["plan"]
    assert state["merged"] == [[1, 2]] and plan == [1090]
    compiles = cache.compiles
    warm = _runtime("mlp", cache=cache, state=state)
    assert [e.kind for e in warm.events] == ["restored"]
    # The restored plan is the first install, not a swap.
    assert [e.kind for e in warm.units[1090].history] == ["created", "restored"]
    assert [e.kind for e in warm.units[1].history] == ["created", "set-aside"]
    rep = warm.report()
    assert rep["swaps"] == 0 and rep["restored_plan"] == [1090]
    first = warm.run(xs[0])
    assert first.plan == (1090,) and first.checked
    assert cache.compiles == compiles  # the plan came from the cache
    # A state of another model is ignored, with the reason.
    other = _runtime("moe", state=state)
    assert [e.kind for e in other.events] == ["state-ignored"]
    assert other.events[0].detail == "saved for another model"
    # So is one measured under other hardware timing (an older RTL revision, whose
    # CAPS are the same), or saved before states recorded the timing.
    for timing in ("0123456789abcdef", None):
        old = _runtime("mlp", cache=cache, state={**state, "timing": timing})
        assert [(e.kind, e.detail) for e in old.events] == [
            ("state-ignored", "saved for another hardware timing revision")]
        assert old.report()["restored_plan"] != [1090]
