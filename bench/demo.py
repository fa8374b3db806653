"""``make bench-demo``: ``make demo``'s run on the fast Verilator library and under cocotb.

The same ``npu run`` command line (``host.demo.npu_args()``: the MoE served
adaptively, 64 digits, 8 per call) runs on the fast simulation library in this
process and, for comparison, inside the cocotb simulation
(``verif.fastsim.scenarios:npu_command``), each with a fresh compile cache. Figures:
wall seconds of each (the cocotb one includes starting the simulator; both exclude
building the model, which is cached first), and on the fast library the seconds the
simulation's clock ran (``VerilatorDevice.clock_seconds``) and their share of the run.
Writes ``bench/results/demo.json``.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time

from rich.console import Console

from bench.common import report
from firmware.config import CONFIGS
from host import cli, demo
from verif import fastsim, rtl_device


def _fresh_cache(tmp: str, name: str) -> None:
    os.environ["NPU_CACHE_DIR"] = os.path.join(tmp, name)


def fast_run(args: list[str]) -> dict:
    opts = cli._parser().parse_args(args)
    device = fastsim.open_device(opts.config, dram_bytes=1 << 22)
    try:
        wall = time.perf_counter()
        ok = cli.run_on_device(device, opts, Console(file=io.StringIO()))
        wall = time.perf_counter() - wall
    finally:
        device.close()
    assert ok, "the demo's run did not pass its checks"
    return {"wall_seconds": round(wall, 2), "clock_seconds": round(device.clock_seconds, 2),
            "simulation_share": round(device.clock_seconds / wall, 3)}


def cocotb_run(args: list[str]) -> dict:
    # `npu info` first: builds the cocotb model if needed, outside the timed run
    rtl_device.run_scenario("verif.fastsim.scenarios:npu_command", "default",
                            extra_env={"NPU_ARGV": json.dumps(["info"])}, quiet=True)
    wall = time.perf_counter()
    rtl_device.run_scenario("verif.fastsim.scenarios:npu_command", "default",
                            extra_env={"NPU_ARGV": json.dumps(args)}, quiet=True)
    return {"wall_seconds": round(time.perf_counter() - wall, 2)}


def main() -> None:
    args = demo.npu_args([])
    fastsim.open_device(CONFIGS["default"]).close()  # build or find the library first
    with tempfile.TemporaryDirectory() as tmp:
        _fresh_cache(tmp, "fast")
        fast = fast_run(args)
        _fresh_cache(tmp, "cocotb")
        slow = cocotb_run(args)
    report("demo", {"command": "npu " + " ".join(args), "load_average_1min":
                    round(os.getloadavg()[0], 1),
                    **{f"fast_{k}": v for k, v in fast.items()},
                    **{f"cocotb_{k}": v for k, v in slow.items()},
                    "speedup_wall": round(slow["wall_seconds"] / fast["wall_seconds"], 1)})


if __name__ == "__main__":
    main()
