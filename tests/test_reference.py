"""The reference interpreter against the golden model, independent integer formulas
and ONNX's own reference implementation; the accuracy of requantization from float
scales."""

from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from firmware import asm
from firmware.golden import Machine
from firmware.quant import multiplier_is_exact, quantize_multiplier, quantize_multipliers_shared
from host.builder import GraphBuilder
from host.ir import Requant
from host.onnx_import import load_onnx
from host.reference import run_reference

PROGRAMS = Path(__file__).resolve().parent.parent / "firmware" / "programs"
TABLE = [(i * 4096, 4096) for i in range(8)]


def rne(num: Fraction) -> int:
    """Round half to even of an exact rational (independent of firmware.quant)."""
    fl = num.numerator // num.denominator
    rem = num - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    return fl


def golden(program, defines, dram, args):
    m = Machine(dram_bytes=1 << 16)
    for addr, data in dram.items():
        raw = np.ascontiguousarray(data).view(np.uint8).ravel()
        m.dram[addr: addr + raw.size] = raw
    res = m.load_and_run(asm.assemble((PROGRAMS / program).read_text(), defines), TABLE,
                         args=args)
    assert res.ok, res.message
    return m


# ---- bit-exact with the NPU ------------------------------------------------------------------


def test_qgemm_matches_the_golden_model(seed):
    """A QGemm with an input zero point (folded into the bias) is exactly what the
    NPU's gemm/vbias/vreq sequence computes on the node's parameters."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (16, 16), dtype=np.int8)
    w = rng.integers(-128, 128, (16, 8), dtype=np.int8)
    bias = rng.integers(-50000, 50000, 8).astype(np.int32)
    zx = int(rng.integers(-128, 128))
    b = GraphBuilder()
    xi = b.input("x", (16, 16), scale=0.05, zp=zx)
    b.output(b.qgemm(xi, w, bias, w_scale=0.01, out_scale=float(rng.uniform(0.5, 20)),
                     out_zp=int(rng.integers(-20, 20))), "y")
    g = b.build()
    node = g.nodes[0]
    got = run_reference(g, {"x": x})["y"]
    r = node.requant
    m = golden("gemm.s", dict(QMUL=r.mult, QSHIFT=r.shift, QZP=r.zp),
               {0: x, 0x400: w, 0x800: node.bias.astype("<i4")}, (0, 0x400, 0x800, 0x1000))
    npu = m.dram[0x1000:0x1080].view(np.int8).reshape(16, 8)
    assert np.array_equal(got, npu), f"seed {seed}"
    # and the folded bias is the zero point's job: (x - zx) @ w + bias, independently
    acc = (x.astype(np.int64) - zx) @ w.astype(np.int64) + bias
    want = [[max(-128, min(127, rne(Fraction(int(a) * r.mult, 1 << r.shift)) + r.zp))
             for a in row] for row in acc]
    assert np.array_equal(got, np.array(want)), f"seed {seed}"


def test_qadd_clip_maxpool_match_the_golden_model(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (4, 8), dtype=np.int8)
    bb = rng.integers(-128, 128, (4, 8), dtype=np.int8)
    t = rng.integers(-128, 128, (4, 4, 2), dtype=np.int8)  # HWC, as vector.s pools it
    v = rng.integers(-128, 128, 8, dtype=np.int8)
    b = GraphBuilder()
    ai = b.input("a", (4, 8), scale=float(rng.uniform(0.01, 0.1)), zp=int(rng.integers(-9, 9)))
    bi = b.input("b", (4, 8), scale=float(rng.uniform(0.01, 0.1)), zp=int(rng.integers(-9, 9)))
    ti = b.input("t", (1, 2, 4, 4), scale=0.1)
    b.output(b.qadd(ai, bi, out_scale=float(rng.uniform(0.05, 0.2)), out_zp=1), "sum")
    b.output(b.clip(ai, -10, 10), "clip")
    b.output(b.maxpool(ti, (2, 2)), "pool")
    g = b.build()
    add = g.nodes[0]
    got = run_reference(g, {"a": a, "b": bb, "t": t.transpose(2, 0, 1)[None]})
    d = dict(ADD_MUL_A=add.mul_a, ADD_MUL_B=add.mul_b, ADD_ZP_A=add.zp_a, ADD_ZP_B=add.zp_b,
             QSHIFT=add.shift, QZP=add.zp)
    m = golden("vector.s", d, {0x200: np.concatenate([a.ravel(), bb.ravel(), t.ravel(), v])},
               (0x200, 0x800))
    out = m.dram[0x800:0x800 + 72].view(np.int8)
    assert np.array_equal(got["sum"], out[:32].reshape(4, 8)), f"seed {seed}"
    assert np.array_equal(got["clip"], out[32:64].reshape(4, 8))
    assert np.array_equal(got["pool"][0].transpose(1, 2, 0), out[64:72].reshape(2, 2, 2))


def test_int32_accumulation_and_bias_wrap_like_the_npu():
    b = GraphBuilder()
    x = b.input("x", (1, 2), scale=1.0)
    w = np.array([[127], [127]], np.int8)
    bias = np.array([(1 << 31) - 100], np.int64)
    b.output(b.qgemm(x, w, bias.astype(np.int32), requant=Requant(1, 0, 0), device="npu"), "y")
    b.output(b.qgemm(x, w, bias.astype(np.int32), device="cpu"), "acc")
    out = run_reference(b.build(), {"x": np.array([[127, 127]], np.int8)})
    wrapped = (2 * 127 * 127 + (1 << 31) - 100) - (1 << 32)  # int32 two's complement
    assert out["acc"].tolist() == [[wrapped]] and out["acc"].dtype == np.int32
    assert out["y"].tolist() == [[-128]]  # the wrapped accumulator is negative


def naive_conv(x, w, strides, pads, pad_value):
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    pt, pl, pb, pr = pads
    oh, ow = (h + pt + pb - kh) // strides[0] + 1, (wd + pl + pr - kw) // strides[1] + 1
    out = np.zeros((n, oc, oh, ow), np.int64)
    for i in range(n):
        for o in range(oc):
            for y in range(oh):
                for z in range(ow):
                    s = 0
                    for ch in range(c):
                        for dy in range(kh):
                            for dx in range(kw):
                                yy, xx = y * strides[0] + dy - pt, z * strides[1] + dx - pl
                                inside = 0 <= yy < h and 0 <= xx < wd
                                v = int(x[i, ch, yy, xx]) if inside else pad_value
                                s += v * int(w[o, ch, dy, dx])
                    out[i, o, y, z] = s
    return out


def test_qconv_matches_a_naive_convolution(seed):
    rng = np.random.default_rng(seed)
    for _ in range(3):
        c, oc = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        strides = tuple(int(s) for s in rng.integers(1, 3, 2))
        pads = (int(rng.integers(0, kh)), int(rng.integers(0, kw)),
                int(rng.integers(0, kh)), int(rng.integers(0, kw)))
        x = rng.integers(-128, 128, (2, c, 6, 7), dtype=np.int8)
        w = rng.integers(-128, 128, (oc, c, kh, kw), dtype=np.int8)
        bias = rng.integers(-9999, 9999, oc).astype(np.int32)
        zx = int(rng.integers(-128, 128))
        b = GraphBuilder()
        xi = b.input("x", x.shape, scale=0.1, zp=zx)
        b.output(b.qconv(xi, w, bias, strides=strides, pads=pads, device="cpu"), "acc")
        got = run_reference(b.build(), {"x": x})["acc"]
        # padding is a real zero: x - zx with the pad at zx
        want = naive_conv(x.astype(np.int64) - zx, w, strides, pads, 0) + bias[:, None, None]
        assert np.array_equal(got, want), f"seed {seed}: strides {strides} pads {pads}"


def test_maxpool_matches_naive_loops(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 2, 7, 6), dtype=np.int8)
    kernel, strides, pads = (3, 2), (2, 1), (1, 0, 2, 1)
    b = GraphBuilder()
    b.output(b.maxpool(b.input("x", x.shape, scale=1.0), kernel, strides, pads), "y")
    got = run_reference(b.build(), {"x": x})["y"]
    oh, ow = got.shape[2:]
    for ch in range(2):
        for i in range(oh):
            for j in range(ow):
                vals = [x[0, ch, i * 2 + di - 1, j + dj] for di in range(3) for dj in range(2)
                        if 0 <= i * 2 + di - 1 < 7 and 0 <= j + dj < 6]
                assert got[0, ch, i, j] == max(vals), f"seed {seed}"


# ---- requantization from float scales --------------------------------------------------------


def test_float32_scales_are_encoded_exactly(seed):
    rng = np.random.default_rng(seed)
    for s in np.float32(10.0) ** rng.uniform(-11.9, 1.5, 300).astype(np.float32):
        mult, shift = quantize_multiplier(float(s))
        assert multiplier_is_exact(float(s), mult, shift), f"seed {seed}: scale {s!r}"
    # a float32 mantissa has 24 bits: exact down to 2**-40, where the shift saturates
    # at 63 and leaves 24 bits; below that the scale loses bits
    tiny = float(np.float32(1.2345 * 2.0 ** -45))
    mult, shift = quantize_multiplier(tiny)
    assert shift == 63 and not multiplier_is_exact(tiny, mult, shift)
    edge = float(np.nextafter(np.float32(2.0 ** -40), np.float32(1)))
    assert multiplier_is_exact(edge, *quantize_multiplier(edge))


def test_requant_is_exact_rounding_of_the_exact_product(seed):
    """With an exactly encoded scale, vreq rounds ``acc * scale`` exactly: it equals
    QLinearMatMul's ONNX definition (exact product, round half to even) always."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        s = np.float32(10.0 ** rng.uniform(-6, 0))
        zp = int(rng.integers(-128, 128))
        acc = rng.integers(-(1 << 24), 1 << 24, 20)
        acc[:5] = [rne_tie_acc(s, k) for k in range(5)]  # exercise exact ties too
        r = Requant(*quantize_multiplier(float(s)), zp)
        got = r.apply(acc)
        want = [max(-128, min(127, rne(int(a) * Fraction(float(s))) + zp)) for a in acc]
        assert got.tolist() == want, f"seed {seed}: scale {s!r}"


def rne_tie_acc(s, k):
    """An accumulator whose product with ``s`` is a half-integer, if one is small."""
    f = Fraction(float(s))
    # acc * num / den = m + 1/2  <=>  acc = den * (2m + 1) / (2 num) ; take m = k
    den, num = f.denominator, f.numerator
    acc = Fraction(den * (2 * k + 1), 2 * num)
    return int(acc) if acc.denominator == 1 and abs(acc) < (1 << 31) else k


def test_requant_vs_float32_arithmetic_within_one_lsb(seed):
    """Against a float32 implementation (acc and scale multiplied in float32, as
    onnxruntime's kernels do), the result differs by at most one LSB, and only where
    the float32 product is within one float32 ulp of a rounding tie."""
    rng = np.random.default_rng(seed)
    n_diff = 0
    for _ in range(50):
        s = np.float32(10.0 ** rng.uniform(-5, -1))
        acc = rng.integers(-(1 << 20), 1 << 20, 2000)
        r = Requant(*quantize_multiplier(float(s)), 0, -128, 127)
        got = r.apply(acc).astype(np.int64)
        prod32 = acc.astype(np.float32) * s
        f32 = np.clip(np.rint(prod32), -128, 127).astype(np.int64)
        diff = np.abs(got - f32)
        assert diff.max() <= 1, f"seed {seed}"
        exact = acc.astype(np.float64) * np.float64(s)
        near_tie = np.abs(np.abs(exact - np.floor(exact)) - 0.5) <= np.spacing(
            np.abs(prod32)).astype(np.float64)
        assert np.all(near_tie[diff == 1]), f"seed {seed}: a difference away from a tie"
        n_diff += int(diff.sum())
    assert n_diff < 50 * 2000 * 0.01


def test_qlinearmatmul_in_range_is_bit_exact_with_onnx(seed):
    """ONNX's own QLinearMatMul (onnx.reference) on random data whose results stay
    in range: the imported QGemm reproduces it exactly."""
    rng = np.random.default_rng(seed)
    for _ in range(5):
        k, n = int(rng.integers(1, 20)), int(rng.integers(1, 10))
        a = rng.integers(-128, 128, (3, k), dtype=np.int8)
        w = rng.integers(-128, 128, (k, n), dtype=np.int8)
        sa, sw = np.float32(rng.uniform(0.001, 0.1)), np.float32(rng.uniform(0.001, 0.1))
        acc = a.astype(np.int64) @ w.astype(np.int64)
        sy = np.float32(max(np.abs(acc).max(), 1) * sa * sw / 120)
        inits = [numpy_helper.from_array(np.array(v), nm) for nm, v in [
            ("sa", sa), ("za", np.int8(0)), ("w", w), ("sw", sw), ("zw", np.int8(0)),
            ("sy", sy), ("zy", np.int8(3))]]
        node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "w", "sw", "zw", "sy",
                                                  "zy"], ["y"], name="mm")
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info(
            "a", TensorProto.INT8, [3, k])], [helper.make_tensor_value_info(
                "y", TensorProto.INT8, [3, n])], initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        want = ReferenceEvaluator(m).run(None, {"a": a})[0]
        graph = load_onnx(m)
        assert graph.nodes[0].device == "npu"
        assert np.array_equal(run_reference(graph, {"a": a})["y"], want), f"seed {seed}"


def test_qadd_shared_shift_within_one_lsb(seed):
    """vadd's two multipliers share one shift; against the exact real sum rounded half
    to even the result is off by at most one LSB (only near ties), and so it is
    against ONNX's float QDQ Add."""
    rng = np.random.default_rng(seed)
    for _ in range(10):
        sa, sb, sy = (float(np.float32(10 ** rng.uniform(-3, -1))) for _ in range(3))
        za, zb, zy = (int(v) for v in rng.integers(-20, 20, 3))
        (ma, mb), shift = quantize_multipliers_shared([sa / sy, sb / sy])
        assert max(ma, mb) >= 1 << 30 and max(ma, mb) < 1 << 31  # 31 significant bits
        b = GraphBuilder()
        ai, bi = b.input("a", (64,), scale=sa, zp=za), b.input("b", (64,), scale=sb, zp=zb)
        b.output(b.qadd(ai, bi, out_scale=sy, out_zp=zy), "y")
        g = b.build()
        a = rng.integers(-128, 128, 64, dtype=np.int8)
        bb = rng.integers(-128, 128, 64, dtype=np.int8)
        got = run_reference(g, {"a": a, "b": bb})["y"].astype(np.int64)
        exact = [max(-128, min(127, rne((Fraction(sa) * (int(x) - za) + Fraction(sb)
                                         * (int(y) - zb)) / Fraction(sy)) + zy))
                 for x, y in zip(a, bb, strict=True)]
        assert np.abs(got - exact).max() <= 1, f"seed {seed}"
        assert np.mean(got == exact) >= 0.95, f"seed {seed}"
        ref = onnx_qdq_add(a, bb, sa, za, sb, zb, sy, zy)
        assert np.abs(got - ref).max() <= 1, f"seed {seed}"


def onnx_qdq_add(a, b, sa, za, sb, zb, sy, zy):
    ins = {"a": a, "b": b}
    nodes, inits = [], []
    for nm, s, z in (("a", sa, za), ("b", sb, zb)):
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"s{nm}"),
                  numpy_helper.from_array(np.array(z, np.int8), f"z{nm}")]
        nodes.append(helper.make_node("DequantizeLinear", [nm, f"s{nm}", f"z{nm}"], [f"f{nm}"]))
    inits += [numpy_helper.from_array(np.array(sy, np.float32), "sy"),
              numpy_helper.from_array(np.array(zy, np.int8), "zy")]
    nodes += [helper.make_node("Add", ["fa", "fb"], ["f"]),
              helper.make_node("QuantizeLinear", ["f", "sy", "zy"], ["y"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.INT8, [64]) for n in ("a", "b")]
    g = helper.make_graph(nodes, "add", vi, [helper.make_tensor_value_info(
        "y", TensorProto.INT8, [64])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(m).run(None, ins)[0].astype(np.int64)


def test_quantize_and_dequantize_match_onnx_including_ties(seed):
    rng = np.random.default_rng(seed)
    scale = np.float32(rng.uniform(0.01, 1))
    x = np.concatenate([rng.normal(0, 50, 200), (np.arange(-40, 40) + 0.5) * scale,
                        [1e6, -1e6]]).astype(np.float32)
    b = GraphBuilder()
    q = b.quantize(b.input("x", x.shape, dtype="float32"), float(scale), 7)
    f = b.dequantize(q)
    b.output(q, "q")
    b.output(f, "f")
    got = run_reference(b.build(), {"x": x})
    inits = [numpy_helper.from_array(np.array(scale), "s"),
             numpy_helper.from_array(np.array(7, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["f"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x.shape)], [helper.make_tensor_value_info(
            n, t, x.shape) for n, t in (("q", TensorProto.INT8), ("f", TensorProto.FLOAT))],
        initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    q_ref, f_ref = ReferenceEvaluator(m).run(None, {"x": x})
    assert np.array_equal(got["q"], q_ref) and np.array_equal(got["f"], f_ref), f"seed {seed}"


def test_shared_multipliers_reject_bad_scales():
    with pytest.raises(ValueError):
        quantize_multipliers_shared([0.0, 0.0])
    with pytest.raises(ValueError):
        quantize_multipliers_shared([-1.0, 0.5])
    (m0, m1), shift = quantize_multipliers_shared([0.0, 0.75])
    assert m0 == 0 and Fraction(m1, 1 << shift) == Fraction(3, 4)


def test_run_reference_checks_its_inputs():
    b = GraphBuilder()
    b.output(b.relu(b.input("x", (2,), scale=1.0, zp=0)), "y")
    g = b.build()
    with pytest.raises(ValueError, match="missing input"):
        run_reference(g, {})
    with pytest.raises(ValueError, match="shape"):
        run_reference(g, {"x": np.zeros(3, np.int8)})
    with pytest.raises(ValueError, match="int8"):
        run_reference(g, {"x": np.array([0, 300])})
    with pytest.raises(ValueError, match="unknown"):
        run_reference(g, {"x": np.zeros(2, np.int8), "z": 1})
    assert run_reference(g, {"x": np.array([-5, 5], np.int8)})["y"].tolist() == [0, 5]


def test_uint8_boundary_conversion():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, [4])], [helper.make_tensor_value_info(
            "y", TensorProto.UINT8, [4])])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    x = np.array([0, 1, 128, 255], np.uint8)
    out = run_reference(graph, {"x": x}, keep_all=True)
    assert out["y"].dtype == np.uint8 and out["y"].tolist() == x.tolist()
    with pytest.raises(ValueError, match="uint8"):
        run_reference(graph, {"x": np.array([-1, 0, 0, 0])})
    assert onnx.__version__ == "1.19.1"
