"""The hand-written programs in firmware/programs, one per instruction class, run on
the golden model and checked against numpy formulas written here."""

from pathlib import Path

import numpy as np
import pytest

from firmware import asm, isa
from firmware.golden import Machine
from firmware.quant import quantize_multiplier

PROGRAMS = Path(__file__).resolve().parent.parent / "firmware" / "programs"
TABLE = [(i * 4096, 4096) for i in range(8)]


def run(name, args=(), defines=None, dram=None, machine=None):
    prog = asm.assemble((PROGRAMS / name).read_text(), defines)
    m = machine or Machine(dram_bytes=1 << 16)
    for addr, data in (dram or {}).items():
        raw = np.ascontiguousarray(data).view(np.uint8).ravel()
        m.dram[addr: addr + raw.size] = raw
    res = m.load_and_run(prog, TABLE, args=args)
    assert res.ok, f"{name}: {res.error.name} at pc {res.pc}: {res.message}"
    return m, res


def ref_rne(x, shift):
    """Round-half-even of x / 2**shift with Python integers (independent of firmware)."""
    out = []
    for v in np.asarray(x, dtype=object).ravel():
        q, r = divmod(int(v), 1 << shift) if shift else (int(v), 0)
        half = (1 << shift) // 2
        if shift and (r > half or (r == half and q % 2)):
            q += 1
        out.append(q)
    return np.array(out, dtype=np.int64).reshape(np.shape(x))


def test_every_instruction_class_has_a_program():
    used = set()
    for path in PROGRAMS.glob("*.s"):
        prog = asm.assemble(path.read_text(), defaultdict_defines())
        used |= {i.spec.cls for i in prog.instrs()}
    assert used == {s.cls for s in isa.SPECS}


def defaultdict_defines():
    names = ["QMUL", "QSHIFT", "QZP", "ADD_MUL_A", "ADD_MUL_B", "ADD_ZP_A", "ADD_ZP_B",
             "GATE_MUL", "GATE_SHIFT", "GATE_ZP", "EXP_MUL", "EXP_SHIFT", "EXP_ZP"]
    return {n: 1 for n in names}


@pytest.mark.parametrize("n", [0, 1, 5, 13, 40])
def test_scalar(n):
    m, _ = run("scalar.s", args=(n,))
    s, f = n * (n + 1) // 2, 1
    for i in range(1, n + 1):
        f = (f * i) % (1 << 32)
    assert m.regs[2] == s and m.regs[3] == f
    assert m.regs[4] == int(s < f)
    assert m.regs[6] == (s - f) % (1 << 32)


def test_control():
    m, res = run("control.s")
    assert (m.regs[2], m.regs[3], m.regs[4], m.regs[5], m.regs[6]) == (12, 30, 0, 1, 23)
    assert [r.region for r in m.trace] == [9] * 5
    assert m.counters["misspeculations"] == 1 and m.counters["regions"] == 5
    assert m.pt_set == 1


def test_dma():
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    m, _ = run("dma.s", args=(0x100, 0x1000), dram={0x100: src})
    block = src[2:6, 4:12]
    assert np.array_equal(m.dram[0x1000:0x1020].reshape(4, 8), block)
    strided = m.dram[0x1040:0x1040 + 64].reshape(4, 16)
    assert np.array_equal(strided[:, :8], block)
    assert not strided[:, 8:].any(), "bytes between strided rows must stay untouched"
    assert m.counters["tag_misses"][0] == 1 and m.counters["tag_hits"][0] == 1
    assert m.counters["dram_read_bytes"] == 32 and m.counters["dram_write_bytes"] == 64


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gemm(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (16, 16), dtype=np.int8)
    w = rng.integers(-128, 128, (16, 8), dtype=np.int8)
    b = rng.integers(-50000, 50000, 8).astype("<i4")
    mult, shift = quantize_multiplier(rng.uniform(1e-4, 1e-2))
    zp = int(rng.integers(-20, 20))
    m, _ = run("gemm.s", args=(0, 0x400, 0x800, 0x1000),
               defines=dict(QMUL=mult, QSHIFT=shift, QZP=zp),
               dram={0: x, 0x400: w, 0x800: b})
    acc = x.astype(np.int64) @ w.astype(np.int64) + b
    want = np.clip(ref_rne(acc * mult, shift) + zp, -128, 127)
    got = m.dram[0x1000:0x1080].view(np.int8).reshape(16, 8)
    assert np.array_equal(got, want), f"seed {seed}"
    assert m.counters["macs"] == 16 * 16 * 8


def test_vector():
    rng = np.random.default_rng(11)
    a = rng.integers(-128, 128, (4, 8), dtype=np.int8)
    b = rng.integers(-128, 128, (4, 8), dtype=np.int8)
    t = rng.integers(-128, 128, (4, 4, 2), dtype=np.int8)
    v = np.array([3, -7, 9, 1, 9, -128, 0, 2], dtype=np.int8)
    d = dict(ADD_MUL_A=3 << 20, ADD_MUL_B=5 << 19, ADD_ZP_A=-3, ADD_ZP_B=4, QSHIFT=22, QZP=1)
    m, _ = run("vector.s", args=(0x200, 0x800), defines=d,
               dram={0x200: np.concatenate([a.ravel(), b.ravel(), t.ravel(), v])})
    out = m.dram[0x800:0x800 + 72].view(np.int8)
    s = (a.astype(np.int64) + 3) * (3 << 20) + (b.astype(np.int64) - 4) * (5 << 19)
    assert np.array_equal(out[:32].reshape(4, 8), np.clip(ref_rne(s, 22) + 1, -128, 127))
    assert np.array_equal(out[32:64].reshape(4, 8), np.clip(a, -10, 10))
    pooled = t.reshape(2, 2, 2, 2, 2).max(axis=(1, 3))  # (h', w', c)
    assert np.array_equal(out[64:72].reshape(2, 2, 2), pooled)
    assert m.regs[12] == 2  # first of the two 9s


def test_depthwise(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (5, 4, 8), dtype=np.int8)
    w = rng.integers(-128, 128, (3, 3, 8), dtype=np.int8)  # (kernel row, column, channel)
    pad = int(rng.integers(-20, 20))
    bias = rng.integers(-5000, 5000, 8).astype("<i4")
    block = np.zeros(112, dtype=np.int8)
    block[:72] = w.ravel()
    block[72] = pad
    block[80:] = bias.view(np.int8)
    mult, shift = quantize_multiplier(rng.uniform(1e-4, 1e-2))
    zp = int(rng.integers(-20, 20))
    m, _ = run("depthwise.s", args=(0, 0x800, 0x400),
               defines=dict(QMUL=mult, QSHIFT=shift, QZP=zp), dram={0: x, 0x400: block})
    xp = np.full((7, 6, 8), pad, dtype=np.int64)
    xp[1:6, 1:5] = x
    acc = sum(xp[i:i + 5, j:j + 4] * w[i, j].astype(np.int64)
              for i in range(3) for j in range(3)) + bias
    want = np.clip(ref_rne(acc * mult, shift) + zp, -128, 127)
    got = m.dram[0x800:0x800 + 160].view(np.int8).reshape(5, 4, 8)
    assert np.array_equal(got, want), f"seed {seed}"
    assert m.counters["macs"] == 5 * 4 * 9 * 8
