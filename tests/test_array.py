"""GEMM engine (hdl/array.py): random wload/gemm sequences against numpy.

Broad random runs use Amaranth's simulator on both configurations; one random run
goes through Verilator + cocotb on the default configuration. Every run has a
scratchpad model that refuses requests at random, the real accumulator, and checks
the results, the ``macs`` counts, the done pulses and ``idle``/``busy``/``stall``
(see ``verif.array_tb.check_trace``).
"""

from __future__ import annotations

import gc
import random
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from firmware.config import CONFIGS, NPUConfig
from hdl.array import PE_STAGES, GemmEngine, ProcessingElement
from hdl.ports import SP_READ_LATENCY, ArrayOp
from verif.array_tb import (
    TOPLEVEL,
    ArrayHarness,
    Command,
    Cycle,
    acc_window,
    check_acc,
    check_trace,
    grants,
    random_program,
    random_scratchpad,
    reference,
    unpack_row,
    window,
)
from verif.sim import run_cocotb, sim_build_dir, to_verilog

COCOTB_MODULE = "verif.array_tb"


def simulate(config: NPUConfig, prog: list[Command], sp: np.ndarray, rng: random.Random,
             grant: str, what: str, *, gaps: bool = True, max_cycles: int = 50_000):
    """Run ``prog`` on the harness in Amaranth's simulator.

    Returns the per-cycle trace and the accumulator rows of :func:`acc_window`.
    """
    dut = ArrayHarness(config)
    width = config.bus_bytes
    trace: list[Cycle] = []
    acc_rows = {}

    def scratchpad(port, name):
        async def serve(ctx):
            unaccepted = None
            grant_seq = grants(rng, grant)
            due = deque([None] * (SP_READ_LATENCY - 1))  # read data on its way
            ctx.set(port.ready, next(grant_seq))
            async for _, _, valid, ready, addr, we in ctx.tick().sample(
                    port.valid, port.ready, port.addr, port.we):
                if unaccepted is not None:
                    assert valid and addr == unaccepted, f"{what}: refused {name} request changed"
                assert not (valid and we), f"{what}: the GEMM engine must only read"
                due.append(window(sp, addr, width) if valid and ready else None)
                rdata = due.popleft()
                ctx.set(port.rvalid, rdata is not None)
                if rdata is not None:
                    ctx.set(port.rdata, rdata)
                unaccepted = addr if valid and not ready else None
                ctx.set(port.ready, next(grant_seq))
        return serve

    async def monitor(ctx):
        d = dut
        async for _, _, *v in ctx.tick().sample(
                d.cmd.valid, d.cmd.ready, d.wload_done, d.gemm_done, d.macs, d.mon_wen,
                d.mon_waddr, d.idle, d.busy, d.stall, d.sp.valid, d.sp.ready, d.wsp.valid,
                d.wsp.ready):
            trace.append(Cycle(v[0] & v[1], *v[2:]))

    async def driver(ctx):
        for c in prog:
            if gaps and rng.random() < 0.3:
                await ctx.tick().repeat(rng.choice([1, 2, 4]))
            ctx.set(dut.cmd.payload, c.fields())
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)
        for _ in range(max_cycles):
            if ctx.get(dut.idle):
                break
            await ctx.tick()
        else:
            raise AssertionError(f"{what}: not idle {max_cycles} cycles after the last command")
        await ctx.tick()  # the monitor records the idle cycle
        ctx.set(dut.rb_sel, 1)
        ctx.set(dut.rb.ren, 1)
        for r in acc_window(config):
            ctx.set(dut.rb.raddr, r)
            await ctx.tick()
            acc_rows[r] = unpack_row(config, ctx.get(dut.rb.rdata))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(scratchpad(dut.sp, "sp"), background=True)
    sim.add_testbench(scratchpad(dut.wsp, "wsp"), background=True)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(driver)
    sim.run()
    return trace, acc_rows


def run_random(config: NPUConfig, seed: int, length: int, grant: str):
    rng = random.Random(seed)
    what = f"seed {seed} ({config.rows}x{config.cols}, grant={grant})"
    sp = random_scratchpad(config, rng)
    prog = random_program(config, rng, length)
    trace, acc = simulate(config, prog, sp, rng, grant, what)
    check_trace(config, prog, trace, what)
    check_acc(config, reference(config, sp, prog), acc, what)
    return prog, trace


# ---- Amaranth simulator -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "small"])
@pytest.mark.parametrize("grant", ["always", "random", "bursty"])
def test_random_sequences(name, grant, seed, regress):
    config = CONFIGS[name]
    for i in range(6 if regress else 1):
        run_random(config, seed + i, 45, grant)


def test_streams_one_row_per_cycle(seed):
    # With the scratchpad always granting, back-to-back gemms keep the row port busy
    # every cycle: no bubble between gemms (m=1 ones too), none between a swap gemm and
    # the wload before it, which reads beside the gemm before the swap.
    config = CONFIGS["small"]
    rng = random.Random(seed)
    sp = random_scratchpad(config, rng)
    R, C = config.rows, config.cols
    prog = [Command(ArrayOp.WLOAD, 0, R, C)]
    for t in range(3):
        prog.append(Command(ArrayOp.GEMM, 256 + 64 * t, R, C, R, 12, 16 * t, t % 2, 1))
        prog.append(Command(ArrayOp.WLOAD, 32 + 16 * t, R, C))
    prog.append(Command(ArrayOp.GEMM, 256, R, C, R, 12, 48, 1, 1))
    prog += [Command(ArrayOp.GEMM, 700 + 5 * i, R, C, R, 1, 60 + i % 2, 1) for i in range(5)]
    trace, acc = simulate(config, prog, sp, rng, "always", f"seed {seed}", gaps=False)
    check_trace(config, prog, trace, f"seed {seed}")
    check_acc(config, reference(config, sp, prog), acc, f"seed {seed}")
    fired = [s.sp_valid and s.sp_ready for s in trace]
    first = fired.index(True)
    last = len(fired) - 1 - fired[::-1].index(True)
    reads = sum(c.m for c in prog if c.op == ArrayOp.GEMM)
    # the wloads read through their own port, beside the rows
    assert sum(s.wsp_valid and s.wsp_ready for s in trace) == R * 4
    assert sum(fired) == reads
    assert last - first + 1 == reads, f"port idle {last - first + 1 - reads} cycles"


def test_wload_does_not_disturb_streaming_gemm(seed):
    # A long gemm on tile A while the next tile B is loaded, then gemm swap on B, then a
    # wload C right after the swap gemm: B's gemm must not see C, A's gemm must not see B.
    config = CONFIGS["default"]
    rng = random.Random(seed)
    sp = random_scratchpad(config, rng)
    R, C = config.rows, config.cols
    prog = [
        Command(ArrayOp.WLOAD, 0, R, C),
        Command(ArrayOp.GEMM, 1000, R, C, R, 20, 0, 0, 1),
        Command(ArrayOp.WLOAD, 100, R - 3, C - 2),
        Command(ArrayOp.GEMM, 2000, R - 3, C - 2, 7, 1, 5, 1, 1),
        Command(ArrayOp.WLOAD, 200, R, C),
        Command(ArrayOp.GEMM, 3000, R - 3, C - 2, R, 3, 0, 1, 0),
        Command(ArrayOp.GEMM, 4000, R, C, R, 4, 1008, 0, 1),
    ]
    for grant in ("always", "bursty"):
        what = f"seed {seed}, grant={grant}"
        trace, acc = simulate(config, prog, sp, rng, grant, what, gaps=False)
        check_trace(config, prog, trace, what)
        check_acc(config, reference(config, sp, prog), acc, what)


def test_back_to_back_accumulate(seed):
    # m=1 gemms on one row in consecutive cycles, alternating between a full-width tile
    # (accumulating) and a narrow one (sometimes overwriting): a forwarded row must keep
    # the columns the narrow tile did not write. Then m=3 gemms over the same three rows.
    config = CONFIGS["default"]
    rng = random.Random(seed)
    sp = random_scratchpad(config, rng)
    R, C = config.rows, config.cols
    tiles = [(R, C), (R - 5, 3)]
    prog = [
        Command(ArrayOp.WLOAD, 0, *tiles[0]),
        Command(ArrayOp.GEMM, 500, *tiles[0], R, 1, 7, 0, 1),
        Command(ArrayOp.WLOAD, 100, *tiles[1]),
    ]
    active = 0
    for i in range(8):
        swap = i % 2
        active ^= swap
        k, n = tiles[active]
        accumulate = int(i % 4 != 2)  # narrow, overwriting, followed by a full-width one
        prog.append(Command(ArrayOp.GEMM, 600 + 13 * i, k, n, k, 1, 7, accumulate, swap))
    for i in range(4):
        k, n = tiles[active]
        prog.append(Command(ArrayOp.GEMM, 900 + 29 * i, k, n, 5, 3, 1000, int(i > 0)))
    for grant in ("always", "random"):
        what = f"seed {seed}, grant={grant}"
        trace, acc = simulate(config, prog, sp, rng, grant, what, gaps=False)
        check_trace(config, prog, trace, what)
        check_acc(config, reference(config, sp, prog), acc, what)


def test_golden_cost_model_knows_the_pe_pipeline():
    """The golden model's GEMM latency counts the same processing-element stages and
    scratchpad read latency."""
    from firmware.golden import CostModel

    cost = CostModel()
    assert cost.array_stages == PE_STAGES
    assert cost.sp_read == SP_READ_LATENCY
    config = CONFIGS["default"]
    engine = GemmEngine(config)
    engine._MustUse__silence = True  # only its latency is read
    assert engine.latency == config.rows + config.cols + cost.array_stages + cost.sp_read - 2


def test_engine_rejects_non_config():
    with warnings.catch_warnings():
        # The half-built component is never elaborated; do not warn when it is collected.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="NPUConfig"):
            GemmEngine({"rows": 8})
        gc.collect()


def test_processing_element(seed):
    # The weight bank travels with the activation; products and sums are signed, wrap.
    rng = random.Random(seed)
    pe = ProcessingElement()
    cases = [(rng.randint(-128, 127), rng.randint(-(2**31), 2**31 - 1)) for _ in range(40)]
    cases += [(-128, 2**31 - 1), (127, -(2**31))]
    w = [rng.randint(-128, 127), -128]

    async def bench(ctx):
        for b in range(2):
            ctx.set(pe.w_we, 1 << b)
            ctx.set(pe.w_data, w[b])
            await ctx.tick()
        ctx.set(pe.w_we, 0)
        # A case's partial sum comes PE_STAGES - 1 cycles after its activation, and
        # its result one cycle later; activations stream every cycle meanwhile.
        lag = PE_STAGES - 1
        for t in range(len(cases) + lag):
            if t < len(cases):
                ctx.set(pe.a_in, cases[t][0])
                ctx.set(pe.sel_in, t % 2)
            i = t - lag
            if i >= 0:
                ctx.set(pe.psum_in, cases[i][1])
            await ctx.tick()
            if t < len(cases):
                assert ctx.get(pe.a_out) == cases[t][0] and ctx.get(pe.sel_out) == t % 2
            if i >= 0:
                a, ps = cases[i]
                want = (ps + a * w[i % 2] + 2**31) % 2**32 - 2**31
                assert ctx.get(pe.psum_out) == want, f"seed {seed}: case {i}"

    sim = Simulator(pe)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_checker_catches_wrong_results(seed):
    # The reference and the checker must be able to fail: a flipped bit in one
    # accumulator row, or a missing done pulse, is reported.
    config = CONFIGS["small"]
    rng = random.Random(seed)
    sp = random_scratchpad(config, rng)
    prog = random_program(config, rng, 12)
    trace, acc = simulate(config, prog, sp, rng, "random", f"seed {seed}")
    expected = reference(config, sp, prog)
    check_acc(config, expected, acc, f"seed {seed}")
    g = prog[1]  # the first gemm
    bad = dict(acc)
    bad[g.acc][0] ^= 1
    with pytest.raises(AssertionError, match="accumulator row"):
        check_acc(config, expected, bad, "mutated")
    done = next(t for t, s in enumerate(trace) if s.gemm_done)
    trace[done].gemm_done = 0
    with pytest.raises(AssertionError):
        check_trace(config, prog, trace, "mutated")


# ---- Verilator + cocotb -----------------------------------------------------------------


def build_verilog(config: NPUConfig = CONFIGS["default"]) -> tuple[Path, Path]:
    """Write the default-config harness Verilog; return (build dir, source)."""
    build = sim_build_dir(TOPLEVEL)
    return build, to_verilog(ArrayHarness(config), TOPLEVEL, build / f"{TOPLEVEL}.v")


@pytest.mark.rtl
def test_random_sequence_verilator(seed, regress):
    # Random bursty/random grants, the default config, checked inside the simulation.
    build, src = build_verilog()
    run_cocotb(TOPLEVEL, [src], COCOTB_MODULE, build, testcase="random_sequence",
               extra_env={"ARRAY_SEED": str(seed), "ARRAY_LENGTH": "300" if regress else "60"})


@pytest.mark.parametrize("k", [1, 2])
def test_swap_gemm_right_after_short_wload(k, seed):
    # A swap gemm queued behind a one- or two-row wload whose reads wait for grants:
    # the gemm streams as soon as it may, and its first activation meets the freshly
    # written weight rows (their writes are registered).
    config = CONFIGS["small"]
    rng = random.Random(seed)
    sp = random_scratchpad(config, rng)
    C = config.cols
    prog = []
    for t in range(12):
        prog.append(Command(ArrayOp.WLOAD, 16 * (t % 4), k, C))
        prog.append(Command(ArrayOp.GEMM, 256 + 40 * (t % 5), k, C, k, 1 + t % 3, 8 * (t % 6),
                            t % 2, 1))
    for grant in ("always", "random", "bursty"):
        what = f"seed {seed}, grant={grant}"
        trace, acc = simulate(config, prog, sp, rng, grant, what, gaps=False)
        check_trace(config, prog, trace, what)
        check_acc(config, reference(config, sp, prog), acc, what)
