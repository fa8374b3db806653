"""What torch and onnxruntime write, op by op: the zoo holds each idiom, each lands where
the IR can run it, and a batch left symbolic by ``dynamic_axes`` binds as documented.

``tests/test_zoo_import.py`` checks every zoo file's outputs against onnxruntime; this
file checks that the idioms it relies on are really in the files (so the coverage
cannot silently vanish on regeneration) and where the importer places them.
"""

import numpy as np
import onnx
import pytest
from onnx import helper

from host.errors import ModelError
from host.ir import CpuOp
from host.onnx_import import load_onnx
from verif.zoo import ZOO_DIR, load_manifest
from verif.zoo.check import assert_matches_onnxruntime, load_expected
from verif.zoo.status import run_on_golden

MANIFEST = load_manifest()
ENTRIES = {f["file"]: f for f in MANIFEST["files"]}


def nodes(file):
    return list(onnx.load(str(ZOO_DIR / file)).graph.node)


def attr(node, name, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def test_torch_idioms_are_in_the_zoo():
    ns = nodes("idioms.float.onnx")
    ops = [n.op_type for n in ns]
    for op in ("Flatten", "Reshape", "Split", "Concat", "Squeeze", "Unsqueeze"):
        assert op in ops, op
    convs = [n for n in ns if n.op_type == "Conv"]
    assert any(attr(c, "strides") == [2, 2] for c in convs)
    assert any(attr(c, "dilations") == [2, 2] and attr(c, "pads") == [2, 2, 2, 2] for c in convs)
    assert any(n.op_type == "Gemm" and attr(n, "transB") == 1 for n in ns)
    producer = {o: n for n in ns for o in n.output}
    assert any(n.op_type == "MatMul" and producer.get(n.input[0]) is not None
               and producer[n.input[0]].op_type == "Transpose" for n in ns)
    dims = MANIFEST["files"][[f["file"] for f in MANIFEST["files"]].index(
        "idioms.float.onnx")]["input"]["shape"]
    assert dims[0] == "batch" and all(isinstance(d, int) for d in dims[1:])


@pytest.mark.parametrize("variant", ["qop-pt-u8", "qop-pc-s8"])
def test_onnxruntime_contrib_pooling_and_concat_are_in_the_zoo(variant):
    ops = {(n.domain, n.op_type) for n in nodes(f"pool_cat.{variant}.onnx")}
    for op in ("QLinearConcat", "QLinearGlobalAveragePool", "QLinearAveragePool"):
        assert ("com.microsoft", op) in ops, op


def test_dynamo_exporter_model_is_in_the_zoo():
    info = MANIFEST["models"]["cnn_dynamo"]
    assert "dynamo=True" in info["exporter"]


NPU_OPS = {"Conv", "Gemm", "MatMul", "Flatten", "Reshape", "Squeeze", "Unsqueeze",
           "QLinearConv", "QLinearMatMul", "QGemm"}
"""The idioms' ops the IR runs on the NPU (per-tensor files): the dilated Conv as a
dense kernel with zero taps, Squeeze/Unsqueeze as reshapes."""

CPU_OPS = {"Split", "Concat", "Transpose", "QLinearConcat"}
"""No IR operator: the CPU fallback, on the int8 values (no float round trip)."""


@pytest.mark.parametrize("file", ["idioms.qdq-pt-s8.onnx", "idioms.qdq-pt-u8.onnx",
                                  "idioms.qop-pt-u8.onnx"])
def test_idioms_land_where_the_ir_runs_them(file):
    graph = load_onnx(ZOO_DIR / file, allow_cpu_fallback=True)
    placed = {n.name: n for _, n in graph.walk()}
    for node in nodes(file):
        if node.op_type in NPU_OPS:
            assert placed[node.name].device == "npu", node.name
        if node.op_type in CPU_OPS:
            ir = placed[node.name]
            assert isinstance(ir, CpuOp)
            data = {graph.tensors[i].dtype for i in ir.inputs if not graph.tensors[i].is_const}
            assert data == {"int8"}, node.name


def test_symbolic_batch_binds_to_one_with_a_note():
    graph = load_onnx(ZOO_DIR / "idioms.qdq-pt-s8.onnx", allow_cpu_fallback=True)
    assert graph.tensors["input"].shape == (1, 2, 8, 8)
    assert graph.notes == ["input 'input': symbolic batch dimension 'batch' bound to 1 "
                           "(one inference per run)"]


@pytest.mark.parametrize("file", ["idioms.qdq-pt-u8.onnx", "idioms.qop-pt-u8.onnx"])
def test_symbolic_batch_takes_the_size_given(file):
    """dims={"batch": 2}: two stored inputs in one run equal onnxruntime's outputs."""
    graph = load_onnx(ZOO_DIR / file, allow_cpu_fallback=True, dims={"batch": 2})
    assert graph.tensors["input"].shape == (2, 2, 8, 8) and not graph.notes
    npz = load_expected("idioms")
    pairs = npz["input"][:4].reshape(2, 1, 2, 2, 8, 8)  # two runs of batch 2
    got = run_on_golden(graph, pairs)
    assert_matches_onnxruntime(ENTRIES[file], {"output": got["output"].reshape(4, 1, 4, 4)},
                               npz, rows=range(4))


def test_only_the_leading_dimension_binds_by_itself():
    m = onnx.load(str(ZOO_DIR / "idioms.qdq-pt-s8.onnx"))
    dim = m.graph.input[0].type.tensor_type.shape.dim[2]
    dim.Clear()
    dim.dim_param = "height"
    with pytest.raises(ModelError, match="symbolic dimension 'height' at axis 2") as e:
        load_onnx(m, allow_cpu_fallback=True)
    assert "dims={'height': N}" in str(e.value)
    g = load_onnx(m, allow_cpu_fallback=True, dims={"height": 8})
    assert g.tensors["input"].shape == (1, 2, 8, 8)


def test_dilated_conv_runs_as_a_dense_kernel():
    graph = load_onnx(ZOO_DIR / "idioms.qdq-pt-s8.onnx", allow_cpu_fallback=True)
    conv = graph.node("/conv2/Conv")
    assert conv.device == "npu" and conv.weight.shape[2:] == (5, 5)
    assert not conv.weight[:, :, 1::2, :].any() and not conv.weight[:, :, :, 1::2].any()
    assert np.count_nonzero(conv.weight[:, :, ::2, ::2]) > 0


def test_npu_run_prints_the_batch_note(tmp_path, monkeypatch, capsys):
    from host import cli

    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "cache"))
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input=load_expected("idioms")["input"][:1])
    assert cli.main(["run", str(ZOO_DIR / "idioms.qdq-pt-s8.onnx"), "--inputs", str(inputs),
                     "--cpu-fallback"]) == cli.ExitCode.OK
    out, err = capsys.readouterr()
    assert err == "" and "symbolic batch dimension 'batch' bound to 1" in " ".join(out.split())
