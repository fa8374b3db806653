"""Vector unit (hdl/vector.py) against the golden model.

Broad random tests run in Amaranth's simulator on both configurations: every
operation with random shapes, strides, configuration values (ties, saturation,
shift 0 and 63, negative zero points) and data, behind scratchpad ports that
refuse requests at random and the real accumulator. One random command sequence
also runs under Verilator + cocotb. The bench itself lives in ``verif.vector_tb``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from firmware.config import CONFIGS, NPUConfig
from firmware.isa import CFG_RANGE, CFG_RESET, CfgField
from hdl.ports import (
    VectorOp,
)
from verif.sim import run_cocotb, sim_build_dir, to_verilog
from verif.vector_tb import (
    ACC_WINDOW,
    Stimulus,
    VectorHarness,
    cfg_cmd,
    check,
    command,
    golden,
    mixed_sequence,
    op_sequence,
    pack_command,
    read_acc,
    run_commands,
)

COCOTB_MODULE = "verif.vector_tb"


class AmaranthIo:
    """``io`` for :func:`verif.vector_tb.run_commands` on an Amaranth testbench context."""

    def __init__(self, ctx, dut):
        self.ctx = ctx
        self.dut = dut
        self.signals = {}

    def _s(self, name):
        s = self.signals.get(name)
        if s is None:
            s = self.dut
            for part in name.split("."):
                s = getattr(s, part)
            if isinstance(s, data.View):
                s = s.as_value()
            self.signals[name] = s
        return s

    def get(self, name):
        return self.ctx.get(self._s(name))

    def set(self, name, value):
        self.ctx.set(self._s(name), value)

    def tick(self):
        return self.ctx.tick()


def simulate(config: NPUConfig, bench):
    """Run ``await bench(io, dut)`` against a fresh harness."""
    dut = VectorHarness(config)
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def testbench(ctx):
        await bench(AmaranthIo(ctx, dut), dut)

    sim.add_testbench(testbench)
    sim.run()


def run_and_check(config: NPUConfig, stim: Stimulus, seed: int, **kw) -> dict:
    out = {}

    async def bench(io, dut):
        sp, results, stats = await run_commands(io, config, stim, seed, **kw)
        acc = await read_acc(io, config, ACC_WINDOW)
        check(config, stim, sp, results, acc, seed)
        out.update(stats, refusals=sp.refusals)

    simulate(config, bench)
    return out


CONFIG_NAMES = ["default", "small"]
OPS = [VectorOp.BIAS, VectorOp.REQ, VectorOp.ADD, VectorOp.CLIP, VectorOp.MAX,
       VectorOp.ARGMAX, VectorOp.QTAB, VectorOp.REQB]


@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_op_random(name, op, seed, regress):
    config = CONFIGS[name]
    stim = op_sequence(config, seed, op, 30 if regress else 8)
    stats = run_and_check(config, stim, seed)
    assert stats["refusals"] > 0, "the scratchpad model never refused a request"


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_mixed_random(name, seed, regress):
    config = CONFIGS[name]
    stim = mixed_sequence(config, seed, 60 if regress else 14)
    run_and_check(config, stim, seed, grant=random.Random(seed).choice([0.3, 0.6, 0.9]))


def test_long_rows(seed):
    """ARGMAX over 4096 elements (ties in the last chunk), long rows, a 255-tap window."""
    config = CONFIGS["default"]
    st = Stimulus(config, seed)
    a = st.region(4096)
    x = np.random.default_rng(seed).integers(-128, 100, 4096).astype(np.int8)
    x[[4090, 4093]] = 127  # first maximum in the last chunk
    st.plant(a, x, np.int8)
    st.cmds.append(command(VectorOp.ARGMAX, a=a, n=4096))
    st.argmax(n=4095)
    st.set_cfg(CfgField.POOL_COUNT, 3)
    st.set_cfg(CfgField.POOL_STRIDE, 5)
    st.set_cfg(CfgField.POOL_ISTRIDE, 0)
    a = st.region(700)
    # two dense rows of 600: the destination spans 1200 bytes
    st.cmds.append(command(VectorOp.MAX, a=a, d=st.region(1200, avoid=[(a, 700)]), m=2, n=600))
    st.set_cfg(CfgField.POOL_COUNT, 255)  # the longest window
    st.set_cfg(CfgField.POOL_STRIDE, 1)
    w = st.region(300)
    st.cmds.append(command(VectorOp.MAX, a=w, d=st.region(9, avoid=[(w, 300)]), m=1, n=9))
    st.set_cfg(CfgField.CLIP_LO, -5)
    st.cmds.append(command(VectorOp.CLIP, a=a, d=a, m=1, n=699))  # in place
    run_and_check(config, st, seed, grant=0.9)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_pool_partial_chunk(name, seed):
    """The pool of random program 5014: rows of 9 bytes (a full window and one lane on
    the default NPU), 3 taps 9 apart, windows 27 apart, a dense destination; source and
    destination at random (mostly unaligned) places, twice."""
    config = CONFIGS[name]
    st = Stimulus(config, seed)
    st.set_cfg(CfgField.POOL_COUNT, 3)
    st.set_cfg(CfgField.POOL_STRIDE, 9)
    st.set_cfg(CfgField.POOL_ISTRIDE, 27)
    st.set_cfg(CfgField.OUT_STRIDE, 0)
    a = st.region(81)
    st.cmds.append(command(VectorOp.MAX, a=a, d=st.region(27, avoid=[(a, 81)]), m=3, n=9))
    a = st.region(81)
    st.cmds.append(command(VectorOp.MAX, a=a, d=st.region(27, avoid=[(a, 81)]), m=3, n=9))
    run_and_check(config, st, seed, grant=0.5)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_requant_extremes(name, seed):
    """Products at +-2**62, shifts 0/1/62/63 (ties at 63), clamps at both ends."""
    config = CONFIGS[name]
    st = Stimulus(config, seed)
    cols = config.cols
    vals = [-(1 << 31), (1 << 31) - 1, 0, 1, -1, 3, -3, 5][:cols]
    vals += [-(1 << 31)] * (cols - len(vals))
    a = st.region(4 * cols)
    st.plant(a, vals, "<i4")
    st.cmds.append(command(VectorOp.BIAS, a=a, acc=0, m=2, n=cols))
    st.cmds.append(command(VectorOp.BIAS, a=a, acc=1, m=1, n=cols))  # row 1 wraps
    for qmul in (-(1 << 31), (1 << 31) - 1, 1, -1):
        for qshift in (0, 1, 62, 63):
            for zp, lo, hi in ((0, -128, 127), (-128, -100, 100), (127, 0, 127)):
                st.maybe_cfg({CfgField.QMUL: qmul, CfgField.QSHIFT: qshift, CfgField.QZP: zp,
                              CfgField.CLIP_LO: lo, CfgField.CLIP_HI: hi})
                d = st.region(2 * cols)
                st.cmds.append(command(VectorOp.REQ, d=d, acc=0, m=2, n=cols))
    run_and_check(config, st, seed, grant=0.9, gap=0.0)


def test_throughput(seed):
    """With every request granted, each op moves one accumulator row (BIAS/REQ) or one
    window per source (ADD/CLIP/MAX/ARGMAX) per cycle, plus a fixed per-command latency."""
    config = CONFIGS["default"]
    W, cols = config.bus_bytes, config.cols
    st = Stimulus(config, seed)
    beats = 0

    def op(opcode, count, **f):
        nonlocal beats
        st.cmds.append(command(opcode, **f))
        beats += count

    op(VectorOp.BIAS, 32 + 4 * cols // W, a=0, acc=0, m=32, n=cols)
    op(VectorOp.REQ, 32, d=0, acc=0, m=32, n=cols)
    op(VectorOp.CLIP, 4 * 16, a=1000, d=5001, m=4, n=16 * W)
    op(VectorOp.ADD, 2 * 16, a=2000, b=3003, d=6000, m=2, n=16 * W)
    op(VectorOp.ARGMAX, 64, a=3, n=64 * W)
    st.set_cfg(CfgField.POOL_COUNT, 2)
    st.set_cfg(CfgField.POOL_STRIDE, 9 * W)
    st.set_cfg(CfgField.POOL_ISTRIDE, 18 * W)
    op(VectorOp.MAX, 2 * 8 * 2, a=7000, d=9000, m=2, n=8 * W)
    stats = run_and_check(config, st, seed, grant=1.0, gap=0.0)
    latency = 12  # busy cycles beyond the beats: walker start, read, queue (2), pipeline (S1-S9)
    assert stats["busy"] <= beats + 6 * latency, (stats, beats)


def test_run_start_resets_cfg(seed):
    """run_start puts every configuration register back to CFG_RESET."""
    config = CONFIGS["small"]
    rng = random.Random(seed)
    stim = mixed_sequence(config, seed, 10)  # golden: a fresh run with reset registers

    async def bench(io, dut):
        io.set("acc_sel", 1)
        for f in CfgField:  # a previous run leaves every register off its reset value
            _, lo, hi = CFG_RANGE[f]
            value = rng.choice([v for v in (lo, hi, lo + 1) if v != CFG_RESET[f]])
            payload = command(VectorOp.CFG, field=int(f), value=value)
            io.set("cmd.payload", pack_command(config, payload))
            io.set("cmd.valid", 1)
            await io.tick()
        io.set("cmd.valid", 0)
        await io.tick()
        assert io.get("gemm_stride") != 0
        sp, results, stats = await run_commands(io, config, stim, seed)  # pulses run_start
        acc = await read_acc(io, config, ACC_WINDOW)
        check(config, stim, sp, results, acc, seed)

    simulate(config, bench)


def test_run_start_resets_table(seed):
    """run_start puts every requantization-table entry back to the reset qmul/qshift:
    a REQ with ``tab`` and no QTAB in its run equals one with the reset cfg values."""
    config = CONFIGS["default"]
    first = op_sequence(config, seed, VectorOp.QTAB, 3)  # leaves a table behind
    second = Stimulus(config, seed + 1)
    for _ in range(3):
        second.bias(edge=True)
    second.tables = 1  # pretend a table was loaded: REQs may use it
    for _ in range(6):
        second.req()
    for _ in range(64):  # each REQ uses the table at even odds: make sure one does
        if any(c["op"] == VectorOp.REQ and c["tab"] for c in second.cmds):
            break
        second.req()
    assert any(c["op"] == VectorOp.REQ and c["tab"] for c in second.cmds)

    async def bench(io, dut):
        io.set("acc_sel", 1)
        await run_commands(io, config, first, seed)
        sp, results, stats = await run_commands(io, config, second, seed)
        acc = await read_acc(io, config, ACC_WINDOW)
        check(config, second, sp, results, acc, seed)

    simulate(config, bench)


def test_cfg_done_and_gemm_stride():
    """Back-to-back CFG commands: one accepted per cycle, one done each, in order."""
    config = CONFIGS["small"]

    async def bench(io, dut):
        values = [7, 123456, 0]
        seen = []
        io.set("cmd.valid", 1)
        for i, v in enumerate(values):
            io.set("cmd.payload", pack_command(config, cfg_cmd(CfgField.GEMM_STRIDE, v)))
            assert io.get("cmd.ready") == 1
            await io.tick()
            assert io.get("done") == 1, f"no done for CFG {i}"
            seen.append(io.get("gemm_stride"))
            io.set("cmd.valid", int(i + 1 < len(values)))
        await io.tick()
        assert io.get("done") == 0
        assert seen == values
        assert io.get("busy") == 0 and io.get("idle") == 1

    simulate(config, bench)


def test_bench_detects_a_wrong_result(seed):
    """The checker is not vacuous: a corrupted scratchpad byte is reported with the seed."""
    config = CONFIGS["small"]
    stim = op_sequence(config, seed, VectorOp.CLIP, 2)
    exp = golden(config, stim.sp, stim.cmds)

    class Fake:
        mem = exp.sp.copy()

    Fake.mem[stim.cmds[-1]["d"]] ^= 1
    with pytest.raises(AssertionError, match=f"seed {seed}"):
        check(config, stim, Fake, exp.argmax, exp.acc[:ACC_WINDOW], seed)


@pytest.mark.rtl
def test_random_sequence_verilator(seed):
    """One random command sequence on the default config under Verilator + cocotb."""
    name = "vector_harness"
    build = sim_build_dir(name)
    src = to_verilog(VectorHarness(CONFIGS["default"]), name, build / f"{name}.v")
    run_cocotb(name, [src], COCOTB_MODULE, build,
               extra_env={"VECTOR_CONFIG": "default", "VECTOR_SEED": str(seed),
                          "VECTOR_COUNT": "80"})
