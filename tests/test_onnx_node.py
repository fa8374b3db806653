"""External conformance: the ONNX backend node tests of the supported integer ops.

Each case is loaded offline with ``onnx.backend.test.loader.load_model_tests``
(onnx 1.19.1 ships the models and their input/output protobufs), its weights,
scales and zero points frozen into initializers (the NPU needs them constant at
import), imported, and run on the reference interpreter. Outputs must equal
ONNX's expected outputs exactly, with one documented exception: the int8
QLinearMatMul cases expect *wrapped* values where the result leaves int8 (a bug
in onnx's reference implementation, onnx/onnx#7835, fixed after 1.19.1 by
onnx/onnx#7868); the NPU saturates, as the operator's specification says.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import freeze_inputs, load_onnx
from host.reference import run_reference
from host.runtime import Session

SCALES = ["a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"]

# case name -> (inputs frozen into initializers, CPU fallback needed, placement of the nodes)
CASES = {
    "test_matmulinteger": (["B", "a_zero_point", "b_zero_point"], False, ["cpu"]),
    "test_convinteger_with_padding": (["w", "x_zero_point"], False, ["cpu"]),
    "test_convinteger_without_padding": (["w", "x_zero_point"], False, ["cpu"]),
    "test_qlinearconv": (["x_scale", "x_zero_point", "w", "w_scale", "w_zero_point",
                          "y_scale", "y_zero_point"], True, ["cpu"]),
    "test_maxpool_2d_uint8": ([], False, ["npu"]),
    "test_add_int8": ([], False, ["npu"]),
    "test_add_uint8": ([], False, ["npu"]),
    "test_clip_default_int8_inbounds": ([], False, ["npu"]),
    "test_clip_default_int8_min": (["min"], False, ["npu"]),
    "test_clip_default_int8_max": (["max"], False, ["npu"]),
    "test_clip_default_int8_max_expanded": (["max"], True, ["cpu", "cpu"]),  # Less, Where
    "test_quantizelinear": (["y_scale", "y_zero_point"], False, ["cpu"]),
    "test_dequantizelinear": (["x_scale", "x_zero_point"], False, ["cpu"]),
    "test_if": ([], False, ["npu"]),
}
for _rank in ("2D", "3D"):
    for _q in ("int8", "uint8"):
        for _f in ("float16", "float32"):
            # b - b_zero_point leaves int8 in every case: CPU, same integer formula
            CASES[f"test_qlinearmatmul_{_rank}_{_q}_{_f}"] = (SCALES, True, ["cpu"])

# How many expected elements of the int8 QLinearMatMul cases are wrapped (see above).
WRAPPED = {"test_qlinearmatmul_2D_int8_float16": 1, "test_qlinearmatmul_2D_int8_float32": 1,
           "test_qlinearmatmul_3D_int8_float16": 4, "test_qlinearmatmul_3D_int8_float32": 4}


def qlinearmatmul_exact(a, sa, za, b, sb, zb, sy, zy):
    """Independent formula: round-half-even of the exact product with the scale
    computed in the scales' float type (as ONNX does), before any saturation."""
    acc = (a.astype(np.int64) - za.astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64))
    return np.rint(acc * np.float64((sa * sb / sy)[0])) + int(zy[0])


_ALL = {t.name: t for t in load_model_tests(kind="node")}


def _data_sets(case):
    sets = []
    for ds in sorted(__import__("pathlib").Path(case.model_dir).glob("test_data_set_*")):
        ins, outs = {}, []
        for f in sorted(ds.glob("input_*.pb")):
            t = onnx.load_tensor(str(f))
            ins[t.name] = numpy_helper.to_array(t)
        for f in sorted(ds.glob("output_*.pb")):
            outs.append(numpy_helper.to_array(onnx.load_tensor(str(f))))
        sets.append((ins, outs))
    return sets


def test_every_case_is_in_the_installed_onnx():
    missing = [name for name in CASES if name not in _ALL]
    assert not missing, f"onnx {onnx.__version__} lacks {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_node(name):
    frozen, fallback, placement = CASES[name]
    case = _ALL[name]
    model = onnx.load(f"{case.model_dir}/model.onnx")
    sets = _data_sets(case)
    assert sets, f"{name} has no data sets"
    for ins, outs in sets:
        consts = {k: ins.pop(k) for k in frozen}
        m = freeze_inputs(model, consts)
        if fallback:  # the case needs the CPU: without the fallback it must say why
            with pytest.raises(ValueError, match="outside int8|unsupported operator"):
                load_onnx(m)
        g = load_onnx(m, allow_cpu_fallback=fallback)
        assert [n.device for _, n in g.walk()] == placement
        got = run_reference(g, ins)
        for config in CONFIGS.values():  # compiled and run on the golden-model NPU
            session = Session(NPUDriver(GoldenDevice(config)), compile_model(g, config),
                              check=True)
            session.load()
            npu = session.run(ins).outputs
            for k, v in got.items():
                assert np.array_equal(npu[k], v), f"{name}: NPU {k}"
        for info, want in zip(model.graph.output, outs, strict=True):
            y = got[info.name]
            assert y.dtype == want.dtype and y.shape == want.shape, name
            if name.startswith("test_qlinearmatmul"):
                raw = qlinearmatmul_exact(ins["a"], *(consts[k] for k in SCALES))
                info_ = np.iinfo(want.dtype)
                assert np.array_equal(raw.astype(np.int64).astype(want.dtype), want), \
                    "ONNX's data is not the wrapped exact result"
                assert np.sum((raw < info_.min) | (raw > info_.max)) == WRAPPED.get(name, 0)
                want = np.clip(raw, info_.min, info_.max).astype(want.dtype)
            np.testing.assert_array_equal(y, want, err_msg=name)

