"""Vector-unit throughput, measured in RTL simulation (Amaranth's simulator).

Each operation runs once as a long command on ``CONFIGS["default"]`` behind a
scratchpad that grants every request, and once more with a scratchpad that
grants half of them at random (ADD/CLIP/MAX), and an ADD whose two sources
compete for the same banks (reads of a window need the banks of the words it
touches; ``rd_a`` wins). Elements are output elements, but
input elements (``m * pool_count * n``) for MAX. A command's cycles count from its acceptance to
its ``done`` pulse, so they include the pipeline fill and drain (``overhead``:
the cycles of a one-element command).

Run ``python -m bench.bench_vector`` (or ``make bench-datapath`` with the rest).
"""

from __future__ import annotations

import random

import numpy as np
from amaranth.sim import Simulator

from firmware.config import CONFIGS, NPUConfig
from firmware.isa import CfgField
from hdl.ports import VectorOp, vector_command_layout
from verif.vector_tb import VectorHarness

__all__ = ["run", "measure"]


def _workload(config: NPUConfig) -> list[tuple[str, list[dict], int]]:
    """(name, commands, elements of the measured last command)."""
    W, cols = config.bus_bytes, config.cols
    n = 64 * W

    def cmd(op, **f):
        return {"op": op, "field": 0, "value": 0, "d": 0, "a": 0, "b": 0, "acc": 0,
                "m": 1, "n": 1, **f}

    def cfg(field, value):
        return cmd(VectorOp.CFG, field=int(field), value=value)

    half = config.sp_bytes // 2
    return [
        ("bias", [cmd(VectorOp.BIAS, a=0, acc=0, m=256, n=cols)], 256 * cols),
        ("req", [cmd(VectorOp.REQ, d=0, acc=0, m=256, n=cols)], 256 * cols),
        ("add", [cmd(VectorOp.ADD, a=0, b=n * 4, d=half, m=4, n=n)], 4 * n),
        ("clip", [cmd(VectorOp.CLIP, a=0, d=half, m=4, n=n)], 4 * n),
        ("max", [cfg(CfgField.POOL_COUNT, 2), cfg(CfgField.POOL_STRIDE, n),
                 cfg(CfgField.POOL_ISTRIDE, 2 * n),
                 cmd(VectorOp.MAX, a=0, d=half, m=2, n=n)], 2 * 2 * n),
        ("argmax", [cmd(VectorOp.ARGMAX, a=0, n=4096)], 4096),
        ("overhead", [cmd(VectorOp.CLIP, a=0, d=half, m=1, n=1)], 1),
    ]


def measure(config: NPUConfig, cmds: list[dict], grant: float = 1.0, seed: int = 0,
            banked: bool = False) -> int:
    """Cycles from acceptance to ``done`` of the last of ``cmds``."""
    top = VectorHarness(config)
    layout = vector_command_layout(config)
    W = config.bus_bytes
    mem = np.random.default_rng(seed).integers(0, 256, config.sp_bytes + W, dtype=np.uint8)
    rng = random.Random(seed)
    out = {}

    def window(addr):
        return int.from_bytes(mem[addr: addr + W].tobytes(), "little")

    async def bench(ctx):
        ctx.set(top.acc_sel, 1)  # the vector unit owns the accumulator
        responses = {}
        issued = dones = cycle = 0
        start = None
        while dones < len(cmds):
            for port in ("rd_a", "rd_b"):
                p = getattr(top, port)
                ctx.set(p.rvalid, port in responses)
                ctx.set(p.rdata, responses.get(port, 0))
            granted = {}
            busy_banks = set()
            for port in ("rd_a", "rd_b", "wr"):
                p = getattr(top, port)
                ok = grant >= 1.0 or rng.random() < grant
                if banked and port != "wr" and ctx.get(p.valid):
                    # A read needs the banks of the words its window touches; rd_a wins.
                    addr = ctx.get(p.addr)
                    word = addr // W
                    need = {word % config.sp_banks, (word + (addr % W != 0)) % config.sp_banks}
                    ok = ok and not need & busy_banks
                    if ok:
                        busy_banks |= need
                ctx.set(p.ready, ok)
                if ok and ctx.get(p.valid):
                    granted[port] = ctx.get(p.addr)
                    if port == "wr":
                        wdata, wstrb = ctx.get(p.wdata), ctx.get(p.wstrb)
            ctx.set(top.cmd.valid, issued < len(cmds))
            if issued < len(cmds):
                c = cmds[issued]
                ctx.set(top.cmd.payload, layout.const({**c, "op": VectorOp(c["op"])}))
                if ctx.get(top.cmd.ready):
                    issued += 1
                    if issued == len(cmds):
                        start = cycle
            dones += ctx.get(top.done)
            await ctx.tick()
            cycle += 1
            responses = {p: window(a) for p, a in granted.items() if p != "wr"}
            if "wr" in granted:
                raw = wdata.to_bytes(W, "little")
                for i in range(W):
                    if wstrb >> i & 1:
                        mem[granted["wr"] + i] = raw[i]
        out["cycles"] = cycle - 1 - start  # the cycle of acceptance up to that of done

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out["cycles"]


def run(config_name: str = "default") -> dict:
    """Measure every operation; return plain figures (elements per cycle per op, ...)."""
    config = CONFIGS[config_name]
    figures = {"config": config_name, "bus_bytes": config.bus_bytes, "cols": config.cols}
    for name, cmds, elements in _workload(config):
        cycles = measure(config, cmds)
        if name == "overhead":
            figures["overhead_cycles"] = cycles
            continue
        figures[f"{name}_elements"] = elements
        figures[f"{name}_cycles"] = cycles
        figures[f"{name}_elements_per_cycle"] = round(elements / cycles, 3)
        if name in ("add", "clip", "max"):
            slow = measure(config, cmds, grant=0.5, seed=1)
            figures[f"{name}_elements_per_cycle_grant50"] = round(elements / slow, 3)
    # ADD with both sources in the same banks (a = b mod sp_banks words), unaligned:
    # every window of a needs a bank that b's window at the same index needs too.
    n, span = 64 * config.bus_bytes, config.sp_banks * config.bus_bytes
    cmd = {"op": VectorOp.ADD, "field": 0, "value": 0, "a": 3, "b": 4 * span + 3,
           "d": config.sp_bytes // 2, "acc": 0, "m": 1, "n": n}
    cycles = measure(config, [cmd], banked=True)
    figures["add_same_banks_elements_per_cycle"] = round(n / cycles, 3)
    figures["peak_acc_elements_per_cycle"] = config.cols
    figures["peak_sp_bytes_per_cycle"] = config.bus_bytes
    return figures


if __name__ == "__main__":
    from bench.common import report

    report("vector", run())
