"""Integer quantization arithmetic shared by the golden model and the host compiler."""

from __future__ import annotations

import math

import numpy as np


def rshift_rne(x, shift):
    """Arithmetic right shift rounding half to even (ONNX QuantizeLinear rounding).

    ``x`` is an int64 array (or int) with ``|x| < 2**62``; ``0 <= shift <= 63``, an int
    or an integer array broadcast against ``x`` (a shift per element or column).
    """
    x = np.asarray(x, dtype=np.int64)
    if np.ndim(shift) == 0:
        shift = int(shift)
        if shift == 0:
            return x
        q = x >> shift
        r = x - (q << shift)
        half = np.int64(1) << (shift - 1)
        up = (r > half) | ((r == half) & ((q & 1) == 1))
        return q + up.astype(np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    q = x >> shift
    r = x - (q << shift)
    half = (np.int64(1) << np.maximum(shift - 1, 0)) * (shift > 0)
    up = (shift > 0) & ((r > half) | ((r == half) & ((q & 1) == 1)))
    return q + up.astype(np.int64)


def requantize(acc, mult, shift, zp: int, lo: int = -128, hi: int = 127):
    """``clamp(zp + rshift_rne(acc * mult, shift), lo, hi)`` as int8 (the ``vreq`` formula).

    ``mult`` and ``shift`` are ints, or arrays broadcast against ``acc`` (per-column
    requantization: one multiplier and shift per output channel).
    """
    prod = np.asarray(acc, dtype=np.int64) * np.asarray(mult, dtype=np.int64)
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


def quantize_multipliers_shared(scales) -> tuple[list[int], int]:
    """Fixed-point form of several non-negative scales sharing one shift (``vadd``).

    Returns ``(mults, shift)`` with ``mults[i] / 2**shift ~= scales[i]``, every
    ``mults[i] < 2**31`` and ``0 <= shift <= 63``: the largest shift that keeps the
    biggest multiplier within 31 bits, so the largest scale keeps 31 significant bits
    (where the shift range allows).
    A zero scale gives a zero multiplier. Raises ``ValueError`` when a scale is
    negative or not finite, all are zero, or the largest is too large.
    """
    scales = [float(s) for s in scales]
    if not all(math.isfinite(s) and s >= 0 for s in scales) or not any(scales):
        raise ValueError(f"scales {scales!r} must be finite, non-negative, not all zero")
    _, shift = quantize_multiplier(max(scales))
    while True:
        mults = [round(s * (1 << shift)) for s in scales]
        if max(mults) < 1 << 31:
            return mults, shift
        shift -= 1  # rounding carried into bit 31
        if shift < 0:  # pragma: no cover - quantize_multiplier already refused
            raise ValueError(f"scales {scales!r} are too large for 31-bit multipliers")


def multiplier_is_exact(scale: float, mult: int, shift: int) -> bool:
    """True when ``mult / 2**shift`` equals ``scale`` exactly (no rounding of the scale)."""
    from fractions import Fraction

    return Fraction(mult, 1 << shift) == Fraction(float(scale))
