"""The adaptive runtime's profiler: decayed chain counts, edges, unit statistics.

The efficient (lazily decayed) profiler is checked against a brute-force
recount of the whole observed history with explicit ``decay**age`` weights.
"""

import json
import math
import random
from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest

from firmware.golden import TraceRecord
from host.adaptive.profiler import STAT_FIELDS, Profiler, ProfilerConfig, UnitStats

# -- brute-force reference ---------------------------------------------------------------


def _matches(cond: dict | None, feats: dict | None) -> bool:
    """Does an inference with ``feats`` belong to the condition ``cond``?"""
    if not cond:
        return True
    feats = feats or {}
    if len(cond) == 1:
        ((name, value),) = cond.items()
        return name in feats and feats[name] == value
    return cond == feats


class Brute:
    """Recount everything from the full history, weighting inference i by decay**age."""

    def __init__(self, history, decay, max_chain):
        self.history, self.decay, self.max_chain = history, decay, max_chain
        n = len(history)
        self.weights = [decay ** (n - 1 - i) for i in range(n)]
        self.norm = sum(self.weights)

    def chains(self):
        out = defaultdict(float)
        for (trace, _recs, _feats), w in zip(self.history, self.weights, strict=True):
            for length in range(2, self.max_chain + 1):
                for s in range(len(trace) - length + 1):
                    out[tuple(trace[s:s + length])] += w
        return dict(out)

    def successors(self, a, cond=None):
        counts = defaultdict(float)
        for (trace, _recs, feats), w in zip(self.history, self.weights, strict=True):
            if _matches(cond, feats):
                for x, y in pairwise(trace):
                    if x == a:
                        counts[y] += w
        return dict(counts)

    def unit(self, uid):
        count, weight, sums = 0.0, 0.0, np.zeros(len(STAT_FIELDS))
        for (trace, recs, _feats), w in zip(self.history, self.weights, strict=True):
            for i, u in enumerate(trace):
                if u == uid:
                    count += w
                    if recs is not None:
                        r = recs[i]
                        weight += w
                        sums += w * np.array([r.cycles, r.macs, r.dram_read_bytes,
                                              r.dram_write_bytes, r.tag_hits, r.tag_misses,
                                              r.stall_cycles, r.busy_load, r.busy_store,
                                              r.busy_array, r.busy_vector, r.sp_conflicts],
                                             dtype=float)
        return count / self.norm, weight, (sums / weight if weight else sums)


def _record(rng: random.Random, region: int) -> TraceRecord:
    start = rng.randrange(10_000)
    return TraceRecord(region=region, start=start, end=start + rng.randrange(1, 500),
                       instructions=rng.randrange(50), macs=rng.randrange(20_000),
                       dram_read_bytes=rng.randrange(4096), dram_write_bytes=rng.randrange(1024),
                       tag_hits=rng.randrange(8), tag_misses=rng.randrange(8),
                       stall_cycles=rng.randrange(100), busy_load=rng.randrange(300),
                       busy_store=rng.randrange(300), busy_array=rng.randrange(300),
                       busy_vector=rng.randrange(300), sp_conflicts=rng.randrange(20))


def _random_stream(rng: random.Random, n: int, alphabet: int = 6):
    """Random traces (with repeats, so loops occur), some with records and features."""
    stream = []
    for _ in range(n):
        trace = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 11))]
        recs = [_record(rng, u) for u in trace] if rng.random() < 0.7 else None
        feats = rng.choice([None, {"g": rng.randrange(3)},
                            {"g": rng.randrange(3), "b": rng.randrange(2)}])
        stream.append((trace, recs, feats))
    return stream


def _feed(prof: Profiler, stream):
    for trace, recs, feats in stream:
        prof.observe(trace, recs, feats)


CONDITIONS = [None, {"g": 0}, {"g": 1}, {"g": 2}, {"b": 1}, {"g": 1, "b": 0}, {"g": 2, "b": 1}]


def _check_against_brute(prof: Profiler, stream, tol_abs: float, seed: int):
    cfg = prof.config
    ref = Brute(stream, cfg.decay, cfg.max_chain)
    want = ref.chains()
    got = prof.chains()
    for chain in set(want) | set(got):
        assert got.get(chain, 0.0) == pytest.approx(want.get(chain, 0.0), rel=1e-9, abs=tol_abs), \
            f"seed {seed}: chain {chain}"
        assert prof.chain_frequency(chain) == pytest.approx(
            want.get(chain, 0.0) / ref.norm, rel=1e-9, abs=tol_abs / ref.norm), f"seed {seed}"
    assert prof.chains(min_len=3).keys() == {c for c in got if len(c) >= 3}
    units = {u for trace, _r, _f in stream for u in trace}
    assert set(prof.units()) == units
    for uid in units:
        freq, weight, means = ref.unit(uid)
        st = prof.unit_stats(uid)
        assert prof.unit_frequency(uid) == pytest.approx(freq, rel=1e-9), f"seed {seed}"
        assert st.frequency == pytest.approx(freq, rel=1e-9)
        assert st.runs == sum(trace.count(uid) for trace, _r, _f in stream)
        assert st.samples == pytest.approx(weight, rel=1e-9, abs=1e-12)
        got_means = [getattr(st, name) for name in STAT_FIELDS]
        np.testing.assert_allclose(got_means, means, rtol=1e-9, err_msg=f"seed {seed}")
        for cond in CONDITIONS:
            counts = ref.successors(uid, cond)
            if cond and not counts:  # never seen under that condition: unconditioned
                counts = ref.successors(uid)
            total = sum(counts.values())
            got_succ = dict(prof.successors(uid, cond))
            if tol_abs:
                # Each count may be off by tol_abs: bound the error of count / total,
                # and skip sources so rare that the bound says nothing.
                if total < 1:
                    continue
                tol = tol_abs * (1 + len(set(counts) | set(got_succ))) / total
            else:
                tol = 1e-9
            for b in set(counts) | set(got_succ):
                want_p = counts.get(b, 0.0) / total if total else 0.0
                assert got_succ.get(b, 0.0) == pytest.approx(want_p, abs=tol), \
                    f"seed {seed}: edge {uid}->{b} | {cond}"


# -- tests -------------------------------------------------------------------------------


def test_hand_made_counts():
    # Three inferences with decay 0.5: ages 2, 1, 0 weigh 0.25, 0.5, 1.
    prof = Profiler(ProfilerConfig(decay=0.5, max_chain=3, min_count=0))
    for trace in [(1, 2, 3), (1, 2), (2, 3, 1, 2)]:
        prof.observe(trace)
    assert prof.chains() == pytest.approx({
        (1, 2): 0.25 + 0.5 + 1, (2, 3): 0.25 + 1, (1, 2, 3): 0.25,
        (3, 1): 1, (2, 3, 1): 1, (3, 1, 2): 1,
    })
    norm = 0.25 + 0.5 + 1
    assert prof.chain_frequency((1, 2)) == pytest.approx(1.0)
    assert prof.chain_frequency([2, 3]) == pytest.approx(1.25 / norm)
    assert prof.chain_frequency((9, 9)) == 0.0
    assert prof.unit_frequency(2) == pytest.approx((0.25 + 0.5 + 2) / norm)  # twice in the last
    assert prof.unit_frequency(3) == pytest.approx(1.25 / norm)
    # Transitions out of 2: to 3 at ages 2 and 0 (0.25 + 1); never elsewhere.
    assert prof.successors(2) == [(3, pytest.approx(1.0))]
    assert prof.edge_probability(3, 1) == pytest.approx(1.0)
    assert prof.edge_probability(1, 3) == 0.0
    # Chains only above a threshold.
    assert set(prof.chains(threshold=1.0)) == {(1, 2), (2, 3), (3, 1), (2, 3, 1), (3, 1, 2)}


def test_matches_brute_force(seed):
    rng = random.Random(seed)
    cfg = ProfilerConfig(window=rng.randrange(8, 40), decay=rng.uniform(0.8, 0.99),
                         max_chain=rng.randrange(2, 6), min_count=0)
    stream = _random_stream(rng, 200)
    prof = Profiler(cfg)
    _feed(prof, stream)
    _check_against_brute(prof, stream, tol_abs=0.0, seed=seed)


def test_matches_brute_force_with_pruning(seed):
    # With min_count > 0, a dropped chain that comes back restarts from zero: the
    # counts may differ from the exact ones by less than min_count (twice, to be safe).
    rng = random.Random(seed)
    cfg = ProfilerConfig(window=8, decay=0.7, max_chain=4, min_count=0.05)
    stream = _random_stream(rng, 200, alphabet=12)
    prof = Profiler(cfg)
    _feed(prof, stream)
    _check_against_brute(prof, stream, tol_abs=2 * cfg.min_count, seed=seed)
    # The automatic sweep (every `window` inferences; 200 is a multiple of 8) bounds
    # the table: nothing below min_count survives it.
    assert len(prof._chains) == len(prof.chains())
    assert sum(map(len, prof._edges[None].values())) == len(prof.edges())
    prof.observe([0, 1])
    prof.prune()
    assert all(v >= cfg.min_count for v in prof.chains().values())
    assert len(prof._chains) == len(prof.chains())


def test_window_keeps_last_traces():
    prof = Profiler(ProfilerConfig(window=5))
    traces = [tuple(range(i, i + 3)) for i in range(12)]
    for t in traces:
        prof.observe(t)
    assert prof.recent() == traces[-5:]
    assert prof.inferences == 12
    prof.observe([])  # an inference without NPU work still counts
    assert prof.recent() == [*traces[-4:], ()]
    assert prof.inferences == 13


def test_chains_longer_than_max_chain_not_counted():
    prof = Profiler(ProfilerConfig(max_chain=3, decay=1.0))
    prof.observe([1, 2, 3, 4, 5, 6])
    got = prof.chains()
    assert max(len(c) for c in got) == 3
    assert len(got) == 5 + 4  # 5 pairs, 4 triples
    assert prof.chain_count((1, 2, 3, 4)) == 0.0
    assert prof.chain_count((4, 5, 6)) == 1.0


def test_loops_count_per_occurrence():
    prof = Profiler(ProfilerConfig(decay=1.0, max_chain=4))
    prof.observe([1, 2, 1, 2, 1])
    assert prof.chain_count((1, 2)) == 2
    assert prof.chain_count((2, 1)) == 2
    assert prof.chain_count((1, 2, 1)) == 2
    assert prof.chain_count((2, 1, 2)) == 1
    assert prof.chain_count((1, 2, 1, 2)) == 1
    assert prof.unit_frequency(1) == 3.0
    assert prof.unit_stats(2).runs == 2
    prof.observe([7, 7, 7])  # a unit repeated back to back (a self loop)
    assert prof.chain_count((7, 7)) == 2
    assert prof.chain_count((7, 7, 7)) == 1
    assert prof.successors(7) == [(7, 1.0)]
    assert prof.unit_frequency(7) == pytest.approx(3 / 2)


def test_edge_probabilities_sum_to_one(seed):
    rng = random.Random(seed)
    prof = Profiler(ProfilerConfig(decay=0.9))
    _feed(prof, _random_stream(rng, 100))
    edges = prof.edges()
    assert edges
    per_source = defaultdict(float)
    for (a, _b), p in edges.items():
        assert 0 < p <= 1
        per_source[a] += p
    for a, total in per_source.items():
        assert total == pytest.approx(1.0), f"seed {seed}: source {a}"
        for cond in CONDITIONS[1:]:
            succ = prof.successors(a, cond)
            assert sum(p for _b, p in succ) == pytest.approx(1.0), f"seed {seed}"
            probs = [p for _b, p in succ]
            assert probs == sorted(probs, reverse=True)
            for b, p in succ:
                assert prof.edge_probability(a, b, cond) == pytest.approx(p)


def test_edges_conditioned_on_features(seed):
    # A gated model: 0 -> gate 1 -> expert 10+g -> 2, where the gate's outcome g is
    # the input feature. Conditioned on g the expert is certain; unconditioned it is
    # the decayed share of g in the stream.
    rng = random.Random(seed)
    decay = 0.9
    prof = Profiler(ProfilerConfig(decay=decay))
    gs = [rng.randrange(4) for _ in range(120)]
    for i, g in enumerate(gs):
        feats = {"g": g} if i % 2 else {"g": g, "batch": 1 + i % 3}
        prof.observe([0, 1, 10 + g, 2], features=feats)
    n = len(gs)
    share = defaultdict(float)
    for i, g in enumerate(gs):
        share[g] += decay ** (n - 1 - i)
    total = sum(share.values())
    for g in range(4):
        if g not in share:
            continue
        assert prof.edge_probability(1, 10 + g, {"g": g}) == pytest.approx(1.0), f"seed {seed}"
        for other in range(4):
            if other != g:
                assert prof.edge_probability(1, 10 + other, {"g": g}) == 0.0
        assert prof.edge_probability(1, 10 + g) == pytest.approx(share[g] / total)
        assert prof.successors(1, {"g": g}) == [(10 + g, pytest.approx(1.0))]
    # The full feature tuple is a condition of its own.
    g_last, batch_last = gs[-2], 1 + (n - 2) % 3
    assert prof.edge_probability(1, 10 + g_last, {"g": g_last, "batch": batch_last}) == \
        pytest.approx(1.0)
    # A condition never seen falls back to the unconditioned statistics.
    assert prof.edge_probability(1, 10 + gs[-1], {"g": 99}) == \
        pytest.approx(prof.edge_probability(1, 10 + gs[-1]))
    # Features don't affect unconditioned edges that are certain anyway.
    assert prof.edge_probability(0, 1, {"g": gs[-1]}) == pytest.approx(1.0)
    assert prof.edge_probability(0, 1) == pytest.approx(1.0)


def test_forget(seed):
    rng = random.Random(seed)
    prof = Profiler(ProfilerConfig(decay=0.9, min_count=0))
    stream = _random_stream(rng, 60, alphabet=5)
    _feed(prof, stream)
    before = prof.chains()
    gone = {1, 3}
    prof.forget(gone)
    after = prof.chains()
    assert after == {c: v for c, v in before.items() if gone.isdisjoint(c)}
    assert all(gone.isdisjoint(edge) for edge in prof.edges())
    for uid in gone:
        with pytest.raises(KeyError):
            prof.unit_stats(uid)
        assert prof.unit_frequency(uid) == 0.0
        assert prof.successors(uid) == []
        assert prof.successors(uid, {"g": 0}) == []
    for (a, b), _p in prof.edges().items():
        assert gone.isdisjoint((a, b))
    # Survivors renormalize over the remaining successors.
    for a in prof.units():
        succ = prof.successors(a)
        if succ:
            assert sum(p for _b, p in succ) == pytest.approx(1.0)
    assert prof.recent() == [tuple(t) for t, _r, _f in stream[-prof.config.window:]]
    # Observing continues; a forgotten id that shows up again starts from scratch.
    prof.observe([1, 2])
    assert prof.chain_count((1, 2)) == 1.0
    assert prof.unit_stats(1).runs == 1


def test_round_trip_identical(seed):
    rng = random.Random(seed)
    cfg = ProfilerConfig(window=16, decay=0.85, max_chain=3, min_count=0.02)
    stream = _random_stream(rng, 80)
    prof = Profiler(cfg)
    _feed(prof, stream)
    state = json.loads(json.dumps(prof.to_dict()))  # the profile DB stores JSON
    twin = Profiler.from_dict(state)

    def answers(p: Profiler):
        return (
            p.config, p.inferences, p.recent(), p.chains(), p.edges(), p.units(),
            [p.unit_stats(u) for u in p.units()],
            [p.successors(u, c) for u in p.units() for c in CONDITIONS],
            p.snapshot(),
        )

    assert answers(twin) == answers(prof)
    # Both continue identically, pruning sweeps included.
    more = _random_stream(rng, 40)
    _feed(prof, more)
    _feed(twin, more)
    assert answers(twin) == answers(prof)
    with pytest.raises(ValueError, match="version"):
        Profiler.from_dict({**state, "version": 99})


def test_round_trip_tuple_features():
    prof = Profiler()
    prof.observe([1, 2], features={"shape": (1, 28, 28)})
    twin = Profiler.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert twin.edge_probability(1, 2, {"shape": (1, 28, 28)}) == 1.0
    assert twin._edges.keys() == prof._edges.keys()


@pytest.mark.parametrize("decay", [0.9, 0.95, 0.98])
def test_phase_shift_crossover(decay):
    prof = Profiler(ProfilerConfig(decay=decay))
    for _ in range(400):
        prof.observe([0, 1, 2, 3])
    assert prof.chain_frequency((1, 2, 3)) == pytest.approx(1.0, abs=1e-6)  # steady state
    assert prof.chain_frequency((1, 4, 5)) == 0.0
    bound = math.ceil(1 / (1 - decay))
    crossed = None
    for k in range(1, 3 * bound):
        prof.observe([0, 1, 4, 5])
        if crossed is None and prof.chain_frequency((1, 4, 5)) > prof.chain_frequency((1, 2, 3)):
            crossed = k
    assert crossed is not None and crossed <= bound
    # Analytically the old count is decay**k and the new 1 - decay**k (in steady
    # state units): they cross at k = log(1/2) / log(decay).
    assert crossed == math.floor(math.log(0.5) / math.log(decay)) + 1
    # Long after the shift the old chain is gone from the tables entirely.
    for _ in range(40 * bound):
        prof.observe([0, 1, 4, 5])
    assert (1, 2, 3) not in prof.chains()
    assert prof.edge_probability(1, 4) == pytest.approx(1.0)
    assert prof.edge_probability(1, 2) == 0.0


@pytest.mark.parametrize("field, value", [
    ("window", 0), ("window", 2.5), ("window", True),
    ("decay", 0.0), ("decay", 1.5), ("decay", -0.1), ("decay", "x"),
    ("max_chain", 1), ("max_chain", None),
    ("min_count", -1.0), ("min_count", float("nan")), ("min_count", float("inf")),
])
def test_config_validation(field, value):
    with pytest.raises(ValueError, match=field):
        ProfilerConfig(**{field: value})


def test_observe_validation():
    with pytest.raises(TypeError):
        Profiler(config={"window": 3})
    prof = Profiler()
    rec = TraceRecord(1, 0, 10, 1, 0, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="records"):
        prof.observe([1, 2], [rec])
    with pytest.raises(ValueError, match="region"):
        prof.observe([2], [rec])
    with pytest.raises(TypeError):
        prof.observe([1.5])
    with pytest.raises(TypeError):
        prof.observe([1], features={"x": [1, 2]})  # unhashable feature value
    assert prof.inferences == 0 and prof.chains() == {}  # nothing half-applied
    prof.observe_records([rec, TraceRecord(3, 10, 30, 1, 0, 0, 0, 0, 0, 0)])
    assert prof.chains() == {(1, 3): 1.0}
    assert prof.unit_stats(3).cycles == 20


def test_unit_stats_bound():
    peak, bus = 64, 8  # 8x8 array, 64-bit bus
    prof = Profiler(ProfilerConfig(decay=0.5))

    def rec(region, cycles, macs=0, rd=0, wr=0, stalls=0):
        return TraceRecord(region, 100, 100 + cycles, 10, macs, rd, wr, 1, 2, stalls)

    for i in range(6):
        prof.observe([1, 2, 3, 4], [
            rec(1, 100 + i, macs=64 * 90, rd=80),  # 90 compute cycles vs 10 DRAM
            rec(2, 200, macs=64 * 10, rd=8 * 150, wr=8 * 30),  # 180 DRAM vs 10 compute
            rec(3, 1000 + i, macs=64 * 100, rd=8 * 100, stalls=500),  # neither reaches half
            rec(4, 100, macs=64 * 60, rd=8 * 70),  # both over half: the larger wins
        ])
    assert prof.unit_stats(1).bound(peak, bus) == "compute"
    assert prof.unit_stats(2).bound(peak, bus) == "memory"
    assert prof.unit_stats(3).bound(peak, bus) == "overhead"
    assert prof.unit_stats(4).bound(peak, bus) == "memory"
    # On a half-as-wide bus unit 1 is still compute-bound, on a 1/8 array memory-bound.
    assert prof.unit_stats(1).bound(peak, bus / 2) == "compute"
    assert prof.unit_stats(1).bound(peak / 8, bus) == "compute"
    assert prof.unit_stats(1).bound(peak, bus / 16) == "memory"
    # Decayed mean of unit 3's cycles (1000..1005 with weights 0.5**age).
    w = np.array([0.5 ** (5 - i) for i in range(6)])
    st = prof.unit_stats(3)
    assert st.cycles == pytest.approx(float(np.dot(w, 1000 + np.arange(6)) / w.sum()))
    assert (st.stalls, st.hits, st.misses, st.dram_write) == (500, 1, 2, 0)
    # Units without records: frequencies but no measurements, hence "overhead".
    prof.observe([9])
    st9 = prof.unit_stats(9)
    assert st9.samples == 0 and st9.cycles == 0 and st9.bound(peak, bus) == "overhead"
    assert UnitStats(5, 1.0, 1, 1.0, cycles=10, macs=640).bound(peak, bus) == "compute"
    with pytest.raises(ValueError):
        st.bound(0, bus)


def test_snapshot_is_json(seed):
    rng = random.Random(seed)
    prof = Profiler()
    _feed(prof, _random_stream(rng, 50))
    snap = json.loads(json.dumps(prof.snapshot(top=5)))
    assert snap["inferences"] == 50
    assert len(snap["chains"]) == min(5, len(prof.chains()))
    counts = [c["count"] for c in snap["chains"]]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == pytest.approx(max(prof.chains().values()))
    for c in snap["chains"]:
        assert c["frequency"] == pytest.approx(prof.chain_frequency(c["chain"]))
    assert {u["uid"] for u in snap["units"]} == set(prof.units())
    assert {(e["src"], e["dst"]) for e in snap["edges"]} == set(prof.edges())


def test_unit_stats_bound_from_counters_by_cause():
    """Records with the engines' busy cycles classify by them, not by the work."""
    peak, bus = 64, 8
    prof = Profiler()
    base = dict(start=0, instructions=10, macs=64 * 90, dram_read_bytes=80,
                dram_write_bytes=0, tag_hits=0, tag_misses=0, stall_cycles=0)
    prof.observe_records([
        # the work says compute; the DMA was busy 80% of the cycles
        TraceRecord(region=1, end=100, busy_load=80, busy_array=40, **base),
        TraceRecord(region=2, end=100, busy_array=30, busy_vector=20, **base),
        TraceRecord(region=3, end=100, busy_array=90, sp_conflicts=15, **base),
        TraceRecord(region=4, end=100, busy_array=70, busy_load=60, **base),
    ])
    assert [prof.unit_stats(u).bound(peak, bus) for u in (1, 2, 3, 4)] == \
        ["memory", "overhead", "conflict", "compute"]
    assert prof.unit_stats(1).busy_load == 80 and prof.unit_stats(3).sp_conflicts == 15


def test_state_saved_before_the_counters_by_cause_loads():
    prof = Profiler()
    prof.observe_records([TraceRecord(1, 0, 10, 1, 64, 8, 0, 0, 0, 0)])
    state = prof.to_dict()
    state["units"] = [[*u[:5], u[5][:7]] for u in state["units"]]  # the old 7 sums
    old = Profiler.from_dict(state)
    assert old.unit_stats(1).cycles == 10 and old.unit_stats(1).busy_array == 0
