"""Depthwise convolution and average pooling on the Verilator-built NPU, against the
golden model (outputs, counters, trace, cycles) and the reference interpreter
(``verif.model_scenarios.depthwise_vs_golden``)."""

import pytest

from verif.fastsim import run_scenario

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


def test_depthwise_and_pooling_on_rtl(seed):
    run_scenario("verif.model_scenarios:depthwise_vs_golden", "default", seed=seed,
                 extra_env={"NPU_INPUTS": "2"})
