"""``python -m verif.zoo``: regenerate the zoo, or ``--status``: what the importer makes of it."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from . import MODEL_NAMES, ZOO_DIR


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verif.zoo", description=__doc__)
    ap.add_argument("--status", action="store_true",
                    help="import every zoo file, run it on the reference interpreter "
                         "and compare with the oracle (no torch needed)")
    ap.add_argument("--out", type=Path, default=ZOO_DIR, help="where to write the zoo")
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models to regenerate (default: all of {', '.join(MODEL_NAMES)})")
    opts = ap.parse_args(argv)
    unknown = set(opts.models) - set(MODEL_NAMES)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)} (the zoo has {', '.join(MODEL_NAMES)})")
    if opts.status:
        from .status import print_status

        return print_status(opts.out)
    missing = [m for m in ("torch", "skl2onnx", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"verif.zoo: {', '.join(missing)} missing: regenerating the zoo needs the "
              "models extra (.venv/bin/pip install -e '.[models]')", file=sys.stderr)
        return 2
    from .generate import generate

    generate(opts.out, list(opts.models) or list(MODEL_NAMES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
