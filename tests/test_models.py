"""The bundled models (host/models) and the digits helpers (host/datasets.py).

Shipped files are checked for ONNX validity, their documented interface and ops, the
onnxruntime QDQ conventions, agreement with independent numpy formulas (float
models) and with the NPU's integer requantization (firmware.quant), accuracy, routing
and early-exit behaviour, and byte-for-byte reproducibility of the generator.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from firmware.quant import quantize_multiplier, requantize
from host.datasets import (
    NUM_CLASSES,
    class_mix_stream,
    load_digits_split,
    to_images,
)
from host.models import (
    CALIBRATION_FILE,
    CLASS_GROUPS,
    MODEL_DIR,
    MODEL_NAMES,
    NUM_EXPERTS,
    SPECS,
    load_calibration,
    load_model,
    model_filename,
    run_reference,
)

BOTH = [(n, q) for n in MODEL_NAMES for q in (False, True)]
BOTH_IDS = [f"{n}-{'qdq' if q else 'float'}" for n, q in BOTH]
ACCURACY_FLOOR = 0.90
MAX_QUANT_DROP = 0.02


# ------------------------------------------------------------------------------------
# helpers


def _graphs(graph):
    """The graph and all its (nested) If subgraphs."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


def _nodes(model):
    return [n for g in _graphs(model.graph) for n in g.node]


def _inits(model):
    return {i.name: numpy_helper.to_array(i) for g in _graphs(model.graph)
            for i in g.initializer}


@cache
def _model(name, quantized):
    return load_model(name, quantized)


@lru_cache(maxsize=1)
def _split():
    return load_digits_split(0)


@cache
def _test_outputs(name, quantized):
    """Outputs of a shipped model over the whole test split (cached: several tests)."""
    return run_reference(_model(name, quantized), name, _split().x_test)


def _numpy_float(name, inits, x):
    """The float models from their initializers, in float64 numpy (independent code)."""
    def dense(a, layer):
        return a @ inits[f"{layer}_W"].T.astype(np.float64) + inits[f"{layer}_B"]

    def relu(a):
        return np.maximum(a, 0)

    def conv(a, layer):  # 3x3, pad 1, stride 1 cross-correlation, NCHW
        w, b = inits[f"{layer}_W"].astype(np.float64), inits[f"{layer}_B"]
        win = sliding_window_view(np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                  axis=(2, 3))
        return np.einsum("nchwyx,ocyx->nohw", win, w) + b[None, :, None, None]

    def pool(a):
        n, c, h, w = a.shape
        return a.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    x = x.astype(np.float64)
    if name == "mlp":
        return {"logits": dense(relu(dense(x, "fc1")), "fc2")}
    if name == "cnn":
        a = pool(relu(conv(to_images(x), "conv1")))
        a = pool(relu(conv(a, "conv2")))
        return {"logits": dense(a.reshape(len(x), -1), "fc")}
    if name == "moe":
        expert = dense(x, "gate").argmax(1)
        every = np.stack([dense(relu(dense(x, f"e{k}_fc1")), f"e{k}_fc2")
                          for k in range(NUM_EXPERTS)])
        return {"logits": every[expert, np.arange(len(x))], "expert": expert}
    h1 = relu(dense(x, "fc1"))
    path = dense(h1, "gate").argmax(1)
    deep = dense(relu(dense(h1, "fc2")), "fc3")
    return {"logits": np.where(path[:, None] == 0, dense(h1, "head1"), deep), "path": path}


# ------------------------------------------------------------------------------------
# the shipped files


def test_files_present_and_small():
    for name in MODEL_NAMES:
        for q in (False, True):
            path = MODEL_DIR / model_filename(name, q)
            assert path.is_file(), f"{path} missing: run python -m host.models.generate"
            assert path.stat().st_size < 64 * 1024, f"{path} is {path.stat().st_size} bytes"
    assert (MODEL_DIR / CALIBRATION_FILE).is_file()
    assert (MODEL_DIR / "README.md").is_file()
    with pytest.raises(ValueError, match="unknown model"):
        model_filename("resnet")


@pytest.mark.parametrize(("name", "quantized"), BOTH, ids=BOTH_IDS)
def test_checker_and_interface(name, quantized):
    model = _model(name, quantized)
    onnx.checker.check_model(model, full_check=True)
    spec = SPECS[name]
    assert [o.domain for o in model.opset_import] == [""]
    assert model.opset_import[0].version >= 13
    (inp,) = model.graph.input
    assert inp.name == "input"
    assert inp.type.tensor_type.elem_type == TensorProto.FLOAT
    assert tuple(d.dim_value for d in inp.type.tensor_type.shape.dim) == spec.input_shape
    outs = [(o.name, o.type.tensor_type.elem_type,
             tuple(d.dim_value for d in o.type.tensor_type.shape.dim))
            for o in model.graph.output]
    assert outs == [(o.name, o.elem_type, o.shape) for o in spec.outputs]
    ops = {n.op_type for n in _nodes(model)}
    assert ops == (spec.qdq_ops if quantized else spec.float_ops)


@pytest.mark.parametrize(("name", "quantized"), BOTH, ids=BOTH_IDS)
def test_control_flow_is_argmax_equal_if(name, quantized):
    """Every If is decided by Equal(ArgMax(...), constant k), nothing else."""
    model = _model(name, quantized)
    nodes, inits = _nodes(model), _inits(model)
    producer = {o: n for n in nodes for o in n.output}
    ifs = [n for n in nodes if n.op_type == "If"]
    ks = []
    for node in ifs:
        eq = producer[node.input[0]]
        assert eq.op_type == "Equal"
        am = producer[eq.input[0]]
        assert am.op_type == "ArgMax"
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in am.attribute}
        assert attrs == {"axis": 1, "keepdims": 0}
        k = inits[eq.input[1]]
        assert k.dtype == np.int64 and k.shape == ()
        ks.append(int(k))
        for attr in node.attribute:
            (out,) = attr.g.output
            assert out.type.tensor_type.elem_type == TensorProto.FLOAT
            assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, 10]
    expected = {"moe": list(range(NUM_EXPERTS - 1)), "early_exit": [0]}.get(name, [])
    assert sorted(ks) == expected


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_qdq_conventions(name):
    """The onnxruntime QDQ layout: int8 activations, symmetric int8 weights with zero
    point 0, int32 biases with scale s_in * s_w, fused ReLU (zero point -128)."""
    model = _model(name, True)
    nodes, inits = _nodes(model), _inits(model)
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def dq_of(tensor):
        """The DequantizeLinear of ``tensor``, its scale and zero point (per tensor:
        onnxruntime writes biases' as shape (1,), the rest as scalars)."""
        dq = producer[tensor]
        assert dq.op_type == "DequantizeLinear", f"{tensor} is not dequantized"
        scale, zp = inits[dq.input[1]], inits[dq.input[2]]
        assert scale.dtype == np.float32 and scale.shape in ((), (1,)) and scale > 0
        assert zp.shape in ((), (1,))
        return dq, scale.reshape(()), zp.reshape(())

    for q in (n for n in nodes if n.op_type == "QuantizeLinear"):
        scale, zp = inits[q.input[1]], inits[q.input[2]]
        assert scale.dtype == np.float32 and scale.shape == () and scale > 0
        assert zp.dtype == np.int8 and zp.shape == ()
        (dq,) = consumers[q.output[0]]
        assert dq.op_type == "DequantizeLinear" and list(dq.input[1:]) == list(q.input[1:])
    n_layers = 0
    for node in (n for n in nodes if n.op_type in ("Gemm", "Conv")):
        n_layers += 1
        _, s_in, _ = dq_of(node.input[0])
        wdq, s_w, zp_w = dq_of(node.input[1])
        bdq, s_b, zp_b = dq_of(node.input[2])
        w, b = inits[wdq.input[0]], inits[bdq.input[0]]
        assert w.dtype == np.int8 and zp_w.dtype == np.int8 and zp_w == 0
        assert w.min() >= -127 and w.max() <= 127
        assert max(-w.min(), w.max()) == 127  # symmetric min/max scale uses the full range
        assert b.dtype == np.int32 and zp_b.dtype == np.int32 and zp_b == 0
        assert s_b == np.float32(s_in * s_w)
        (q,) = consumers[node.output[0]]
        assert q.op_type == "QuantizeLinear"
        if node.output[0].endswith("_relu_out"):
            assert inits[q.input[2]] == -128, f"fused ReLU of {node.name} needs zp -128"
    assert n_layers == {"mlp": 2, "cnn": 3, "moe": 9, "early_exit": 5}[name]
    for node in (n for n in nodes if n.op_type in ("MaxPool", "ArgMax")):
        _, s_in, zp_in = dq_of(node.input[0])
        if node.op_type == "MaxPool":
            (q,) = consumers[node.output[0]]
            assert inits[q.input[1]] == s_in and inits[q.input[2]] == zp_in


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_qdq_weights_round_the_float_weights(name):
    """Each quantized weight and bias is the float one rounded to its scale."""
    fl, qd = _inits(_model(name, False)), _inits(_model(name, True))
    layers = sorted(k[:-2] for k in fl if k.endswith("_W"))
    assert layers
    for layer in layers:
        w = fl[f"{layer}_W"]
        s_w = qd[f"{layer}_W_scale"]
        assert s_w == np.float32(np.float64(np.abs(w).max()) / 127)
        err = np.abs(qd[f"{layer}_W_quantized"] * s_w - w)
        assert err.max() <= s_w * 0.5001, layer
        s_b = qd[f"{layer}_B_quantized_scale"]
        err = np.abs(qd[f"{layer}_B_quantized"] * np.float64(s_b) - fl[f"{layer}_B"])
        assert err.max() <= s_b * 0.5001, layer


@pytest.mark.parametrize(("name", "quantized"), BOTH, ids=BOTH_IDS)
def test_runs_on_a_few_inputs(name, quantized, seed):
    """Outputs have the documented shapes; float models match a numpy forward pass."""
    split = _split()
    idx = np.random.default_rng(seed).choice(len(split.x_test), 5, replace=False)
    model = _model(name, quantized)
    sess = ReferenceEvaluator(model)
    x = SPECS[name].prepare(split.x_test[idx])
    expect = _numpy_float(name, _inits(model), split.x_test[idx]) if not quantized else None
    for j in range(len(idx)):
        outs = sess.run(None, {"input": x[j : j + 1]})
        for spec, value in zip(SPECS[name].outputs, outs, strict=True):
            assert value.shape == spec.shape, f"seed {seed}: {spec.name}"
            assert value.dtype == onnx.helper.tensor_dtype_to_np_dtype(spec.elem_type)
            if expect is not None:
                np.testing.assert_allclose(value[0], expect[spec.name][j], rtol=1e-4,
                                           atol=1e-4, err_msg=f"seed {seed}: {spec.name}")
        assert np.all(np.isfinite(outs[0]))


def _readme_accuracies():
    text = (MODEL_DIR / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|.*\| ([\d.]+%) \| ([\d.]+%) \|$", text, re.M)
    return {n: (f, q) for n, f, q in rows}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_accuracy_on_test_split(name):
    y = _split().y_test
    acc_f = (_test_outputs(name, False)["logits"].argmax(1) == y).mean()
    acc_q = (_test_outputs(name, True)["logits"].argmax(1) == y).mean()
    assert acc_q >= ACCURACY_FLOOR, f"QDQ {name} accuracy {acc_q:.2%}"
    assert acc_q >= acc_f - MAX_QUANT_DROP, f"QDQ {acc_q:.2%} vs float {acc_f:.2%}"
    # README.md records exactly these numbers
    assert _readme_accuracies()[name] == (f"{acc_f:.2%}", f"{acc_q:.2%}")


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "qdq"])
def test_moe_routes_by_class_group(quantized):
    expert = _test_outputs("moe", quantized)["expert"]
    y = _split().y_test
    used = np.unique(expert)
    assert len(used) >= 3, f"only experts {used} used"
    for k, group in enumerate(CLASS_GROUPS):
        routed = y[expert == k]
        assert np.isin(routed, group).mean() > 0.8, f"expert {k} gets classes {routed}"


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "qdq"])
def test_early_exit_fraction(quantized):
    out = _test_outputs("early_exit", quantized)
    exit_ = out["path"] == 0
    assert set(np.unique(out["path"])) <= {0, 1}
    assert 0.2 <= exit_.mean() <= 0.9, f"early exits {exit_.mean():.1%}"
    # the gate exits where head1 is good: early answers are at least as accurate
    y = _split().y_test
    pred = out["logits"].argmax(1)
    assert (pred[exit_] == y[exit_]).mean() >= (pred[~exit_] == y[~exit_]).mean()


def test_mlp_integer_pipeline_matches_qdq():
    """The QDQ MLP run the NPU way (int32 accumulate, vreq fixed-point requantize)
    agrees with onnx.reference's float QDQ evaluation."""
    model = _model("mlp", True)
    c = _inits(model)
    sess = ReferenceEvaluator(model)
    split = _split()
    s_x, zp_x = c["input_scale"], int(c["input_zero_point"])
    s_h, zp_h = c["fc1_relu_out_scale"], int(c["fc1_relu_out_zero_point"])
    s_o, zp_o = c["logits_scale"], int(c["logits_zero_point"])
    m1 = quantize_multiplier(float(s_x) * float(c["fc1_W_scale"]) / float(s_h))
    m2 = quantize_multiplier(float(s_h) * float(c["fc2_W_scale"]) / float(s_o))
    w1 = c["fc1_W_quantized"].astype(np.int64)
    w2 = c["fc2_W_quantized"].astype(np.int64)
    diffs_h, diffs_o, agree = 0, 0, 0
    for x in split.x_test:
        ref = sess.run(None, {"input": x[None]}, intermediate=True)
        xq = np.clip(np.rint(x / s_x) + zp_x, -128, 127).astype(np.int64)
        assert np.array_equal(xq, ref["input_QuantizeLinear_Output"][0])
        hq = requantize((xq - zp_x) @ w1.T + c["fc1_B_quantized"], *m1, zp_h)
        oq = requantize((hq.astype(np.int64) - zp_h) @ w2.T + c["fc2_B_quantized"], *m2, zp_o)
        ref_h = ref["fc1_relu_out_QuantizeLinear_Output"][0]
        ref_o = ref["logits_QuantizeLinear_Output"][0]
        assert np.abs(hq.astype(int) - ref_h).max() <= 1  # ties may round apart
        diffs_h += int((hq != ref_h).sum())
        diffs_o += int((oq != ref_o).sum())
        agree += int(oq.argmax() == ref_o.argmax())
    n = len(split.x_test)
    assert diffs_h <= 0.01 * n * 32 and diffs_o <= 0.01 * n * 10
    assert agree >= 0.99 * n


def test_calibration_sample():
    x, y = load_calibration()
    with np.load(MODEL_DIR / CALIBRATION_FILE) as f:
        index = f["index"]
    split = _split()
    assert x.dtype == np.float32 and x.shape[1:] == (64,) and 24 <= len(x) <= 100
    assert np.array_equal(x, split.x_train[index]) and np.array_equal(y, split.y_train[index])
    assert len(np.unique(y)) == NUM_CLASSES
    # the input's quantization range comes from this sample
    c = _inits(_model("mlp", True))
    assert c["input_scale"] == np.float32(np.float64(x.max()) / 255)


@pytest.mark.parametrize("names", [("mlp", "moe", "early_exit"), ("cnn",)],
                         ids=["dense-models", "cnn"])
def test_regeneration_is_deterministic(tmp_path, names):
    """Regenerating reproduces the shipped ONNX bytes and calibration sample."""
    from host.models.generate import generate

    generate(tmp_path, names=names, evaluate=False, log=lambda _: None)
    for name in names:
        for q in (False, True):
            f = model_filename(name, q)
            assert (tmp_path / f).read_bytes() == (MODEL_DIR / f).read_bytes(), (
                f"{f} differs from a fresh generation: run python -m host.models.generate")
    f = CALIBRATION_FILE
    assert (tmp_path / f).read_bytes() == (MODEL_DIR / f).read_bytes()


# ------------------------------------------------------------------------------------
# host.datasets


def test_digits_split():
    s = _split()
    assert s.x_train.dtype == s.x_test.dtype == np.float32
    assert s.x_train.shape[1:] == (64,) and len(s.x_train) + len(s.x_test) == 1797
    assert s.x_train.min() >= 0 and s.x_train.max() == 1 and s.x_test.max() <= 1
    assert s.y_train.dtype.kind == "i" and set(np.unique(s.y_test)) == set(range(10))
    # stratified: each class has about 20 % of its samples in the test split
    frac = np.bincount(s.y_test) / (np.bincount(s.y_test) + np.bincount(s.y_train))
    assert np.all(np.abs(frac - 0.2) < 0.01)
    # every original image is in exactly one split
    from sklearn.datasets import load_digits

    raw = load_digits()
    joined = np.concatenate([s.x_train, s.x_test]) * 16
    key = np.lexsort(joined.T)
    raw_key = np.lexsort(raw.data.T)
    assert np.array_equal(joined[key], raw.data[raw_key])
    again = load_digits_split(0)
    assert np.array_equal(again.x_test, s.x_test) and np.array_equal(again.y_train, s.y_train)
    other = load_digits_split(1)
    assert not np.array_equal(other.y_test, s.y_test)
    with pytest.raises(ValueError, match="seed"):
        load_digits_split(-1)


def test_image_view():
    s = _split()
    img = s.test_images
    assert img.shape == (len(s.x_test), 1, 8, 8) and np.shares_memory(img, s.x_test)
    assert img[3, 0, 2, 5] == s.x_test[3, 2 * 8 + 5]
    assert to_images(s.x_test[0]).shape == (1, 1, 8, 8)
    with pytest.raises(ValueError, match="64"):
        to_images(np.zeros((3, 63)))


def test_class_mix_stream(seed):
    phases = [{0: 1.0, 1: 1.0}, {7: 3.0, 2: 1.0}, {c: 1.0 for c in range(10)}]
    n = 1200
    items = list(class_mix_stream(n, phases, seed))
    assert [it.index for it in items] == list(range(n))
    phase = np.array([it.phase for it in items])
    label = np.array([it.label for it in items])
    assert np.array_equal(np.bincount(phase), [400, 400, 400])
    assert np.all(np.diff(phase) >= 0)
    assert set(label[phase == 0]) == {0, 1} and set(label[phase == 1]) == {2, 7}
    share7 = (label[phase == 1] == 7).mean()
    assert abs(share7 - 0.75) < 0.08, f"seed {seed}: class 7 share {share7}"
    assert len(set(label[phase == 2])) == 10
    # each sample is a test digit of its label
    s = _split()
    for it in items[::50]:
        hits = np.flatnonzero((s.x_test == it.x).all(axis=1))
        assert len(hits) and it.label in s.y_test[hits], f"seed {seed}: item {it.index}"
    again = list(class_mix_stream(n, phases, seed))
    assert all(np.array_equal(a.x, b.x) and a.label == b.label
               for a, b in zip(items, again, strict=True))
    assert [it.phase for it in class_mix_stream(5, phases, seed)] == [0, 1, 1, 2, 2]


@pytest.mark.parametrize(("n", "phases", "match"), [
    (-1, [{0: 1}], "non-negative"),
    (10, [], "at least one"),
    (10, [{10: 1.0}], "class"),
    (10, [{3: -1.0}], "weight"),
    (10, [{3: 0.0}], "no positive"),
])
def test_class_mix_stream_rejects_bad_arguments(n, phases, match):
    with pytest.raises(ValueError, match=match):
        list(class_mix_stream(n, phases, 0))


def _output_lsb(model, output: str) -> float:
    """The largest scale of a DequantizeLinear writing ``output`` (in any branch): one
    step of the quantized value behind a float output."""
    inits, nodes = _inits(model), _nodes(model)
    names, todo = set(), [output]
    while todo:  # an If's output is written by the matching output of each branch
        name = todo.pop()
        names.add(name)
        for n in nodes:
            if n.op_type == "If" and name in n.output:
                k = list(n.output).index(name)
                todo += [a.g.output[k].name for a in n.attribute
                         if a.type == onnx.AttributeProto.GRAPH]
    return max(float(inits[n.input[1]]) for n in nodes
               if n.op_type == "DequantizeLinear" and names & set(n.output))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_reference_interpreter_matches_onnxruntime(name):
    """The host's reference interpreter on the bundled QDQ model against onnxruntime
    executing the graph literally (ORT_DISABLE_ALL): float outputs within one step of
    their quantized value, integer outputs (expert, path) and top-1 equal, on 64
    held-out digits."""
    import onnxruntime as ort

    from host.onnx_import import load_onnx
    from host.reference import run_reference

    model = _model(name, True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    oracle = ort.InferenceSession(model.SerializeToString(), options,
                                  providers=["CPUExecutionProvider"])
    names = [o.name for o in oracle.get_outputs()]
    graph = load_onnx(model)
    x = SPECS[name].prepare(_split().x_test[:64])
    for j in range(len(x)):
        want = dict(zip(names, oracle.run(None, {"input": x[j:j + 1]}), strict=True))
        got = run_reference(graph, {"input": x[j:j + 1]})
        for out, value in want.items():
            if value.dtype.kind == "f":
                err = np.abs(got[out] - value).max()
                assert err <= _output_lsb(model, out) * (1 + 1e-3), f"{out}[{j}]: {err}"
            else:
                np.testing.assert_array_equal(got[out], value, err_msg=f"{out}[{j}]")
        assert got["logits"].argmax() == want["logits"].argmax(), f"top-1 of digit {j}"
