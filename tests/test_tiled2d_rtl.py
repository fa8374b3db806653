"""Convolutions streamed image and weights together on the Verilator-built NPU
(``small`` profile), against the golden model and the reference interpreter
(``verif.tiled_scenarios.tiled2d_vs_golden``)."""

import pytest

from verif.fastsim import run_scenario

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


def test_tiled2d_on_rtl(seed):
    run_scenario("verif.tiled_scenarios:tiled2d_vs_golden", "small", seed=seed)
