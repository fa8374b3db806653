"""What survives ``kill -9``: the compile cache, the saved state and the report.

An adaptive run writes the compile cache (sqlite, in transactions), and at its end
the runtime state and the report (each written whole: a temporary file renamed
over the old one). Killed at a random moment (seeded; ``--regress`` kills more
often), every file is afterwards the old one or the new one: the state and report
read back valid, ``npu cache verify`` finds no bad entry, and the next run passes
its checks. A writer killed between writing its temporary and renaming it leaves
the temporary, named with its process id; the next write removes it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from firmware.config import CONFIGS
from host import cli
from host.adaptive import saved

MOE = cli.MODELS / "moe.onnx"
ROOT = Path(__file__).resolve().parents[1]


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
    left = [p.name for d in ("state", "reports") for p in (tmp_path / d).glob("*.tmp")]
    assert left == [], left  # the last run's writes swept what the killed runs left


# A writer that stops inside save_json, after its temporary is written and synced,
# before the rename: says so on stdout, then waits to be killed.
STALLED_WRITER = """
import os, sys, time
from pathlib import Path
from host.adaptive import saved
real_fsync = os.fsync
def stall(fd):
    real_fsync(fd)
    print("written", flush=True)
    time.sleep(600)
os.fsync = stall
saved.save_json({"run": "killed"}, Path(sys.argv[1]))
"""


def test_a_write_killed_before_its_rename_leaves_a_temporary_the_next_write_removes(
        tmp_path):
    path = tmp_path / "state" / "m-0123-default.json"
    saved.save_json({"run": "first"}, path)
    writer = subprocess.Popen([sys.executable, "-c", STALLED_WRITER, str(path)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "written\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    left = [p.name for p in path.parent.glob("*.tmp")]
    assert len(left) == 1 and f".{writer.pid}@" in left[0], left
    assert json.loads(path.read_text()) == {"run": "first"}  # the old file, whole
    # beside it: a live writer's temporary, another host's, and files not ours
    host = left[0].split("@")[1].split(".")[0]
    keep = [f".{path.name}.{os.getpid()}@{host}.abcd1234.tmp",
            f".{path.name}.{writer.pid}@another-host.abcd1234.tmp",
            f"{path.name}.{writer.pid}.tmp", "notes.tmp"]
    for name in keep:
        (path.parent / name).write_text("{}")
    saved.save_json({"run": "next"}, path)
    assert json.loads(path.read_text()) == {"run": "next"}
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, *keep])
