"""The bundled digits data set (scikit-learn's ``load_digits``), split and streamed.

Everything here is offline and deterministic: the 1797 8x8 digit images ship with
scikit-learn. Pixels are scaled from 0..16 to float32 in [0, 1]. The models in
``host.models`` are trained on :func:`load_digits_split` (seed 0) and evaluated on
its test split; :func:`class_mix_stream` draws from the same test split with a class
mix that changes phase by phase, the workload of the adaptive benchmark.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

__all__ = [
    "NUM_CLASSES",
    "DigitsSplit",
    "StreamSample",
    "class_mix_stream",
    "load_digits_split",
    "to_images",
]

NUM_CLASSES = 10
#: Fraction of each class held out for the test split.
TEST_FRACTION = 0.2


def to_images(x: np.ndarray) -> np.ndarray:
    """Return flat digits ``(N, 64)`` (or one digit ``(64,)``) as a ``(N, 1, 8, 8)`` view.

    The result is a view (no copy) in NCHW layout, row-major pixels, as the ``cnn``
    model takes them.
    """
    x = np.asarray(x)
    if x.shape[-1:] != (64,) or x.ndim not in (1, 2):
        raise ValueError(f"expected shape (N, 64) or (64,), got {x.shape}")
    return x.reshape(-1, 1, 8, 8)


@dataclass(frozen=True)
class DigitsSplit:
    """A deterministic stratified train/test split of the digits.

    Members
    -------
    x_train, x_test : np.ndarray
        float32 ``(N, 64)`` images, pixels in [0, 1], row-major 8x8.
    y_train, y_test : np.ndarray
        int64 ``(N,)`` labels in 0..9.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def train_images(self) -> np.ndarray:
        """The training images as an ``(N, 1, 8, 8)`` view."""
        return to_images(self.x_train)

    @property
    def test_images(self) -> np.ndarray:
        """The test images as an ``(N, 1, 8, 8)`` view."""
        return to_images(self.x_test)


@lru_cache(maxsize=1)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # heavy import: only when data is wanted

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def load_digits_split(seed: int = 0) -> DigitsSplit:
    """Split the digits into train (about 80 %) and test (about 20 %) sets.

    The split is stratified (each class keeps its share in both sets) and depends
    only on ``seed``: the same seed gives the same arrays on every machine. Samples
    in each set are in a seeded random order. The returned arrays are fresh copies.
    """
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    x, y = _raw_digits()
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in range(NUM_CLASSES):
        idx = np.flatnonzero(y == c)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * TEST_FRACTION))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    train = np.concatenate(train_idx)[rng.permutation(sum(map(len, train_idx)))]
    test = np.concatenate(test_idx)[rng.permutation(sum(map(len, test_idx)))]
    return DigitsSplit(x[train].copy(), y[train].copy(), x[test].copy(), y[test].copy())


class StreamSample(NamedTuple):
    """One item of :func:`class_mix_stream`.

    Members
    -------
    index : int
        Position in the stream, 0-based.
    phase : int
        Index of the phase this sample belongs to.
    x : np.ndarray
        float32 ``(64,)`` image (use :func:`to_images` for the ``cnn`` layout).
    label : int
        True class.
    """

    index: int
    phase: int
    x: np.ndarray
    label: int


def _phase_probs(phase: Mapping[int, float], k: int) -> np.ndarray:
    p = np.zeros(NUM_CLASSES)
    for c, w in phase.items():
        if not (isinstance(c, int | np.integer) and 0 <= c < NUM_CLASSES):
            raise ValueError(f"phase {k}: class {c!r} is not in 0..{NUM_CLASSES - 1}")
        if not (np.isfinite(w) and w >= 0):
            raise ValueError(f"phase {k}: weight {w!r} of class {c} must be finite and >= 0")
        p[c] = w
    if p.sum() <= 0:
        raise ValueError(f"phase {k}: weights {dict(phase)!r} have no positive entry")
    return p / p.sum()


def class_mix_stream(
    n: int,
    phases: Sequence[Mapping[int, float]],
    seed: int,
    *,
    split_seed: int = 0,
) -> Iterator[StreamSample]:
    """Yield ``n`` test-split digits whose class mix changes phase by phase.

    The stream is cut into ``len(phases)`` consecutive phases of near-equal length
    (phase ``k`` covers stream positions ``k*n//P`` to ``(k+1)*n//P``). Each phase maps
    classes to relative weights (normalized; a class left out has weight 0): within a
    phase every sample's class is drawn independently with those probabilities, then
    a test digit of that class is drawn uniformly (with replacement, so a stream may
    be longer than the test split). The test split is ``load_digits_split(split_seed)``.
    The same arguments give the same stream.

    Raises ``ValueError`` for a negative ``n``, no phases, a class outside 0..9, a
    negative or non-finite weight, or a phase whose weights are all zero.
    """
    if not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    phases = list(phases)
    if not phases:
        raise ValueError("phases must hold at least one class mix")
    probs = [_phase_probs(ph, k) for k, ph in enumerate(phases)]
    split = load_digits_split(split_seed)
    by_class = [np.flatnonzero(split.y_test == c) for c in range(NUM_CLASSES)]
    rng = np.random.default_rng(seed)
    n_ph = len(phases)
    i = 0
    for k, p in enumerate(probs):
        length = (k + 1) * n // n_ph - k * n // n_ph
        classes = rng.choice(NUM_CLASSES, size=length, p=p)
        for c in classes:
            j = by_class[c][rng.integers(len(by_class[c]))]
            yield StreamSample(i, k, split.x_test[j].copy(), int(split.y_test[j]))
            i += 1
