"""The four MLPerf Tiny reference architectures in PyTorch, at their real sizes.

Each follows the Keras reference of mlcommons/tiny, ``benchmark/training/``, layer by
layer (counts, channels, kernel sizes, strides):

* ``resnet8``: ``image_classification/keras_model.py`` ``resnet_v1_eembc`` as the
  v1.0 submissions ran it (16 first-stage filters: 78k parameters, 12.5M MACs).
* ``ds_cnn``: ``keyword_spotting/keras_model.py``, ``model_name == 'ds_cnn'``.
* ``mobilenet_v1_025``: ``visual_wake_words/vww_model.py`` ``mobilenet_v1``.
* ``fc_autoencoder``: ``anomaly_detection/keras_model.py`` ``get_model(640)``.

Keras ``padding='same'`` pads asymmetrically when the padding is odd (the extra row
and column at the bottom and right); ``nn.ZeroPad2d`` before an unpadded convolution
says the same, and onnxruntime's ``quant_pre_process`` folds the ``Pad`` into the
``Conv``'s ``pads``. The TorchScript exporter folds every BatchNorm into its
convolution; a BatchNorm after a ``Linear`` it leaves in the graph, so the
autoencoder folds those with ``torch.nn.utils.fusion.fuse_linear_bn_eval`` first.
Dropout is kept and exports to nothing in eval mode. The classifiers end in the
reference's Softmax.

Weights are seeded, not trained (the data sets are not on this machine): Keras's
``he_normal`` initialization, then each BatchNorm's statistics set from a pass over
synthetic inputs, so every layer's activations have the ranges of a trained
network's (zero mean, unit variance before each ReLU) and calibration sees them.

Needs the ``models`` extra (torch); imported only by the generator.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .models import SEED, ZooModel, _deterministic, _export_torch

#: Calibration inputs per model (each one inference), and committed test inputs.
N_CALIBRATION = 32
N_TEST = 4
#: MobileNet's 96x96x3 inputs are 110 kB each as float32: fewer are committed.
N_TEST_LARGE = 2
#: Synthetic inputs that set the BatchNorm statistics.
N_STATISTICS = 64


def _same(kernel: int | tuple[int, int], stride: int | tuple[int, int],
          size: tuple[int, int]) -> nn.ZeroPad2d:
    """Keras ``padding='same'`` for one input size: (left, right, top, bottom)."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    pads = []
    for k, s, n in ((kw, sw, size[1]), (kh, sh, size[0])):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        pads += [total // 2, total - total // 2]
    return nn.ZeroPad2d(tuple(pads))


def _conv_bn(cin: int, cout: int, kernel, stride, size: tuple[int, int], groups: int = 1,
             relu: bool = True) -> nn.Sequential:
    """Keras Conv2D/DepthwiseConv2D (``padding='same'``) + BatchNormalization [+ ReLU]."""
    layers = [_same(kernel, stride, size),
              nn.Conv2d(cin, cout, kernel, stride=stride, groups=groups),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class ResNet8(nn.Module):
    """ResNet-8: Conv 3x3 16, three residual stacks (16, 32 s2, 64 s2; 1x1 s2
    shortcuts), AvgPool 8, Dense 10, Softmax; input 32x32x3."""

    def __init__(self, filters: int = 16, classes: int = 10):
        super().__init__()
        f = filters
        self.stem = _conv_bn(3, f, 3, 1, (32, 32))
        self.s1 = nn.Sequential(_conv_bn(f, f, 3, 1, (32, 32)),
                                _conv_bn(f, f, 3, 1, (32, 32), relu=False))
        self.s2 = nn.Sequential(_conv_bn(f, 2 * f, 3, 2, (32, 32)),
                                _conv_bn(2 * f, 2 * f, 3, 1, (16, 16), relu=False))
        self.s2_short = nn.Conv2d(f, 2 * f, 1, stride=2)
        self.s3 = nn.Sequential(_conv_bn(2 * f, 4 * f, 3, 2, (16, 16)),
                                _conv_bn(4 * f, 4 * f, 3, 1, (8, 8), relu=False))
        self.s3_short = nn.Conv2d(2 * f, 4 * f, 1, stride=2)
        self.pool = nn.AvgPool2d(8)
        self.dense = nn.Linear(4 * f, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.s1(x))
        x = torch.relu(self.s2_short(x) + self.s2(x))
        x = torch.relu(self.s3_short(x) + self.s3(x))
        return torch.softmax(self.dense(self.pool(x).flatten(1)), dim=-1)


class DSCNN(nn.Module):
    """DS-CNN: Conv 10x4 s2 64, four depthwise-separable blocks (DW 3x3, PW 1x1 64),
    AvgPool 24x5, Dense 12, Softmax; input 49x10 MFCC."""

    def __init__(self, filters: int = 64, classes: int = 12, size=(49, 10)):
        super().__init__()
        half = (-(-size[0] // 2), -(-size[1] // 2))  # 25x5 after the stride-2 stem
        blocks = [_conv_bn(1, filters, (10, 4), 2, size), nn.Dropout(0.2)]
        for _ in range(4):
            blocks += [_conv_bn(filters, filters, 3, 1, half, groups=filters),
                       _conv_bn(filters, filters, 1, 1, half)]
        # the reference's pool is (49 // 2, 10 // 2) = 24x5 over the 25x5 map
        blocks += [nn.Dropout(0.4), nn.AvgPool2d((size[0] // 2, size[1] // 2))]
        self.body = nn.Sequential(*blocks)
        self.dense = nn.Linear(filters, classes)

    def forward(self, x):
        return torch.softmax(self.dense(self.body(x).flatten(1)), dim=-1)


#: MobileNetV1's depthwise-separable layers 2-14: (stride of the depthwise conv,
#: output channels of the pointwise conv at width 0.25).
MOBILENET_LAYERS = ((1, 16), (2, 32), (1, 32), (2, 64), (1, 64), (2, 128),
                    (1, 128), (1, 128), (1, 128), (1, 128), (1, 128), (2, 256), (1, 256))


class MobileNetV1(nn.Module):
    """MobileNetV1 width 0.25: Conv 3x3 s2 8, 13 depthwise-separable layers (8 -> 256
    channels, 96 -> 3 pixels), AvgPool 3, Dense 2, Softmax; input 96x96x3."""

    def __init__(self, classes: int = 2, size: int = 96):
        super().__init__()
        ch, n = 8, size
        layers = [_conv_bn(3, ch, 3, 2, (n, n))]
        n //= 2
        for stride, out in MOBILENET_LAYERS:
            layers.append(_conv_bn(ch, ch, 3, stride, (n, n), groups=ch))
            n = -(-n // stride)
            layers.append(_conv_bn(ch, out, 1, 1, (n, n)))
            ch = out
        layers.append(nn.AvgPool2d(n))
        self.body = nn.Sequential(*layers)
        self.dense = nn.Linear(ch, classes)

    def forward(self, x):
        return torch.softmax(self.dense(self.body(x).flatten(1)), dim=-1)


class FCAutoencoder(nn.Module):
    """FC autoencoder: Dense 128 x4, Dense 8, Dense 128 x4 (each + BatchNorm + ReLU),
    Dense 640; input 640 (5 frames of 128 log-mel bins)."""

    def __init__(self, inputs: int = 640):
        super().__init__()
        widths = (128, 128, 128, 128, 8, 128, 128, 128, 128)
        layers, n = [], inputs
        for w in widths:
            layers += [nn.Linear(n, w), nn.BatchNorm1d(w), nn.ReLU()]
            n = w
        self.body = nn.Sequential(*layers, nn.Linear(n, inputs))

    def forward(self, x):
        return self.body(x)

    def fold_batchnorm(self) -> None:
        """Fold each BatchNorm into the Linear before it (eval mode)."""
        from torch.nn.utils.fusion import fuse_linear_bn_eval

        mods = list(self.body)
        out = []
        for m in mods:
            if isinstance(m, nn.BatchNorm1d):
                out[-1] = fuse_linear_bn_eval(out[-1], m)
            else:
                out.append(m)
        self.body = nn.Sequential(*out)


def _he_normal(net: nn.Module) -> None:
    """Keras's ``he_normal`` on every weight (fan in, truncated at 2 sigma), zero biases."""
    for m in net.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            # the std of the normal before truncation (Keras's constant for 2 sigma)
            std = (2 / m.weight[0].numel()) ** 0.5 / 0.87962566103423978
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(m.bias)


def _set_batchnorm_statistics(net: nn.Module, x: np.ndarray) -> None:
    """Running mean and variance of every BatchNorm over ``x`` (cumulative average)."""
    for m in net.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    net.train()
    with torch.no_grad():
        for batch in torch.from_numpy(x).split(16):
            net(batch)
    net.eval()


def _images(n: int, size: int, seed: int) -> np.ndarray:
    """Smooth random RGB images in [0, 1] (pixels / 255 as the references feed them):
    8x8 random colour fields upsampled bilinearly, plus fine noise."""
    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.uniform(0, 1, (n, 3, 8, 8)).astype(np.float32))
    x = nn.functional.interpolate(coarse, size=(size, size), mode="bilinear",
                                  align_corners=False).numpy()
    x = x + rng.normal(0, 0.05, x.shape)
    return np.clip(x, 0, 1).astype(np.float32)


def _features(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Standard-normal feature maps (MFCCs, log-mel frames after normalization)."""
    return np.random.default_rng(seed).normal(0, 1, (n, *shape)).astype(np.float32)


def _one_per_row(x: np.ndarray) -> np.ndarray:
    """Stacked samples as one batch-1 inference per row."""
    return x[:, None]


def _build(name: str, net: nn.Module, make_inputs, n_test: int, output: str) -> ZooModel:
    """Seed ``net``, set its BatchNorm statistics, and wrap it with its inputs."""
    _he_normal(net)
    _set_batchnorm_statistics(net, make_inputs(N_STATISTICS, SEED + 3))
    if isinstance(net, FCAutoencoder):
        net.fold_batchnorm()
    calib = _one_per_row(make_inputs(N_CALIBRATION, SEED + 1))
    test = _one_per_row(make_inputs(n_test, SEED + 2))
    return ZooModel(name, " ".join(type(net).__doc__.split()),
                    f"torch {torch.__version__} (dynamo=False)",
                    lambda: _export_torch(net, test[0], output), calib, test)


def resnet8() -> ZooModel:
    _deterministic()
    return _build("resnet8", ResNet8(), lambda n, s: _images(n, 32, s), N_TEST,
                  "probabilities")


def ds_cnn() -> ZooModel:
    _deterministic()
    return _build("ds_cnn", DSCNN(), lambda n, s: _features(n, (1, 49, 10), s), N_TEST,
                  "probabilities")


def mobilenet_v1_025() -> ZooModel:
    _deterministic()
    return _build("mobilenet_v1_025", MobileNetV1(), lambda n, s: _images(n, 96, s),
                  N_TEST_LARGE, "probabilities")


def fc_autoencoder() -> ZooModel:
    _deterministic()
    return _build("fc_autoencoder", FCAutoencoder(), lambda n, s: _features(n, (640,), s),
                  N_TEST, "reconstruction")


BUILDERS = {"resnet8": resnet8, "ds_cnn": ds_cnn, "mobilenet_v1_025": mobilenet_v1_025,
            "fc_autoencoder": fc_autoencoder}
