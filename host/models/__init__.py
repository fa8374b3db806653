"""The bundled digit-classifier models: what they are and where they live.

Four models trained on ``host.datasets.load_digits_split(0)`` ship as ONNX files in
this folder, each as a float model (``NAME_float.onnx``) and as a QDQ int8 model in
onnxruntime's static-quantizer layout (``NAME.onnx``); ``README.md`` lists their
accuracies and the quantization conventions, and ``python -m host.models.generate``
rebuilds them all. Every model takes one digit per inference (batch dimension 1):

* ``mlp``: input (1, 64) -> Gemm 32, ReLU -> Gemm 10.
* ``cnn``: input (1, 1, 8, 8) -> Conv 3x3 (8), ReLU, MaxPool 2 -> Conv 3x3 (16), ReLU,
  MaxPool 2 -> Flatten -> Gemm 10.
* ``moe``: input (1, 64) -> gate Gemm 4 -> ArgMax (output ``expert``) -> nested
  ``Equal``/``If`` choosing one of four 64-32-10 expert MLPs.
* ``early_exit``: input (1, 64) -> Gemm 32, ReLU -> exit gate Gemm 2 -> ArgMax (output
  ``path``); ``path == 0`` returns head1's logits (Gemm 10), otherwise
  Gemm 32, ReLU -> Gemm 10.

Every model has the float32 output ``logits`` (1, 10).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

__all__ = [
    "CALIBRATION_FILE",
    "CLASS_GROUPS",
    "MLPERF_DIR",
    "MODEL_DIR",
    "MODEL_NAMES",
    "NUM_EXPERTS",
    "SPECS",
    "ModelSpec",
    "OutputSpec",
    "load_calibration",
    "load_model",
    "model_filename",
    "model_path",
    "run_reference",
]

MODEL_DIR = Path(__file__).resolve().parent
#: The MLPerf Tiny reference architectures (``mlperf/README.md``): ``NAME.onnx`` and
#: ``NAME.expected.npz``, whose key ``input`` holds sample inputs, one inference a row.
MLPERF_DIR = MODEL_DIR / "mlperf"
MODEL_NAMES = ("mlp", "cnn", "moe", "early_exit")
CALIBRATION_FILE = "calibration.npz"
NUM_EXPERTS = 4
#: Digit classes whose inputs the ``moe`` gate was trained to send to each expert.
CLASS_GROUPS = ((0, 6, 8), (1, 4, 7), (2, 3), (5, 9))


@dataclass(frozen=True)
class OutputSpec:
    """One graph output.

    Members
    -------
    name : str
    elem_type : int
        ``onnx.TensorProto`` element type.
    shape : tuple of int
    """

    name: str
    elem_type: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """The documented interface of one bundled model.

    Members
    -------
    name : str
    summary : str
        One-line description.
    input_shape : tuple of int
        Shape of the float32 input ``input`` (batch 1).
    outputs : tuple of OutputSpec
        Graph outputs, ``logits`` first.
    float_ops : frozenset of str
        Operator types of the float model.
    qdq_ops : frozenset of str
        Operator types of the QDQ model.
    """

    name: str
    summary: str
    input_shape: tuple[int, ...]
    outputs: tuple[OutputSpec, ...]
    float_ops: frozenset[str]
    qdq_ops: frozenset[str]

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """Return flat digits ``(N, 64)`` as float32 batches of this model's input layout."""
        x = np.asarray(x, dtype=np.float32)
        return x.reshape((-1,) + self.input_shape[1:])


_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_LOGITS = OutputSpec("logits", TensorProto.FLOAT, (1, 10))
_CONTROL = {"ArgMax", "Equal", "If"}

SPECS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(
        "mlp", "MLP 64 -> 32 (ReLU) -> 10.", (1, 64), (_LOGITS,),
        frozenset({"Gemm", "Relu"}), frozenset({"Gemm"} | _QDQ)),
    "cnn": ModelSpec(
        "cnn", "CNN: Conv 3x3 8ch, ReLU, MaxPool 2, Conv 3x3 16ch, ReLU, MaxPool 2, "
        "Flatten, Gemm 64 -> 10.", (1, 1, 8, 8), (_LOGITS,),
        frozenset({"Conv", "Relu", "MaxPool", "Flatten", "Gemm"}),
        frozenset({"Conv", "MaxPool", "Flatten", "Gemm"} | _QDQ)),
    "moe": ModelSpec(
        "moe", f"Gated mixture of {NUM_EXPERTS} experts: gate 64 -> {NUM_EXPERTS}, ArgMax, "
        "nested Ifs over 64 -> 32 (ReLU) -> 10 experts.", (1, 64),
        (_LOGITS, OutputSpec("expert", TensorProto.INT64, (1,))),
        frozenset({"Gemm", "Relu"} | _CONTROL), frozenset({"Gemm"} | _CONTROL | _QDQ)),
    "early_exit": ModelSpec(
        "early_exit", "Early exit: 64 -> 32 (ReLU), exit gate 32 -> 2 (ArgMax); exit with "
        "head1 32 -> 10 or continue 32 -> 32 (ReLU) -> 10.", (1, 64),
        (_LOGITS, OutputSpec("path", TensorProto.INT64, (1,))),
        frozenset({"Gemm", "Relu"} | _CONTROL), frozenset({"Gemm"} | _CONTROL | _QDQ)),
}


def model_filename(name: str, quantized: bool = True) -> str:
    """File name of model ``name``: ``NAME.onnx`` (QDQ) or ``NAME_float.onnx``."""
    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; models are {', '.join(MODEL_NAMES)}")
    return f"{name}.onnx" if quantized else f"{name}_float.onnx"


def model_path(name: str, quantized: bool = True) -> Path:
    """Path of the shipped model ``name`` (QDQ by default)."""
    return MODEL_DIR / model_filename(name, quantized)


def load_model(name: str, quantized: bool = True) -> onnx.ModelProto:
    """Load the shipped model ``name`` (QDQ by default)."""
    return onnx.load(model_path(name, quantized))


def load_calibration() -> tuple[np.ndarray, np.ndarray]:
    """The calibration sample: float32 ``(N, 64)`` training inputs and their labels."""
    with np.load(MODEL_DIR / CALIBRATION_FILE) as f:
        return f["x"], f["y"]


def run_reference(model: onnx.ModelProto | str | Path, name: str,
                  x: np.ndarray, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``model`` (spec ``name``) under ``onnx.reference`` on flat digits ``x`` (N, 64).

    The model runs once per digit (batch 1). Returns every graph output (or those
    named in ``outputs``) stacked over the digits: ``logits`` as (N, 10), ``expert``
    and ``path`` as (N,).
    """
    from onnx.reference import ReferenceEvaluator

    spec = SPECS[name]
    if isinstance(model, str | Path):
        model = onnx.load(model)
    sess = ReferenceEvaluator(model)
    names = list(outputs) if outputs is not None else [o.name for o in spec.outputs]
    xs = spec.prepare(x)
    rows = [sess.run(names, {"input": xs[i : i + 1]}) for i in range(len(xs))]
    return {n: np.concatenate([r[j] for r in rows]) for j, n in enumerate(names)}
