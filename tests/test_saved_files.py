"""State and reports of adaptive runs: keyed by the model's content, read safely.

Every case runs ``host.cli.main`` on the golden backend with ``NPU_CACHE_DIR`` in
``tmp_path``: a user's own model named like a bundled one keeps its own files; a
damaged file is one line naming it and ``--fresh``, exit code 2; files saved by
name alone are read as a warm start or left unshown, and never removed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from firmware.config import CONFIGS
from host import cli
from host.adaptive import saved
from host.cli import ExitCode

RUN = ["--adaptive", "--digits", "3", "--inline-compile"]
DEFAULT = CONFIGS["default"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def own_mlp(tmp_path):
    """A user's ``mlp.onnx``: another model (the bundled CNN's bytes) under the name."""
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / "mlp.onnx"
    shutil.copy(cli.MODELS / "cnn.onnx", path)
    return path


def npu(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_users_model_named_like_a_bundled_one_keeps_its_own_files(cache_dir, own_mlp,
                                                                     capsys):
    assert npu(["run", "mlp", *RUN], capsys)[0] == ExitCode.OK
    bundled_state = saved.state_path(cli.MODELS / "mlp.onnx", DEFAULT)
    before = bundled_state.read_bytes()
    code, _, err = npu(["report", str(own_mlp)], capsys)
    assert code == ExitCode.USAGE and err.startswith(f"npu: no adaptive report of {own_mlp}")
    assert npu(["run", str(own_mlp), *RUN], capsys)[0] == ExitCode.OK
    assert bundled_state.read_bytes() == before  # not overwritten
    code, out, _ = npu(["report", str(own_mlp)], capsys)
    assert code == ExitCode.OK and "cnn: units of the adaptive run" in out
    code, out, _ = npu(["report", "mlp"], capsys)
    assert code == ExitCode.OK and "mlp: units of the adaptive run" in out
    names = sorted(p.name for p in (cache_dir / "reports").iterdir())
    assert len(names) == 2 and all(n.startswith("mlp-") for n in names), names


def damage_state(path, good: dict):
    return [
        ("not JSON", lambda: path.write_text("{garbage")),
        ("not UTF-8", lambda: path.write_bytes(b"\xff\xfe\x00")),
        ("a list", lambda: path.write_text("[1, 2]")),
        ("a field missing", lambda: path.write_text(json.dumps({"version": 1}))),
        ("a field of the wrong type", lambda: path.write_text(json.dumps(
            {**good, "merged": "nope"}))),
        ("a broken profiler", lambda: path.write_text(json.dumps(
            {**good, "profiler": {"version": 1}}))),
    ]


def test_a_damaged_state_is_one_line_naming_it_and_fresh(cache_dir, capsys):
    assert npu(["run", "mlp", *RUN], capsys)[0] == ExitCode.OK
    path = saved.state_path(cli.MODELS / "mlp.onnx", DEFAULT)
    for what, damage in damage_state(path, json.loads(path.read_text())):
        damage()
        code, _, err = npu(["run", "mlp", *RUN], capsys)
        assert code == ExitCode.USAGE, (what, err)
        line, = err.strip().splitlines()
        assert str(path) in line and "--fresh" in line, (what, line)
    # The way out works, and replaces the damaged file.
    assert npu(["run", "mlp", *RUN, "--fresh"], capsys)[0] == ExitCode.OK
    assert saved.load_state(cli.MODELS / "mlp.onnx", DEFAULT) is not None
    assert npu(["run", "mlp", *RUN], capsys)[0] == ExitCode.OK


@pytest.mark.parametrize("damage", [
    lambda rep: b"\x00" * 10,
    lambda rep: json.dumps({**rep, "units": [{"id": "x"}]}).encode(),
    lambda rep: json.dumps({**rep, "stream": {"cycles": "many"}}).encode(),
    lambda rep: json.dumps({**rep, "cost_model_error": None}).encode(),
    lambda rep: json.dumps({**rep, "model_digest": "0" * 16}).encode(),
    lambda rep: b"[" * 100_000,
], ids=["zeros", "units", "stream", "cost", "another_model", "deep"])
def test_a_damaged_report_is_one_line_naming_it(cache_dir, capsys, damage):
    assert npu(["run", "mlp", *RUN], capsys)[0] == ExitCode.OK
    path = saved.report_path(cli.MODELS / "mlp.onnx", DEFAULT)
    path.write_bytes(damage(json.loads(path.read_text())))
    code, _, err = npu(["report", "mlp"], capsys)
    assert code == ExitCode.USAGE, err
    line, = err.strip().splitlines()
    assert str(path) in line and "--fresh" in line, line


def test_files_saved_by_name_alone(cache_dir, own_mlp, capsys):
    """An earlier version's name-keyed state warms the run of the model it belongs to
    (and is ignored for another), its report is never shown; both stay in place."""
    assert npu(["run", "mlp", *RUN], capsys)[0] == ExitCode.OK
    for kind in ("state", "reports"):
        keyed = getattr(saved, f"{kind.rstrip('s')}_path")(cli.MODELS / "mlp.onnx", DEFAULT)
        keyed.rename(saved.legacy_path(kind, cli.MODELS / "mlp.onnx", DEFAULT))
    legacy = {k: saved.legacy_path(k, cli.MODELS / "mlp.onnx", DEFAULT).read_bytes()
              for k in ("state", "reports")}
    assert saved.load_state(cli.MODELS / "mlp.onnx", DEFAULT) is not None
    code, _, err = npu(["report", "mlp"], capsys)
    assert code == ExitCode.USAGE and "saved by name alone" in err
    code, out, _ = npu(["run", str(own_mlp), *RUN], capsys)
    assert code == ExitCode.OK and "state-ignored" in out  # another model's state
    saved.legacy_path("state", cli.MODELS / "mlp.onnx", DEFAULT).write_text("{damaged")
    assert saved.load_state(cli.MODELS / "mlp.onnx", DEFAULT) is None  # not ours to judge
    legacy["state"] = b"{damaged"
    for kind, data in legacy.items():
        assert saved.legacy_path(kind, cli.MODELS / "mlp.onnx", DEFAULT).read_bytes() == data


def test_a_write_that_fails_leaves_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    saved.save_json({"a": 1}, path)
    with pytest.raises(TypeError):
        saved.save_json({"a": object()}, path)
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left


def test_an_empty_cache_dir_variable_means_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("NPU_CACHE_DIR", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert saved.cache_root() == tmp_path / ".cache" / "npu"
