"""The adaptive runtime on the Verilator-built NPU over its real AXI ports, in
lockstep with the golden model (``verif.model_scenarios.adaptive_vs_golden``):
fusion with hot swaps under load, shadow validation, rollback of an injected
fault, de-fusion after a phase shift, and a speculative merge across the gate's
branch whose misses fall back in the program. Every result equals the reference."""

import pytest

from verif.fastsim import run_scenario

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


@pytest.mark.parametrize("model, inputs, phases, fault, expect", [
    ("mlp", 10, "0123456789", "0", "swapped-in,merge-validated"),
    ("mlp", 10, "0123456789", "1", "rollback"),  # the fused unit is broken
    ("moe", 48, "0167|59", "0", "merge-validated,defuse-planned"),  # hot, then cold
    # one expert hot: a speculative merge across the gate's branch, then misses
    ("moe", 40, "6|0123456789", "0", "speculate-validated,defuse-planned"),
    # fusion off, specializer on: unit variants land, validate and are reverted
    ("cnn", 12, "0123456789", "specialize", "variant-validated,specialize-reverted"),
])
def test_adaptive_on_rtl(model, inputs, phases, fault, expect, seed, regress):
    run_scenario("verif.model_scenarios:adaptive_vs_golden", "default", seed=seed,
                 extra_env={"NPU_MODEL": model, "NPU_INPUTS": str(inputs * (4 if regress else 1)),
                            "NPU_PHASES": phases,
                            "NPU_FAULT": "0" if fault == "specialize" else fault,
                            "NPU_SPECIALIZE": "1" if fault == "specialize" else "0",
                            "NPU_EXPECT": expect})
