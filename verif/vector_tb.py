"""Vector-unit test bench shared by Amaranth's simulator and Verilator/cocotb.

``tests/test_vector.py`` imports the harness, the stimulus, the scratchpad model,
the golden-model reference and the simulator-independent driver from here, and
``bench/bench_vector.py`` the harness; under Verilator this module is also the
cocotb test module (run by ``test_vector.py::test_random_sequence_verilator``).

The design under test is :class:`VectorHarness`: the
:class:`hdl.vector.VectorUnit` joined to the real :class:`hdl.accumulator.Accumulator`,
whose GEMM-side port (``acc_sel`` = 0) is the bench's backdoor to the accumulator.
Commands are generated in their resolved form (absolute addresses, as the
sequencer sends them) and translated into a program for the golden model with a
single partition covering the whole scratchpad, so every check is against
``firmware.golden``.
"""

from __future__ import annotations

import os
import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from firmware.config import CONFIGS, NPUConfig
from firmware.golden import Machine
from firmware.isa import (
    CFG_RANGE,
    CFG_RESET,
    QTAB_ENTRY_BYTES,
    QTAB_SHIFT_BITS,
    CfgField,
    make,
)
from hdl.accumulator import Accumulator
from hdl.ports import (
    SP_READ_LATENCY,
    VectorOp,
    acc_port_signature,
    command_stream,
    sp_window_signature,
    vector_command_layout,
)
from hdl.vector import VectorUnit

PORTS = ("rd_a", "rd_b", "wr")
ARGMAX_REGS = tuple(range(5, 16))  # r5..r15 receive argmax results in the golden program
ACC_WINDOW = 48  # tests use accumulator rows below this (cheap backdoor read-back)


# ---- commands ---------------------------------------------------------------------------


class VectorHarness(wiring.Component):
    """The vector unit on the real accumulator, with the accumulator's GEMM-side port
    (``acc_bd``, selected by ``acc_sel`` = 0) as the bench's backdoor."""

    def __init__(self, config: NPUConfig):
        self.config = config
        window = sp_window_signature(config)
        super().__init__({
            "cmd": In(command_stream(vector_command_layout(config))),
            "run_start": In(1),
            "rd_a": Out(window), "rd_b": Out(window), "wr": Out(window),
            "result": Out(32), "result_valid": Out(1), "done": Out(1),
            "idle": Out(1), "busy": Out(1), "stall": Out(1), "gemm_stride": Out(20),
            "acc_sel": In(1),
            "acc_bd": In(acc_port_signature(config)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = VectorUnit(self.config)
        m.submodules.accbuf = accbuf = Accumulator(self.config)
        connect(m, flipped(self.cmd), unit.cmd)
        for port in ("rd_a", "rd_b", "wr"):
            connect(m, getattr(unit, port), flipped(getattr(self, port)))
        connect(m, unit.acc, accbuf.vector)
        connect(m, flipped(self.acc_bd), accbuf.array)
        m.d.comb += [
            unit.run_start.eq(self.run_start), accbuf.sel.eq(self.acc_sel),
            self.result.eq(unit.result), self.result_valid.eq(unit.result_valid),
            self.done.eq(unit.done), self.idle.eq(unit.idle), self.busy.eq(unit.busy),
            self.stall.eq(unit.stall), self.gemm_stride.eq(unit.gemm_stride),
        ]
        return m


def command(op: VectorOp, **fields) -> dict:
    """A resolved vector command; unused fields get junk the unit must ignore."""
    junk = random.Random(hash((int(op), tuple(sorted(fields.items())))))
    cmd = {"op": op, "field": junk.randrange(16), "value": junk.randrange(1 << 32),
           "d": junk.randrange(1 << 10), "a": junk.randrange(1 << 10),
           "b": junk.randrange(1 << 10), "acc": junk.randrange(4), "m": junk.randrange(1, 9),
           "n": junk.randrange(1, 9), "tab": junk.randrange(2),
           "col": junk.randrange(2)}
    cmd.update(fields)
    return cmd


def cfg_cmd(f: CfgField, value: int) -> dict:
    _, lo, hi = CFG_RANGE[f]
    assert lo <= value <= hi, (f, value)
    return command(VectorOp.CFG, field=int(f), value=value)


def pack_command(config: NPUConfig, cmd: dict) -> int:
    """The command as the integer value of the ``cmd.payload`` port."""
    layout = vector_command_layout(config)
    value = {k: v for k, v in cmd.items() if k != "value"}
    value["value"] = cmd["value"] & 0xFFFF_FFFF
    value["op"] = VectorOp(cmd["op"])
    return layout.const(value).as_value().value


# ---- golden reference -------------------------------------------------------------------


@dataclass
class Expected:
    sp: np.ndarray
    acc: np.ndarray
    argmax: list = field(default_factory=list)


def golden(config: NPUConfig, sp_init: np.ndarray, cmds: list[dict]) -> Expected:
    """Run ``cmds`` as one program on the golden model (partition p0 = whole scratchpad).

    Registers r1..r4 carry the addresses (``li`` before each instruction); the
    argmax results go to r5..r15, one register each.
    """
    prog, regs = [], []

    def li(r, v):
        prog.append(make("li", rd=r, imm=v))

    for c in cmds:
        op, mm, n = VectorOp(c["op"]), c["m"], c["n"]
        if op == VectorOp.CFG:
            prog.append(make("cfg", field=CfgField(c["field"]), value=c["value"]))
        elif op in (VectorOp.BIAS, VectorOp.REQ):
            li(1, c["a"] if op == VectorOp.BIAS else c["d"])
            li(4, c["acc"])
            if op == VectorOp.BIAS:
                prog.append(make("vbias", p=0, sp=1, acc=4, m=mm, n=n))
            else:
                prog.append(make("vreq", p=0, sp=1, acc=4, m=mm, n=n, tab=c["tab"]))
        elif op == VectorOp.REQB:
            li(1, c["d"]), li(2, c["b"]), li(4, c["acc"])
            prog.append(make("vreqb", p=0, sp=1, acc=4, m=mm, n=n, pb=0, b=2, tab=c["tab"],
                             col=c["col"]))
        elif op == VectorOp.QTAB:
            li(1, c["a"])
            prog.append(make("vqtab", p=0, sp=1, n=n))
        elif op == VectorOp.ADD:
            li(1, c["a"]), li(2, c["b"]), li(3, c["d"])
            prog.append(make("vadd", pd=0, d=3, pa=0, a=1, pb=0, b=2, m=mm, n=n))
        elif op in (VectorOp.CLIP, VectorOp.MAX):
            li(1, c["a"]), li(3, c["d"])
            prog.append(make("vclip" if op == VectorOp.CLIP else "vmax",
                             pd=0, d=3, ps=0, s=1, m=mm, n=n))
        elif op == VectorOp.ARGMAX:
            rd = ARGMAX_REGS[len(regs)]
            regs.append(rd)
            li(1, c["a"])
            prog.append(make("vargmax", rd=rd, p=0, s=1, n=n))
    prog.append(make("end"))
    machine = Machine(config, dram_bytes=64)
    machine.sp[:] = sp_init
    machine.load_and_run([i.encode() for i in prog], [(0, config.sp_bytes)]).check()
    return Expected(machine.sp.copy(), machine.acc.copy(), [machine.regs[r] for r in regs])


# ---- stimulus ---------------------------------------------------------------------------


class Stimulus:
    """Random command sequences with edge-biased configuration values.

    Every command keeps its operands inside the scratchpad and the accumulator
    rows below :data:`ACC_WINDOW`; destinations never partially overlap their
    sources (exact in-place operation is generated on purpose).
    """

    def __init__(self, config: NPUConfig, seed: int):
        self.config = config
        self.rng = random.Random(seed)
        self.sp = np.random.default_rng(seed).integers(0, 256, config.sp_bytes, dtype=np.uint8)
        self.cmds: list[dict] = []
        self.cfg = dict(CFG_RESET)
        self.argmax_count = 0
        self.tables = 0  # QTAB commands so far (REQ uses the table only after one)

    # -- helpers
    def set_cfg(self, f: CfgField, value: int):
        self.cmds.append(cfg_cmd(f, value))
        self.cfg[f] = value

    def plant(self, addr: int, values, dtype):
        raw = np.asarray(values, dtype=dtype).view(np.uint8)
        self.sp[addr: addr + raw.size] = raw

    def region(self, span: int, avoid=()) -> int:
        """A random base for ``span`` bytes not overlapping the ``(base, span)`` in ``avoid``."""
        for _ in range(1000):
            base = self.rng.randrange(self.config.sp_bytes - span + 1)
            if all(base + span <= b or b + s <= base for b, s in avoid):
                return base
        raise AssertionError("scratchpad too small for the generated operands")

    def int8(self, lo=-128, hi=127):
        return self.rng.randint(lo, hi)

    def int32(self):
        r = self.rng
        return r.choice([r.randint(-(1 << 31), (1 << 31) - 1), r.randint(-300, 300),
                         -(1 << 31), (1 << 31) - 1, 0, 1, -1])

    def shape(self, max_m=5, max_n=40):
        r = self.rng
        n = r.choice([r.randint(1, max_n), r.randint(1, 3 * self.config.bus_bytes),
                      self.config.bus_bytes])
        return r.randint(1, max_m), n

    def strides(self, n):
        """Random IN_STRIDE/OUT_STRIDE (0 = dense); out stride never below n."""
        r = self.rng
        ins = r.choice([0, 0, n, n + r.randint(1, 19), r.randint(1, 2 * n + 8)])
        outs = r.choice([0, 0, n, n + r.randint(1, 19)])
        return ins, outs

    def clip_range(self):
        r = self.rng
        lo, hi = sorted((self.int8(), self.int8()))
        return r.choice([(-128, 127), (lo, hi), (0, 127), (hi, lo), (-128, -128), (127, 127)])

    def quant(self):
        """QMUL, QSHIFT, QZP chosen to hit ties, saturation, shift 0 and 63."""
        r = self.rng
        kind = r.randrange(5)
        if kind == 0:  # ties: x * 1 >> small shift
            return r.choice([1, -1, 3]), r.randint(0, 3), self.int8()
        if kind == 1:  # extremes of the shift and of the multiplier
            return r.choice([-(1 << 31), (1 << 31) - 1, 1 << 30]), r.choice([0, 1, 62, 63]), \
                self.int8()
        if kind == 2:  # realistic: a scale near 2**-k
            s = r.randint(20, 40)
            return r.randint(1 << 29, (1 << 31) - 1), s, self.int8(-20, 20)
        return self.int32(), r.randint(0, 63), self.int8()

    def maybe_cfg(self, fields_values: dict):
        """Write each field that changes (and sometimes one that does not)."""
        for f, v in fields_values.items():
            if self.cfg[f] != v or self.rng.random() < 0.2:
                self.set_cfg(f, v)

    # -- operations
    def bias(self, edge=False):
        r, c = self.rng, self.config
        n = r.randint(1, c.cols)
        m = r.randint(1, 6)
        acc = r.randrange(ACC_WINDOW - m + 1)
        a = self.region(4 * n)
        if edge or r.random() < 0.3:
            self.plant(a, [self.int32() for _ in range(n)], "<i4")
        self.cmds.append(command(VectorOp.BIAS, a=a, acc=acc, m=m, n=n))

    def req(self):
        r, c = self.rng, self.config
        qmul, qshift, qzp = self.quant()
        lo, hi = self.clip_range()
        m, _ = self.shape(max_m=6)
        n = r.randint(1, c.cols)
        outs = r.choice([0, 0, n, n + r.randint(1, 19)])
        self.maybe_cfg({CfgField.QMUL: qmul, CfgField.QSHIFT: qshift, CfgField.QZP: qzp,
                        CfgField.CLIP_LO: lo, CfgField.CLIP_HI: hi,
                        CfgField.OUT_STRIDE: outs})
        acc = r.randrange(ACC_WINDOW - m + 1)
        d = self.region((m - 1) * (outs or n) + n)
        tab = int(self.tables and r.random() < 0.5)
        self.cmds.append(command(VectorOp.REQ, d=d, acc=acc, m=m, n=n, tab=tab))

    def reqb(self):
        """REQ with a bias word per row (edge values planted), beside the rows' writes,
        or (half the time) one per column, read before the rows."""
        r, c = self.rng, self.config
        qmul, qshift, qzp = self.quant()
        lo, hi = self.clip_range()
        m = r.choice([r.randint(1, 6), r.randint(1, 3 * c.bus_bytes)])
        n = r.choice([1, r.randint(1, c.cols)])
        outs = r.choice([0, 0, n, n + r.randint(1, 19)])
        self.maybe_cfg({CfgField.QMUL: qmul, CfgField.QSHIFT: qshift, CfgField.QZP: qzp,
                        CfgField.CLIP_LO: lo, CfgField.CLIP_HI: hi,
                        CfgField.OUT_STRIDE: outs})
        acc = r.randrange(ACC_WINDOW - m + 1)
        col = int(r.random() < 0.5)
        words = n if col else m
        b = self.region(4 * words)
        if r.random() < 0.5:
            self.plant(b, [self.int32() for _ in range(words)], "<i4")
        span = (m - 1) * (outs or n) + n
        d = self.region(span, avoid=[(b, 4 * words)])
        tab = int(self.tables and r.random() < 0.5)
        self.cmds.append(command(VectorOp.REQB, d=d, b=b, acc=acc, m=m, n=n, tab=tab,
                                 col=col))

    def qtab(self):
        """A per-column requantization table: multipliers and shifts as :meth:`quant`
        picks them, shift bytes with junk in their ignored bits and padding bytes."""
        r, c = self.rng, self.config
        n = r.choice([c.cols, r.randint(1, c.cols)])
        a = self.region(QTAB_ENTRY_BYTES * n)
        for j in range(n):
            mul, shift, _ = self.quant()
            self.plant(a + QTAB_ENTRY_BYTES * j, [mul], "<i4")
            junk = [r.randrange(256) for _ in range(QTAB_ENTRY_BYTES - 4)]
            junk[0] = shift | (r.randrange(4) << QTAB_SHIFT_BITS)
            self.plant(a + QTAB_ENTRY_BYTES * j + 4, junk, np.uint8)
        self.cmds.append(command(VectorOp.QTAB, a=a, n=n))
        self.tables += 1

    def add(self):
        r = self.rng
        m, n = self.shape()
        ins, outs = self.strides(n)
        kind = r.randrange(4)
        if kind == 0:  # ties: (a + b) >> 1
            ma, mb, s = 1, 1, r.randint(0, 2)
        elif kind == 1:  # realistic scales
            s = r.randint(18, 30)
            ma, mb = (r.randint(1 << (s - 2), 1 << (s + 1)) * r.choice([1, -1])
                      for _ in range(2))
        elif kind == 2:  # extremes
            ma, mb = r.choice([-(1 << 31), (1 << 31) - 1]), r.choice([-(1 << 31), (1 << 31) - 1])
            s = r.choice([0, 31, 39, 40, 63])
        else:
            ma, mb, s = self.int32(), self.int32(), r.randint(0, 63)
        lo, hi = self.clip_range()
        self.maybe_cfg({CfgField.ADD_MUL_A: ma, CfgField.ADD_MUL_B: mb, CfgField.QSHIFT: s,
                        CfgField.ADD_ZP_A: self.int8(), CfgField.ADD_ZP_B: self.int8(),
                        CfgField.QZP: self.int8(), CfgField.CLIP_LO: lo, CfgField.CLIP_HI: hi,
                        CfgField.IN_STRIDE: ins, CfgField.OUT_STRIDE: outs})
        span_in = (m - 1) * (ins or n) + n
        span_out = (m - 1) * (outs or n) + n
        a = self.region(span_in)
        b = self.region(span_in)
        inplace = (ins or n) >= n and (ins or n) == (outs or n) and r.random() < 0.3
        if inplace:
            d = r.choice([a, b])
            if d == a and a != b:  # b must not partially overlap the destination
                b = self.region(span_in, avoid=[(a, span_in)])
            elif d == b and a != b:
                a = self.region(span_in, avoid=[(b, span_in)])
        else:
            d = self.region(span_out, avoid=[(a, span_in), (b, span_in)])
        self.cmds.append(command(VectorOp.ADD, d=d, a=a, b=b, m=m, n=n))

    def clip(self):
        r = self.rng
        m, n = self.shape()
        ins, outs = self.strides(n)
        lo, hi = self.clip_range()
        self.maybe_cfg({CfgField.CLIP_LO: lo, CfgField.CLIP_HI: hi,
                        CfgField.IN_STRIDE: ins, CfgField.OUT_STRIDE: outs})
        span_in = (m - 1) * (ins or n) + n
        a = self.region(span_in)
        if (ins or n) >= n and (ins or n) == (outs or n) and r.random() < 0.3:
            d = a
        else:
            d = self.region((m - 1) * (outs or n) + n, avoid=[(a, span_in)])
        self.cmds.append(command(VectorOp.CLIP, d=d, a=a, m=m, n=n))

    def vmax(self):
        r = self.rng
        m, n = self.shape(max_m=4, max_n=24)
        count = r.choice([1, 2, 3, r.randint(1, 6)])
        pstride = r.choice([0, n, r.randint(1, 40)])
        pistride = r.choice([0, count * (pstride or 1), r.randint(1, 60)])
        outs = r.choice([0, n, n + r.randint(1, 9)])
        self.maybe_cfg({CfgField.POOL_COUNT: count, CfgField.POOL_STRIDE: pstride,
                        CfgField.POOL_ISTRIDE: pistride, CfgField.OUT_STRIDE: outs})
        span_in = (m - 1) * pistride + (count - 1) * pstride + n
        a = self.region(span_in)
        d = self.region((m - 1) * (outs or n) + n, avoid=[(a, span_in)])
        self.cmds.append(command(VectorOp.MAX, d=d, a=a, m=m, n=n))

    def argmax(self, n=None):
        r = self.rng
        n = n or r.choice([r.randint(1, 64), r.randint(1, 3 * self.config.bus_bytes)])
        a = self.region(n)
        pool = r.choice([[-128, 127], [-128, -127, 5], list(range(-3, 3)), [-128]])
        self.plant(a, [r.choice(pool) for _ in range(n)], np.int8)
        self.cmds.append(command(VectorOp.ARGMAX, a=a, n=n))
        self.argmax_count += 1

    def op(self, op: VectorOp):
        {VectorOp.BIAS: self.bias, VectorOp.REQ: self.req, VectorOp.ADD: self.add,
         VectorOp.CLIP: self.clip, VectorOp.MAX: self.vmax, VectorOp.ARGMAX: self.argmax,
         VectorOp.QTAB: self.qtab, VectorOp.REQB: self.reqb}[op]()


def op_sequence(config: NPUConfig, seed: int, op: VectorOp, count: int) -> Stimulus:
    """``count`` commands of ``op`` (after accumulator set-up for REQ) with their cfg writes."""
    st = Stimulus(config, seed)
    if op in (VectorOp.REQ, VectorOp.REQB):
        for _ in range(6):
            st.bias(edge=True)
        st.qtab()
    if op == VectorOp.ARGMAX:
        count = min(count, len(ARGMAX_REGS))
    for _ in range(count):
        st.op(op)
    return st


def mixed_sequence(config: NPUConfig, seed: int, count: int) -> Stimulus:
    """A random mix of every operation (biases first, so REQ sees data)."""
    st = Stimulus(config, seed)
    for _ in range(3):
        st.bias()
    ops = [VectorOp.BIAS, VectorOp.REQ, VectorOp.ADD, VectorOp.CLIP, VectorOp.MAX,
           VectorOp.ARGMAX, VectorOp.QTAB, VectorOp.REQB]
    for _ in range(count):
        op = st.rng.choice(ops)
        if op == VectorOp.ARGMAX and st.argmax_count == len(ARGMAX_REGS):
            op = VectorOp.CLIP
        st.op(op)
    return st


# ---- simulator-independent driver --------------------------------------------------------


class ScratchpadModel:
    """Byte-addressed scratchpad behind three window ports that refuse at random.

    Besides single refusals (probability ``1 - grant``), a port is sometimes
    blocked for a burst of up to 16 cycles, so that the other ports run ahead.
    Like the banked scratchpad, two reads that need a common bank in the same
    cycle are not both granted (the port first in ``read_order`` wins).

    Checks the window protocol: a refused request must stay presented unchanged,
    read ports never write, the write port never reads. Read data is taken before
    the same cycle's writes land and is returned ``SP_READ_LATENCY`` cycles later.
    """

    def __init__(self, config: NPUConfig, init: np.ndarray, rng: random.Random,
                 grant: float = 0.7):
        self.config = config
        self.mem = init.copy()
        self.rng = rng
        self.grant = grant
        self.refused: dict[str, tuple] = {}
        self.read_order = rng.choice([("rd_a", "rd_b"), ("rd_b", "rd_a")])
        self.blocked = dict.fromkeys(PORTS, 0)
        self.reads = self.writes = self.refusals = 0
        self.presented: set[str] = set()

    def grants(self, port: str) -> bool:
        """Decide this cycle's grant of a presented request (bank conflicts aside).

        A port's first request is always refused once, so that every run checks the
        refused-request protocol (a short run could otherwise see no refusal at all).
        """
        if port not in self.presented:
            self.presented.add(port)
            return False
        if self.blocked[port]:
            self.blocked[port] -= 1
            return False
        if self.rng.random() < (1 - self.grant) / 8:
            self.blocked[port] = self.rng.randint(1, 16)
            return False
        return self.rng.random() < self.grant

    def banks(self, addr: int) -> set:
        """Banks of the words a window read at ``addr`` touches."""
        c = self.config
        word = addr // c.bus_bytes
        last = word + (addr % c.bus_bytes != 0)
        return {w % (c.sp_bytes // c.bus_bytes) % c.sp_banks for w in (word, last)}

    def window(self, addr: int) -> int:
        idx = (addr + np.arange(self.config.bus_bytes)) % self.config.sp_bytes
        return int.from_bytes(self.mem[idx].tobytes(), "little")

    def write(self, addr: int, wdata: int, wstrb: int):
        raw = wdata.to_bytes(self.config.bus_bytes, "little")
        for i in range(self.config.bus_bytes):
            if wstrb >> i & 1:
                self.mem[(addr + i) % self.config.sp_bytes] = raw[i]


async def run_commands(io, config: NPUConfig, stim: Stimulus, seed: int, *,
                       grant: float = 0.7, gap: float = 0.2, check_comb: bool = True,
                       max_cycles: int | None = None) -> tuple[ScratchpadModel, list, dict]:
    """Drive ``stim.cmds`` through the harness behind ``io`` and serve its scratchpad.

    ``io`` offers ``get(name)``, ``set(name, value)`` and ``tick()`` (an awaitable
    that returns after the next rising clock edge, outputs settled). ``check_comb``
    also checks outputs that depend combinationally on this cycle's inputs
    (``stall``), which needs a simulator that settles after ``set``.

    Returns the scratchpad model, the argmax results in order and statistics.
    """
    rng = random.Random(seed)
    sp = ScratchpadModel(config, stim.sp, rng, grant)
    cmds = list(stim.cmds)
    n_cmds = len(cmds)
    payloads = [pack_command(config, c) for c in cmds]
    accepted = dones = 0
    results = []
    responses: dict[str, int] = {}
    due = deque([{}] * (SP_READ_LATENCY - 1))  # read data on its way
    stats = {"cycles": 0, "busy": 0, "stall": 0}
    budget = max_cycles or 400 + 60 * n_cmds + 40 * sum(
        c["m"] * -(-c["n"] // config.bus_bytes) * 4 for c in cmds if c["op"] != VectorOp.CFG)
    io.set("acc_sel", 1)
    io.set("run_start", 1)
    await io.tick()
    io.set("run_start", 0)
    while dones < n_cmds:
        stats["cycles"] += 1
        assert stats["cycles"] < budget, \
            f"timeout: {dones}/{n_cmds} commands done after {budget} cycles (seed {seed})"
        for port in ("rd_a", "rd_b"):
            io.set(f"{port}.rvalid", int(port in responses))
            io.set(f"{port}.rdata", responses.get(port, rng.getrandbits(8 * config.bus_bytes)))
        requests = {}
        refused_any = False
        taken = set()
        for port in (*sp.read_order, "wr"):
            if io.get(f"{port}.valid"):
                req = (io.get(f"{port}.addr"), io.get(f"{port}.we"))
                if port == "wr":
                    req += (io.get("wr.wdata"), io.get("wr.wstrb"))
                assert req[1] == (port == "wr"), f"{port}: we={req[1]}"
                if port in sp.refused:
                    assert req == sp.refused.pop(port), f"{port}: refused request changed"
                ok = sp.grants(port)
                if port != "wr":
                    ok = ok and not sp.banks(req[0]) & taken
                    taken |= sp.banks(req[0]) if ok else set()
                io.set(f"{port}.ready", int(ok))
                if ok:
                    requests[port] = req
                else:
                    sp.refused[port] = req
                    refused_any = True
                    sp.refusals += 1
            else:
                assert port not in sp.refused, f"{port}: refused request withdrawn"
                io.set(f"{port}.ready", int(rng.random() < 0.5))
        offer = accepted < n_cmds and rng.random() >= gap
        io.set("cmd.valid", int(offer))
        if offer:
            io.set("cmd.payload", payloads[accepted])
        busy = io.get("busy")
        assert io.get("idle") == 1 - busy
        assert io.get("cmd.ready") == 1 - busy
        take = offer and not busy
        stats["busy"] += busy
        if check_comb:
            assert io.get("stall") == int(busy and refused_any), "stall"
        stats["stall"] += busy and refused_any
        done = io.get("done")
        if io.get("result_valid"):
            assert done, "result_valid without done"
            results.append(io.get("result"))
        dones += done
        assert dones <= accepted, "done before the command was accepted"
        if done and cmds[dones - 1]["op"] == VectorOp.ARGMAX:
            assert len(results) == sum(c["op"] == VectorOp.ARGMAX for c in cmds[:dones]), \
                "ARGMAX done without result_valid"
        await io.tick()
        due.append({p: sp.window(req[0]) for p, req in requests.items() if p != "wr"})
        sp.reads += len(due[-1])
        responses = due.popleft()
        if "wr" in requests:
            sp.write(requests["wr"][0], requests["wr"][2], requests["wr"][3])
            sp.writes += 1
        accepted += take
    io.set("cmd.valid", 0)
    for port in PORTS:
        io.set(f"{port}.ready", 0)
    # After the last done no request may be left presented.
    await io.tick()
    for port in PORTS:
        assert not io.get(f"{port}.valid"), f"{port} still requesting after the last done"
    return sp, results, stats


async def read_acc(io, config: NPUConfig, rows: int) -> np.ndarray:
    """Read accumulator rows ``0..rows-1`` through the backdoor port."""
    io.set("acc_sel", 0)
    out = np.zeros((rows, config.cols), dtype=np.int32)
    for r in range(rows):
        io.set("acc_bd.ren", 1)
        io.set("acc_bd.raddr", r)
        await io.tick()  # the synchronous read happened on this edge
        word = io.get("acc_bd.rdata")
        out[r] = np.array([(word >> (32 * j)) & 0xFFFF_FFFF for j in range(config.cols)],
                          dtype=np.uint32).view(np.int32)
    io.set("acc_bd.ren", 0)
    return out


def check(config: NPUConfig, stim: Stimulus, sp: ScratchpadModel, results: list,
          acc: np.ndarray, seed: int):
    """Compare the run with the golden model; the message names the seed."""
    exp = golden(config, stim.sp, stim.cmds)
    where = f"(seed {seed}, config {config})"
    bad = np.flatnonzero(sp.mem != exp.sp)
    assert bad.size == 0, (
        f"scratchpad differs at {bad.size} bytes, first {bad[:8].tolist()}: "
        f"got {sp.mem[bad[:8]].tolist()} expected {exp.sp[bad[:8]].tolist()} {where}")
    rows = acc.shape[0]
    assert np.array_equal(acc, exp.acc[:rows]), (
        f"accumulator differs in rows "
        f"{np.flatnonzero((acc != exp.acc[:rows]).any(axis=1)).tolist()} {where}")
    assert not exp.acc[rows:].any(), "stimulus touched accumulator rows beyond the window"
    assert results == exp.argmax, f"argmax results {results} expected {exp.argmax} {where}"


# ---- cocotb -------------------------------------------------------------------------------

try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import FallingEdge
except ImportError:  # pragma: no cover - cocotb is a project dependency
    cocotb = None


class CocotbIo:
    """``io`` for :func:`run_commands` on a cocotb handle (drive and sample at the falling edge)."""

    def __init__(self, dut):
        self.dut = dut
        self.handles = {}

    def _h(self, name):
        h = self.handles.get(name)
        if h is None:
            h = self.handles[name] = getattr(self.dut, name.replace(".", "__"))
        return h

    def get(self, name):
        return int(self._h(name).value)

    def set(self, name, value):
        self._h(name).value = int(value)

    def tick(self):
        return FallingEdge(self.dut.clk)


if cocotb is not None:

    @cocotb.test()
    async def random_command_sequence(dut):
        """A random mix of every vector command against the golden model."""
        config = CONFIGS[os.environ.get("VECTOR_CONFIG", "default")]
        seed = int(os.environ.get("VECTOR_SEED", "1"))
        count = int(os.environ.get("VECTOR_COUNT", "24"))
        stim = mixed_sequence(config, seed, count)
        io = CocotbIo(dut)
        for name in ("cmd.valid", "run_start", "acc_bd.ren", "acc_bd.wen", "rd_a.ready",
                     "rd_b.ready", "wr.ready", "rd_a.rvalid", "rd_b.rvalid"):
            io.set(name, 0)
        io.set("acc_sel", 1)
        dut.rst.value = 1
        Clock(dut.clk, 10, unit="ns").start()
        await io.tick()
        await io.tick()
        dut.rst.value = 0
        sp, results, stats = await run_commands(io, config, stim, seed, check_comb=False)
        acc = await read_acc(io, config, ACC_WINDOW)
        check(config, stim, sp, results, acc, seed)
        dut._log.info("%d commands in %d cycles (%d busy, %d stalled), seed %d",
                      len(stim.cmds), stats["cycles"], stats["busy"], stats["stall"], seed)
