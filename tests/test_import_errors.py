"""Every refusal of the importer names the node (name and index), its op and domain, and
what to do, on one line; ``npu run`` prints that line with the exit code of its class.

Each case is a small bad or unsupported model made with onnx.helper: the table says
whether the CPU fallback is on, which error class and exit code it gets, where the
fault is (node name, index in its graph, op, domain; None for a fault outside any
node) and a fragment of the problem and of the fix the line must carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from host import cli
from host.cli import ExitCode
from host.errors import ModelError, UnsupportedOpError
from host.onnx_import import load_onnx

OPSET = 17


def info(name, shape, et=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, et, shape)


def init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model(nodes, inputs, outputs, inits=(), opsets=(("", OPSET),)):
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def qdq_input(nodes, inits, scale=0.1):
    """``x`` (float, 1x4) quantized to int8 and dequantized: ``x_dq``."""
    inits += [init("s", np.array(scale, np.float32)), init("z", np.array(0, np.int8))]
    nodes += [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], name="quant"),
              helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], name="dequant")]


# ---- the bad models ---------------------------------------------------------------------


def erf():
    return model([helper.make_node("Identity", ["x"], ["r"], name="keep"),
                  helper.make_node("Erf", ["r"], ["y"], name="erf1")],
                 [info("x", [1, 8])], [info("y", [1, 8])])


def custom_domain():
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")
    return model([node], [info("x", [1, 8])], [info("y", [1, 8])],
                 opsets=(("", OPSET), ("com.example", 1)))


def dangling():
    return model([helper.make_node("Relu", ["x"], ["a"], name="first"),
                  helper.make_node("Add", ["a", "nowhere"], ["y"], name="second")],
                 [info("x", [1, 4])], [info("y", [1, 4])])


def unknown_default_op():
    return model([helper.make_node("Relu", ["x"], ["a"], name="first"),
                  helper.make_node("Frobnicate", ["a"], ["y"], name="frob")],
                 [info("x", [1, 4])], [info("y", [1, 4])])


def zero_scale():
    nodes, inits = [], []
    qdq_input(nodes, inits, scale=0.0)
    nodes.append(helper.make_node("Relu", ["x_dq"], ["y"], name="relu"))
    return model(nodes, [info("x", [1, 4])], [info("y", [1, 4])], inits)


def float_into_qlinear():
    inits = [init(k, v) for k, v in (
        ("sa", np.float32(0.1)), ("za", np.int8(0)), ("b", np.ones((4, 3), np.int8)),
        ("sb", np.float32(0.1)), ("zb", np.int8(0)), ("sy", np.float32(0.2)),
        ("zy", np.int8(0)))]
    mm = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                          ["y"], name="mm")
    return model([helper.make_node("Relu", ["x"], ["a"], name="relu"), mm],
                 [info("x", [2, 4])], [info("y", [2, 3], TensorProto.INT8)], inits)


def wide_weights():
    inits = [init(k, v) for k, v in (
        ("sa", np.float32(0.1)), ("za", np.uint8(128)),
        ("b", np.array([[0, 255, 3], [1, 2, 3], [4, 5, 6], [7, 8, 9]], np.uint8)),
        ("sb", np.float32(0.1)), ("zb", np.uint8(100)), ("sy", np.float32(0.2)),
        ("zy", np.uint8(128)))]
    mm = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                          ["y"], name="mm")
    return model([mm], [info("a", [2, 4], TensorProto.UINT8)],
                 [info("y", [2, 3], TensorProto.UINT8)], inits)


def runtime_shape():
    nodes, inits = [], []
    qdq_input(nodes, inits)
    nodes.append(helper.make_node("Reshape", ["x_q", "shape"], ["y"], name="reshape"))
    return model(nodes, [info("x", [1, 4]), info("shape", [2], TensorProto.INT64)],
                 [info("y", [1, 4], TensorProto.INT8)], inits)


def never_requantized():
    nodes, inits = [], []
    qdq_input(nodes, inits)
    inits += [init("w_q", np.ones((4, 2), np.int8)), init("w_s", np.float32(0.1)),
              init("w_z", np.int8(0))]
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], name="dqw"),
              helper.make_node("MatMul", ["x_dq", "w"], ["y"], name="mm")]
    return model(nodes, [info("x", [1, 4])], [info("y", [1, 2])], inits)


def in_a_branch():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t0"], name="keep"),
                              helper.make_node("Erf", ["t0"], ["t"], name="erf_in_then")],
                             "then", [], [info("t", [1, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="pass")],
                              "else", [], [info("e", [1, 4])])
    return model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                                   else_branch=other)],
                 [info("c", [], TensorProto.BOOL), info("x", [1, 4])], [info("y", [1, 4])])


def symbolic_feature_dim():
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [info("x", ["batch", "features"])], [info("y", ["batch", "features"])])


def double_input():
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [info("x", [1, 4], TensorProto.DOUBLE)], [info("y", [1, 4], TensorProto.DOUBLE)])


def vector_clip_bound():  # found by tests/test_fuzz.py
    nodes, inits = [], []
    qdq_input(nodes, inits)
    inits.append(init("lo", np.zeros(2, np.float32)))
    nodes.append(helper.make_node("Clip", ["x_dq", "lo"], ["y"], name="clip"))
    return model(nodes, [info("x", [1, 4])], [info("y", [1, 4])], inits)


def scales_off_axis():  # found by tests/test_fuzz.py
    inits = [init("w", np.ones(4, np.int8)), init("sw", np.full(4, 0.1, np.float32)),
             init("zw", np.zeros(4, np.int8))]
    node = helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["y"], name="dq", axis=1)
    return model([helper.make_node("Identity", ["x"], ["x1"], name="keep"), node],
                 [info("x", [1, 4])], [info("y", [4])], inits)


@dataclass(frozen=True)
class Case:
    build: object
    fallback: bool
    error: type
    code: ExitCode
    where: tuple | None  # (node, index, op, domain)
    problem: str
    fix: str  # as the library says it
    cli_fix: str = ""  # as npu says it, where it has its own flag


CASES = {
    "unsupported op": Case(erf, False, UnsupportedOpError, ExitCode.UNSUPPORTED,
                           ("erf1", 1, "Erf", "ai.onnx"), "unsupported operator Erf",
                           "allow_cpu_fallback=True"),
    "custom domain, no fallback": Case(
        custom_domain, False, UnsupportedOpError, ExitCode.UNSUPPORTED,
        ("frob", 0, "Frobnicate", "com.example"), "no NPU mapping", "allow_cpu_fallback=True"),
    "custom domain, fallback": Case(
        custom_domain, True, ModelError, ExitCode.BAD_MODEL,
        ("frob", 0, "Frobnicate", "com.example"), "cannot run the CPU fallback",
        "replace the node by operators"),
    "dangling input": Case(dangling, False, ModelError, ExitCode.BAD_MODEL,
                           ("second", 1, "Add", "ai.onnx"), "'nowhere' is neither",
                           "add the initializer"),
    "unknown op (checker)": Case(unknown_default_op, True, ModelError, ExitCode.BAD_MODEL,
                                 ("frob", 1, "Frobnicate", "ai.onnx"), "onnx.checker",
                                 "onnx.checker.check_model accepts it"),
    "zero scale": Case(zero_scale, True, ModelError, ExitCode.BAD_MODEL,
                       ("quant", 0, "QuantizeLinear", "ai.onnx"), "must be positive",
                       "quantize the model again"),
    "float into QLinearMatMul": Case(float_into_qlinear, True, ModelError, ExitCode.BAD_MODEL,
                                     ("mm", 1, "QLinearMatMul", "ai.onnx"), "dtype mismatch",
                                     "full_check=True"),
    "weights outside int8": Case(wide_weights, False, UnsupportedOpError, ExitCode.UNSUPPORTED,
                                 ("mm", 0, "QLinearMatMul", "ai.onnx"), "outside int8",
                                 "allow_cpu_fallback=True"),
    "runtime Reshape shape": Case(runtime_shape, False, UnsupportedOpError,
                                  ExitCode.UNSUPPORTED, ("reshape", 2, "Reshape", "ai.onnx"),
                                  "must be a constant", "allow_cpu_fallback=True"),
    "float MatMul never requantized": Case(
        never_requantized, False, UnsupportedOpError, ExitCode.UNSUPPORTED,
        ("mm", 3, "MatMul", "ai.onnx"), "never requantized", "allow_cpu_fallback=True"),
    "inside an If branch": Case(in_a_branch, False, UnsupportedOpError, ExitCode.UNSUPPORTED,
                                ("erf_in_then", 1, "Erf", "ai.onnx"), "unsupported operator Erf",
                                "allow_cpu_fallback=True"),
    "symbolic feature dimension": Case(
        symbolic_feature_dim, True, ModelError, ExitCode.BAD_MODEL, None,
        "graph input 'x' has the symbolic dimension 'features' at axis 1",
        "dims={'features': N}", "run with --dim features=N"),
    "Clip bound not a scalar": Case(vector_clip_bound, True, ModelError, ExitCode.BAD_MODEL,
                                    ("clip", 2, "Clip", "ai.onnx"), "takes a scalar",
                                    "one-element min"),
    "scales along a missing axis": Case(scales_off_axis, True, ModelError, ExitCode.BAD_MODEL,
                                        ("dq", 1, "DequantizeLinear", "ai.onnx"),
                                        "axis 1 is outside the 1-D data", "set axis"),
    "float64 input": Case(double_input, True, ModelError, ExitCode.BAD_MODEL, None,
                          "element type DOUBLE", "cast it to float32"),
}


def location(where) -> str:
    node, index, op, domain = where
    return f"node {node!r} (#{index}, {op}, domain {domain}): "


@pytest.mark.parametrize("name", CASES)
def test_error_names_node_op_domain_and_fix(name):
    case = CASES[name]
    with pytest.raises(ModelError) as e:
        load_onnx(case.build(), allow_cpu_fallback=case.fallback)
    err, text = e.value, str(e.value)
    assert type(err) is case.error, text
    assert "\n" not in text and case.problem in text and text.endswith(err.fix), text
    assert case.fix in err.fix, text
    if case.where is None:
        assert not err.node, text
        return
    assert text.startswith(location(case.where)), text
    assert (err.node, err.index, err.op_type, err.domain) == case.where


@pytest.fixture
def own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", CASES)
def test_npu_run_prints_one_line_and_the_exit_code(name, tmp_path, capsys, own_cache_dir):
    case = CASES[name]
    path = tmp_path / "bad.onnx"
    onnx.save(case.build(), path)
    argv = ["run", str(path), "--digits", "1"] + (["--cpu-fallback"] if case.fallback else [])
    assert cli.main(argv) == case.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (line,) = err.splitlines()
    assert case.problem in line, line
    if case.where is not None:
        assert location(case.where) in line, line
    if case.fix == "allow_cpu_fallback=True":  # the command names its own flag
        assert line.endswith("or run with --cpu-fallback to run it on the CPU"), line
    else:
        assert (case.cli_fix or case.fix) in line, line


def test_npu_run_takes_the_size_of_a_symbolic_dimension(tmp_path, capsys, own_cache_dir):
    path, inputs = tmp_path / "dims.onnx", tmp_path / "in.npz"
    onnx.save(symbolic_feature_dim(), path)
    np.savez(inputs, x=np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 1, 4))
    argv = ["run", str(path), "--cpu-fallback", "--inputs", str(inputs)]
    assert cli.main(argv + ["--dim", "features=4"]) == ExitCode.OK
    assert "3/3 results equal the reference" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--dim", "features"])
    assert e.value.code == ExitCode.USAGE
    assert "is not NAME=SIZE" in capsys.readouterr().err


def test_fallback_runs_what_the_refusals_name():
    """The unsupported cases import with the fallback on (they are not broken models)."""
    for name, case in CASES.items():
        if case.error is UnsupportedOpError and name != "custom domain, no fallback":
            load_onnx(case.build(), allow_cpu_fallback=True)
