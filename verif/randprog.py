"""Constrained-random NPU programs: legal, race-free, and seeded.

A program is a sequence of *groups* (load -> compute -> store pipelines linked by
dependency tokens, of several kinds: GEMM with K accumulation and epilogue,
element-wise add, clip, max-pool, argmax feeding a branch), scalar blocks, hardware
loops with an immediate or a register count (with a ``sync`` closing the body and one
after the loop, which runs even when the count is 0 or a branch leaves the loop early;
a loop left early may count up to 2**32 - 1), forward branches that skip code,
region marks and tagged loads whose tags hit on later iterations.

Race freedom is what makes a random program comparable with the golden model, which
executes in program order: every group writes fresh scratchpad regions (a bump
allocator; a ``sync`` recycles them when a partition fills up) and fresh DRAM output
areas, and everything a queue reads was produced before the token it pops.
:func:`find_races` checks it on the golden model, for any program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware import asm, isa
from firmware.config import NPUConfig
from firmware.golden import Machine
from firmware.isa import DW_LOAD_WINDOWS, QTAB_ENTRY_BYTES, Queue, Token
from firmware.quant import quantize_multiplier

IN_BASE, IN_BYTES = 0x0, 0x10000  # random input data
OUT_BASE = 0x40000  # outputs are bump-allocated from here


@dataclass
class RandomProgram:
    source: str
    program: asm.Program
    partitions: list
    dram: dict = field(default_factory=dict)
    args: tuple = ()


class _Gen:
    def __init__(self, config: NPUConfig, rng: np.random.Generator):
        self.c, self.rng = config, rng
        # Draws of their own for later additions, so that the programs of every seed
        # stay what they were where the additions do not apply.
        self.side = rng.spawn(1)[0]
        parts = min(4, config.partitions)
        size = config.sp_bytes // parts
        self.psize = size
        self.partitions = [(i * size, size) for i in range(parts)]
        self.bump = [0] * parts
        self.out = OUT_BASE
        self.lines: list[str] = []
        self.label = 0
        self.regions = 0
        self.loop_depth = 0

    def r(self, lo, hi):
        return int(self.rng.integers(lo, hi + 1))

    def emit(self, line):
        self.lines.append("    " + line)

    def new_label(self):
        self.label += 1
        return f"L{self.label}"

    def alloc(self, p, nbytes):
        """A fresh region in partition p (sync and recycle when it is full)."""
        if self.bump[p] + nbytes > self.psize:
            self.emit("sync")
            self.bump = [0] * len(self.bump)
        off = self.bump[p]
        self.bump[p] += nbytes
        return off

    def out_area(self, nbytes):
        addr = self.out
        self.out += (nbytes + 15) // 16 * 16
        return addr

    def src_addr(self, nbytes):
        return self.r(0, IN_BYTES - nbytes - 1)

    # ---- groups -----------------------------------------------------------------------
    def load(self, p, off, dram, rows, nbytes, stride=0, tag=0):
        self.emit(f"li r12, {off}")
        self.emit(f"li r14, {dram}")
        if stride:
            self.emit(f"li r15, {stride}")
        t = f", tag={tag}" if tag else ""
        self.emit(f"load p{p}, r12, r14, {'r15' if stride else 'r0'}, {rows}, {nbytes}{t}, "
                  "push=next")

    def store(self, p, off, rows, nbytes, times=1):
        addr = self.out_area(rows * nbytes * times)
        self.emit(f"li r12, {off}")
        self.emit(f"li r14, {addr}")
        self.emit(f"store p{p}, r12, r14, r0, {rows}, {nbytes}, pop=prev")

    def compute(self, instrs, pops, push=True):
        """Compute instructions; the first ``pops`` pop a load token, the last pushes."""
        while len(instrs) < pops:
            instrs.insert(0, f"cfg.qzp {self.r(-128, 127)}")
        for i, ins in enumerate(instrs):
            toks = []
            if i < pops:
                toks.append("pop=prev")
            if push and i == len(instrs) - 1:
                toks.append("push=next")
            self.emit(ins + (", " + ", ".join(toks) if toks else ""))

    def requant_cfg(self):
        mult, shift = quantize_multiplier(float(self.rng.uniform(1e-5, 0.5)))
        lo = self.r(-128, 0)
        return [f"cfg.qmul {mult}", f"cfg.qshift {shift}", f"cfg.qzp {self.r(-30, 30)}",
                f"cfg.clip_lo {lo}", f"cfg.clip_hi {self.r(lo, 127)}"]

    def gemm_group(self, tag=0):
        c = self.c
        m, k, n = self.r(1, 24), self.r(1, c.rows), self.r(1, c.cols)
        ktiles = self.r(1, 2)
        x_off = self.alloc(0, m * k * ktiles)
        w_off = self.alloc(1, k * n * ktiles)
        bp = 3 if len(self.partitions) > 3 else 1  # bias partition
        # Per-channel requantization: a table of random entries (any multiplier, the
        # shift byte's ignored bits set at random) for vreq ... tab=1, after the biases.
        per_channel = self.rng.random() < 0.4
        # A bias per row (vreqb, as GEMV results take it) instead of per column.
        per_row = self.rng.random() < 0.3
        nb = m if per_row else n
        b_off = self.alloc(bp, 4 * nb + QTAB_ENTRY_BYTES * per_channel * n)
        t_off = b_off + 4 * nb
        # A second column tile after the requantization, as compiled GEMMs have: its
        # gemm may run beside the vreq (two accumulator read ports) when its rows differ.
        second = self.side.random() < 0.4
        y_off = self.alloc(2, m * n * (1 + second))
        self.load(0, x_off, self.src_addr(m * k * ktiles), m, k * ktiles)
        self.load(1, w_off, self.src_addr(k * n * ktiles), 1, k * n * ktiles, tag=tag)
        self.load(bp, b_off, self.src_addr(4 * nb) & ~3, 1, 4 * nb)
        if per_channel:
            self.load(bp, t_off, self.src_addr(QTAB_ENTRY_BYTES * n), 1, QTAB_ENTRY_BYTES * n)
        acc = self.r(0, c.acc_rows - m)
        ins = [f"cfg.gemm_stride {k * ktiles}", *self.requant_cfg()]
        wregs = ("r13", "r15")
        for t in range(ktiles):
            self.emit(f"li {wregs[t]}, {w_off + t * k * n}")
            ins.append(f"wload p1, {wregs[t]}, {k}, {n}")
            mode = "overwrite" if t == 0 else "accumulate"
            ins.append(f"gemm.{mode} p0, r0, r5, {m}, swap=1, off={x_off + t * k}")
        tab = ", tab=1" if per_channel else ""
        if not per_row:
            ins.append(f"vbias p{bp}, r0, r5, {m}, {n}, off={b_off}")
        if per_channel:
            ins.append(f"vqtab p{bp}, r0, {n}, off={t_off}")
        if per_row:
            self.emit(f"li r8, {y_off}")
            self.emit(f"li r10, {b_off}")
            ins.append(f"vreqb p2, r8, r5, {m}, {n}, p{bp}, r10{tab}")
        else:
            ins.append(f"vreq p2, r0, r5, {m}, {n}, off={y_off}{tab}")
        self.emit(f"li r5, {acc}")
        if second:
            # the same rows at times (the gemm waits for the vreq), else others
            acc2 = acc if self.side.random() < 0.3 else \
                int(self.side.integers(0, c.acc_rows - m + 1))
            self.emit(f"li r7, {acc2}")
            ins += [f"wload p1, r13, {k}, {n}",
                    f"gemm.overwrite p0, r0, r7, {m}, swap=1, off={x_off}",
                    f"vreq p2, r0, r7, {m}, {n}, off={y_off + m * n}"]
        self.compute(ins, 4 if per_channel else 3)
        self.store(2, y_off, m * (1 + second), n)

    def depthwise_group(self):
        """dwload + dwconv (a second kernel accumulating, at times), then vreq."""
        c = self.c
        s, kh, kw, n = self.r(1, 2), self.r(1, 3), self.r(1, 3), self.r(1, c.cols)
        h, mo = self.r(1, (c.dw_rows - kh) // s + 1), self.r(1, 6)
        pix = n + self.r(0, 1) * self.r(1, 9)
        rows_in, cols_in = (h - 1) * s + kh, (mo - 1) * s + kw
        pt = self.r(0, min(2, rows_in - 1))
        pb = self.r(0, min(2, rows_in - 1 - pt))
        pl = self.r(0, min(2, cols_in - 1))
        pr = self.r(0, min(2, cols_in - 1 - pl))
        rows_in, cols_in = rows_in - pt - pb, cols_in - pl - pr  # read from the scratchpad
        row = pix * cols_in + self.r(0, 9)
        span = (rows_in - 1) * row + (cols_in - 1) * pix + n
        kernels = self.r(1, 2)
        x_off = self.alloc(0, span)
        taps = DW_LOAD_WINDOWS * c.cols  # and the pad value and biases
        w_off = self.alloc(1, taps * kernels)
        y_off = self.alloc(2, h * mo * n)
        self.load(0, x_off, self.src_addr(span), 1, span)
        self.load(1, w_off, self.src_addr(taps * kernels), 1, taps * kernels)
        acc = self.r(0, c.acc_rows - h * mo)
        ins = [f"cfg.gemm_stride {pix}", f"cfg.in_stride {row}", "cfg.out_stride 0",
               *self.requant_cfg()]
        for k in range(kernels):
            mode = "overwrite" if k == 0 else "accumulate"
            ins += [f"dwload p1, r0, off={w_off + k * taps}",
                    f"dwconv.{mode} p0, r9, r5, {mo}, {h}, {s}, {kh}, {kw}, {n}, pt={pt}, "
                    f"pb={pb}, pl={pl}, pr={pr}"]
        ins.append(f"vreq p2, r0, r5, {h * mo}, {n}, off={y_off}")
        self.emit(f"li r5, {acc}")
        self.emit(f"li r9, {x_off}")
        self.compute(ins, 2)
        self.store(2, y_off, h * mo, n)

    def eltwise_group(self, kind):
        m, n = self.r(1, 6), self.r(1, 40)
        a = self.alloc(0, m * n)
        b = self.alloc(0, m * n)
        d = self.alloc(2, m * n)
        self.load(0, a, self.src_addr(m * n), m, n)
        pops = 1
        if kind == "vadd":
            self.load(0, b, self.src_addr(m * n), m, n)
            pops = 2
        self.emit(f"li r9, {a}")
        self.emit(f"li r10, {b}")
        self.emit(f"li r11, {d}")
        ins = ["cfg.in_stride 0", "cfg.out_stride 0"]
        if kind == "vadd":
            ins += [f"cfg.add_mul_a {self.r(1, 1 << 22)}", f"cfg.add_mul_b {self.r(1, 1 << 22)}",
                    f"cfg.add_zp_a {self.r(-128, 127)}", f"cfg.add_zp_b {self.r(-128, 127)}",
                    f"cfg.qshift {self.r(10, 30)}", f"cfg.qzp {self.r(-20, 20)}",
                    "cfg.clip_lo -128", "cfg.clip_hi 127",
                    f"vadd p2, r11, p0, r9, p0, r10, {m}, {n}"]
        else:
            lo = self.r(-128, 127)
            ins += [f"cfg.clip_lo {lo}", f"cfg.clip_hi {self.r(lo, 127)}",
                    f"vclip p2, r11, p0, r9, {m}, {n}"]
        self.compute(ins, pops)
        self.store(2, d, m, n)

    def maxpool_group(self):
        count, rows_out, n = self.r(1, 4), self.r(1, 4), self.r(1, 16)
        tstride, istride = n * self.r(1, 2), 0
        istride = count * tstride
        span = (rows_out - 1) * istride + (count - 1) * tstride + n
        s = self.alloc(0, span)
        d = self.alloc(2, rows_out * n)
        self.load(0, s, self.src_addr(span), 1, span)
        self.emit(f"li r9, {s}")
        self.emit(f"li r11, {d}")
        ins = [f"cfg.pool_count {count}", f"cfg.pool_stride {tstride}",
               f"cfg.pool_istride {istride}", "cfg.out_stride 0",
               f"vmax p2, r11, p0, r9, {rows_out}, {n}"]
        self.compute(ins, 1)
        self.store(2, d, rows_out, n)

    def argmax_branch(self):
        n = self.r(1, 64)
        s = self.alloc(0, n)
        self.load(0, s, self.src_addr(n), 1, n)
        self.emit(f"li r9, {s}")
        self.compute([f"vargmax r6, p0, r9, {n}"], 1, push=False)
        skip = self.new_label()
        self.emit(f"li r7, {self.r(0, n - 1)}")
        self.emit(f"br.{self.rng.choice(['eq', 'ne', 'lt', 'geu'])} r6, r7, {skip}")
        self.scalar_block()
        self.lines.append(f"{skip}:")

    def scalar_block(self):
        for _ in range(self.r(1, 5)):
            op = self.rng.choice(["li", "addi", "add", "sub", "mul", "cmp"])
            rd, ra, rb = (f"r{self.r(8, 11)}" for _ in range(3))
            if op == "li":
                self.emit(f"li {rd}, {self.r(-(1 << 31), (1 << 31) - 1)}")
            elif op == "addi":
                self.emit(f"addi {rd}, {ra}, {self.r(-1000, 1000)}")
            elif op == "cmp":
                cond = self.rng.choice(["eq", "ne", "lt", "ge", "ltu", "geu", "always"])
                self.emit(f"cmp.{cond} {rd}, {ra}, {rb}")
            else:
                self.emit(f"{op} {rd}, {ra}, {rb}")

    def group(self, depth=0):
        kind = self.rng.choice(["gemm", "vadd", "vclip", "vmax", "argmax", "scalar", "loop",
                                "depthwise"],
                               p=[0.25, 0.15, 0.1, 0.1, 0.1, 0.1, 0.15, 0.05])
        if kind == "depthwise" and not self.c.dw_rows:  # a build without the engine
            kind = "gemm"
        region = self.regions < self.c.region_depth and self.rng.random() < 0.3
        rid = self.r(1, 999)
        if region:
            self.regions += 1
            self.emit(f"region.begin {rid}")
        if kind == "gemm":
            self.gemm_group(tag=self.r(0, min(self.c.tag_slots, 7)))
        elif kind in ("vadd", "vclip"):
            self.eltwise_group(kind)
        elif kind == "depthwise":
            self.depthwise_group()
        elif kind == "vmax":
            self.maxpool_group()
        elif kind == "argmax":
            self.argmax_branch()
        elif kind == "scalar":
            self.scalar_block()
        elif kind == "loop" and depth < min(2, self.c.loop_depth - 1):
            end = self.new_label()
            count = self.r(0, 3)
            # Some loops are left early by a taken branch on an iteration counter
            # (the hardware pops the loop instead of counting it down), landing on
            # the loop's end or past code after it.
            leave = self.rng.random() < 0.35
            counter = f"r{1 + depth}"  # one per nesting level (no group writes r1..r4)
            if leave:
                self.emit(f"li {counter}, 0")
            if self.rng.random() < 0.4:
                # The count from a register (read once, at the loop's start, so nested
                # loops may share r3). A loop that is left early may have a count past
                # the immediate's 16 bits, up to 2**32 - 1 (unsigned).
                if leave and self.rng.random() < 0.5:
                    count = int(self.rng.choice([0x10000 + self.r(0, 3), -1]))
                self.emit(f"li r3, {count}")
                self.emit(f"loopr r3, {end}")
            else:
                self.emit(f"loop {count}, {end}")
            self.emit("sync")
            self.bump = [0] * len(self.bump)  # the body starts from empty buffers
            self.group(depth + 1)
            out = end
            if leave:
                out = end if self.rng.random() < 0.5 else self.new_label()
                self.emit(f"addi {counter}, {counter}, 1")
                self.emit(f"li r7, {self.r(1, 3)}")
                self.emit(f"br.{self.rng.choice(['eq', 'geu'])} {counter}, r7, {out}")
            self.emit("sync")
            self.lines.append(f"{end}:")
            if out != end:
                self.scalar_block()  # runs only when the loop was not left early
                self.lines.append(f"{out}:")
            # A count of 0 skips the body with both its syncs, and leaving early skips
            # the last: the buffers are recycled only after a sync that always runs.
            self.emit("sync")
            self.bump = [0] * len(self.bump)
        else:
            self.scalar_block()
        if region:
            self.emit(f"region.end {rid}")
            self.regions -= 1


def random_program(config: NPUConfig, seed: int, groups: int = 6) -> RandomProgram:
    """A legal, race-free random program with its partition table and DRAM image."""
    rng = np.random.default_rng(seed)
    g = _Gen(config, rng)
    for _ in range(groups):
        g.group()
    g.emit("end")
    source = "\n".join(g.lines) + "\n"
    data = rng.integers(0, 256, IN_BYTES, dtype=np.uint8)
    return RandomProgram(source, asm.assemble(source), g.partitions, {IN_BASE: data})


# ---- race check ---------------------------------------------------------------------------
_QUEUES = ("load", "compute", "store")


class _Recorder(np.ndarray):
    """A memory array that logs the indices of every ``[]`` read and write."""

    log: list

    def __getitem__(self, idx):
        self.log.append((False, idx))
        return np.asarray(self)[idx]

    def __setitem__(self, idx, value):
        self.log.append((True, idx))
        np.asarray(self)[idx] = value


class _RaceMachine(Machine):
    """The golden model, recording which queue instruction touched which scratchpad or
    DRAM byte and which earlier instructions are ordered before it (vector clocks)."""

    def __init__(self, config: NPUConfig, dram_bytes: int):
        super().__init__(config, dram_bytes=dram_bytes)
        self.races: list[str] = []
        self.spaces = {}
        for name in ("sp", "dram"):
            rec = getattr(self, name).view(_Recorder)
            rec.log = []
            setattr(self, name, rec)
            n = len(rec)
            # Per byte: the last writer (queue, number) and the last reader in each queue.
            self.spaces[name] = (np.arange(n), np.full(n, -1, np.int8), np.zeros(n, np.int32),
                                 np.zeros((len(_QUEUES), n), np.int32))

    def _reset_run_state(self):
        super()._reset_run_state()
        if hasattr(self, "spaces"):
            for _, wq, _, rn in self.spaces.values():
                wq.fill(-1)
                rn.fill(0)
        # Queue instructions are numbered from 1 per queue. clock[q][r] = c: the
        # instructions 1..c of queue r complete before the next one of queue q starts
        # (its own queue included: a queue runs in order).
        self.clock = {q: np.zeros(len(_QUEUES), np.int64) for q in _QUEUES}
        self.sent = {c: [] for c in isa.TOKEN_CHANNELS}  # the clocks tokens carry

    def _drain(self, queues):
        """The sequencer waits until ``queues`` are idle: later instructions see all."""
        done = np.max([self.clock[q] for q in queues], axis=0)
        for q in _QUEUES:
            self.clock[q] = np.maximum(self.clock[q], done)

    def _exec(self, ins, pc):
        spec = ins.spec
        if spec.queue is Queue.SEQ:
            if ins.mnemonic in ("sync", "end", "ptsel", "region"):  # (isa.py: all drain)
                self._drain(_QUEUES)
            elif ins.mnemonic == "tinv":
                self._drain(("load",))
            return super()._exec(ins, pc)
        q = spec.queue.value
        qi = _QUEUES.index(q)
        seen = self.clock[q].copy()
        for flag in (Token.POP_PREV, Token.POP_NEXT):
            if ins.tokens & flag:
                ch = isa.token_channel(spec.queue, flag)
                if self.sent[ch]:  # (else the model stops with TOKEN_DEADLOCK)
                    seen = np.maximum(seen, self.sent[ch].pop(0))
        me = self.clock[q][qi] + 1
        for rec in (self.sp, self.dram):
            rec.log.clear()
        nxt = super()._exec(ins, pc)
        for name in ("sp", "dram"):
            self._check(name, ins, pc, qi, me, seen)
        seen[qi] = me
        self.clock[q] = seen
        for flag in (Token.PUSH_PREV, Token.PUSH_NEXT):
            if ins.tokens & flag:
                self.sent[isa.token_channel(spec.queue, flag)].append(seen.copy())
        return nxt

    def _check(self, name, ins, pc, qi, me, seen):
        rec = getattr(self, name)
        addrs, wq, wn, rn = self.spaces[name]
        for write in (False, True):
            idx = [addrs[i].ravel() for w, i in rec.log if w == write]
            if not idx:
                continue
            a = np.unique(np.concatenate(idx))
            # Unordered with the last writer of a byte (another queue, not seen yet).
            lq = wq[a]
            bad = (lq >= 0) & (lq != qi)
            bad[bad] = wn[a[bad]] > seen[lq[bad]]
            what = "write" if write else "read"
            for b in a[bad][:1]:
                self.races.append(
                    f"pc {pc} {ins.mnemonic} ({_QUEUES[qi]}) {what}s {name}[{b:#x}] "
                    f"unordered with write #{wn[b]} of the {_QUEUES[wq[b]]} queue")
            if write:
                for r in range(len(_QUEUES)):
                    if r == qi:
                        continue
                    bad = rn[r, a] > seen[r]
                    for b in a[bad][:1]:
                        self.races.append(
                            f"pc {pc} {ins.mnemonic} ({_QUEUES[qi]}) writes {name}[{b:#x}] "
                            f"unordered with read #{rn[r, b]} of the {_QUEUES[r]} queue")
                wq[a], wn[a] = qi, me
            else:
                rn[qi, a] = me


def find_races(config: NPUConfig, program: asm.Program, partitions, dram=None, args=(),
               runs: int = 1, dram_bytes: int = 1 << 20) -> list[str]:
    """Races of a program, found by running it on the golden model.

    A race is a pair of scratchpad or DRAM accesses from different queues, at least
    one a write, that nothing orders: not a token chain, not a ``sync`` (nor ``end``,
    ``ptsel``, a region mark, or ``tinv`` for loads). Inside a queue, program order counts as order.
    The golden model runs everything in program order, so the RTL may legally give a
    racy program a different answer. Returns one line per race found (at most one
    per instruction, memory and kind), or ``[]`` when the program is race-free;
    a run that stops with an error is reported too.

    ``partitions``, ``dram`` (address -> array) and ``args`` are as for a job;
    ``runs`` runs follow each other on the same machine.
    """
    m = _RaceMachine(config, dram_bytes=dram_bytes)
    for addr, data in (dram or {}).items():
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        np.asarray(m.dram)[addr: addr + len(raw)] = raw
    m.write_program(program)
    m.set_partitions(partitions)
    m.swap()
    for _ in range(runs):
        res = m.run(args)
        if not res.ok:
            m.races.append(f"run stopped: {res}")
    return m.races
