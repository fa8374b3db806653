"""Depthwise engine (hdl/depthwise.py): random dwload/dwconv commands against the
golden model, in Amaranth's simulator.

The engine runs with a scratchpad model that refuses reads at random (as the NPU's
port never does, so the engine must hold a refused read) and an accumulator model
with the buffer's one-cycle read; the golden model runs the same commands as a
program, and the accumulator rows, the ``macs`` count and the cycles of each
command on an always-granting scratchpad are compared.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from amaranth.sim import Simulator

from firmware import asm
from firmware.config import CONFIGS, NPUConfig
from firmware.golden import CostModel, Machine
from firmware.isa import DW_LOAD_WINDOWS
from hdl.depthwise import DepthwiseEngine, DwOp
from hdl.ports import SP_READ_LATENCY

CONFIG = CONFIGS["default"]
SP_BYTES = 4096  # the part of the scratchpad the commands use


def random_conv(rng: random.Random, config: NPUConfig) -> dict:
    """A legal dwconv inside SP_BYTES and the first 256 accumulator rows."""
    while True:
        s, kh, kw = rng.choice((1, 2)), rng.randint(1, 3), rng.randint(1, 3)
        h = rng.randint(1, (config.dw_rows - kh) // s + 1)
        mo = rng.randint(1, 9)
        n = rng.randint(1, config.cols)
        pix = rng.choice((0, n, config.cols, 16, 24, 64))
        rows_in, cols_in = (h - 1) * s + kh, (mo - 1) * s + kw
        pads = [rng.choice((0, 0, 1, 2)) for _ in range(4)]  # top, bottom, left, right
        rows, cols = rows_in - pads[0] - pads[1], cols_in - pads[2] - pads[3]
        row = rng.choice((0, (pix or n) * cols, (pix or n) * cols + rng.randint(0, 9)))
        span = (rows - 1) * (row or n) + (cols - 1) * (pix or n) + n
        if rows >= 1 and cols >= 1 and span + 64 < SP_BYTES and h * mo < 200:
            return dict(sp=rng.randint(0, SP_BYTES - span - 64), acc=rng.randint(0, 40),
                        m=mo, h=h, s=s, kh=kh, kw=kw, n=n, pix=pix, row=row,
                        accumulate=rng.randint(0, 1), pt=pads[0], pb=pads[1], pl=pads[2],
                        pr=pads[3])


def golden(config, sp: np.ndarray, cmds) -> tuple[np.ndarray, int, list[int]]:
    """The accumulator, the MACs and each command's cycles by the golden model."""
    mach = Machine(config)
    mach.sp[:len(sp)] = sp
    src, costs = [], []
    for c in cmds:
        if c["op"] == "load":
            src.append(f"li r1, {c['sp']}\ndwload p0, r1\n")
            costs.append(DW_LOAD_WINDOWS + CostModel().dwload_latency)
        else:
            mode = "accumulate" if c["accumulate"] else "overwrite"
            src.append(f"cfg.gemm_stride {c['pix']}\ncfg.in_stride {c['row']}\n"
                       f"li r1, {c['sp']}\nli r2, {c['acc']}\n"
                       f"dwconv.{mode} p0, r1, r2, {c['m']}, {c['h']}, {c['s']}, "
                       f"{c['kh']}, {c['kw']}, {c['n']}, pt={c['pt']}, pb={c['pb']}, "
                       f"pl={c['pl']}, pr={c['pr']}\n")
            rows_in, cols_in = (c["h"] - 1) * c["s"] + c["kh"], (c["m"] - 1) * c["s"] + c["kw"]
            costs.append(rows_in * cols_in + c["h"] + CostModel().dwconv_latency)
    res = mach.load_and_run(asm.assemble("".join(src) + "end\n"),
                            [(0, config.sp_bytes)] + [(0, 0)] * (config.partitions - 1))
    assert res.ok, res
    return mach.acc.copy(), mach.counters["macs"], costs


def simulate(config, sp: np.ndarray, cmds, refuse: float, seed: int):
    """Run the commands on the engine; return the accumulator, MACs and cycles per
    command (acceptance to ``done``)."""
    dut = DepthwiseEngine(config)
    rng = random.Random(seed)
    accbuf = np.zeros((config.acc_rows, config.cols), dtype=np.int64)
    out = {"macs": 0, "cycles": []}
    w = config.bus_bytes

    async def bench(ctx):
        due = deque([None] * SP_READ_LATENCY)
        acc_read = None
        for c in cmds:
            p = {"op": DwOp.LOAD if c["op"] == "load" else DwOp.CONV, "sp": c["sp"]}
            if c["op"] == "conv":
                p.update(pix=c["pix"] or c["n"], row=c["row"] or c["n"], m=c["m"], h=c["h"],
                         acc=c["acc"], accumulate=c["accumulate"], s=c["s"], kh=c["kh"],
                         kw=c["kw"], n=c["n"], pt=c["pt"], pb=c["pb"], pl=c["pl"],
                         pr=c["pr"])
            ctx.set(dut.cmd.payload, p)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick()
            ctx.set(dut.cmd.valid, 0)
            start, cycle = 0, 0
            while True:
                # the scratchpad: a grant's window comes SP_READ_LATENCY cycles later
                ready = rng.random() >= refuse
                ctx.set(dut.sp.ready, ready)
                data = due.popleft()
                ctx.set(dut.sp.rvalid, data is not None)
                ctx.set(dut.sp.rdata, int.from_bytes(bytes(data), "little") if data else 0)
                valid, addr = ctx.get(dut.sp.valid), ctx.get(dut.sp.addr)
                due.append([int(sp[(addr + i) % len(sp)]) for i in range(w)]
                           if valid and ready else None)
                # the accumulator: a read answers the next cycle
                rd = acc_read
                ctx.set(dut.acc.rdata, sum((int(v) & 0xFFFFFFFF) << (32 * j)
                                           for j, v in enumerate(accbuf[rd])) if rd is not None
                        else 0)
                acc_read = ctx.get(dut.acc.raddr) if ctx.get(dut.acc.ren) else None
                if ctx.get(dut.acc.wen):
                    row, word, mask = (ctx.get(dut.acc.waddr), ctx.get(dut.acc.wdata),
                                       ctx.get(dut.acc.wmask))
                    for j in range(config.cols):
                        if mask >> j & 1:
                            v = (word >> (32 * j)) & 0xFFFFFFFF
                            accbuf[row, j] = v - (1 << 32) if v >> 31 else v
                out["macs"] += ctx.get(dut.macs)
                done = ctx.get(dut.done)
                await ctx.tick()
                cycle += 1
                if done:
                    break
                assert cycle < 10_000, "the engine hangs"
            assert ctx.get(dut.idle)
            out["cycles"].append(cycle - start)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return accbuf.astype(np.int32), out["macs"], out["cycles"]


def program(rng: random.Random, config: NPUConfig, count: int):
    cmds = []
    for _ in range(count):
        if not cmds or rng.random() < 0.3:
            cmds.append({"op": "load",
                         "sp": rng.randint(0, SP_BYTES - DW_LOAD_WINDOWS * config.cols)})
        else:
            cmds.append({"op": "conv", **random_conv(rng, config)})
    return cmds


@pytest.mark.parametrize("refuse", [0.0, 0.3])
def test_engine_matches_golden(seed, refuse):
    rng = random.Random(seed)
    sp = np.frombuffer(rng.randbytes(SP_BYTES), dtype=np.uint8).copy()
    cmds = program(rng, CONFIG, 12)
    want, want_macs, costs = golden(CONFIG, sp, cmds)
    got, macs, cycles = simulate(CONFIG, sp, cmds, refuse, seed)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"accumulator differs at {len(bad)} places, first {tuple(bad[0])}: " \
                          f"{got[tuple(bad[0])]} != {want[tuple(bad[0])]} ({cmds})"
    assert macs == want_macs
    if refuse == 0:
        # The golden model counts from the compute queue's start, which is a fixed
        # number of cycles from the engine's acceptance to its done: one per command kind.
        offsets = {(c["op"], got - want) for c, got, want in zip(cmds, cycles, costs,
                                                                  strict=True)}
        assert len(offsets) == len({op for op, _ in offsets}), offsets


def test_engine_needs_rows():
    with pytest.raises(ValueError, match="dw_rows"):
        DepthwiseEngine(NPUConfig(dw_rows=0))
