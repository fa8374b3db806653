"""The test zoo: small models made by the real tools, and onnxruntime's outputs for them.

Users bring models exported by ``torch.onnx.export`` or skl2onnx and quantized by
``onnxruntime.quantization.quantize_static``; the zoo in ``tests/zoo/`` holds such
models, written by those tools (never imitated), in every quantization layout the
importer is meant to accept, with onnxruntime's outputs on fixed inputs as the oracle.

This module holds what the generator, the test and the status report share: where
the files live, the quantization variants (one table; the manifest records each
file's settings from it) and how the expected outputs are keyed. It imports neither
torch nor onnxruntime.

::

    python -m verif.zoo             # regenerate tests/zoo/ (needs the models extra)
    python -m verif.zoo --status    # what host.onnx_import makes of every zoo file
    python -m verif.zoo --mlperf    # regenerate the MLPerf Tiny models (host/models/mlperf/)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parents[2] / "tests" / "zoo"
MANIFEST = "MANIFEST.json"

#: The zoo's models (``verif.zoo.models`` builds each), in manifest order.
MODEL_NAMES = ("cnn_pc", "mlp_skl", "dwsep", "residual", "attention", "idioms", "pool_cat",
               "cnn_dynamo")

#: The float model's variant name (``{model}.float.onnx``).
FLOAT = "float"

#: How the oracle ran: the graph executed literally (``ORT_DISABLE_ALL``, the fair
#: reference for bit-level comparison) and with onnxruntime's default optimizations
#: (what a user's session computes; fused integer kernels may differ by an LSB).
ORACLE_MODES = ("literal", "default")


@dataclass(frozen=True)
class Variant:
    """One set of ``quantize_static`` settings.

    Members
    -------
    name : the file-name part (``{model}.{name}.onnx``).
    quant_format : ``"QDQ"`` (QuantizeLinear/DequantizeLinear around float ops) or
        ``"QOperator"`` (QLinear* and ``com.microsoft`` integer ops).
    per_channel : per-output-channel weight scales.
    activation_type, weight_type : ``"QInt8"`` or ``"QUInt8"``.
    activation_symmetric : ``extra_options={"ActivationSymmetric": True}``
        (activation zero points 0 for int8).
    """

    name: str
    quant_format: str
    per_channel: bool
    activation_type: str
    weight_type: str = "QInt8"
    activation_symmetric: bool = False

    def settings(self) -> dict:
        """The settings as the manifest records them."""
        d = asdict(self)
        del d["name"]
        return d


#: Every variant is made for every model: together they cover QDQ per-tensor and
#: per-channel, QOperator, int8 and uint8 activations, symmetric and asymmetric
#: activations on each model at least once.
VARIANTS = (
    Variant("qdq-pt-s8", "QDQ", per_channel=False, activation_type="QInt8"),
    Variant("qdq-pc-s8", "QDQ", per_channel=True, activation_type="QInt8"),
    Variant("qdq-pt-u8", "QDQ", per_channel=False, activation_type="QUInt8"),
    Variant("qdq-pc-s8-sym", "QDQ", per_channel=True, activation_type="QInt8",
            activation_symmetric=True),
    Variant("qop-pt-u8", "QOperator", per_channel=False, activation_type="QUInt8"),
    Variant("qop-pc-s8", "QOperator", per_channel=True, activation_type="QInt8"),
)


#: The MLPerf Tiny reference models (``verif.zoo.mlperf_models`` builds each), made in
#: one variant: per-tensor QDQ with int8 activations, as the issue's users quantize.
MLPERF_NAMES = ("resnet8", "ds_cnn", "mobilenet_v1_025", "fc_autoencoder")
MLPERF_VARIANT = VARIANTS[0]
assert MLPERF_VARIANT.name == "qdq-pt-s8"


def model_file(model: str, variant: str) -> str:
    """The zoo file name of one model in one variant (``cnn_pc.qdq-pt-s8.onnx``)."""
    return f"{model}.{variant}.onnx"


def expected_file(model: str) -> str:
    """The npz with one model's inputs and the oracle's outputs for every variant."""
    return f"{model}.expected.npz"


def output_key(variant: str, output: str, mode: str) -> str:
    """The npz key of one output of one variant under one oracle mode."""
    return f"{variant}|{output}|{mode}"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_manifest(zoo_dir: Path = ZOO_DIR) -> dict:
    """The zoo's manifest (``MANIFEST.json``)."""
    return json.loads((Path(zoo_dir) / MANIFEST).read_text())
