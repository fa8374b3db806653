"""The golden model: the executable, bit-exact semantics of the NPU ISA.

:class:`Machine` holds what the NPU holds (two instruction banks with their
partition tables, scratchpad, tile tags, accumulators, weight buffers, scalar and
configuration registers, counters, the region trace) and runs programs on it in
program order. Data results, scalar registers, error codes and the counters marked
*exact* in :data:`EXACT_COUNTERS` are what the RTL must reproduce bit for bit. Cycle
figures come from the documented cost model (:class:`CostModel`), a model of the
decoupled queues, the engines, the scratchpad ports and the DMA: a run's cycles and
its trace's cycle stamps are the RTL's exactly where :attr:`RunResult.cycles_exact`
says so (with the simulation's memory, or a slower one of :class:`DramLatency`), an
estimate elsewhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import isa
from .bursts import DramLatency, burst_plan
from .config import NPUConfig
from .isa import CfgField, Cond, ErrorCode, GemmMode, Queue, RegionOp, Token
from .quant import requantize, rshift_rne
from .regs import CAUSE_COUNTERS

__all__ = ["Machine", "RunResult", "TraceRecord", "CostModel", "DramLatency", "requantize",
           "rshift_rne"]

MASK32 = (1 << 32) - 1

EXACT_COUNTERS = (
    "instructions", "macs", "dram_read_bytes", "dram_write_bytes", "tag_hits", "tag_misses",
    "regions", "misspeculations", "runs", "errors", "trace_overflows",
)
"""Counters the RTL must match exactly; the others come from the cost model (``cycles``
is exact where :attr:`RunResult.cycles_exact` says so)."""


def wrap32(x):
    """Wrap an int64 array to int32 two's complement."""
    return np.asarray(x, dtype=np.int64).astype(np.int32)


@dataclass(frozen=True)
class CostModel:
    """The golden model's cycle costs (documented in docs/isa.md).

    Each queue executes in order; the three queues overlap, ordered only by
    dependency tokens. Inside the compute queue, a ``wload`` overlaps streaming
    GEMMs (double buffering) and GEMMs pipeline back to back; the array and the
    vector unit take turns, but for array commands beside a ``vreq``/``vreqb`` on a
    build with two accumulator read ports. The parameters are the RTL's, measured: the programs of
    ``verif.scenarios.COST_PROGRAMS`` take the model's cycles exactly
    (tests/test_npu.py), and so do the runs :attr:`RunResult.cycles_exact` vouches for.
    """

    dispatch: int = 2  # sequencer cycles per instruction (check, fire + next operands)
    dispatch_queue: int = 4  # ... per load/compute/store instruction (+ span, product)
    branch: int = 1  # extra cycles per br, taken or not (its condition is registered first)
    branch_taken: int = 0  # extra cycles for a taken branch (the next pc is resolved in CHECK)
    queue_start: int = 5  # from a queue instruction's dispatch to its idle queue starting it
    drain: int = 3  # from the queues' last completion to a draining instruction's end
    end_cycle: int = 1  # a run's cycles count the cycle its end fires in, too
    # A load or store costs its latency plus a cycle per bus beat. The latencies are the
    # DMA's pipeline and the memory's together, measured with the Verilator NPU's
    # memory (cocotbext-axi AxiRam); a slower DRAM adds its own (Machine.dram_latency).
    load_latency: int = 9  # start to the first beat in the scratchpad (after the R and write FIFOs)
    store_latency: int = 12  # start to the write response, less the beats
    # At most this many write bursts are between the DMA's burst splitter and the
    # memory's acceptance of their last beat (the DMA's address queue of 2, the
    # memory's of 2 and the burst it takes data for): a burst's data comes no earlier
    # than store_refill after the end of the data of the burst store_bursts before it.
    store_bursts: int = 5
    store_refill: int = 8
    dma_gap: int = 1  # the queue's next load (store) starts this much after one ends
    token: int = 1  # a pushed token counts in the popping queue this long after its push
    tag_hit: int = 1  # a load whose tag hits ends this long after its start...
    tag_check: int = 2  # ... and the load queue starts its next instruction this long after
    vector_latency: int = 14  # fill and drain of the vector pipeline (1 element: 15 cycles)
    vadd_latency: int = 14  # ... for vadd, while its two reads find their banks free
    # The vector unit's read queues: a source is read at most this many windows ahead
    # of the operands taken from the queues (vadd's reads wait for each other's banks).
    vector_queue: int = 7
    vbias_latency: int = 6  # ... for vbias (after its bias words: accumulators to accumulators)
    vargmax_latency: int = 8  # ... for vargmax (a reduction into a register)
    vqtab_latency: int = 6  # ... for vqtab (table words into the unit's registers)
    dwload_latency: int = 4  # the depthwise engine's tap reads (one window per tap) to done
    dwconv_latency: int = 5  # its last window's grant to its last accumulator write, less h
    reg_writeback: int = 4  # from a vargmax's end to the end of a dispatch reading its rd
    wload_latency: int = 1  # a swap gemm may follow a k-row wload k + this cycles after its start
    # ... one more after a one-row wload (its row is written a cycle after its data
    # comes, and the gemm's first activation reads it at once)
    wload_one_row: int = 1
    handoff: int = 1  # a wload waiting for a wload, a vector op for the GEMMs, starts this late
    array_stages: int = 3  # pipeline stages of a processing element (hdl.array.PE_STAGES)
    sp_read: int = 2  # a scratchpad read's grant to its data (hdl.ports.SP_READ_LATENCY)
    gemm_intake: int = 2  # an idle array starts a gemm this long after its queue could
    # A wload may start into a gemm's weight bank this long before the gemm's results
    # are in (its rows leave the array, and the wload's rows come as late after their
    # reads' grants as the gemm's rows came: sp_read - 1 of it).
    array_exit: int = 3
    cfg: int = 1
    fire_overlap: int = 2  # a dispatch into a full queue resumes this long before a slot frees
    # A load writes its first beat load_latency - load_write_lead after its start; a
    # vreq, vreqb or vclip writes its last window vector_write_end before its end.
    load_write_lead: int = 2
    vector_write_end: int = 2
    # A vreqb.col reads its bias words within this long after its first bias window
    # (an array command beside it no earlier meets none of its reads).
    vector_read_lag: int = 3

    def dma_beats(self, addr: int, nbytes: int, bus: int) -> int:
        return (addr % bus + nbytes + bus - 1) // bus

    def read_pair_delay(self, a, b, banks) -> int:
        """Cycles by which vadd's last operand pair comes late because its two
        sources' reads (windows at absolute addresses ``a`` and ``b``, in order) want
        the same scratchpad banks: each cycle the first source's read wins its banks
        (``banks(addr)``), and a source runs at most ``vector_queue`` windows ahead
        of the pairs taken; a window's data is there ``sp_read + 1`` after its grant."""
        return self.read_pairs(a, b, banks)[0]

    def read_pairs(self, a, b, banks) -> tuple[int, int]:
        """:meth:`read_pair_delay` and the cycles the second source's read was
        refused its banks (the ``sp_conflicts`` it causes)."""
        n, depth, lag = len(a), self.vector_queue, self.sp_read + 1
        grant_a: list[int] = []
        grant_b: list[int] = []
        occ_a = occ_b = taken = t = 0
        last = refused = 0
        while taken < n:
            req_a = len(grant_a) < n and occ_a < depth
            req_b = len(grant_b) < n and occ_b < depth
            got_b = req_b and not (req_a and banks(a[len(grant_a)]) & banks(b[len(grant_b)]))
            refused += req_b and not got_b
            take = (len(grant_b) > taken and grant_a[taken] + lag <= t
                    and grant_b[taken] + lag <= t)
            if req_a:
                grant_a.append(t)
            if got_b:
                grant_b.append(t)
            if take:
                taken, last = taken + 1, t
            occ_a += req_a - take
            occ_b += got_b - take
            t += 1
        return last - (n - 1 + lag), refused

    def store_data(self, bursts) -> int:
        """Cycles from a store's first data beat to the end of its last: a beat a
        cycle, each burst (``bursts``: their beats, in order) waiting for the burst
        ``store_bursts`` before it."""
        ends: deque[int] = deque(maxlen=self.store_bursts)
        t = 0
        for beats in bursts:
            if len(ends) == self.store_bursts:
                t = max(t, ends[0] + self.store_refill)
            t += beats
            ends.append(t)
        return t


@dataclass
class TraceRecord:
    """One region-trace entry: what a region cost between its begin and end marks."""

    region: int
    start: int
    end: int
    instructions: int
    macs: int
    dram_read_bytes: int
    dram_write_bytes: int
    tag_hits: int
    tag_misses: int
    stall_cycles: int
    busy_load: int = 0
    busy_store: int = 0
    busy_array: int = 0
    busy_vector: int = 0
    sp_conflicts: int = 0

    @property
    def cycles(self) -> int:
        return self.end - self.start


@dataclass
class RunResult:
    """The outcome of one run: error status as the NPU reports it, plus cost figures."""

    error: ErrorCode
    pc: int
    error_addr: int = 0
    message: str = ""
    cycles: int = 0
    instructions: int = 0
    #: Whether ``cycles`` (and the region trace's cycle stamps) are the RTL's exactly,
    #: with the simulation's memory: False for a run that stopped with an error, and
    #: for one where a DMA transfer and a compute instruction used the same scratchpad
    #: banks in overlapping cycles (the bank arbitration may hold the transfer back by
    #: cycles the cost model does not count).
    cycles_exact: bool = True
    #: Why not (when the cycles are exact: empty): the cause of the first hazard the cost
    #: model does not play out, or the error.
    inexact_cause: str = ""

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE

    def check(self) -> RunResult:
        """Raise ``RuntimeError`` if the run stopped with an error."""
        if not self.ok:
            raise RuntimeError(
                f"NPU error {self.error.name} at pc {self.pc}: {self.message}"
            )
        return self


@dataclass
class _Cursor:
    """Where a begun run stands: the next pc and the limits it runs under."""

    pc: int
    start_instr: int
    max_cycles: int | None
    max_instructions: int


class _Stop(Exception):
    def __init__(self, code: ErrorCode, message: str, addr: int = 0):
        super().__init__(message)
        self.code, self.message, self.addr = code, message, addr


def _counters(partitions: int) -> dict:
    return {
        "cycles": 0, "instructions": 0, "macs": 0,
        "dram_read_bytes": 0, "dram_write_bytes": 0,
        "tag_hits": [0] * partitions, "tag_misses": [0] * partitions,
        "regions": 0, "misspeculations": 0, "runs": 0, "errors": 0, "swaps": 0,
        "trace_overflows": 0,
        "busy_load": 0, "busy_compute": 0, "busy_store": 0, "stall_cycles": 0,
        **dict.fromkeys(CAUSE_COUNTERS, 0),
    }


class Machine:
    """The NPU as the golden model sees it.

    Parameters
    ----------
    config : the hardware configuration (array size, scratchpad, ...).
    dram_bytes : size of the modelled DRAM; accesses beyond it are bus errors.
    cost : the cycle cost model.
    dram_latency : the extra cycles of a slow DRAM (:class:`DramLatency`; none by
        default, the simulation's AxiRam).

    ``bus_faults`` lists DRAM byte ranges ``(lo, hi)`` that answer bus errors as
    well (what a test declares to the RTL's DRAM model as SLVERR/DECERR windows):
    a DMA row touching one stops the run with BUS_ERROR at that row's address.
    """

    def __init__(self, config: NPUConfig | None = None, dram_bytes: int = 1 << 20,
                 cost: CostModel | None = None, dram_latency: DramLatency | None = None):
        if dram_bytes <= 0:
            raise ValueError(f"dram_bytes={dram_bytes!r}: must be positive")
        self.config = cfg = config or NPUConfig()
        self.cost = cost or CostModel()
        self.dram_latency = dram_latency or DramLatency()
        self.dram = np.zeros(dram_bytes, dtype=np.uint8)
        self.bus_faults: list[tuple[int, int]] = []
        self.sp = np.zeros(cfg.sp_bytes, dtype=np.uint8)
        self.imem = [[0] * cfg.imem_depth for _ in range(2)]
        self.ptables = [
            [[(0, 0)] * cfg.partitions for _ in range(cfg.pt_sets)] for _ in range(2)
        ]
        self.bank_version = [0, 0]
        self.active_bank = 0
        self.tags: list[tuple | None] = [None] * (cfg.tag_slots + 1)  # slot 0 unused
        self.counters = _counters(cfg.partitions)
        self.trace: deque[TraceRecord] = deque()
        # (the scratchpad's banks repeat every sp_banks bus words)
        self._bank_period = self.config.sp_banks * self.config.bus_bytes
        self._window_banks_cache: dict[tuple, np.ndarray] = {}
        self._span_masks: dict[tuple, int] = {}  # (rows, n) -> _bank_mask's run
        self.regs = [0] * isa.NUM_REGS
        self.last: RunResult | None = None
        self.inexact_runs = 0  # runs whose cycles are not exact (RunResult.cycles_exact)
        self.counted_inexact = 0  # ... of them since the counters were reset
        # Per cause of inexact cycles (RunResult.inexact_cause): the runs it made inexact
        # first, and how often it fired (a DMA overlap: only as a run's first cause).
        self.inexact_firsts: dict[str, int] = {}
        self.inexact_fired: dict[str, int] = {}
        self._cursor: _Cursor | None = None
        self._reset_run_state()

    # ---- host-side operations (what the CSR port offers) -----------------------
    @property
    def shadow_bank(self) -> int:
        return 1 - self.active_bank

    def write_program(self, words, bank: int | None = None, version: int | None = None):
        """Write a program (words or ``asm.Program``) into a bank (default: the shadow).

        The rest of the bank is cleared, so running past the program hits an
        illegal (all-zero) word. Raises ``ValueError`` for the active bank, like
        the hardware refuses such writes, or when the program does not fit.
        """
        words = list(getattr(words, "words", words))
        bank = self.shadow_bank if bank is None else bank
        if bank == self.active_bank:
            raise ValueError(f"bank {bank} is active: programs go into the shadow bank")
        if len(words) > self.config.imem_depth:
            raise ValueError(
                f"program of {len(words)} instructions exceeds imem_depth "
                f"{self.config.imem_depth}"
            )
        self.imem[bank] = words + [0] * (self.config.imem_depth - len(words))
        if version is not None:
            self.bank_version[bank] = version

    def set_partitions(self, table, bank: int | None = None, pt_set: int = 0):
        """Set one partition table: a list of (base, size) byte pairs, at most ``partitions``.

        Unlisted entries become disabled (size 0). Entries are not checked here;
        an access through an entry that leaves the scratchpad is a PARTITION_BOUNDS
        error, exactly as on the hardware.
        """
        bank = self.shadow_bank if bank is None else bank
        table = [(int(b), int(s)) for b, s in table]
        if len(table) > self.config.partitions:
            raise ValueError(
                f"{len(table)} partitions given, the NPU has {self.config.partitions}"
            )
        if not 0 <= pt_set < self.config.pt_sets:
            raise ValueError(f"pt_set={pt_set}: the NPU has {self.config.pt_sets} sets")
        self.ptables[bank][pt_set] = table + [(0, 0)] * (self.config.partitions - len(table))

    def swap(self, invalidate_tags: bool = False):
        """Make the shadow bank active (the RTL does this at the next run boundary)."""
        self.active_bank = self.shadow_bank
        self.counters["swaps"] += 1
        if invalidate_tags:
            self.tags = [None] * len(self.tags)

    def reset_counters(self):
        self.counters = _counters(self.config.partitions)
        self.counted_inexact = 0

    def invalidate_tags(self):
        self.tags = [None] * len(self.tags)

    def pop_trace(self) -> TraceRecord | None:
        return self.trace.popleft() if self.trace else None

    def load_and_run(self, program, partitions, args=(), max_cycles=None) -> RunResult:
        """Convenience for tests and tools: program + table into the shadow bank, swap, run."""
        self.write_program(program, bank=self.shadow_bank)
        self.set_partitions(partitions, bank=self.shadow_bank)
        self.swap()
        return self.run(args=args, max_cycles=max_cycles)

    # ---- execution --------------------------------------------------------------
    def _reset_run_state(self):
        cfg = self.config
        self.regs = [0] * isa.NUM_REGS
        self.cfg = dict(isa.CFG_RESET)
        # The per-column requantization table (vqtab): multipliers and shifts.
        self.qtab_mul = np.full(cfg.cols, isa.CFG_RESET[CfgField.QMUL], dtype=np.int64)
        self.qtab_shift = np.full(cfg.cols, isa.CFG_RESET[CfgField.QSHIFT], dtype=np.int64)
        self.acc = np.zeros((cfg.acc_rows, cfg.cols), dtype=np.int32)
        self.w = [np.zeros((cfg.rows, cfg.cols), dtype=np.int8) for _ in range(2)]
        self.wdims = [(0, 0), (0, 0)]
        self.w_active = 0
        self.dw_taps = np.zeros((isa.DW_TAPS, cfg.cols), dtype=np.int8)
        self.dw_pad = 0
        self.dw_bias = np.zeros(cfg.cols, dtype=np.int64)
        self.pt_set = 0
        self.tokens = {c: deque() for c in isa.TOKEN_CHANNELS}
        self.loops: list[list[int]] = []  # [start, end, remaining]
        self.regions: list[tuple] = []

    def run(self, args=(), max_cycles: int | None = None,
            max_instructions: int = 50_000_000) -> RunResult:
        """Run the active bank from pc 0 until ``end`` or an error.

        ``args`` (at most 7 ints) start in r1..r7, like the ARG registers.
        ``max_cycles`` is the host's cycle budget (TIMEOUT when exceeded).
        """
        self.begin(args, max_cycles, max_instructions)
        return self.advance()

    def begin(self, args=(), max_cycles: int | None = None,
              max_instructions: int = 50_000_000) -> None:
        """Start a run of the active bank at pc 0 without executing it (see :meth:`advance`).

        The arguments are those of :meth:`run`; a run left paused is abandoned.
        """
        if len(args) > isa.NUM_ARG_REGS:
            raise ValueError(f"{len(args)} args given, at most {isa.NUM_ARG_REGS}")
        self._reset_run_state()
        for i, a in enumerate(args):
            self.regs[1 + i] = int(a) & MASK32
        self._time = _Timeline(self.config, self.cost, self.dram_latency)
        self.counters["runs"] += 1
        self._cursor = _Cursor(0, self.counters["instructions"], max_cycles, max_instructions)

    @property
    def running(self) -> bool:
        """Whether a run was begun and has not ended (it is paused)."""
        return self._cursor is not None

    def advance(self, until: int | None = None) -> RunResult | None:
        """Execute the begun run until it ends, or pause it before an instruction that
        would issue after cycle ``until`` (None: never pause).

        Returns the run's result when it ended (``cycles`` may exceed ``until``: the
        queues drain after the last issue), None when it paused. Pausing changes nothing
        in the run: advancing in steps gives the state and cycles of one ``run``.
        """
        cur = self._cursor
        if cur is None:
            raise RuntimeError("no run in progress: begin() one first")
        pc = cur.pc
        try:
            while True:
                if until is not None and self._time.now > until:
                    cur.pc = pc
                    return None
                if not 0 <= pc < self.config.imem_depth:
                    raise _Stop(ErrorCode.PC_BOUNDS, f"pc {pc} outside the bank")
                if self.counters["instructions"] - cur.start_instr >= cur.max_instructions or (
                    cur.max_cycles is not None and self._time.now > cur.max_cycles
                ):
                    raise _Stop(ErrorCode.TIMEOUT, "cycle budget exhausted")
                try:
                    ins = isa.decode(self.imem[self.active_bank][pc])
                except isa.DecodeError as e:
                    raise _Stop(e.code, str(e)) from None
                nxt = self._exec(ins, pc)
                self.counters["instructions"] += 1
                if nxt is None:
                    break
                pc = nxt
            result = RunResult(ErrorCode.NONE, pc)
        except _Stop as stop:
            self.counters["errors"] += 1
            result = RunResult(stop.code, pc, stop.addr, stop.message)
        self._cursor = None
        cycles = self._time.finish()
        self.counters["cycles"] += cycles
        for q in ("load", "compute", "store"):
            self.counters["busy_" + q] += self._time.busy[q]
        self.counters["stall_cycles"] += self._time.stall
        for name, value in self._time.causes.items():
            self.counters[name] += value
        result.cycles = cycles
        result.cycles_exact = result.ok and not self._time.contended
        fired = self._time.inexact_causes
        for cause, n in fired.items():
            self.inexact_fired[cause] = self.inexact_fired.get(cause, 0) + n
        if not result.cycles_exact:
            result.inexact_cause = ("error" if not result.ok else next(iter(fired)))
            self.inexact_firsts[result.inexact_cause] = \
                self.inexact_firsts.get(result.inexact_cause, 0) + 1
        self.inexact_runs += not result.cycles_exact
        self.counted_inexact += not result.cycles_exact
        result.instructions = self.counters["instructions"] - cur.start_instr
        self.last = result
        return result

    # ---- helpers ---------------------------------------------------------------------
    def _reg(self, r: int) -> int:
        self._time.read_reg(r)
        return self.regs[r]

    def _set_reg(self, r: int, value: int):
        if r:
            self.regs[r] = value & MASK32

    def _sp_range(self, p: int, offset: int, nbytes: int) -> int:
        """Absolute scratchpad address of [offset, offset+nbytes) in partition p."""
        if p >= self.config.partitions:
            raise _Stop(ErrorCode.BAD_OPERAND, f"partition p{p} does not exist")
        base, size = self.ptables[self.active_bank][self.pt_set][p]
        if size == 0:
            raise _Stop(ErrorCode.PARTITION_BOUNDS, f"partition p{p} is disabled", offset)
        if base + size > self.config.sp_bytes:
            raise _Stop(ErrorCode.PARTITION_BOUNDS,
                        f"partition p{p} ({base}+{size}) leaves the scratchpad", offset)
        if offset + nbytes > size:
            raise _Stop(ErrorCode.PARTITION_BOUNDS,
                        f"p{p}[{offset}:{offset + nbytes}] outside partition size {size}", offset)
        return base + offset

    def _sp_rows(self, p, offset, m, n, stride):
        """Absolute row addresses of an m x n tile with the given row stride."""
        stride = stride or n
        base = self._sp_range(p, offset, (m - 1) * stride + n)
        return base + np.arange(m) * stride

    def _sp_read(self, rows, n):
        idx = rows[:, None] + np.arange(n)[None, :]
        return self.sp[idx].view(np.int8)

    def _sp_write(self, rows, data):
        idx = rows[:, None] + np.arange(data.shape[1])[None, :]
        self.sp[idx] = data.view(np.uint8)

    def _acc_rows(self, first: int, m: int) -> slice:
        if first + m > self.config.acc_rows:
            raise _Stop(ErrorCode.ACC_BOUNDS,
                        f"accumulator rows {first}..{first + m - 1} beyond {self.config.acc_rows}")
        return slice(first, first + m)

    def _cols(self, n: int, what="n"):
        if n > self.config.cols:
            raise _Stop(ErrorCode.BAD_OPERAND, f"{what}={n} exceeds array cols {self.config.cols}")

    def _dram_row(self, addr: int, nbytes: int):
        if addr + nbytes > len(self.dram):
            raise _Stop(ErrorCode.BUS_ERROR, f"DRAM [{addr:#x}, +{nbytes}) outside memory", addr)
        for lo, hi in self.bus_faults:
            if addr < hi and lo < addr + nbytes:
                raise _Stop(ErrorCode.BUS_ERROR, f"DRAM [{addr:#x}, +{nbytes}) touches the "
                            f"erroring window [{lo:#x}, {hi:#x})", addr)
        return slice(addr, addr + nbytes)

    # ---- the instructions --------------------------------------------------------------
    def _exec(self, ins: isa.Instr, pc: int) -> int | None:
        m, o, t = ins.mnemonic, ins.ops, self._time
        spec = ins.spec
        if spec.queue is not Queue.SEQ:
            handler = getattr(self, "_op_" + m)
            t.begin(spec.queue, ins.tokens, self.tokens)
            cost = handler(o)
            t.complete(spec.queue, ins, cost, self.tokens)
            return self._advance(pc)
        t.seq()
        if m == "nop":
            pass
        elif m == "end":
            t.drain()
            if self.regions:
                raise _Stop(ErrorCode.REGION, f"end with region {self.regions[-1][0]} open")
            return None
        elif m == "li":
            self._set_reg(o["rd"], o["imm"])
        elif m == "addi":
            self._set_reg(o["rd"], self._reg(o["rs"]) + o["imm"])
        elif m in ("add", "sub", "mul", "cmp"):
            a, b = self._reg(o["rs1"]), self._reg(o["rs2"])
            if m == "cmp":
                v = int(_compare(o["cond"], a, b))
            else:
                v = a + b if m == "add" else a - b if m == "sub" else a * b
            self._set_reg(o["rd"], v)
        elif m == "br":
            a, b = self._reg(o["rs1"]), self._reg(o["rs2"])
            t.branch()  # the condition's step comes after the operands' (and their wait)
            if _compare(o["cond"], a, b):
                t.taken_branch()
                return self._branch(o["target"])
        elif m in ("loop", "loopr"):
            count = o["count"] if m == "loop" else self._reg(o["rs"])
            return self._loop(pc, count, o["end"])
        elif m == "sync":
            t.drain()
        elif m == "region":
            self._region(o["op"], o["id"])
        elif m == "ptsel":
            if o["set"] >= self.config.pt_sets:
                raise _Stop(ErrorCode.BAD_OPERAND, f"partition-table set {o['set']} does not exist")
            t.drain()
            self.pt_set = o["set"]
        elif m == "tinv":
            slot = o["slot"]
            if slot > self.config.tag_slots:
                raise _Stop(ErrorCode.BAD_OPERAND, f"tag slot {slot} does not exist")
            t.drain(("load",))
            if slot == 0:
                self.invalidate_tags()
            else:
                self.tags[slot] = None
        elif m == "misspec":
            self.counters["misspeculations"] += 1
        else:  # pragma: no cover - every SEQ spec has a branch above
            raise AssertionError(m)
        return self._advance(pc)

    def _advance(self, pc: int) -> int:
        nxt = pc + 1
        if self.loops and nxt == self.loops[-1][1]:
            top = self.loops[-1]
            if top[2] > 1:
                top[2] -= 1
                return top[0]
            self.loops.pop()
        return nxt

    def _branch(self, target: int) -> int:
        if target >= self.config.imem_depth:
            raise _Stop(ErrorCode.PC_BOUNDS, f"branch target {target} outside the bank")
        if self.loops and not self.loops[-1][0] <= target < self.loops[-1][1]:
            self.loops.pop()
            if self.loops and not self.loops[-1][0] <= target < self.loops[-1][1]:
                raise _Stop(ErrorCode.LOOP, f"branch to {target} leaves two loops at once")
        return target

    def _loop(self, pc: int, count: int, end: int) -> int:
        if end >= self.config.imem_depth + 1:
            raise _Stop(ErrorCode.PC_BOUNDS, f"loop end {end} outside the bank")
        if end <= pc + 1:
            raise _Stop(ErrorCode.LOOP, f"loop at {pc} has an empty body (end {end})")
        if self.loops and end >= self.loops[-1][1]:
            raise _Stop(ErrorCode.LOOP, f"loop ending at {end} does not end before its "
                        f"enclosing loop ({self.loops[-1][1]})")
        if len(self.loops) >= self.config.loop_depth:
            raise _Stop(ErrorCode.LOOP, f"loop stack depth {self.config.loop_depth} exceeded")
        if count == 0:
            return end
        self.loops.append([pc + 1, end, count])
        return pc + 1

    def _region(self, op: RegionOp, rid: int):
        c = self.counters
        if op == RegionOp.BEGIN:
            if len(self.regions) >= self.config.region_depth:
                raise _Stop(ErrorCode.REGION, f"region nesting deeper than "
                            f"{self.config.region_depth}")
            self._time.drain()
            self.regions.append((rid, self._time.now, self._snapshot()))
            c["regions"] += 1
            return
        if not self.regions or self.regions[-1][0] != rid:
            open_ = self.regions[-1][0] if self.regions else None
            raise _Stop(ErrorCode.REGION, f"region.end {rid} but the open region is {open_}")
        self._time.drain()
        _, start, snap = self.regions.pop()
        now = self._snapshot()
        rec = TraceRecord(rid, start, self._time.now,
                          *[now[i] - snap[i] for i in range(len(now))])
        if len(self.trace) >= self.config.trace_depth:
            c["trace_overflows"] += 1  # the record is lost, and the loss is counted
        else:
            self.trace.append(rec)

    def _snapshot(self):
        c, t = self.counters, self._time
        return (c["instructions"], c["macs"], c["dram_read_bytes"], c["dram_write_bytes"],
                sum(c["tag_hits"]), sum(c["tag_misses"]), t.stall, t.busy["load"],
                t.busy["store"], t.causes["busy_array"], t.causes["busy_vector"],
                t.causes["sp_conflicts"])

    # DMA ------------------------------------------------------------------------
    def _op_load(self, o):
        rows, nb = o["rows"], o["bytes"]
        dram = self._reg(o["dram"])
        stride = self._reg(o["stride"]) if o["stride"] else nb
        slot = o["tag"]
        if slot > self.config.tag_slots:
            raise _Stop(ErrorCode.BAD_OPERAND, f"tag slot {slot} does not exist")
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, rows * nb)
        key = (dram, rows, nb, stride, base)
        if slot and self.tags[slot] == key:
            self.counters["tag_hits"][o["p"]] += 1
            return self.cost.tag_hit, self.cost.tag_check  # (latency, issue)
        if slot:
            self.tags[slot] = None  # a failed transfer leaves the slot invalid
        cycles = self.cost.load_latency
        bursts, w = [], self.config.bus_bytes
        # (a beat's write claims its window's first word, which starts the row's DRAM
        # offset within a bus word before the row: _load_delay plays the same windows)
        writes = []
        for i in range(rows):
            addr = (dram + i * stride) & MASK32
            src = self._dram_row(addr, nb)
            self.sp[base + i * nb: base + (i + 1) * nb] = self.dram[src]
            writes.append((base + i * nb - addr % w, nb + addr % w))
            self.counters["dram_read_bytes"] += nb
            cycles += self.cost.dma_beats(addr, nb, self.config.bus_bytes)
            bursts += [beats for _, beats in burst_plan(addr, nb, self.config.bus_bytes)]
        self._time.causes["dram_read_bursts"] += len(bursts)
        waits = sum(self.dram_latency.read_gaps(bursts))  # a slow memory's (beyond a beat
        cycles += waits  # a cycle), in which no beat moves
        self._time.causes["stall_in_load"] += self.cost.load_latency - LOAD_UNTIMED + waits
        if slot:
            self.tags[slot] = key
            self.counters["tag_misses"][o["p"]] += 1
        self._uses(writes=writes)
        self._time.load_rows = (base, dram, stride, rows, nb)
        return cycles

    def _op_store(self, o):
        rows, nb = o["rows"], o["bytes"]
        dram = self._reg(o["dram"])
        stride = self._reg(o["stride"]) if o["stride"] else nb
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, rows * nb)
        bursts = []
        for i in range(rows):
            addr = (dram + i * stride) & MASK32
            dst = self._dram_row(addr, nb)
            self.dram[dst] = self.sp[base + i * nb: base + (i + 1) * nb]
            self.counters["dram_write_bytes"] += nb
            bursts += [beats for _, beats in burst_plan(addr, nb, self.config.bus_bytes)]
        self._uses(reads=[(base, rows * nb)])
        # A slow memory sets the pace of the data (it takes no beat while a response waits).
        data = (self.dram_latency.store_cycles(bursts) if self.dram_latency.write
                else self.cost.store_data(bursts))
        causes = self._time.causes
        causes["dram_write_bursts"] += len(bursts)
        causes["stall_out_store"] += self.cost.store_latency + data - sum(bursts) - STORE_UNTIMED
        return self.cost.store_latency + data

    # compute ----------------------------------------------------------------------
    def _op_cfg(self, o):
        f = CfgField(o["field"])
        _, lo, hi = isa.CFG_RANGE[f]
        if not lo <= o["value"] <= hi:
            raise _Stop(ErrorCode.BAD_OPERAND, f"cfg.{f.name.lower()} = {o['value']} "
                        f"outside [{lo}, {hi}]")
        self.cfg[f] = o["value"]
        return self.cost.cfg

    def _op_wload(self, o):
        k, n = o["k"], o["n"]
        if k > self.config.rows or n > self.config.cols:
            raise _Stop(ErrorCode.BAD_OPERAND, f"weight tile {k}x{n} exceeds the "
                        f"{self.config.rows}x{self.config.cols} array")
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, k * n)
        shadow = 1 - self.w_active
        w = np.zeros((self.config.rows, self.config.cols), dtype=np.int8)
        w[:k, :n] = self.sp[base: base + k * n].view(np.int8).reshape(k, n)
        self.w[shadow], self.wdims[shadow] = w, (k, n)
        self._uses(reads=[(base, k * n)])
        self._time.array_reads = self._window_banks(
            ("wload", base % self._bank_period, k, n), lambda: base + np.arange(k) * n)
        self._time.spans = ((base, base + k * n - 1), None)
        return k

    def _op_gemm(self, o):
        mrows = o["m"]
        active = 1 - self.w_active if o["swap"] else self.w_active
        k, n = self.wdims[active]
        if k == 0:
            raise _Stop(ErrorCode.BAD_OPERAND, "gemm without weights (no wload before it)")
        acc = self._acc_rows(self._reg(o["acc"]), mrows)
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        rows = self._sp_rows(o["p"], offset, mrows, k, self.cfg[CfgField.GEMM_STRIDE])
        x = self._sp_read(rows, k).astype(np.int64)
        self.w_active = active
        out = x @ self.w[active][:k, :n].astype(np.int64)
        if o["mode"] == GemmMode.ACCUMULATE:
            out = out + self.acc[acc, :n].astype(np.int64)
        self.acc[acc, :n] = wrap32(out)
        self.counters["macs"] += mrows * k * n
        step = int(rows[1] - rows[0]) if mrows > 1 else 0
        self._uses(reads=[(rows, k)])
        self._time.array_reads = self._window_banks(
            ("gemm", int(rows[0]) % self._bank_period, step % self._bank_period, mrows),
            lambda: rows)
        self._time.spans = (_span(rows, k), (acc.start, acc.stop - 1))
        return mrows

    def _op_dwload(self, o):
        cfg = self.config
        self._dw_present()
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, isa.DW_LOAD_WINDOWS * cfg.cols)
        nbytes = isa.DW_TAPS * cfg.cols
        self.dw_taps = self.sp[base: base + nbytes].view(np.int8).reshape(isa.DW_TAPS, cfg.cols)
        pad = base + isa.DW_PAD_WINDOW * cfg.cols
        self.dw_pad = int(self.sp[pad: pad + 1].view(np.int8)[0])
        bias = base + isa.DW_BIAS_WINDOW * cfg.cols
        self.dw_bias = self.sp[bias: bias + 4 * cfg.cols].view("<i4").astype(np.int64)
        self._uses(reads=[(base + np.arange(isa.DW_LOAD_WINDOWS) * cfg.cols, cfg.cols)])
        self._time.spans = ((base, base + isa.DW_LOAD_WINDOWS * cfg.cols - 1), None)
        return isa.DW_LOAD_WINDOWS

    def _op_dwconv(self, o):
        h, mo, s, kh, kw, n = o["h"], o["m"], o["s"], o["kh"], o["kw"], o["n"]
        k = isa.DW_KERNEL
        self._dw_present()
        rows_in, cols_in = (h - 1) * s + kh, (mo - 1) * s + kw
        if kh > k or kw > k:
            raise _Stop(ErrorCode.BAD_OPERAND, f"a {kh}x{kw} kernel exceeds the "
                        f"depthwise engine's {k}x{k}")
        self._cols(n)
        if rows_in > self.config.dw_rows:
            raise _Stop(ErrorCode.BAD_OPERAND, f"{rows_in} input rows exceed the depthwise "
                        f"engine's {self.config.dw_rows}")
        pt, pb, pl, pr = o["pt"], o["pb"], o["pl"], o["pr"]
        real_rows, real_cols = rows_in - pt - pb, cols_in - pl - pr
        if real_rows < 1 or real_cols < 1:
            raise _Stop(ErrorCode.BAD_OPERAND, f"the pads leave {real_rows} input rows "
                        f"and {real_cols} columns")
        acc = self._acc_rows(self._reg(o["acc"]), h * mo)
        pix = self.cfg[CfgField.GEMM_STRIDE] or n
        row = self.cfg[CfgField.IN_STRIDE] or n
        offset = self._reg(o["sp"])
        base = self._sp_range(o["p"], offset,
                              (real_rows - 1) * row + (real_cols - 1) * pix + n)
        # x[i, c, j]: window row i, column c, lane j (the pad value around the input)
        idx = (base + np.arange(real_rows)[:, None, None] * row
               + np.arange(real_cols)[None, :, None] * pix + np.arange(n)[None, None, :])
        x = np.full((rows_in, cols_in, n), self.dw_pad, dtype=np.int64)
        x[pt: pt + real_rows, pl: pl + real_cols] = self.sp[idx].view(np.int8)
        taps = self.dw_taps[:, :n].astype(np.int64).reshape(k, k, n)
        out = np.zeros((h, mo, n), dtype=np.int64)
        for i in range(kh):
            for c in range(kw):
                out += taps[i, k - kw + c] * x[i: i + (h - 1) * s + 1: s,
                                               c: c + (mo - 1) * s + 1: s]
        out = out.reshape(h * mo, n)
        if o["mode"] == GemmMode.ACCUMULATE:
            out = out + self.acc[acc, :n].astype(np.int64)
        else:
            out = out + self.dw_bias[None, :n]
        self.acc[acc, :n] = wrap32(out)
        self.counters["macs"] += h * mo * kh * kw * n
        self._uses(reads=[(idx[:, :, 0].reshape(-1), n)])
        self._time.spans = (_span(idx[:, :, 0].reshape(-1), n), (acc.start, acc.stop - 1))
        return rows_in * cols_in + h  # a window a cycle, then a cycle per output row

    def _dw_present(self):
        if not self.config.dw_rows:
            raise _Stop(ErrorCode.BAD_OPERAND, "this build has no depthwise engine")

    def _op_vbias(self, o):
        mrows, n = o["m"], o["n"]
        self._cols(n)
        acc = self._acc_rows(self._reg(o["acc"]), mrows)
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, 4 * n)
        bias = self.sp[base: base + 4 * n].view("<i4").astype(np.int64)
        self.acc[acc, :n] = wrap32(self.acc[acc, :n].astype(np.int64) + bias[None, :])
        self._uses(reads=[(base, 4 * n)])
        return self._vec_cycles(1, 4 * n) + mrows  # the bias words, then a row a cycle

    def _op_vreq(self, o):
        mrows, n = o["m"], o["n"]
        self._cols(n)
        acc = self._acc_rows(self._reg(o["acc"]), mrows)
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        rows = self._sp_rows(o["p"], offset, mrows, n, self.cfg[CfgField.OUT_STRIDE])
        c = self.cfg
        if o["tab"]:
            mul, shift = self.qtab_mul[:n], self.qtab_shift[:n]
        else:
            mul, shift = c[CfgField.QMUL], c[CfgField.QSHIFT]
        y = requantize(self.acc[acc, :n], mul, shift, c[CfgField.QZP],
                       c[CfgField.CLIP_LO], c[CfgField.CLIP_HI])
        self._sp_write(rows, y)
        self._uses(writes=[(rows, n)])
        self._time.vector_writes = (rows, n)
        self._time.spans = (_span(rows, n), (acc.start, acc.stop - 1))
        return self._vec_cycles(mrows, n)

    def _op_vreqb(self, o):
        mrows, n = o["m"], o["n"]
        self._cols(n)
        acc = self._acc_rows(self._reg(o["acc"]), mrows)
        rows = self._sp_rows(o["p"], self._reg(o["sp"]), mrows, n,
                             self.cfg[CfgField.OUT_STRIDE])
        words = n if o["col"] else mrows
        base = self._sp_range(o["pb"], self._reg(o["b"]), 4 * words)
        bias = self.sp[base: base + 4 * words].view("<i4").astype(np.int64)
        c = self.cfg
        if o["tab"]:
            mul, shift = self.qtab_mul[:n], self.qtab_shift[:n]
        else:
            mul, shift = c[CfgField.QMUL], c[CfgField.QSHIFT]
        biased = wrap32(self.acc[acc, :n].astype(np.int64)
                        + (bias[None, :] if o["col"] else bias[:, None]))
        y = requantize(biased, mul, shift, c[CfgField.QZP], c[CfgField.CLIP_LO],
                       c[CfgField.CLIP_HI])
        self._sp_write(rows, y)
        self._time.spans = (_span(rows, n), (acc.start, acc.stop - 1))
        if o["col"]:  # the bias words first, then an accumulator row a cycle
            self._uses(reads=[(base, 4 * n)], writes=[(rows, n)])
            self._time.vector_writes = (rows, n)
            self._time.vector_reads = self._vec_cycles(1, 4 * n)
            return self._vec_cycles(1, 4 * n) + self._vec_cycles(mrows, n)
        self._uses(reads=[(base + 4 * np.arange(mrows), 4)], writes=[(rows, n)])
        self._time.vector_writes = (rows, n)
        return self._vec_cycles(mrows, n)  # a bias word beside each accumulator row

    def _op_vqtab(self, o):
        n = o["n"]
        self._cols(n)
        offset = (self._reg(o["sp"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, isa.QTAB_ENTRY_BYTES * n)
        entries = self.sp[base: base + isa.QTAB_ENTRY_BYTES * n].reshape(n, -1)
        self.qtab_mul[:n] = entries[:, :4].copy().view("<i4").reshape(n)
        self.qtab_shift[:n] = entries[:, 4] & ((1 << isa.QTAB_SHIFT_BITS) - 1)
        self._uses(reads=[(base, isa.QTAB_ENTRY_BYTES * n)])
        return -(-isa.QTAB_ENTRY_BYTES * n // self.config.bus_bytes)

    def _op_vadd(self, o):
        mrows, n, c = o["m"], o["n"], self.cfg
        ra = self._sp_rows(o["pa"], self._reg(o["a"]), mrows, n, c[CfgField.IN_STRIDE])
        rb = self._sp_rows(o["pb"], self._reg(o["b"]), mrows, n, c[CfgField.IN_STRIDE])
        rd = self._sp_rows(o["pd"], self._reg(o["d"]), mrows, n, c[CfgField.OUT_STRIDE])
        a = self._sp_read(ra, n).astype(np.int64) - c[CfgField.ADD_ZP_A]
        b = self._sp_read(rb, n).astype(np.int64) - c[CfgField.ADD_ZP_B]
        s = a * c[CfgField.ADD_MUL_A] + b * c[CfgField.ADD_MUL_B]
        y = rshift_rne(s, c[CfgField.QSHIFT]) + c[CfgField.QZP]
        y = np.clip(y, c[CfgField.CLIP_LO], c[CfgField.CLIP_HI]).astype(np.int8)
        self._sp_write(rd, y)
        self._uses(reads=[(ra, n), (rb, n)], writes=[(rd, n)])
        delay, refused = self.cost.read_pairs(
            self._windows(ra, n), self._windows(rb, n), self._read_banks)
        self._time.causes["sp_conflicts"] += refused
        return self._vec_cycles(mrows, n) + delay

    def _op_vclip(self, o):
        mrows, n, c = o["m"], o["n"], self.cfg
        rs = self._sp_rows(o["ps"], self._reg(o["s"]), mrows, n, c[CfgField.IN_STRIDE])
        rd = self._sp_rows(o["pd"], self._reg(o["d"]), mrows, n, c[CfgField.OUT_STRIDE])
        x = self._sp_read(rs, n)
        self._sp_write(rd, np.clip(x, c[CfgField.CLIP_LO], c[CfgField.CLIP_HI]).astype(np.int8))
        self._uses(reads=[(rs, n)], writes=[(rd, n)])
        self._time.vector_writes = (rd, n)
        return self._vec_cycles(mrows, n)

    def _op_vmax(self, o):
        mrows, n, c = o["m"], o["n"], self.cfg
        count, tstride = c[CfgField.POOL_COUNT], c[CfgField.POOL_STRIDE]
        istride = c[CfgField.POOL_ISTRIDE]
        span = (mrows - 1) * istride + (count - 1) * tstride + n
        src = self._sp_range(o["ps"], self._reg(o["s"]), span)
        rd = self._sp_rows(o["pd"], self._reg(o["d"]), mrows, n, c[CfgField.OUT_STRIDE])
        idx = (src + np.arange(mrows)[:, None, None] * istride
               + np.arange(count)[None, :, None] * tstride + np.arange(n)[None, None, :])
        y = self.sp[idx].view(np.int8).max(axis=1)
        self._sp_write(rd, y)
        self._uses(reads=[(src, span)], writes=[(rd, n)])
        return self._vec_cycles(mrows * count, n)

    def _op_vargmax(self, o):
        n = o["n"]
        offset = (self._reg(o["s"]) + o["off"]) & MASK32
        base = self._sp_range(o["p"], offset, n)
        x = self.sp[base: base + n].view(np.int8)
        self._set_reg(o["rd"], int(np.argmax(x)))
        self._uses(reads=[(base, n)])
        return self._vec_cycles(1, n)

    def _uses(self, reads=(), writes=()):
        """Tell the timeline which scratchpad banks the instruction reads and writes:
        ``reads``/``writes`` are (absolute row addresses, bytes per row)."""
        # (a read takes whole windows: an unaligned one reaches into the next word)
        w = self.config.bus_bytes - 1
        self._time.footprint = (self._bank_mask((r, n + w) for r, n in reads),
                                self._bank_mask(writes))

    def _bank_mask(self, spans) -> int:
        """The banks (a mask) of the words that ``spans`` ((row addresses, bytes per
        row) each) touch: a row's words are consecutive, so a row of ``c`` words from
        word ``f`` on is the run of ``c`` bits at ``f % banks``, folded once. The mask
        of an array of rows is kept: a model's loops read the same tiles again."""
        cfg, mask = self.config, 0
        banks, bus = cfg.sp_banks, cfg.bus_bytes
        every = (1 << banks) - 1
        for rows, n in spans:
            if isinstance(rows, np.ndarray):
                key = (rows.dtype.str, rows.tobytes(), n)
                run = self._span_masks.get(key)
                if run is None:
                    rows = rows.astype(np.int64).reshape(-1)
                    first, last = rows // bus, (rows + n - 1) // bus
                    count = last - first + 1
                    run = every if count.size and count.max() >= banks else int(
                        np.bitwise_or.reduce(((1 << np.maximum(count, 0)) - 1)
                                             << (first % banks), initial=0))
                    if len(self._span_masks) >= 4096:
                        self._span_masks.clear()
                    self._span_masks[key] = run
            else:
                first, last = int(rows) // bus, (int(rows) + n - 1) // bus
                if last - first + 1 >= banks:
                    return every
                run = ((1 << max(last - first + 1, 0)) - 1) << (first % banks)
            if run == every:
                return every
            mask |= run
        return (mask | mask >> banks) & every

    def _window_banks(self, key: tuple, windows) -> np.ndarray:
        """:meth:`_row_banks` of the array's read windows ``windows()``, computed once
        per ``key``: banks depend on addresses modulo :attr:`_bank_period` only, and a
        model's gemms and wloads repeat a few shapes."""
        banks = self._window_banks_cache.get(key)
        if banks is None:
            banks = self._window_banks_cache[key] = self._row_banks(windows())
            banks.flags.writeable = False  # (shared by every instruction of the key)
        return banks

    def _windows(self, rows, n: int) -> list[int]:
        """Absolute addresses of the windows the vector unit reads ``n``-byte rows in."""
        w = self.config.bus_bytes
        return [int(r) + k for r in rows for k in range(0, n, w)]

    def _read_banks(self, addr: int) -> int:
        """The scratchpad banks (a bit mask) a read window at ``addr`` needs."""
        cfg = self.config
        words = cfg.sp_bytes // cfg.bus_bytes
        word = addr // cfg.bus_bytes
        need = 1 << (word % cfg.sp_banks)
        if addr % cfg.bus_bytes:
            need |= 1 << ((word + 1) % words % cfg.sp_banks)
        return need

    def _row_banks(self, rows) -> np.ndarray:
        """The scratchpad banks (bit masks) of the read windows at addresses ``rows``."""
        cfg = self.config
        words = np.asarray(rows, dtype=np.int64) // cfg.bus_bytes
        second = (words + 1) % (cfg.sp_bytes // cfg.bus_bytes) % cfg.sp_banks
        unaligned = np.asarray(rows, dtype=np.int64) % cfg.bus_bytes != 0
        return (1 << (words % cfg.sp_banks)) | np.where(unaligned, 1 << second, 0)

    def _vec_cycles(self, rows: int, n: int) -> int:
        """Cycles of the vector unit's walk over ``rows`` rows of ``n`` bytes: one
        scratchpad window (a bus word) a cycle."""
        return rows * -(-n // self.config.bus_bytes)


def _span(rows, n: int) -> tuple[int, int]:
    """First and last byte of ``n``-byte rows at ``rows`` (row addresses in order)."""
    r = np.atleast_1d(rows)
    return int(r[0]), int(r[-1]) + n - 1


def _meet(a, b) -> bool:
    """Whether two inclusive (first, last) ranges share an element (None: no range)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _compare(cond: Cond, a: int, b: int) -> bool:
    sa, sb = _signed(a), _signed(b)
    return {
        Cond.ALWAYS: True, Cond.EQ: a == b, Cond.NE: a != b, Cond.LT: sa < sb,
        Cond.GE: sa >= sb, Cond.LTU: a < b, Cond.GEU: a >= b,
    }[Cond(cond)]


def _signed(v: int) -> int:
    v &= MASK32
    return v - (1 << 32) if v >> 31 else v


# The counters by cause: cycles of an instruction's cost model that the RTL's busy and
# stall signals do not see (the queue's steps before and after the engine's).
LOAD_UNTIMED = 3  # of a load's latency: the DMA is not busy yet, or no longer
STORE_UNTIMED = 2  # of a store's latency and data cycles, less its beats
# An engine is busy from an instruction's start - [0] to its end + [1] (cycles).
ENGINE_BUSY = {"gemm": (2, 0),  # (an idle array takes a gemm gemm_intake before its start)
                "wload": (0, 0), "vector": (0, -1), "depthwise": (0, -1)}

# The counter by cause of a token wait: (queue, popped flag, engine) -> counter.
_TOKEN_WAIT_CAUSE = {
    **{(q, flag, e): name for (q, flag), name in (
        (("load", Token.POP_NEXT), "stall_out_load"),
        (("store", Token.POP_PREV), "stall_in_store")) for e in ("array", "vector")},
    **{("compute", flag, e): f"{way}_{e}" for flag, way in (
        (Token.POP_PREV, "stall_in"), (Token.POP_NEXT, "stall_out"))
       for e in ("array", "vector")},
}
_VECTOR_OPS = ("vbias", "vreq", "vreqb", "vadd", "vclip", "vmax", "vargmax", "vqtab")
# The depthwise engine shares the accumulator and the GEMM engine's scratchpad port,
# and takes turns with both engines as the vector unit does.
_DW_OPS = ("dwload", "dwconv")


@dataclass
class _LoadTiming:
    """How a load was timed, kept while a vector op timed after it may still hold its
    beats back (:meth:`_Timeline._replay_loads`)."""

    queued: int  # when its queue could have started it, tokens and queue aside
    popped: list  # (flag, time) of the tokens it popped
    ready: int  # ... and with its tokens in
    free_before: int  # when the load queue was free for it
    nominal: int | tuple  # its cycles alone (a tag hit: its (latency, issue))
    rows: tuple | None  # its load_rows (None: a tag hit)
    start: int = 0
    delay: int = 0  # cycles the vector unit's writes held its beats back
    conflicts: int = 0  # ... refusals of its beats (sp_conflicts)
    end: int = 0
    free: int = 0  # when the queue could start the next load
    pushes: list = field(default_factory=list)  # [channel, token time] it pushed
    entry: tuple | None = None  # its entry in the queue's starts
    use: tuple | None = None  # its window in sp_use["dma_write"]


class _Timeline:
    """Discrete-event model of the decoupled queues (see :class:`CostModel`).

    The sequencer dispatches one instruction per `dispatch` cycles into bounded queues; each
    queue runs in order; tokens carry the completion time of the instruction that
    pushed them.
    """

    def __init__(self, config: NPUConfig, cost: CostModel, dram_latency: DramLatency):
        self.config, self.cost, self.dram_latency = config, cost, dram_latency
        self.now = 0  # sequencer time
        self.free = {"load": 0, "compute": 0, "store": 0}  # next start possible
        self.done = {"load": 0, "compute": 0, "store": 0}  # last completion
        # (start, mnemonic) of each queue's instructions, for the bounded queue depth
        self.starts = {q: deque() for q in self.free}
        self.busy = {q: 0 for q in self.free}
        self.reg_ready = [0] * isa.NUM_REGS
        self.array_done = 0  # completion of the last GEMM (results in the accumulators)
        self.vector_done = 0  # completion of the last vector op (the vector unit is idle)
        self.dw_done = 0  # completion of the last depthwise op (its engine is idle)
        self.wload_done = 0  # the last wload's rows are in
        # ... and the weight loader free for the next (earlier than wload_done for a
        # wload whose reads a streaming gemm made room for: it ends with that gemm), as
        # it was when the wload being timed came to the array
        self.loader_free_before = self.loader_free = 0
        self.wload_released = 0  # a swap gemm may start streaming on them
        self.wload_pending = False  # a wload came after the latest gemm
        self.last_compute = ""  # the compute queue's last instruction
        self.retired = -1  # when the compute queue's last instruction retired
        self.pushed = 0  # when its retirement reached the queue's token counters
        # The latest gemms' row reads: [grant cycle of each row, banks of each row], and
        # the banks of each read window of the wload or gemm being timed.
        self._streams: list[list] = []
        self._beats: dict[tuple, list] = {}  # load_rows -> _load_beats
        self.array_reads = None
        self._wload_reads = (0, [])  # the latest wload's first read cycle, banks read
        # the channels the latest gemm pushed its token on, and the token's time
        self._gemm_pushes: tuple[list, int] = ([], 0)
        self.gemm_end = 0  # when the latest gemm's results are in
        self.front = 0  # the weight bank of the latest gemm; a wload fills the other
        self.bank_free = [0, 0]  # when the rows of the gemms on each bank have left the array
        self.stall = 0
        self.causes = dict.fromkeys(CAUSE_COUNTERS, 0)  # firmware.regs.CAUSE_COUNTERS
        self._busy_until = {"array": 0, "vector": 0}  # the engines' busy intervals' end
        self._token_waits: list[tuple[Token, int]] = []  # of the instruction being timed
        self._front = 0  # when the instruction being timed is at its queue's front
        self._after_vargmax = self._repeated = 0  # see _next_instruction
        self.accepted = 0  # when an engine took the compute queue's last instruction
        self._gemm_start = self._gemm_rows_end = 0  # the latest gemm's start, last row
        # Scratchpad use, per kind of access, of the instructions that may still overlap
        # a later one: (start, end, banks) of DMA reads (stores) and writes (loads), compute
        # reads and writes. The DMA's ports come last in the scratchpad's priority, so
        # where a transfer overlaps compute of its kind, the RTL may delay the transfer
        # by bank conflicts the cost model does not play out: the run is `contended`.
        self.sp_use: dict[str, list[tuple[int, int]]] = {
            k: [] for k in ("dma_read", "dma_write", "compute_read", "compute_write")}
        self.contended = False
        self.inexact_causes: dict[str, int] = {}  # what made it contended, how often
        self.footprint = (0, 0)  # banks (masks) the instruction being timed reads, writes
        # The vector unit's scratchpad writes, one window a cycle: (first cycle, banks of
        # each write) of the vreq, vreqb and vclip ops that a later load may meet. Its
        # write port comes before the DMA's, so a load's beat waits while it writes the
        # same bank (played out in :meth:`_load_delay`).
        self.vector_plan: list[tuple[int, list[int]]] = []
        # The loads a vector op timed later may still hold back (they write beside it),
        # in queue order, and the load being timed.
        self.loads: list[_LoadTiming] = []
        self._load: _LoadTiming | None = None
        self.vector_writes = None  # (row addresses, bytes) of the vector op being timed
        self.load_rows = None  # (sp base, dram, stride, rows, bytes) of the load being timed
        self._start = self._ready = 0  # of the queue instruction being dispatched
        # Two accumulator read ports: the scratchpad bytes (first, last) a wload or gemm
        # reads or a vreq/vreqb writes, and its accumulator rows (None for a wload), of
        # the instruction being timed; and of the vector unit's latest instruction
        # when it is a vreq/vreqb that an array command may run beside, with its start,
        # end and scratchpad banks (None otherwise).
        self.spans = None
        self.beside = None
        # The cycles from its start in which the vector op being timed reads the
        # scratchpad, where it reads only at first (None: throughout).
        self.vector_reads = None
        self.array_free = 0  # when the queue could start the next array command

    def _wait(self, t: int, cause: str = "stall_in_seq", dispatching: int = 0):
        """Wait until ``t``; its first ``dispatching`` cycles are not a stall."""
        if t > self.now:
            stall = max(0, t - self.now - dispatching)
            self.stall += stall
            self.causes[cause] += stall
            self.now = t

    def _next_instruction(self):
        # The sequencer repeats its operands step after dispatching a vargmax.
        self.now += self._after_vargmax
        self._repeated, self._after_vargmax = self._after_vargmax, 0

    def seq(self):
        self._next_instruction()
        self.now += self.cost.dispatch

    def branch(self):
        self.now += self.cost.branch

    def taken_branch(self):
        self.now += self.cost.branch_taken

    def read_reg(self, r: int):
        # A vargmax's result reaches a dispatch a cycle into its wait (its operands
        # step takes the value written back), unless that step is a repeated one.
        self._wait(self.reg_ready[r], dispatching=1 - self._repeated)

    def drain(self, queues=("load", "compute", "store")):
        # A queue that has completed nothing in this run (done 0) was idle all along.
        self._wait(max((self.done[q] + self.cost.drain for q in queues if self.done[q]),
                       default=0))

    def begin(self, queue: Queue, tokens: Token, channels):
        self._next_instruction()
        q = queue.value
        starts = self.starts[q]
        if len(starts) >= self.config.queue_depth:  # queue full: its fire step waits
            # (the steps before it ran meanwhile)
            oldest, kind = starts.popleft()
            if kind == "cfg after array" and oldest - self.cost.fire_overlap > self.now:
                # A cfg waiting for the array frees its entry as the array's commands
                # end, by cycles the model does not play out. (An array command's entry
                # frees as the array takes it: see _accept.)
                self._flag("queue full behind a cfg waiting for the array")
            self._wait(oldest - self.cost.fire_overlap, "stall_out_seq")
        ready = self.now + self.cost.queue_start
        # its queue's head from then on: the compute queue moves on as an engine
        # accepts a command, before the engine starts it
        front = self._front = max(ready, self.accepted if q == "compute" else self.free[q])
        self._token_waits = []
        for flag in (Token.POP_PREV, Token.POP_NEXT):
            if tokens & flag:
                ch = isa.token_channel(queue, flag)
                if not channels[ch]:
                    raise _Stop(ErrorCode.TOKEN_DEADLOCK, f"pop on {ch} with no token pushed")
                token = channels[ch].popleft()
                ready = max(ready, token)
                self._token_waits.append((flag, token - front))
        self._ready = ready  # when it could start if its queue were idle
        self._start = max(ready, self.free[q])
        if q == "load":
            self._load = _LoadTiming(
                self.now + self.cost.queue_start,
                [(flag, wait + front) for flag, wait in self._token_waits], ready,
                self.free[q], 0, None)
        self.now += self.cost.dispatch_queue

    def complete(self, queue: Queue, ins: isa.Instr, cycles: int | tuple, channels):
        q, m, c = queue.value, ins.mnemonic, self.cost
        start = self._start
        late = False
        vector_done = self.vector_done
        banks = self.footprint[0]  # (the banks a vreqb reads, for _runs_beside)
        spans, reads = self.spans, self.vector_reads
        beside = m in ("gemm", "wload", *_DW_OPS) and self._runs_beside()
        clear = vector_done  # when the vector unit no longer holds this instruction up
        if beside:
            # It starts while the vector unit requantizes: its queue moves on as the
            # vector unit takes the vreq, and the hazard is clear from then on (once
            # the depthwise engine is idle).
            clear = max(self._ready, self.accepted, self.dw_done)
            if m in _DW_OPS:
                start = clear
            else:
                self.vector_done = clear
                start = max(clear, self.array_free)
        if m == "gemm":
            # The array takes a command only while the vector unit is idle.
            start = max(start, max(self._ready, self.vector_done) + c.gemm_intake)
            if ins.ops["swap"]:
                start = max(start, self.wload_released)
                self.front ^= 1
            stream = [start + np.arange(cycles), self.array_reads]
            # (on the old weights, it may stream while the latest wload reads)
            reads, banks = self._wload_reads
            if self.wload_pending and not ins.ops["swap"] and start <= reads + len(banks):
                # where its first rows meet them, or it starts in the cycle after the
                # last read (a one-row wload's, compute queue programs), the RTL may
                # start it a cycle later than the model: that is not played out.
                self._flag("gemm on old weights beside a wload's reads")
            self.wload_pending = False
            issue = cycles + self._hold_up([stream], reads, banks)
            latency = issue + (self.config.rows + self.config.cols + c.array_stages
                               + c.sp_read - 3)
            self._streams = [*self._streams[-1:], stream]
        elif m == "wload":
            start, latency = self._wload(start, cycles)
            # It overlaps streaming: it takes the issue slot, and a gemm after it still
            # streams after the rows of the gemm before it.
            issue = max(1, self._gemm_rows_end - start) if self.last_compute == "gemm" else 1
        elif m == "cfg":  # the vector unit holds the cfg registers: it waits for the array
            # (and a gemm after it waits for the vector unit to be idle again)
            after_array = max(self.array_done, self.wload_done) + c.handoff
            late = after_array >= start  # its completion then reaches the queue later
            start = max(start, after_array, vector_done)
            issue = latency = cycles
        elif m in _VECTOR_OPS or m in _DW_OPS:
            # ... and the vector unit only while the array is idle (wloads too).
            start = max(start, max(self.array_done, self.wload_done) + c.handoff, clear)
            issue = latency = cycles + {"vadd": c.vadd_latency, "vbias": c.vbias_latency,
                                        "vargmax": c.vargmax_latency,
                                        "vqtab": c.vqtab_latency,
                                        "dwload": c.dwload_latency,
                                        "dwconv": c.dwconv_latency}.get(m, c.vector_latency)
        elif q == "load":
            self._load.nominal, self._load.rows = cycles, self.load_rows
            latency, issue = self._time_load(self._load, start)
        elif isinstance(cycles, tuple):  # a tag hit
            latency, issue = cycles
        elif q == "store":
            latency, issue = cycles, cycles + c.dma_gap
        else:
            issue = latency = cycles
        end = start + latency
        if q == "compute":
            self.last_compute = m
        self.free[q] = start + issue
        retire, token = end, end + c.token
        if q == "compute":
            # Completions retire in program order, one a cycle: the queue's idleness and
            # a push wait for everything before it in the queue. An engine's completion
            # reaches the queue `token` after its end, a cfg's at once (unless it
            # waited for the array), and the push is counted then.
            retire = self.retired = max(end, self.retired + 1)
            slow = m != "cfg" or late
            token = self.pushed = max(end + slow * c.token, self.pushed + 1)
        self.done[q] = max(self.done[q], retire)
        # (a DMA queue is busy until its transfer's end, then takes the next one)
        busy = latency if q != "compute" else issue if m != "wload" else cycles
        if beside:  # the queue is busy with the vreq until it ends
            busy -= max(0, min(vector_done, start + busy) - start)
        self.busy[q] += busy
        self._count_causes(q, m, start, end)
        # An entry leaves its queue as its engine takes the instruction, which for an
        # array command may be before it starts (the array queues a gemm behind a
        # streaming one, and a wload beside it).
        taken = self._accept(m, start) if q == "compute" else start
        self.starts[q].append((taken, "cfg after array" if m == "cfg" and late else m))
        used = None
        if not isinstance(cycles, tuple):  # a tag hit moves no data
            used = self._use_scratchpad(q, *self._port_windows(q, m, start, end, cycles),
                                        planned=self.vector_writes is not None)
        if q == "load":
            self._keep_load(self.starts[q][-1], used if self._load.rows else None)
        if self.vector_writes is not None:
            self._replay_loads(*self._plan_vector_writes(end, *self.vector_writes))
        self.footprint = (0, 0)
        self.vector_writes = self.load_rows = self.spans = self.vector_reads = None
        if m == "gemm":
            self.gemm_end = end
            self.array_done = max(self.array_done, end)
            self.bank_free[self.front] = max(self.bank_free[self.front], end - c.array_exit)
        elif m == "wload":
            self.wload_done = end
            self.wload_pending = True  # until a gemm (with swap or not) follows it
            self.wload_released = end - (c.sp_read - 1) + (c.wload_one_row if cycles == 1 else 0)
        if m in ("gemm", "wload"):
            self.vector_done = vector_done
            self.array_free = self.free[q]
        elif m in _DW_OPS:  # (a vreq it runs beside may end after it)
            self.vector_done = max(vector_done, end)
            self.dw_done = end
        elif m in _VECTOR_OPS or m == "cfg":
            self.vector_done = end
            self.beside = None
            if m in ("vreq", "vreqb") and self.config.acc_ports == 2:
                until = end if reads is None else start + reads + c.vector_read_lag
                self.beside = (*spans, until, end, banks)
            if m == "vargmax":
                self.reg_ready[ins.ops["rd"]] = end + c.reg_writeback
                self._after_vargmax = 1
        pushes = []
        for flag in (Token.PUSH_PREV, Token.PUSH_NEXT):
            if ins.tokens & flag:
                channels[isa.token_channel(queue, flag)].append(token)
                pushes.append(channels[isa.token_channel(queue, flag)])
        if q == "load":
            self.loads[-1].pushes = [[ch, token] for ch in pushes]
        if m == "gemm":  # (a wload that takes its reads from it delays them)
            self._gemm_pushes = (pushes, token)

    def _flag(self, cause: str):
        """Note that the run's cycles are an estimate, and why."""
        self.contended = True
        self.inexact_causes[cause] = self.inexact_causes.get(cause, 0) + 1

    def _runs_beside(self) -> bool:
        """Whether the wload, gemm, dwload or dwconv being timed may start while the
        vector unit runs its latest instruction (two accumulator read ports): that one
        is a vreq or vreqb still running, whose written bytes the command does not
        read and whose accumulator rows a gemm or dwconv does not touch. Where the
        command may read the banks a vreqb reads its bias words from while it reads
        them, the array's (or depthwise engine's) reads win and the vreqb's wait,
        cycles the model does not play out: the run is flagged (writes
        are arbitrated apart from reads, and a vreqb.col's bias reads are over before
        the command can start)."""
        if self.beside is None or self.spans is None:
            return False
        sp, acc, reads_until, end, banks = self.beside
        my_sp, my_acc = self.spans
        earliest = max(self._ready, self.accepted)
        if end <= earliest or _meet(sp, my_sp) or _meet(acc, my_acc):
            return False
        if banks & self.footprint[0] and earliest < reads_until:
            self._flag("array beside a vreqb reading its banks")
        return True

    def _count_causes(self, q: str, m: str, start: int, end: int):
        """Count an instruction's token waits and its engine's busy cycles into the
        counters by cause."""
        engine = "vector" if m in _VECTOR_OPS or m == "cfg" else "array"
        if self._token_waits:
            for flag, wait in self._token_waits:
                self.causes[_TOKEN_WAIT_CAUSE[q, flag, engine]] += max(0, wait)
            self._token_waits = []
        if q != "compute" or m == "cfg":  # a cfg never makes the vector unit busy
            return
        before, after = ENGINE_BUSY[m if m in ("gemm", "wload") else
                                    "depthwise" if m in _DW_OPS else "vector"]
        first, last = start - before, end + after
        if m == "wload":  # a gemm it ran beside (and may have held up) ends later
            last = max(last, self.gemm_end)
        until = self._busy_until[engine]
        self.causes["busy_" + engine] += max(0, last - max(first, until))
        self._busy_until[engine] = max(until, last)

    def _accept(self, m: str, start: int) -> int:
        """Note when the compute queue's next entry is at its front: a cycle after an
        engine took the instruction that starts at ``start`` (a gemm while the gemm
        before it streams: the array queues one; a wload once the wload before it
        is done; anything else as it starts). Returns when the instruction's entry
        left the queue (a gemm queued behind a streaming one: as that one took over
        the stream, a cycle before it starts)."""
        front = max(self._front, self._ready)  # ... and its tokens are in
        leaves = None
        if m in ("gemm", "wload"):
            # an array command waits at the front while the vector unit runs (but
            # beside a vreq: then vector_done is when the hazard clears)
            front = max(front, self.vector_done)
        if m == "gemm":
            taken = front
            if self._gemm_rows_end > front:  # queued behind the gemm that streams
                taken = max(front, self._gemm_start)
                if self._gemm_start > front:
                    leaves = self._gemm_start - 1
            taken = min(taken, start - self.cost.gemm_intake)
            self._gemm_start, self._gemm_rows_end = start, self.free["compute"]
        elif m == "wload":
            taken = min(start, max(front, self.loader_free_before + 1))
        else:
            taken = start
        taken = taken if leaves is None else min(taken, leaves)
        self.accepted = taken + 1
        return taken

    def _port_windows(self, q: str, m: str, start: int, end: int, cycles: int):
        """The cycles, with a margin, in which an instruction may read and write the
        scratchpad: ((start, end) of its reads, (start, end) of its writes)."""
        c, pad = self.cost, 2
        if m == "gemm":
            # (a wload handed over while it streams pushes its last rows back by up to k)
            reads, writes = (start, start + cycles + self.config.rows), (0, 0)
        elif m == "wload":
            reads, writes = (start, start + cycles + c.wload_latency + 1), (0, 0)
        elif q == "compute":  # a vector op walks its reads first and writes last
            reads, writes = (start, start + cycles + 3), (end - cycles - 3, end)
        elif q == "load":
            reads, writes = (0, 0), (start + c.load_latency - 3, end)
        else:  # a store reads ahead of its data beats, before the write response
            reads, writes = (start, end - 4), (0, 0)
        return tuple((a - pad, b + pad) if a < b else (0, 0) for a, b in (reads, writes))

    def _use_scratchpad(self, q: str, reads, writes, planned: bool = False):
        """Note the scratchpad banks the instruction uses in the windows ``reads`` and
        ``writes`` ((start, end) cycles); return a load's entry (None: none noted). A
        vector op whose writes are ``planned`` (:meth:`_plan_vector_writes`) leaves
        them out: the loads beside them play them out beat by beat (:meth:`_load_delay`,
        :meth:`_replay_loads`)."""
        if self.contended:  # (the run's first cause is named: the rest need no search)
            return None
        who = "compute" if q == "compute" else "dma"
        rival = "dma" if who == "compute" else "compute"
        horizon = min(self.free.values()) - 8  # later instructions use no earlier cycles
        used = None
        for kind, mask, (start, end) in zip(("read", "write"), self.footprint,
                                            (reads, writes), strict=True):
            if not mask or start >= end or (planned and kind == "write"):
                continue
            if any(s < end and start < e and mask & b
                   for s, e, b in self.sp_use[f"{rival}_{kind}"]):
                self._flag(f"{who} {kind} beside {rival} {kind}")
                return None
            uses = self.sp_use[f"{who}_{kind}"]
            used = (start, end, mask)
            uses.append(used)
            if len(uses) > 64:
                uses[:] = [u for u in uses if u[1] > horizon]
        return used

    def _word_banks(self, lo, hi) -> int:
        """The banks (a mask) of the words holding scratchpad bytes ``lo`` to ``hi``."""
        cfg = self.config
        return ((1 << (lo // cfg.bus_bytes % cfg.sp_banks))
                | (1 << (hi // cfg.bus_bytes % cfg.sp_banks)))

    def _plan_vector_writes(self, end: int, rows, n: int):
        """Note the write windows of a vector op that ends at ``end``: one a cycle, in
        row order, the last ``vector_write_end`` before ``end``."""
        w = self.config.bus_bytes
        banks = [self._word_banks(int(r) + k, int(r) + min(n, k + w) - 1)
                 for r in np.atleast_1d(rows) for k in range(0, n, w)]
        first = end - self.cost.vector_write_end - len(banks)
        horizon = min(self.free.values()) - 8
        self.vector_plan = [p for p in self.vector_plan if p[0] + len(p[1]) > horizon]
        self.vector_plan.append((first, banks))
        return first, first + len(banks) - 1

    def _time_load(self, rec: _LoadTiming, start: int) -> tuple[int, int]:
        """Latency and issue cycles of the load ``rec`` started at ``start``, its beats
        held back by the vector unit's writes; note them in ``rec`` and the counters."""
        delay = conflicts = 0
        if rec.rows is None:  # a tag hit
            latency, issue = rec.nominal
        else:
            if self.vector_plan:
                self.load_rows = rec.rows
                before = self.causes["sp_conflicts"]
                delay = self._load_delay(start, rec.nominal)
                conflicts = self.causes["sp_conflicts"] - before
            latency = rec.nominal + delay
            issue = latency + self.cost.dma_gap
            if delay and self.dram_latency.read:
                # (the RTL holds the slow memory's bursts back with the beats; the play
                # only shifts the beats: the FC autoencoder's GEMV steps end 62 later)
                self._flag("a load held back by vector writes behind a slow dram")
        # (beats held back by the writes; a load timed again replaces its figures)
        self.causes["stall_in_load"] += delay - rec.delay
        self.causes["sp_conflicts"] -= rec.conflicts
        rec.start, rec.delay, rec.conflicts = start, delay, conflicts
        rec.end, rec.free = start + latency, start + issue
        return latency, issue

    def _keep_load(self, entry: tuple, use: tuple | None):
        """Keep the load just timed (its queue entry and scratchpad window ``use``)
        while a vector op timed later may write beside it: the vector ops start after
        the vector unit's latest end."""
        rec = self._load
        rec.entry, rec.use = entry, use
        self.loads = [r for r in self.loads if r.end >= self.vector_done] + [rec]

    def _replay_loads(self, first: int, last: int):
        """Time again the loads the vector op just timed writes beside (in cycles
        ``first`` to ``last``; it comes after them in program order), and the loads
        queued after them."""
        c = self.cost
        lead = c.load_latency - c.load_write_lead
        hit = next((i for i, r in enumerate(self.loads) if r.rows is not None
                    and r.start + lead <= last and first <= r.end), None)
        if hit is None:
            return
        free = self.loads[hit].free_before
        for rec in self.loads[hit:]:
            old_start, old_latency = rec.start, rec.end - rec.start
            old_front = max(rec.queued, rec.free_before)
            rec.free_before = free
            latency, _ = self._time_load(rec, max(rec.ready, free))
            self.busy["load"] += latency - old_latency
            for flag, t in rec.popped:
                self.causes[_TOKEN_WAIT_CAUSE["load", flag, "array"]] += \
                    max(0, t - max(rec.queued, free)) - max(0, t - old_front)
            if rec.start != old_start:
                self._move_load_entry(rec)
            for push in rec.pushes:
                self._move_token(push, rec.end + c.token)
            if rec.use is not None:
                uses = self.sp_use["dma_write"]
                at = next((i for i, u in enumerate(uses) if u is rec.use), None)
                _, window = self._port_windows("load", "load", rec.start, rec.end, 0)
                rec.use = (*window, rec.use[2])
                if at is not None:
                    uses[at] = rec.use
            free = rec.free
        self.free["load"] = free
        self.done["load"] = max(self.done["load"], self.loads[-1].end)

    def _move_load_entry(self, rec: _LoadTiming):
        """Move the queue entry of a load timed again to its new start, while it is
        in the queue."""
        starts = self.starts["load"]
        at = next((i for i, e in enumerate(starts) if e is rec.entry), None)
        if at is not None:
            rec.entry = starts[at] = (rec.start, "load")

    def _move_token(self, push: list, token: int):
        """Move a load's pushed token (``push``: [channel, time]) to ``token`` (no
        instruction timed already took it: that one came after the vector op)."""
        channel, old = push
        if token == old:
            return
        at = next((i for i in range(len(channel) - 1, -1, -1) if channel[i] == old), None)
        assert at is not None, "a load timed again after its token was taken"
        channel[at] = push[1] = token

    def _load_delay(self, start: int, cycles: int) -> int:
        """Cycles by which the vector unit's writes (:attr:`vector_plan`) hold back a
        load that starts at ``start`` and takes ``cycles`` alone: each beat waits while
        the vector unit writes one of its banks, and the beats after it follow it; a
        slow memory's waits before bursts (:meth:`DramLatency.read_gaps`) place them."""
        c = self.cost
        first = start + c.load_latency - c.load_write_lead
        last = start + cycles
        busy: dict[int, int] = {}
        for t0, banks in self.vector_plan:
            if t0 < last + len(banks) and first < t0 + len(banks):
                for i, b in enumerate(banks):
                    busy[t0 + i] = busy.get(t0 + i, 0) | b
        if not busy:
            return 0
        t = first - 1
        beats, alone = self._load_beats(self.load_rows)
        for nominal, mask in beats:
            t = max(t + 1, first - 1 + nominal)
            while busy.get(t, 0) & mask:
                t += 1
                self.causes["sp_conflicts"] += 1  # the DMA's write port refused
        return t - (first - 1 + alone)

    def _load_beats(self, load_rows: tuple) -> tuple[list[tuple[int, int]], int]:
        """Each beat of a load (:attr:`load_rows`) as (its cycle alone, counted from
        the cycle before its first beat's; the banks it writes), and the last beat's
        cycle alone, worked out once per load: a slow memory's waits before bursts
        (:meth:`DramLatency.read_gaps`) place them."""
        hit = self._beats.get(load_rows)
        if hit is not None:
            return hit
        base, dram, stride, rows, nb = load_rows
        w, nominal, beats = self.config.bus_bytes, 0, []
        plans = [burst_plan((dram + i * stride) & MASK32, nb, w) for i in range(rows)]
        gaps = iter(self.dram_latency.read_gaps([n for p in plans for _, n in p]))
        for i, plan in enumerate(plans):
            row, off = base + i * nb, (dram + i * stride) % w
            first_beat = 0  # of the burst, in the row
            for _, count in plan:
                nominal += next(gaps)
                for b in range(first_beat, first_beat + count):
                    # The beat's window starts at its DRAM lane 0's byte: the write
                    # claims that word, strobed or not, and the word of its last byte.
                    hi = min(nb, (b + 1) * w - off) - 1
                    nominal += 1
                    beats.append((nominal, self._word_banks(row + b * w - off, row + hi)))
                first_beat += count
        hit = self._beats[load_rows] = (beats, nominal)
        return hit

    def _wload(self, start: int, k: int) -> tuple[int, int]:
        """Start and latency of a ``k``-row wload that its queue could start at ``start``.

        The array takes it once the loader is free (beside a streaming gemm, too), and
        its reads go out a cycle later, one a cycle through the loader's own scratchpad
        port, which goes before the gemms' (hdl.top.SP_PORTS): a streaming gemm's row
        waits while one of them takes its banks (:meth:`_hold_up`)."""
        c, q = self.cost, "compute"
        # (the queue's start waits for the rows of a gemm before it: the array does not)
        after_array = self.last_compute in ("gemm", "wload")
        taken = max(max(self._ready, self.accepted) if after_array else start,
                    self.wload_done + c.handoff)
        # It overwrites the bank of the gemms before the last swap: their rows must be out.
        reads = max(taken, self.bank_free[self.front ^ 1]) + c.wload_latency
        start = reads - c.wload_latency
        self._wload_reads = (reads, self.array_reads)
        delay = self._hold_up(self._streams, reads, self.array_reads)
        if delay:  # the gemms it held up end later (the latest, queued, takes over later)
            self._gemm_start = int(self._streams[-1][0][0])
            self._gemm_rows_end += delay
            self.gemm_end += delay
            self.array_done = max(self.array_done, self.gemm_end)
            self.retired = max(self.retired, self.gemm_end)
            self.done[q] = max(self.done[q], self.gemm_end)
            self.bank_free[self.front] = self.gemm_end - c.array_exit
            self._delay_gemm_tokens(delay)
        # Done when its last row's data is in, sp_read - 1 after a swap gemm may start.
        self.loader_free_before = self.loader_free
        self.loader_free = start + k + c.wload_latency + c.sp_read - 1
        return start, k + c.wload_latency + c.sp_read - 1

    def _hold_up(self, streams, reads: int, banks) -> int:
        """Play out the rows of gemms (``streams``, in order: [grant cycles, banks]
        of each row) that a wload whose reads (windows on ``banks``) go out from cycle
        ``reads`` on meets: a row waits while the wload's read of that cycle takes one
        of its banks, and the rows after it follow it. Counts the refused cycles;
        returns the cycles by which the last gemm's last row comes late."""
        k, delay, before = len(banks), 0, None
        end, banks = reads + k, [int(b) for b in banks]
        for stream in streams:
            grants, rows = stream
            first = int(grants[0])
            if first >= end and (before is None or before < first):
                delay, before = 0, int(grants[-1])  # after the reads, not pushed
                continue
            j = int(np.searchsorted(grants, reads))
            if j == len(grants):
                before = int(grants[-1])
                continue
            new = grants.copy()
            t = int(new[j - 1]) if j else before
            for i in range(j, len(new)):
                g = int(new[i])
                t = g if t is None else max(g, t + 1)
                if t >= end:
                    if t > g:  # past the wload's reads, pushed: each row at the latest
                        # of its grant and a cycle after the row before (grants rise)
                        step = np.arange(len(new) - i)
                        tail = new[i:] - step
                        tail[0] = t
                        new[i:] = np.maximum.accumulate(tail) + step
                    break  # (not pushed: the rest stream as before)
                while t < end and banks[t - reads] & int(rows[i]):
                    t += 1
                    self.causes["sp_conflicts"] += 1  # the gemm's port refused
                new[i] = t
            delay = int(new[-1] - grants[-1])
            stream[0], before = new, int(new[-1])
        return delay

    def _delay_gemm_tokens(self, k: int):
        """The streaming gemm whose rows a wload held up pushes its tokens ``k``
        later. One a load timed before the wload took already is flagged: the RTL's
        counters by cause differ then, by cycles the model does not play out
        (tests/test_compiler_streaming.py::test_streamed_gemm_on_the_rtl,
        tests/test_kernels.py::test_gemm_stream_one_group_on_the_rtl: stall_out_load)."""
        channels, token = self._gemm_pushes
        for channel in channels:
            if channel and channel[-1] == token:
                channel[-1] = token + k
                self.pushed = max(self.pushed, token + k)
            else:
                self._flag("a wload held up a gemm whose token a load took")
        self._gemm_pushes = ([], 0)

    def finish(self) -> int:
        return max(self.now, *self.done.values()) + self.cost.end_cycle
