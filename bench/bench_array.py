"""GEMM engine MAC utilization, measured in RTL simulation (Verilator + cocotb).

The engine streams ``tiles`` pairs of (full-size ``wload``; ``gemm swap=1`` over
256 dense rows) on the default configuration, so each wload fills the shadow
weights while the previous gemm streams. Utilization is the MACs retired (the
engine's ``macs`` output, summed) over ``rows * cols`` times the cycles from the
first accepted command until the engine is idle again. The run goes through the
same harness and checks as ``tests/test_array.py`` (results against numpy).

``python -m bench.bench_array`` prints the figures; ``make bench-datapath`` includes them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from firmware.config import CONFIGS
from verif import array_tb as tb
from verif.sim import run_cocotb, sim_build_dir, to_verilog


def run(tiles: int = 16, grant: str = "always") -> dict:
    """Measure the streaming MAC utilization; return plain figures.

    Parameters
    ----------
    tiles : int
        Number of (wload; gemm m=256) pairs.
    grant : str
        Scratchpad grant pattern: ``"always"`` (the figure of merit), ``"random"``
        or ``"bursty"`` (see ``verif.array_tb.grants``).

    Returns
    -------
    dict
        ``mac_utilization``, ``cycles``, ``macs``, ``peak_macs_per_cycle``,
        ``stall_cycles``, ``tiles``, ``rows_per_gemm``, ``grant``, ``config``,
        ``simulator``.
    """
    if tiles < 1:
        raise ValueError(f"tiles must be >= 1, not {tiles!r}")
    config = CONFIGS["default"]
    build = sim_build_dir(tb.TOPLEVEL)
    src = to_verilog(tb.ArrayHarness(config), tb.TOPLEVEL, build / f"{tb.TOPLEVEL}.v")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        run_cocotb(tb.TOPLEVEL, [src], "verif.array_tb", build, testcase="stream_utilization",
                   extra_env={"ARRAY_BENCH_OUT": str(out), "ARRAY_BENCH_TILES": str(tiles),
                              "ARRAY_BENCH_GRANT": grant},
                   test_dir=Path(tmp))
        measured = json.loads(out.read_text())
    peak = config.peak_macs_per_cycle
    return {
        "mac_utilization": measured["macs"] / (peak * measured["cycles"]),
        "cycles": measured["cycles"],
        "macs": measured["macs"],
        "peak_macs_per_cycle": peak,
        "stall_cycles": measured["stall_cycles"],
        "tiles": tiles,
        "rows_per_gemm": 256,
        "grant": grant,
        "config": "default",
        "simulator": "verilator",
    }


if __name__ == "__main__":
    from bench.common import report

    report("array", run())
