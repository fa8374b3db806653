"""``make bench-swaps``: instruction words a plan change writes into the shadow bank.

Runs ``npu run MODEL --adaptive --digits 48 --phases PHASES --fresh`` on the golden
model for each bundled model (an empty cache and state directory each) and reads
the run's saved report: the swaps, and the instruction words the plan changes
wrote after the initial load (the driver writes only the runs of words that
differ from what the shadow bank holds) against the words of those programs
written whole (what every swap cost before). ``--backend verilator`` runs the
same on the RTL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import report

RUNS = {  # model: --phases
    "moe": "0123|6789",
    "cnn": "0123|6789",
    "mlp": "0123|6789",
    "early_exit": "0123|6789",
}


def run(model: str, phases: str, backend: str, digits: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NPU_CACHE_DIR": tmp}
        proc = subprocess.run(
            [sys.executable, "-m", "host.cli", "run", model, "--adaptive", "--digits",
             str(digits), "--phases", phases, "--fresh", "--inline-compile",
             "--backend", backend], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"npu run {model} failed: {proc.stderr.strip()}")
        rep = json.loads(next(Path(tmp, "reports").glob("*.json")).read_text())
    words, swaps = rep["program_words"], rep["swaps"]
    return {"swaps": swaps, "words_written": words["written"],
            "words_whole": words["whole"],
            "per_swap_written": round(words["written"] / swaps, 1) if swaps else None,
            "per_swap_whole": round(words["whole"] / swaps, 1) if swaps else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="golden", choices=("golden", "verilator"))
    ap.add_argument("--digits", type=int, default=48)
    opts = ap.parse_args(argv)
    models = {}
    for model, phases in RUNS.items():
        models[model] = run(model, phases, opts.backend, opts.digits)
        m = models[model]
        print(f"{model:<11} {m['swaps']} swaps: {m['words_written']} words written, "
              f"{m['words_whole']} as whole programs", flush=True)
    written = sum(m["words_written"] for m in models.values())
    whole = sum(m["words_whole"] for m in models.values())
    report("swaps", {"backend": opts.backend, "digits": opts.digits,
                     "words_written": written, "words_whole": whole,
                     "written_share": round(written / whole, 3) if whole else None,
                     "models": models})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
