"""The training run of the profile-guided library (``build --profiled``).

``python -m verif.fastsim.train LIBRARY CONFIG_JSON`` runs a mixed workload on an
instrumented library, each part checked against the golden model as in the tests:
constrained-random programs (the sequencer, queues, DMA, every vector op), a
streaming GEMM with DRAM backpressure (the array, bursts, stalls) and a convolution
model (the compiler's conv and vector code). Its own seeds and sizes, none of the
benchmarks' inputs. The process's exit writes the profile beside the objects.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from firmware.config import NPUConfig
from host.verilator_device import VerilatorDevice
from verif.rtl_device import scenario_function

from . import _environment

WORKLOAD = (  # scenario, its environment, DRAM backpressure
    ("verif.scenarios:random_programs", {"NPU_RANDOM_COUNT": "30"}, False),
    ("verif.scenarios:gemm_bench", {"NPU_GEMM_MNK": "64,64,64"}, True),
    ("verif.model_scenarios:model_vs_golden", {"NPU_MODEL": "cnn", "NPU_INPUTS": "2"}, False),
)
SEED = 271828


def main(argv=None) -> int:
    library, config_json = argv or sys.argv[1:]
    config = NPUConfig(**json.loads(config_json))
    with tempfile.TemporaryDirectory() as tmp:
        for spec, env, backpressure in WORKLOAD:
            device = VerilatorDevice(library)
            if backpressure:
                device.set_backpressure(SEED, 30)
            try:
                with _environment({**env, "NPU_BENCH_OUT": os.path.join(tmp, "out.json")}):
                    scenario_function(spec)(device, config=config, seed=SEED)
            finally:
                device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
