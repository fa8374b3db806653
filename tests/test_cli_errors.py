"""``npu`` under bad input: one line on stderr and an exit code per class, never a traceback.

Each case builds its bad file in ``tmp_path`` and runs ``host.cli.main`` on the golden
backend; ``--debug`` brings the traceback back.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from host import cli
from host.cli import ExitCode


def npu(argv) -> int:
    """``main``'s exit code, argparse's own exits included."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


# ---- bad files, made fresh per test ---------------------------------------------------------


def empty_model(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    return tmp_path / "empty.onnx"


def truncated_model(tmp_path):
    data = (cli.MODELS / "mlp.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[:len(data) // 2])
    return tmp_path / "cut.onnx"


def random_model(tmp_path):
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    return tmp_path / "random.onnx"


def unsupported_model(tmp_path):
    """A well-formed model whose only op (Erf) the NPU cannot run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Erf", ["x"], ["y"], name="erf0")],
                              "erf", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "erf.onnx")
    return tmp_path / "erf.onnx"


def npz(tmp_path, name="in.npz", **arrays):
    np.savez(tmp_path / name, **arrays)
    return tmp_path / name


def batch_of_mlp(tmp_path, rows):
    """The bundled MLP declared for ``rows`` samples at once (the digits feed one)."""
    model = onnx.load(cli.MODELS / "mlp.onnx")
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = rows
    onnx.save(model, tmp_path / "mlp_rows.onnx")
    return tmp_path / "mlp_rows.onnx"


def infinite_scale(tmp_path):
    model = onnx.load(cli.MODELS / "mlp.onnx")
    init = next(i for i in model.graph.initializer if i.name == "fc1_relu_out_scale")
    init.CopyFrom(onnx.numpy_helper.from_array(np.float32(np.inf), init.name))
    onnx.save(model, tmp_path / "inf.onnx")
    return tmp_path / "inf.onnx"


def beyond_the_dram(tmp_path, width=1000, layers=5):
    """Int8 layers whose weights together (5 MB) exceed the device's 4 MB of DRAM,
    each within what one DMA transfer and one instruction bank take."""
    rng = np.random.default_rng(0)
    nh = onnx.numpy_helper
    inits = [nh.from_array(np.float32(0.1), "s"), nh.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["t0"], name="q")]
    for i in range(layers):
        inits.append(nh.from_array(rng.integers(-8, 8, (width, width)).astype(np.int8), f"w{i}"))
        nodes.append(helper.make_node("QLinearMatMul", [f"t{i}", "s", "z", f"w{i}", "s", "z",
                                                         "s", "z"], [f"t{i + 1}"], name=f"mm{i}"))
    nodes.append(helper.make_node("DequantizeLinear", [f"t{layers}", "s", "z"], ["y"], name="dq"))
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "wide.onnx")
    np.savez(tmp_path / "wide.npz", x=rng.normal(size=(2, 1, width)).astype(np.float32))
    return ["run", str(tmp_path / "wide.onnx"), "--inputs", str(tmp_path / "wide.npz")]


def mlp_samples(n=3):
    return np.random.default_rng(0).uniform(0, 16, (n, 64)).astype(np.float32)


# Each case: argv (a function of tmp_path), the exit code, and a word the line must name.
CASES = {
    "empty model": (lambda t: ["run", str(empty_model(t))], ExitCode.BAD_MODEL, "bad model"),
    "truncated model": (lambda t: ["compile", str(truncated_model(t))], ExitCode.BAD_MODEL,
                        "cannot read the model"),
    "random bytes": (lambda t: ["disasm", str(random_model(t))], ExitCode.BAD_MODEL,
                     "cannot read the model"),
    "missing model": (lambda t: ["run", str(t / "nope.onnx")], ExitCode.BAD_MODEL,
                      "does not exist"),
    "directory as model": (lambda t: ["run", str(t)], ExitCode.BAD_MODEL, "is a directory"),
    "unsupported op": (lambda t: ["run", str(unsupported_model(t))], ExitCode.UNSUPPORTED,
                       "unsupported operator Erf"),
    "digits 0": (lambda t: ["run", "mlp", "--digits", "0"], ExitCode.USAGE, "--digits"),
    "phases abc": (lambda t: ["run", "mlp", "--adaptive", "--no-cache", "--phases", "abc"],
                   ExitCode.USAGE, "--phases"),
    "inputs missing": (lambda t: ["run", "mlp", "--inputs", str(t / "nope.npz")],
                       ExitCode.USAGE, "No such file"),
    "inputs not npz": (lambda t: ["run", "mlp", "--inputs", str(empty_model(t))],
                       ExitCode.USAGE, "not an .npz"),
    "inputs wrong name": (lambda t: ["run", "mlp", "--inputs", str(npz(t, x=mlp_samples()))],
                          ExitCode.USAGE, "no array named input"),
    "inputs wrong size": (lambda t: ["run", "mlp", "--inputs",
                                     str(npz(t, input=np.zeros((3, 5), np.float32)))],
                          ExitCode.USAGE, "has 5 values"),
    "inputs empty": (lambda t: ["run", "mlp", "--inputs",
                                str(npz(t, input=np.zeros((0, 64), np.float32)))],
                     ExitCode.USAGE, "non-zero number of samples"),
    "inputs NaN": (lambda t: ["run", "mlp", "--inputs",
                              str(npz(t, input=np.full((3, 64), np.nan, np.float32)))],
                   ExitCode.USAGE, "NaN"),
    "fewer labels": (lambda t: ["run", "mlp", "--inputs",
                                str(npz(t, input=mlp_samples(3), labels=np.array([1])))],
                     ExitCode.USAGE, "1 labels for 3 samples"),
    # found by tests/test_fuzz.py
    "labels not a list": (lambda t: ["run", "mlp", "--inputs",
                                     str(npz(t, input=mlp_samples(1), labels=np.array(1.5)))],
                          ExitCode.USAGE, "one class number per sample"),
    "digits do not fit": (lambda t: ["run", str(batch_of_mlp(t, 3))], ExitCode.USAGE,
                          "pass --inputs"),
    "infinite scale": (lambda t: ["run", str(infinite_scale(t))], ExitCode.BAD_MODEL,
                       "positive and finite"),
    "output a directory": (lambda t: ["compile", "mlp", "-o", str(t)], ExitCode.USAGE,
                           "is a directory"),
    "output the current directory": (lambda t: ["compile", "mlp", "-o", "."], ExitCode.USAGE,
                                     "is a directory"),
    "output a device": (lambda t: ["compile", "mlp", "-o", os.devnull], ExitCode.USAGE,
                        "is not a regular file"),
    "output .const": (lambda t: ["compile", "mlp", "-o", str(t / "prog.const")],
                      ExitCode.USAGE, "PROGRAM.const"),
    # an internal ValueError from the device's memory check before
    "beyond the DRAM": (beyond_the_dram, ExitCode.UNSUPPORTED,
                        "the model needs more DRAM than this device has"),
    "serial port": (lambda t: ["info", "--backend", "serial", "--port", str(t / "ttyNONE")],
                    ExitCode.DEVICE, "cannot open the serial port"),
}


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("case", CASES)
def test_one_line_and_exit_code(case, tmp_path, capsys):
    argv, code, names = CASES[case]
    if case == "serial port":
        pytest.importorskip("serial")
    assert npu(argv(tmp_path)) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert names in lines[0], lines[0]


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert npu(["--debug", "run", str(empty_model(tmp_path))]) == ExitCode.BAD_MODEL
    err = capsys.readouterr().err
    assert "Traceback" in err and "ModelError" in err, err
    assert npu(["run", str(empty_model(tmp_path)), "--debug"]) == ExitCode.BAD_MODEL
    assert "Traceback" in capsys.readouterr().err


def test_internal_error_names_debug(monkeypatch, capsys):
    def broken(opts, argv):
        raise KeyError("boom")

    monkeypatch.setattr(cli, "_command", broken)
    assert npu(["info"]) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert err.splitlines() == ["npu: internal error: KeyError: 'boom' (run with --debug for "
                                "the traceback)"], err


def test_mismatch_and_device_error_codes(monkeypatch, capsys):
    """The runtime's MismatchError and the driver's DeviceError (an NPU error status)."""
    from host.driver import DeviceError
    from host.runtime import MismatchError

    for exc, code in ((MismatchError("output 'y': NPU [1\n 2] != [3\n 4]"), ExitCode.MISMATCH),
                      (DeviceError("NPU error BUS at pc 3"), ExitCode.DEVICE)):
        def fail(opts, argv, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "_command", fail)
        assert npu(["info"]) == code
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and str(exc).split()[0] in err, err


def test_valid_inputs_still_run(tmp_path, capsys):
    path = npz(tmp_path, input=mlp_samples(3), labels=np.array([1, 2, 3]))
    assert npu(["run", "mlp", "--inputs", str(path)]) == ExitCode.OK
    assert capsys.readouterr().err == ""


def test_one_adaptive_inference_reports(capsys):
    """A stream of one has no first half: the report prints its mean alone."""
    assert npu(["run", "mlp", "--adaptive", "--no-cache", "--inline-compile",
                "--digits", "1"]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert "cycles per inference:" in out and err == "", err


@pytest.mark.parametrize("flags", [["--batch", "4"], ["--cache", "c.sqlite"],
                                   ["--inline-compile", "--batch", "2"]])
def test_adaptive_options_without_adaptive_are_refused(flags, capsys, tmp_path):
    flags = [str(tmp_path / f) if f.endswith(".sqlite") else f for f in flags]
    assert npu(["run", "mlp", "--digits", "1", *flags]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only with --adaptive" in err and flags[0] in err, err
    assert not (tmp_path / "c.sqlite").exists()  # nothing was opened or made


# ---- failures on a device, on every backend ----------------------------------------------------

BACKENDS = ["golden", pytest.param("verilator", marks=pytest.mark.rtl)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bus_error_is_one_line_and_the_device_code(backend, monkeypatch, capsys):
    """Every DRAM transfer of the NPU answers SLVERR: the run ends in the NPU's
    BUS_ERROR status, which ``npu`` reports in one line with exit code 5."""
    from host.device import RESP_SLVERR

    def run_with_faults(device, opts):
        device.set_bus_faults([(0, 1 << 22, RESP_SLVERR)])
        return cli.run_on_device(device, opts)

    monkeypatch.setitem(cli.COMMANDS, "run", run_with_faults)
    assert npu(["run", "mlp", "--digits", "2", "--backend", backend]) == ExitCode.DEVICE
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    line, = err.splitlines()
    assert line.startswith("npu: device error: ") and "BUS_ERROR" in line, line


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flags, code, start", [
    (["--cycle-budget", "100"], ExitCode.LIMIT,
     "npu: the run stopped at its cycle budget of 100 cycles"),
    (["--inputs", "nan.npz"], ExitCode.USAGE, "npu: --inputs nan.npz: 'input' contains NaN"),
])
def test_limits_and_bad_inputs_on_every_backend(backend, flags, code, start, tmp_path,
                                                monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    np.savez("nan.npz", input=np.full((2, 64), np.nan, np.float32))
    assert npu(["run", "mlp", "--backend", backend, *flags]) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    line, = err.splitlines()
    assert line.startswith(start), line


def test_compile_output_is_written_whole(tmp_path, monkeypatch, capsys):
    """``npu compile -o``: a disk that fills mid-write leaves the old program and
    constants and no temporary; a link to a program is written through."""
    import errno

    program, consts = tmp_path / "prog.bin", tmp_path / "prog.const"
    program.write_bytes(b"old program")
    consts.write_bytes(b"old constants")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(os, "fsync", full)
        assert npu(["compile", "mlp", "-o", str(program)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.splitlines() == [f"npu: -o {program}: cannot write {program} (No space left "
                                "on device)"], err
    assert program.read_bytes() == b"old program" and consts.read_bytes() == b"old constants"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.bin", "prog.const"]
    (tmp_path / "link.bin").symlink_to(program)
    assert npu(["compile", "mlp", "-o", str(tmp_path / "link.bin")]) == ExitCode.OK
    assert (tmp_path / "link.bin").is_symlink() and program.read_bytes() != b"old program"


def test_a_directory_named_like_a_bundled_model_does_not_shadow_it(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlp").mkdir()
    assert npu(["run", "mlp", "--digits", "2"]) == ExitCode.OK
    assert "2/2 results equal the reference" in capsys.readouterr().out
