"""The graph IR and the builder: construction, validation errors, order, subgraphs."""

import numpy as np
import pytest

from host.builder import GraphBuilder
from host.errors import ModelError
from host.ir import (
    Clip,
    Graph,
    If,
    QAdd,
    QGemm,
    QParams,
    Requant,
    Subgraph,
    Tensor,
)
from host.reference import run_reference


def rne_shift(x, shift):
    """Round half to even of x / 2**shift with Python integers (independent)."""
    out = []
    for v in np.asarray(x, dtype=object).ravel():
        q, r = divmod(int(v), 1 << shift) if shift else (int(v), 0)
        if shift and (2 * r > (1 << shift) or (2 * r == (1 << shift) and q % 2)):
            q += 1
        out.append(q)
    return np.array(out, dtype=np.int64).reshape(np.shape(x))


def dense(x, zx, w, b, r: Requant):
    acc = (x.astype(np.int64) - zx) @ w.astype(np.int64) + b
    return np.clip(rne_shift(acc * r.mult, r.shift) + r.zp, r.lo, r.hi)


def test_builder_mlp_matches_integer_formula(seed):
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-128, 128, (32, 16), dtype=np.int8)
    w2 = rng.integers(-128, 128, (16, 10), dtype=np.int8)
    b1 = rng.integers(-5000, 5000, 16).astype(np.int32)
    b = GraphBuilder("mlp")
    x = b.input("x", (3, 32), scale=0.02, zp=-7)
    h = b.qgemm(x, w1, b1, w_scale=0.01, out_scale=0.3, out_zp=-128, relu=True)
    y = b.qgemm(h, w2, None, w_scale=0.01, out_scale=0.5, out_zp=3, clip=(-6.0, 6.0))
    cls = b.argmax(y, axis=-1)
    b.output(y, "y")
    b.output(cls, "cls")
    g = b.build()
    n1, n2 = (n for n in g.nodes if isinstance(n, QGemm))
    assert n1.requant.lo == -128 and n2.requant.lo == 3 - 12 and n2.requant.hi == 3 + 12
    x_in = rng.integers(-128, 128, (3, 32), dtype=np.int8)
    out = run_reference(g, {"x": x_in})
    hh = dense(x_in, -7, w1, b1, n1.requant)
    yy = dense(hh, -128, w2, 0, n2.requant)
    assert np.array_equal(out["y"], yy), f"seed {seed}"
    assert out["cls"].tolist() == [int(np.argmax(r)) for r in yy]
    assert out["cls"].dtype == np.int64
    assert "QGemm" in g.summary() and "mlp" in g.summary()


def gated(rng):
    """Gate GEMM -> argmax -> equal 0 -> If(expert 0, expert 1)."""
    wg = rng.integers(-128, 128, (8, 2), dtype=np.int8)
    we = [rng.integers(-128, 128, (8, 4), dtype=np.int8) for _ in range(2)]
    b = GraphBuilder("gated")
    x = b.input("x", (1, 8), scale=0.05)
    logits = b.qgemm(x, wg, w_scale=0.01, out_scale=0.05)
    cond = b.equal(b.argmax(logits, axis=1), 0)
    (y,) = b.if_(cond, lambda t: [t.qgemm(x, we[0], w_scale=0.01, out_scale=0.1)],
                 lambda e: [e.qgemm(x, we[1], w_scale=0.01, out_scale=0.1, relu=True)])
    b.output(y, "y")
    return b.build(), wg, we


def test_if_runs_the_branch_the_data_picks(seed):
    rng = np.random.default_rng(seed)
    g, wg, we = gated(rng)
    (ifn,) = [n for n in g.nodes if isinstance(n, If)]
    rt, re_ = ifn.then_graph.nodes[0].requant, ifn.else_graph.nodes[0].requant
    rg = g.nodes[0].requant
    seen = set()
    for _ in range(50):
        x = rng.integers(-128, 128, (1, 8), dtype=np.int8)
        logits = dense(x, 0, wg, 0, rg)
        expert = 0 if int(np.argmax(logits)) == 0 else 1
        want = dense(x, 0, we[expert], 0, rt if expert == 0 else re_)
        assert np.array_equal(run_reference(g, {"x": x})["y"], want), f"seed {seed}"
        seen.add(expert)
    assert seen == {0, 1}, f"seed {seed}: only expert(s) {seen} ran"


def test_topological_order_and_validation_sort_shuffled_nodes():
    b = GraphBuilder()
    x = b.input("x", (1, 4), scale=1.0)
    c = b.clip(b.relu(x), -3, 3)
    b.output(b.flatten(b.reshape(c, (2, 2)), axis=0), "y")
    g = b.build()
    names = [n.name for n in g.nodes]
    g.nodes.reverse()
    g.validate()
    assert [n.name for n in g.nodes] == names


def single(node, tensors, inputs, outputs):
    return Graph("g", {t.name: t for t in tensors}, [node], inputs, outputs)


def t8(name, shape, **kw):
    return Tensor(name, shape, "int8", **kw)


W = np.ones((4, 2), np.int8)
RQ = Requant(1 << 30, 30, 0)


def test_dangling_input_names_the_node():
    g = single(Clip("c", ["nowhere"], ["y"]), [t8("y", (1,))], [], ["y"])
    with pytest.raises(ModelError, match="not defined") as e:
        g.validate()
    assert e.value.node == "c" and "'c'" in str(e.value)


def test_shape_mismatch_names_the_node():
    g = single(QGemm("fc", ["x"], ["y"], weight=W, requant=RQ),
               [t8("x", (1, 4)), t8("y", (1, 3))], ["x"], ["y"])
    with pytest.raises(ModelError, match="shape mismatch") as e:
        g.validate()
    assert e.value.node == "fc"
    g = single(QGemm("fc", ["x"], ["y"], weight=W, requant=RQ),
               [t8("x", (1, 5)), t8("y", (1, 2))], ["x"], ["y"])
    with pytest.raises(ModelError, match="does not match weights") as e:
        g.validate()
    assert e.value.node == "fc"
    g = single(QAdd("add", ["a", "b"], ["y"]), [t8("a", (2,)), t8("b", (3,)), t8("y", (2,))],
               ["a", "b"], ["y"])
    with pytest.raises(ModelError, match="differ in shape") as e:
        g.validate()
    assert e.value.node == "add"


def test_dtype_mismatch_names_the_node():
    g = single(QGemm("fc", ["x"], ["y"], weight=W, requant=RQ),
               [Tensor("x", (1, 4), "float32"), t8("y", (1, 2))], ["x"], ["y"])
    with pytest.raises(ModelError, match="dtype float32") as e:
        g.validate()
    assert e.value.node == "fc"
    g = single(QGemm("fc", ["x"], ["y"], weight=W, requant=RQ),
               [t8("x", (1, 4)), Tensor("y", (1, 2), "int32")], ["x"], ["y"])
    with pytest.raises(ModelError, match="dtype mismatch") as e:
        g.validate()
    assert e.value.node == "fc"


def test_npu_limits_are_enforced():
    wide = np.full((4, 2), 200, np.int16)
    g = single(QGemm("fc", ["x"], ["y"], weight=wide, requant=RQ),
               [t8("x", (1, 4)), t8("y", (1, 2))], ["x"], ["y"])
    with pytest.raises(ModelError, match="int8 weights") as e:
        g.validate()
    assert e.value.node == "fc"
    g.nodes[0].device = "cpu"  # wide weights are legal on the CPU
    g.validate()
    g = single(QGemm("fc", ["x"], ["y"], weight=W),
               [t8("x", (1, 4)), Tensor("y", (1, 2), "int32")], ["x"], ["y"])
    with pytest.raises(ModelError, match="must run on the CPU"):
        g.validate()
    g = single(QGemm("fc", ["x"], ["y"], weight=W, bias=np.zeros(3, np.int32), requant=RQ),
               [t8("x", (1, 4)), t8("y", (1, 2))], ["x"], ["y"])
    with pytest.raises(ModelError, match="bias"):
        g.validate()
    g = single(Clip("c", ["x"], ["y"], lo=5, hi=-5), [t8("x", (1,)), t8("y", (1,))],
               ["x"], ["y"])
    with pytest.raises(ModelError, match="empty"):
        g.validate()


def test_double_writes_and_cycles_are_refused():
    a, b = Clip("a", ["x", ], ["y"]), Clip("b", ["x"], ["y"])
    g = Graph("g", {"x": t8("x", (1,)), "y": t8("y", (1,))}, [a, b], ["x"], ["y"])
    with pytest.raises(ModelError, match="written twice") as e:
        g.validate()
    assert e.value.node == "b"
    a, b = Clip("a", ["v"], ["u"]), Clip("b", ["u"], ["v"])
    g = Graph("g", {"u": t8("u", (1,)), "v": t8("v", (1,))}, [a, b], [], ["u"])
    with pytest.raises(ModelError, match="cycle"):
        g.validate()


def test_branches_must_agree():
    b = GraphBuilder()
    x = b.input("x", (1, 4), scale=1.0)
    c = b.input("c", (1,), dtype="bool")
    with pytest.raises(ModelError, match="branches disagree"):
        b.if_(c, lambda t: [t.reshape(x, (4,))], lambda e: [e.reshape(x, (2, 2))])


def test_value_records_check_their_ranges():
    with pytest.raises(ValueError, match="shift"):
        Requant(1, 64, 0)
    with pytest.raises(ValueError, match="multiplier"):
        Requant(1 << 31, 0, 0)
    with pytest.raises(ValueError, match="outside int8"):
        Requant(1, 0, 200)
    with pytest.raises(ValueError, match="scale"):
        QParams(0.0, 0)
    with pytest.raises(ValueError, match="zero point"):
        QParams(1.0, 128)
    with pytest.raises(ValueError, match="dtype"):
        Tensor("t", (1,), "float16")
    assert Tensor("k", (2,), "int8", data=[1, 2]).is_const


def test_per_channel_requant_applies_along_the_channels():
    r = Requant([1 << 30, 1 << 29], (30, 31), 1)
    assert r.per_channel and r.mult == (1 << 30, 1 << 29) and r.shift == (30, 31)
    acc = np.array([[8, 8], [-6, -6]], dtype=np.int32)
    assert r.apply(acc).tolist() == [[9, 3], [-5, -1]]  # -1.5 rounds to even: -2, +1
    nchw = np.full((1, 2, 1, 1), 8, dtype=np.int32)
    assert r.apply(nchw, (1, -1, 1, 1)).ravel().tolist() == [9, 3]
    with pytest.raises(ValueError, match="shift 64"):
        Requant([1, 1], [0, 64], 0)
    with pytest.raises(ModelError, match="2 channels for 3 outputs"):
        QGemm("g", ["x"], ["y"], weight=np.zeros((4, 3), np.int8), requant=r).check()


def test_subgraph_record_and_edges():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (2, 8), scale=0.1)
    h = b.qgemm(x, rng.integers(-9, 9, (8, 8), dtype=np.int8), w_scale=0.1, out_scale=0.2)
    r = b.relu(h)
    y = b.qgemm(r, rng.integers(-9, 9, (8, 4), dtype=np.int8), w_scale=0.1, out_scale=0.2)
    b.output(y, "y")
    b.output(h, "h")
    g = b.build()
    first, relu, last = g.nodes
    sg = g.subgraph(7, [first.name, relu.name])
    assert isinstance(sg, Subgraph) and sg.id == 7
    assert sg.inputs == ["x"]
    assert sg.outputs == ["h", relu.outputs[0]]  # h is a graph output, r feeds the last GEMM
    assert sg.instructions == [] and sg.exec_count == 0 and sg.resources == {}
    sg.record("compiled", "first compile")
    sg.record("fused", "hot chain")
    assert sg.history == [("compiled", "first compile"), ("fused", "hot chain")]
    assert g.subgraph(8, [last.name]).inputs == [relu.outputs[0]]
    assert g.consumers(relu.outputs[0]) == [last]
    assert g.producer("y") is last and g.producer("x") is None
