"""cocotb entry point of :func:`verif.rtl_device.run_scenario` (runs in the simulator).

Not collected by pytest. It resets the NPU, then runs the host function named by
``NPU_SCENARIO`` in a bridge thread with a :class:`~verif.rtl_device.CocotbDevice`.
"""

import os

import cocotb
from cocotb.task import bridge

from verif.rtl_device import (
    CocotbDevice,
    NpuTestbench,
    config_from_env,
    dram_latency_from_env,
    scenario_function,
)


@cocotb.test()
async def npu_scenario(dut):
    """The host scenario named by NPU_SCENARIO passes on the RTL."""
    seed = int(os.environ.get("NPU_SCENARIO_SEED", "0"))
    tb = NpuTestbench(dut, backpressure=os.environ.get("NPU_BACKPRESSURE") == "1", seed=seed,
                      dram_latency=dram_latency_from_env(os.environ))
    await tb.reset()
    fn = scenario_function(os.environ["NPU_SCENARIO"])
    config = config_from_env(os.environ["NPU_CONFIG"])
    dut._log.info("scenario %s, seed %d", os.environ["NPU_SCENARIO"], seed)
    await bridge(fn)(CocotbDevice(tb), config=config, seed=seed)
