"""Integer quantization arithmetic shared by the golden model and the host compiler."""

from __future__ import annotations

import math

import numpy as np


def rshift_rne(x, shift: int):
    """Arithmetic right shift rounding half to even (ONNX QuantizeLinear rounding).

    ``x`` is an int64 array (or int) with ``|x| < 2**62``; ``0 <= shift <= 63``.
    """
    x = np.asarray(x, dtype=np.int64)
    if shift == 0:
        return x
    q = x >> shift
    r = x - (q << shift)
    half = np.int64(1) << (shift - 1)
    up = (r > half) | ((r == half) & ((q & 1) == 1))
    return q + up.astype(np.int64)


def requantize(acc, mult: int, shift: int, zp: int, lo: int = -128, hi: int = 127):
    """``clamp(zp + rshift_rne(acc * mult, shift), lo, hi)`` as int8 (the ``vreq`` formula)."""
    prod = np.asarray(acc, dtype=np.int64) * np.int64(mult)
    y = rshift_rne(prod, shift) + zp
    return np.clip(y, max(lo, -128), min(hi, 127)).astype(np.int8)


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """Fixed-point form of a positive real scale: ``(mult, shift)`` with
    ``mult / 2**shift ~= scale``, ``mult < 2**31`` and ``0 <= shift <= 63``.

    The multiplier keeps 31 significant bits where the shift range allows.
    Raises ``ValueError`` for a scale that is not positive and finite or too large.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale {scale!r} must be positive and finite")
    mant, exp = math.frexp(scale)  # scale = mant * 2**exp, 0.5 <= mant < 1
    shift = 31 - exp
    if shift < 0:
        raise ValueError(f"scale {scale!r} is too large for a 31-bit multiplier")
    shift = min(shift, 63)
    mult = round(scale * (1 << shift))
    if mult >= 1 << 31:  # rounding carried into bit 31
        mult >>= 1
        shift -= 1
    return mult, shift
