"""Benchmark plumbing: print figures and save them to bench/results/NAME.json."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def report(name: str, figures: dict, quiet: bool = False) -> Path:
    """Print ``figures`` (flat or one level of sections; ``quiet``: only where they
    went, for a benchmark that prints its own table) and write them as JSON."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    record = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "host": platform.node(), **figures}
    out.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    if quiet:
        print(f"(saved to {out.relative_to(RESULTS.parent.parent)})")
        return out
    print(f"== {name} ==")
    for key, value in figures.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k:<40} {_fmt(v)}")
        else:
            print(f"{key:<42} {_fmt(value)}")
    print(f"(saved to {out.relative_to(RESULTS.parent.parent)})")
    return out


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def refuse_unknown(ap, names, known) -> None:
    """Stop with ``ap``'s usage error if ``names`` holds a model not in ``known``."""
    unknown = sorted(set(names) - set(known))
    if unknown:
        ap.error(f"unknown models {unknown} (choose from {', '.join(known)})")
