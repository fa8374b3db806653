"""Host scenarios run against the RTL (inside the simulator) and the golden model.

Each scenario is a blocking host function ``fn(device, config, seed)``: it drives the
RTL through :class:`host.driver.NPUDriver` over the given device, runs the same
thing on a :class:`host.device.GoldenDevice`, and raises ``AssertionError`` on any
difference in DRAM, scalar registers, error status, the exact counters or the exact
fields of the region trace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from firmware import asm
from firmware.golden import EXACT_COUNTERS
from firmware.quant import quantize_multiplier
from host.device import GoldenDevice
from host.driver import NPUDriver

PROGRAMS = Path(__file__).resolve().parent.parent / "firmware" / "programs"
DRAM_BYTES = 1 << 20
EXACT_TRACE = ("region", "instructions", "macs", "dram_read_bytes", "dram_write_bytes",
               "tag_hits", "tag_misses")
TABLE = [(i * 1024, 1024) for i in range(8)]


@dataclass
class Job:
    """One program run: code, tables, arguments and DRAM contents."""

    name: str
    program: asm.Program
    partitions: list
    args: tuple = ()
    dram: dict = field(default_factory=dict)  # address -> bytes
    runs: int = 1
    pt_sets: tuple = ()


class Pair:
    """The RTL and the golden model side by side, behind the same driver code."""

    def __init__(self, device, config):
        self.config = config
        self.rtl = NPUDriver(device)
        assert self.rtl.config == config, f"CAPS read {self.rtl.config}, built {config}"
        self.gold = NPUDriver(GoldenDevice(config, dram_bytes=DRAM_BYTES))

    def both(self):
        return (self.rtl, self.gold)

    def run_job(self, job: Job, check_dram=True):
        for drv in self.both():
            for addr, data in job.dram.items():
                drv.write_mem(addr, np.ascontiguousarray(data))
            drv.load(job.program, job.partitions, pt_sets=job.pt_sets)
        for i in range(job.runs):
            st = [drv.run(job.args) for drv in self.both()]
            assert st[0] == st[1], f"{job.name} run {i}: RTL {st[0]}, golden {st[1]}"
        self.compare(job.name, check_dram=check_dram)
        return st[1]

    def compare(self, what: str, check_dram=True):
        """Compare everything; return the RTL's region trace (read out for the check)."""
        rtl, gold = self.both()
        assert rtl.regs() == gold.regs(), f"{what}: registers\nRTL {rtl.regs()}\n" \
                                          f"golden {gold.regs()}"
        cr, cg = rtl.counters(), gold.counters()
        for name in EXACT_COUNTERS:
            assert cr[name] == cg[name], f"{what}: counter {name}: RTL {cr[name]}, " \
                                         f"golden {cg[name]}"
        for kind in ("tag_hits", "tag_misses"):
            assert cr[kind] == cg[kind], f"{what}: {kind}: RTL {cr[kind]}, golden {cg[kind]}"
        tr, tg = rtl.read_trace(), gold.read_trace()
        assert len(tr) == len(tg), f"{what}: {len(tr)} trace records, golden {len(tg)}"
        for a, b in zip(tr, tg, strict=True):
            for f in EXACT_TRACE:
                assert getattr(a, f) == getattr(b, f), \
                    f"{what}: trace {f}: RTL {a}, golden {b}"
        if check_dram:
            dr = np.frombuffer(rtl.read_mem(0, DRAM_BYTES), np.uint8)
            dg = np.frombuffer(gold.read_mem(0, DRAM_BYTES), np.uint8)
            diff = np.flatnonzero(dr != dg)
            assert diff.size == 0, f"{what}: DRAM differs at {diff.size} bytes, first " \
                                   f"{diff[0]:#x}: RTL {dr[diff[0]]}, golden {dg[diff[0]]}"
        return tr


def program_jobs(seed: int) -> list[Job]:
    """The hand-written programs of firmware/programs with data, as in tests/test_programs."""
    rng = np.random.default_rng(seed)
    src = lambda name, **d: asm.assemble((PROGRAMS / name).read_text(), d)  # noqa: E731
    jobs = [
        Job("scalar", src("scalar.s"), TABLE, args=(13,)),
        Job("control", src("control.s"), TABLE),
        Job("dma", src("dma.s"), TABLE, args=(0x100, 0x1000),
            dram={0x100: rng.integers(0, 256, (16, 32), dtype=np.uint8)}),
    ]
    mult, shift = quantize_multiplier(float(rng.uniform(1e-4, 1e-2)))
    jobs.append(Job(
        "gemm", src("gemm.s", QMUL=mult, QSHIFT=shift, QZP=int(rng.integers(-20, 20))),
        TABLE, args=(0, 0x400, 0x800, 0x1000),
        dram={0: rng.integers(-128, 128, (16, 16), dtype=np.int8),
              0x400: rng.integers(-128, 128, (16, 8), dtype=np.int8),
              0x800: rng.integers(-50000, 50000, 8).astype("<i4")}))
    jobs.append(Job(
        "vector", src("vector.s", ADD_MUL_A=3 << 20, ADD_MUL_B=5 << 19, ADD_ZP_A=-3,
                      ADD_ZP_B=4, QSHIFT=22, QZP=1),
        TABLE, args=(0x200, 0x800),
        dram={0x200: rng.integers(-128, 128, 104, dtype=np.int8)}))
    return jobs


def programs(device, config, seed):
    """Every hand-written program: RTL equals golden."""
    pair = Pair(device, config)
    for job in program_jobs(seed):
        pair.run_job(job)


def random_programs(device, config, seed, count=None):
    """Constrained-random programs (verif.randprog): RTL equals golden on each."""
    from verif.randprog import random_program

    count = count or int(os.environ.get("NPU_RANDOM_COUNT", "10"))
    pair = Pair(device, config)
    for i in range(count):
        rp = random_program(config, seed * 1000 + i)
        job = Job(f"random seed {seed * 1000 + i}", rp.program, rp.partitions,
                  dram=rp.dram, runs=2)
        try:
            pair.run_job(job, check_dram=True)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- program ---\n{rp.source}") from None


# Each error case: (name, source, partitions); both machines must report the same
# code, pc and address, and a good program must run correctly afterwards.
ERROR_CASES = [
    ("illegal_zero_word", "nop\n.word 0\nend"),
    ("reserved_opcode", ".word (63 << 58) | (1 << 56)\nend"),
    ("wrong_version", "nop\n.word (1 << 58) | (2 << 56)\nend"),
    ("reserved_bits", "nop\n.word (1 << 56) | 1\nend"),
    ("bad_wload_k", "nop\nwload p0, r0, 9, 1\nend"),
    ("bad_cfg_qshift", "cfg.qshift 64\nend"),
    ("bad_tinv_slot", "nop\ntinv 63\nend"),
    ("bad_ptsel", "ptsel 3\nend"),
    ("gemm_without_weights", "gemm.overwrite p0, r0, r0, 1\nend"),
    ("partition_bounds", "li r1, 1000\nload p0, r1, r0, r0, 1, 100\nend"),
    ("partition_disabled", "load p7, r0, r0, r0, 1, 1\nend"),
    ("acc_bounds", "wload p0, r0, 2, 2\nli r2, 1023\ngemm.overwrite p0, r0, r2, 2, swap=1\nend"),
    ("pc_bounds_branch", "nop\nbr.always r0, r0, 5000\nend"),
    ("loop_empty", "nop\nloop 3, 2\nend"),
    ("loop_nesting", "loop 2, 4\nloop 2, 5\nnop\nnop\nnop\nend"),
    ("token_deadlock", "nop\nstore p0, r0, r0, r0, 1, 1, pop=prev\nend"),
    ("region_mismatch", "region.begin 1\nregion.end 2\nend"),
    ("region_open_at_end", "region.begin 1\nend"),
    ("run_off_the_end", "nop\nnop"),
]


def errors(device, config, seed):
    """Every error case stops with the golden model's code/pc/address; the NPU recovers."""
    pair = Pair(device, config)
    good = program_jobs(seed)[3]  # gemm
    table = [(i * 1024, 1024) for i in range(7)]  # p7 stays disabled
    for name, source in ERROR_CASES:
        job = Job(name, asm.assemble(source), table)
        status = pair.run_job(job, check_dram=False)
        assert not status.ok, f"{name}: expected an error, both machines ran clean"
        pair.run_job(good)


def hot_swap(device, config, seed):
    """Back-to-back runs while a new program is swapped in: every run all-A or all-B.

    Program A and B each run inside one region with their own id and a distinct
    instruction count; the trace shows which program every run executed and that it
    executed entirely. No run is lost or doubled, and exactly one swap happens.
    """
    rtl = NPUDriver(device)
    body = "li r8, {n}\nloopr r8, done\naddi r9, r9, 1\nmisspec\ndone:\n"
    prog = {rid: asm.assemble(f"region.begin {rid}\n" + body.format(n=n)
                              + f"region.end {rid}\nend\n")
            for rid, n in ((1, 40), (2, 25))}
    rtl.load(prog[1], TABLE, version=1)
    rtl.reset_counters()
    runs = 8
    rtl.write("CYCLE_BUDGET", 0)
    runs_lo = lambda: rtl.read("CNT_RUNS_LO")  # noqa: E731
    rtl.start()
    for i in range(1, runs):
        while runs_lo() < i:  # run i has begun: the next START queues behind it
            pass
        if i == 3:  # while A runs: B into the shadow bank, then the swap request
            rtl.write_program(prog[2], version=2)
            rtl.set_partitions(TABLE)
            rtl.swap(wait=False)
        rtl.start()
    while runs_lo() < runs or rtl.status() & 1:
        pass
    trace = rtl.read_trace()
    ids = [r.region for r in trace]
    counts = {1: 2 * 40 + 3, 2: 2 * 25 + 3}  # begin, li, loopr, n x (addi, misspec)
    assert len(trace) == runs, f"{len(trace)} runs recorded for {runs} starts: {ids}"
    switch = ids.index(2) if 2 in ids else runs
    assert ids == [1] * switch + [2] * (runs - switch), f"runs not all-A then all-B: {ids}"
    assert 0 < switch < runs, f"the swap never landed between runs: {ids}"
    for r in trace:
        assert r.instructions == counts[r.region], f"torn run: {r}"
    c = rtl.counters()
    assert c["runs"] == runs and c["swaps"] == 1, f"runs {c['runs']}, swaps {c['swaps']}"
    assert rtl.bank_version(rtl.active_bank) == 2



def print_program(device, config, seed):
    """``make sim``: run one assembly file on the RTL, print what it did, check it.

    The program comes from NPU_PROGRAM, its arguments from NPU_ARGS (integers) and
    its DRAM image is random bytes from the seed; the run is compared with golden.
    """
    path = Path(os.environ["NPU_PROGRAM"])
    args = tuple(int(a, 0) for a in os.environ.get("NPU_ARGS", "").split())
    rng = np.random.default_rng(seed)
    job = Job(path.name, asm.assemble(path.read_text()), TABLE[:config.partitions],
              args=args, dram={0: rng.integers(0, 256, 0x10000, dtype=np.uint8)})
    pair = Pair(device, config)
    for drv in pair.both():
        for addr, data in job.dram.items():
            drv.write_mem(addr, data)
        drv.load(job.program, job.partitions)
    t0 = device.cycle()
    status = pair.rtl.run(args)
    wall = device.cycle() - t0
    gold = pair.gold.run(args)
    assert status == gold, f"RTL {status} != golden {gold}"
    regs, counters = pair.rtl.regs(), pair.rtl.counters()
    trace = pair.compare(path.name)
    print(f"\n== {path} on the Verilator NPU ({config.rows}x{config.cols}) ==")
    print(f"status: {status.error.name} at pc {status.pc}  (golden: {gold.error.name})")
    print("registers: " + " ".join(f"r{i}={v:#x}" for i, v in enumerate(regs) if v))
    for name, value in counters.items():
        print(f"  {name:<18} {value}")
    print(f"  host-visible cycles for the run (CSR traffic included): {wall}")
    for r in trace:
        print(f"  region {r.region}: cycles {r.end - r.start}, instrs {r.instructions}, "
              f"MACs {r.macs}, DRAM rd {r.dram_read_bytes} wr {r.dram_write_bytes}")
    print("RTL equals the golden model (DRAM, registers, exact counters)")
