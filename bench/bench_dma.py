"""DMA bytes per cycle against the bus width, measured in RTL simulation (Verilator).

Runs the ``throughput`` cocotb test of ``tests/cocotb_dma.py`` on the DMA alone, with
cocotbext-axi's RAM as DRAM and a scratchpad model: long rows (4 KiB, unaligned) loaded,
stored and both at once, and short unaligned rows loaded, first with no backpressure,
then with every AXI channel and the scratchpad refusing 25 % of cycles at random.

Run alone with ``python -m bench.bench_dma``; ``bench/datapath.py`` includes it.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from bench.common import report
from firmware.config import CONFIGS, NPUConfig
from hdl.dma import DMAShell
from verif.sim import REPO_ROOT, run_cocotb, sim_build_dir, to_verilog

COCOTB_MODULE = REPO_ROOT / "tests" / "cocotb_dma.py"
BENCH_CONFIGS = {
    "bus64": CONFIGS["default"],
    "bus32": dataclasses.replace(CONFIGS["small"], bus_bytes=4),
}


def measure(config: NPUConfig, build_name: str) -> dict:
    """Run the throughput test on ``config``; return its figures (nested by condition)."""
    build = sim_build_dir(build_name)
    source = to_verilog(DMAShell(config), "dma", build / "dma.v")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dma_bench.json"
        run_cocotb("dma", [source], COCOTB_MODULE, build, testcase="throughput",
                   extra_env={"DMA_TB_CONFIG": json.dumps(config.as_dict()),
                              "DMA_TB_SEED": "1", "DMA_BENCH_OUT": str(out)})
        return json.loads(out.read_text())


def run() -> dict:
    """Return flat figures: ``<bus>_<condition>_<metric>`` plus each bus width in bytes.

    Conditions are ``zero_backpressure`` and ``random_backpressure``; metrics are bytes
    per cycle for a load, a store, both at once and short-row loads, and the load and
    store efficiency (bytes per cycle / bus bytes).
    """
    figures: dict = {}
    for name, config in BENCH_CONFIGS.items():
        # same build directories as tests/test_dma.py, so the builds are shared
        raw = measure(config, "dma_default" if name == "bus64" else "dma_bus32")
        figures[f"{name}_bus_bytes"] = raw["bus_bytes"]
        for cond in ("zero_backpressure", "random_backpressure"):
            for metric, value in raw[cond].items():
                figures[f"{name}_{cond}_{metric}"] = value
        figures[f"{name}_max_read_bursts_in_flight"] = raw["max_read_bursts_in_flight"]
    return figures


def main():
    report("dma", run())


if __name__ == "__main__":
    main()
