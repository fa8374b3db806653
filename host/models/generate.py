"""Train the bundled digit models in numpy and write them as float and QDQ ONNX files.

Run ``python -m host.models.generate`` to regenerate every file of ``host/models/``
(``--out DIR`` writes elsewhere). Training uses fixed seeds, so the ONNX bytes come
out the same on every run on the same machine.

``mlp`` and ``cnn`` are quantized by onnxruntime itself:
``quantize_static(..., quant_format=QDQ, activation_type=QInt8, weight_type=QInt8)``
with the MinMax calibrator over ``calibration.npz``, per-tensor weights and the
default options (:data:`ONNXRUNTIME_QUANTIZED`).

``moe`` and ``early_exit`` hold ``If`` nodes, whose branch bodies onnxruntime's QDQ
quantizer leaves in float (onnxruntime 1.32 quantizes the top graph only: 8 of
``moe``'s 9 ``Gemm`` stay float). No tool writes their QDQ form, so this module
builds it in the layout that quantizer gives a graph without branches:

* every activation tensor a quantized op reads or writes gets one
  ``QuantizeLinear -> DequantizeLinear`` pair, int8 with a per-tensor scale and zero
  point from the min/max over the calibration sample (the range widened to hold 0),
  names ``T_scale``, ``T_zero_point``, ``T_QuantizeLinear_Output``,
  ``T_DequantizeLinear_Output``;
* weights are stored int8, symmetric in [-127, 127] with zero point 0
  (``W_quantized``, ``W_scale``, ``W_zero_point``) behind a ``DequantizeLinear``;
* biases are stored int32 with scale ``s_in * s_w`` and zero point 0
  (``B_quantized``, ``B_quantized_scale``, ``B_quantized_zero_point``);
* ReLU is fused as onnxruntime does by default: the ``Relu`` node is removed and the
  ``QuantizeLinear`` after the ``Gemm``/``Conv`` uses the calibrated range of the
  ReLU output (zero point -128), so the int8 clamp performs the ReLU;
* ``MaxPool`` output reuses its input's scale and zero point; ``Flatten``,
  ``ArgMax``, ``Equal`` and ``If`` are not quantized (they read dequantized tensors);
* a quantized graph output (or ``If``-branch output) keeps its name on the
  ``DequantizeLinear`` output; the producer writes ``T_QuantizeLinear_Input``.

Calibration runs every ``If`` branch on every calibration input (branches inlined),
so each expert's ranges come from the whole calibration sample.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from host.datasets import DigitsSplit, load_digits_split
from host.models import (
    CALIBRATION_FILE,
    CLASS_GROUPS,
    MODEL_DIR,
    MODEL_NAMES,
    NUM_EXPERTS,
    SPECS,
    model_filename,
    run_reference,
)

OPSET = 19
IR_VERSION = 9
#: Models without ``If``: quantized by onnxruntime's ``quantize_static``.
ONNXRUNTIME_QUANTIZED = ("mlp", "cnn")
SPLIT_SEED = 0
N_CALIBRATION = 48
#: Share of training samples labelled "exit" for the early-exit gate.
EXIT_TARGET = 0.6


# --------------------------------------------------------------------------------------
# numpy training


class _Adam:
    """Adam over a dict of float64 parameter arrays (updated in place)."""

    def __init__(self, params: dict[str, np.ndarray], wd: float):
        self.params, self.wd, self.t = params, wd, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: dict[str, np.ndarray], lr: float) -> None:
        self.t += 1
        b1, b2 = 0.9, 0.999
        for k, g in grads.items():
            if k.endswith("_W"):  # decay weights only: small weights quantize per-tensor well
                g = g + self.wd * self.params[k]
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh = self.m[k] / (1 - b1**self.t)
            vh = self.v[k] / (1 - b2**self.t)
            self.params[k] -= lr * mh / (np.sqrt(vh) + 1e-8)


def _fit(params, grad_fn, x, y, *, epochs, seed, lr=0.01, batch=32, wd=1e-4):
    """Minibatch Adam with a cosine learning-rate decay; returns ``params``."""
    rng = np.random.default_rng(seed)
    opt = _Adam(params, wd)
    for ep in range(epochs):
        lr_ep = lr * 0.5 * (1 + math.cos(math.pi * ep / epochs))
        perm = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            idx = perm[i : i + batch]
            opt.step(grad_fn(params, x[idx], y[idx]), lr_ep)
    return params


def _init_dense(rng, params, name, n_in, n_out):
    params[f"{name}_W"] = rng.normal(0, math.sqrt(2 / n_in), (n_out, n_in))
    params[f"{name}_B"] = np.zeros(n_out)


def _init_conv(rng, params, name, c_in, c_out):
    params[f"{name}_W"] = rng.normal(0, math.sqrt(2 / (9 * c_in)), (c_out, c_in, 3, 3))
    params[f"{name}_B"] = np.zeros(c_out)


def _dense(p, name, x):
    return x @ p[f"{name}_W"].T + p[f"{name}_B"]


def _dense_back(p, name, x, dz, grads):
    """Accumulate the layer's gradients into ``grads``; return d(loss)/d(x)."""
    grads[f"{name}_W"] = grads.get(f"{name}_W", 0) + dz.T @ x
    grads[f"{name}_B"] = grads.get(f"{name}_B", 0) + dz.sum(0)
    return dz @ p[f"{name}_W"]


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _xent_grad(z, y):
    """Gradient of the mean cross-entropy with respect to the logits ``z``."""
    d = _softmax(z)
    d[np.arange(len(y)), y] -= 1
    return d / len(y)


def _im2col(x):
    """(N, C, H, W) -> (N, H, W, C*9) patches of a 3x3 pad-1 convolution, (c, ky, kx) order."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, ky : ky + h, kx : kx + w] for ky in range(3) for kx in range(3)],
                    axis=2)
    return cols.transpose(0, 3, 4, 1, 2).reshape(n, h, w, c * 9)


def _conv(p, name, cols):
    w = p[f"{name}_W"]
    out = cols @ w.reshape(len(w), -1).T + p[f"{name}_B"]
    return out.transpose(0, 3, 1, 2)


def _conv_back(p, name, cols, dout, grads, shape):
    w = p[f"{name}_W"]
    d = dout.transpose(0, 2, 3, 1)  # N, H, W, O
    grads[f"{name}_W"] = (d.reshape(-1, len(w)).T @ cols.reshape(-1, cols.shape[-1])).reshape(
        w.shape)
    grads[f"{name}_B"] = d.sum((0, 1, 2))
    if shape is None:  # first layer: no input gradient needed
        return None
    n, c, h, wd = shape
    dcols = (d @ w.reshape(len(w), -1)).reshape(n, h, wd, c, 9)
    dxp = np.zeros((n, c, h + 2, wd + 2))
    for k in range(9):
        ky, kx = divmod(k, 3)
        dxp[:, :, ky : ky + h, kx : kx + wd] += dcols[..., k].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def _pool(x):
    n, c, h, w = x.shape
    r = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = r.max(axis=(3, 5))
    return out, r == out[:, :, :, None, :, None]


def _pool_back(dout, mask):
    n, c, h, _, w, _ = mask.shape
    return (mask * dout[:, :, :, None, :, None]).reshape(n, c, 2 * h, 2 * w)


def _mlp_forward(p, x, prefix=""):
    h = np.maximum(_dense(p, f"{prefix}fc1", x), 0)
    return _dense(p, f"{prefix}fc2", h)


def _mlp_grad(p, x, y, prefix=""):
    g = {}
    h = np.maximum(_dense(p, f"{prefix}fc1", x), 0)
    z = _dense(p, f"{prefix}fc2", h)
    dh = _dense_back(p, f"{prefix}fc2", h, _xent_grad(z, y), g)
    _dense_back(p, f"{prefix}fc1", x, dh * (h > 0), g)
    return g


def train_mlp(data: DigitsSplit) -> dict[str, np.ndarray]:
    """64 -> 32 (ReLU) -> 10."""
    rng = np.random.default_rng(101)
    p: dict[str, np.ndarray] = {}
    _init_dense(rng, p, "fc1", 64, 32)
    _init_dense(rng, p, "fc2", 32, 10)
    return _fit(p, _mlp_grad, data.x_train, data.y_train, epochs=40, seed=102)


def _cnn_forward(p, x, grads=None, y=None):
    """Logits of the CNN; with ``grads`` and ``y``, also fill in the gradients."""
    c1 = _im2col(x)
    a1 = np.maximum(_conv(p, "conv1", c1), 0)
    p1, m1 = _pool(a1)
    c2 = _im2col(p1)
    a2 = np.maximum(_conv(p, "conv2", c2), 0)
    p2, m2 = _pool(a2)
    f = p2.reshape(len(x), -1)
    z = _dense(p, "fc", f)
    if grads is None:
        return z
    df = _dense_back(p, "fc", f, _xent_grad(z, y), grads)
    da2 = _pool_back(df.reshape(p2.shape), m2) * (a2 > 0)
    dp1 = _conv_back(p, "conv2", c2, da2, grads, p1.shape)
    da1 = _pool_back(dp1, m1) * (a1 > 0)
    _conv_back(p, "conv1", c1, da1, grads, None)
    return z


def train_cnn(data: DigitsSplit) -> dict[str, np.ndarray]:
    """Conv 3x3 (8) ReLU, MaxPool 2, Conv 3x3 (16) ReLU, MaxPool 2, Flatten, Gemm 64 -> 10."""
    rng = np.random.default_rng(201)
    p: dict[str, np.ndarray] = {}
    _init_conv(rng, p, "conv1", 1, 8)
    _init_conv(rng, p, "conv2", 8, 16)
    _init_dense(rng, p, "fc", 64, 10)

    def grad(p, x, y):
        g: dict[str, np.ndarray] = {}
        _cnn_forward(p, x, g, y)
        return g

    return _fit(p, grad, data.train_images.astype(np.float64), data.y_train, epochs=30,
                seed=202)


def _group_of(y):
    lut = np.zeros(10, dtype=np.int64)
    for k, group in enumerate(CLASS_GROUPS):
        lut[list(group)] = k
    return lut[y]


def train_moe(data: DigitsSplit) -> dict[str, np.ndarray]:
    """Linear gate 64 -> 4 trained on class groups; one 64-32-10 MLP per routed subset."""
    rng = np.random.default_rng(301)
    p: dict[str, np.ndarray] = {}
    _init_dense(rng, p, "gate", 64, NUM_EXPERTS)

    def gate_grad(p, x, g):
        grads: dict[str, np.ndarray] = {}
        _dense_back(p, "gate", x, _xent_grad(_dense(p, "gate", x), g), grads)
        return grads

    x, y = data.x_train, data.y_train
    _fit(p, gate_grad, x, _group_of(y), epochs=60, seed=302)
    route = _dense(p, "gate", x).argmax(1)
    for k in range(NUM_EXPERTS):
        sel = route == k
        if sel.sum() < 50:
            raise RuntimeError(f"gate routes only {sel.sum()} training samples to expert {k}")
        e: dict[str, np.ndarray] = {}
        _init_dense(rng, e, f"e{k}_fc1", 64, 32)
        _init_dense(rng, e, f"e{k}_fc2", 32, 10)
        prefix = f"e{k}_"
        _fit(e, lambda p, xb, yb, pre=prefix: _mlp_grad(p, xb, yb, pre), x[sel], y[sel],
             epochs=60, seed=310 + k)
        p.update(e)
    return p


def _ee_grad(p, x, y):
    """Joint loss: cross-entropy of head1 plus cross-entropy of the deep head."""
    g = {}
    h1 = np.maximum(_dense(p, "fc1", x), 0)
    z1 = _dense(p, "head1", h1)
    h2 = np.maximum(_dense(p, "fc2", h1), 0)
    z2 = _dense(p, "fc3", h2)
    dh1 = _dense_back(p, "head1", h1, _xent_grad(z1, y), g)
    dh2 = _dense_back(p, "fc3", h2, _xent_grad(z2, y), g)
    dh1 = dh1 + _dense_back(p, "fc2", h1, dh2 * (h2 > 0), g)
    _dense_back(p, "fc1", x, dh1 * (h1 > 0), g)
    return g


def train_early_exit(data: DigitsSplit) -> dict[str, np.ndarray]:
    """Trunk 64-32 with head1 and a deep path 32-32-10, then a 32 -> 2 exit gate.

    The gate's target is "exit" (class 0) when head1 is right and confident: its
    softmax top probability is above the threshold that labels ``EXIT_TARGET`` of the
    training samples exit.
    """
    rng = np.random.default_rng(401)
    p: dict[str, np.ndarray] = {}
    _init_dense(rng, p, "fc1", 64, 32)
    _init_dense(rng, p, "head1", 32, 10)
    _init_dense(rng, p, "fc2", 32, 32)
    _init_dense(rng, p, "fc3", 32, 10)
    x, y = data.x_train, data.y_train
    _fit(p, _ee_grad, x, y, epochs=40, seed=402)
    h1 = np.maximum(_dense(p, "fc1", x), 0)
    prob = _softmax(_dense(p, "head1", h1))
    conf = np.where(prob.argmax(1) == y, prob.max(1), 0.0)
    threshold = np.quantile(conf, 1 - EXIT_TARGET)
    target = np.where(conf > threshold, 0, 1)
    _init_dense(rng, p, "gate", 32, 2)

    def gate_grad(p, hb, tb):
        grads: dict[str, np.ndarray] = {}
        _dense_back(p, "gate", hb, _xent_grad(_dense(p, "gate", hb), tb), grads)
        return grads

    _fit(p, gate_grad, h1, target, epochs=60, seed=403)
    return p


TRAINERS: dict[str, Callable[[DigitsSplit], dict[str, np.ndarray]]] = {
    "mlp": train_mlp,
    "cnn": train_cnn,
    "moe": train_moe,
    "early_exit": train_early_exit,
}


# --------------------------------------------------------------------------------------
# ONNX building


def _compute_scale_zp(rmin, rmax, qmin, qmax, symmetric):
    """onnxruntime's ``compute_scale_zp``: float32 scale, integer zero point."""
    rmin = min(np.float32(rmin), np.float32(0))
    rmax = max(np.float32(rmax), np.float32(0))
    if symmetric:
        absmax = max(abs(rmin), abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (np.float64(rmax) - np.float64(rmin)) / (np.float64(qmax) - np.float64(qmin))
    if scale < np.finfo(np.float32).tiny:
        return np.float32(1.0), 0
    zp = 0 if symmetric else int(np.round(qmin - np.float64(rmin) / scale))
    return np.float32(scale), zp


class _Builder:
    """Collects the nodes and initializers of one graph of a model.

    ``mode`` is ``"float"`` (the float model), ``"calib"`` (float with every ``If``
    branch inlined, for calibration) or ``"qdq"`` (quantized, needs ``ranges``:
    float-model tensor name -> (min, max)). Layer methods take and return
    float-model tensor names; in QDQ mode ``self.q`` maps a quantized tensor to its
    dequantized name and quantization parameters.
    """

    def __init__(self, mode, params, ranges=None, parent=None):
        self.mode, self.p, self.ranges = mode, params, ranges
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.q: dict[str, tuple[str, np.float32, int]] = dict(parent.q) if parent else {}

    # helpers --------------------------------------------------------------------------
    def _init(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def _node(self, op, inputs, outputs, name, **attrs):
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))

    def _qdq(self, t, scale, zp):
        """Add the Q/DQ pair of activation ``t`` with the given parameters."""
        s = self._init(f"{t}_scale", np.float32(scale))
        z = self._init(f"{t}_zero_point", np.int8(zp))
        self._node("QuantizeLinear", [t, s, z], [f"{t}_QuantizeLinear_Output"],
                   f"{t}_QuantizeLinear")
        dq = f"{t}_DequantizeLinear_Output"
        self._node("DequantizeLinear", [f"{t}_QuantizeLinear_Output", s, z], [dq],
                   f"{t}_DequantizeLinear")
        self.q[t] = (dq, np.float32(scale), zp)

    def act(self, t):
        """Tensor to feed a quantized op: ``t`` dequantized, quantizing it if needed."""
        if self.mode != "qdq":
            return t
        if t not in self.q:
            self._qdq(t, *_compute_scale_zp(*self.ranges[t], -128, 127, symmetric=False))
        return self.q[t][0]

    def _weight(self, name, s_in):
        """Weight and bias inputs of layer ``name`` (DQ'd in QDQ mode)."""
        w = self.p[f"{name}_W"].astype(np.float32)
        b = self.p[f"{name}_B"].astype(np.float32)
        wn, bn = f"{name}_W", f"{name}_B"
        if self.mode != "qdq":
            return self._init(wn, w), self._init(bn, b)
        s_w, _ = _compute_scale_zp(w.min(), w.max(), -127, 127, symmetric=True)
        wq = np.clip(np.round(w / s_w), -127, 127).astype(np.int8)
        self._init(f"{wn}_quantized", wq)
        self._init(f"{wn}_scale", s_w)
        self._init(f"{wn}_zero_point", np.int8(0))
        self._node("DequantizeLinear",
                   [f"{wn}_quantized", f"{wn}_scale", f"{wn}_zero_point"],
                   [f"{wn}_DequantizeLinear_Output"], f"{wn}_DequantizeLinear")
        s_b = np.float32(s_in * s_w)
        bq = np.clip(np.round(b / s_b), -(2**31), 2**31 - 1).astype(np.int32)
        self._init(f"{bn}_quantized", bq)
        self._init(f"{bn}_quantized_scale", s_b)
        self._init(f"{bn}_quantized_zero_point", np.int32(0))
        self._node("DequantizeLinear",
                   [f"{bn}_quantized", f"{bn}_quantized_scale", f"{bn}_quantized_zero_point"],
                   [f"{bn}_DequantizeLinear_Output"], f"{bn}_DequantizeLinear")
        return f"{wn}_DequantizeLinear_Output", f"{bn}_DequantizeLinear_Output"

    def _layer(self, op, x, name, relu, out, **attrs):
        xin = self.act(x)
        s_in = self.q[x][1] if self.mode == "qdq" else None
        w, b = self._weight(name, s_in)
        y = out or (f"{name}_relu_out" if relu else f"{name}_out")
        if self.mode == "qdq":
            # ReLU fused: the layer writes the ReLU output name, Q/DQ uses its range
            self._node(op, [xin, w, b], [y], name, **attrs)
            self.act(y)
        elif relu:
            self._node(op, [xin, w, b], [f"{name}_out"], name, **attrs)
            self._node("Relu", [f"{name}_out"], [y], f"{name}_relu")
        else:
            self._node(op, [xin, w, b], [y], name, **attrs)
        return y

    # layers ---------------------------------------------------------------------------
    def gemm(self, x, name, relu=False, out=None):
        """``y = x @ W.T + B`` (Gemm, transB=1), optionally followed by ReLU."""
        return self._layer("Gemm", x, name, relu, out, transB=1)

    def conv(self, x, name, relu=False):
        """3x3 convolution, stride 1, padding 1, optionally followed by ReLU."""
        return self._layer("Conv", x, name, relu, None, kernel_shape=[3, 3],
                           pads=[1, 1, 1, 1], strides=[1, 1])

    def maxpool(self, x, name):
        """2x2 max pooling, stride 2; QDQ output shares the input's parameters."""
        y = f"{name}_out"
        self._node("MaxPool", [self.act(x)], [y], name, kernel_shape=[2, 2], strides=[2, 2])
        if self.mode == "qdq":
            self._qdq(y, *self.q[x][1:])
        return y

    def flatten(self, x, name):
        y = f"{name}_out"
        src = self.q[x][0] if self.mode == "qdq" and x in self.q else x
        self._node("Flatten", [src], [y], name, axis=1)
        return y

    def argmax(self, x, name, out):
        """Index of the largest value along axis 1, shape (1,) int64 (first on ties)."""
        self._node("ArgMax", [self.act(x)], [out], name, axis=1, keepdims=0)
        return out

    def equal(self, x, k, name):
        c = self._init(f"{name}_k", np.int64(k))
        self._node("Equal", [x, c], [f"{name}_out"], name)
        return f"{name}_out"

    def if_(self, cond, then_fn, else_fn, out, shape, name):
        """``out = then_fn(...) if cond else else_fn(...)``; each fn builds its branch
        in a sub-builder and returns its float output tensor name."""
        if self.mode == "calib":
            t = then_fn(self)
            else_fn(self)
            self._node("Identity", [t], [out], f"{name}_calib")
            return out
        branches = {}
        for key, fn in (("then_branch", then_fn), ("else_branch", else_fn)):
            sub = _Builder(self.mode, self.p, self.ranges, parent=self)
            t = fn(sub)
            branches[key] = sub.graph(f"{name}_{key.split('_')[0]}",
                                      [helper.make_tensor_value_info(t, TensorProto.FLOAT,
                                                                     shape)])
        self._node("If", [cond], [out], name, **branches)
        return out

    def graph(self, name, outputs, inputs=(), doc=""):
        """The finished GraphProto; quantized outputs keep their name on the DQ."""
        nodes = self.nodes
        if self.mode == "qdq":
            for vi in outputs:
                t = vi.name
                if t in self.q:
                    ren = {t: f"{t}_QuantizeLinear_Input", self.q[t][0]: t}
                    for n in nodes:
                        n.input[:] = [ren.get(i, i) for i in n.input]
                        n.output[:] = [ren.get(o, o) for o in n.output]
        return helper.make_graph(nodes, name, list(inputs), list(outputs), self.inits,
                                 doc_string=doc)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _build_mlp(g):
    h = g.gemm("input", "fc1", relu=True)
    g.gemm(h, "fc2", out="logits")


def _build_cnn(g):
    a = g.conv("input", "conv1", relu=True)
    a = g.maxpool(a, "pool1")
    a = g.conv(a, "conv2", relu=True)
    a = g.maxpool(a, "pool2")
    a = g.flatten(a, "flatten")
    g.gemm(a, "fc", out="logits")


def _expert(k):
    def build(g):
        h = g.gemm("input", f"e{k}_fc1", relu=True)
        return g.gemm(h, f"e{k}_fc2", out=f"e{k}_logits")

    return build


def _build_moe(g):
    g.gemm("input", "gate", out="gate_logits")
    g.argmax("gate_logits", "gate_argmax", "expert")

    def choose(k):
        # expert k if expert == k, else the remaining experts (nested Ifs)
        def build(sg):
            cond = sg.equal("expert", k, f"is_expert{k}")
            other = _expert(k + 1) if k == NUM_EXPERTS - 2 else choose(k + 1)
            out = "logits" if k == 0 else f"route{k}_logits"
            return sg.if_(cond, _expert(k), other, out, [1, 10], f"route{k}")

        return build

    choose(0)(g)


def _build_early_exit(g):
    h1 = g.gemm("input", "fc1", relu=True)
    g.gemm(h1, "gate", out="gate_logits")
    g.argmax("gate_logits", "gate_argmax", "path")
    cond = g.equal("path", 0, "is_exit")

    def exit_now(sg):
        return sg.gemm(h1, "head1", out="head1_logits")

    def go_deep(sg):
        h2 = sg.gemm(h1, "fc2", relu=True)
        return sg.gemm(h2, "fc3", out="deep_logits")

    g.if_(cond, exit_now, go_deep, "logits", [1, 10], "exit")


BUILDERS = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    "moe": _build_moe,
    "early_exit": _build_early_exit,
}


def build_model(name: str, params: dict[str, np.ndarray], mode: str,
                ranges: dict[str, tuple[float, float]] | None = None) -> onnx.ModelProto:
    """Build model ``name`` (float, calib or qdq mode, see ``_Builder``)."""
    spec = SPECS[name]
    g = _Builder(mode, params, ranges)
    BUILDERS[name](g)
    outputs = [_vi(o.name, o.elem_type, list(o.shape)) for o in spec.outputs]
    kind = "QDQ int8 (onnxruntime static-quantizer layout)" if mode == "qdq" else "float32"
    graph = g.graph(name, outputs, [_vi("input", TensorProto.FLOAT, list(spec.input_shape))],
                    doc=f"{spec.summary} {kind}.")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="adaptive-npu host.models.generate",
                              producer_version="1", ir_version=IR_VERSION)
    if mode != "calib":
        onnx.checker.check_model(model, full_check=True)
    return model


def calibrate(name: str, params: dict[str, np.ndarray], x_cal: np.ndarray):
    """Min/max of every float tensor of the model over the calibration inputs."""
    from onnx.reference import ReferenceEvaluator

    model = build_model(name, params, "calib")
    sess = ReferenceEvaluator(model)
    x_cal = SPECS[name].prepare(x_cal)
    ranges: dict[str, tuple[float, float]] = {}
    for i in range(len(x_cal)):
        res = sess.run(None, {"input": x_cal[i : i + 1]}, intermediate=True)
        for t, v in res.items():
            if isinstance(v, np.ndarray) and v.dtype == np.float32:
                lo, hi = ranges.get(t, (np.inf, -np.inf))
                ranges[t] = (min(lo, float(v.min())), max(hi, float(v.max())))
    return ranges


def quantize_with_onnxruntime(name: str, float_model: onnx.ModelProto,
                              x_cal: np.ndarray) -> onnx.ModelProto:
    """``float_model`` quantized by onnxruntime's ``quantize_static`` (QDQ, int8
    activations and weights, per tensor, MinMax over ``x_cal``, one inference each)."""
    import tempfile

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rows = iter(SPECS[name].prepare(x_cal).astype(np.float32))

        def get_next(self):
            x = next(self.rows, None)
            return None if x is None else {"input": x[None]}

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(float_model, src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=False)
        model = onnx.load(str(dst))
    onnx.checker.check_model(model, full_check=True)
    return model


# --------------------------------------------------------------------------------------
# driver


def _save_npz(path, **arrays):
    """``np.savez`` with fixed zip timestamps, so the file's bytes are reproducible."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for key, a in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)


def _numpy_logits(name, p, x):
    """The float model in numpy (checks the ONNX float export)."""
    if name == "mlp":
        return _mlp_forward(p, x)
    if name == "cnn":
        return _cnn_forward(p, SPECS[name].prepare(x).astype(np.float64))
    if name == "moe":
        route = _dense(p, "gate", x).argmax(1)
        out = np.stack([_mlp_forward(p, x, f"e{k}_") for k in range(NUM_EXPERTS)])
        return out[route, np.arange(len(x))]
    h1 = np.maximum(_dense(p, "fc1", x), 0)
    deep = _dense(p, "fc3", np.maximum(_dense(p, "fc2", h1), 0))
    exit_ = _dense(p, "gate", h1).argmax(1) == 0
    return np.where(exit_[:, None], _dense(p, "head1", h1), deep)


def generate(out_dir: Path | str = MODEL_DIR, *, names: Sequence[str] = MODEL_NAMES,
             evaluate: bool = True,
             log: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """Train the models ``names`` (default all) and write their ONNX files and the
    calibration sample into ``out_dir``.

    With ``evaluate`` (the default), also measure float and QDQ accuracy on the test
    split with ``onnx.reference`` (and write ``README.md`` when all models were
    built); returns the metrics per model (empty without ``evaluate``). A model is
    the same whichever other models are built with it.
    """
    unknown = set(names) - set(MODEL_NAMES)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; models are {MODEL_NAMES}")
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    # one BLAS thread: faster for these tiny matrices, and one summation order
    with threadpool_limits(limits=1, user_api="blas"):
        return _generate(Path(out_dir), names, evaluate, log)


def _generate(out_dir, names, evaluate, log):
    out_dir.mkdir(parents=True, exist_ok=True)
    data = load_digits_split(SPLIT_SEED)
    cal_idx = np.sort(np.random.default_rng(7).choice(len(data.x_train), N_CALIBRATION,
                                                      replace=False))
    x_cal, y_cal = data.x_train[cal_idx], data.y_train[cal_idx]
    _save_npz(out_dir / CALIBRATION_FILE, x=x_cal, y=y_cal, index=cal_idx)
    metrics: dict[str, dict[str, float]] = {}
    for name in (n for n in MODEL_NAMES if n in names):
        t0 = time.perf_counter()
        params = TRAINERS[name](data)
        float_model = build_model(name, params, "float")
        if name in ONNXRUNTIME_QUANTIZED:
            qdq_model = quantize_with_onnxruntime(name, float_model, x_cal)
        else:
            qdq_model = build_model(name, params, "qdq", calibrate(name, params, x_cal))
        onnx.save(float_model, out_dir / model_filename(name, quantized=False))
        onnx.save(qdq_model, out_dir / model_filename(name, quantized=True))
        t_train = time.perf_counter() - t0
        if not evaluate:
            log(f"{name}: trained and written in {t_train:.1f} s")
            continue
        pred_np = _numpy_logits(name, params, data.x_test).argmax(1)
        m = {"numpy": float((pred_np == data.y_test).mean())}
        for kind, model in (("float", float_model), ("qdq", qdq_model)):
            out = run_reference(model, name, data.x_test)
            if kind == "float" and (out["logits"].argmax(1) != pred_np).mean() > 0.01:
                raise RuntimeError(f"{name}: float ONNX export disagrees with numpy")
            m[kind] = float((out["logits"].argmax(1) == data.y_test).mean())
            if name == "moe":
                e = out["expert"]
                m[f"{kind}_experts"] = np.bincount(e, minlength=NUM_EXPERTS)
                m[f"{kind}_in_group"] = [float(np.isin(data.y_test[e == k], g).mean())
                                         for k, g in enumerate(CLASS_GROUPS)]
            if name == "early_exit":
                m[f"{kind}_exit"] = float((out["path"] == 0).mean())
        metrics[name] = m
        extra = ""
        if name == "moe":
            extra = f", routed per expert (qdq) {m['qdq_experts'].tolist()}"
        if name == "early_exit":
            extra = f", early exits {m['float_exit']:.1%} float / {m['qdq_exit']:.1%} qdq"
        log(f"{name}: test accuracy float {m['float']:.2%} (numpy {m['numpy']:.2%}), "
            f"QDQ {m['qdq']:.2%}{extra}; {t_train:.1f} s to train")
    if evaluate and set(names) == set(MODEL_NAMES):
        (out_dir / "README.md").write_text(_readme(metrics, data))
    return metrics


def _readme(metrics, data) -> str:
    rows = []
    for name in MODEL_NAMES:
        s, m = SPECS[name], metrics[name]
        rows.append(f"| `{name}` | {s.summary} | {m['float']:.2%} | {m['qdq']:.2%} |")
    moe, ee = metrics["moe"], metrics["early_exit"]
    groups = ", ".join("{" + ", ".join(map(str, g)) + "}" for g in CLASS_GROUPS)
    return f"""# Bundled models

Four small digit classifiers, trained in numpy by `generate.py` on scikit-learn's
bundled digits (8x8 images, pixels scaled to [0, 1]) with the split of
`host.datasets.load_digits_split(seed={SPLIT_SEED})`: {len(data.y_train)} training and
{len(data.y_test)} test images. Each model ships twice:

- `NAME_float.onnx`: the float32 model.
- `NAME.onnx`: the same model quantized in QDQ format: `mlp` and `cnn` by
  onnxruntime's `quantize_static` (QDQ, QInt8 activations and weights, per tensor,
  MinMax calibration over `calibration.npz`); `moe` and `early_exit` by
  `generate.py` in the layout that quantizer writes, because it leaves the bodies
  of `If` nodes in float. The layout: `QuantizeLinear`/`DequantizeLinear` pairs,
  int8 activations with a per-tensor scale and zero point from min/max
  calibration, symmetric int8 weights with zero point 0, int32 biases with scale
  `s_in * s_w`. **ReLU is fused** as onnxruntime does by default: there is no
  `Relu` node in the QDQ models; the `QuantizeLinear` after a `Gemm`/`Conv` has the
  ReLU output's range (zero point -128), so its int8 clamp is the ReLU. `ArgMax`,
  `Equal`, `If` and `Flatten` read dequantized tensors.

All models are ONNX opset {OPSET} (IR version {IR_VERSION}) and take **one digit per
inference** (batch dimension 1): input `input` of shape (1, 64), or (1, 1, 8, 8) for
`cnn` (`host.datasets.to_images`). Output `logits` is float32 (1, 10).
`calibration.npz` holds the {N_CALIBRATION} training inputs used for calibration
(`x`, `y`, and `index` into the training split).

| model | what it is | float accuracy | QDQ accuracy |
|---|---|---|---|
{chr(10).join(rows)}

Accuracies are on the test split, measured with `onnx.reference.ReferenceEvaluator`.

## Control flow

Only `ArgMax -> Equal(constant) -> If` decides, so the NPU can run it as `vargmax`
plus a branch.

- `moe`: the gate (`Gemm` 64 -> 4) was trained to predict the class group
  ({groups}); `ArgMax` gives output `expert` (int64, shape (1,)); nested `If`s
  (`expert == 0`, else `== 1`, else `== 2`, else expert 3) each run one
  64 -> 32 (ReLU) -> 10 expert, trained on the training inputs the gate routes to it.
  Test inputs routed per expert (QDQ): {moe['qdq_experts'].tolist()}
  (float: {moe['float_experts'].tolist()}); share of each expert's inputs that are in
  its class group (QDQ): {", ".join(f"{v:.0%}" for v in moe['qdq_in_group'])}.
- `early_exit`: trunk 64 -> 32 (ReLU); an exit gate (`Gemm` 32 -> 2, `ArgMax` as
  output `path`, int64 (1,)). `path == 0` exits with head1 (`Gemm` 32 -> 10, computed
  in the `If`'s then-branch); otherwise the else-branch continues
  32 -> 32 (ReLU) -> 10. The gate was trained to predict when head1 is right and
  confident (the {EXIT_TARGET:.0%} most confident correct training answers).
  Early exits on the test split: {ee['qdq_exit']:.1%} QDQ, {ee['float_exit']:.1%} float.

## Regenerate

```sh
.venv/bin/python -m host.models.generate          # rewrites every file here
.venv/bin/python -m host.models.generate --no-eval --out /tmp/m mlp   # just one model
```

Training uses fixed seeds and one BLAS thread: the ONNX files come out
byte-identical on the same machine (`tests/test_models.py` checks it against the
files shipped here; after changing `generate.py`, regenerate and commit the results).
`--no-eval` skips the accuracy runs and leaves `README.md` alone.
"""


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m host.models.generate [--out DIR] [--no-eval] [MODEL ...]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=MODEL_DIR, help="output directory")
    ap.add_argument("--no-eval", action="store_true",
                    help="skip the accuracy evaluation (and README.md)")
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models to build: {', '.join(MODEL_NAMES)} (default: all)")
    args = ap.parse_args(argv)
    bad = [m for m in args.models if m not in MODEL_NAMES]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; models are {', '.join(MODEL_NAMES)}")
    generate(args.out, names=args.models or MODEL_NAMES, evaluate=not args.no_eval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
