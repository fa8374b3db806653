"""``make bench-specialize`` (bench/specialize.py): a model the adaptive runtime
refuses becomes the row's reason; any other error in the runtime surfaces."""

import pytest

import bench.specialize as spec
from host.cli import model_path
from host.onnx_import import load_onnx
from host.profiles import profile
from verif.model_scenarios import model_inputs


def test_a_paged_program_is_the_rows_reason():
    """DS-CNN on ``small`` runs only paged (its program outgrows a 1024-word bank),
    which the runtime cannot hot-swap: the row says so instead of a figure."""
    graph = load_onnx(model_path("ds_cnn"), allow_cpu_fallback=True)
    out = spec.specialized_or_why(graph, profile("small"), model_inputs("ds_cnn", graph), 1)
    assert out["failed"].startswith("ProgramTooLong: ") and "1024" in out["failed"]


def test_a_bug_in_the_runtime_is_not_swallowed(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(spec, "specialized", broken)
    with pytest.raises(KeyError, match="a bug"):
        spec.specialized_or_why(None, profile("default"), [], 1)
