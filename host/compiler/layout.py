"""How a tensor's elements sit in NPU memory.

The NPU computes convolutions and pooling channels-last (NHWC: a pixel's channels
are contiguous, so a convolution window row is one contiguous run of bytes the
array can stream). The graph's tensors are NCHW, as ONNX writes them. A
:class:`Layout` records the permutation: the device bytes of a tensor are its
*source* value (of shape ``src_shape``) transposed by ``axes`` and flattened.
Reshape and Flatten never move data, so they keep their input's layout: any
reshape of the source has the same C-order elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NHWC = (0, 2, 3, 1)


@dataclass(frozen=True)
class Layout:
    """Device order of a tensor: ``source.transpose(axes).ravel()``.

    Members
    -------
    src_shape : logical shape of the source the bytes were laid out from.
    axes : the transpose applied before flattening (identity: row-major).
    """

    src_shape: tuple[int, ...]
    axes: tuple[int, ...]

    @classmethod
    def row_major(cls, shape) -> Layout:
        shape = tuple(int(d) for d in shape)
        return cls(shape, tuple(range(len(shape))))

    @classmethod
    def nhwc(cls, shape) -> Layout:
        if len(shape) != 4:
            raise ValueError(f"NHWC needs a 4-D shape, got {shape}")
        return cls(tuple(int(d) for d in shape), NHWC)

    @property
    def is_row_major(self) -> bool:
        return self.axes == tuple(range(len(self.axes)))

    @property
    def device_shape(self) -> tuple[int, ...]:
        """Shape of the transposed source (the device's row-major view)."""
        return tuple(self.src_shape[a] for a in self.axes)

    def to_device(self, value: np.ndarray) -> np.ndarray:
        """The bytes to write for ``value`` (any reshape of the source), flat."""
        v = np.asarray(value).reshape(self.src_shape)
        return np.ascontiguousarray(v.transpose(self.axes)).ravel()

    def from_device(self, flat: np.ndarray, shape) -> np.ndarray:
        """The logical value of shape ``shape`` held by device bytes ``flat``."""
        v = np.asarray(flat).reshape(self.device_shape)
        return v.transpose(np.argsort(self.axes)).reshape(shape)

    def row_permutation(self, rows: int) -> np.ndarray | None:
        """For a tensor viewed as ``(rows, K)``: ``perm`` with device column ``j``
        holding logical column ``perm[j]`` of every row, or ``None`` if row-major.

        Raises ``ValueError`` when the layout mixes rows (the batch axis must lead).
        """
        if self.is_row_major:
            return None
        size = int(np.prod(self.src_shape))
        if self.axes[0] != 0 or self.src_shape[0] != rows:
            raise ValueError(f"layout {self.axes} of {self.src_shape} interleaves rows")
        k = size // rows
        inner = np.arange(k).reshape(self.src_shape[1:])
        return inner.transpose([a - 1 for a in self.axes[1:]]).ravel()
