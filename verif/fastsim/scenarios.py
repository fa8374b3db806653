"""Scenarios that hold the fast path to the cocotb path.

:func:`fingerprint` runs a fixed set of programs on a device, checks each against the
golden model as every RTL scenario does, and writes what the NPU did to the JSON file
named by ``NPU_FINGERPRINT_OUT``: per run its status, every counter (cycles, busy and
stall cycles included) and the duration of every trace record. Run on the cocotb
testbench and on the fast library, the two files must be equal
(tests/test_fastsim.py).

:func:`npu_command` runs an ``npu`` command line on either path (bench/demo.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from firmware import asm
from verif.scenarios import COST_PROGRAMS, DRAM_BYTES, TABLE, Job, Pair, program_jobs

RANDOM_PROGRAMS = 4


def _jobs(config, seed: int) -> list[Job]:
    from verif.randprog import random_program

    jobs = program_jobs(seed)
    for name in ("streaming gemms", "load>compute, busy", "two stores of 64 B", "vmax"):
        jobs.append(Job(name, asm.assemble(COST_PROGRAMS[name] + "end\n"),
                        TABLE[:config.partitions], args=(5, 7, 0, 0, 2)))
    for i in range(RANDOM_PROGRAMS):
        rp = random_program(config, seed * 10_000 + i)
        jobs.append(Job(f"random {seed * 10_000 + i}", rp.program, rp.partitions,
                        dram=rp.dram, runs=2))
    return jobs


def fingerprint(device, config, seed):
    """Run :func:`_jobs` on the RTL (checked against golden); write what it did."""
    pair = Pair(device, config)
    runs = []
    for job in _jobs(config, seed):
        pair.rtl.reset_counters()
        pair.gold.reset_counters()
        status = pair.run_job(job, check_dram=True, check_state=False)
        counters = pair.rtl.counters()
        trace = pair.compare(job.name, check_dram=True)
        dram = hashlib.sha256(pair.rtl.read_mem(0, DRAM_BYTES)).hexdigest()
        runs.append({"job": job.name, "status": repr(status), "counters": counters,
                     "regions": [(r.region, r.end - r.start) for r in trace],
                     "dram_sha256": dram})
    out = os.environ.get("NPU_FINGERPRINT_OUT")
    if out:
        Path(out).write_text(json.dumps(runs, indent=1, default=_plain))


def npu_command(device, config, seed):
    """``npu`` with the arguments in ``NPU_ARGV`` (a JSON list) on ``device``: the same
    command on the fast library and under cocotb (bench/demo.py)."""
    from host.cli import COMMANDS, _parser

    opts = _parser().parse_args(json.loads(os.environ["NPU_ARGV"]))
    assert COMMANDS[opts.command](device, opts), "the run did not pass its checks"


def _plain(value):
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(type(value))
