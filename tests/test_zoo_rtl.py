"""The test zoo (``tests/zoo/``: models written by torch, skl2onnx and onnxruntime's
quantizer) on the Verilator-built NPU, over its real AXI ports.

Each file is imported with the CPU fallback on and run on the RTL and the golden model
side by side (``verif.model_scenarios.zoo_vs_golden``): every inference equals the
reference interpreter (``Session(check=True)``), the RTL's outputs, exact counters and
trace equal the golden model's, and the outputs agree with onnxruntime's stored ones
as in ``tests/test_zoo_import.py`` (within 1 LSB of the graph executed literally,
top-1 of the default session).

One simulator start runs a whole group of files (a start costs seconds); a group is
one model in every variant, so a failure names its model. The groups run under
``make regress``; ``make test`` runs one small group on every CI run.
"""

import pytest

from verif.fastsim import run_scenario
from verif.zoo import MODEL_NAMES, load_manifest

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator

SCENARIO = "verif.model_scenarios:zoo_vs_golden"

SMOKE_FILES = ("cnn_pc.qdq-pt-s8.onnx", "cnn_pc.qop-pt-u8.onnx", "cnn_pc.qdq-pc-s8.onnx")
"""QDQ and QOperator files whose Conv and Gemm layers run on the NPU (the last with
per-channel weight scales: vqtab and vreq ... tab=1): the path from a real tool's file
to the RTL, cheap enough for every CI run."""

REGRESS_INPUTS = 3
"""Stored inputs per file under ``make regress``: a few, since every file's RTL run
is also checked inference by inference against the golden model."""


def _model_files(model: str) -> list[str]:
    return [f["file"] for f in load_manifest()["files"] if f["model"] == model]


def _run_zoo(files, inputs: int, seed: int) -> None:
    run_scenario(SCENARIO, "default", seed=seed,
                 extra_env={"NPU_ZOO": ",".join(files), "NPU_INPUTS": str(inputs)})


def test_zoo_smoke_on_rtl(seed):
    _run_zoo(SMOKE_FILES, 1, seed)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_zoo_model_on_rtl(model, seed):
    _run_zoo(_model_files(model), REGRESS_INPUTS, seed)
