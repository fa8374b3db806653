"""A crash of C++ code during the import (onnx's checker or shape inference,
onnxruntime's inference of contrib outputs) is a refused model, not the end of
the process: these steps run in a forked child (host/isolate.py), the rest of the
import in the caller.

No model known to crash the installed onnx reaches it (the zero divisors are
refused first, tests/test_import_errors.py), so these tests crash the checker on
purpose: it sends its own process a signal, as a crashing C++ function would.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time

import onnx
import pytest

from host import cli
from host.cli import ExitCode, model_path
from host.errors import ModelError, UnsupportedOpError
from host.isolate import ChildCrashed, ChildTimedOut, run_isolated
from host.onnx_import import load_onnx


def die(sig):
    faulthandler.disable()  # pytest's dump of the child's stack is noise here
    os.kill(os.getpid(), sig)


@pytest.mark.parametrize("sig", [signal.SIGFPE, signal.SIGSEGV, signal.SIGABRT])
def test_a_child_killed_by_a_signal_names_it(sig):
    with pytest.raises(ChildCrashed) as crash:
        run_isolated(die, sig)
    assert crash.value.signal == sig
    assert str(crash.value) == f"the child process was killed by {sig.name}"


def test_a_child_that_exits_without_an_answer_is_a_crash():
    with pytest.raises(ChildCrashed, match="exited with 7") as crash:
        run_isolated(os._exit, 7)
    assert crash.value.signal is None


def test_a_child_that_does_not_answer_in_time_is_killed():
    """A hang in the child (C++ deadlocked after fork, say) ends the call: the child
    is killed, and the caller's wait is bounded."""
    with pytest.raises(ChildTimedOut, match="no answer within 0.5 s"):
        run_isolated(time.sleep, 60, timeout=0.5)


def test_a_long_answer_arrives_whole_within_the_time_limit():
    assert run_isolated(bytes, 3 << 20, timeout=60) == bytes(3 << 20)


def test_results_and_exceptions_come_back_as_in_process():
    assert run_isolated(lambda a, *, b: [a, b], 1, b=2) == [1, 2]
    with pytest.raises(UnsupportedOpError) as raised:
        load_onnx(model_path("resnet8"))
    with pytest.raises(UnsupportedOpError) as direct:
        run_isolated(lambda: (_ for _ in ()).throw(raised.value))
    for err in (raised.value, direct.value):  # members intact, no __init__ re-run
        assert (err.op_type, err.node, err.index) == ("Softmax", "/Softmax", 67)
    assert str(direct.value) == str(raised.value)


def crash_in_checker(monkeypatch, sig):
    monkeypatch.setattr(onnx.checker, "check_model", lambda proto, *a, **k: die(sig))


@pytest.mark.parametrize("sig", [signal.SIGFPE, signal.SIGSEGV])
def test_a_crash_in_onnx_is_a_model_error(monkeypatch, sig):
    crash_in_checker(monkeypatch, sig)
    with pytest.raises(ModelError, match=f"crashes onnx's C\\+\\+ code while importing "
                       f"\\({sig.name}\\)"):
        load_onnx(model_path("mlp"))


def test_a_crash_in_the_shape_inference_of_a_cpu_node_is_a_model_error(monkeypatch):
    """resnet8's Softmax runs on the CPU: its outputs are typed by onnx's C++ shape
    inference, in a child of its own."""
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, *a, **k: die(signal.SIGSEGV))
    with pytest.raises(ModelError, match="crashes onnx's C\\+\\+ code while importing "
                       "\\(SIGSEGV\\)"):
        load_onnx(model_path("resnet8"), allow_cpu_fallback=True)


def test_npu_reports_the_crash_in_one_line(monkeypatch, capsys):
    crash_in_checker(monkeypatch, signal.SIGFPE)
    code = cli.main(["compile", "mlp"])
    line, = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.BAD_MODEL
    assert line.startswith("npu: bad model: the model crashes onnx's C++ code"), line
