"""The zoo's float models, built with the tools users have: torch and scikit-learn.

Each :class:`ZooModel` exports its float ONNX model and supplies its calibration and
test inputs. Everything is seeded and runs on one thread, so a rerun on the same
machine gives the same weights. torch models go through the TorchScript exporter
(``torch.onnx.export(..., dynamo=False)``), the one most published models went
through; ``cnn_dynamo`` goes through the torch.export-based exporter (``dynamo=True``,
the default since torch 2.9, which needs onnxscript).

Needs the ``models`` extra (torch, skl2onnx); imported only by the generator.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from torch import nn

from host.datasets import load_digits_split

from . import MODEL_NAMES

#: Opset of every exported model: one that onnxruntime's quantizer handles fully
#: (QuantizeLinear with ``axis`` since 13; skl2onnx is tested up to 22).
OPSET = 17
#: Opset of the dynamo exporter: the oldest it implements (it converts down otherwise).
DYNAMO_OPSET = 18
#: ai.onnx.ml opset of the skl2onnx model.
ML_OPSET = 3
SEED = 0
N_CALIBRATION = 48
#: Test inputs per digits model; the synthetic blocks take fewer, their float
#: outputs are larger and the zoo is committed.
N_TEST = 16
N_TEST_BLOCKS = 8
INPUT = "input"


@dataclass
class ZooModel:
    """One float model of the zoo.

    Members
    -------
    name : the file-name part (``{name}.float.onnx``).
    what : one line for the README.
    exporter : the tool that wrote the float ONNX.
    export : returns the float model.
    calibration : inputs for ``quantize_static``'s calibration, each one inference.
    test_inputs : the oracle's inputs, stacked (one inference per row).
    """

    name: str
    what: str
    exporter: str
    export: Callable[[], onnx.ModelProto]
    calibration: np.ndarray
    test_inputs: np.ndarray


def _deterministic() -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _export_torch(module: nn.Module, example: np.ndarray, output: str,
                  dynamic_batch: bool = False) -> onnx.ModelProto:
    """The TorchScript exporter; ``dynamic_batch`` makes the leading dimension symbolic
    (``dynamic_axes``, as torch users write it for batching)."""
    module.eval()
    buf = io.BytesIO()
    axes = {INPUT: {0: "batch"}, output: {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(module, (torch.from_numpy(example),), buf, dynamo=False,
                      opset_version=OPSET, input_names=[INPUT], output_names=[output],
                      dynamic_axes=axes)
    return onnx.load_model_from_string(buf.getvalue())


def _export_dynamo(module: nn.Module, example: np.ndarray, output: str) -> onnx.ModelProto:
    """The torch.export-based exporter (``dynamo=True``, needs onnxscript)."""
    module.eval()
    program = torch.onnx.export(module, (torch.from_numpy(example),), dynamo=True,
                                opset_version=DYNAMO_OPSET, input_names=[INPUT],
                                output_names=[output], optimize=True, verbose=False)
    return program.model_proto


# ---- digits models ------------------------------------------------------------------


def _digits():
    split = load_digits_split(seed=SEED)
    return split, split.x_train[:N_CALIBRATION], split.x_test[:N_TEST]


class DigitsCNN(nn.Module):
    """Conv 3x3 1->4 + ReLU, Conv 3x3 stride 2 4->8 + ReLU, Flatten, Linear 128->10."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
            nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(8 * 4 * 4, 10))

    def forward(self, x):
        return self.body(x)


def _images(x: np.ndarray) -> np.ndarray:
    """Flat digits as one (1, 1, 8, 8) inference per row."""
    return x.reshape(-1, 1, 1, 8, 8).astype(np.float32)


def _rows(x: np.ndarray) -> np.ndarray:
    """Flat digits as one (1, 64) inference per row."""
    return x.reshape(-1, 1, 64).astype(np.float32)


def _train(module: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int) -> None:
    """A few epochs of Adam: seconds on the digits, enough for realistic ranges."""
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(SEED)
    module.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(module(xt[idx]), yt[idx]).backward()
            opt.step()
    module.eval()


def _digits_cnn(module_cls: type[nn.Module]):
    """A digits image classifier trained under the fixed seed; (net, calibration, test)."""
    split, calib, test = _digits()
    _deterministic()
    net = module_cls()
    _train(net, split.x_train.reshape(-1, 1, 8, 8), split.y_train, epochs=8)
    return net, _images(calib), _images(test)


def cnn_pc() -> ZooModel:
    net, calib, test = _digits_cnn(DigitsCNN)
    return ZooModel("cnn_pc", DigitsCNN.__doc__, f"torch {torch.__version__} (dynamo=False)",
                    lambda: _export_torch(net, test[0], "logits"), calib, test)


class PoolConcat(nn.Module):
    """Conv 3x3 1->4 + ReLU, AvgPool2d 2, Conv 1x1 4->4 + ReLU, torch.cat of both (8
    channels), AdaptiveAvgPool2d(1), Flatten, Linear 8->10."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.branch = nn.Conv2d(4, 4, 1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x):
        y = self.pool(torch.relu(self.conv(x)))
        return self.head(torch.cat([y, torch.relu(self.branch(y))], dim=1))


def pool_cat() -> ZooModel:
    net, calib, test = _digits_cnn(PoolConcat)
    return ZooModel("pool_cat", PoolConcat.__doc__, f"torch {torch.__version__} (dynamo=False)",
                    lambda: _export_torch(net, test[0], "logits"), calib, test)


def cnn_dynamo() -> ZooModel:
    """The digits CNN of ``cnn_pc`` (same seed and training), written by the
    torch.export-based exporter."""
    net, calib, test = _digits_cnn(DigitsCNN)
    return ZooModel("cnn_dynamo", "The digits CNN of cnn_pc, exported by the torch.export-"
                    "based exporter.", f"torch {torch.__version__} (dynamo=True, onnxscript "
                    f"{__import__('onnxscript').__version__})",
                    lambda: _export_dynamo(net, test[0], "logits"), calib, test)


def mlp_skl() -> ZooModel:
    """scikit-learn's MLPClassifier, converted by skl2onnx with ``zipmap=False``.

    ``zipmap=False`` makes the probabilities a plain float tensor instead of a
    sequence of maps (``ZipMap``): the option skl2onnx documents for numeric
    consumers, and the form onnxruntime's quantizer and the NPU can take. The label
    branch (``ArgMax``, ``ArrayFeatureExtractor`` over the classes, ``Cast``,
    ``Reshape``) stays. The batch dimension is left symbolic (``None``), as users
    write it.
    """
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neural_network import MLPClassifier

    split, calib, test = _digits()
    clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=300, random_state=SEED)
    clf.fit(split.x_train, split.y_train)

    def export():
        return to_onnx(clf, initial_types=[(INPUT, FloatTensorType([None, 64]))],
                       options={id(clf): {"zipmap": False}},
                       target_opset={"": OPSET, "ai.onnx.ml": ML_OPSET})

    return ZooModel("mlp_skl", "scikit-learn MLPClassifier 64->32 (ReLU)->10, "
                    "skl2onnx zipmap=False (label branch kept)",
                    f"skl2onnx {__import__('skl2onnx').__version__}",
                    export, _rows(calib), _rows(test))


# ---- synthetic blocks ------------------------------------------------------------------


def _random_inputs(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Calibration and test inputs in [-1, 1] from distinct seeds: the test inputs
    share the calibrated range, so they exercise rounding rather than saturation."""
    calib = np.random.default_rng(SEED + 1).uniform(-1, 1, (N_CALIBRATION, *shape))
    test = np.random.default_rng(SEED + 2).uniform(-1, 1, (N_TEST_BLOCKS, *shape))
    return calib.astype(np.float32), test.astype(np.float32)


class DepthwiseSeparable(nn.Module):
    """Depthwise Conv 3x3 (groups=8) + ReLU, pointwise Conv 1x1 8->16 + ReLU."""

    def __init__(self, channels=8, out=16):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, out, 1)

    def forward(self, x):
        return torch.relu(self.pointwise(torch.relu(self.depthwise(x))))


class Residual(nn.Module):
    """Conv 3x3 8->8 + ReLU, Conv 3x3 8->8, Add the block's input, ReLU."""

    def __init__(self, channels=8):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


class SelfAttention(nn.Module):
    """One head over 8 tokens of 16: Q/K/V Linear, Q K^T / 4, Softmax, times V."""

    def __init__(self, dim=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x):
        scores = torch.matmul(self.q(x), self.k(x).transpose(-2, -1)) * self.scale
        return torch.matmul(torch.softmax(scores, dim=-1), self.v(x))


class TorchIdioms(nn.Module):
    """What torch writes for common layers, batch symbolic: Conv 3x3 stride 2 + ReLU,
    Conv 3x3 dilation 2 + ReLU, Split into channel halves, Concat swapped, Flatten,
    Linear (Gemm transB), Reshape to (-1, 4, 4), Transpose, MatMul, Unsqueeze,
    Squeeze."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.fc = nn.Linear(8 * 4 * 4, 16)
        self.mix = nn.Parameter(torch.randn(4, 4) / 2)

    def forward(self, x):
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        a, b = torch.split(y, 4, dim=1)
        y = torch.relu(self.fc(torch.flatten(torch.cat([b, a], dim=1), 1)))
        t = torch.matmul(y.reshape(-1, 4, 4).transpose(1, 2), self.mix)
        return t.unsqueeze(1).squeeze(1)


def _block(name: str, module_cls: type[nn.Module], shape: tuple[int, ...],
           dynamic_batch: bool = False) -> ZooModel:
    _deterministic()
    net = module_cls()  # torch's default initialization under the fixed seed
    calib, test = _random_inputs(shape)
    exporter = f"torch {torch.__version__} (dynamo=False" + \
        (", dynamic_axes batch)" if dynamic_batch else ")")
    return ZooModel(name, module_cls.__doc__, exporter,
                    lambda: _export_torch(net, test[0], "output", dynamic_batch), calib, test)


def dwsep() -> ZooModel:
    return _block("dwsep", DepthwiseSeparable, (1, 8, 8, 8))


def residual() -> ZooModel:
    return _block("residual", Residual, (1, 8, 8, 8))


def attention() -> ZooModel:
    return _block("attention", SelfAttention, (1, 8, 16))


def idioms() -> ZooModel:
    return _block("idioms", TorchIdioms, (1, 2, 8, 8), dynamic_batch=True)


BUILDERS = {"cnn_pc": cnn_pc, "mlp_skl": mlp_skl, "dwsep": dwsep, "residual": residual,
            "attention": attention, "idioms": idioms, "pool_cat": pool_cat,
            "cnn_dynamo": cnn_dynamo}
assert tuple(BUILDERS) == MODEL_NAMES, "verif.zoo.MODEL_NAMES lists every builder"
