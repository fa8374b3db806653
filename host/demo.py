"""``make demo``: the gated mixture-of-experts digit classifier on the simulated NPU.

It imports ``host/models/moe.onnx`` (a QDQ model: a gate picks one of four
experts per input with ArgMax + If), compiles it for the hardware profile read
from the device's CAPS registers, loads it, and runs held-out digits through the
one runtime path, on the Verilator-built RTL over its real AXI ports by default
(the first run builds the NPU: minutes). Every result is checked against the
reference interpreter; the report shows predictions, accuracy, cycles, MAC
utilization, DRAM traffic and the per-unit table from the region trace, with the
cost model's predictions. (The adaptive runtime that fuses and hot-swaps units
while this runs is issue #6, not built yet.)
"""

from __future__ import annotations

import argparse

from . import cli


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="verilator", choices=("verilator", "golden"))
    ap.add_argument("--digits", type=int, default=16, help="held-out digits (default 16)")
    ap.add_argument("--model", default="moe", help="bundled model or .onnx (default moe)")
    ap.add_argument("--config", default="default")
    ns = ap.parse_args(argv)
    return cli.main(["run", ns.model, "--backend", ns.backend, "--digits", str(ns.digits),
                     "--config", ns.config])


if __name__ == "__main__":
    raise SystemExit(main())
