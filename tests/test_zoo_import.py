"""The test zoo through the importer: every file imports (CPU fallback on), runs on
the golden model with ``check=True`` (outputs equal the reference interpreter bit for
bit) and agrees with onnxruntime.

Against onnxruntime with graph optimizations off (the graph executed literally):
quantized outputs within 1 LSB of their output scale, float outputs within a float
tolerance, integer outputs (labels) equal. The classifiers' top-1 equals that of
onnxruntime's default session on every test input. Files the importer refuses are
listed in ``EXPECTED_REFUSALS`` with their reason, so a new refusal and an unexpected
success both fail.
"""

import numpy as np
import onnx
import pytest

from host.errors import ModelError
from host.ir import CpuOp
from host.onnx_import import load_onnx
from verif.zoo import ZOO_DIR, expected_file, load_manifest, output_key
from verif.zoo.status import output_scales, run_on_golden

MANIFEST = load_manifest()
FILES = MANIFEST["files"]

EXPECTED_REFUSALS: dict[str, str] = {}
"""Zoo file -> a fragment of the importer's error (none today: every file imports)."""

CLASSIFIER_OUTPUT = {"cnn_pc": "logits", "mlp_skl": "probabilities"}
"""The score output of each classifier model, compared by top-1."""

FLOAT_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
"""Float outputs: the host's float ops sum in another order than onnxruntime's."""


def _expected(model: str) -> dict:
    return np.load(ZOO_DIR / expected_file(model))


def _ids(entries):
    return [e["file"] for e in entries]


@pytest.fixture(scope="module")
def data():
    return {m: _expected(m) for m in MANIFEST["models"]}


def _run(entry, npz):
    graph = load_onnx(ZOO_DIR / entry["file"], allow_cpu_fallback=True)
    return graph, run_on_golden(graph, npz["input"])


@pytest.mark.parametrize("entry", [f for f in FILES if f["file"] not in EXPECTED_REFUSALS],
                         ids=_ids([f for f in FILES if f["file"] not in EXPECTED_REFUSALS]))
def test_zoo_file_matches_onnxruntime(entry, data):
    npz = data[entry["model"]]
    _, got = _run(entry, npz)
    scales = output_scales(onnx.load(str(ZOO_DIR / entry["file"])))
    for out in entry["outputs"]:
        want = npz[output_key(entry["variant"], out, "literal")]
        value = got[out].reshape(want.shape)
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(value, want, err_msg=out)
        elif out in scales:
            lsb = np.abs(value.astype(np.float64) - want) / scales[out]
            assert lsb.max() <= 1 + 1e-3, f"{out}: {lsb.max():.3g} LSB"
        else:
            np.testing.assert_allclose(value, want, err_msg=out, **FLOAT_TOLERANCE)
    score = CLASSIFIER_OUTPUT.get(entry["model"])
    if score is not None:
        default = npz[output_key(entry["variant"], score, "default")]
        np.testing.assert_array_equal(got[score].reshape(default.shape).argmax(-1),
                                      default.argmax(-1), err_msg=f"{score} top-1")


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
