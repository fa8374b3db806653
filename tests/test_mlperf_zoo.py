"""The MLPerf Tiny models (host/models/mlperf/): files, oracle, import, reference, NPU.

* the manifest describes the files on disk and onnxruntime reproduces the stored
  outputs exactly;
* each model has its reference architecture's size (MACs and quantized weights);
* each imports (CPU fallback for what the NPU lacks) with the manifest's interface;
* the reference interpreter equals onnxruntime (``ORT_DISABLE_ALL``) within 1 LSB on
  every int8 tensor, each computed from onnxruntime's values of its inputs
  (:mod:`verif.zoo.layerwise`);
* where the compiler maps a model onto the default NPU, the golden model's outputs
  equal the reference interpreter's bit for bit.

Needs onnxruntime, not torch.
"""

import argparse

import numpy as np
import pytest

from firmware.config import CONFIGS
from host import cli
from host.compiler import CompileError, compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.models import MLPERF_DIR
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.zoo import (
    MANIFEST,
    MLPERF_NAMES,
    MLPERF_VARIANT,
    ORACLE_MODES,
    expected_file,
    load_manifest,
    oracle,
    output_key,
    sha256,
)
from verif.zoo.layerwise import layer_errors
from verif.zoo.workload import workload

MANIFEST_DATA = load_manifest(MLPERF_DIR)
ENTRIES = {f["model"]: f for f in MANIFEST_DATA["files"]}

#: MACs and parameters of the reference architectures, from their layer lists
#: (mlcommons/tiny benchmark/training/): the published 12.5M, 2.7M, 7.5M and 264k MACs.
REFERENCE_SIZE = {
    "resnet8": (12_501_632, 77_706),
    "ds_cnn": (2_656_768, 22_604),
    "mobilenet_v1_025": (7_489_664, 210_850),
    "fc_autoencoder": (264_192, 265_864),
}


def _path(model):
    return MLPERF_DIR / ENTRIES[model]["file"]


def _inputs(model):
    return np.load(MLPERF_DIR / expected_file(model))["input"]


def test_manifest_lists_exactly_the_files_on_disk():
    listed = {f["file"] for f in MANIFEST_DATA["files"]} | {
        info["expected"] for info in MANIFEST_DATA["models"].values()}
    on_disk = {p.name for p in MLPERF_DIR.iterdir()} - {MANIFEST, "README.md"}
    assert listed == on_disk
    assert tuple(MANIFEST_DATA["models"]) == MLPERF_NAMES


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_files_have_their_manifest_hash(model):
    assert sha256(_path(model)) == ENTRIES[model]["sha256"]
    info = MANIFEST_DATA["models"][model]
    assert sha256(MLPERF_DIR / info["expected"]) == info["expected_sha256"]


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_oracle_reproduces_the_expected_outputs(model):
    npz = np.load(MLPERF_DIR / expected_file(model))
    for mode in ORACLE_MODES:
        got = oracle.run(oracle.session(_path(model), mode), npz["input"])
        for name, value in got.items():
            np.testing.assert_array_equal(
                value, npz[output_key(MLPERF_VARIANT.name, name, mode)], err_msg=f"{mode} {name}")


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_model_has_its_reference_size(model):
    import onnx
    from onnx import numpy_helper

    macs, params = REFERENCE_SIZE[model]
    assert workload(_path(model)).macs == macs
    assert MANIFEST_DATA["models"][model]["macs"] == macs
    # the quantized weights and biases (DequantizeLinear's inputs, less the scales and
    # zero points of one element each)
    inits = [numpy_helper.to_array(i) for i in onnx.load(str(_path(model))).graph.initializer]
    assert sum(a.size for a in inits if a.dtype in (np.int8, np.int32) and a.size > 1) == params


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_model_imports_with_its_interface(model):
    graph = load_onnx(_path(model), allow_cpu_fallback=True)
    entry = ENTRIES[model]
    assert graph.inputs == [entry["input"]["name"]]
    assert list(graph.tensors[graph.inputs[0]].shape) == entry["input"]["shape"]
    assert graph.outputs == entry["outputs"]
    assert any(n.device == "npu" for n in graph.nodes)


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_reference_equals_onnxruntime_within_one_lsb_per_layer(model):
    graph = load_onnx(_path(model), allow_cpu_fallback=True)
    errors = layer_errors(graph, _path(model), _inputs(model))
    assert len(errors) >= ENTRIES[model]["ops"]["QuantizeLinear"] - 1  # the Flatten's pair
    assert max(errors.values()) <= 1, {k: v for k, v in errors.items() if v > 1}


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_golden_npu_equals_reference(model):
    graph = load_onnx(_path(model), allow_cpu_fallback=True)
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    try:
        compiled = compile_model(graph, drv.config)
    except CompileError as err:  # the state of the compiler, reported by bench.models
        pytest.skip(f"does not compile for the default config: {err}")
    session = Session(drv, compiled, check=True)
    session.load()
    shape = graph.tensors[graph.inputs[0]].shape
    result = session.run({graph.inputs[0]: _inputs(model)[0].reshape(shape)})
    assert result.checked and result.counters["macs"] > 0


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_npu_resolves_the_name_and_its_sample_inputs(model):
    assert cli.model_path(model) == _path(model)
    assert model in cli.bundled_names()
    graph = load_onnx(cli.model_path(model), allow_cpu_fallback=True)
    opts = argparse.Namespace(model=model, inputs=None, digits=None)
    batch, labels = cli.load_inputs(graph, opts)
    assert labels is None
    np.testing.assert_array_equal(np.stack([b["input"] for b in batch]), _inputs(model))


def test_npu_refuses_digits_for_an_mlperf_model(capsys):
    assert cli.main(["run", "resnet8", "--cpu-fallback", "--digits", "2"]) == \
        cli.ExitCode.USAGE
    err = capsys.readouterr().err
    assert "not an 8x8 digit" in err and "--inputs" in err and len(err.splitlines()) == 1


def test_compile_error_is_unsupported_not_a_bad_model():
    code, line = cli.failure(CompileError("the unit needs 83088 bytes of scratchpad"))
    assert code == cli.ExitCode.UNSUPPORTED
    assert "cannot map the model onto this NPU" in line and "83088" in line
