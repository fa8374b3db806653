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

import numpy as np
import onnx
import pytest

from host.errors import ModelError
from host.ir import CpuOp, QConv, QGemm
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
                                  "mlp_skl.qop-pt-u8.onnx", "dwsep.qop-pt-u8.onnx"])
def test_qoperator_per_tensor_layers_run_on_the_npu(file):
    """QLinearConv, com.microsoft QGemm and QLinearAdd map onto NPU operators."""
    graph = load_onnx(ZOO_DIR / file, allow_cpu_fallback=True)
    model = onnx.load(str(ZOO_DIR / file))
    mapped = {n.name for n in model.graph.node
              if n.op_type in ("QLinearConv", "QGemm", "QLinearAdd")}
    placed = {n.name: n for n in graph.nodes if n.name in mapped}
    assert mapped and set(placed) == mapped
    assert all(n.device == "npu" and not isinstance(n, CpuOp) for n in placed.values())


_WEIGHT_SCALE_INPUT = {"QLinearConv": 4, "QLinearMatMul": 4, "QGemm": 4}
"""QOperator ops: the input index of the weight scale."""


def _per_channel_nodes(model) -> dict[str, bool]:
    """ONNX nodes with per-channel weight scales -> whether they are grouped convolutions:
    QDQ Conv/Gemm/MatMul whose weight is a DequantizeLinear with a per-axis scale, and
    QOperator QLinearConv/QLinearMatMul/QGemm with a per-axis weight scale."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    dq_scale = {n.output[0]: sizes.get(n.input[1], 1) for n in model.graph.node
                if n.op_type == "DequantizeLinear"}
    out = {}
    for n in model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            per_channel = dq_scale.get(n.input[1], 1) > 1
        elif n.op_type in _WEIGHT_SCALE_INPUT:
            per_channel = sizes.get(n.input[_WEIGHT_SCALE_INPUT[n.op_type]], 1) > 1
        else:
            continue
        if per_channel:
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            out[n.name] = group != 1
    return out


PER_CHANNEL_FILES = [f for f in FILES if (f["settings"] or {}).get("per_channel")]


@pytest.mark.parametrize("entry", PER_CHANNEL_FILES, ids=_ids(PER_CHANNEL_FILES))
def test_per_channel_layers_run_on_the_npu(entry):
    """Every per-channel Conv (grouped and depthwise too), Gemm and MatMul of the
    per-channel files runs on the NPU with a per-channel requantization (vqtab +
    vreq ... tab=1). Prints the NPU vs CPU counts."""
    model = onnx.load(str(ZOO_DIR / entry["file"]))
    nodes = _per_channel_nodes(model)
    assert nodes, "a per-channel file without per-channel weights"
    graph = load_onnx(ZOO_DIR / entry["file"], allow_cpu_fallback=True)
    by_name = {n.name: n for n in graph.nodes}
    on_npu = set(nodes)
    assert on_npu <= set(by_name), f"not lowered to one IR node: {on_npu - set(by_name)}"
    for name in on_npu:
        n = by_name[name]
        assert isinstance(n, QGemm | QConv) and n.device == "npu", (name, n.op, n.device)
        assert n.requant is not None and n.requant.per_channel, name
    npu = sum(n.device == "npu" for n in graph.nodes)
    grouped = sum(nodes.values())
    print(f"\n{entry['file']}: {len(on_npu)} per-channel layers on the NPU ({grouped} "
          f"grouped); IR nodes {npu} NPU, {len(graph.nodes) - npu} CPU")


def test_asymmetric_per_channel_weights_stay_on_the_cpu():
    """Per-channel weights with non-zero zero points are not what the NPU's table takes:
    the importer names the reason, and under fallback the layer runs on the CPU."""
    model = onnx.load(str(ZOO_DIR / "cnn_pc.qdq-pc-s8.onnx"))
    zp = next(t for t in model.graph.initializer if t.name == "body.0.weight_zero_point")
    values = onnx.numpy_helper.to_array(zp).copy()
    values[0] = 1
    zp.CopyFrom(onnx.numpy_helper.from_array(values, zp.name))
    with pytest.raises(ModelError, match="non-zero zero points"):
        load_onnx(model)
    graph = load_onnx(model, allow_cpu_fallback=True)
    convs = [n for n in graph.nodes if n.name == "/body/body.0/Conv"]
    assert convs and all(n.device == "cpu" for n in convs)
@pytest.mark.parametrize("entry", [f for f in FILES if f["model"] == "dwsep"
                                   and f["file"] != "dwsep.float.onnx"], ids=lambda e: e["file"])
def test_depthwise_conv_runs_on_the_npu(entry):
    """The depthwise-separable block's depthwise Conv (groups=8) and pointwise Conv are
    NPU convolutions in every quantized variant (per-tensor and per-channel)."""
    graph = load_onnx(ZOO_DIR / entry["file"], allow_cpu_fallback=True)
    convs = [n for n in graph.nodes if n.op == "QConv"]
    assert [(n.device, n.group, n.is_depthwise) for n in convs] == \
        [("npu", 8, True), ("npu", 1, False)]
    assert not any(isinstance(n, CpuOp) for n in graph.nodes)
