"""``python -m verif.zoo``: regenerate the zoo, or ``--status``: what the importer makes of it.

``--mlperf`` regenerates the MLPerf Tiny models in host/models/mlperf/ instead."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from . import MLPERF_NAMES, MODEL_NAMES, ZOO_DIR


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verif.zoo", description=__doc__)
    ap.add_argument("--status", action="store_true",
                    help="import every zoo file, run it on the reference interpreter "
                         "and compare with the oracle (no torch needed)")
    ap.add_argument("--mlperf", action="store_true",
                    help="regenerate the MLPerf Tiny models (host/models/mlperf/; "
                         f"{', '.join(MLPERF_NAMES)})")
    ap.add_argument("--out", type=Path, help="where to write the zoo (default: tests/zoo/, "
                    "with --mlperf host/models/mlperf/)")
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models to regenerate (default: all of {', '.join(MODEL_NAMES)}, "
                         f"with --mlperf of {', '.join(MLPERF_NAMES)})")
    opts = ap.parse_args(argv)
    names = MLPERF_NAMES if opts.mlperf else MODEL_NAMES
    unknown = set(opts.models) - set(names)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)} (the zoo has {', '.join(names)})")
    if opts.status and opts.mlperf:
        ap.error("--status reports on the test zoo; bench.models reports on the MLPerf models")
    if opts.status:
        from .status import print_status

        return print_status(opts.out or ZOO_DIR)
    missing = [m for m in ("torch", "onnxscript", "skl2onnx", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"verif.zoo: {', '.join(missing)} missing: regenerating the zoo needs the "
              "models extra (.venv/bin/pip install -e '.[models]')", file=sys.stderr)
        return 2
    if opts.mlperf:
        from host.models import MLPERF_DIR

        from .mlperf import generate_mlperf

        generate_mlperf(opts.out or MLPERF_DIR, tuple(opts.models) or MLPERF_NAMES)
        return 0
    from .generate import generate

    generate(opts.out or ZOO_DIR, list(opts.models) or list(MODEL_NAMES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
