"""Shared pytest options: ``--regress`` (long runs) and ``--seed`` (reproduce a failure)."""

import os
import random

import pytest


def pytest_addoption(parser):
    parser.addoption("--regress", action="store_true",
                     help="run the long regression: slow tests and larger random counts")
    parser.addoption("--seed", type=int, default=None,
                     help="base seed for randomized tests (default: random, printed)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    if seed is None:
        seed = int(os.environ.get("NPU_SEED", random.randrange(1 << 31)))
    config.npu_seed = seed
    os.environ["NPU_SEED"] = str(seed)  # cocotb testbenches read it from the environment


def pytest_report_header(config):
    return f"npu base seed: {config.npu_seed} (reproduce with --seed {config.npu_seed})"


def pytest_collection_modifyitems(config, items):
    # The RTL tests first: they are the long ones (builds, simulations), and under
    # `-n 2 --dist worksteal` (make test) the worker that runs out of short tests
    # steals from the other's tail, which works best when the long tests went first.
    items.sort(key=lambda item: "rtl" not in item.keywords)
    if config.getoption("--regress"):
        return
    skip = pytest.mark.skip(reason="long test: run with make regress (--regress)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def regress(request) -> bool:
    """True under ``make regress``: tests scale their random counts up."""
    return request.config.getoption("--regress")


@pytest.fixture
def seed(request) -> int:
    """The session's base seed (printed in the header), offset per test for variety."""
    return (request.config.npu_seed + sum(map(ord, request.node.name))) % (1 << 31)


@pytest.fixture(autouse=True)
def _rtl_tests_are_marked(request, monkeypatch):
    """Keep the fast tier honest: a test that reaches Verilator (a cocotb run or a lint)
    without the ``rtl`` mark fails and says so, so ``pytest -m "not rtl"`` never builds
    the RTL."""
    if "rtl" in request.keywords:
        return
    try:
        import verif.sim as sim
    except ImportError:  # no `sim` extra installed: nothing can reach Verilator
        return

    def refuse():
        raise RuntimeError(f"{request.node.nodeid} runs Verilator: mark it @pytest.mark.rtl")

    monkeypatch.setattr(sim, "_verilator_root", refuse)


def pytest_terminal_summary(terminalreporter):
    """The fuzz tests' case counts (``record_property("fuzz", ...)``; xdist carries
    them from the workers), so every run says how many cases it tried."""
    lines = [value for reports in terminalreporter.stats.values() for r in reports
             for name, value in getattr(r, "user_properties", ()) if name == "fuzz"
             and getattr(r, "when", "call") == "call"]
    if lines:
        terminalreporter.section("fuzz cases tried")
        for line in sorted(lines):
            terminalreporter.write_line(line)
