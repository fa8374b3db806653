"""The zoo's acceptance check: a run's outputs against onnxruntime's stored outputs.

Shared by the golden-model test (``tests/test_zoo_import.py``) and the RTL scenario
(``verif.model_scenarios:zoo_vs_golden``), so both hold the NPU to the same oracle:

* against the graph executed literally (``ORT_DISABLE_ALL``): quantized outputs
  within 1 LSB of their output scale, float outputs within a float tolerance,
  integer outputs (labels) equal;
* the classifiers' top-1 equals that of onnxruntime's default session.

Needs neither torch nor onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from . import ZOO_DIR, expected_file, load_manifest, output_key
from .status import output_scales

CLASSIFIER_OUTPUT = {"cnn_pc": "logits", "mlp_skl": "probabilities"}
"""The score output of each classifier model, compared by top-1."""

FLOAT_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
"""Float outputs: the host's float ops sum in another order than onnxruntime's."""

LSB_SLACK = 1 + 1e-3
"""1 LSB, plus float rounding of the difference divided by the scale."""


def manifest_entry(file: str, zoo_dir: Path = ZOO_DIR) -> dict:
    """The manifest's record of one zoo file (``KeyError`` names an unknown file)."""
    entries = {f["file"]: f for f in load_manifest(zoo_dir)["files"]}
    if file not in entries:
        raise KeyError(f"{file!r} is not a zoo file (see {zoo_dir}/MANIFEST.json)")
    return entries[file]


def load_expected(model: str, zoo_dir: Path = ZOO_DIR):
    """One model's stored inputs (``input``) and oracle outputs (npz)."""
    return np.load(zoo_dir / expected_file(model))


def assert_matches_onnxruntime(entry: dict, got: dict, npz, rows=None,
                               zoo_dir: Path = ZOO_DIR) -> None:
    """``got`` (output name -> outputs stacked one inference a row) agrees with
    onnxruntime on the stored inputs ``rows`` (indices; all when None) of the zoo
    in ``zoo_dir``."""
    rows = slice(None) if rows is None else np.asarray(rows)
    scales = output_scales(onnx.load(str(zoo_dir / entry["file"])))
    where = entry["file"]
    for out in entry["outputs"]:
        want = npz[output_key(entry["variant"], out, "literal")][rows]
        value = np.asarray(got[out]).reshape(want.shape)
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(value, want, err_msg=f"{where}: {out}")
        elif out in scales:
            lsb = np.abs(value.astype(np.float64) - want) / scales[out]
            assert lsb.max() <= LSB_SLACK, f"{where}: {out}: {lsb.max():.3g} LSB"
        else:
            np.testing.assert_allclose(value, want, err_msg=f"{where}: {out}",
                                       **FLOAT_TOLERANCE)
    score = CLASSIFIER_OUTPUT.get(entry["model"])
    if score is not None:
        default = npz[output_key(entry["variant"], score, "default")][rows]
        np.testing.assert_array_equal(np.asarray(got[score]).reshape(default.shape).argmax(-1),
                                      default.argmax(-1), err_msg=f"{where}: {score} top-1")
