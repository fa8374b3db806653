"""``make bench-depthwise``: depthwise convolution and average pooling on the golden model.

Each layer is compiled for the default configuration as a one-unit model and run
twice on the golden model (the second run has its weights resident; the depthwise
scenarios of tests/test_depthwise_rtl.py take the same cycles on the Verilator NPU).
The depthwise convolutions run on the depthwise engine (``dwload``/``dwconv``), the
poolings as channel-diagonal GEMMs on the array. Figures per layer: the unit's
cycles (its region, including the input load and output store), the layer's MACs,
MAC utilization against the array's peak, the channel-diagonal ceiling (one MAC per
column per cycle, ``1/rows`` of the peak: what the array reaches on a depthwise
layer), the queues' busy cycles, and the cost model's linear prediction before any
measurement.

Layers: the DS-CNN (MLPerf Tiny keyword spotting) depthwise layer, 25x5x64, 3x3,
stride 1; MobileNetV1-0.25 (96x96 input) depthwise layers (12x12x64 stride 1,
24x24x32 stride 2 down to 12x12, 6x6x128 stride 1);
and the global average pooling that ends DS-CNN (25x5x64) and ResNet-8 (8x8x64).
"""

from __future__ import annotations

import numpy as np

from bench.common import report
from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.compiler import compile_model
from host.compiler.cost import CostModel
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.runtime import Session

LAYERS = {
    # name: (channels, height, width, kernel or None for global pooling, stride)
    "dscnn_dw_25x5x64_s1": (64, 25, 5, 3, 1),
    "mobilenet_dw_12x12x64_s1": (64, 12, 12, 3, 1),
    "mobilenet_dw_24x24x32_s2": (32, 24, 24, 3, 2),
    "mobilenet_dw_6x6x128_s1": (128, 6, 6, 3, 1),
    "dscnn_global_pool_25x5x64": (64, 25, 5, None, 1),
    "resnet8_global_pool_8x8x64": (64, 8, 8, None, 1),
}


def _graph(rng, c, h, w, k, stride):
    b = GraphBuilder("layer")
    x = b.input("x", (1, c, h, w), scale=0.05, zp=3)
    if k is None:
        y = b.avgpool(x, None, out_scale=0.03, out_zp=0)
    else:
        weight = rng.integers(-128, 128, (c, 1, k, k), dtype=np.int8)
        bias = rng.integers(-3000, 3000, c).astype(np.int32)
        y = b.qconv(x, weight, bias, strides=(stride, stride), pads=(1, 1, 1, 1),
                    w_scale=0.01, out_scale=0.4, relu=True, group=c)
    b.output(y, "y")
    return b.build()


def measure(name: str, c, h, w, k, stride, config) -> dict:
    rng = np.random.default_rng(0)
    model = compile_model(_graph(rng, c, h, w, k, stride), config)
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    x = {"x": rng.integers(-128, 128, (1, c, h, w), dtype=np.int8)}
    s.run(x)
    r = s.run(x)  # warm: the weight tags hit
    (rec,) = r.trace
    unit = model.regions[rec.region]
    macs = unit.resources["macs"]
    peak = config.rows * config.cols
    work = {k: v for k, v in unit.resources["work"].items() if k != "timeline"}
    return {
        "cycles": rec.cycles,
        "macs": macs,
        "mac_utilization": macs / (rec.cycles * peak),
        "diagonal_ceiling": 1 / config.rows,
        "compute_floor_cycles": -(-macs // config.cols),
        "array_counter_macs": rec.macs,
        "busy_load": r.counters["busy_load"],
        "busy_compute": r.counters["busy_compute"],
        "busy_store": r.counters["busy_store"],
        "instructions_in_program": len(model.program),
        "cost_model_linear_prediction": round(CostModel(config).predict(work)),
    }


def main():
    config = CONFIGS["default"]
    figures = {name: measure(name, *shape, config) for name, shape in LAYERS.items()}
    report("depthwise", figures)


if __name__ == "__main__":
    main()
