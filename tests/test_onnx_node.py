"""External conformance: the ONNX backend node tests of the supported integer ops.

Each case (``verif.onnx_cases``: loaded offline with
``onnx.backend.test.loader.load_model_tests``, onnx 1.19.1 ships the models and
their input/output protobufs) has its weights, scales and zero points frozen into
initializers (the NPU needs them constant at import), is imported, and run on the
reference interpreter and, compiled, on the golden-model NPU. Outputs must equal
ONNX's expected outputs exactly, with one documented exception: the int8
QLinearMatMul cases expect *wrapped* values where the result leaves int8 (a bug
in onnx's reference implementation, onnx/onnx#7835, fixed after 1.19.1 by
onnx/onnx#7868); the NPU saturates, as the operator's specification says. A subset
also runs on the RTL (``tests/test_onnx_node_rtl.py``).
"""

import numpy as np
import onnx
import pytest

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import Session
from verif.onnx_cases import CASES, check_expected, freeze_case, load_case, node_tests


def test_every_case_is_in_the_installed_onnx():
    missing = [name for name in CASES if name not in node_tests()]
    assert not missing, f"onnx {onnx.__version__} lacks {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_node(name):
    _, fallback, placement = CASES[name]
    model, sets = load_case(name)
    assert sets, f"{name} has no data sets"
    for ins, outs in sets:
        m, consts = freeze_case(name, model, ins)
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
        check_expected(name, model, got, ins, consts, outs)
