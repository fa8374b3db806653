"""The ONNX backend node tests on the Verilator-built NPU (the subset the NPU runs).

Every case is offered to one simulation per configuration
(``verif.onnx_node_scenarios.node_cases_vs_golden``): the cases whose nodes are
placed on the NPU run there, each data set's outputs equal ONNX's expected outputs
exactly and the golden model's, with equal exact counters and trace fields; the
CPU-only cases are skipped inside the scenario, which must run at least every case
``CASES`` places on the NPU.
"""

import pytest

from verif.fastsim import run_scenario
from verif.onnx_cases import CASES

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator

NPU_CASES = sorted(name for name, (_, _, placement) in CASES.items() if "npu" in placement)


def test_npu_cases_are_listed():
    # maxpool, add int8/uint8, the three clip int8 cases and If, at least
    assert len(NPU_CASES) >= 7, NPU_CASES


@pytest.mark.parametrize("config", ["default", "small"])
def test_onnx_nodes_on_rtl(config, seed, regress):
    run_scenario("verif.onnx_node_scenarios:node_cases_vs_golden", config, seed=seed,
                 extra_env={"NPU_ONNX_CASES": ",".join(sorted(CASES)),
                            "NPU_ONNX_MIN_NPU": str(len(NPU_CASES)),
                            "NPU_ONNX_RANDOM": "8" if regress else "1"})
