"""Batch-specialized programs: one NPU run for B inferences, behind a guard.

Every batched run goes through the one runtime path (Session -> NPUDriver ->
GoldenDevice) with ``check=True`` (the batched graph's reference interpreter),
and every per-input output is compared with the generic model's reference
output for that input alone.
"""

import dataclasses

import numpy as np
import pytest

from firmware.config import CONFIGS
from host.adaptive.specialize import (
    BatchVariant,
    GuardError,
    SpecializationError,
    batch_candidates,
    batch_graph,
    predicted_cycles,
    specialize_batch,
)
from host.builder import GraphBuilder
from host.cli import model_path
from host.compiler import compile_model
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.ir import Reshape
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import Session

CFG = CONFIGS["default"]


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


_graphs = {}


def simplified(name: str, config=CFG):
    """The bundled model's simplified graph (what the compiler and units name)."""
    key = (name, config)
    if key not in _graphs:
        _graphs[key] = compile_model(load_onnx(model_path(name)), config).graph
    return _graphs[key]


def session(model, check=True):
    s = Session(NPUDriver(GoldenDevice(model.config)), model, check=check)
    s.load()
    return s


def digit_inputs(graph, digits, idx):
    shape = graph.tensors["input"].shape
    return [{"input": digits.x_test[i].reshape(shape).astype(np.float32)} for i in idx]


def assert_same(got: dict, want: dict, what: str):
    assert set(got) == set(want), what
    for k, v in want.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype, f"{what}: {k}"
        assert np.array_equal(got[k], v), f"{what}: {k} {got[k]} != {v}"


# ---- correctness on the bundled models ------------------------------------------------------


@pytest.mark.parametrize("batch", [2, 4, 8])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_batched_program_equals_generic_per_input(name, batch, digits, seed):
    g = simplified(name)
    v = specialize_batch(g, CFG, batch)
    s = session(v.model)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(digits.x_test), 2 * batch, replace=False)
    xs = digit_inputs(g, digits, idx)
    for k in range(2):  # a cold run (weights load into their tags), then a warm one
        chunk = xs[k * batch:(k + 1) * batch]
        res = v.run_batch(s, chunk)
        assert res.batched and len(res.inferences) == 1, f"seed {seed}"
        assert res.inferences[0].checked  # equal to the batched graph's reference
        assert len(res.outputs) == batch
        for i, (x, out) in enumerate(zip(chunk, res.outputs, strict=True)):
            assert_same(out, run_reference(g, x), f"{name} B={batch} input {i} seed {seed}")
    # One region run per unit per batch: B inferences, one program run.
    assert len(res.inferences[0].trace) == len(v.model.units)


def test_merged_units_carry_over(digits, seed):
    """Units (node names of the simplified graph) cut the batched graph the same way."""
    g = simplified("mlp")
    generic = compile_model(g, CFG, [["fc1", "fc2"]], simplified=True)
    code = list(generic.units[0].instructions)
    v = specialize_batch(g, CFG, 4, generic.units)
    assert [(u.id, u.nodes) for u in v.model.units] == [(u.id, u.nodes) for u in generic.units]
    # The generic program's unit records are left alone.
    assert generic.units[0].instructions == code != v.model.units[0].instructions
    assert len(v.model.place.arena) == 2  # fc1's output stays on chip: input, logits
    s = session(v.model)
    xs = digit_inputs(g, digits, np.random.default_rng(seed).choice(100, 4, replace=False))
    for x, out in zip(xs, v.run(s, xs), strict=True):
        assert_same(out, run_reference(g, x), f"seed {seed}")


def test_random_residual_graph_batches(seed):
    """QAdd, Clip and Reshape keep their rows apart (random weights and inputs)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("res")
    x = b.input("x", (1, 24), scale=0.1, zp=3)
    h = b.qgemm(x, rng.integers(-128, 128, (24, 24), dtype=np.int8), None, w_scale=0.01,
                out_scale=0.1, out_zp=2)
    a = b.qadd(h, x, out_scale=0.15, out_zp=-4)
    c = b.clip(b.reshape(a, (1, 4, 6)), lo=-60, hi=90)
    y = b.qgemm(b.reshape(c, (1, 24)), rng.integers(-128, 128, (24, 7), dtype=np.int8),
                rng.integers(-500, 500, 7, dtype=np.int32), w_scale=0.02, out_scale=0.3)
    b.output(y, "y")
    g = compile_model(b.build(), CFG).graph
    v = specialize_batch(g, CFG, 8)
    assert any(isinstance(n, Reshape) and n.shape == (8, 4, 6) for n in v.model.graph.nodes)
    s = session(v.model)
    xs = [{"x": rng.integers(-128, 128, (1, 24), dtype=np.int8)} for _ in range(8)]
    for i, (x, out) in enumerate(zip(xs, v.run(s, xs), strict=True)):
        assert_same(out, run_reference(g, x), f"input {i} seed {seed}")


# ---- the figure: cycles per inference ------------------------------------------------------


def cycles_per_inference(name, digits, batch):
    """Warm cycles per inference of the generic program and of the batch-B one."""
    g = simplified(name)
    xs = digit_inputs(g, digits, range(2 * batch))
    gen = session(compile_model(g, CFG, simplified=True), check=False)
    gen.run(xs[0])  # weights into their tag slots
    generic = sum(gen.run(x).cycles for x in xs[batch:]) / batch
    v = specialize_batch(g, CFG, batch)
    s = session(v.model, check=False)
    v.run_batch(s, xs[:batch])
    batched = v.run_batch(s, xs[batch:]).cycles_per_inference
    pred = (predicted_cycles(gen.model), predicted_cycles(v.model) / batch)
    print(f"\n{name}: cycles per inference, generic {generic:.1f}, batch {batch} "
          f"{batched:.1f} ({generic / batched:.2f}x); predicted {pred[0]:.0f} vs {pred[1]:.0f}")
    return generic, batched


def test_batching_cuts_cycles_per_inference_of_the_mlp(digits):
    generic, batched = cycles_per_inference("mlp", digits, 8)
    # M=1 GEMVs pay a weight-tile load per tile per inference; B=8 pays it once.
    assert batched < generic / 2


def test_cnn_cycles_per_inference_reported(digits):
    generic, batched = cycles_per_inference("cnn", digits, 8)
    # A convolution already streams a whole output row per weight tile: little to gain,
    # but the batch must not cost more (one region overhead instead of eight).
    assert batched <= generic


# ---- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, node, source", [("moe", "route0", "gate_argmax"),
                                                 ("early_exit", "exit", "gate_argmax")])
def test_branching_models_refuse(name, node, source):
    g = simplified(name)
    for make in (lambda: batch_graph(g, 4), lambda: specialize_batch(g, CFG, 4)):
        with pytest.raises(SpecializationError, match="per-input routing") as err:
            make()
        assert err.value.node == node and source in str(err.value)
    assert batch_candidates(g, CFG) == []


def test_standalone_argmax_and_bad_shapes_refuse(seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (16, 4), dtype=np.int8)

    b = GraphBuilder("cls")
    x = b.input("x", (1, 16), scale=0.1)
    b.output(b.argmax(b.qgemm(x, w, None, w_scale=0.01, out_scale=0.1)), "k")
    g = b.build()
    with pytest.raises(SpecializationError, match="vargmax") as err:
        batch_graph(g, 2)
    assert g.producer("k").name == err.value.node

    b = GraphBuilder("wide")
    x = b.input("x", (3, 16), scale=0.1)  # already a batch of 3: no leading 1
    b.output(b.qgemm(x, w, None, w_scale=0.01, out_scale=0.1), "y")
    with pytest.raises(SpecializationError, match="leading dimension"):
        batch_graph(b.build(), 2)

    b = GraphBuilder("turn")
    x = b.input("x", (1, 16), scale=0.1)
    b.output(b.reshape(b.qgemm(x, w, None, w_scale=0.01, out_scale=0.1), (4, 1)), "y")
    with pytest.raises(SpecializationError, match="Reshape") as err:
        batch_graph(b.build(), 2)
    assert err.value.node

    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError):
            batch_graph(simplified("mlp"), bad)


# ---- the batched graph ---------------------------------------------------------------------


def test_batch_graph_shapes_and_constants():
    g = simplified("cnn")
    bg = batch_graph(g, 4)
    assert bg is not g and [n.name for n in bg.nodes] == [n.name for n in g.nodes]
    assert bg.inputs == g.inputs and bg.outputs == g.outputs
    for name, t in g.tensors.items():
        u = bg.tensors[name]
        if t.is_const:
            assert u.shape == t.shape and np.array_equal(u.data, t.data)
        else:
            assert t.shape[0] == 1 and u.shape == (4, *t.shape[1:]), name
    assert bg.tensors["input"].shape == (4, 1, 8, 8)
    assert g.tensors["input"].shape == (1, 1, 8, 8)  # the original is untouched
    for n, m in zip(g.nodes, bg.nodes, strict=True):
        if hasattr(n, "weight"):
            assert np.array_equal(n.weight, m.weight)


def test_batch_candidates():
    for name in ("mlp", "cnn"):
        g = simplified(name)
        cands = batch_candidates(g, CFG)
        # The mlp's batch 1 runs its GEMMs as GEMVs: two rows through the GEMM
        # mapping do not gain 5 % on it, four do.
        assert cands and cands[0] == {"mlp": 4, "cnn": 2}[name]
        assert cands == sorted(cands) and all(c & (c - 1) == 0 for c in cands)
        prev = predicted_cycles(compile_model(g, CFG, simplified=True, fuse=False))
        for c in cands:  # each compiles and predicts fewer cycles per inference
            per = predicted_cycles(specialize_batch(g, CFG, c).model) / c
            assert per < prev
            prev = per
    # The mlp keeps gaining up to the latency cap; the cap and the gain bound hold.
    assert batch_candidates(simplified("mlp"), CFG, max_batch=16) == [4, 8, 16]
    assert batch_candidates(simplified("mlp"), CFG, min_gain=0.99) == []
    # The cnn's program unrolls per image: B=16 overflows a 1024-deep instruction bank.
    narrow = dataclasses.replace(CFG, imem_depth=1024)
    assert max(batch_candidates(simplified("cnn"), narrow, min_gain=0.0)) == 8
    assert max(batch_candidates(simplified("cnn"), CFG, min_gain=0.0)) == 16


# ---- the guard -----------------------------------------------------------------------------


def test_guard(digits):
    g = simplified("mlp")
    v = specialize_batch(g, CFG, 4)
    assert isinstance(v, BatchVariant) and v.name == "batch4"
    xs = digit_inputs(g, digits, range(5))
    assert v.guard(xs[:4]) and v.guard(tuple(xs[:4]))
    bad = {
        "too few": xs[:3],
        "too many": xs[:5],
        "empty": [],
        "not a list": xs[0],
        "wrong shape": xs[:3] + [{"input": digits.x_test[4].reshape(64, 1)}],
        "batched shape": xs[:3] + [{"input": digits.x_test[4:6].astype(np.float32)}],
        "wrong dtype": xs[:3] + [{"input": xs[3]["input"].astype(np.float64)}],
        "not an array": xs[:3] + [{"input": xs[3]["input"].tolist()}],
        "missing input": xs[:3] + [{}],
        "extra input": xs[:3] + [{**xs[3], "other": xs[3]["input"]}],
        "not a dict": xs[:3] + [xs[3]["input"]],
    }
    for what, inputs in bad.items():
        assert not v.guard(inputs), what
        assert v.guard_failure(inputs), what


def test_guard_failure_falls_back_to_the_generic_program(digits):
    g = simplified("mlp")
    v = specialize_batch(g, CFG, 4)
    s = session(v.model)
    generic = session(compile_model(g, CFG, simplified=True))
    xs = digit_inputs(g, digits, range(3))  # one short of a batch
    with pytest.raises(GuardError, match="3 inputs for a batch of 4"):
        v.run(s, xs)
    res = v.run_batch(s, xs, fallback=generic)
    assert not res.batched and len(res.inferences) == 3 and "3 inputs" in res.reason
    for x, out in zip(xs, res.outputs, strict=True):
        assert_same(out, run_reference(g, x), "fallback")
    # A session running another program is refused, not misread.
    with pytest.raises(ValueError, match="not this variant"):
        v.run(generic, digit_inputs(g, digits, range(4)))
