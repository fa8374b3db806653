"""Shared pytest options: ``--regress`` (long runs) and ``--seed`` (reproduce a failure)."""

import os
import random
import resource

import pytest

# The fast Verilator library's test build level (verif/fastsim/build.py, LEVELS): set
# before any test imports the builder, and inherited by the `npu` processes tests start.
os.environ.setdefault("NPU_FASTSIM_LEVEL", "test")


def pytest_addoption(parser):
    parser.addoption("--regress", action="store_true",
                     help="run the long regression: slow tests and larger random counts")
    parser.addoption("--seed", type=int, default=None,
                     help="base seed for randomized tests (default: random, printed)")
    parser.addoption("--cpu-times", type=int, default=None, metavar="N",
                     help="report CPU seconds (the test's process and the builds and "
                          "simulations it waited for) per file and for the N costliest tests")


def pytest_configure(config):
    seed = config.getoption("--seed")
    if seed is None:
        seed = int(os.environ.get("NPU_SEED", random.randrange(1 << 31)))
    config.npu_seed = seed
    os.environ["NPU_SEED"] = str(seed)  # cocotb testbenches read it from the environment


def pytest_report_header(config):
    return f"npu base seed: {config.npu_seed} (reproduce with --seed {config.npu_seed})"


# RTL tests that start a large Verilator build (the model's C++ takes a minute or
# more of CPU) or run long, longest first: measured with `make test
# PYTEST_ARGS=--durations=40` on a fresh clone. The others follow in file order.
LONG_RTL_TESTS = (
    "tests/test_fastsim.py::test_fast_path_equals_cocotb_path",  # the cocotb NPU
    "tests/test_vector.py::test_random_sequence_verilator",  # the vector harness
    "tests/test_adaptive_rtl.py::",  # the default fast library
    "tests/test_compiler_streaming.py::test_streamed_gemm_on_the_rtl",  # the small one
    "tests/test_array.py::test_random_sequence_verilator",
    "tests/test_npu.py::test_random_programs",
    "tests/test_scratchpad.py::test_random_traffic_verilator",
    "tests/test_dma.py::test_dma_verilator",
    "tests/test_bridge.py::test_bridge_verilator",
)


def _run_order(item) -> tuple[int, int]:
    """The RTL tests first, the long ones of them first: under `-n 2 --dist
    worksteal` (make test) the worker that runs out of short tests steals from the
    other's tail, so the session ends on short tests, not on a build started last."""
    if "rtl" not in item.keywords:
        return (1, 0)
    rank = next((i for i, prefix in enumerate(LONG_RTL_TESTS)
                 if item.nodeid.startswith(prefix)), len(LONG_RTL_TESTS))
    return (0, rank)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_run_order)
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


_CPU_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """User + system CPU of this process and of the children it waited for (Verilator,
    the C++ compiler, cocotb's simulator), which wall time on a shared machine is not."""
    own, children = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.config.getoption("--cpu-times") is not None:
        item.stash[_CPU_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "teardown" and _CPU_START in item.stash:
        report.user_properties.append(("cpu", _cpu_seconds() - item.stash[_CPU_START]))


def _properties(terminalreporter, name: str, when: str):
    """(report, value) of every ``name`` user property of the ``when`` reports (xdist
    carries them from the workers)."""
    return [(r, value) for reports in terminalreporter.stats.values() for r in reports
            if getattr(r, "when", None) == when
            for key, value in getattr(r, "user_properties", ()) if key == name]


def pytest_terminal_summary(terminalreporter, config):
    """The fuzz tests' case counts (``record_property("fuzz", ...)``), so every run
    says how many cases it tried; with ``--cpu-times N``, where the CPU went."""
    lines = [value for _, value in _properties(terminalreporter, "fuzz", "call")]
    if lines:
        terminalreporter.section("fuzz cases tried")
        for line in sorted(lines):
            terminalreporter.write_line(line)
    count = config.getoption("--cpu-times")
    if count is not None:
        _report_cpu(terminalreporter, _properties(terminalreporter, "cpu", "teardown"), count)


def _report_cpu(terminalreporter, measured, count: int) -> None:
    per_file: dict[str, float] = {}
    for report, seconds in measured:
        path = report.nodeid.split("::")[0]
        per_file[path] = per_file.get(path, 0.0) + seconds
    terminalreporter.section("CPU seconds per file (tests, their builds and simulations)")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}  all tests")
    terminalreporter.section(f"CPU seconds of the {count} costliest tests")
    for report, seconds in sorted(measured, key=lambda rs: -rs[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}  {report.nodeid}")
