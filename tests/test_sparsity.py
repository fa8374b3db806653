"""Sparsity variants: the skipped-element graph, its guard, input statistics, and the
adaptive runtime serving it with guard failures mid-stream (golden model).

Every served result is compared with the reference interpreter of the original
graph; a guard that lets a nonzero element through, or a bias fold that is off,
shows as a mismatch.
"""

import numpy as np
import pytest

from firmware.config import CONFIGS
from host.adaptive import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.faults import corrupt_requant
from host.adaptive.input_stats import RangeProfile, ZeroProfile, clamped_nodes, gemm_inputs
from host.adaptive.sparsity import SparsityConfig, sparse_graph
from host.cli import model_path
from host.compiler import compile_model
from host.compiler.compile import SharedConsts
from host.compiler.plan import simplify
from host.datasets import class_mix_stream
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.ir import Requant
from host.onnx_import import load_onnx
from host.reference import run_reference

ALL = {c: 1.0 for c in range(10)}


def _graph(name):
    return simplify(load_onnx(model_path(name)))[0]


def _digits(n, seed):
    return [s.x.reshape(1, 64).astype(np.float32) for s in class_mix_stream(n, [ALL], seed)]


def test_gemm_inputs_are_the_inputs_only_gemms_read():
    assert [(s.input, s.gemms, s.k, s.zero) for s in gemm_inputs(_graph("mlp"))] == \
        [("input", ("fc1",), 64, -128)]
    # The MoE's input feeds the gate and every expert inside the branches.
    (moe,) = gemm_inputs(_graph("moe"))
    assert len(moe.gemms) == 5
    # A convolution reads the cnn's input: no GEMM input to skip.
    assert gemm_inputs(_graph("cnn")) == []


@pytest.mark.parametrize("name", ["mlp", "moe", "early_exit"])
def test_sparse_graph_equals_the_original_where_the_skipped_elements_are_zero(name, seed):
    g = _graph(name)
    (src,) = gemm_inputs(g)
    rng = np.random.default_rng(seed)
    skip = sorted(rng.choice(64, size=int(rng.integers(1, 40)), replace=False).tolist())
    sg = sparse_graph(g, src, skip)
    keep = np.setdiff1d(np.arange(64), skip)
    for x in _digits(8, seed):
        x = x.copy()
        x[0, skip] = 0.0  # quantizes to the zero point
        x[0, keep[:4]] = rng.random(4)  # and something elsewhere
        want = run_reference(g, {"input": x})
        got = run_reference(sg, {"input": x[:, keep]})
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v)


def test_sparse_graph_refuses_an_improper_skip_set():
    g = _graph("mlp")
    (src,) = gemm_inputs(g)
    for skip in ([], list(range(64)), [64]):
        with pytest.raises(ValueError):
            sparse_graph(g, src, skip)


def test_zero_profile_picks_whole_tiles_that_hold_together():
    g = _graph("mlp")
    (src,) = gemm_inputs(g)
    p = ZeroProfile(src, window=10)
    for i in range(10):
        v = np.full(64, 5, np.int8)
        v[:8] = -128  # always zero: one tile
        v[8:16] = -128 if i < 8 else 3  # zero in 80 % of the inputs
        p.observe(v)
    assert p.tile_rates(8)[:3].tolist() == [1.0, 0.8, 0.0]
    assert p.skip_set(8, 0.9) == (tuple(range(8)), 1.0)
    assert p.skip_set(8, 0.75) == (tuple(range(16)), 0.8)
    assert p.hit_rate(range(16)) == 0.8


def test_range_profile_measures_values_before_the_clamp():
    # Every ReLU of the bundled models is the int8 saturation of its requantization
    # (output zero point -128): there is no clamp narrower than int8 to drop.
    for name in ("mlp", "cnn", "moe", "early_exit"):
        assert clamped_nodes(_graph(name)) == []
    g, open_fc2 = _graph("mlp"), _graph("mlp")
    for graph in (g, open_fc2):
        rq = graph.node("fc1").requant  # a ReLU above the zero point
        graph.node("fc1").requant = Requant(rq.mult, rq.shift, rq.zp, lo=-120)
    fc1, fc2 = g.node("fc1"), g.node("fc2")
    rq = fc2.requant
    fc2.requant = Requant(rq.mult, rq.shift, rq.zp, hi=126)
    assert clamped_nodes(g) == [fc1, fc2]
    rp = RangeProfile(g)
    before_clamp = []  # fc2's values with no clamp: what the profile must have seen
    for x in _digits(16, 0):
        env = run_reference(g, {"input": x}, keep_all=True)
        rp.observe(env)
        before_clamp.append(run_reference(open_fc2, {"input": x}, keep_all=True)[fc2.outputs[0]])
    rep = rp.report()["clamps"]
    # fc1's values before the clamp reach the saturation (-128): the clamp acts.
    assert rep["fc1"]["observed"][0] == -128 and "fc1" not in rp.identity()
    hi = int(np.max(before_clamp))
    assert rep["fc2"]["observed"] == [int(np.min(before_clamp)), hi]
    assert ("fc2" in rp.identity()) == (hi <= 126)


def _runtime(name, sparsity, **kw):
    rt = AdaptiveRuntime(NPUDriver(GoldenDevice(CONFIGS["default"])), load_onnx(model_path(name)),
                         AdaptiveConfig(async_compile=False, sparsity=sparsity, **kw))
    rt.load()
    return rt


def _kinds(rt, kind):
    return [e for e in rt.events if e.kind == kind]


@pytest.mark.parametrize("name", ["mlp", "moe"])
def test_guard_failures_mid_stream_give_only_reference_results(name, seed):
    # The MoE's five GEMMs read the input (gate and experts): every switch between
    # the variant and the generic plan moves their tags between two addresses.
    # (min_hit 0.5: a guard failing on a third of the inputs keeps its variant)
    rt = _runtime(name, SparsityConfig(window=8, warmup=8, min_hit=0.5, settle=0))
    xs = _digits(40, seed)
    # Column 0 of every image row stays zero, so a variant skipping it is
    # proposed, validated and kept; from input 18 on, every third input lights one
    # of those pixels: the guard must fail and the generic plan answer.
    for i, x in enumerate(xs):
        np.maximum(x, 0.1, out=x)  # no pixel is zero but column 0
        x[0, ::8] = 0.0
        if i >= 18 and i % 3 == 0:
            x[0, 8 * (i % 8)] = 0.7
    results = [rt.run({"input": x}) for x in xs]
    for x, r in zip(xs, results, strict=True):
        want = run_reference(rt.graph, {"input": x})
        np.testing.assert_array_equal(r.outputs["logits"], want["logits"])
        assert r.checked
    assert _kinds(rt, "sparsity-planned") and _kinds(rt, "sparsity-validated")
    failed = _kinds(rt, "guard-failed")
    assert failed and all("not the zero point" in e.detail for e in failed)
    fast = [r for r in results if r.model is not None and "@sparse" in r.model.graph.name]
    assert 0 < len(fast) < len(results)
    rep = rt.report()["sparsity"]
    assert rep["fast_path"] == len(fast)
    if name == "mlp":
        # On the variant, the GEMM loads fewer weight tiles: fewer cycles than the
        # generic plan's warm runs. (The MoE's measurement mixes its branches.)
        trial = rep["trials"][0]
        assert trial["verdict"] == "kept" and trial["cycles"] < trial["generic_cycles"]


def test_a_guard_that_stops_holding_drops_the_variant(seed):
    rt = _runtime("mlp", SparsityConfig(window=8, warmup=8, min_hit=0.9, settle=0))
    xs = _digits(40, seed)
    for i, x in enumerate(xs):
        np.maximum(x, 0.1, out=x)  # no pixel is zero ...
        x[0, ::8] = 0.0 if i < 20 else 0.5  # ... but column 0, until it lights up
    results = [rt.run({"input": x}) for x in xs]
    assert all(r.checked for r in results)
    (kept,) = _kinds(rt, "sparsity-kept")
    assert kept.inference < 20
    (reverted,) = _kinds(rt, "sparsity-reverted")
    assert "the guard held on" in reverted.detail
    # Nothing is zero after the change: the rest runs on the generic plan.
    assert rt.sparse.variant is None
    assert all("@sparse" not in r.model.graph.name for r in results[reverted.inference:])


def test_a_wrong_variant_is_rolled_back_in_shadow(seed, monkeypatch):
    import host.adaptive.sparsity as sp

    real = sp.sparse_graph

    def broken(graph, source, skip):
        g = real(graph, source, skip)
        for _s, n in g.walk():
            if n.name in source.gemms:
                n.bias = (n.bias + 1000).astype(np.int32)  # a wrong bias fold
        return g

    monkeypatch.setattr(sp, "sparse_graph", broken)
    rt = _runtime("mlp", SparsityConfig(window=8, warmup=8, settle=0), check=False)
    xs = _digits(24, seed)
    for x in xs:
        x[0, ::8] = 0.0
    results = [rt.run({"input": x}) for x in xs]
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_array_equal(r.outputs["logits"],
                                      run_reference(rt.graph, {"input": x})["logits"])
    # Each proposal fails its first run (the last may not have run yet) and is
    # never proposed again on the plan it was built for.
    rollbacks, planned = _kinds(rt, "rollback"), _kinds(rt, "sparsity-planned")
    assert rollbacks and len(planned) - 1 <= len(rollbacks) <= len(planned)
    assert not _kinds(rt, "sparsity-validated") and rt.sparse.fast == 0
    assert len(rt.sparse.refused) == len(rollbacks)


def test_a_variant_shares_the_generic_constants_it_does_not_change():
    g = _graph("mlp")
    hw = CONFIGS["default"]
    generic = compile_model(g, hw, [["fc1", "fc2"]], simplified=True)
    (src,) = gemm_inputs(g)
    tail_at = 1 << 16
    v = compile_model(sparse_graph(g, src, range(8)), hw, [["fc1", "fc2"]], simplified=True,
                      share_consts=SharedConsts(generic.place, tail_at))
    same, changed = v.place.blobs["fc2"], v.place.blobs["fc1"]
    mine = generic.place.blobs
    assert (same.dram, same.slot, same.sp) == (mine["fc2"].dram, mine["fc2"].slot,
                                               mine["fc2"].sp)
    # fc1 lost a K-tile: its blob goes beyond the generic's constants and arena, into
    # the generic fc1's tag slot (the tag names the address: it misses once a switch).
    assert changed.dram >= tail_at and changed.slot == mine["fc1"].slot
    assert len(changed.data) < len(mine["fc1"].data)
    assert v.place.weights_bytes == generic.place.weights_bytes


@pytest.mark.rtl
@pytest.mark.parametrize("name", ["mlp", pytest.param("moe", marks=pytest.mark.slow)])
def test_sparsity_variants_on_rtl_equal_the_golden_model(name, seed):
    from verif.fastsim import run_scenario

    run_scenario("verif.model_scenarios:sparsity_vs_golden", "default", seed=seed,
                 extra_env={"NPU_MODEL": name, "NPU_INPUTS": "36"})


def test_a_wrong_stored_variant_is_evicted(seed):
    rt = _runtime("mlp", SparsityConfig(window=8, warmup=8, settle=0))
    real = rt.cache.get_or_compile
    evicted = []

    def served_broken(graph, plan, config, specialization="", compile_fn=None):
        model, _ = real(graph, plan, config, specialization, compile_fn)
        if "sparse" in specialization:  # as if a stored entry were damaged
            model = corrupt_requant(model, model.units[0].id)
            return model, True
        return model, False

    rt.cache.get_or_compile = served_broken
    rt.cache.evict = lambda *a, **kw: evicted.append(kw["specialization"]) or True
    xs = _digits(16, seed)
    for x in xs:
        x[0, ::8] = 0.0
    for x in xs:
        r = rt.run({"input": x})
        np.testing.assert_array_equal(r.outputs["logits"],
                                      run_reference(rt.graph, {"input": x})["logits"])
    assert _kinds(rt, "cache-evicted") and _kinds(rt, "rollback")
    assert evicted and all(k.startswith("sparse:input:") for k in evicted)
