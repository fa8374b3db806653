"""The soak (bench/soak.py): runs, hot swaps and bus faults, nothing lost.

Every run ends in a result equal to the reference interpreter or, when it meets a
fault window, in a reported BUS_ERROR; the run after a fault is right again and
every staged swap lands. On the RTL, under random backpressure, every run also
equals its golden twin's (outputs, fault codes, and cycles when nothing pauses).
``make test`` soaks 300 golden runs and 40 RTL runs; ``make regress`` the full
10,000 golden runs with 1,000 swaps and 1,000 RTL runs with 100 swaps, and saves
the figures to bench/results/soak.json.
"""

from __future__ import annotations

import pytest

from bench.soak import save, soak


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
    save("golden", fig)


def check_rtl(fig: dict, runs: int, swaps: int):
    check(fig, runs, swaps)
    assert 0 < fig["runs_under_backpressure"] < runs, fig
    # runs without pauses: cycles compared (the soak raises on a difference where the
    # golden model promises them)
    assert fig["runs_cycles_checked"] + fig["runs_cycles_not_vouched"] > 0, fig


@pytest.mark.rtl
def test_short_rtl_soak(seed):
    check_rtl(soak(runs=40, swaps=4, seed=seed, fault_rate=0.3, rtl=True), 40, 4)


@pytest.mark.rtl
@pytest.mark.slow
def test_full_rtl_soak(seed):
    fig = soak(runs=1_000, swaps=100, seed=seed, rtl=True)
    check_rtl(fig, 1_000, 100)
    save("rtl", fig)
