"""The files an adaptive run leaves behind: where they live, and reading them safely.

A model's runtime state (profile and plan) and its last report are keyed by the
digest of the model file's bytes, with its name in front for people: a user's own
``moe.onnx`` never reads or overwrites the bundled model's files, and ``npu report
/any/moe.onnx`` shows that file's own report. Files are written whole (a temporary
file renamed over the old one), so a killed run leaves the previous file or the
new one, never half of one; the temporary such a run leaves carries its
writer's process id and host, and the next write in that directory removes it
once that process is gone. Every read is validated; a file ``npu`` cannot use
raises :class:`SavedFileError`, whose message names the file and the way out.

State saved by earlier versions under the model's name alone is still read as a
warm start (the runtime ignores a state of another model: it checks the graph's
signature) and left where it is; such a report is never shown as this model's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path

from firmware.config import NPUConfig

from ..costgraph_energy import ENERGY_TERMS
from ..profiles import profile_key, profile_name

DIGEST_CHARS = 16


class SavedFileError(Exception):
    """A saved state or report that is damaged or belongs to another model."""


class Maybe:
    """A schema that also accepts None (JSON null), or a missing key."""

    def __init__(self, schema):
        self.schema = schema


NUM = (int, float)
STATE_SCHEMA = {"version": int, "graph": str, "profile": str, "timing": str,
                "profiler": dict, "merged": [[int]], "inferences": int}
REPORT_SCHEMA = {
    "model": str, "model_digest": str, "plan": [int], "inferences": int, "swaps": int,
    "rollbacks": int, "compiles": int, "restored_plan": Maybe([int]),
    "cost_model_error": {"profile": NUM, "refit": NUM},
    "cache": {"compiles": int, "hits": int},
    "units": [{"id": int, "kind": str, "state": str, "nodes": [str], "exec_count": int,
               "history": [{"inference": int, "kind": str, "reason": Maybe(str)}]}],
    "speculation": Maybe({"bets": int, "misspeculations": int, "threshold": NUM,
                          "active": Maybe({"branch": str, "unit": int, "hit_rate": NUM,
                                           "break_even": NUM})}),
    "batch_variants": Maybe(dict),
    "stream": Maybe({"cycles": [int], "host_ms": [NUM], "checked": int,
                     "mean_cycles_first_half": Maybe(NUM),
                     "mean_cycles_second_half": Maybe(NUM),
                     "initial_plan_cycles": Maybe(NUM),
                     "speedup_second_half_over_initial": Maybe(NUM),
                     "misspeculation_rate": Maybe(NUM)}),
    # what host/costgraph_report.py prints (host/costgraph.py, CostGraph.as_dict)
    "costgraph": Maybe({
        "measured_cycles": int, "total_cycles": NUM, "critical_path_cycles": NUM,
        "energy_pj": NUM, "energy_by_term": dict.fromkeys(ENERGY_TERMS, NUM),
        "coefficients": {"mac": NUM, "sp_byte": NUM, "acc_byte": NUM, "acc_copies": int,
                         "dram_byte": NUM, "fetch": NUM, "source": str},
        "sram_counted": bool, "sram_matches": bool,
        "nodes": [{"id": str, "kind": str, "label": str, "cycles": NUM, "runs": int,
                   "region_cycles": int, "predicted": Maybe(NUM), "macs": int,
                   "dram_read": int, "dram_write": int, "sp_bytes": int, "acc_read": int,
                   "acc_write": int, "dma_cycles": int, "host_bytes": int,
                   "energy_pj": NUM}],
        "edges": [{"src": str, "dst": str}]}),
}


def model_digest(model_file: Path) -> str:
    """The digest of a model file's bytes (what its state and report are keyed by)."""
    h = hashlib.sha256()
    with open(model_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:DIGEST_CHARS]


def cache_root() -> Path:
    """``$NPU_CACHE_DIR`` (when set and not empty), else ``~/.cache/npu``."""
    base = os.environ.get("NPU_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "npu"


def _file_name(model_file: Path, config: NPUConfig, digest: str | None) -> str:
    key = profile_name(config) or profile_key(config)
    middle = f"-{digest}" if digest else ""
    return f"{Path(model_file).stem}{middle}-{key}.json"


def report_path(model_file: Path, config: NPUConfig) -> Path:
    """Where the last adaptive run of a model file on a profile leaves its report."""
    return cache_root() / "reports" / _file_name(model_file, config, model_digest(model_file))


def state_path(model_file: Path, config: NPUConfig) -> Path:
    """Where the adaptive runtime keeps a model file's profile and plan between runs."""
    return cache_root() / "state" / _file_name(model_file, config, model_digest(model_file))


def legacy_path(kind: str, model_file: Path, config: NPUConfig) -> Path:
    """Where earlier versions kept a ``kind`` ("state", "reports") under the name alone."""
    return cache_root() / kind / _file_name(model_file, config, None)


def save_json(data: dict, path: Path) -> Path:
    """Write ``data`` to ``path`` whole (see :func:`write_whole`)."""
    return write_whole(path, lambda f: f.write(json.dumps(data, indent=1).encode()))


def write_whole(path: Path, write) -> Path:
    """Write a file whole: ``write(f)`` fills a temporary beside ``path`` (a binary
    file), which is synced and renamed over ``path``. A crash leaves the old file
    or the new one; a failure (an exception of ``write`` or of the disk) leaves the
    old one and no temporary.

    The temporary is ``.NAME.PID@HOST.XXXXXXXX.tmp``; a writer killed before its
    rename leaves one, which :func:`sweep_temporaries` (run first) removes. A
    symbolic link is followed (its target is replaced, the link stays).
    """
    path = Path(path).resolve() if Path(path).is_symlink() else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_writer()}.",
                               suffix=".tmp")
    try:
        # the mode the file has, or a new file's (mkstemp's is 0600)
        os.fchmod(fd, path.stat().st_mode & 0o7777 if path.is_file() else _NEW_FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _new_file_mode() -> int:
    umask = os.umask(0o022)  # the only way to read it: set and restore, once at import
    os.umask(umask)
    return 0o666 & ~umask


_NEW_FILE_MODE = _new_file_mode()
_TEMPORARY = re.compile(r"\..+\.(\d+)@([A-Za-z0-9-]+)\.[a-z0-9_]+\.tmp")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _writer() -> str:
    return f"{os.getpid()}@{_host()}"


def sweep_temporaries(directory: Path) -> list[Path]:
    """Remove the temporaries :func:`save_json` writers on this host left in
    ``directory`` when they died before renaming; return what was removed.

    Only names of :func:`save_json`'s pattern whose process no longer runs: a
    writer still at work (or another host's, whose processes this one cannot see)
    and every other file are left alone.
    """
    removed = []
    host = _host()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _TEMPORARY.fullmatch(name)
        if m and m.group(2) == host and not _running(int(m.group(1))):
            with contextlib.suppress(FileNotFoundError):  # a sweeper beside us took it
                os.unlink(Path(directory) / name)
                removed.append(Path(directory) / name)
    return removed


def _running(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id a writer has: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def read_json(path: Path, schema: dict, way_out: str) -> dict | None:
    """The object in ``path`` if it conforms to ``schema``; None when there is no file.

    Raises :class:`SavedFileError` naming the file, what is wrong and ``way_out``.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        why = getattr(err, "strerror", None) or type(err).__name__
        raise SavedFileError(f"{path} is unreadable or damaged ({why}); {way_out}") from None
    problem = conform(data, schema)
    if problem:
        raise SavedFileError(f"{path} is damaged ({problem}); {way_out}")
    return data


def load_state(model_file: Path, config: NPUConfig) -> dict | None:
    """A model file's saved runtime state, or None when it has none.

    A state saved under the name alone is read when there is no keyed one (and
    ignored if it is damaged: it may be another model's); raises
    :class:`SavedFileError` for a damaged keyed state.
    """
    from .profiler import Profiler

    way_out = "run with --fresh to start over and replace it"
    path = state_path(model_file, config)
    legacy = legacy_path("state", model_file, config)
    state = read_json(path, STATE_SCHEMA, way_out)
    if state is None and legacy.is_file():
        try:
            state, path = read_json(legacy, STATE_SCHEMA, way_out), legacy
        except SavedFileError:
            return None
    if state is None:
        return None
    try:
        Profiler.from_dict(state["profiler"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        if path == legacy:
            return None
        raise SavedFileError(f"{path} is damaged (its profiler state: {type(err).__name__}: "
                             f"{err}); {way_out}") from None
    return state


def load_report(model_file: Path, config: NPUConfig, command: str) -> dict:
    """The last adaptive report of a model file on a profile.

    Raises :class:`SavedFileError` when there is none, or it is damaged, or it is
    another model file's; ``command`` is the ``npu run`` that writes it.
    """
    path = report_path(model_file, config)
    way_out = f"`{command} --fresh` writes a new one"
    rep = read_json(path, REPORT_SCHEMA, way_out)
    if rep is None:
        legacy = legacy_path("reports", model_file, config)
        note = (f" ({legacy} was saved by name alone, maybe for another model of that "
                "name, and is not shown)" if legacy.is_file() else "")
        raise SavedFileError(f"no adaptive report of {model_file} at {path}: run "
                             f"`{command}` first{note}")
    if rep["model_digest"] != model_digest(model_file):
        raise SavedFileError(f"{path} is another model's report (digest "
                             f"{rep['model_digest']}); {way_out}")
    bad = [u["id"] for u in rep["units"] if u["state"] == "quarantined"
           and not (u["history"] and isinstance(u["history"][-1].get("reason"), str))]
    if bad:
        raise SavedFileError(f"{path} is damaged (quarantined units {bad} without a "
                             f"reason); {way_out}")
    return rep


def conform(value, schema, where: str = "the file") -> str | None:
    """The first way ``value`` departs from ``schema``, or None.

    A schema is a type or tuple of types, a dict of required keys (a
    :class:`Maybe` value may be missing or null), a one-item list (every item
    conforms), or a :class:`Maybe`.
    """
    if isinstance(schema, Maybe):
        return None if value is None else conform(value, schema.schema, where)
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where} is not an object"
        for key, sub in schema.items():
            if key not in value:
                if isinstance(sub, Maybe):
                    continue
                return f"{where} has no {key!r}"
            problem = conform(value[key], sub, f"{key!r}")
            if problem:
                return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        for i, item in enumerate(value):
            problem = conform(item, schema[0], f"{where}[{i}]")
            if problem:
                return problem
        return None
    types = schema if isinstance(schema, tuple) else (schema,)
    if isinstance(value, bool) and bool not in types:
        return f"{where} is {value!r}, not {' or '.join(t.__name__ for t in types)}"
    if not isinstance(value, types):
        return f"{where} is {type(value).__name__}, not {' or '.join(t.__name__ for t in types)}"
    return None
