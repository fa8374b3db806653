"""Compiled models on the RTL: the runtime's results against the reference
interpreter, and the RTL's counters and trace against the golden model.

Scenarios for :func:`verif.rtl_device.run_scenario` (environment: ``NPU_MODEL``, a
bundled model name or .onnx path; ``NPU_INPUTS``, how many held-out digits).
"""

from __future__ import annotations

import os

import numpy as np

from firmware.golden import EXACT_COUNTERS
from host.cli import model_path
from host.compiler import compile_model
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.scenarios import EXACT_TRACE


def model_vs_golden(device, config, seed):
    """Run a bundled model on RTL and golden side by side: outputs equal the reference
    interpreter on both, and every exact counter and trace field agree per inference."""
    name = os.environ.get("NPU_MODEL", "mlp")
    count = int(os.environ.get("NPU_INPUTS", "4"))
    graph = load_onnx(model_path(name))
    sessions = []
    for dev in (device, GoldenDevice(config)):
        drv = NPUDriver(dev)
        model = compile_model(graph, drv.config)
        s = Session(drv, model, check=True)
        s.load()
        sessions.append(s)
    split = load_digits_split(seed=0)
    rng = np.random.default_rng(seed)
    shape = graph.tensors[graph.inputs[0]].shape
    for i in rng.choice(len(split.x_test), size=count, replace=False):
        inputs = {graph.inputs[0]: split.x_test[i].reshape(shape).astype(np.float32)}
        rtl, gold = (s.run(inputs) for s in sessions)
        for out in rtl.outputs:
            assert np.array_equal(rtl.outputs[out], gold.outputs[out]), f"{name} #{i}: {out}"
        for c in EXACT_COUNTERS:
            assert rtl.counters[c] == gold.counters[c], \
                f"{name} #{i}: counter {c}: RTL {rtl.counters[c]}, golden {gold.counters[c]}"
        assert len(rtl.trace) == len(gold.trace), f"{name} #{i}: trace length"
        for a, b in zip(rtl.trace, gold.trace, strict=True):
            for f in EXACT_TRACE:
                assert getattr(a, f) == getattr(b, f), f"{name} #{i}: trace {f}: {a} vs {b}"
        print(f"{name} digit #{i}: {int(np.argmax(rtl.outputs['logits']))} "
              f"(label {split.y_test[i]}), {rtl.cycles} cycles on the RTL, "
              f"{gold.cycles} estimated by the golden model; results, counters and trace agree")
