"""Streamed layers at MLPerf Tiny sizes on the golden model (RTL within a few cycles).

The FC autoencoder's dense stack and a ResNet-8 first stage (verif/mlperf_shapes.py)
compiled for the default and the small NPU: warm cycles per inference (weights that fit
stay resident), MAC utilization against the array's peak, DRAM bytes, program size,
and how many layers stream. Then each convolution layer of
:data:`verif.conv_shapes.LAYERS` alone on the default NPU, with the rows of its
longest ``gemm`` (the output rows one GEMM covers, :mod:`host.compiler.convrows`).
Run: ``make bench-tiling``.
"""

from __future__ import annotations

import re

import numpy as np

from bench.common import report
from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.runtime import Session
from verif.conv_shapes import LAYERS, conv_layer
from verif.mlperf_shapes import fc_autoencoder, resnet8_convs

PROFILES = {
    "default": CONFIGS["default"],
    "small": CONFIGS["small"],
}


def measure(graph, config) -> dict:
    model = compile_model(graph, config)
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    x = {n: np.random.default_rng(0).integers(-128, 128, graph.tensors[n].shape,
                                              dtype=np.int8) for n in graph.inputs}
    s.run(x)  # cold: resident weights load
    r = s.run(x)
    # The layers' own MACs: the MACS counter also counts the products of the rows a
    # long convolution GEMM reads past each output row's end.
    macs = sum(u.resources["macs"] for u in model.units)
    peak = config.peak_macs_per_cycle
    return {
        "cycles": r.cycles,
        "macs": macs,
        "array_macs": r.counters["macs"],
        "mac_utilization": macs / (r.cycles * peak),
        "dram_read_bytes": r.counters["dram_read_bytes"],
        "dram_bound_cycles": r.counters["dram_read_bytes"] // config.bus_bytes,
        "instructions": model.instructions,
        "units_streamed": sum(1 for u in model.units if u.resources.get("streamed_steps")),
        "units": len(model.units),
        "gemm_rows_max": max((int(m) for m in re.findall(r"gemm\.\w+ p\d, r\d+, r\d+, (\d+)",
                                                         model.source)), default=0),
    }


def main():
    figures = {}
    for name, build in (("fc_autoencoder", fc_autoencoder), ("resnet8_stage1", resnet8_convs)):
        graph = build()
        for prof, config in PROFILES.items():
            figures[f"{name} {prof}"] = measure(graph, config)
    for name, geom in LAYERS.items():
        figures[f"conv {name} default"] = measure(conv_layer(0, *geom), PROFILES["default"])
    report("tiling", figures)


if __name__ == "__main__":
    main()
