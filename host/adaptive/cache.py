"""The compiled-unit cache: compiled units and plans persisted in sqlite, shared across
processes.

The adaptive runtime compiles many plans (the initial cut of a model, merged
units, de-fused ones, specialized variants). Compiling is off the inference
path but not free, and a plan compiled once never needs compiling again for the
same model on the same hardware. :class:`CompileCache` stores every compiled
plan under the key

``(graph signature, plan, hardware profile, specialization)``

* the graph signature (:func:`graph_signature`) digests the structure and the
  constants of the simplified graph, so a changed weight is another model;
* the plan (:func:`plan_key`) is the tuple of units, each a tuple of node names
  in graph order;
* the hardware profile is :func:`host.profiles.profile_key` of the configuration
  (read from the device's CAPS), so another build never gets this build's program;
* the specialization names a specialized variant ("" is the generic unit).

A plan the compiler refuses (:class:`~host.compiler.plan.CompileError`) is stored
too, as a negative entry, so it is not recompiled on every attempt.

Underneath the plans, a second table stores every unit compiled on its own into
relocatable code (:mod:`host.compiler.units`) under the key

``(unit key, hardware profile, variant)``

* the unit key digests the unit's signature (:func:`unit_signature`) and its
  context in the model (:meth:`host.compiler.compile._Compiler.unit_context`: node
  names, the residency and bytes of its weight blobs, the layouts of its DRAM
  tensors, the weights partition size, the result registers in use), the facts
  every plan of the model agrees on;
* the variant names a variant of the unit's lowering ("" today: the one lowering).

A plan the cache has not seen compiles only the units it lacks and links them
(:func:`~host.compiler.compile_model` with the cache as ``unit_store``).

A third table keeps what the specializer measured (:meth:`CompileCache.measured`):
per unit signature and measured profile (:func:`host.profiles.measured_key`), the
cycles of each variant tried.

The store is one sqlite table in WAL mode (readers never wait for a writer);
every process and thread may open the same file. An entry that cannot be read
back (damaged, written by another cache format or another compiler version) is a
miss, counted as ``stale`` and replaced: the cache never returns a program it
cannot vouch for. Entries are pickles: the cache file is trusted local data,
like the compiler itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import pickle
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from firmware.config import NPUConfig

from ..compiler import CompiledModel, CompileError, compile_model, initial_units
from ..compiler.compile import ProgramTooLong, blobs_remembered
from ..compiler.plan import check_supported
from ..compiler.units import UnitCode
from ..errors import ModelError
from ..ir import Graph, Node, Subgraph
from ..profiles import PROFILES, profile_key, profile_name

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Layout of a stored entry; bump it when the pickled pieces change."""

_TABLE = "compiled"
_UNITS = "units"
_OUTCOMES = "specialize_outcomes"
_KEYS = {"compiled": ("graph", "names", "plan", "profile", "specialization"),
         "units": ("unit", "profile", "variant"),
         _OUTCOMES: ("unit", "profile")}
_OUTCOME_COLUMNS = ("unit", "profile", "measured")
_OUTCOME_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {_OUTCOMES} (
    unit TEXT NOT NULL, profile TEXT NOT NULL, measured TEXT NOT NULL,
    PRIMARY KEY (unit, profile))"""
_UNIT_COLUMNS = ("unit", "profile", "variant", "version", "kind", "model", "digest", "blob",
                 "size", "created")
_UNIT_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {_UNITS} (
    unit TEXT NOT NULL, profile TEXT NOT NULL, variant TEXT NOT NULL, version TEXT NOT NULL,
    kind TEXT NOT NULL, model TEXT NOT NULL, digest TEXT NOT NULL, blob BLOB NOT NULL,
    size INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (unit, profile, variant))"""
_COLUMNS = ("graph", "names", "plan", "profile", "specialization", "version", "kind",
            "model", "config", "digest", "blob", "size", "created")
_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
    graph TEXT NOT NULL, names TEXT NOT NULL, plan TEXT NOT NULL, profile TEXT NOT NULL,
    specialization TEXT NOT NULL, version TEXT NOT NULL, kind TEXT NOT NULL,
    model TEXT NOT NULL, config TEXT NOT NULL, digest TEXT NOT NULL, blob BLOB NOT NULL,
    size INTEGER NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (graph, names, plan, profile, specialization))"""

# Sources whose change can change a compiled program: an entry written by another
# version of them is stale.
_COMPILER_SOURCES = ("host/compiler/*.py", "host/ir.py", "firmware/asm.py", "firmware/isa.py",
                     "firmware/config.py")


def default_cache_path() -> Path:
    """``$NPU_CACHE_DIR/compile.sqlite``, else ``~/.cache/npu/compile.sqlite``."""
    base = os.environ.get("NPU_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "npu"
    return root / "compile.sqlite"


_version_memo: list[str] = []


def cache_version() -> str:
    """The version stamp of entries this process writes and accepts.

    The cache format version and a digest of the compiler's sources: an entry
    compiled by another version of the compiler is stale, never served.
    """
    if not _version_memo:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for pattern in _COMPILER_SOURCES:
            for f in sorted(root.glob(pattern)):
                h.update(f.relative_to(root).as_posix().encode() + b"\0")
                h.update(f.read_bytes())
        _version_memo.append(f"{FORMAT_VERSION}:{h.hexdigest()[:16]}")
    return _version_memo[0]


# ---- which files the cache may use ------------------------------------------------------------


APPLICATION_ID = int.from_bytes(b"NPUc", "big")
"""``PRAGMA application_id`` of a compile cache: how a file is recognised as one."""

_SQLITE_MAGIC = b"SQLite format 3\x00"
_APPLICATION_ID_OFFSET = 68  # in the sqlite file header, big-endian


class CacheFileError(Exception):
    """A ``--cache`` path the cache refuses to use; the message says why and what to do."""


def _refuse(path: Path, why: str):
    raise CacheFileError(f"compile cache {path}: {why}; pass another --cache PATH, "
                         "or --no-cache")


def _refuse_unless_usable(path: Path) -> bool:
    """Raise :class:`CacheFileError` unless ``path`` is absent, empty, or this project's
    cache; return whether that cache is read-only (the file or its directory). Looks
    only at the file header: nothing is opened for writing, so a refused path is
    left exactly as it was (bytes and times)."""
    if path.is_dir():
        _refuse(path, "is a directory")
    if path.exists() and not path.is_file():
        _refuse(path, "is not a regular file")
    parent = path.parent
    if not path.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            _refuse(path, f"cannot create its directory ({err.strerror})")
        if not _writable(parent):
            _refuse(path, f"its directory {parent} is not writable")
        return False
    # sqlite writes the file and, beside it, the WAL and lock files
    read_only = not _writable(path) or not _writable(parent)
    header = _file_header(path)
    if not header:
        if read_only:
            _refuse(path, "is empty and read-only (the file or its directory)")
        return False  # an empty file: sqlite makes it a new database
    if not header.startswith(_SQLITE_MAGIC):
        _refuse(path, "is not an sqlite database (not an npu compile cache)")
    app_id = int.from_bytes(header[_APPLICATION_ID_OFFSET:_APPLICATION_ID_OFFSET + 4], "big")
    if app_id == 0 and _is_unmarked_cache(path):
        return read_only  # written before caches were marked: it gets the mark on open
    if app_id != APPLICATION_ID:
        _refuse(path, f"is another application's sqlite database (application_id "
                f"{app_id:#x}, an npu compile cache has {APPLICATION_ID:#x})")
    return read_only


def _is_unmarked_cache(path: Path) -> bool:
    """Whether the unmarked sqlite file holds exactly this cache's table (read-only look)."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")]
            cols = tuple(r[1] for r in db.execute(f"PRAGMA table_info({_TABLE})"))
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False
    return sorted(tables) in ([_TABLE], [_TABLE, _UNITS]) and cols == _COLUMNS


def _writable(path: Path) -> bool:
    """Writable, and meant to be: root may write anything, but a file or directory
    without its owner's write bit was made read-only on purpose."""
    return os.access(path, os.R_OK | os.W_OK) and bool(path.stat().st_mode & stat.S_IWUSR)


def _file_header(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(100)


def _move_aside(path: Path) -> Path:
    """Rename this project's damaged cache (and its WAL files) to a name no file has."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
        try:
            os.link(path, aside)  # fails when the name is taken: never overwrites
        except FileExistsError:
            continue
        break
    os.unlink(path)
    for suffix in ("-wal", "-shm"):
        side = Path(str(path) + suffix)
        if side.exists():
            os.replace(side, Path(str(aside) + suffix))
    return aside


# ---- signatures ------------------------------------------------------------------------------


class _Digest:
    """Feeds Python/numpy values into sha256 with type tags (no two values collide)."""

    def __init__(self):
        self.h = hashlib.sha256()

    def tag(self, t: bytes, payload: bytes = b""):
        self.h.update(t + len(payload).to_bytes(8, "little") + payload)

    def feed(self, v: Any):
        if v is None:
            self.tag(b"N")
        elif isinstance(v, (bool, np.bool_)):
            self.tag(b"B", b"1" if v else b"0")
        elif isinstance(v, (int, np.integer)):
            self.tag(b"I", str(int(v)).encode())
        elif isinstance(v, (float, np.floating)):
            self.tag(b"F", float(v).hex().encode())
        elif isinstance(v, str):
            self.tag(b"S", v.encode())
        elif isinstance(v, (bytes, bytearray)):
            self.tag(b"Y", bytes(v))
        elif isinstance(v, np.ndarray):
            self.tag(b"A", f"{v.dtype.str}{v.shape}".encode())
            self.tag(b"a", np.ascontiguousarray(v).tobytes())
        elif isinstance(v, (list, tuple)):
            self.tag(b"L", str(len(v)).encode())
            for x in v:
                self.feed(x)
        elif isinstance(v, dict):
            self.tag(b"D", str(len(v)).encode())
            for k in sorted(v, key=str):
                self.feed(k)
                self.feed(v[k])
        elif isinstance(v, Graph):
            self.graph(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            self.tag(b"C", type(v).__qualname__.encode())
            skip = ("name",) if isinstance(v, Node) else ()
            for f in dataclasses.fields(v):
                if f.name not in skip:
                    self.tag(b"f", f.name.encode())
                    self.feed(getattr(v, f.name))
        else:
            raise TypeError(f"cannot digest a {type(v).__name__} ({v!r})")

    def graph(self, g: Graph):
        """The graph's boundary, its tensors in order of first use, then its nodes."""
        self.tag(b"G")
        self.feed(list(g.inputs))
        self.feed(list(g.outputs))
        seen: set[str] = set()
        order = list(g.inputs) + [t for n in g.nodes for t in (*n.inputs, *n.outputs)]
        order += sorted(set(g.tensors) - set(order))
        for t in order:
            if t in g.tensors and t not in seen:
                seen.add(t)
                self.feed(g.tensors[t])
        self.tag(b"n", str(len(g.nodes)).encode())
        for n in g.nodes:
            self.tag(b"O", n.op.encode())
            self.feed(n)

    def hex(self, n: int = 32) -> str:
        return self.h.hexdigest()[:n]


def graph_signature(graph: Graph) -> str:
    """A digest of ``graph``'s structure and constants (32 hex digits).

    In graph order: every node's operator and its compute parameters (every
    dataclass field but the node's name: tensor names, placement, weights,
    biases, requantization, geometry; ``If`` branches recursively), every
    tensor's shape, dtype, quantization and constant bytes. Equal for the same
    model loaded twice; different when any of that changes (one weight byte).
    Node names are not part of it (the plan names the nodes).
    """
    d = _Digest()
    d.graph(graph)
    return d.hex()


def _names_digest(graph: Graph) -> str:
    d = _Digest()
    d.feed([n.name for _, n in graph.walk()])
    return d.hex(16)


def _index(graph: Graph):
    order: dict[str, int] = {}
    nodes: dict[str, Node] = {}
    tensors: dict = {}
    scopes = [graph]
    for g, n in graph.walk():
        order.setdefault(n.name, len(order))
        nodes.setdefault(n.name, n)
        if g not in scopes:
            scopes.append(g)
    for g in scopes:
        for name, t in g.tensors.items():
            tensors.setdefault(name, t)
    return order, nodes, tensors, scopes


def _unit_names(u) -> list[str]:
    if isinstance(u, Subgraph):
        return list(u.nodes)
    if isinstance(u, str):
        raise TypeError(f"a unit is a list of node names, got the string {u!r}")
    return list(u)


def unit_signature(graph: Graph, nodes: Iterable[str] | Subgraph) -> str:
    """A structural digest of one unit of ``graph`` (32 hex digits); names do not count.

    Covers, in graph order, the unit's operators and compute parameters, its
    constants, the shape, dtype and quantization of every tensor it reads or
    writes, and which of its outputs leave the unit. Tensors are numbered by first
    use, so two units that compute the same thing on the same kinds of tensors
    (an expert copied under other names) share a signature; different weights give
    different signatures. The runtime keys per-unit metadata on it.
    """
    order, by_name, tensors, scopes = _index(graph)
    names = _unit_names(nodes)
    missing = [nm for nm in names if nm not in by_name]
    if missing:
        raise KeyError(f"no node {missing[0]!r} in graph {graph.name!r}")
    chosen = sorted({by_name[nm] for nm in names}, key=lambda n: order[n.name])
    inside = {n.name for n in chosen}
    read_outside = {t for _, n in graph.walk() if n.name not in inside for t in n.inputs}
    read_outside.update(t for g in scopes for t in g.outputs)

    d = _Digest()
    labels: dict[str, str] = {}
    counts = {"c": 0, "i": 0, "t": 0}

    def label(t: str, kind: str) -> str:
        if t not in labels:
            labels[t] = f"{kind}{counts[kind]}"
            counts[kind] += 1
            tensor = tensors.get(t)
            d.tag(b"T", labels[t].encode())
            if tensor is None:
                d.tag(b"?")
            else:
                d.feed((tensor.shape, tensor.dtype, tensor.quant, tensor.data, tensor.io_dtype))
            if kind == "t":
                d.feed(t in read_outside)
        return labels[t]

    for n in chosen:
        ins = [label(t, "c" if t in tensors and tensors[t].is_const else "i")
               for t in n.inputs]
        outs = [label(t, "t") for t in n.outputs]
        d.tag(b"O", n.op.encode())
        d.feed((ins, outs))
        for f in dataclasses.fields(n):
            if f.name not in ("name", "inputs", "outputs"):
                d.tag(b"f", f.name.encode())
                d.feed(getattr(n, f.name))
    return d.hex()


def plan_key(graph: Graph, plan: Iterable) -> tuple[tuple[str, ...], ...]:
    """The canonical form of a plan: per unit (in plan order), its node names in graph order.

    ``plan`` holds lists of node names or :class:`~host.ir.Subgraph` records. Names
    the graph does not have sort last (the compiler will refuse the plan).
    """
    order = {n.name: i for i, (_, n) in enumerate(graph.walk())}
    last = len(order)
    return tuple(tuple(sorted(_unit_names(u), key=lambda s: (order.get(s, last), s)))
                 for u in plan)


def _plan_text(graph: Graph, plan: list) -> str:
    units = [list(u) for u in plan_key(graph, plan)]
    ids = [u.id if isinstance(u, Subgraph) else i + 1 for i, u in enumerate(plan)]
    if ids == list(range(1, len(plan) + 1)):
        return json.dumps(units, separators=(",", ":"))
    # Region ids are compiled into the program: other ids are another program.
    return json.dumps({"units": units, "ids": ids}, separators=(",", ":"))


class CacheKey(NamedTuple):
    """Where one compiled plan lives in the cache (every part is text)."""

    graph: str
    names: str
    plan: str
    profile: str
    specialization: str


# ---- the cache ---------------------------------------------------------------------------------


_MISS = object()


class _OtherVersion(ValueError):
    """A cache entry another compiler version wrote."""


class CompileCache:
    """A persistent cache of compiled plans (see the module docstring for the key).

    Parameters
    ----------
    path : the sqlite file (created with its directory), or None for an in-memory
        cache private to this object (tests). :func:`default_cache_path` is the
        usual file. A path that is not this project's cache raises
        :class:`CacheFileError` and is left as it was. This project's cache on a
        read-only file or directory is opened read-only (:attr:`read_only`).
    fresh : serve nothing stored: every lookup misses, and what is compiled
        replaces the entry (``npu run --fresh``).

    Members
    -------
    path : the file, or None.
    hits, misses : lookups that found / did not find a usable entry (a stored
        refusal is a hit).
    compiles : compilations run by :meth:`get_or_compile`.
    unit_hits, unit_compiles : units found in the cache / compiled and stored while
        compiling plans (a plan compile lowers only the units the cache lacks).
    stale : entries found unreadable or from another version, dropped and
        counted as misses.
    negative_hits : hits on stored refusals.
    evicted : entries removed by :meth:`evict`.
    read_only : the file cannot be written: it is read as it is (never locked,
        its write-ahead log unread), what this object stores stays in its memory,
        and what it evicts or drops is hidden from its lookups only.

    The object may be used from several threads; other processes open their own
    (a pickled cache reopens its file in the receiving process).
    """

    def __init__(self, path: str | Path | None, *, fresh: bool = False):
        self.path = None if path is None else Path(path)
        self.fresh = fresh
        self.hits = self.misses = self.compiles = self.stale = self.negative_hits = 0
        self.stale_versions = 0  # of ``stale``: entries another compiler version wrote
        self.evicted = 0
        self.unit_hits = self.unit_compiles = 0
        self._held_rows: dict | None = None  # see hold_writes
        self.read_only = False
        self._kept: dict = {}  # (table, key) -> (table, row) stored by a read-only cache
        self._hidden: set = set()  # (table, key) a read-only cache evicted or dropped
        self._lock = threading.RLock()
        self._orphans: list = []
        self._outcomes_readable = True  # a read-only file may lack the outcomes table
        self._db = self._connect()

    # ---- connection --------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        self._pid = os.getpid()
        if self.path is None:
            db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            db.execute(_SCHEMA)
            db.execute(_UNIT_SCHEMA)
            db.execute(_OUTCOME_SCHEMA)
            return db
        if _refuse_unless_usable(self.path):
            self.read_only = True
            try:
                return self._open_read_only()
            except sqlite3.DatabaseError as err:
                _refuse(self.path, f"is read-only and cannot be read as a compile cache "
                        f"({err})")
        try:
            return self._open_file()
        except sqlite3.DatabaseError as err:
            # Only this project's own file reaches here (see _refuse_unless_usable):
            # damaged, so its entries are lost anyway; keep the bytes for a post-mortem.
            aside = _move_aside(self.path)
            log.warning("compile cache %s is damaged (%s); moved it to %s and started a new "
                        "one", self.path, err, aside)
            return self._open_file()

    def _open_file(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, check_same_thread=False,
                             isolation_level=None)
        try:
            # The mark first: a new file is never seen by another process unmarked.
            if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # Damage in the middle of the file would otherwise surface on some later
            # lookup; a cache is a few MB, so checking it whole on open is cheap.
            status = db.execute("PRAGMA quick_check").fetchone()[0]
            if status != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {status}")
            for table, schema, columns in ((_TABLE, _SCHEMA, _COLUMNS),
                                           (_UNITS, _UNIT_SCHEMA, _UNIT_COLUMNS),
                                           (_OUTCOMES, _OUTCOME_SCHEMA, _OUTCOME_COLUMNS)):
                db.execute(schema)
                cols = tuple(r[1] for r in db.execute(f"PRAGMA table_info({table})"))
                if cols != columns:
                    # A table from another cache format: nothing in it is usable.
                    log.warning("compile cache %s has another format; emptying its %s",
                                self.path, table)
                    db.execute(f"DROP TABLE {table}")
                    db.execute(schema)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _open_read_only(self) -> sqlite3.Connection:
        """The file as it is: no lock, no write-ahead log, no file created beside it."""
        db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                             check_same_thread=False, isolation_level=None)
        try:
            status = db.execute("PRAGMA quick_check").fetchone()[0]
            if status != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {status}")
            for table, columns in ((_TABLE, _COLUMNS), (_UNITS, _UNIT_COLUMNS)):
                cols = tuple(r[1] for r in db.execute(f"PRAGMA table_info({table})"))
                if cols != columns:
                    raise sqlite3.DatabaseError(f"table {table} has another format")
            # A file written before the specializer's table had it has no outcomes.
            self._outcomes_readable = tuple(r[1] for r in db.execute(
                f"PRAGMA table_info({_OUTCOMES})")) == _OUTCOME_COLUMNS
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _conn(self) -> sqlite3.Connection:
        if self.path is not None and os.getpid() != self._pid:
            # A forked child must not use its parent's connection (keep it unclosed).
            self._orphans.append(self._db)
            self._db = self._connect()
        return self._db

    def close(self):
        """Close the database (the object is unusable afterwards)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> CompileCache:
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        if self.path is None:
            raise TypeError("an in-memory CompileCache cannot be sent to another process")
        return {"path": self.path, "fresh": self.fresh}

    def __setstate__(self, state):
        self.__init__(state["path"], fresh=state.get("fresh", False))

    def __repr__(self):
        return f"CompileCache({str(self.path) if self.path else None!r})"

    # ---- keys ------------------------------------------------------------------------------
    def key(self, graph: Graph, plan: list | None, config: NPUConfig,
            specialization: str = "") -> CacheKey:
        """The key of a plan (``plan`` None: :func:`~host.compiler.initial_units`)."""
        if not isinstance(specialization, str):
            raise TypeError(f"specialization must be a string, got {specialization!r}")
        plan = initial_units(graph) if plan is None else list(plan)
        sig, names = _memo(graph, "graph", lambda: (graph_signature(graph),
                                                    _names_digest(graph)))
        return CacheKey(sig, names, _plan_text(graph, plan),
                        profile_key(config), specialization)

    # ---- lookups ---------------------------------------------------------------------------
    def get(self, graph: Graph, plan: list | None, config: NPUConfig,
            specialization: str = "") -> CompiledModel | None:
        """The stored program for this key, or None.

        ``graph`` is the simplified graph (``CompiledModel.graph``); the returned
        model computes on that very object and is a private copy otherwise.
        Raises the stored :class:`CompileError` when the compiler refused the plan.
        """
        key = self.key(graph, plan, config, specialization)
        found = self._lookup(key, graph)
        return self._count(found)

    def get_or_compile(self, graph: Graph, plan: list | None, config: NPUConfig,
                       specialization: str = "",
                       compile_fn: Callable[[], CompiledModel] | None = None,
                       ) -> tuple[CompiledModel, bool]:
        """The stored program, or compile it now and store it: ``(model, hit)``.

        ``compile_fn`` defaults to linking the plan from the cache's compiled units,
        lowering the ones it lacks (``compile_model(..., unit_store=...)``), and
        when that program does not fit the instruction bank, to
        ``compile_model(graph, config, plan, simplified=True)`` (units lowered in
        place, each after the code before it: fewer ``cfg`` writes);
        a specialized variant passes its own. A
        :class:`CompileError` (fresh or stored) is raised and stored. On a miss
        the plan's :class:`~host.ir.Subgraph` records (if any) are filled by the
        compiler; on a hit they are not: read ``model.units``.
        """
        key = self.key(graph, plan, config, specialization)
        found = self._lookup(key, graph)
        if found is not _MISS:
            return self._count(found), True
        with self._lock:
            self.misses += 1
            self.compiles += 1
        if compile_fn is None:
            units = initial_units(graph) if plan is None else list(plan)

            def compile_fn():
                try:
                    return compile_model(graph, config, units, simplified=True,
                                         unit_store=self.unit_store(config, specialization))
                except ProgramTooLong:
                    # Linked units set up their own cfg and registers, so a program
                    # near the bank's size may fit only lowered in place.
                    return compile_model(graph, config, units, simplified=True)

        try:
            model = compile_fn()
        except CompileError as err:
            self._store(key, graph, config, err)
            raise
        self._store(key, graph, config, model)
        return model, False

    def put(self, graph: Graph, plan: list | None, config: NPUConfig,
            result: CompiledModel | CompileError, specialization: str = ""):
        """Store a compiled plan, or the compiler's refusal of it (replaces the entry)."""
        if not isinstance(result, (CompiledModel, CompileError)):
            raise TypeError(f"expected a CompiledModel or a CompileError, got "
                            f"{type(result).__name__}")
        self._store(self.key(graph, plan, config, specialization), graph, config, result)

    def _count(self, found):
        if found is _MISS:
            with self._lock:
                self.misses += 1
            return None
        with self._lock:
            self.hits += 1
            if isinstance(found, CompileError):
                self.negative_hits += 1
        if isinstance(found, CompileError):
            raise found
        return found

    def _lookup(self, key: CacheKey, graph: Graph):
        return self._read(_TABLE, key, lambda kind, blob: self._decode(kind, blob, key, graph))

    def _read(self, table: str, key: tuple, decode: Callable[[str, bytes], Any]):
        """The entry under ``key`` decoded, or ``_MISS``; an entry that is damaged or of
        another compiler version is dropped (and counted stale), never served."""
        if self.fresh:
            return _MISS
        columns = _KEYS[table]
        row = self._held(table, key)
        if row is None and (table, tuple(key)) in self._hidden:
            return _MISS
        if row is None:
            with self._lock:
                row = self._conn().execute(
                    f"SELECT version, kind, digest, blob FROM {table} WHERE "
                    + " AND ".join(f"{c}=?" for c in columns), key).fetchone()
        if row is None:
            return _MISS
        version, kind, digest, blob = row
        try:
            if version != cache_version():
                raise _OtherVersion(f"version {version}, this compiler writes "
                                    f"{cache_version()}")
            if hashlib.sha256(blob).hexdigest()[:32] != digest:
                raise ValueError("the stored bytes do not match their digest")
            return decode(kind, blob)
        except Exception as err:  # any damage at all: never serve it
            # Entries of another compiler version are routine after an upgrade: said
            # once per cache; damage is said every time.
            if not isinstance(err, _OtherVersion) or not self.stale_versions:
                log.warning("dropping a stale compile-cache entry (%s)%s", err,
                            "; others of that kind are dropped as met"
                            if isinstance(err, _OtherVersion) else "")
            self.stale_versions += isinstance(err, _OtherVersion)
            with self._lock:
                self.stale += 1
                if self.read_only:
                    self._kept.pop((table, tuple(key)), None)
                    self._hidden.add((table, tuple(key)))
                else:
                    self._conn().execute(
                        f"DELETE FROM {table} WHERE "
                        + " AND ".join(f"{c}=?" for c in (*columns, "digest")),
                        (*key, digest))
            return _MISS

    @staticmethod
    def _decode(kind: str, blob: bytes, key: CacheKey, graph: Graph):
        obj = pickle.loads(blob)
        if kind == "error":
            return _refusal(obj)
        if kind != "program" or not isinstance(obj, CompiledModel):
            raise ValueError(f"an entry of kind {kind!r} holds a {type(obj).__name__}")
        if profile_key(obj.config) != key.profile:
            raise ValueError("the entry was compiled for another profile")
        if obj.graph is None:
            obj.graph = graph
        return obj

    def _store(self, key: CacheKey, graph: Graph, config: NPUConfig,
               result: CompiledModel | CompileError):
        if isinstance(result, CompileError):
            kind, blob = "error", _refusal_blob(result)
        else:
            kind = "program"
            # The graph is the caller's (the key vouches for it): store the rest.
            stored = dataclasses.replace(result, graph=None) if result.graph is graph \
                else result
            blob = pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL)
        row = (*key, cache_version(), kind, graph.name,
               json.dumps(config.as_dict(), sort_keys=True),
               hashlib.sha256(blob).hexdigest()[:32], blob, len(blob), time.time())
        self._write(_TABLE, row)

    # ---- writes held back ------------------------------------------------------------------
    def hold_writes(self) -> None:
        """Keep what is stored from now on in this object (lookups see it) until
        :meth:`take_held`: a compile process hands its entries to the one process that
        writes, so processes never wait on each other for the file's write lock."""
        self._held_rows = {}

    def take_held(self) -> list[tuple[str, tuple]]:
        """The held ``(table, row)`` entries; writes go to the file again."""
        rows, self._held_rows = list((self._held_rows or {}).values()), None
        return rows

    def write_rows(self, rows: list[tuple[str, tuple]]) -> None:
        """Store entries another process held (:meth:`take_held`), in one transaction."""
        with self._lock:
            if self.read_only:
                for table, row in rows:
                    self._keep(table, row)
                return
            db = self._conn()
            db.execute("BEGIN")
            try:
                for table, row in rows:
                    self._insert(db, table, row)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _held(self, table: str, key: tuple):
        """A held entry (or one a read-only cache kept) as the file's query returns it
        (version, kind, digest, blob)."""
        found = (self._held_rows or {}).get((table, tuple(key))) or \
            self._kept.get((table, tuple(key)))
        if found is None:
            return None
        row = found[1]
        n = len(key)
        return row[n], row[n + 1], row[-4], row[-3]

    def _write(self, table: str, row: tuple) -> None:
        n = len(_KEYS[table])
        with self._lock:
            if self._held_rows is not None:
                self._held_rows[(table, tuple(row[:n]))] = (table, row)
                return
            if self.read_only:
                self._keep(table, row)
                return
            self._insert(self._conn(), table, row)

    def _keep(self, table: str, row: tuple) -> None:
        key = (table, tuple(row[:len(_KEYS[table])]))
        self._kept[key] = (table, row)
        self._hidden.discard(key)

    def _delete(self, table: str, key: tuple) -> int:
        """Remove one entry (for a read-only cache: from what it shows); how many."""
        key = tuple(key)
        if self.read_only:
            kept = self._kept.pop((table, key), None) is not None
            stored = (table, key) not in self._hidden and self._conn().execute(
                f"SELECT 1 FROM {table} WHERE "
                + " AND ".join(f"{c}=?" for c in _KEYS[table]), key).fetchone() is not None
            self._hidden.add((table, key))
            return int(kept or stored)
        return self._conn().execute(
            f"DELETE FROM {table} WHERE " + " AND ".join(f"{c}=?" for c in _KEYS[table]),
            key).rowcount

    @staticmethod
    def _insert(db, table: str, row: tuple) -> None:
        columns = {_TABLE: _COLUMNS, _UNITS: _UNIT_COLUMNS, _OUTCOMES: _OUTCOME_COLUMNS}[table]
        db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES "
                   f"({', '.join('?' * len(columns))})", row)

    # ---- units ----------------------------------------------------------------------------
    def unit_store(self, config: NPUConfig, variant: str = "") -> _UnitStore:
        """This cache as the compiler's :class:`~host.compiler.units.UnitStore` for one
        hardware profile and unit variant."""
        return _UnitStore(self, profile_key(config), variant)

    def has_unit(self, key: tuple) -> bool:
        """Whether a unit entry of this compiler version is stored under ``key``
        (``(unit key, profile key, variant)``); its bytes are checked when it is read."""
        if self.fresh:
            return False
        if self._held(_UNITS, key) is not None:
            return True
        with self._lock:
            return self._conn().execute(
                f"SELECT 1 FROM {_UNITS} WHERE unit=? AND profile=? AND variant=? AND "
                "version=?", (*key, cache_version())).fetchone() is not None

    def _unit_lookup(self, key: tuple):
        return self._read(_UNITS, key, _decode_unit)

    def _unit_store_row(self, key: tuple, model: str, result):
        if isinstance(result, CompileError):
            kind, blob = "error", _refusal_blob(result)
        else:
            kind = "unit"
            blob = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        row = (*key, cache_version(), kind, model, hashlib.sha256(blob).hexdigest()[:32],
               blob, len(blob), time.time())
        with self._lock:
            self.unit_compiles += 1
        self._write(_UNITS, row)

    def _evict_units(self, graph: Graph, plan: list | None, config: NPUConfig,
                     variant: str = "") -> int:
        """Remove the stored units a plan links (its program failed validation);
        ``variant``: the specialization they were stored under."""
        store = _UnitStore(self, profile_key(config), variant, record=True)
        units = initial_units(graph) if plan is None else list(plan)
        try:
            compile_model(graph, config, units, simplified=True, unit_store=store)
        except CompileError:
            pass
        with self._lock:
            return sum(self._delete(_UNITS, key) for key in store.seen)

    # ---- measurements ----------------------------------------------------------------------
    def measured(self, unit: str, profile: str) -> dict[str, float]:
        """What the specializer measured of unit signature ``unit``'s variants on
        ``profile`` (a :func:`~host.profiles.measured_key`): variant (as
        :meth:`~host.compiler.variants.Variant.describe` says it) -> cycles."""
        if self.fresh:
            return {}
        key = (unit, profile)
        with self._lock:
            found = (self._held_rows or {}).get((_OUTCOMES, key)) or \
                self._kept.get((_OUTCOMES, key))
            if found is not None:
                return json.loads(found[1][2])
            if not self._outcomes_readable:
                return {}
            row = self._conn().execute(
                f"SELECT measured FROM {_OUTCOMES} WHERE unit=? AND profile=?", key).fetchone()
        return json.loads(row[0]) if row else {}

    def put_measured(self, unit: str, profile: str, measured: dict[str, float]) -> None:
        """Store what :meth:`measured` returns for ``unit`` on ``profile`` (a
        read-only cache keeps it in this object)."""
        self._write(_OUTCOMES, (unit, profile, json.dumps(measured, sort_keys=True)))

    # ---- inspection ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters of this object and the size of the store."""
        with self._lock:
            count, size = self._conn().execute(
                f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {_TABLE}").fetchone()
            units, unit_bytes = self._conn().execute(
                f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {_UNITS}").fetchone()
            return {"hits": self.hits, "misses": self.misses, "compiles": self.compiles,
                    "stale": self.stale, "negative_hits": self.negative_hits,
                    "evicted": self.evicted, "unit_hits": self.unit_hits,
                    "unit_compiles": self.unit_compiles, "units": units,
                    "unit_bytes": unit_bytes,
                    "entries": count, "bytes": size,
                    "path": str(self.path) if self.path else None}

    def entries(self, profile: str | NPUConfig | None = None) -> list[dict]:
        """The stored entries, oldest first; ``profile`` (a name, a configuration or a
        :func:`~host.profiles.profile_key`) keeps one profile's.

        Each is a dict: ``model`` (graph name), ``graph`` (signature), ``plan``
        (tuple of units, each a tuple of node names; ``ids`` when not 1..n),
        ``profile`` (key), ``profile_name`` (or None), ``config``,
        ``specialization``, ``kind`` ("program" or "error"), ``current`` (written by
        this compiler version), ``size`` (bytes) and ``created`` (Unix time).
        """
        query, args = f"SELECT * FROM {_TABLE}", ()
        if profile is not None:
            if isinstance(profile, NPUConfig):
                pk = profile_key(profile)
            else:
                pk = profile_key(PROFILES[profile]) if profile in PROFILES else profile
            query, args = query + " WHERE profile=?", (pk,)
        with self._lock:
            rows = self._conn().execute(query + " ORDER BY created", args).fetchall()
        out = []
        for row in rows:
            r = dict(zip(_COLUMNS, row, strict=True))
            plan = json.loads(r["plan"])
            ids = None
            if isinstance(plan, dict):
                plan, ids = plan["units"], plan["ids"]
            config = NPUConfig(**json.loads(r["config"]))
            out.append({"model": r["model"], "graph": r["graph"],
                        "plan": tuple(tuple(u) for u in plan), "ids": ids,
                        "profile": r["profile"], "profile_name": profile_name(config),
                        "config": config, "specialization": r["specialization"],
                        "kind": r["kind"], "current": r["version"] == cache_version(),
                        "size": r["size"], "created": r["created"]})
        return out

    def evict(self, graph: Graph, plan: list | None, config: NPUConfig,
              specialization: str = "") -> bool:
        """Remove one entry (a program that failed validation) and the compiled units
        it links; True when there was a plan entry."""
        key = self.key(graph, plan, config, specialization)
        self._evict_units(graph, plan, config, specialization)
        with self._lock:
            n = self._delete(_TABLE, key)
            self.evicted += n
            return n > 0

    def clear(self) -> int:
        """Remove every entry, plans, units and measured outcomes (the counters are
        kept); returns how many plan entries there were."""
        if self.read_only:
            _refuse(self.path, "is read-only: it cannot be cleared")
        with self._lock:
            self._conn().execute(f"DELETE FROM {_OUTCOMES}")
            self._conn().execute(f"DELETE FROM {_UNITS}")
            return self._conn().execute(f"DELETE FROM {_TABLE}").rowcount

    def unit_entries(self) -> list[dict]:
        """The stored units: ``model``, ``profile``, ``variant``, ``kind`` ("unit" or
        "error"), ``current`` (this compiler version) and ``size``."""
        with self._lock:
            rows = self._conn().execute(
                f"SELECT model, profile, variant, kind, version, size FROM {_UNITS} "
                "ORDER BY created").fetchall()
        return [{"model": m, "profile": p, "variant": v, "kind": k,
                 "current": ver == cache_version(), "size": n} for m, p, v, k, ver, n in rows]


def _refusal_blob(err: CompileError) -> bytes:
    return pickle.dumps({"message": err.args[0] if err.args else str(err),
                         "node": getattr(err, "node", "")})


def _refusal(obj: dict) -> CompileError:
    err = CompileError("")
    err.args, err.node = (str(obj["message"]),), str(obj["node"])
    return err


def _decode_unit(kind: str, blob: bytes):
    obj = pickle.loads(blob)
    if kind == "error":
        return _refusal(obj)
    if kind != "unit" or not isinstance(obj, UnitCode):
        raise ValueError(f"a unit entry of kind {kind!r} holds a {type(obj).__name__}")
    return obj


def unit_key(graph: Graph, nodes: list[str], context: tuple) -> str:
    """The cache key of a unit: its signature and its context (32 hex digits)."""
    nodes = tuple(nodes)
    h = hashlib.sha256(_memo(graph, nodes, lambda: unit_signature(graph, nodes)).encode())
    h.update(repr(context).encode())
    return h.hexdigest()[:32]


_memos = threading.local()  # .graphs: id(graph) -> (graph, what -> digest), while on


@contextlib.contextmanager
def digests_remembered():
    """Within it, this thread remembers the digests of each graph object (the graph
    signature, unit signatures) and its packed weight blobs
    (:func:`~host.compiler.compile.blobs_remembered`): compiling the plans of one
    model digests and packs the same graph and units again and again. The graphs
    must not change meanwhile."""
    outer = getattr(_memos, "graphs", None)
    _memos.graphs = {} if outer is None else outer
    try:
        with blobs_remembered():
            yield
    finally:
        _memos.graphs = outer


def _memo(graph: Graph, what, digest: Callable[[], Any]):
    graphs = getattr(_memos, "graphs", None)
    if graphs is None:
        return digest()
    entry = graphs.get(id(graph))
    if entry is None or entry[0] is not graph:
        entry = graphs[id(graph)] = (graph, {})
    if what not in entry[1]:
        entry[1][what] = digest()
    return entry[1][what]


class _UnitStore:
    """A :class:`CompileCache` as the compiler's unit store (one profile, one variant).

    ``record``: remember the key of every unit looked up (``seen``); ``read_only``:
    store nothing (``missing`` says whether a unit was not there)."""

    def __init__(self, cache: CompileCache, profile: str, variant: str, record=False,
                 read_only=False):
        self.cache, self.profile, self.variant = cache, profile, variant
        self.seen: list[tuple] | None = [] if record else None
        self.read_only, self.missing = read_only, False

    def _key(self, graph, nodes, context) -> tuple:
        key = (unit_key(graph, nodes, context), self.profile, self.variant)
        if self.seen is not None:
            self.seen.append(key)
        return key

    def get(self, graph, nodes, context):
        found = self.cache._unit_lookup(self._key(graph, nodes, context))
        if found is _MISS:
            self.missing = True
            return None
        with self.cache._lock:
            self.cache.unit_hits += 1
        if isinstance(found, CompileError):
            raise found
        return found

    def put(self, graph, nodes, context, result):
        if not self.read_only:
            self.cache._unit_store_row(self._key(graph, nodes, context), graph.name, result)


# ---- ahead-of-time compilation -------------------------------------------------------------------


def precompile_plans(graph: Graph, limit: int = 64) -> list[tuple[str, list[Subgraph]]]:
    """The plans ``npu precompile`` fills the cache with: ``(label, plan)`` pairs.

    Every plan the adaptive runtime can reach by merging chains: within each scope,
    the initial units (:func:`~host.compiler.initial_units`) cut into runs of
    consecutive units, each run one unit with the region id the runtime gives it
    (:func:`~host.adaptive.units.merged_unit_id`); all combinations over scopes,
    fewest merges first, at most ``limit``. ``graph`` is simplified.
    """
    units = [Subgraph(i + 1, u) for i, u in enumerate(initial_units(graph))]
    return _merge_plans(graph, units, [], limit)


def speculative_plans(graph: Graph, limit: int = 64
                      ) -> list[tuple[str, Graph, list[Subgraph]]]:
    """The speculative plans the runtime can reach: ``(label, hoisted graph, plan)``.

    For every branch body decided by an ArgMax on the NPU, the graph with that body
    hoisted (:func:`~host.adaptive.speculate.hoist`) and its units merged into the
    gate's unit (the id the runtime gives it), with every chain merge of the other
    units; at most ``limit`` in all.
    """
    from .speculate import gate_unit, hoist, leaves
    from .units import SPEC_BASE

    units = [Subgraph(i + 1, u) for i, u in enumerate(initial_units(graph))]
    owner = {n: u for u in units for n in u.nodes}
    out = []
    for leaf in leaves(graph):
        gate = gate_unit(graph, leaf, owner)
        if gate is None:
            continue
        body = [u for u in units if set(u.nodes) <= set(leaf.npu_nodes)]
        ids = [gate.id] + [u.id for u in body]
        spec = Subgraph(SPEC_BASE + min(ids) * 64 + max(ids),
                        gate.nodes + [m for u in body for m in u.nodes])
        rest = [u for u in units if u.id not in ids]
        try:
            hoisted = hoist(graph, leaf)
        except CompileError:
            continue
        for label, plan in _merge_plans(hoisted, rest, [spec], limit):
            out.append((f"bet on {leaf.describe()}" + ("" if label == "initial"
                                                         else f", {label}"), hoisted, plan))
    return out[:limit]


def _merge_plans(graph: Graph, units: list[Subgraph], fixed: list[Subgraph],
                 limit: int) -> list[tuple[str, list[Subgraph]]]:
    """``fixed`` plus every way to merge runs of consecutive same-scope ``units``."""
    from .units import merged_unit_id

    scope = {n.name: id(g) for g, n in graph.walk()}
    groups: list[list[Subgraph]] = []  # consecutive units of one scope
    for u in units:
        if groups and scope[groups[-1][-1].nodes[0]] == scope[u.nodes[0]] \
                and groups[-1][-1].id + 1 == u.id:
            groups[-1].append(u)
        else:
            groups.append([u])

    def cuts(group):  # every way to cut a run of units into consecutive merges
        for mask in range(1 << (len(group) - 1)):
            out, run = [], [group[0]]
            for i, u in enumerate(group[1:]):
                if mask >> i & 1:
                    run.append(u)
                else:
                    out.append(run)
                    run = [u]
            out.append(run)
            yield out

    order = {n.name: i for i, (_, n) in enumerate(graph.walk())}
    plans = []
    if math.prod(1 << (len(g) - 1) for g in groups) > _MAX_CUTS:
        combos = _fewest_merges(groups, limit)
    else:
        combos = itertools.product(*(list(cuts(g)) for g in groups))
    for combo in combos:
        runs = [r for part in combo for r in part]
        merged = [r for r in runs if len(r) > 1]
        plan = [r[0] if len(r) == 1 else
                Subgraph(merged_unit_id([u.id for u in r]), [n for u in r for n in u.nodes])
                for r in runs] + fixed
        plan.sort(key=lambda u: min(order[n] for n in u.nodes))
        label = "initial" if not merged else "merge " + ", ".join(
            "+".join(n for u in r for n in u.nodes) for r in merged)
        plans.append((len(merged), label, plan))
    plans.sort(key=lambda p: p[0])
    return [(label, plan) for _, label, plan in plans[:limit]]


_MAX_CUTS = 4096  # beyond this many ways to cut, plans are enumerated fewest merges first


def _fewest_merges(groups: list[list[Subgraph]], limit: int):
    """The cuts of ``groups`` with 0, 1, 2, ... merged runs, at most ``limit``: for a
    model whose every way to cut (2 ** (units - 1) per group) cannot be listed."""
    runs = [(g, a, b) for g, group in enumerate(groups)
            for a in range(len(group)) for b in range(a + 2, len(group) + 1)]
    made = 0
    for k in itertools.count():
        if made >= limit or k > len(runs):
            return
        for chosen in itertools.combinations(runs, k):
            spans = sorted(chosen)
            if any(x[0] == y[0] and y[1] < x[2] for x, y in itertools.pairwise(spans)):
                continue  # two runs overlap
            combo = []
            for g, group in enumerate(groups):
                mine = [(a, b) for gg, a, b in spans if gg == g]
                part, at = [], 0
                for a, b in mine:
                    part += [[u] for u in group[at:a]] + [group[a:b]]
                    at = b
                combo.append(part + [[u] for u in group[at:]])
            yield combo
            made += 1
            if made >= limit:
                return


@dataclasses.dataclass
class PrecompileResult:
    """What :func:`precompile` did for one model.

    Members
    -------
    model : the graph's name.
    plans : plans tried.
    compiled : plans compiled now (and stored).
    cached : plans found in the cache already (stored refusals included).
    refused : plans the compiler refused (now or before).
    units : units lowered now (the plans link from them).
    notes : one line per refusal.
    """

    model: str
    plans: int = 0
    compiled: int = 0
    cached: int = 0
    refused: int = 0
    units: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)


def precompile(cache: CompileCache, graph: Graph, config: NPUConfig,
               workers: int = 1, pool=None) -> PrecompileResult:
    """Fill ``cache`` with the :func:`precompile_plans` and :func:`speculative_plans`
    of the simplified ``graph`` for ``config`` (see :func:`precompile_models`).

    Raises :class:`~host.errors.ModelError` (an unsupported operator) when the
    model cannot run on the NPU at all.
    """
    res = precompile_models(cache, [graph], config, workers, pool)[0]
    if isinstance(res, Exception):
        raise res
    return res


def precompile_models(cache: CompileCache, graphs: list[Graph], config: NPUConfig,
                      workers: int = 1, pool=None, busy: list | None = None
                      ) -> list[PrecompileResult | ModelError]:
    """:func:`precompile` for each simplified graph: its result, or the
    :class:`~host.errors.ModelError` (an unsupported operator) that rules it out.

    With ``workers`` > 1 (and a cache file) a pool of that many processes at most
    compiles every model's plans together (:mod:`host.adaptive.pool`; ``pool``: the
    processes of :func:`~host.adaptive.pool.compile_pool` to use; ``busy``: see
    :func:`~host.adaptive.pool.compile_plans_parallel`). Refused plans are noted
    and stored as refusals.
    """
    from .pool import compile_one, compile_plans_parallel

    results: list = []
    jobs: list[tuple[int, str, Graph, list]] = []  # (model, label, graph, plan)
    for m, graph in enumerate(graphs):
        try:
            check_supported(graph)
        except ModelError as err:
            results.append(err)
            continue
        results.append(PrecompileResult(graph.name))
        jobs += [(m, label, graph, plan) for label, plan in precompile_plans(graph)]
        jobs += [(m, label, g, plan) for label, g, plan in speculative_plans(graph)]
    with digests_remembered():
        if workers > 1 and cache.path is not None and not cache.fresh:
            outcomes = compile_plans_parallel(cache, [(g, p) for _, _, g, p in jobs],
                                              config, workers, pool, busy)
        else:
            outcomes = [compile_one(cache, g, p, config) for _, _, g, p in jobs]
    for (m, label, _, _), out in zip(jobs, outcomes, strict=True):
        res = results[m]
        res.plans += 1
        res.units += out.units
        if out.kind == "refused":
            res.refused += 1
            res.cached += not out.fresh
            res.notes.append(f"{res.model}: {label} refused"
                             f"{'' if out.fresh else ' (cached)'}: {out.message}")
        elif out.kind == "hit":
            res.cached += 1
        else:
            res.compiled += 1
    return results


# ---- verification ------------------------------------------------------------------------------


@dataclasses.dataclass
class VerifyResult:
    """What :func:`verify` did: ``entries`` looked at, ``recompiled`` (compared with a
    fresh compile), ``intact`` (the others, whose integrity record held) and
    ``evicted`` (either check failed); ``units`` compiled units checked by their
    integrity record and ``units_evicted`` of them."""

    entries: int = 0
    recompiled: int = 0
    intact: int = 0
    evicted: int = 0
    units: int = 0
    units_evicted: int = 0


def verify(cache: CompileCache, graphs: list[Graph]) -> VerifyResult:
    """Check every entry of ``cache`` and evict the bad ones.

    An entry of one of the simplified ``graphs`` (the plans :func:`precompile`
    makes) is recompiled for its stored configuration and must equal the fresh
    compile: program, constants and partitions, or the same refusal. Any other
    entry (a batch variant, a model not given) is checked by its integrity
    record only: this compiler version, the digest of its bytes, and that it
    decodes. Bounded: one compile per entry at most.
    """
    res = VerifyResult()
    known = _known_plans(cache, graphs)
    with cache._lock:
        rows = cache._conn().execute(
            f"SELECT graph, names, plan, profile, specialization, config FROM {_TABLE}"
        ).fetchall()
    for *key_parts, config_json in rows:
        key = CacheKey(*key_parts)
        res.entries += 1
        job = known.get(key)
        graph = job[0] if job else None
        stored = cache._lookup(key, graph if graph is not None else Graph("unknown"))
        if stored is _MISS:  # failed its integrity record: _lookup dropped it
            res.evicted += 1
            continue
        if job is None:
            res.intact += 1
            continue
        res.recompiled += 1
        config = NPUConfig(**json.loads(config_json))
        if not _same_as_fresh(stored, graph, job[1], config):
            cache.evict(graph, job[1], config)
            res.evicted += 1
        elif not _links_as_fresh(cache, graph, job[1], config):
            res.units_evicted += cache._evict_units(graph, job[1], config)
    # The other units: by their integrity record.
    with cache._lock:
        keys = cache._conn().execute(f"SELECT unit, profile, variant FROM {_UNITS}").fetchall()
    for key in keys:
        res.units += 1
        if cache._unit_lookup(tuple(key)) is _MISS:
            res.units_evicted += 1
    return res


def _known_plans(cache: CompileCache, graphs: list[Graph]) -> dict:
    """Key -> (graph, plan) of every precompiled plan of ``graphs``, for every profile
    the cache holds."""
    with cache._lock:
        configs = [NPUConfig(**json.loads(c)) for (c,) in cache._conn().execute(
            f"SELECT DISTINCT config FROM {_TABLE}")]
    known = {}
    for graph in graphs:
        jobs = [(graph, plan) for _, plan in precompile_plans(graph)]
        jobs += [(g, plan) for _, g, plan in speculative_plans(graph)]
        for config in configs:
            for g, plan in jobs:
                known[cache.key(g, plan, config)] = (g, plan)
    return known


def _links_as_fresh(cache: CompileCache, graph: Graph, plan: list, config: NPUConfig) -> bool:
    """Whether the plan linked from the stored units (none compiled, none stored)
    equals a fresh compile."""
    store = _UnitStore(cache, profile_key(config), "", read_only=True)
    try:
        linked = compile_model(graph, config, plan, simplified=True, unit_store=store)
    except CompileError as err:
        return store.missing or _same_as_fresh(err, graph, plan, config)
    return _same_as_fresh(linked, graph, plan, config)


def _same_as_fresh(stored, graph: Graph, plan: list, config: NPUConfig) -> bool:
    """Whether ``stored`` equals what :meth:`CompileCache.get_or_compile` compiles now
    (the plan lowered in place as relocatable units, or as it links when that
    program is too long)."""
    try:
        try:
            fresh = compile_model(graph, config, plan, simplified=True, relocatable=True)
        except ProgramTooLong:
            fresh = compile_model(graph, config, plan, simplified=True)
    except CompileError as err:
        return isinstance(stored, CompileError) and str(stored) == str(err)
    if isinstance(stored, CompileError):
        return False
    return (stored.program.to_bytes() == fresh.program.to_bytes()
            and stored.const_image() == fresh.const_image()
            and stored.partitions == fresh.partitions)
