"""The variant library (host/compiler/variants.py): the default leaves programs as the
compiler writes them, each knob changes a unit's code and the program still
computes the reference's results, and a variant the compiler cannot honour is
refused."""

import functools

import pytest

from firmware.config import CONFIGS
from host.adaptive.cache import CompileCache
from host.cli import main, model_path
from host.compiler import CompileError, compile_model
from host.compiler.variants import (
    DEFAULT,
    Variant,
    candidates,
    compile_with,
    enumerate_variants,
    unit_code,
)
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.model_scenarios import model_inputs

CFG = CONFIGS["default"]


@functools.cache
def _fused(name):
    return compile_model(load_onnx(model_path(name), allow_cpu_fallback=True), CFG)


@functools.cache
def _default_cycles(name):
    return _warm_run(_fused(name), name, check=False).cycles


def _unit(model, first_node):
    return next(u for u in model.units if u.nodes[0] == first_node)


def _warm_run(model, name, check=True):
    """The second run of the first input (the first loads the resident weights),
    its outputs checked against the reference."""
    s = Session(NPUDriver(GoldenDevice(CFG)), model, check=check)
    s.load()
    x = model_inputs(name, model.graph)[0]
    s.run(x)
    r = s.run(x)
    assert r.checked or not check
    return r


@pytest.mark.parametrize("name", ["cnn", "resnet8", "fc_autoencoder"])
@pytest.mark.parametrize("store", [False, True])
def test_default_variants_leave_the_program_as_it_was(name, store):
    """Naming every unit with DEFAULT changes no byte of program or constants,
    linked from a unit store too (and their cache keys are the same)."""
    model = _fused(name)
    kw = {"unit_store": CompileCache(None).unit_store(CFG)} if store else {}
    plan = [list(u.nodes) for u in model.units]
    plain = compile_model(model.graph, CFG, plan, simplified=True, **kw)
    named = compile_with(model, {tuple(u.nodes): DEFAULT for u in model.units}, **kw)
    assert named.program.to_bytes() == plain.program.to_bytes()
    assert named.const_image() == plain.const_image()
    if not store:
        assert plain.program.to_bytes() == model.program.to_bytes()


@pytest.mark.parametrize("name, first, variant", [
    ("resnet8", "/stem/stem.1/Conv", Variant(way="bands", extra_bands=3)),
    ("resnet8", "/stem/stem.1/Conv", Variant(way="whole")),
    ("resnet8", "/Add", Variant(m_tiles=8)),
    ("fc_autoencoder", "/body/body.0/Gemm", Variant(step_bytes=2048)),
    ("fc_autoencoder", "/body/body.0/Gemm", Variant(buffers=2)),
    ("fc_autoencoder", "/body/body.18/Gemm", Variant(block_outputs=128)),
    ("resnet8", "/s2/s2.0/s2.0.1/Conv", Variant(stream_weights=True)),
])
def test_each_knob_changes_the_code_and_keeps_the_results(name, first, variant):
    model = _fused(name)
    key = tuple(_unit(model, first).nodes)
    other = compile_with(model, {key: variant})
    assert unit_code(other, key) != unit_code(model, key)
    assert _warm_run(other, name).cycles != _default_cycles(name)  # other code, other time


def test_a_unit_store_keeps_variants_apart():
    """A variant's unit is cached under its own context: linking the default plan
    after a variant from the same store gives the default's program."""
    model = _fused("resnet8")
    store = CompileCache(None).unit_store(CFG)
    key = tuple(_unit(model, "/Add").nodes)
    plan = [list(u.nodes) for u in model.units]
    fresh = compile_model(model.graph, CFG, plan, simplified=True,
                          unit_store=CompileCache(None).unit_store(CFG))
    varied = compile_with(model, {key: Variant(m_tiles=8)}, unit_store=store)
    again = compile_model(model.graph, CFG, plan, simplified=True, unit_store=store)
    assert varied.program.to_bytes() != fresh.program.to_bytes()
    assert again.program.to_bytes() == fresh.program.to_bytes()


@pytest.mark.parametrize("first, variant, why", [
    ("/stem/stem.1/Conv", Variant(m_tiles=2), "does not work on independent rows"),
    ("/s3/s3.1/s3.1.1/Conv", Variant(way="whole"), "scratchpad"),
    ("/Add", Variant(m_tiles=10 ** 6), "rows"),
])
def test_a_variant_the_compiler_cannot_honour_is_refused(first, variant, why):
    model = _fused("resnet8")
    with pytest.raises(CompileError, match=why):
        compile_with(model, {tuple(_unit(model, first).nodes): variant})


def test_variants_need_the_plan():
    model = _fused("cnn")
    with pytest.raises(ValueError, match="units"):
        compile_model(model.graph, CFG, simplified=True,
                      variants={tuple(model.units[0].nodes): Variant(m_tiles=2)})


def test_the_library_is_ranked_and_holds_the_compilers_choice():
    """The library holds one variant per distinct program the candidates compile to
    (counted here from the candidates themselves), and its ranking agrees with the
    golden model's measurement at both ends."""
    model = _fused("resnet8")
    add = _unit(model, "/Add")
    key = tuple(add.nodes)
    options = enumerate_variants(model, add)
    assert DEFAULT in [o.variant for o in options]
    programs = set()
    for v in candidates(model.graph, add.nodes):
        try:
            programs.add(unit_code(compile_with(model, {key: v}), key))
        except CompileError:
            pass
    programs.add(unit_code(model, key))
    assert len(options) == len(programs) > 3
    fastest, slowest = (_warm_run(o.model, "resnet8", check=False).trace
                        for o in (options[0], options[-1]))
    cycles = [next(r.cycles for r in trace if r.region == add.id)
              for trace in (fastest, slowest)]
    assert cycles[0] < cycles[1]


@pytest.mark.parametrize("v", [DEFAULT, Variant(way="bands", extra_bands=2),
                               Variant(m_tiles=3, stream_weights=True),
                               Variant(step_bytes=512),
                               Variant(step_bytes=2048, block_outputs=128, buffers=4)])
def test_a_variant_reads_back_from_its_description(v):
    assert Variant.parse(v.describe()) == v


@pytest.mark.parametrize("knobs", [{"way": "diagonal"}, {"m_tiles": 0},
                                   {"extra_bands": -1}, {"step_bytes": 0},
                                   {"buffers": 1}, {"block_outputs": 0}])
def test_bad_knobs_are_refused(knobs):
    with pytest.raises(ValueError):
        Variant(**knobs)


def test_npu_compile_lists_the_variants(capsys):
    assert main(["compile", "cnn", "--variants"]) == 0
    out = capsys.readouterr().out
    assert "* default" in out and "predicted cycles" in out


@pytest.mark.rtl
@pytest.mark.parametrize("variants", [
    {"/body/body.0/Gemm": "buffers 4"},
    {"/body/body.18/Gemm": "step bytes 2048, block outputs 128"},
], ids=["buffers", "block_outputs"])
def test_gemv_knobs_on_the_rtl_behind_a_slow_dram(variants):
    """Each GEMV knob's instruction stream on the fast library behind the slowmem
    DRAM: outputs equal the reference, counters and trace the golden model's,
    cycles too where it counts them exactly (the scenario fails on any difference)."""
    import json

    from host.profiles import dram_latency
    from verif.fastsim import run_scenario

    run_scenario("verif.model_scenarios:variants_vs_golden", "default",
                 dram_latency=dram_latency("slowmem"),
                 extra_env={"NPU_MODEL": "fc_autoencoder", "NPU_INPUTS": "2",
                            "NPU_VARIANTS": json.dumps(variants)})
