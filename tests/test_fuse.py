"""The fused static plan (host/compiler/fuse.py), the default of ``compile_model``.

* merging is decided on the merged unit's own code: the plan it picks is what the
  cost model predicts faster, and the golden model confirms it (fewer cycles than
  the per-layer plan, outputs equal to the reference interpreter);
* units never merge across a branch body or a CPU node, and the per-layer plan
  stays one ``compile_model(..., fuse=False)`` away;
* a merge the compiler refuses is reported with its reason.
"""

import os
import subprocess
import sys

import pytest

from firmware.config import CONFIGS
from host.adaptive.timeline import timeline_cycles
from host.cli import model_path
from host.compiler import compile_model, initial_units, simplify
from host.compiler.fuse import fuse_units
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.model_scenarios import model_inputs

CONFIG = CONFIGS["default"]


def _graph(name):
    return load_onnx(model_path(name), allow_cpu_fallback=True)


def _golden_cycles(name, compiled) -> int:
    """Warm cycles of one checked inference (outputs equal the reference)."""
    session = Session(NPUDriver(GoldenDevice(CONFIG)), compiled, check=True)
    session.load()
    x = model_inputs(name, compiled.graph)[0]
    session.run(x)
    result = session.run(x)
    assert result.checked
    return result.cycles


@pytest.mark.parametrize("name", ["ds_cnn", "cnn", "early_exit"])
def test_fused_plan_is_faster_and_exact(name):
    graph = _graph(name)
    fused = compile_model(graph, CONFIG)
    per_layer = compile_model(graph, CONFIG, fuse=False)
    assert len(fused.units) < len(per_layer.units)
    assert any(line.startswith("fused ") for line in fused.fusion)
    assert _golden_cycles(name, fused) < _golden_cycles(name, per_layer)


def test_ds_cnn_runs_as_one_unit():
    """Its activations are 8 KB each, and a merged unit hands a dead intermediate's
    buffer to the next layer: all eleven layers fit one unit. The first
    convolution's output stays at the GEMM pitch (one vreqb per column tile), which
    the depthwise engine after it reads as it is, so its merge pays."""
    graph = simplify(_graph("ds_cnn"))[0]
    plan = fuse_units(graph, CONFIG)
    layers = [n for u in initial_units(graph) for n in u]
    assert plan.units == [layers]
    assert sum(plan.predicted) < plan.per_layer and plan.refused == []
    model = compile_model(graph, CONFIG, plan.units, simplified=True)
    assert model.units[0].resources["scratchpad_bytes"] < model.config.sp_bytes // 2


def test_prediction_follows_the_golden_timeline():
    """The cost model's saving from merging, as a share of the per-layer plan, agrees
    in sign and size with the golden model's. Greedy merging ranks candidates by
    predicted saving, so what must hold is the saving's size relative to the cycles
    around it; the profile's initial coefficients overestimate every unit's cycles
    alike (about 1.4x on DS-CNN) until measurements refit them."""
    graph = simplify(_graph("ds_cnn"))[0]
    plan = fuse_units(graph, CONFIG)
    fused = sum(timeline_cycles(compile_model(graph, CONFIG, plan.units,
                                              simplified=True)).values())
    per_layer = sum(timeline_cycles(compile_model(graph, CONFIG, simplified=True,
                                                  fuse=False)).values())
    predicted_share = (plan.per_layer - sum(plan.predicted)) / plan.per_layer
    assert fused < per_layer
    assert (per_layer - fused) / per_layer == pytest.approx(predicted_share, rel=0.2)


def test_per_layer_plan_on_request():
    graph = simplify(_graph("resnet8"))[0]
    model = compile_model(graph, CONFIG, simplified=True, fuse=False)
    assert [u.nodes for u in model.units] == initial_units(graph)
    assert model.fusion == []


def test_units_stay_inside_their_branch_body():
    """moe's experts live in If bodies: a unit holds nodes of one scope only, and the
    gate's ArgMax stays with the GEMM it reads."""
    graph = simplify(_graph("moe"))[0]
    scope = {n.name: id(g) for g, n in graph.walk()}
    plan = fuse_units(graph, CONFIG)
    assert len(plan.units) < len(initial_units(graph))
    for unit in plan.units:
        assert len({scope[n] for n in unit}) == 1, unit


def test_residual_blocks_fuse_only_where_they_fit():
    """ResNet-8's adds read a block's input from DRAM; a merged block would need its
    whole activations on chip, which the working partition does not hold: the
    report names the scratchpad."""
    model = compile_model(_graph("resnet8"), CONFIG)
    refusals = [line for line in model.fusion if line.startswith("not fused")]
    assert refusals and all("scratchpad" in line for line in refusals)
    session = Session(NPUDriver(GoldenDevice(CONFIG)), model, check=True)
    session.load()
    assert session.run(model_inputs("resnet8", model.graph)[0]).checked


def test_a_cached_register_is_not_overwritten_within_one_instruction():
    """In-place lowering keeps register values across units: a DRAM address found
    in the cache must survive the scratchpad address the same ``load`` needs next
    (ResNet-8's merged conv + add read its shortcut from a clobbered address)."""
    from host.compiler.emit import SCRATCH, Emitter

    e = Emitter()
    dram = e.reg(4096, base="r2")
    for value in range(1, len(SCRATCH)):
        e.reg(value)  # the round robin comes back to ``dram``'s register
    assert e.reg(4096, base="r2") == dram
    assert e.reg(9824) != dram


def test_a_fused_plan_that_does_not_link_falls_back_to_per_layer(monkeypatch):
    """Fusing estimates the program's size from units lowered on their own; should
    the linked program still be refused, the per-layer plan compiles instead and
    ``fusion`` says why."""
    from host.compiler import compile as compile_module
    from host.compiler.fuse import FusedPlan

    graph = simplify(_graph("resnet8"))[0]
    whole = [[n for u in initial_units(graph) for n in u]]  # needs too much scratchpad
    monkeypatch.setattr(compile_module, "fuse_units",
                        lambda *a, **kw: FusedPlan(whole, [0.0], 0.0))
    model = compile_model(graph, CONFIG, simplified=True)
    assert [u.nodes for u in model.units] == initial_units(graph)
    [note] = model.fusion
    assert "does not compile" in note and "scratchpad" in note


def test_the_fused_program_does_not_depend_on_the_hash_seed():
    """Dead buffers return to the allocator in a fixed order: with the order of a set
    of names, ResNet-8's program differed between processes (PYTHONHASHSEED 0 and
    1), and with it the compile cache's entries and the measured cycles."""
    script = ("import hashlib; from host.cli import model_path; "
              "from host.onnx_import import load_onnx; "
              "from host.compiler import compile_model; from firmware.config import CONFIGS; "
              "m = compile_model(load_onnx(model_path('resnet8'), allow_cpu_fallback=True), "
              "CONFIGS['default']); print(hashlib.sha256(m.program.to_bytes()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": h}).stdout
               for h in ("0", "1")}
    assert len(digests) == 1, digests
