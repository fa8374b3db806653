"""The golden-model soak (bench/soak.py): runs, hot swaps and bus faults, nothing lost.

Every run ends in a result equal to the reference interpreter or, when it meets a
fault window, in a reported BUS_ERROR; the run after a fault is right again and
every staged swap lands. ``make test`` soaks 300 runs; ``make regress`` the full
10,000 runs and 1,000 swaps, and saves the figures to bench/results/soak.json.
"""

from __future__ import annotations

import pytest

from bench.common import report
from bench.soak import soak


def check(fig: dict, runs: int, swaps: int):
    assert fig["checked_results"] + fig["faulted_runs"] == runs, fig
    assert fig["swaps_staged"] == fig["swaps_landed"] == swaps, fig
    assert fig["faults_by_code"] == ({"BUS_ERROR": fig["faulted_runs"]}
                                     if fig["faulted_runs"] else {}), fig
    assert fig["faulted_runs"] > 0 and fig["faulted_runs"] <= fig["fault_windows"], fig
    assert fig["faults_followed_by_a_checked_run"] == fig["faulted_runs"], fig


def test_short_soak(seed):
    check(soak(runs=300, swaps=30, seed=seed, fault_rate=0.1), 300, 30)


@pytest.mark.slow
def test_full_soak(seed):
    fig = soak(runs=10_000, swaps=1_000, seed=seed)
    check(fig, 10_000, 1_000)
    report("soak", fig)
