"""The compile cache under bad ``--cache`` paths and bad entries (golden backend).

A path that is not this project's cache is refused with one line and left exactly as
it was; a damaged cache of this project is moved aside; a stored program that gives
wrong results is evicted and recompiled; ``npu cache info|verify|clear``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import sqlite3

import pytest

from firmware import asm
from host import cli
from host.adaptive.cache import APPLICATION_ID
from host.cli import ExitCode

RUN = ["run", "mlp", "--adaptive", "--digits", "4", "--inline-compile"]


def npu(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "npu-cache"))


def snapshot(path):
    """Bytes (files) or names (directories) and the mtime of ``path``."""
    st = path.stat()
    content = sorted(os.listdir(path)) if path.is_dir() else path.read_bytes()
    return content, st.st_mtime_ns, st.st_mode


# ---- paths that are not this project's cache --------------------------------------------------


def a_directory(tmp_path):
    d = tmp_path / "somedir"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    return d, "is a directory"


def a_foreign_database(tmp_path):
    p = tmp_path / "other.db"
    with sqlite3.connect(p) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('precious')")
    db.close()
    return p, "another application's sqlite database"


def a_text_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("not a database\n" * 50)
    return p, "not an sqlite database"


def an_empty_read_only_file(tmp_path):
    p = tmp_path / "ro.sqlite"
    p.write_bytes(b"")
    p.chmod(0o444)
    return p, "is empty and read-only"


def the_working_directory(tmp_path):
    return tmp_path, "is a directory"


BAD_PATHS = [a_directory, a_foreign_database, a_text_file, an_empty_read_only_file,
             the_working_directory]


@pytest.mark.parametrize("make", BAD_PATHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", ["run", "precompile", "cache"])
def test_a_path_that_is_not_a_usable_cache_is_refused_untouched(make, command, tmp_path,
                                                                capsys, monkeypatch):
    path, why = make(tmp_path)
    if make is the_working_directory:
        monkeypatch.chdir(tmp_path)
    before = snapshot(path)
    others = sorted(os.listdir(path.parent))
    argv = {"run": RUN + ["--cache", str(path)],
            "precompile": ["precompile", "--profile", "default", "--model", "mlp",
                           "--cache", str(path)],
            "cache": ["cache", "info", "--cache", str(path)]}[command]
    assert npu(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and why in err and str(path) in err, err
    assert snapshot(path) == before
    assert sorted(os.listdir(path.parent)) == others  # nothing renamed or added beside it


# ---- this project's cache, read-only ----------------------------------------------------------


def test_a_read_only_cache_is_read_as_it_is(tmp_path, capsys):
    """A cache on a read-only file or directory (one shared, or on read-only media)
    serves what it holds, is never written (no lock or log file beside it), and a
    wrong program in it is evicted from the run's view only; the commands that
    write a cache refuse it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "c.sqlite"
    assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
    good = predictions(capsys.readouterr().out)
    poison(path)
    path.chmod(0o444)
    shared.chmod(0o555)
    try:
        before, listing = snapshot(path), sorted(os.listdir(shared))
        for _ in range(2):  # the eviction never reaches the file: twice the same
            assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
            out = capsys.readouterr().out
            assert f"compile cache {path} is read-only" in out and "cache-evicted" in out, out
            assert predictions(out) == good
        assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.OK
        assert "entries: 1 (1 programs" in capsys.readouterr().out
        for argv in (["cache", "clear"], ["cache", "verify", "--model", "mlp"],
                     ["precompile", "--profile", "default", "--model", "mlp"]):
            assert npu(argv + ["--cache", str(path)]) == ExitCode.USAGE
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1 and "is read-only" in err, err
        assert snapshot(path) == before and sorted(os.listdir(shared)) == listing
    finally:
        shared.chmod(0o755)


# ---- this project's cache, damaged -------------------------------------------------------------


def test_a_damaged_project_cache_is_moved_aside_and_the_run_succeeds(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
    data = bytearray(path.read_bytes())
    assert int.from_bytes(data[68:72], "big") == APPLICATION_ID
    data[100:] = os.urandom(len(data) - 100)
    path.write_bytes(bytes(data))
    for side in tmp_path.glob("c.sqlite-*"):  # a WAL would restore the pages
        side.unlink()
    earlier = tmp_path / f"c.sqlite.corrupt-{'x' * 4}"
    earlier.write_bytes(b"an earlier one")  # a name already taken stays as it was
    assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
    aside = [p for p in tmp_path.glob("c.sqlite.corrupt-*") if p != earlier]
    assert [p.read_bytes() for p in aside] == [bytes(data)]
    assert earlier.read_bytes() == b"an earlier one"
    assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.OK
    assert "entries: 1" in capsys.readouterr().out


# ---- a wrong program in the cache ---------------------------------------------------------------


def poison(path, where: str = "1"):
    """Replace every stored program (``where``: those the SQL condition selects) by a
    wrong one with a valid digest: the output requantization multiplier of each unit
    becomes 1 (all outputs at the zero point)."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT rowid, blob FROM compiled WHERE kind='program' AND "
                          + where).fetchall()
        assert rows
        for rowid, blob in rows:
            model = pickle.loads(blob)
            source = "\n".join("    cfg.qmul 1, push=next" if "cfg.qmul" in line else line
                               for line in model.source.splitlines())
            assert source != model.source
            bad = dataclasses.replace(model, source=source, program=asm.assemble(source))
            blob = pickle.dumps(bad, protocol=pickle.HIGHEST_PROTOCOL)
            db.execute("UPDATE compiled SET blob=?, digest=?, size=? WHERE rowid=?",
                       (blob, hashlib.sha256(blob).hexdigest()[:32], len(blob), rowid))
    db.close()


@pytest.mark.parametrize("flags", [[], ["--no-check"], ["--fresh"]])
def test_a_poisoned_entry_is_evicted_and_the_run_is_right(flags, tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
    good = capsys.readouterr().out
    poison(path)
    assert npu(RUN + ["--cache", str(path)] + flags) == ExitCode.OK
    out = capsys.readouterr().out
    if "--fresh" in flags:  # nothing stored was served
        assert "cache-evicted" not in out
    else:
        assert "cache-evicted" in out
    assert predictions(out) == predictions(good)
    # the entry now holds the right program: served on, nothing evicted
    assert npu(RUN + ["--cache", str(path)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "cache-evicted" not in out and predictions(out) == predictions(good)


BATCH = ["run", "mlp", "--adaptive", "--batch", "4", "--digits", "16", "--inline-compile"]


@pytest.mark.parametrize("flags", [[], ["--no-check"]])
def test_a_poisoned_batch_variant_is_evicted_and_compiled_anew(flags, tmp_path, capsys):
    """A batch variant the cache serves is validated like one compiled here; a wrong
    one is evicted (its entry and the units it links), never served again."""
    path = tmp_path / "c.sqlite"
    assert npu(BATCH + ["--cache", str(path)]) == ExitCode.OK
    good = predictions(capsys.readouterr().out)
    poison(path, "specialization='batch4'")
    assert npu(BATCH + ["--cache", str(path)] + flags) == ExitCode.OK
    out = capsys.readouterr().out
    assert "batch4 (cache hit)" in out and "cache-evicted" in out, out
    assert "batch4 (compiled)" in out, out  # compiled anew, not served again
    assert predictions(out) == good
    assert npu(BATCH + ["--cache", str(path)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "batch4 (cache hit)" in out and "cache-evicted" not in out, out
    assert predictions(out) == good


def predictions(out: str) -> list[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(("accuracy:", "predictions:"))]
    assert lines, out
    return lines


def test_verify_evicts_a_poisoned_entry(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    assert npu(["precompile", "--profile", "default", "--model", "mlp",
                "--cache", str(path)]) == ExitCode.OK
    capsys.readouterr()
    assert npu(["cache", "verify", "--model", "mlp", "--cache", str(path)]) == ExitCode.OK
    assert "evicted 0" in capsys.readouterr().out
    poison(path)
    assert npu(["cache", "verify", "--model", "mlp", "--cache", str(path)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "2 recompiled and compared" in out and "evicted 2" in out, out
    assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.OK
    assert "entries: 0" in capsys.readouterr().out


def test_info_and_clear(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.USAGE
    assert not path.exists()  # info never creates a cache
    capsys.readouterr()
    assert npu(["precompile", "--profile", "small", "--model", "mlp",
                "--cache", str(path)]) == ExitCode.OK
    capsys.readouterr()
    assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"path: {path}" in out and "entries: 2 (2 programs" in out
    assert "profiles: small (2)" in out and "bytes" in out
    assert npu(["cache", "clear", "--cache", str(path)]) == ExitCode.OK
    assert "removed 2 entries" in capsys.readouterr().out
    assert npu(["cache", "info", "--cache", str(path)]) == ExitCode.OK
    assert "entries: 0" in capsys.readouterr().out
