"""Compiled bundled models on the Verilator-built NPU, over its real AXI ports.

Every inference's outputs equal the reference interpreter (``Session(check=True)``)
and the golden model's, and the exact counters and region-trace fields of the RTL
equal the golden model's (``verif.model_scenarios.model_vs_golden``).
"""

import pytest

from verif.fastsim import run_scenario

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


@pytest.mark.parametrize("config, model, inputs", [
    ("default", "mlp", 3),
    ("default", "cnn", 2),
    ("default", "moe", 4),
    ("default", "early_exit", 4),
    ("small", "cnn", 1),
])
def test_model_on_rtl(config, model, inputs, seed, regress):
    run_scenario("verif.model_scenarios:model_vs_golden", config, seed=seed,
                 extra_env={"NPU_MODEL": model, "NPU_INPUTS": str(inputs * (10 if regress else 1))})
