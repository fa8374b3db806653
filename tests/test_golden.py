"""The golden model against independent reference formulas written from the ISA text."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware import isa
from firmware.asm import assemble
from firmware.config import CONFIGS, NPUConfig
from firmware.golden import Machine, RunResult, TraceRecord, requantize, rshift_rne
from firmware.isa import ErrorCode

M32 = (1 << 32) - 1
HSET = settings(max_examples=200, deadline=None, database=None)


# ---- reference math (pure Python ints; no golden helpers) -----------------------------
def ref_rne(x: int, s: int) -> int:
    """x / 2**s rounded to nearest, ties to even, with integer arithmetic only."""
    q, r = divmod(x, 1 << s)  # floor division, 0 <= r < 2**s
    if 2 * r > (1 << s) or (2 * r == (1 << s) and q % 2 == 1):
        q += 1
    return q


def ref_clamp(v: int, lo: int, hi: int) -> int:
    return min(max(v, lo), hi)


def ref_requant(acc: int, mult: int, shift: int, zp: int, lo=-128, hi=127) -> int:
    return ref_clamp(zp + ref_rne(acc * mult, shift), max(lo, -128), min(hi, 127))


def wrap_i32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def signed(v: int) -> int:
    return wrap_i32(v)


# ---- machine helpers ------------------------------------------------------------------
def parts_for(config: NPUConfig, size: int = 4096):
    return [(i * size, size) for i in range(config.partitions)]


def run(src: str, m: Machine | None = None, *, config: NPUConfig | None = None,
        parts=None, args=(), max_cycles=None, dram_bytes=1 << 16) -> tuple[Machine, RunResult]:
    m = m or Machine(config, dram_bytes=dram_bytes)
    parts = parts_for(m.config) if parts is None else parts
    res = m.load_and_run(assemble(src), parts, args=args, max_cycles=max_cycles)
    return m, res


def run_ok(src: str, m: Machine | None = None, **kw) -> Machine:
    m, res = run(src, m, **kw)
    assert res.ok, f"{res.error.name} at pc {res.pc}: {res.message}\n{src}"
    return m


def sp_put(m: Machine, p: int, offset: int, data: np.ndarray):
    base, size = m.ptables[m.active_bank][m.pt_set][p]
    raw = np.ascontiguousarray(data).view(np.uint8).ravel()
    assert offset + raw.size <= size
    m.sp[base + offset: base + offset + raw.size] = raw


def sp_get(m: Machine, p: int, offset: int, n: int, dtype=np.int8) -> np.ndarray:
    base, _ = m.ptables[m.active_bank][m.pt_set][p]
    return m.sp[base + offset: base + offset + n * np.dtype(dtype).itemsize].view(dtype).copy()


def prepare(src_setup: str = "end", config=None) -> Machine:
    """A machine whose active bank already holds the standard partition table."""
    m, res = run(src_setup, config=config)
    assert res.ok
    return m


def cfg_lines(**kw) -> str:
    return "\n".join(f"cfg.{k} {v}" for k, v in kw.items())


# ---- rshift_rne / requantize ------------------------------------------------------------
RNE_CASES = [
    (5, 1, 2), (7, 1, 4), (-5, 1, -2), (-7, 1, -4), (1, 1, 0), (-1, 1, 0), (3, 1, 2),
    (-3, 1, -2), (6, 2, 2), (10, 2, 2), (-6, 2, -2), (-10, 2, -2), (14, 2, 4), (-14, 2, -4),
    (9, 2, 2), (11, 2, 3), (-9, 2, -2), (-11, 2, -3), (0, 5, 0),
    (12345, 0, 12345), (-12345, 0, -12345), (0, 0, 0), ((1 << 62) - 1, 0, (1 << 62) - 1),
    ((1 << 62) - 1, 63, 0), (-(1 << 62) + 1, 63, 0), (1, 63, 0), (-1, 63, 0),
    (1 << 61, 62, 0), (-(1 << 61), 62, 0), ((1 << 61) + 1, 62, 1), (-(1 << 61) - 1, 62, -1),
    (3 << 60, 61, 2), (-(3 << 60), 61, -2), (1 << 60, 61, 0), ((1 << 62) - 1, 62, 1),
    (-(1 << 62) + 1, 62, -1), ((1 << 62) - 1, 61, 2), (-(1 << 62) + 1, 61, -2),
]


@pytest.mark.parametrize("x, s, want", RNE_CASES)
def test_rshift_rne_edge_cases(x, s, want):
    assert ref_rne(x, s) == want == round(Fraction(x, 1 << s))
    assert int(rshift_rne(x, s)) == want, (x, s)
    assert int(rshift_rne(np.array([x], dtype=np.int64), s)[0]) == want


@HSET
@given(x=st.integers(-(1 << 62) + 1, (1 << 62) - 1), s=st.integers(0, 63))
def test_rshift_rne_matches_exact_rational_rounding(x, s):
    want = round(Fraction(x, 1 << s))  # Python rounds Fractions half to even
    assert ref_rne(x, s) == want
    assert int(rshift_rne(x, s)) == want


@HSET
@given(xs=st.lists(st.integers(-(1 << 53), 1 << 53), min_size=1, max_size=32),
       s=st.integers(0, 63))
def test_rshift_rne_matches_numpy_round_half_even(xs, s):
    x = np.array(xs, dtype=np.int64)
    # float64 holds these x exactly and dividing by 2**s is exact: np.round is RNE
    want = np.round(x.astype(np.float64) / 2.0 ** s).astype(np.int64)
    got = rshift_rne(x, s)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@HSET
@given(x=st.integers(-(1 << 53), 1 << 53), s=st.integers(1, 40))
def test_rshift_rne_ties(x, s):
    tie = x * (1 << s) + (1 << (s - 1))  # exactly x + 0.5 after the shift
    if abs(tie) >= 1 << 62:
        return
    want = x if x % 2 == 0 else x + 1
    assert int(rshift_rne(tie, s)) == want
    assert int(rshift_rne(-tie, s)) == -want


REQ_CASES = [  # acc, mult, shift, zp, lo, hi
    (0, 1 << 30, 30, 0, -128, 127),
    (100, 1 << 30, 30, 0, -128, 127),
    (1000, 1 << 30, 30, 0, -128, 127),   # saturate high
    (-1000, 1 << 30, 30, 0, -128, 127),  # saturate low
    (5, 1 << 30, 31, 0, -128, 127),      # 2.5 -> 2
    (7, 1 << 30, 31, 0, -128, 127),      # 3.5 -> 4
    (-5, 1 << 30, 31, 0, -128, 127),     # -2.5 -> -2
    (-7, 1 << 30, 31, 0, -128, 127),     # -3.5 -> -4
    (-1, 1, 1, 0, -128, 127),            # -0.5 -> 0
    (3, 1, 0, -100, -128, 127),          # shift 0, negative zero point
    (-50, 1, 0, -100, -128, 127),        # saturates through the zero point
    (50, 1, 0, -100, -128, 127),
    (2**31 - 1, 2**31 - 1, 63, 0, -128, 127),
    (-(2**31), -(2**31), 63, 0, -128, 127),   # product 2**62 / 2**63 = 0.5 -> 0
    (-(2**31), -(2**31), 62, 0, -128, 127),   # exactly 1
    (-(2**31), 2**31 - 1, 55, 3, -128, 127),
    (2**31 - 1, 2**31 - 1, 0, 0, -128, 127),
    (-(2**31), 2**31 - 1, 0, 0, -128, 127),
    (40, 1, 0, 10, 10, 127),             # ReLU: clip_lo = zp
    (-40, 1, 0, 10, 10, 127),
    (100, 1, 0, 0, -20, 30),
    (-100, 1, 0, 0, -20, 30),
    (25, 1, 0, 0, -20, 30),
]


@pytest.mark.parametrize("acc, mult, shift, zp, lo, hi", REQ_CASES)
def test_requantize_edge_cases(acc, mult, shift, zp, lo, hi):
    want = ref_requant(acc, mult, shift, zp, lo, hi)
    got = requantize(np.array([acc], dtype=np.int32), mult, shift, zp, lo, hi)
    assert got.dtype == np.int8
    assert int(got[0]) == want


@HSET
@given(acc=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=16),
       mult=st.integers(-(2**31), 2**31 - 1), shift=st.integers(0, 63),
       zp=st.integers(-128, 127), lo=st.integers(-128, 127), hi=st.integers(-128, 127))
def test_requantize_random(acc, mult, shift, zp, lo, hi):
    lo, hi = min(lo, hi), max(lo, hi)
    got = requantize(np.array(acc, dtype=np.int32), mult, shift, zp, lo, hi)
    want = [ref_requant(a, mult, shift, zp, lo, hi) for a in acc]
    assert got.tolist() == want


# ---- GEMM --------------------------------------------------------------------------
def gemm_program(M, K, N, config, xa, wa, ba, ya, q):
    """X (MxK) @ W (KxN) + bias -> requant -> Y, tiled by the array, with tokens.

    p0: X tile, p1: W tile, p2: biases, p3: the whole M x N output.
    """
    R, C = config.rows, config.cols
    tiles = [(n0, k0) for n0 in range(0, N, C) for k0 in range(0, K, R)]
    L = [
        f"li r1, {ba}",
        f"load p2, r0, r1, r0, 1, {4 * N}, push=next",
        f"cfg.out_stride {N}, pop=prev",
        cfg_lines(qmul=q["qmul"], qshift=q["qshift"], qzp=q["qzp"],
                  clip_lo=q["lo"], clip_hi=q["hi"]),
        f"li r4, {K}",
        f"li r5, {N}",
    ]
    for t, (n0, k0) in enumerate(tiles):
        kt, nt = min(R, K - k0), min(C, N - n0)
        last = t == len(tiles) - 1
        mode = "overwrite" if k0 == 0 else "accumulate"
        L += [
            f"li r2, {xa + k0}",
            f"li r3, {wa + k0 * N + n0}",
            f"load p0, r0, r2, r4, {M}, {kt}" + (", pop=next" if t else ""),
            f"load p1, r0, r3, r5, {kt}, {nt}, push=next",
            f"wload p1, r0, {kt}, {nt}, pop=prev",
            f"gemm.{mode} p0, r0, r0, {M}, swap=1" + ("" if last else ", push=prev"),
        ]
        if k0 + R >= K:  # last K tile of this column block
            L += [f"vbias p2, r0, r0, {M}, {nt}, off={4 * n0}",
                  f"vreq p3, r0, r0, {M}, {nt}, off={n0}" + (", push=next" if last else "")]
    L += [f"li r6, {ya}", f"store p3, r0, r6, r0, {M}, {N}, pop=prev", "end"]
    return "\n".join(L)


@pytest.mark.parametrize("cname", ["default", "small"])
@pytest.mark.parametrize("seed", range(8))
def test_gemm_tiled_against_numpy(cname, seed):
    config = CONFIGS[cname]
    rng = np.random.default_rng(seed)
    M, K, N = (int(v) for v in rng.integers(1, [17, 21, 21]))
    if seed == 0:
        M, K, N = 3, 2 * config.rows + 1, 2 * config.cols + 3  # ragged tiles on both axes
    X = rng.integers(-128, 128, (M, K), dtype=np.int64)
    W = rng.integers(-128, 128, (K, N), dtype=np.int64)
    bias = rng.integers(-(1 << 16), 1 << 16, N, dtype=np.int64)
    q = dict(qmul=int(rng.integers(1 << 20, 1 << 31)), qshift=int(rng.integers(28, 40)),
             qzp=int(rng.integers(-20, 21)), lo=int(rng.integers(-128, -60)),
             hi=int(rng.integers(60, 128)))
    xa, wa, ba, ya = 0x1000, 0x2000, 0x3000, 0x4000
    m = Machine(config, dram_bytes=1 << 16)
    m.dram[xa: xa + M * K] = X.astype(np.int8).view(np.uint8).ravel()
    m.dram[wa: wa + K * N] = W.astype(np.int8).view(np.uint8).ravel()
    m.dram[ba: ba + 4 * N] = bias.astype("<i4").view(np.uint8)
    src = gemm_program(M, K, N, config, xa, wa, ba, ya, q)
    res = m.load_and_run(assemble(src), parts_for(config))
    ctx = f"seed={seed} config={cname} M,K,N={M},{K},{N} q={q}"
    assert res.ok, f"{ctx}: {res.error.name} at pc {res.pc}: {res.message}"
    acc = X @ W + bias[None, :]  # int64, no overflow at these sizes
    want = np.array([[ref_requant(int(a), q["qmul"], q["qshift"], q["qzp"], q["lo"], q["hi"])
                      for a in row] for row in acc], dtype=np.int8)
    got = m.dram[ya: ya + M * N].view(np.int8).reshape(M, N)
    np.testing.assert_array_equal(got, want, err_msg=ctx)
    assert m.counters["macs"] == M * K * N, ctx
    assert m.counters["dram_write_bytes"] == M * N, ctx
    nblocks = -(-N // config.cols)  # X is re-read once per column block
    assert m.counters["dram_read_bytes"] == 4 * N + M * K * nblocks + K * N, ctx


def test_gemm_overwrite_vs_accumulate_and_gemm_stride():
    m = prepare()
    x = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)  # two rows of 8, stride 8
    w = np.arange(24, dtype=np.int8).reshape(4, 6) - 12
    sp_put(m, 0, 0, x)
    sp_put(m, 1, 0, w)
    # gemm_stride 8: rows start every 8 bytes but only k=4 bytes are used
    src = """
        cfg.gemm_stride 8
        li r1, 10
        wload p1, r0, 4, 6
        gemm.overwrite p0, r0, r1, 2, swap=1
        gemm.accumulate p0, r0, r1, 2, off=4
        end
    """
    m = run_ok(src, m)
    x64, w64 = x.astype(np.int64), w.astype(np.int64)
    want = x64[:, :4] @ w64 + x64[:, 4:] @ w64
    np.testing.assert_array_equal(m.acc[10:12, :6], want)
    assert not m.acc[10:12, 6:].any() and not m.acc[:10].any()


# ---- vector unit ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_vadd_against_reference(seed):
    rng = random.Random(seed)
    M, N = rng.randint(1, 6), rng.randint(1, 20)
    ist, ost = rng.choice([0, N + 3]), rng.choice([0, N + 5])
    c = dict(add_mul_a=rng.randint(-(2**31), 2**31 - 1), add_mul_b=rng.randint(1, 2**31 - 1),
             add_zp_a=rng.randint(-128, 127), add_zp_b=rng.randint(-128, 127),
             qshift=rng.randint(25, 40), qzp=rng.randint(-128, 127),
             clip_lo=rng.randint(-128, -1), clip_hi=rng.randint(0, 127),
             in_stride=ist, out_stride=ost)
    if seed == 0:
        c.update(add_mul_a=1 << 30, add_mul_b=1 << 30, qshift=31, add_zp_a=0, add_zp_b=0,
                 qzp=0, clip_lo=-128, clip_hi=127)  # (a + b) / 2, ties to even
    a = np.array([[rng.randint(-128, 127) for _ in range(N)] for _ in range(M)], np.int8)
    b = np.array([[rng.randint(-128, 127) for _ in range(N)] for _ in range(M)], np.int8)
    m = prepare()
    s_in = ist or N
    for i in range(M):
        sp_put(m, 1, i * s_in, a[i])
        sp_put(m, 2, 100 + i * s_in, b[i])
    src = f"""
        {cfg_lines(**c)}
        li r1, 100
        li r2, 7
        vadd p3, r2, p1, r0, p2, r1, {M}, {N}
        end
    """
    m = run_ok(src, m)
    s_out = ost or N
    for i in range(M):
        want = [ref_clamp(c["qzp"] + ref_rne(c["add_mul_a"] * (int(a[i, j]) - c["add_zp_a"])
                                             + c["add_mul_b"] * (int(b[i, j]) - c["add_zp_b"]),
                                             c["qshift"]), c["clip_lo"], c["clip_hi"])
                for j in range(N)]
        got = sp_get(m, 3, 7 + i * s_out, N).tolist()
        assert got == want, f"seed={seed} row {i} cfg={c}"


def test_vclip_with_strides():
    m = prepare()
    x = np.arange(-128, 128, dtype=np.int64).astype(np.int8)  # 256 values, 4 rows x 64
    sp_put(m, 0, 0, x)
    src = """
        cfg.clip_lo -5
        cfg.clip_hi 17
        cfg.in_stride 64
        cfg.out_stride 50
        li r1, 3
        vclip p1, r1, p0, r0, 4, 40
        end
    """
    m = run_ok(src, m)
    for i in range(4):
        want = [ref_clamp(int(v), -5, 17) for v in x[i * 64: i * 64 + 40]]
        assert sp_get(m, 1, 3 + i * 50, 40).tolist() == want


def test_vclip_relu_default_range_is_identity():
    m = prepare()
    x = np.array([-128, -1, 0, 1, 127], np.int8)
    sp_put(m, 0, 0, x)
    m = run_ok("vclip p1, r0, p0, r0, 1, 5\ncfg.clip_lo 0\nvclip p2, r0, p0, r0, 1, 5\nend", m)
    assert sp_get(m, 1, 0, 5).tolist() == x.tolist()
    assert sp_get(m, 2, 0, 5).tolist() == [0, 0, 0, 1, 127]


@pytest.mark.parametrize("H, W, C, seed", [(4, 4, 3, 0), (6, 8, 5, 1), (2, 2, 1, 2),
                                           (8, 6, 16, 3)])
def test_vmax_maxpool_2x2_stride2_hwc(H, W, C, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (H, W, C)).astype(np.int8)
    m = prepare()
    sp_put(m, 0, 0, x)
    # pass 1 (along W): output row = (h, w/2), window elements C apart
    # pass 2 (along H): output row = h/2 of (W/2)*C bytes, window elements a row apart
    src = f"""
        cfg.pool_count 2
        cfg.pool_stride {C}
        cfg.pool_istride {2 * C}
        vmax p1, r0, p0, r0, {H * W // 2}, {C}
        cfg.pool_stride {W // 2 * C}
        cfg.pool_istride {W * C}
        vmax p2, r0, p1, r0, {H // 2}, {W // 2 * C}
        end
    """
    m = run_ok(src, m)
    want = np.array([[[max(int(x[2 * i + a, 2 * j + b, c]) for a in (0, 1) for b in (0, 1))
                       for c in range(C)] for j in range(W // 2)] for i in range(H // 2)])
    got = sp_get(m, 2, 0, H // 2 * W // 2 * C).reshape(H // 2, W // 2, C)
    np.testing.assert_array_equal(got, want, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(got, x.reshape(H // 2, 2, W // 2, 2, C).max(axis=(1, 3)))


def test_vmax_window_and_out_stride():
    m = prepare()
    x = np.array([3, -7, 9, 0, -128, 5, 5, 127, -1, 2, 8, -3], np.int8)
    sp_put(m, 0, 0, x)
    # 2 output rows of 2 bytes; window of 3 elements 4 bytes apart; rows 1 byte apart
    src = """
        cfg.pool_count 3
        cfg.pool_stride 4
        cfg.pool_istride 1
        cfg.out_stride 5
        vmax p1, r0, p0, r0, 2, 2
        end
    """
    m = run_ok(src, m)
    for i in range(2):
        want = [max(int(x[i + t * 4 + j]) for t in range(3)) for j in range(2)]
        assert sp_get(m, 1, i * 5, 2).tolist() == want


@pytest.mark.parametrize("vec", [
    [1, 2, 3], [3, 2, 1], [5, 5, 5], [-128, -128, -127, -127], [0], [-1, 7, 7, -1, 7],
    [127, -128, 127], list(range(-128, 128)),
])
def test_vargmax_first_index_on_ties(vec):
    m = prepare()
    sp_put(m, 3, 5, np.array(vec, np.int8))
    m = run_ok(f"li r2, 2\nvargmax r9, p3, r2, {len(vec)}, off=3\n"
               "li r1, 0\nbr.eq r9, r1, skip\nli r10, 1\nskip: end", m)
    first = max(range(len(vec)), key=lambda i: (vec[i], -i))
    assert m.regs[9] == first
    assert m.regs[10] == (1 if first else 0)


def test_vbias_wraps_int32():
    m = prepare()
    big = np.array([2**31 - 1, -(2**31), 5, -5], dtype="<i4")
    sp_put(m, 0, 0, big)
    sp_put(m, 0, 16, np.array([5, -1, 2**31 - 1, -(2**31)], dtype="<i4"))
    src = """
        li r1, 3
        vbias p0, r0, r1, 2, 4
        vbias p0, r0, r1, 2, 4, off=16
        end
    """
    m = run_ok(src, m)
    addends = [5, -1, 2**31 - 1, -(2**31)]
    want = [wrap_i32(int(a) + int(b)) for a, b in zip(big, addends, strict=True)]
    assert want == [-(2**31) + 4, 2**31 - 1, -(2**31) + 4, 2**31 - 5]
    assert m.acc[3, :4].tolist() == want and m.acc[4, :4].tolist() == want
    assert not m.acc[3:5, 4:].any() and not m.acc[5].any() and not m.acc[2].any()


def _qtab(mults, shifts, junk=0):
    """``vqtab`` entries: int32le multiplier, shift byte (``junk`` in its ignored bits
    and in the padding bytes)."""
    e = np.full((len(mults), 8), junk, dtype=np.uint8)
    e[:, :4] = np.asarray(mults, dtype="<i4").view(np.uint8).reshape(-1, 4)
    e[:, 4] = (np.asarray(shifts) | (junk & 0xC0)).astype(np.uint8)
    return e


def test_vreq_tab_requantizes_per_column():
    """vreq ... tab=1: column j uses table entry j (vqtab), zero point and clamp from cfg;
    a vqtab of fewer entries keeps the others; the next run starts on the reset entries."""
    m = prepare()
    acc = np.arange(-20, 20, dtype=np.int32).reshape(5, 8) * 1001
    sp_put(m, 0, 0, acc.astype("<i4"))  # accumulator rows 2..6, one vbias each
    mults = [1 << 30, 3 << 28, -(1 << 31), (1 << 31) - 1, 12345, 1, 1 << 20, 7]
    shifts = [38, 38, 39, 40, 22, 0, 63, 2]
    sp_put(m, 1, 0, _qtab(mults, shifts, junk=0xFF))
    sp_put(m, 1, 64, _qtab([5 << 27], [31]))
    rows = "".join(f"li r1, {2 + i}\nvbias p0, r0, r1, 1, 8, off={32 * i}\n" for i in range(5))
    m = run_ok(rows + """
        li r1, 2
        cfg.qzp 3
        cfg.clip_lo -100
        vqtab p1, r0, 8
        vreq p2, r0, r1, 5, 8, tab=1
        vqtab p1, r0, 1, off=64
        vreq p2, r0, r1, 5, 8, off=40, tab=1
        vreq p2, r0, r1, 5, 8, off=80
        end
    """, m)
    want = np.stack([requantize(acc[:, j], mults[j], shifts[j], 3, -100, 127)
                     for j in range(8)], axis=1)
    assert len(np.unique(want)) > 8
    assert (sp_get(m, 2, 0, 40).reshape(5, 8) == want).all()
    want[:, 0] = requantize(acc[:, 0], 5 << 27, 31, 3, -100, 127)
    assert (sp_get(m, 2, 40, 40).reshape(5, 8) == want).all()
    reset = isa.CFG_RESET
    per_tensor = requantize(acc, reset[isa.CfgField.QMUL], reset[isa.CfgField.QSHIFT], 3,
                            -100, 127)
    assert (sp_get(m, 2, 80, 40).reshape(5, 8) == per_tensor).all()
    m = run_ok(rows + "li r1, 2\nvreq p2, r0, r1, 5, 8, off=120, tab=1\nend", m)
    reset_tab = requantize(acc, reset[isa.CfgField.QMUL], reset[isa.CfgField.QSHIFT], 0)
    assert (sp_get(m, 2, 120, 40).reshape(5, 8) == reset_tab).all()


# ---- tile tags -----------------------------------------------------------------------
def test_tile_tags_hit_miss_and_invalidate():
    m = Machine(dram_bytes=1 << 16)
    m.dram[0x100:0x200] = np.arange(256, dtype=np.uint8)
    m.dram[0x300:0x400] = 255 - np.arange(256, dtype=np.uint8)
    load = "load p2, r0, r1, r0, 4, 16, tag=3"
    steps = [  # (extra instructions, expect hit)
        ("li r1, 0x100", False),
        ("", True),
        ("li r1, 0x300", False),   # DRAM address changed -> miss
        ("", True),
        ("tinv 3", False),         # slot invalidated -> miss
        ("tinv 0", False),         # all slots invalidated -> miss
        ("tinv 5", True),          # another slot: still a hit
    ]
    src = []
    for pre, _ in steps:
        src += [pre, load]
    run_ok("\n".join(src) + "\nend", m)
    hits = sum(h for _, h in steps)
    assert m.counters["tag_hits"][2] == hits
    assert m.counters["tag_misses"][2] == len(steps) - hits
    assert sum(m.counters["tag_hits"]) == hits  # counted in the load's partition only
    assert m.counters["dram_read_bytes"] == 64 * (len(steps) - hits)
    assert sp_get(m, 2, 0, 64, np.uint8).tolist() == list(range(255, 191, -1))


def test_tile_tags_persist_across_runs_and_skip_the_transfer():
    m = Machine(dram_bytes=1 << 16)
    m.dram[0:32] = 7
    src = "li r1, 0\nload p1, r0, r1, r0, 2, 16, tag=1\nend"
    run_ok(src, m)
    assert m.counters["tag_misses"][1] == 1 and m.counters["dram_read_bytes"] == 32
    m.dram[0:32] = 9  # the host changed DRAM without invalidating: a hit keeps old data
    run_ok(src, m)
    assert m.counters["tag_hits"][1] == 1 and m.counters["dram_read_bytes"] == 32
    assert (sp_get(m, 1, 0, 32, np.uint8) == 7).all()
    # a different scratchpad address, rows, bytes or slot is a miss
    for variant in ("load p1, r0, r1, r0, 2, 16, tag=1, off=32",
                    "load p1, r0, r1, r0, 1, 16, tag=1",
                    "load p1, r0, r1, r0, 2, 8, tag=1",
                    "load p1, r0, r1, r0, 2, 16, tag=2"):
        before = m.counters["tag_misses"][1]
        run_ok(f"li r1, 0\n{variant}\nend", m)
        assert m.counters["tag_misses"][1] == before + 1, variant
    # the host's invalidation makes the next load miss
    run_ok(src, m)
    m.invalidate_tags()
    misses = m.counters["tag_misses"][1]
    run_ok(src, m)
    assert m.counters["tag_misses"][1] == misses + 1
    assert (sp_get(m, 1, 0, 32, np.uint8) == 9).all()


# ---- scalar and control ----------------------------------------------------------------
CONDS = {
    "always": lambda a, b: True, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "lt": lambda a, b: signed(a) < signed(b), "ge": lambda a, b: signed(a) >= signed(b),
    "ltu": lambda a, b: a < b, "geu": lambda a, b: a >= b,
}
u32 = st.integers(0, M32) | st.sampled_from([0, 1, 2**31 - 1, 2**31, M32])


@settings(max_examples=150, deadline=None, database=None)
@given(a=u32, b=u32, imm=st.integers(-(2**31), 2**31 - 1))
def test_scalar_alu_wraps_mod_2_32(a, b, imm):
    cmps = "\n".join(f"cmp.{c} r{8 + i}, r1, r2" for i, c in enumerate(CONDS))
    src = f"""
        li r1, {a}
        li r2, {b}
        add r3, r1, r2
        sub r4, r1, r2
        mul r5, r1, r2
        addi r6, r1, {imm}
        addi r7, r6, -1
        {cmps}
        li r15, 1
        br.ltu r1, r2, L1
        li r15, 2
    L1: end
    """
    m = run_ok(src)
    r = m.regs
    assert r[1] == a and r[2] == b
    assert r[3] == (a + b) % 2**32 and r[4] == (a - b) % 2**32 and r[5] == (a * b) % 2**32
    assert r[6] == (a + imm) % 2**32 and r[7] == (a + imm - 1) % 2**32
    for i, (c, f) in enumerate(CONDS.items()):
        assert r[8 + i] == int(f(a, b)), c
    assert r[15] == (1 if a < b else 2)
    assert all(0 <= v <= M32 for v in r)


def test_li_accepts_unsigned_and_negative_immediates():
    m = run_ok("li r1, 0xFFFFFFFF\nli r2, -1\nli r3, -2147483648\naddi r4, r1, 1\nend")
    assert m.regs[1:5] == [M32, M32, 2**31, 0]


@pytest.mark.parametrize("cond, a, b", [(c, a, b) for c in CONDS for a, b in [
    (1, 2), (2, 1), (5, 5), (M32, 1), (1, M32), (2**31, 2**31 - 1), (0, 0)]])
def test_branch_taken_and_not_taken(cond, a, b):
    src = f"""
        li r1, {a}
        li r2, {b}
        br.{cond} r1, r2, taken
        li r3, 1
        end
    taken:
        li r3, 2
        end
    """
    m = run_ok(src)
    assert m.regs[3] == (2 if CONDS[cond](a, b) else 1)


def test_cmp_signed_vs_unsigned():
    m = run_ok("li r1, -1\nli r2, 1\ncmp.lt r3, r1, r2\ncmp.ltu r4, r1, r2\n"
               "cmp.ge r5, r1, r2\ncmp.geu r6, r1, r2\ncmp.always r7, r0, r0\nend")
    assert m.regs[3:8] == [1, 0, 0, 1, 1]


def test_nested_loops_and_zero_counts():
    src = """
        li r9, 0
        loop 3, outer_end
        loop 4, inner_end
        addi r1, r1, 1
        addi r5, r5, 2
    inner_end:
        addi r2, r2, 1
        loopr r9, skip_end       ; zero count: body skipped
        addi r3, r3, 1
    skip_end:
        loop 0, z_end            ; immediate zero count
        addi r3, r3, 100
    z_end:
        addi r4, r4, 1
    outer_end:
        li r7, 5
        loopr r7, lr_end
        addi r6, r6, 3
    lr_end:
        end
    """
    m = run_ok(src)
    assert m.regs[1:8] == [12, 3, 0, 3, 24, 15, 5]


def test_loopr_count_is_unsigned_and_branch_leaves_one_loop():
    src = """
        li r1, -1              ; 2**32-1 iterations unless the branch leaves
        li r2, 10
        loopr r1, body_end
        addi r3, r3, 1
        br.eq r3, r2, out
    body_end:
        li r4, 99
    out:
        end
    """
    m = run_ok(src)
    assert m.regs[3] == 10 and m.regs[4] == 0


def test_r0_stays_zero_and_args_land_in_r1_to_r7():
    args = [1, 2**31, M32, -1, 0, 12345, -(2**31)]
    m = run_ok("li r0, 5\naddi r0, r0, 9\nadd r8, r0, r1\nend", args=args)
    assert m.regs[0] == 0
    assert m.regs[1:8] == [a & M32 for a in args]
    assert m.regs[8] == 1 and m.regs[9:] == [0] * 7
    m = run_ok("end", m, args=[3])  # registers are reset by every run
    assert m.regs[1] == 3 and m.regs[2:8] == [0] * 6
    with pytest.raises(ValueError):
        m.run(args=list(range(8)))


# ---- regions and trace -----------------------------------------------------------------
def test_region_trace_records():
    m = prepare()
    sp_put(m, 1, 0, np.ones(12, np.int8))
    src = """
        li r1, 0x40
        region.begin 7
        load p0, r0, r1, r0, 3, 16
        store p0, r0, r1, r0, 2, 8
        region.end 7
        region.begin 1
        region.begin 2
        wload p1, r0, 3, 4
        gemm.overwrite p0, r0, r0, 5, swap=1
        region.end 2
        gemm.accumulate p0, r0, r0, 2
        region.end 1
        end
    """
    before = dict(m.counters)
    m = run_ok(src, m)
    recs = [m.pop_trace() for _ in range(3)]
    assert m.pop_trace() is None
    assert all(isinstance(r, TraceRecord) for r in recs)
    assert [r.region for r in recs] == [7, 2, 1]  # pushed at region.end, in order
    r7, r2, r1 = recs
    assert (r7.macs, r7.dram_read_bytes, r7.dram_write_bytes) == (0, 48, 16)
    assert (r2.macs, r2.dram_read_bytes, r2.dram_write_bytes) == (5 * 3 * 4, 0, 0)
    assert (r1.macs, r1.dram_read_bytes) == (5 * 3 * 4 + 2 * 3 * 4, 0)
    assert 2 <= r7.instructions <= 4 and 2 <= r2.instructions <= 4
    assert 4 <= r1.instructions <= 7
    for r in recs:
        assert r.start <= r.end and r.cycles == r.end - r.start
        assert r.tag_hits == r.tag_misses == 0
    assert r7.end <= r1.start <= r2.start <= r2.end <= r1.end
    assert m.counters["regions"] - before["regions"] == 3
    assert m.counters["trace_overflows"] == 0


def test_region_trace_overflow_counted():
    m = Machine(NPUConfig(trace_depth=3), dram_bytes=4096)
    src = """
        loop 5, done
        region.begin 42
        nop
        region.end 42
    done:
        region.begin 43
        region.end 43
        end
    """
    run_ok(src, m)
    assert len(m.trace) == 3
    assert m.counters["trace_overflows"] == 3 and m.counters["regions"] == 6
    assert [m.pop_trace().region for _ in range(3)] == [42, 42, 42]
    assert m.pop_trace() is None
    run_ok("region.begin 9\nregion.end 9\nend", m)  # room again after popping
    assert m.pop_trace().region == 9 and m.counters["trace_overflows"] == 3


# ---- errors and recovery -----------------------------------------------------------------
def _illegal_reserved():
    return f".word {(isa.RESERVED_OPCODES[0] << 58) | (1 << 56):#x}"


SMALL4 = NPUConfig(imem_depth=4)
ERROR_CASES = [
    # (id, source, expected error, expected pc, machine kwargs, run kwargs)
    ("illegal_zero_word", "nop\n.word 0\nend", ErrorCode.ILLEGAL_INSTRUCTION, 1, {}, {}),
    ("illegal_reserved_opcode", f"nop\nnop\n{_illegal_reserved()}\nend",
     ErrorCode.ILLEGAL_INSTRUCTION, 2, {}, {}),
    ("illegal_run_off_the_end", "nop\nnop", ErrorCode.ILLEGAL_INSTRUCTION, 2, {}, {}),
    ("illegal_wrong_version", f".word {isa.encode('nop') ^ (3 << 56):#x}",
     ErrorCode.ILLEGAL_INSTRUCTION, 0, {}, {}),
    ("bad_operand_wload_k", "nop\nwload p0, r0, 9, 1\nend", ErrorCode.BAD_OPERAND, 1, {}, {}),
    ("bad_operand_wload_n", "wload p0, r0, 1, 9\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_tag_slot", "load p0, r0, r0, r0, 1, 1, tag=17\nend",
     ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_tinv_slot", "nop\ntinv 17\nend", ErrorCode.BAD_OPERAND, 1, {}, {}),
    ("bad_operand_cfg_qshift", "cfg.qshift 64\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_cfg_qzp", "nop\ncfg.qzp -129\nend", ErrorCode.BAD_OPERAND, 1, {}, {}),
    ("bad_operand_cfg_pool_count", "cfg.pool_count 0\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_gemm_no_wload", "nop\ngemm.overwrite p0, r0, r0, 1\nend",
     ErrorCode.BAD_OPERAND, 1, {}, {}),
    ("bad_operand_vreq_n", "vreq p0, r0, r0, 1, 9\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_vqtab_n", "vqtab p0, r0, 9\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("partition_vqtab_entries", "li r1, 4032\nvqtab p0, r1, 8, off=1\nend",
     ErrorCode.PARTITION_BOUNDS, 1, {}, {}),
    ("bad_operand_ptsel", "ptsel 2\nend", ErrorCode.BAD_OPERAND, 0, {}, {}),
    ("bad_operand_partition_index", "load p4, r0, r0, r0, 1, 1\nend",
     ErrorCode.BAD_OPERAND, 0, {"config": CONFIGS["small"]}, {}),
    ("partition_offset_past_size", "li r1, 4090\nload p0, r1, r0, r0, 1, 7\nend",
     ErrorCode.PARTITION_BOUNDS, 1, {}, {}),
    ("partition_rows_past_size", "load p0, r0, r0, r0, 2, 2049\nend",
     ErrorCode.PARTITION_BOUNDS, 0, {}, {}),
    ("partition_disabled", "nop\nvclip p1, r0, p0, r0, 1, 1\nend",
     ErrorCode.PARTITION_BOUNDS, 1, {}, {"parts": [(0, 4096)]}),
    ("partition_leaves_scratchpad", "load p0, r0, r0, r0, 1, 1\nend",
     ErrorCode.PARTITION_BOUNDS, 0, {}, {"parts": [(65535, 2)]}),
    ("acc_bounds_vbias", "li r1, 1020\nvbias p0, r0, r1, 5, 1\nend",
     ErrorCode.ACC_BOUNDS, 1, {}, {}),
    ("acc_bounds_gemm", "wload p0, r0, 1, 1\nli r2, 1024\ngemm.overwrite p0, r0, r2, 1, swap=1"
     "\nend", ErrorCode.ACC_BOUNDS, 2, {}, {}),
    ("bus_error_load", "li r1, 4090\nload p0, r0, r1, r0, 1, 16\nend",
     ErrorCode.BUS_ERROR, 1, {"dram_bytes": 4096}, {}),
    ("bus_error_store_second_row", "li r1, 4000\nli r2, 64\nstore p0, r0, r1, r2, 3, 40\nend",
     ErrorCode.BUS_ERROR, 2, {"dram_bytes": 4096}, {}),
    ("pc_bounds_branch", "nop\nli r1, 1\nbr.always r0, r0, 4096\nend",
     ErrorCode.PC_BOUNDS, 2, {}, {}),
    ("pc_bounds_fall_off", "nop\nnop\nnop\nnop", ErrorCode.PC_BOUNDS, 4,
     {"config": SMALL4}, {}),
    ("loop_empty_body", "nop\nloop 3, 2\nend", ErrorCode.LOOP, 1, {}, {}),
    ("loop_empty_body_zero_count", "loop 0, 1\nend", ErrorCode.LOOP, 0, {}, {}),
    ("loop_overflow", "\n".join(f"loop 2, {10 - i}" for i in range(5))
     + "\nnop\nnop\nnop\nnop\nnop\nend", ErrorCode.LOOP, 4, {}, {}),
    ("loop_inner_ends_at_outer_end", "loop 2, 3\nloop 2, 3\nnop\nend",
     ErrorCode.LOOP, 1, {}, {}),
    ("loop_inner_ends_after_outer_end", "loop 2, 4\nloop 2, 5\nnop\nnop\nnop\nend",
     ErrorCode.LOOP, 1, {}, {}),
    ("loop_branch_leaves_two", "loop 2, 5\nloop 2, 4\nnop\nbr.always r0, r0, 6\nnop\nnop\nend",
     ErrorCode.LOOP, 3, {}, {}),
    ("token_deadlock_pop_prev", "nop\nwload p0, r0, 1, 1, pop=prev\nend",
     ErrorCode.TOKEN_DEADLOCK, 1, {}, {}),
    ("token_deadlock_store", "store p0, r0, r0, r0, 1, 1, pop=prev\nend",
     ErrorCode.TOKEN_DEADLOCK, 0, {}, {}),
    ("token_deadlock_wrong_channel",
     "load p0, r0, r0, r0, 1, 1, push=next\nstore p0, r0, r0, r0, 1, 1, pop=prev\nend",
     ErrorCode.TOKEN_DEADLOCK, 1, {}, {}),
    ("region_mismatched_end", "region.begin 1\nregion.end 2\nend", ErrorCode.REGION, 1, {}, {}),
    ("region_end_without_begin", "nop\nregion.end 0\nend", ErrorCode.REGION, 1, {}, {}),
    ("region_open_at_end", "region.begin 1\nend", ErrorCode.REGION, 1, {}, {}),
    ("region_too_deep", "\n".join(f"region.begin {i}" for i in range(5)) + "\nend",
     ErrorCode.REGION, 4, {}, {}),
    ("timeout_branch_to_itself", "nop\nspin: br.always r0, r0, spin", ErrorCode.TIMEOUT, 1,
     {}, {"max_cycles": 500}),
]


@pytest.mark.parametrize("src, code, pc, mkw, rkw", [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_errors_and_recovery(src, code, pc, mkw, rkw):
    mkw = dict(mkw)
    m = Machine(mkw.pop("config", None), dram_bytes=mkw.pop("dram_bytes", 1 << 16))
    errors = m.counters["errors"]
    m, res = run(src, m, **rkw)
    assert (res.error, res.pc) == (code, pc), f"{res.error.name} at {res.pc}: {res.message}"
    assert not res.ok and res.message
    assert m.last is res and m.counters["errors"] == errors + 1
    with pytest.raises(RuntimeError, match=code.name):
        res.check()
    # recovery: the next run on the same machine succeeds
    m, res2 = run("li r1, 42\nend", m)
    assert res2.ok and res2.error == ErrorCode.NONE and res2.pc == 1 and m.regs[1] == 42
    assert res2.check() is res2 and m.counters["errors"] == errors + 1


def test_every_error_code_is_covered():
    covered = {c[2] for c in ERROR_CASES}
    assert covered == set(ErrorCode) - {ErrorCode.NONE}


def test_bus_error_reports_the_address():
    m, res = run("li r1, 4090\nload p0, r0, r1, r0, 1, 16\nend", dram_bytes=4096)
    assert res.error == ErrorCode.BUS_ERROR and res.error_addr == 4090


def test_timeout_by_instruction_budget_and_cycles_grow():
    m = Machine(dram_bytes=4096)
    m.write_program(assemble("spin: br.always r0, r0, spin"))
    m.set_partitions(parts_for(m.config))
    m.swap()
    res = m.run(max_instructions=1000)
    assert res.error == ErrorCode.TIMEOUT and res.instructions == 1000
    res = m.run(max_cycles=10_000)
    assert res.error == ErrorCode.TIMEOUT and res.cycles >= 10_000


def test_write_program_refuses_the_active_bank():
    m = Machine(dram_bytes=4096)
    words = assemble("end").words
    with pytest.raises(ValueError, match="active"):
        m.write_program(words, bank=m.active_bank)
    m.write_program(words)  # the shadow bank is fine
    m.swap()
    with pytest.raises(ValueError, match="active"):
        m.write_program(words, bank=m.active_bank)
    with pytest.raises(ValueError):
        m.write_program([0] * (m.config.imem_depth + 1))
    m.set_partitions(parts_for(m.config), bank=m.active_bank)
    assert m.run().ok


# ---- where the cycles are exact ----------------------------------------------------------
# The RTL comparisons (tests/test_npu.py) check cycles only on runs the golden model calls
# exact; these pin down which runs those are.

CYCLE_TABLE = [(i * 1024, 1024) for i in range(8)]


def _cycles_exact(source: str, args=()) -> bool:
    machine = Machine(CONFIGS["default"])
    return machine.load_and_run(assemble(source), CYCLE_TABLE, args=args).cycles_exact


def test_cost_programs_are_cycle_exact():
    from verif.scenarios import COST_ARGS, COST_PROGRAMS

    inexact = [n for n, body in COST_PROGRAMS.items()
               if not _cycles_exact(body + "end\n", COST_ARGS)]
    assert inexact == []


def _beside_run(source: str, acc_ports: int):
    machine = Machine(replace(CONFIGS["default"], acc_ports=acc_ports))
    from verif.scenarios import COST_ARGS

    return machine.load_and_run(assemble(source + "end\n"), CYCLE_TABLE, args=COST_ARGS)


def test_gemm_runs_beside_vreqb_only_with_two_accumulator_ports():
    from verif.scenarios import COST_PROGRAMS

    body = COST_PROGRAMS["gemm beside vreqb"]
    two, one = _beside_run(body, 2), _beside_run(body, 1)
    assert two.cycles_exact and one.cycles_exact
    assert two.cycles < one.cycles
    # where the gemm reads the vreqb's bytes or writes its rows it waits for it
    for name in ("gemm after vreqb, its bytes", "gemm after vreqb, its rows"):
        assert _beside_run(COST_PROGRAMS[name], 2).cycles == one.cycles


def test_depthwise_runs_beside_vreq_only_with_two_accumulator_ports():
    from verif.scenarios import COST_PROGRAMS

    for name in ("dwload, dwconv beside vreq", "dwconv, gemm beside vreq",
                 "dwconv beside vreqb"):
        two, one = _beside_run(COST_PROGRAMS[name], 2), _beside_run(COST_PROGRAMS[name], 1)
        assert two.cycles_exact and one.cycles_exact
        assert two.cycles < one.cycles, name
    # a dwload reading the bytes the vreq writes waits for it
    body = COST_PROGRAMS["dwload after vreq, its bytes"]
    assert _beside_run(body, 2).cycles == _beside_run(body, 1).cycles
    # a dwconv writing its rows waits for it, the dwload before it does not (the
    # same program on other rows, and with one port, as the RTL counts them)
    rows = COST_PROGRAMS["dwconv after vreq, its rows"]
    apart = COST_PROGRAMS["dwload, dwconv beside vreq"].replace("vclip p4, r0, p5, r0, 2, 8\n",
                                                                "")
    assert [_beside_run(rows, 2).cycles, _beside_run(apart, 2).cycles,
            _beside_run(rows, 1).cycles] == [93, 69, 111]


@pytest.mark.parametrize("name, two, one", [
    ("dwconv after vreq, its bytes", 93, 111),  # reads the vreq's first byte: waits
    ("dwconv just beside the vreq's bytes", 69, 111),
    ("dwconv rows overlapping the vreq's by one", 95, 113),  # writes its first row: waits
    ("dwconv rows just below the vreq's rows", 71, 113),
])
def test_dwconv_beside_vreq_waits_for_one_shared_byte_or_row(name, two, one):
    """A dwconv after a vreq runs beside it up to the vreq's first written byte and
    accumulator row, and waits for it from there (the dwload before it runs beside
    in every case): cycles as the RTL counts them (COST_PROGRAMS)."""
    from verif.scenarios import COST_PROGRAMS

    runs = [_beside_run(COST_PROGRAMS[name], ports) for ports in (2, 1)]
    assert all(r.cycles_exact for r in runs)
    assert [r.cycles for r in runs] == [two, one]


def test_gemm_beside_vreqb_on_its_banks_is_not_cycle_exact():
    from verif.scenarios import COST_PROGRAMS

    # rows 8 bytes apart: the gemm's reads walk every bank the vreqb writes
    body = COST_PROGRAMS["gemm beside vreqb"].replace("cfg.gemm_stride 64", "cfg.gemm_stride 8")
    assert not _beside_run(body, 2).cycles_exact
    assert _beside_run(body, 1).cycles_exact


def test_dma_on_banks_compute_uses_is_not_cycle_exact():
    # the second load writes p2 while the vadd writes p1: 64-byte rows span every bank
    clash = ("load p0, r0, r0, r0, 1, 64, push=next\n"
             "vadd p1, r0, p0, r0, p0, r0, 8, 64, pop=prev\n"
             "load p2, r0, r0, r0, 8, 64\nend\n")
    assert not _cycles_exact(clash)
    # the same load after a sync: nothing overlaps
    assert _cycles_exact(clash.replace("load p2", "sync\nload p2"))
    # a vclip's or vreqb's writes before the load's: played out beat by beat
    # (COST_PROGRAMS "vreqb, load held back", "vclip>load token, a load held back")
    assert _cycles_exact(clash.replace("vadd p1, r0, p0, r0, p0, r0", "vclip p1, r0, p0, r0"))
    assert _cycles_exact("vreqb p3, r0, r0, 64, 1, p2, r0\n"
                         "load p4, r0, r0, r0, 1, 1024\nend\n")
    # ... and a load before them in program order, timed again when they come
    # (COST_PROGRAMS "load held back by a later vclip")
    assert _cycles_exact("load p2, r0, r0, r0, 8, 64\nvclip p1, r0, p0, r0, 8, 64\nend\n")
    # a store's reads contend with compute reads, not with compute writes
    assert not _cycles_exact("vclip p1, r0, p0, r0, 8, 64\nstore p0, r0, r0, r0, 1, 64\nend\n")
    assert _cycles_exact("vreq p1, r0, r0, 8, 8\nstore p3, r0, r0, r0, 1, 64\nend\n")


def test_a_run_with_an_error_is_not_cycle_exact():
    assert not _cycles_exact("nop\n.word 0\nend\n")


def test_gemm_on_old_weights_beside_a_wload_is_not_cycle_exact():
    # its first rows may meet the wload's reads (COST_PROGRAMS has one after them)
    wload_gemm = "wload p1, r0, 8, 8\ngemm.overwrite p0, r0, r0, 4, swap=1\nwload p1, r0, 8, 8\n"
    assert not _cycles_exact(wload_gemm + "gemm.accumulate p0, r0, r0, 8\nend\n")
    assert _cycles_exact(wload_gemm + "gemm.accumulate p0, r0, r0, 8, swap=1\nend\n")


def test_gemv_tiles_are_cycle_exact():
    # (COST_PROGRAMS["gemv tiles as the compiler emits them"] compares it with the RTL)
    from verif.scenarios import GEMV_TILES

    machine = Machine(CONFIGS["default"])
    result = machine.load_and_run(assemble(GEMV_TILES + "end\n"), CYCLE_TABLE)
    assert result.cycles_exact, result.inexact_cause


def test_an_inexact_run_names_its_first_cause_and_counts_them():
    machine = Machine(CONFIGS["default"])
    clash = ("load p0, r0, r0, r0, 1, 64, push=next\n"
             "vadd p1, r0, p0, r0, p0, r0, 8, 64, pop=prev\n"
             "load p2, r0, r0, r0, 8, 64\nend\n")
    result = machine.load_and_run(assemble(clash), CYCLE_TABLE)
    assert result.inexact_cause == "dma write beside compute write"
    assert machine.inexact_firsts == {"dma write beside compute write": 1}
    assert machine.inexact_fired["dma write beside compute write"] >= 1
    assert machine.load_and_run(assemble("nop\nend\n"), CYCLE_TABLE).inexact_cause == ""
    assert machine.load_and_run(assemble("nop\n.word 0\nend\n"), CYCLE_TABLE).inexact_cause \
        == "error"


def compute_queue_program(rng: random.Random) -> str:
    """Random gemm / wload / cfg sequences that fill the compute queue, then a
    long load whose dispatch waits for a free entry: the timing of the array and the
    vector unit taking turns, and of the dispatch into a full queue."""
    body = "wload p1, r0, 8, 8\ngemm.overwrite p0, r0, r0, 4, swap=1\n"
    pending = False  # a wload no gemm has swapped in yet
    for _ in range(rng.randint(8, 22)):
        r = rng.random()
        if r < 0.45:
            swap = int(pending and rng.random() < 0.8)
            pending = pending and not swap
            body += f"gemm.accumulate p0, r0, r0, {rng.choice([1, 2, 3, 8, 12, 17, 24, 40])}, " \
                    f"swap={swap}\n"
        elif r < 0.7 and not pending:
            body += f"wload p1, r0, {rng.randint(1, 8)}, 8\n"
            pending = True
        else:  # (a vector op's writes would meet the load's on the banks: inexact)
            body += "cfg.qshift 9\n"
    return body + "li r8, 512\nload p4, r0, r0, r8, 2, 512\nend\n"


@pytest.mark.rtl
def test_compute_queue_programs_on_the_rtl(seed, regress):
    """On the fast Verilator NPU, every run of :func:`compute_queue_program` the golden
    model calls exact takes the golden model's cycles (``Pair.check_cycles``)."""
    from verif import fastsim
    from verif.scenarios import Job, Pair

    config = CONFIGS["default"]
    device = fastsim.open_device(config)
    try:
        pair = Pair(device, config)
        rng = random.Random(seed)
        for i in range(300 if regress else 60):
            source = compute_queue_program(rng)
            pair.run_job(Job(f"compute queue program {i} (seed {seed})", assemble(source),
                             CYCLE_TABLE), check_dram=False)
    finally:
        device.close()
    runs = pair.cycle_runs
    print(f"cycles equal on {runs['checked']} of {runs['checked'] + runs['inexact']} runs")
    assert runs["checked"] > 0


def test_a_load_is_timed_again_when_a_later_vector_op_writes_beside_it():
    # (COST_PROGRAMS "load held back by a later vreqb": equal on the RTL)
    from verif.scenarios import COST_ARGS, COST_PROGRAMS

    def held_back(body: str) -> tuple[int, int]:
        machine = Machine(CONFIGS["default"])
        result = machine.load_and_run(assemble(body + "end\n"), CYCLE_TABLE, args=COST_ARGS)
        assert result.cycles_exact
        return result.cycles, machine.counters["stall_in_load"]

    body = COST_PROGRAMS["load held back by a later vreqb"]
    # the vreqb's 64 writes walk the banks under the load's 128 beats
    assert held_back(body) == (196, 56)
    assert held_back(body.replace("vreqb", "sync\nvreqb"))[1] < 56
