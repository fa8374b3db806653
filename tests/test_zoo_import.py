"""The test zoo through the importer: every file imports (CPU fallback on), runs on
the golden model with ``check=True`` (outputs equal the reference interpreter bit for
bit) and agrees with onnxruntime.

Against onnxruntime (``verif.zoo.check``, shared with the RTL run in
``tests/test_zoo_rtl.py``): with graph optimizations off (the graph executed
literally), quantized outputs within 1 LSB of their output scale, float outputs within
a float tolerance, integer outputs (labels) equal; the classifiers' top-1 equals that
of onnxruntime's default session on every test input. Files the importer refuses are
listed in ``EXPECTED_REFUSALS`` with their reason, so a new refusal and an unexpected
success both fail.
"""

import onnx
import pytest

from host.errors import ModelError
from host.ir import CpuOp
from host.onnx_import import load_onnx
from verif.zoo import ZOO_DIR, load_manifest
from verif.zoo.check import assert_matches_onnxruntime, load_expected
from verif.zoo.status import run_on_golden

MANIFEST = load_manifest()
FILES = MANIFEST["files"]

EXPECTED_REFUSALS: dict[str, str] = {}
"""Zoo file -> a fragment of the importer's error (none today: every file imports)."""


def _ids(entries):
    return [e["file"] for e in entries]


@pytest.fixture(scope="module")
def data():
    return {m: load_expected(m) for m in MANIFEST["models"]}


def _run(entry, npz):
    graph = load_onnx(ZOO_DIR / entry["file"], allow_cpu_fallback=True)
    return graph, run_on_golden(graph, npz["input"])


@pytest.mark.parametrize("entry", [f for f in FILES if f["file"] not in EXPECTED_REFUSALS],
                         ids=_ids([f for f in FILES if f["file"] not in EXPECTED_REFUSALS]))
def test_zoo_file_matches_onnxruntime(entry, data):
    npz = data[entry["model"]]
    _, got = _run(entry, npz)
    assert_matches_onnxruntime(entry, got, npz)


def test_expected_refusals_are_refused_for_their_reason():
    for file, reason in EXPECTED_REFUSALS.items():
        with pytest.raises(ModelError, match=reason):
            load_onnx(ZOO_DIR / file, allow_cpu_fallback=True)


def test_refusals_name_zoo_files():
    assert set(EXPECTED_REFUSALS) <= {f["file"] for f in FILES}


@pytest.mark.parametrize("file", ["cnn_pc.qop-pt-u8.onnx", "residual.qop-pt-u8.onnx",
                                  "mlp_skl.qop-pt-u8.onnx"])
def test_qoperator_per_tensor_layers_run_on_the_npu(file):
    """QLinearConv, com.microsoft QGemm and QLinearAdd map onto NPU operators."""
    graph = load_onnx(ZOO_DIR / file, allow_cpu_fallback=True)
    model = onnx.load(str(ZOO_DIR / file))
    mapped = {n.name for n in model.graph.node
              if n.op_type in ("QLinearConv", "QGemm", "QLinearAdd")}
    placed = {n.name: n for n in graph.nodes if n.name in mapped}
    assert mapped and set(placed) == mapped
    assert all(n.device == "npu" and not isinstance(n, CpuOp) for n in placed.values())
