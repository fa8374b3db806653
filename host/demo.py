"""``make demo``: the gated mixture-of-experts digit classifier on the simulated NPU,
served by the adaptive runtime.

It imports ``host/models/moe.onnx`` (a QDQ model: a gate picks one of four
experts per input with ArgMax + If), compiles it for the hardware profile read
from the device's CAPS registers and serves a stream of held-out digits whose
class mix shifts halfway (digits 0-3, then 6-9, so different experts are hot in
each half), on the Verilator-built RTL over its real AXI ports, in-process, by default (the
first run builds the NPU: a minute or two). The adaptive runtime prints its events as they
happen: the routed batch variants it builds for the requests, served 8 at a time
(the gate and the experts it bets on, for 8 inputs per run), re-placing its bet
when the class mix shifts; inputs routed outside the bet run alone. Served one at
a time (``--batch 1``) it fuses chains, hot-swaps plans in while the NPU runs,
validates them and splits units that go cold. Every result is
checked against the reference interpreter; the report shows accuracy, cycles,
DRAM traffic, the per-unit table from the region trace and the unit graph with
each unit's history (``npu report moe`` shows it again).
"""

from __future__ import annotations

import argparse

from . import cli


def npu_args(argv=None) -> list[str]:
    """The ``npu`` command line the demo runs, from the demo's own options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="verilator", choices=("verilator", "golden"))
    ap.add_argument("--digits", type=int, default=64, help="held-out digits (default 64)")
    ap.add_argument("--model", default="moe", help="bundled model or .onnx (default moe)")
    ap.add_argument("--phases", default="0123|6789", help="class mix per phase")
    ap.add_argument("--config", default="default")
    ap.add_argument("--batch", type=int, default=8,
                    help="inputs per call (routed batch variants; 1: one at a time)")
    ap.add_argument("--inline-compile", action="store_true",
                    help="compile on the inference path, not in a worker thread "
                         "(reproducible: the decisions do not depend on thread timing)")
    ns = ap.parse_args(argv)
    args = ["run", ns.model, "--backend", ns.backend, "--digits", str(ns.digits),
            "--config", ns.config, "--adaptive", "--phases", ns.phases, "--batch", str(ns.batch)]
    if ns.inline_compile:
        args.append("--inline-compile")
    return args


def main(argv=None) -> int:
    return cli.main(npu_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
