"""An assembly writer for generated code: labels, scratch registers, cfg tracking.

The compiler writes assembly text, not words: ``firmware.asm`` assembles it, so
generated programs get the same checks, labels and disassembly as hand-written
ones, and ``npu disasm`` shows readable source with the compiler's comments.
"""

from __future__ import annotations

import copy

from firmware import isa

CONST_BASE = "r1"  # DRAM address of the model's constants (weights, biases)
ARENA_BASE = "r2"  # DRAM address of this inference's activation arena
SEGMENT = "r3"  # which NPU segment to run (models with CPU nodes in the middle)
SCRATCH = ("r8", "r9", "r10", "r11", "r12", "r13")
HANDED = 3  # registers of one instruction that :meth:`Emitter.reg` may hand out
RESULT_REGS = ("r15", "r14", "r7", "r6", "r5", "r4")  # vargmax results the host reads
CFG_RESET = {f.name.lower(): reset for f, (reset, _, _) in isa.CFG_RANGE.items()}


class Emitter:
    """Accumulates assembly lines for one program.

    Tracks the values of the ``cfg`` registers and of scratch registers, so it
    emits ``cfg``/``li`` only when a value changes; both are forgotten at every
    label (a merge point of control flow) and at the start of a run.
    """

    def __init__(self):
        self.lines: list[str] = []
        self._labels = 0
        self.cfg = dict(CFG_RESET)
        self._reg_value: dict[str, int] = {}
        self._next_scratch = 0
        self._calls = 0  # reg() calls so far
        self._hit_at: dict[str, int] = {}  # register -> the call that last found it cached
        self.result_regs: dict[str, str] = {}  # tensor name -> register
        self._pending_pop = ""  # token flags the next compute instruction pops
        self._last_compute: int | None = None
        self._last_compute_loops: tuple = ()  # the loops around it (their lines)
        self.work = Work()
        self._mult = [1]
        self._loops: list[int] = []  # the lines of the loops open here, outermost first

    # ---- text ---------------------------------------------------------------------------
    def comment(self, text: str):
        self.lines.append(f"    ; {text}")

    def op(self, text: str, *, pop: str = "", push: str = "", queue: str = "seq"):
        """Emit an instruction; ``pop``/``push`` are "", "prev", "next" or "prev,next".

        A compute instruction takes a pending :meth:`pop_next_compute` token.
        """
        if text.startswith("loop") and self._pending_pop:
            self.marker()  # a token taken inside the body would be taken per pass
        if queue == "compute":
            if self._pending_pop:
                want = set(filter(None, f"{pop},{self._pending_pop}".split(",")))
                pop = ",".join(p for p in ("prev", "next") if p in want)
                self._pending_pop = ""
            self._last_compute = len(self.lines)
            self._last_compute_loops = tuple(self._loops)
        self.work.add(text, self._mult[-1])
        if text.startswith("loop "):
            self._mult.append(self._mult[-1] * int(text.split()[1].rstrip(",")))
            self._loops.append(len(self.lines))
        flags = [f"pop={p}" for p in pop.split(",") if p]
        flags += [f"push={p}" for p in push.split(",") if p]
        self.lines.append("    " + ", ".join([text, *flags]) if flags else "    " + text)

    def compute(self, text: str, **kw):
        self.op(text, queue="compute", **kw)

    def marker(self, *, pop: str = "", push: str = ""):
        """A compute instruction that changes nothing, to carry a token: it
        rewrites a configuration register with the value it holds."""
        known = [(k, v) for k, v in self.cfg.items() if v is not None]
        name, value = known[0] if known else ("pool_count", 1)
        self.compute(f"cfg.{name} {value}", pop=pop, push=push)
        self.cfg[name] = value

    def pop_next_compute(self, direction: str = "prev"):
        """The next compute instruction waits for a token: ``"prev"`` from the load
        queue (its data arrived), ``"next"`` from the store queue (a buffer it
        writes was stored)."""
        if direction not in ("prev", "next"):
            raise ValueError(f"no token direction {direction!r}")
        self._pending_pop = ",".join(filter(None, (self._pending_pop, direction)))

    def push_after_last_compute(self, direction: str):
        """Send a token (``"next"``: to the store queue) when the last compute
        instruction emitted so far completes."""
        if self._last_compute is None:
            raise ValueError("no compute instruction to push a token from")
        if self._last_compute_loops != tuple(self._loops):
            # it runs once per pass of a loop that ended: push after the loop
            self.marker(push=direction)
            return
        line = self.lines[self._last_compute]
        if f"push={direction}" in line:
            raise ValueError(f"two tokens from one instruction: {line.strip()}")
        self.lines[self._last_compute] = f"{line}, push={direction}"

    def new_label(self, stem: str) -> str:
        self._labels += 1
        return f"{stem}_{self._labels}"

    def label(self, name: str):
        """Place a label; control can arrive here from elsewhere, so forget state."""
        self.lines.append(f"{name}:")
        self.forget()

    def forget(self):
        self.cfg = {k: None for k in self.cfg}
        self._reg_value.clear()

    def begin_unit(self):
        """State at a unit boundary: nothing known, nothing pending.

        A unit's code then depends on the unit alone (not on the code before
        it), so a unit compiled once links into any plan that holds it
        (:mod:`host.compiler.units`)."""
        self.forget()
        self._next_scratch = 0
        self._hit_at = {}
        self._pending_pop = ""
        self._last_compute = None
        self._last_compute_loops = ()
        self._mult = [1]
        self._loops = []

    def run_start(self):
        """State at the start of a run: cfg at reset, registers unknown."""
        self.cfg = dict(CFG_RESET)
        self._reg_value.clear()

    def checkpoint(self) -> tuple:
        """The emitter's whole state, for :meth:`rollback` (code written after it is
        discarded, as if it had never been emitted)."""
        state = {k: v for k, v in self.__dict__.items() if k != "lines"}
        return len(self.lines), copy.deepcopy(state)

    def rollback(self, checkpoint: tuple):
        """Return to a :meth:`checkpoint`."""
        n, state = checkpoint
        del self.lines[n:]
        self.__dict__.update(copy.deepcopy(state))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    # ---- state-tracked helpers ------------------------------------------------------
    def set_cfg(self, name: str, value: int, *, pop: str = "", push: str = ""):
        """``cfg.name value`` unless it already holds it (always, with token flags)."""
        if self.cfg.get(name) == value and not pop and not push:
            return
        self.compute(f"cfg.{name} {int(value)}", pop=pop, push=push)
        self.cfg[name] = value

    def reg(self, value: int, base: str = "r0") -> str:
        """A register holding ``base + value`` (``r0`` for 0 with base r0)."""
        value = int(value) & 0xFFFF_FFFF
        if value == 0:
            return base
        key = (base, value)
        self._calls += 1
        for r, v in self._reg_value.items():
            if v == key:
                self._hit_at[r] = self._calls
                return r
        # One instruction takes up to HANDED registers from here: a new value must
        # not land in one that a cache hit has just handed out for it.
        r = SCRATCH[self._next_scratch % len(SCRATCH)]
        while self._calls - self._hit_at.get(r, -HANDED) < HANDED:
            self._next_scratch += 1
            r = SCRATCH[self._next_scratch % len(SCRATCH)]
        self._next_scratch += 1
        if base == "r0":
            self.op(f"li {r}, {value}")
        else:
            self.op(f"addi {r}, {base}, {value if value < 1 << 31 else value - (1 << 32)}")
        self._reg_value[r] = key
        return r

    def point(self, reg: str, at):
        """Set ``reg`` to an address: an offset, or ``(register, offset)``."""
        if isinstance(at, tuple):
            self.op(f"addi {reg}, {at[0]}, {at[1]}")
        else:
            self.op(f"li {reg}, {at}")

    def scratch(self, count: int) -> list[str]:
        """``count`` scratch registers the caller owns until its next :meth:`reg` call.

        They are forgotten by the value cache (the caller writes them).
        """
        if count > len(SCRATCH):
            raise ValueError(f"{count} scratch registers asked, {len(SCRATCH)} exist")
        regs = list(SCRATCH[:count])
        for r in regs:
            self._reg_value.pop(r, None)
        self._next_scratch = count
        return regs

    def repeat(self, count: int, body, stem: str = "rep"):
        """``body()`` ``count`` times: in a hardware loop from two on, inline once."""
        if count >= 2:
            end = self.new_label(stem)
            self.op(f"loop {count}, {end}")
            body()
            self.loop_end(end)
        elif count == 1:
            body()

    def loop_end(self, label: str):
        """Place a loop's end label: only the loop reaches it, so state stays known
        (the loop body must not change what the caches track)."""
        self.lines.append(f"{label}:")
        self._mult.pop()
        self._loops.pop()

    def clobber(self, reg: str):
        self._reg_value.pop(reg, None)

    def result_reg(self, tensor: str) -> str:
        """The register that will hold a scalar result (an ArgMax) for the host."""
        if tensor not in self.result_regs:
            if len(self.result_regs) == len(RESULT_REGS):
                raise ValueError(f"more than {len(RESULT_REGS)} scalar results in one program")
            self.result_regs[tensor] = RESULT_REGS[len(self.result_regs)]
        return self.result_regs[tensor]


class Work:
    """Dynamic work of generated code (loop bodies counted per iteration).

    The features the cost model (:mod:`host.compiler.cost`) predicts cycles from.
    """

    FEATURES = ("instructions", "loads", "load_bytes", "tagged_bytes", "stores",
                "store_bytes", "wloads", "wload_rows", "gemms", "stream_gemms", "gemm_rows",
                "vector_ops", "vector_rows", "vector_bytes", "cfgs")

    def __init__(self):
        self.v = dict.fromkeys(self.FEATURES, 0)

    def snapshot(self) -> dict:
        return dict(self.v)

    def since(self, before: dict) -> dict:
        return {k: self.v[k] - before[k] for k in self.FEATURES}

    def add(self, text: str, mult: int):
        mnem, _, rest = text.partition(" ")
        ops = [o.strip() for o in rest.split(",")]
        pos = [o for o in ops if "=" not in o]
        kw = dict(o.split("=", 1) for o in ops if "=" in o)
        v = self.v
        v["instructions"] += mult
        if mnem in ("load", "store"):
            nbytes = int(pos[4]) * int(pos[5]) * mult
            v[mnem + "s"] += mult
            v[mnem + "_bytes"] += nbytes
            if kw.get("tag", "0") != "0":
                v["tagged_bytes"] += nbytes
        elif mnem == "wload":
            v["wloads"] += mult
            v["wload_rows"] += int(pos[2]) * mult
        elif mnem.startswith("gemm"):
            # A GEMM on the weights already active (swap=0) streams right behind the
            # one before it; a swap fills the array with new weights.
            v["gemms" if kw.get("swap", "0") != "0" else "stream_gemms"] += mult
            v["gemm_rows"] += int(pos[3]) * mult
        elif mnem in ("vbias", "vreq", "vreqb"):
            v["vector_ops"] += mult
            v["vector_rows"] += int(pos[3]) * mult
            v["vector_bytes"] += int(pos[3]) * int(pos[4]) * mult
        elif mnem in ("vadd", "vclip", "vmax"):
            m, n = int(pos[-2]), int(pos[-1])
            v["vector_ops"] += mult
            v["vector_rows"] += m * mult
            v["vector_bytes"] += m * n * mult
        elif mnem == "vqtab":  # one table row of 8-byte entries
            v["vector_ops"] += mult
            v["vector_rows"] += mult
            v["vector_bytes"] += int(pos[2]) * isa.QTAB_ENTRY_BYTES * mult
        elif mnem == "vargmax":
            v["vector_ops"] += mult
            v["vector_rows"] += mult
            v["vector_bytes"] += int(pos[3]) * mult
        elif mnem == "dwload":  # the depthwise engine: one window a tap
            v["vector_ops"] += mult
            v["vector_rows"] += isa.DW_TAPS * mult
        elif mnem.startswith("dwconv"):  # one window a cycle, one output row a cycle
            mo, h, s, kh, kw, n = (int(x) for x in pos[3:9])
            reads = ((h - 1) * s + kh) * ((mo - 1) * s + kw)
            v["vector_ops"] += mult
            v["vector_rows"] += (reads + h) * mult
            v["vector_bytes"] += reads * n * mult
        elif mnem.startswith("cfg."):
            v["cfgs"] += mult
