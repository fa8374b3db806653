"""The compiled-unit cache, the hardware-profile database and ``npu precompile``.

A hit must give back the very program a compile would (and it must run bit-exact);
anything that changes the program (profile, plan, specialization, a weight)
must miss; entries survive the process that wrote them; damaged entries are
recompiled, never served; refusals are remembered.
"""

import dataclasses
import hashlib
import pickle
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from firmware.config import CONFIGS, NPUConfig
from host.adaptive.cache import (
    CacheFileError,
    CompileCache,
    default_cache_path,
    graph_signature,
    plan_key,
    precompile,
    precompile_plans,
    unit_signature,
)
from host.builder import GraphBuilder
from host.cli import main as npu_main
from host.compiler import CompileError, compile_model, initial_units, simplify
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.profiles import PROFILES, profile, profile_key, profile_name, timing_key
from host.runtime import Session

ROOT = Path(__file__).resolve().parents[1]
DEFAULT, SMALL = PROFILES["default"], PROFILES["small"]


def model_graph(name):
    """A bundled model's simplified graph (what the runtime keys the cache on)."""
    return simplify(load_onnx(ROOT / "host" / "models" / f"{name}.onnx"))[0]


def merged(graph, i):
    """The initial plan with units i and i+1 merged."""
    units = initial_units(graph)
    return units[:i] + [units[i] + units[i + 1]] + units[i + 2:]


def assert_same_program(a, b):
    assert a.program.to_bytes() == b.program.to_bytes()
    assert a.const_image() == b.const_image()
    assert a.source == b.source
    assert a.partitions == b.partitions and a.result_regs == b.result_regs
    assert a.layouts == b.layouts and a.stages == b.stages
    assert sorted(a.regions) == sorted(b.regions)
    for uid, u in a.regions.items():
        v = b.regions[uid]
        assert (u.nodes, u.inputs, u.outputs, u.instructions, u.resources) == \
            (v.nodes, v.inputs, v.outputs, v.instructions, v.resources), f"region {uid}"


def never_compile():
    raise AssertionError("the cache compiled although the entry is stored")


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


# ---- hits and misses ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, config", [("moe", "default"), ("cnn", "small")])
def test_hit_returns_the_same_program_and_it_runs(name, config, digits, seed):
    graph, cfg = model_graph(name), PROFILES[config]
    cache = CompileCache(None)
    plan = merged(graph, 1)
    fresh, hit = cache.get_or_compile(graph, plan, cfg)
    assert not hit and cache.compiles == 1 and cache.misses == 1
    again, hit = cache.get_or_compile(graph, plan, cfg, compile_fn=never_compile)
    assert hit and cache.hits == 1 and cache.compiles == 1
    assert again is not fresh and again.graph is graph
    assert_same_program(again, fresh)
    assert_same_program(again, compile_model(graph, cfg, plan, simplified=True,
                                             relocatable=True))
    # The program from the cache computes the model: bit-exact against the reference.
    s = Session(NPUDriver(GoldenDevice(cfg)), again, check=True)
    s.load()
    shape = graph.tensors["input"].shape
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(digits.x_test), 3, replace=False):
        r = s.run({"input": digits.x_test[i].reshape(shape).astype(np.float32)})
        assert r.checked, f"seed {seed}: digit {i}"
    assert cache.get(graph, plan, cfg) is not None and cache.hits == 2


def test_what_changes_the_program_misses():
    graph = model_graph("mlp")
    cache = CompileCache(None)
    base, _ = cache.get_or_compile(graph, None, DEFAULT)
    assert cache.get(graph, initial_units(graph), DEFAULT) is not None, "None is the initial plan"
    assert cache.hits == 1
    variants = [
        ("small profile", None, SMALL, ""),
        ("tag_slots=8", None, dataclasses.replace(DEFAULT, tag_slots=8), ""),
        ("specialized", None, DEFAULT, "batch=1"),
        ("merged plan", merged(graph, 0), DEFAULT, ""),
    ]
    for what, plan, cfg, spec in variants:
        assert cache.get(graph, plan, cfg, spec) is None, what
        model, hit = cache.get_or_compile(graph, plan, cfg, spec)
        assert not hit, what
    assert cache.compiles == 1 + len(variants) and cache.stats()["entries"] == 1 + len(variants)
    small = cache.get(graph, None, SMALL)
    assert small.config == SMALL and small.program.to_bytes() != base.program.to_bytes()
    # Node order inside a unit does not matter; unit order does (region ids).
    fc = [["fc2", "fc1"]]
    assert plan_key(graph, fc) == (("fc1", "fc2"),)
    assert cache.get(graph, fc, DEFAULT) is not None
    assert cache.hits == 3


def test_specialized_compile_fn_and_put():
    graph = model_graph("mlp")
    cache = CompileCache(None)
    calls = []

    def special():
        calls.append(1)
        return compile_model(graph, DEFAULT, None, simplified=True, weight_budget=0)

    m, hit = cache.get_or_compile(graph, None, DEFAULT, "stream-weights", special)
    assert not hit and calls == [1] and m.resources()["tag_slots"] == 0
    m2, hit = cache.get_or_compile(graph, None, DEFAULT, "stream-weights", special)
    assert hit and calls == [1] and m2.resources()["tag_slots"] == 0
    generic = compile_model(graph, DEFAULT, None, simplified=True)
    cache.put(graph, None, DEFAULT, generic)
    assert cache.get(graph, None, DEFAULT).resources()["tag_slots"] == 2
    with pytest.raises(TypeError):
        cache.put(graph, None, DEFAULT, "not a program")


def test_a_renamed_node_is_another_entry():
    graph = model_graph("mlp")
    other = model_graph("mlp")
    cpu = next(n for n in other.nodes if n.device == "cpu")
    cpu.name += "_renamed"  # the compiled model refers to nodes by name (stages)
    assert graph_signature(other) == graph_signature(graph)
    cache = CompileCache(None)
    cache.get_or_compile(graph, None, DEFAULT)
    assert cache.get(other, None, DEFAULT) is None


# ---- across processes --------------------------------------------------------------------------


FILL = textwrap.dedent("""
    import sys
    from host.adaptive.cache import CompileCache
    from host.compiler import initial_units, simplify
    from host.onnx_import import load_onnx
    from host.profiles import PROFILES, profile_key

    cache = CompileCache(sys.argv[1])
    for name in sys.argv[2].split(","):
        g = simplify(load_onnx(f"host/models/{name}.onnx"))[0]
        for cfg in ("default", "small"):
            cache.get_or_compile(g, initial_units(g), PROFILES[cfg])
    print("compiles", cache.compiles, "key", profile_key(PROFILES["small"]))
""")


def test_entries_outlive_the_process_that_wrote_them(tmp_path):
    path = tmp_path / "c" / "compile.sqlite"
    # Two writers at once on one file (WAL): both sets of entries land.
    procs = [subprocess.Popen([sys.executable, "-c", FILL, str(path), names], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for names in ("mlp,cnn", "moe")]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert "compiles 4" in outs[0][0] and "compiles 2" in outs[1][0]
    # The profile key is the same in another process.
    assert f"key {profile_key(SMALL)}" in outs[0][0]
    cache = CompileCache(path)
    assert cache.stats()["entries"] == 6
    for name in ("mlp", "cnn", "moe"):
        g = model_graph(name)
        for cfg in (DEFAULT, SMALL):
            model, hit = cache.get_or_compile(g, None, cfg, compile_fn=never_compile)
            assert hit
            assert_same_program(model, compile_model(g, cfg, simplified=True, fuse=False,
                                                     relocatable=True))
    assert cache.compiles == 0 and cache.hits == 6 and cache.stale == 0
    assert {e["model"] for e in cache.entries("small")} == {"mlp", "cnn", "moe"}
    assert all(e["profile_name"] == "small" and e["current"] for e in cache.entries(SMALL))
    # A cache handed to another process (pickled) reopens the same file.
    again = pickle.loads(pickle.dumps(cache))
    assert again.path == path and again.stats()["entries"] == 6 and again.hits == 0
    with pytest.raises(TypeError, match="in-memory"):
        pickle.dumps(CompileCache(None))


def test_threads_share_one_cache(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    graph = model_graph("moe")
    plans = [p for _, p in precompile_plans(graph)]
    cache = CompileCache(tmp_path / "compile.sqlite")
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda p: cache.get_or_compile(graph, p, SMALL), plans * 2))
    assert cache.stats()["entries"] == len(plans) and cache.stale == 0
    assert cache.hits + cache.misses == 2 * len(plans) and cache.compiles == cache.misses
    for (a, _), (b, _) in zip(got[:len(plans)], got[len(plans):], strict=True):
        assert_same_program(a, b)


def test_default_cache_path(monkeypatch, tmp_path):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    assert default_cache_path() == tmp_path / "compile.sqlite"
    monkeypatch.delenv("NPU_CACHE_DIR")
    assert default_cache_path() == Path.home() / ".cache" / "npu" / "compile.sqlite"


# ---- signatures --------------------------------------------------------------------------------


def test_graph_signature_covers_every_constant(seed):
    rng = np.random.default_rng(seed)
    for name in ("mlp", "moe"):
        a, b = model_graph(name), model_graph(name)
        sig = graph_signature(a)
        assert graph_signature(b) == sig and len(sig) == 32
        # One flipped bit of one weight, anywhere (experts sit inside If branches).
        gemms = [n for _, n in b.walk() if n.op == "QGemm"]
        n = gemms[rng.integers(len(gemms))]
        at = tuple(int(rng.integers(d)) for d in n.weight.shape)
        n.weight[at] ^= np.int8(1 << int(rng.integers(7)))
        assert graph_signature(b) != sig, f"seed {seed}: {n.name}"
    g = model_graph("mlp")
    sig = graph_signature(g)
    n = g.node("fc1")
    n.requant = dataclasses.replace(n.requant, zp=n.requant.zp + 1)
    assert graph_signature(g) != sig
    g = model_graph("mlp")
    t = next(t for t in g.tensors.values() if t.quant is not None)
    t.quant = dataclasses.replace(t.quant, zero_point=t.quant.zero_point ^ 1)
    assert graph_signature(g) != sig


def experts_graph(rng, same: bool):
    """x -> gate (argmax) -> If: expert A else expert B; B copies A's weights if ``same``."""
    b = GraphBuilder("experts")
    x = b.input("x", (1, 16), scale=0.05, zp=-3)
    gate = b.qgemm(x, rng.integers(-60, 60, (16, 4), dtype=np.int8), None, w_scale=0.01,
                   out_scale=0.2)
    cond = b.equal(b.argmax(gate), 0)
    w1 = rng.integers(-60, 60, (16, 8), dtype=np.int8)
    w2 = rng.integers(-60, 60, (8, 4), dtype=np.int8)
    b1 = rng.integers(-500, 500, 8, dtype=np.int32)
    other = (w1, w2, b1) if same else (w1 ^ np.int8(1), w2, b1)

    def expert(ws):
        def body(sb):
            h = sb.qgemm(x, ws[0], ws[2], w_scale=0.01, out_scale=0.1, relu=True)
            return [sb.qgemm(h, ws[1], None, w_scale=0.01, out_scale=0.3)]
        return body

    (y,) = b.if_(cond, expert((w1, w2, b1)), expert(other))
    b.output(y, "y")
    return b.build()


def test_unit_signature_is_structural(seed):
    rng = np.random.default_rng(seed)
    state = rng.bit_generator.state
    g = experts_graph(rng, same=True)
    units = initial_units(g)
    assert len(units) == 5, units  # gate+argmax, then fc1, fc2, else fc1, fc2
    gate, a1, a2, b1, b2 = (unit_signature(g, u) for u in units)
    assert a1 == b1 and a2 == b2, f"seed {seed}: identical experts differ"
    assert len({gate, a1, a2}) == 3
    rng.bit_generator.state = state
    h = experts_graph(rng, same=False)
    units_h = initial_units(h)
    _, c1, c2, d1, d2 = (unit_signature(h, u) for u in units_h)
    assert c1 == a1 and c2 == a2, "the same expert in another graph"
    assert d1 != c1, f"seed {seed}: different weights, same signature"
    assert d2 == c2, "the second layers are identical"
    # A merged unit is its own structure; an output leaving the unit counts.
    assert unit_signature(g, units[1] + units[2]) == unit_signature(g, units[3] + units[4])
    assert unit_signature(g, units[1] + units[2]) != a1
    with pytest.raises(KeyError, match="nope"):
        unit_signature(g, ["nope"])
    # Whether an intermediate leaves the unit changes what the unit must store.
    sigs = []
    for also_out in (False, True):
        rng.bit_generator.state = state
        c = GraphBuilder("chain")
        x = c.input("x", (1, 16), scale=0.05)
        hid = c.qgemm(x, rng.integers(-9, 9, (16, 8), dtype=np.int8), None, out_scale=0.1)
        c.output(c.qgemm(hid, rng.integers(-9, 9, (8, 4), dtype=np.int8), None,
                         out_scale=0.3))
        if also_out:
            c.output(hid)
        cg = c.build()
        sigs.append(unit_signature(cg, [n.name for n in cg.nodes]))
    assert sigs[0] != sigs[1]
    # Both graphs compile, and the signatures do not depend on the compile.
    compile_model(g, DEFAULT, units, simplified=True)
    assert unit_signature(g, units[1]) == a1


# ---- damage and refusals -----------------------------------------------------------------------


def test_entries_of_an_older_compiler_are_said_once(tmp_path, caplog):
    """After an upgrade every entry is of another version: one warning, not one each;
    damaged bytes are said every time."""
    path = tmp_path / "compile.sqlite"
    graph = model_graph("mlp")
    plans = [None, merged(graph, 0)]
    for plan in plans:
        CompileCache(path).get_or_compile(graph, plan, SMALL)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE compiled SET version = '0:older-compiler'")
    cache = CompileCache(path)
    with caplog.at_level("WARNING"):
        assert all(cache.get(graph, plan, SMALL) is None for plan in plans)
    said = [r.getMessage() for r in caplog.records if "stale compile-cache" in r.getMessage()]
    assert cache.stale == 2 and len(said) == 1 and "dropped as met" in said[0]


@pytest.mark.parametrize("damage", ["garbage", "garbage+digest", "version", "wrong-kind",
                                    "other-program"])
def test_a_damaged_entry_is_recompiled(tmp_path, damage):
    path = tmp_path / "compile.sqlite"
    graph = model_graph("mlp")
    want, _ = CompileCache(path).get_or_compile(graph, None, SMALL)
    junk = b"\x80\x05garbage"
    if damage == "wrong-kind":
        junk = pickle.dumps({"message": "x", "node": ""})
    elif damage == "other-program":  # a valid pickle of another plan: bytes flipped in place
        other = CompileCache(None)
        other.put(graph, merged(graph, 0), SMALL, compile_model(graph, SMALL, merged(graph, 0),
                                                                 simplified=True))
        junk = other._db.execute("SELECT blob FROM compiled").fetchone()[0]
    with sqlite3.connect(path) as db:
        if damage == "version":
            db.execute("UPDATE compiled SET version = '0:older-compiler'")
        else:
            keep = damage in ("garbage", "other-program")
            digest = None if keep else hashlib.sha256(junk).hexdigest()[:32]
            db.execute("UPDATE compiled SET blob = ?, digest = COALESCE(?, digest)",
                       (junk, digest))
    cache = CompileCache(path)
    assert cache.get(graph, None, SMALL) is None
    assert cache.stale == 1 and cache.misses == 1 and cache.stats()["entries"] == 0
    model, hit = cache.get_or_compile(graph, None, SMALL)
    assert not hit and cache.compiles == 1
    assert_same_program(model, want)
    again, hit = CompileCache(path).get_or_compile(graph, None, SMALL,
                                                   compile_fn=never_compile)
    assert hit
    assert_same_program(again, want)


def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path):
    path = tmp_path / "compile.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CacheFileError, match="not an sqlite database"):
        CompileCache(path)
    assert path.read_bytes() == b"this is not sqlite" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compile.sqlite"]


def test_a_damaged_cache_of_this_project_is_set_aside(tmp_path):
    path = tmp_path / "compile.sqlite"
    graph = model_graph("mlp")
    with CompileCache(path) as cache:
        cache.get_or_compile(graph, None, SMALL)
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # keep the header (and its mark), wreck the rest
    path.write_bytes(bytes(data))
    cache = CompileCache(path)
    assert not cache.get_or_compile(graph, None, SMALL)[1]
    assert cache.get_or_compile(graph, None, SMALL)[1]
    assert [p.read_bytes() for p in tmp_path.glob("compile.sqlite.corrupt-*")] == [bytes(data)]


def test_refusals_are_stored(tmp_path):
    path = tmp_path / "compile.sqlite"
    graph = model_graph("moe")
    tight = dataclasses.replace(DEFAULT, imem_depth=64)
    cache = CompileCache(path)
    with pytest.raises(CompileError, match="instruction bank holds 64") as first:
        cache.get_or_compile(graph, None, tight)
    assert cache.compiles == 1
    with pytest.raises(CompileError) as second:
        cache.get_or_compile(graph, None, tight, compile_fn=never_compile)
    assert str(second.value) == str(first.value) and second.value.node == first.value.node
    assert cache.compiles == 1 and cache.hits == 1 and cache.negative_hits == 1
    other = CompileCache(path)  # and in another cache object
    with pytest.raises(CompileError, match="instruction bank holds 64"):
        other.get(graph, None, tight)
    assert [e["kind"] for e in other.entries(tight)] == ["error"]
    assert other.entries("default") == []
    # A refusal naming a node keeps the node.
    bad = [["fc1", "input_QuantizeLinear"], ["fc2"]]
    mlp = model_graph("mlp")
    with pytest.raises(CompileError, match="cannot be part of a unit"):
        other.get_or_compile(mlp, bad, DEFAULT)
    with pytest.raises(CompileError, match="cannot be part of a unit") as stored:
        CompileCache(path).get(mlp, bad, DEFAULT)
    assert stored.value.node == "input_QuantizeLinear"
    # Other errors (not a refusal) are not stored.
    def broken():
        raise RuntimeError("compiler bug")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            other.get_or_compile(graph, None, DEFAULT, compile_fn=broken)
    assert other.compiles == 3 and other.stats()["entries"] == 2
    other.clear()
    assert other.stats()["entries"] == 0 and other.get(graph, None, tight) is None


def test_precompile_notes_refusals_and_remembers_them():
    graph = model_graph("mlp")
    plans = precompile_plans(graph)
    assert [label for label, _ in plans] == ["initial", "merge fc1+fc2"]
    lengths = [len(compile_model(graph, SMALL, p, simplified=True).program) for _, p in plans]
    imem = min(lengths)
    cfg = dataclasses.replace(SMALL, imem_depth=imem)
    cache = CompileCache(None)
    res = precompile(cache, graph, cfg)
    refused = sum(n > imem for n in lengths)
    assert (res.plans, res.compiled, res.refused, res.cached) == (2, 2 - refused, refused, 0)
    assert len(res.notes) == refused and all("refused:" in n for n in res.notes)
    res = precompile(cache, graph, cfg)
    assert (res.compiled, res.cached, res.refused) == (0, 2, refused)
    assert all("(cached)" in n for n in res.notes)


def test_precompile_plans_cover_every_chain_merge():
    graph = model_graph("moe")
    units = initial_units(graph)
    plans = dict(precompile_plans(graph))
    # gate+argmax is alone at the top; each expert's two layers share a branch:
    # each expert merged or not, 2**4 plans.
    assert len(plans) == 16
    assert [(u.id, u.nodes) for u in plans["initial"]] == [
        (i + 1, u) for i, u in enumerate(units)]
    for label, p in plans.items():
        for u in p:
            if len(u.nodes) > 1 and u.nodes[0] != "gate":
                assert u.nodes[0].endswith("_fc1") and u.nodes[1].endswith("_fc2")
                assert u.nodes[0][:2] == u.nodes[1][:2], label
                assert u.id >= 1024  # the runtime's id for a merged chain
    assert len(precompile_plans(graph, limit=5)) == 5


# ---- profiles ----------------------------------------------------------------------------------


def test_profile_key_is_stable_and_sensitive():
    assert profile_key(NPUConfig()) == profile_key(CONFIGS["default"])
    assert re.fullmatch(r"[0-9a-f]{16}", profile_key(SMALL))
    base = SMALL
    keys = {profile_key(base)}
    for f in dataclasses.fields(NPUConfig):
        v = getattr(base, f.name)
        for cand in (v * 2, v // 2, v + 1, v - 1, v + 3):  # (dw_rows: 0 or 3..16)
            if cand == v:
                continue
            try:
                changed = dataclasses.replace(base, **{f.name: cand})
            except ValueError:
                continue
            keys.add(profile_key(changed))
            break
        else:
            pytest.fail(f"no valid change of {f.name}")
    assert len(keys) == 1 + len(dataclasses.fields(NPUConfig)), "a field does not count"
    with pytest.raises(TypeError):
        profile_key({"rows": 8})


def test_timing_key_follows_the_golden_cost_model(monkeypatch):
    import firmware.golden as golden

    key = timing_key()
    assert re.fullmatch(r"[0-9a-f]{16}", key) and timing_key() == key
    for f in dataclasses.fields(golden.CostModel):
        slower = dataclasses.make_dataclass(
            "CostModel", [(f.name, int, getattr(golden.CostModel(), f.name) + 1)],
            bases=(golden.CostModel,), frozen=True)
        monkeypatch.setattr(golden, "CostModel", slower)
        assert timing_key() != key, f"{f.name} does not count"
        monkeypatch.undo()
    assert timing_key() == key


def test_profile_database():
    assert set(PROFILES) >= {"default", "small", "ulx3s"}
    assert profile("small") is CONFIGS["small"] and profile("default") == NPUConfig()
    assert (profile("ulx3s").rows, profile("ulx3s").sp_bytes) == (4, 16384)
    with pytest.raises(KeyError, match="known profiles: default, small"):
        profile("de10")
    assert profile_name(dataclasses.replace(SMALL)) == "small"
    assert profile_name(profile("ulx3s")) == "small"  # the same build
    assert profile_name(dataclasses.replace(DEFAULT, tag_slots=8)) is None
    # Every known profile compiles a bundled model.
    g = model_graph("mlp")
    for cfg in PROFILES.values():
        compile_model(g, cfg, simplified=True)


# ---- npu precompile ----------------------------------------------------------------------------


def test_precompile_cli_fills_then_hits(tmp_path, capsys):
    path = tmp_path / "aot.sqlite"
    argv = ["precompile", "--profile", "small", "--model", "mlp", "--cache", str(path)]
    summary = re.compile(r"(\d+) compiles, (\d+) cache hits, \d+ units compiled \(.*\); "
                         r"cache (\S+)")

    assert npu_main(argv) == 0
    out = capsys.readouterr().out
    compiles, hits, where = summary.search(out).groups()
    assert (int(compiles), int(hits), where) == (2, 0, str(path))
    assert re.search(r"mlp\s*│\s*2\s*│\s*2\s*│\s*0\s*│\s*0\s*│\s*3", out), out

    assert npu_main(argv) == 0
    out = capsys.readouterr().out
    assert summary.search(out).groups()[:2] == ("0", "2"), out
    assert re.search(r"mlp\s*│\s*2\s*│\s*0\s*│\s*2\s*│\s*0\s*│\s*0", out), out

    entries = CompileCache(path).entries("small")
    assert sorted(e["plan"] for e in entries) == [(("fc1",), ("fc2",)), (("fc1", "fc2"),)]
    with pytest.raises(SystemExit):
        npu_main(["precompile", "--profile", "nope", "--cache", str(path)])
    capsys.readouterr()
