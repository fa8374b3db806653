"""The ONNX backend node test cases of the supported integer ops, and their check.

One loader for every backend: the golden-model test (``tests/test_onnx_node.py``)
and the RTL scenario (``verif.onnx_node_scenarios``) both take their cases, their
data sets and the rule their outputs must meet from here.

The cases are loaded offline with ``onnx.backend.test.loader.load_model_tests``
(onnx 1.19.1 ships the models and their input/output protobufs). Their weights,
scales and zero points are frozen into initializers (the NPU needs them constant
at import). Outputs must equal ONNX's expected outputs exactly, with one
documented exception: the int8 QLinearMatMul cases expect *wrapped* values where
the result leaves int8 (a bug in onnx's reference implementation, onnx/onnx#7835,
fixed after 1.19.1 by onnx/onnx#7868); the NPU saturates, as the operator's
specification says.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

SCALES = ["a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]

CASES = {
    "test_matmulinteger": (["B", "a_zero_point", "b_zero_point"], False, ["cpu"]),
    "test_convinteger_with_padding": (["w", "x_zero_point"], False, ["cpu"]),
    "test_convinteger_without_padding": (["w", "x_zero_point"], False, ["cpu"]),
    # w - w_zero_point = 0 - 255: the common factor 255 moves into the requantization
    "test_qlinearconv": (["x_scale", "x_zero_point", "w", "w_scale", "w_zero_point",
                          "y_scale", "y_zero_point"], False, ["npu"]),
    "test_maxpool_2d_uint8": ([], False, ["npu"]),
    "test_add_int8": ([], False, ["npu"]),
    "test_add_uint8": ([], False, ["npu"]),
    "test_clip_default_int8_inbounds": ([], False, ["npu"]),
    "test_clip_default_int8_min": (["min"], False, ["npu"]),
    "test_clip_default_int8_max": (["max"], False, ["npu"]),
    "test_clip_default_int8_max_expanded": (["max"], True, ["cpu", "cpu"]),  # Less, Where
    "test_quantizelinear": (["y_scale", "y_zero_point"], False, ["cpu"]),
    "test_dequantizelinear": (["x_scale", "x_zero_point"], False, ["cpu"]),
    "test_quantizelinear_axis": (["y_scale", "y_zero_point"], True, ["cpu"]),  # per axis
    "test_dequantizelinear_axis": (["x_scale", "x_zero_point"], True, ["cpu"]),
    "test_dynamicquantizelinear": ([], True, ["cpu"]),  # scale computed at run time
    "test_dynamicquantizelinear_max_adjusted": ([], True, ["cpu"]),
    "test_dynamicquantizelinear_min_adjusted": ([], True, ["cpu"]),
    "test_if": ([], False, ["npu"]),
}
"""Case name -> (inputs frozen into initializers, CPU fallback needed, placement of the
nodes as ``Graph.walk`` lists them after import)."""

for _rank in ("2D", "3D"):
    for _q in ("int8", "uint8"):
        for _f in ("float16", "float32"):
            # b - b_zero_point leaves int8 in every case: CPU, same integer formula
            CASES[f"test_qlinearmatmul_{_rank}_{_q}_{_f}"] = (SCALES, True, ["cpu"])

WRAPPED = {"test_qlinearmatmul_2D_int8_float16": 1, "test_qlinearmatmul_2D_int8_float32": 1,
           "test_qlinearmatmul_3D_int8_float16": 4, "test_qlinearmatmul_3D_int8_float32": 4}
"""How many expected elements of the int8 QLinearMatMul cases are wrapped (see above)."""


def qlinearmatmul_exact(a, sa, za, b, sb, zb, sy, zy):
    """Independent formula: round-half-even of the exact product with the scale
    computed in the scales' float type (as ONNX does), before any saturation."""
    acc = (a.astype(np.int64) - za.astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64))
    return np.rint(acc * np.float64((sa * sb / sy)[0])) + int(zy[0])


@functools.cache
def node_tests() -> dict:
    """Every node test case of the installed onnx, by name (``onnx.backend.test.case``)."""
    from onnx.backend.test.loader import load_model_tests

    return {t.name: t for t in load_model_tests(kind="node")}


def load_case(name: str) -> tuple[onnx.ModelProto, list[tuple[dict, list]]]:
    """The model of case ``name`` and its data sets.

    Each data set is ``(inputs, outputs)``: graph input name -> array, and the
    expected outputs in graph-output order. The inputs are fresh arrays per call.
    """
    case = node_tests()[name]
    model = onnx.load(f"{case.model_dir}/model.onnx")
    sets = []
    for ds in sorted(Path(case.model_dir).glob("test_data_set_*")):
        ins, outs = {}, []
        for f in sorted(ds.glob("input_*.pb")):
            t = onnx.load_tensor(str(f))
            ins[t.name] = numpy_helper.to_array(t)
        for f in sorted(ds.glob("output_*.pb")):
            outs.append(numpy_helper.to_array(onnx.load_tensor(str(f))))
        sets.append((ins, outs))
    return model, sets


def freeze_case(name: str, model: onnx.ModelProto, ins: dict) -> tuple[onnx.ModelProto, dict]:
    """Freeze the inputs that case ``name`` needs constant into initializers.

    Removes them from ``ins`` (what is left is what the model is run on) and returns
    the frozen model and the frozen values.
    """
    from host.onnx_import import freeze_inputs

    consts = {k: ins.pop(k) for k in CASES[name][0]}
    return freeze_inputs(model, consts), consts


def check_expected(name: str, model: onnx.ModelProto, got: dict, ins: dict, consts: dict,
                   outs: list) -> None:
    """Assert that ``got`` (output name -> array) equals ONNX's expected ``outs`` exactly.

    Dtype and shape must match too. For the QLinearMatMul cases the expected data
    is first checked to be the wrapped exact result (with :data:`WRAPPED` elements
    out of range) and the saturated exact result is required instead. Raises
    ``AssertionError`` naming the case.
    """
    for info, want in zip(model.graph.output, outs, strict=True):
        y = got[info.name]
        assert y.dtype == want.dtype and y.shape == want.shape, \
            f"{name}: {info.name} is {y.dtype}{y.shape}, ONNX expects {want.dtype}{want.shape}"
        if name.startswith("test_qlinearmatmul"):
            raw = qlinearmatmul_exact(ins["a"], *(consts[k] for k in SCALES))
            info_ = np.iinfo(want.dtype)
            assert np.array_equal(raw.astype(np.int64).astype(want.dtype), want), \
                "ONNX's data is not the wrapped exact result"
            assert np.sum((raw < info_.min) | (raw > info_.max)) == WRAPPED.get(name, 0)
            want = np.clip(raw, info_.min, info_.max).astype(want.dtype)
        np.testing.assert_array_equal(y, want, err_msg=f"{name}: {info.name}")


def npu_nodes(graph) -> int:
    """How many nodes of an imported graph (branches included) are placed on the NPU."""
    return sum(n.device == "npu" for _, n in graph.walk())
