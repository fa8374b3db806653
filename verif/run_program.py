"""``make sim``: assemble a program and run it on the Verilator-built NPU.

Usage: ``python -m verif.run_program FILE.s [ARG ...] [--config NAME] [--seed N]``.
It runs on the fast simulation library (``verif.fastsim``); the first run builds it (a
minute or two), later runs reuse the build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from firmware.config import CONFIGS
from verif.fastsim import run_scenario


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", type=Path)
    ap.add_argument("args", nargs="*", help="initial r1..r7 (integers, 0x.. allowed)")
    ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=1)
    opts = ap.parse_args(argv)
    try:
        run_scenario("verif.scenarios:print_program", opts.config, seed=opts.seed,
                     extra_env={"NPU_PROGRAM": str(opts.program.resolve()),
                                "NPU_ARGS": " ".join(opts.args)})
    except (AssertionError, RuntimeError) as e:  # a mismatch, a failed build
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
