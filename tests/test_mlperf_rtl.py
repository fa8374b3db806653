"""The MLPerf Tiny models on the Verilator-built NPU, over its real AXI ports.

Each model the compiler maps onto the default config (the others are skipped with
the compiler's reason; ``make bench-models`` reports them) runs its first sample
input on the RTL and the golden model side by side
(``verif.model_scenarios.bench_models_rtl``): the outputs equal the reference
interpreter on both, and every exact counter and trace field agree. Hundreds of
thousands of cycles each: ``make regress`` only.
"""

import pytest

from firmware.config import CONFIGS
from host.compiler import CompileError, compile_model
from host.models import MLPERF_DIR
from host.onnx_import import load_onnx
from verif.fastsim import run_scenario
from verif.zoo import MLPERF_NAMES

pytestmark = [pytest.mark.rtl, pytest.mark.slow]


@pytest.mark.parametrize("model", MLPERF_NAMES)
def test_mlperf_model_on_rtl(model, seed, tmp_path):
    graph = load_onnx(MLPERF_DIR / f"{model}.onnx", allow_cpu_fallback=True)
    try:
        compile_model(graph, CONFIGS["default"])
    except CompileError as err:
        pytest.skip(f"does not compile for the default config: {err}")
    run_scenario("verif.model_scenarios:bench_models_rtl", "default", seed=seed,
                 extra_env={"NPU_MODELS": model, "NPU_INPUTS": "1",
                            "NPU_BENCH_OUT": str(tmp_path / "figures.json")})
