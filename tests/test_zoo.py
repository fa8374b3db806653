"""The test zoo (tests/zoo/): models made by torch, skl2onnx and onnxruntime's quantizer.

These tests check the vectors, not the importer (``python -m verif.zoo --status``
reports what the importer makes of them): the manifest describes the files on disk,
onnxruntime (the oracle) reproduces the stored outputs exactly, and every file is
in the quantization layout its variant's settings name. Needs onnxruntime, not torch.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from verif.zoo import (
    FLOAT,
    MANIFEST,
    MODEL_NAMES,
    ORACLE_MODES,
    ZOO_DIR,
    expected_file,
    load_manifest,
    oracle,
    output_key,
    sha256,
)

MANIFEST_DATA = load_manifest()
FILES = MANIFEST_DATA["files"]
QUANT_DOMAINS = {"com.microsoft"}
INT_TYPES = {"QInt8": np.int8, "QUInt8": np.uint8}


def _ids(entries):
    return [e["file"] for e in entries]


def _quantized(kind=None):
    return [f for f in FILES if f["settings"] and (kind is None or f["settings"]["quant_format"]
                                                   == kind)]


class _Graph:
    """A zoo file's nodes and initializers, for layout checks."""

    def __init__(self, file):
        self.model = onnx.load(str(ZOO_DIR / file))
        g = self.model.graph
        self.nodes = list(g.node)
        self.inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}

    def of(self, *ops):
        return [n for n in self.nodes if n.op_type in ops]

    def quant_nodes(self):
        """Nodes that compute on quantized values: Q/DQ, QLinear*, contrib integer ops."""
        return [n for n in self.nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                or n.op_type.startswith("QLinear") or n.domain in QUANT_DOMAINS
                or n.op_type in ("MatMulInteger", "ConvInteger", "DynamicQuantizeLinear")]

    def scales(self):
        """Every float initializer a quantized node reads: its scales (biases are int32)."""
        return [self.inits[i] for n in self.quant_nodes() for i in n.input
                if i in self.inits and self.inits[i].dtype == np.float32]

    def activation_zero_points(self):
        """Zero points of quantized activations: quantized operators take each operand
        as (value, scale, zero point), so the zero point two places after an input
        that is not an initializer belongs to an activation (QuantizeLinear's and
        DequantizeLinear's operands included)."""
        zps = []
        for n in self.quant_nodes():
            for i, name in enumerate(n.input[:-2]):
                if name and name not in self.inits and n.input[i + 2] in self.inits:
                    zps.append(self.inits[n.input[i + 2]])
        return zps


# ---- the manifest is the directory --------------------------------------------------


def test_manifest_lists_exactly_the_files_on_disk():
    on_disk = {p.name for p in ZOO_DIR.glob("*.onnx")}
    listed = {f["file"] for f in FILES}
    assert on_disk == listed, (f"not in {MANIFEST}: {sorted(on_disk - listed)}; "
                               f"missing on disk: {sorted(listed - on_disk)}")
    assert list(MANIFEST_DATA["models"]) == list(MODEL_NAMES)


@pytest.mark.parametrize("entry", FILES, ids=_ids(FILES))
def test_file_has_its_manifest_hash(entry):
    path = ZOO_DIR / entry["file"]
    assert path.stat().st_size == entry["bytes"]
    assert sha256(path) == entry["sha256"], f"{entry['file']} changed; regenerate the zoo"


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_expected_outputs_have_their_manifest_hash(model):
    info = MANIFEST_DATA["models"][model]
    assert sha256(ZOO_DIR / info["expected"]) == info["expected_sha256"]


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_model_covers_every_format(model):
    """Each model exists float and in QDQ per tensor, QDQ per channel, QOperator,
    int8 and uint8 activations, symmetric and asymmetric activations."""
    kept = [f for f in FILES if f["model"] == model]
    settings = [f["settings"] for f in kept if f["settings"]]
    assert any(f["variant"] == FLOAT for f in kept)
    needed = {
        "QDQ per tensor": lambda s: s["quant_format"] == "QDQ" and not s["per_channel"],
        "QDQ per channel": lambda s: s["quant_format"] == "QDQ" and s["per_channel"],
        "QOperator": lambda s: s["quant_format"] == "QOperator",
        "int8 activations": lambda s: s["activation_type"] == "QInt8",
        "uint8 activations": lambda s: s["activation_type"] == "QUInt8",
        "symmetric activations": lambda s: s["activation_symmetric"],
        "asymmetric activations": lambda s: not s["activation_symmetric"],
    }
    missing = [what for what, has in needed.items() if not any(map(has, settings))]
    assert not missing, f"{model} has no file with {missing}"


# ---- onnxruntime reproduces the stored outputs ----------------------------------------


@pytest.mark.parametrize("entry", FILES, ids=_ids(FILES))
def test_oracle_reproduces_the_expected_outputs(entry):
    """The graph run literally (ORT_DISABLE_ALL) gives the stored outputs bit for bit:
    the vectors are onnxruntime's, and the file is the one they were made from."""
    data = np.load(ZOO_DIR / expected_file(entry["model"]))
    inputs = data["input"]
    assert list(inputs.shape) == MANIFEST_DATA["models"][entry["model"]]["test_inputs"]
    got = oracle.run(oracle.session(ZOO_DIR / entry["file"], "literal"), inputs)
    assert list(got) == entry["outputs"]
    for name, value in got.items():
        for mode in ORACLE_MODES:
            assert output_key(entry["variant"], name, mode) in data.files
        want = data[output_key(entry["variant"], name, "literal")]
        assert value.dtype == want.dtype and value.shape == want.shape, name
        np.testing.assert_array_equal(value, want, err_msg=f"{entry['file']} output {name}")


# ---- each file is what its variant says ------------------------------------------------


@pytest.mark.parametrize("entry", [f for f in FILES if not f["settings"]],
                         ids=_ids([f for f in FILES if not f["settings"]]))
def test_float_file_has_no_quantization(entry):
    g = _Graph(entry["file"])
    assert not g.quant_nodes(), [n.op_type for n in g.quant_nodes()]
    eight_bit = [k for k, v in g.inits.items() if v.dtype in (np.int8, np.uint8)]
    assert not eight_bit, f"8-bit initializers in a float model: {eight_bit}"


@pytest.mark.parametrize("entry", _quantized("QDQ"), ids=_ids(_quantized("QDQ")))
def test_qdq_file_has_only_quantize_dequantize(entry):
    """QDQ: float operators between QuantizeLinear/DequantizeLinear pairs, no integer
    operators."""
    g = _Graph(entry["file"])
    assert g.of("QuantizeLinear") and g.of("DequantizeLinear")
    integer_ops = [n.op_type for n in g.quant_nodes()
                   if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert not integer_ops, f"integer operators in a QDQ file: {integer_ops}"


@pytest.mark.parametrize("entry", _quantized("QOperator"), ids=_ids(_quantized("QOperator")))
def test_qoperator_file_has_integer_operators(entry):
    g = _Graph(entry["file"])
    integer_ops = [n for n in g.nodes if n.op_type.startswith("QLinear")
                   or n.domain in QUANT_DOMAINS]
    assert integer_ops, "a QOperator file without QLinear* or com.microsoft operators"
    assert "com.microsoft" in entry["opsets"] or not any(n.domain for n in integer_ops)


@pytest.mark.parametrize("entry", _quantized(), ids=_ids(_quantized()))
def test_weight_scales_are_per_channel_or_per_tensor(entry):
    g = _Graph(entry["file"])
    per_channel = [s for s in g.scales() if s.size > 1]
    if not entry["settings"]["per_channel"]:
        assert not per_channel, f"per-tensor file with scales of sizes " \
                                f"{[s.size for s in per_channel]}"
        return
    assert per_channel, "a per-channel file whose scales are all scalars"
    if entry["settings"]["quant_format"] == "QDQ":
        # A weight (an int8 initializer) dequantized along an axis with one scale per
        # slice of that axis.
        along_axis = []
        for n in g.of("DequantizeLinear"):
            w, scale = g.inits.get(n.input[0]), g.inits.get(n.input[1])
            if w is None or scale is None or w.dtype != np.int8 or scale.size < 2:
                continue
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            along_axis.append(w.shape[axis] == scale.size)
        assert along_axis and all(along_axis), "no int8 weight dequantized per channel"


@pytest.mark.parametrize("entry", _quantized(), ids=_ids(_quantized()))
def test_activation_zero_points_have_the_variant_type(entry):
    s = entry["settings"]
    zps = _Graph(entry["file"]).activation_zero_points()
    assert zps, "no QuantizeLinear with a zero point"
    want = INT_TYPES[s["activation_type"]]
    assert {z.dtype for z in zps} == {np.dtype(want)}
    midpoint = 128 if want == np.uint8 else 0
    centered = [bool(np.all(z.astype(np.int32) == midpoint)) for z in zps]
    if s["activation_symmetric"]:
        assert all(centered), "symmetric activations with an off-center zero point"
    else:
        assert not all(centered), "asymmetric activations whose zero points are all centered"


@pytest.mark.parametrize("entry", _quantized(), ids=_ids(_quantized()))
def test_weights_have_the_variant_type(entry):
    """Weights feeding a DequantizeLinear or an integer operator are of the weight type
    (int32 biases aside)."""
    g = _Graph(entry["file"])
    want = np.dtype(INT_TYPES[entry["settings"]["weight_type"]])
    ints = {g.inits[i].dtype for n in g.quant_nodes() for i in n.input
            if i in g.inits and g.inits[i].dtype.kind in "iu" and g.inits[i].ndim >= 1
            and g.inits[i].dtype != np.int32}
    assert ints == {want}, f"weights of types {ints}"
