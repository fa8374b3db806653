"""What survives ``kill -9``: the compile cache, the saved state and the report.

An adaptive run writes the compile cache (sqlite, in transactions), and at its end
the runtime state and the report (each written whole: a temporary file renamed
over the old one). Killed at a random moment (seeded; ``--regress`` kills more
often), every file is afterwards the old one or the new one: the state and report
read back valid, ``npu cache verify`` finds no bad entry, and the next run passes
its checks.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from firmware.config import CONFIGS
from host import cli
from host.adaptive import saved

MOE = cli.MODELS / "moe.onnx"


def npu(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "host.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_killed_adaptive_run_leaves_usable_files(tmp_path, seed, regress, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    env = dict(os.environ)
    run = ["run", "moe", "--adaptive", "--inline-compile", "--phases", "012|789"]
    first = npu(*run, "--digits", "12", env=env)
    assert first.returncode == 0, first.stderr
    rng = random.Random(seed)
    kills = []
    for _ in range(5 if regress else 1):
        # --fresh recompiles every plan and replaces its cache entry: writes all along
        proc = subprocess.Popen([sys.executable, "-m", "host.cli", *run, "--fresh",
                                 "--digits", "40"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        delay = rng.uniform(1.0, 5.0)  # past the imports, inside the run
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        kills.append((round(delay, 2), proc.wait()))
        assert saved.load_state(MOE, CONFIGS["default"]) is not None
        saved.load_report(MOE, CONFIGS["default"], "npu run moe --adaptive")
        verify = npu("cache", "verify", "--model", "moe", env=env)
        assert verify.returncode == 0 and "evicted 0" in verify.stdout, verify
    print(f"\nkilled after (seconds, exit status): {kills}")
    again = npu(*run, "--digits", "12", env=env)
    assert again.returncode == 0, again.stderr
    assert "12/12 results equal the reference" in again.stdout
