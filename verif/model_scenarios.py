"""Compiled models on the RTL: the runtime's results against the reference
interpreter, and the RTL's counters and trace against the golden model.

Scenarios for :func:`verif.fastsim.run_scenario` (and
:func:`verif.rtl_device.run_scenario`, the same under cocotb), configured by environment
variables (each scenario's docstring lists its own): ``NPU_MODEL``, a bundled model
name or .onnx path; ``NPU_INPUTS``, how many inputs; ``NPU_ZOO``, test zoo files;
``NPU_MODELS``, bundled model names for ``bench_models_rtl``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from firmware.golden import EXACT_COUNTERS
from host.cli import model_path
from host.compiler import compile_model
from host.datasets import load_digits_split
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.models import MLPERF_DIR
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.scenarios import assert_same_inference, golden_cycles_exact, golden_twin


def _run_both(rtl_session, gold_session, inputs):
    """One inference on each: (RTL's, golden model's, whether the golden model counted
    the cycles of every run of it exactly; see :func:`golden_cycles_exact`)."""
    gold_device = gold_session.driver.device
    mark = gold_device.machine.inexact_runs
    rtl, gold = rtl_session.run(inputs), gold_session.run(inputs)
    return rtl, gold, golden_cycles_exact(gold_device, mark)


def model_vs_golden(device, config, seed):
    """Run a bundled model on RTL and golden side by side: outputs equal the reference
    interpreter on both, and every exact counter and trace field agree per inference,
    cycles too where the golden model counts them exactly."""
    name = os.environ.get("NPU_MODEL", "mlp")
    count = int(os.environ.get("NPU_INPUTS", "4"))
    graph = load_onnx(model_path(name))
    sessions = []
    for dev in (device, golden_twin(device, config)):
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
        rtl, gold, exact = _run_both(*sessions, inputs)
        assert_same_inference(f"{name} #{i}", rtl, gold, cycles=exact)
        print(f"{name} digit #{i}: {int(np.argmax(rtl.outputs['logits']))} "
              f"(label {split.y_test[i]}), {rtl.cycles} cycles on the RTL, {gold.cycles} "
              f"on the golden model ({'checked' if exact else 'not promised'}); results, "
              "counters and trace agree")


def variants_vs_golden(device, config, seed):
    """A bundled model compiled with unit variants (``NPU_VARIANTS``: JSON, a unit's
    first node -> :meth:`~host.compiler.variants.Variant.describe` text) on RTL and
    golden side by side, on its :func:`model_inputs` (the first ``NPU_INPUTS``):
    outputs equal the reference on both, every exact counter and trace field agrees,
    cycles too where the golden model counts them exactly. Prints per inference
    whether the cycles were compared."""
    from host.compiler.variants import Variant, compile_with

    name = os.environ.get("NPU_MODEL", "fc_autoencoder")
    count = int(os.environ.get("NPU_INPUTS", "2"))
    wanted = json.loads(os.environ.get("NPU_VARIANTS", "{}"))
    graph = load_onnx(model_path(name), allow_cpu_fallback=True)
    sessions = []
    for dev in (device, golden_twin(device, config)):
        drv = NPUDriver(dev)
        base = compile_model(graph, drv.config)
        chosen = {tuple(u.nodes): Variant.parse(wanted[u.nodes[0]])
                  for u in base.units if u.nodes[0] in wanted}
        assert len(chosen) == len(wanted), f"no unit starts at {set(wanted)}"
        s = Session(drv, compile_with(base, chosen), check=True)
        s.load()
        sessions.append(s)
    for i, inputs in enumerate(model_inputs(name, graph)[:count]):
        rtl, gold, exact = _run_both(*sessions, inputs)
        assert_same_inference(f"{name} #{i}", rtl, gold, cycles=exact)
        print(f"{name} #{i} with {wanted}: {rtl.cycles} cycles on the RTL, {gold.cycles} on "
              f"the golden model (cycles {'compared' if exact else 'not promised'})")


def adaptive_vs_golden(device, config, seed):
    """The adaptive runtime on the RTL, every inference mirrored on the golden model
    running the same plan: every result equals the reference and the golden model's,
    every exact counter and trace field agrees, and the plan really changed on the
    RTL (hot swaps staged over AXI4-Lite while it runs).

    Environment: ``NPU_MODEL``, ``NPU_INPUTS`` (stream length), ``NPU_PHASES``
    (``"012|789"``: class mixes, one phase each), ``NPU_FAULT=1`` (inject a broken
    merged unit: validation must roll it back on the RTL), ``NPU_EXPECT`` (event
    kinds that must occur, comma-separated), ``NPU_SPECIALIZE=1`` (fusion off, the
    specializer on: unit variants land, validate and revert on the RTL).
    """
    from host.adaptive import AdaptiveConfig, AdaptiveRuntime
    from host.adaptive.faults import corrupt_requant
    from host.adaptive.profiler import ProfilerConfig
    from host.datasets import class_mix_stream

    name = os.environ.get("NPU_MODEL", "mlp")
    count = int(os.environ.get("NPU_INPUTS", "12"))
    phases = [{int(c): 1.0 for c in ph}
              for ph in os.environ.get("NPU_PHASES", "0123456789").split("|")]
    fault = corrupt_requant if os.environ.get("NPU_FAULT") == "1" else None
    expect = [k for k in os.environ.get("NPU_EXPECT", "swapped-in").split(",") if k]
    # Short streams: a faster-fading profile, so phases show within them.
    knobs = AdaptiveConfig(async_compile=False, warmup=4, decide_every=2, validate_runs=2,
                           settle=6, profiler=ProfilerConfig(decay=0.9))
    if os.environ.get("NPU_SPECIALIZE") == "1":
        from host.adaptive.specialize_units import SpecializeConfig

        knobs.fuse_threshold, knobs.specialize = 1e9, SpecializeConfig(measure_runs=2)
    graph = load_onnx(model_path(name))
    rt = AdaptiveRuntime(NPUDriver(device), graph, knobs, fault=fault)
    rt.load()
    mirror = Session(NPUDriver(GoldenDevice(config)), rt.model, check=True)
    mirror.load()
    inp = rt.graph.inputs[0]
    shape = rt.graph.tensors[inp].shape
    for s in class_mix_stream(count, phases, seed):
        inputs = {inp: s.x.reshape(shape).astype(np.float32)}
        rtl = rt.run(inputs)
        if rtl.model is not mirror.model:
            mirror.install(rtl.model)
        mark = mirror.driver.device.machine.inexact_runs
        gold = mirror.run(inputs)
        where = f"{name} inference {rtl.index} (plan {rtl.plan})"
        assert rtl.checked, where
        for out in rtl.outputs:
            assert np.array_equal(rtl.outputs[out], gold.outputs[out]), f"{where}: {out}"
        for e in rtl.events:
            print(e)
        if any(e.kind == "rollback" for e in rtl.events):
            continue  # the RTL also ran the broken plan once: its tags differ
        assert_same_inference(where, rtl, gold,
                              cycles=golden_cycles_exact(mirror.driver.device, mark))
    kinds = {e.kind for e in rt.events}
    print("candidates now:", *(c.describe() for c in rt.candidates()), sep="\n  ")
    print("cost model:", {k: round(v, 2) for k, v in rt.cost.coef.items()})
    for k in expect:
        assert k in kinds, f"no {k!r} event in {sorted(kinds)}"
    if fault is not None:
        assert rt.rollbacks >= 1, "the broken unit was not rolled back"
    print(f"{name} on the RTL: {rt.n} inferences, {rt.swaps} swaps, {rt.rollbacks} "
          f"rollbacks, plan {rt.report()['plan']}; all equal the reference and the golden model")


def sparsity_vs_golden(device, config, seed):
    """Sparsity variants on the RTL: the adaptive runtime with ``--sparsity`` on the
    RTL and a twin on the golden model, fed the same digits in lockstep, take the
    same decisions; every inference (variant runs, guard failures on the generic
    plan, the switches between them with the constants they share) equals the
    reference and the golden model's, exact counters and trace fields, cycles where
    the golden model counts them exactly. Column 0 of every image is zero; from the
    18th input on every third lights one of its pixels (the guard fails).

    Environment: ``NPU_MODEL``, ``NPU_INPUTS`` (stream length).
    """
    from host.adaptive import AdaptiveConfig, AdaptiveRuntime
    from host.adaptive.sparsity import SparsityConfig
    from host.datasets import class_mix_stream

    name = os.environ.get("NPU_MODEL", "mlp")
    count = int(os.environ.get("NPU_INPUTS", "36"))
    graph = load_onnx(model_path(name))
    runtimes = []
    for dev in (device, golden_twin(device, config)):
        rt = AdaptiveRuntime(NPUDriver(dev), graph, AdaptiveConfig(
            async_compile=False, sparsity=SparsityConfig(window=8, warmup=8, min_hit=0.5,
                                                         settle=0)))
        rt.load()
        runtimes.append(rt)
    rtl_rt, gold_rt = runtimes
    twin = gold_rt.driver.device
    inp = graph.inputs[0]
    shape = rtl_rt.graph.tensors[inp].shape
    fast = 0
    for i, s in enumerate(class_mix_stream(count, [{c: 1.0 for c in range(10)}], seed)):
        x = np.maximum(s.x.reshape(1, 64), 0.1).astype(np.float32)
        x[0, ::8] = 0.0
        if i >= 18 and i % 3 == 0:
            x[0, 8 * (i % 8)] = 0.7
        inputs = {inp: x.reshape(shape)}
        mark = twin.machine.inexact_runs
        rtl, gold = rtl_rt.run(inputs), gold_rt.run(inputs)
        where = f"{name} inference {rtl.index} ({rtl.model.graph.name})"
        assert rtl.checked and gold.checked, where
        assert rtl.model.graph.name == gold.model.graph.name, where
        assert_same_inference(where, rtl, gold, cycles=golden_cycles_exact(twin, mark))
        fast += "@sparse" in rtl.model.graph.name
        for e in rtl.events:
            print(e)
    kinds = {e.kind for e in rtl_rt.events}
    for k in ("sparsity-validated", "guard-failed"):
        assert k in kinds, f"no {k!r} event in {sorted(kinds)}"
    assert 0 < fast < count
    print(f"{name} on the RTL: {count} inferences, {fast} on the sparsity variant; all equal "
          "the reference and the golden model")


def zoo_vs_golden(device, config, seed):
    """Run zoo files (``tests/zoo/``, the real tools' models) on the RTL and the golden
    model side by side: outputs equal the reference interpreter on both, every exact
    counter and trace field agree per inference, and the outputs agree with
    onnxruntime's stored ones (:func:`verif.zoo.check.assert_matches_onnxruntime`).

    Environment: ``NPU_ZOO``, zoo file names, comma-separated (one simulator start
    covers them all: each start costs seconds); ``NPU_INPUTS``, how many of each
    model's stored inputs (the first ones: the oracle's rows are fixed).
    """
    files = [f for f in os.environ["NPU_ZOO"].split(",") if f]
    count = int(os.environ.get("NPU_INPUTS", "2"))
    for file in files:
        _zoo_file_vs_golden(file, device, config, count)


def _zoo_file_vs_golden(file, device, config, count):
    """One zoo file through :func:`zoo_vs_golden`'s checks on its first ``count`` inputs."""
    from verif.zoo import ZOO_DIR
    from verif.zoo.check import assert_matches_onnxruntime, load_expected, manifest_entry

    entry = manifest_entry(file)
    npz = load_expected(entry["model"])
    graph = load_onnx(ZOO_DIR / file, allow_cpu_fallback=True)
    rtl_session, gold_session = (_checked_session(graph, dev) for dev in
                                 (device, GoldenDevice(config)))
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    rows = range(min(count, len(npz["input"])))
    outputs = []
    for row in rows:
        inputs = {name: npz["input"][row].reshape(shape)}
        rtl, gold, exact = _run_both(rtl_session, gold_session, inputs)
        assert_same_inference(f"{file} input #{row}", rtl, gold, cycles=exact)
        outputs.append(rtl.outputs)
    stacked = {out: np.stack([o[out] for o in outputs]) for out in outputs[0]}
    assert_matches_onnxruntime(entry, stacked, npz, rows=list(rows))
    print(f"{file}: {len(rows)} inputs, {rtl.cycles} cycles on the RTL for the last "
          f"({gold.cycles} golden); reference, golden model, counters, trace and "
          "onnxruntime agree")


def _checked_session(graph, device) -> Session:
    """A loaded ``Session(check=True)`` of ``graph`` compiled for ``device``: every
    inference is also compared with the reference interpreter."""
    drv = NPUDriver(device)
    session = Session(drv, compile_model(graph, drv.config, paging=True), check=True)
    session.load()
    return session


#: Held-out digits per digit model in :func:`model_inputs` (MLPerf models run their
#: sample inputs).
BENCH_DIGITS = 4


def model_inputs(name: str, graph) -> list[dict]:
    """The inputs ``make bench-models`` runs a bundled model on: an MLPerf model's
    sample inputs (``host/models/mlperf/NAME.expected.npz``), else the first
    :data:`BENCH_DIGITS` held-out digits."""
    inp = graph.inputs[0]
    shape = graph.tensors[inp].shape
    samples = MLPERF_DIR / f"{name}.expected.npz"
    if samples.is_file():
        rows = np.load(samples)["input"]
    else:
        rows = load_digits_split(seed=0).x_test[:BENCH_DIGITS].astype(np.float32)
    return [{inp: x.reshape(shape)} for x in rows]


def bench_models_rtl(device, config, seed):
    """``bench.models --rtl``: each model of ``NPU_MODELS`` (bundled names, imported
    with the CPU fallback) on its :func:`model_inputs`, on the RTL and the golden
    model side by side: outputs equal the reference on both, every exact counter and
    trace field agree. Writes each model's RTL cycles (first run; mean of the later
    ones) and whether they equal the golden model's estimate to ``NPU_BENCH_OUT``;
    ``NPU_INPUTS``, when set, runs only the first that many inputs of each model.
    ``golden_cycles_exact_runs`` counts the inferences whose cycles the golden model
    counted exactly (:func:`golden_cycles_exact`), the ones the check compared."""
    figures = {}
    count = int(os.environ.get("NPU_INPUTS", "0")) or None
    watch = getattr(device, "watch_runs", None)
    for name in [m for m in os.environ["NPU_MODELS"].split(",") if m]:
        graph = load_onnx(model_path(name), allow_cpu_fallback=True)
        rtl_session, gold_session = (_checked_session(graph, dev) for dev in
                                     (device, golden_twin(device, config)))
        rtl_session.count_pages = gold_session.count_pages = True
        if watch is not None:
            watch(True)
        cycles, late, gaps = [], 0, []
        for i, inputs in enumerate(model_inputs(name, graph)[:count]):
            seen = len(device.run_events()) if watch is not None else 0
            rtl, gold, exact = _run_both(rtl_session, gold_session, inputs)
            assert_same_inference(f"{name} input #{i}", rtl, gold, cycles=exact)
            assert_same_pages(f"{name} input #{i}", rtl, gold, cycles=exact)
            cycles.append((rtl.cycles, gold.cycles, exact))
            late += rtl.late_pages
            if watch is not None:
                gaps += page_gaps(device.run_events()[seen:])
        warm = cycles[1:] or cycles
        figures[name] = {"rtl_cycles_first": cycles[0][0],
                         "rtl_cycles": round(float(np.mean([r for r, _, _ in warm]))),
                         "rtl_cycles_equal_golden": all(r == g for r, g, _ in cycles),
                         # inferences whose cycles the golden model vouched for (compared)
                         "golden_cycles_exact_runs": sum(e for _, _, e in cycles),
                         "rtl_pages": len(rtl_session.model.pages),
                         "rtl_late_pages": late}
        if gaps:  # simulated cycles the NPU sat idle between two runs of an inference
            figures[name]["rtl_run_gap_cycles_max"] = max(gaps)
            figures[name]["rtl_run_gap_cycles_mean"] = round(float(np.mean(gaps)), 1)
        print(f"{name}: {figures[name]}; outputs, counters and trace equal the golden model")
    with open(os.environ["NPU_BENCH_OUT"], "w") as f:
        json.dump(figures, f)


def assert_same_pages(where: str, rtl, gold, cycles: bool) -> None:
    """A paged inference ran the same pages on both, each with equal exact counters
    (and cycles, where the golden model counts them exactly)."""
    assert len(rtl.page_counters) == len(gold.page_counters), \
        f"{where}: {len(rtl.page_counters)} page runs on the RTL, {len(gold.page_counters)} golden"
    for p, (a, b) in enumerate(zip(rtl.page_counters, gold.page_counters, strict=True)):
        for c in EXACT_COUNTERS + (("cycles",) if cycles else ()):
            assert a[c] == b[c], f"{where}: page run {p}: counter {c}: RTL {a[c]}, golden {b[c]}"


def page_gaps(events: list[tuple[int, str]]) -> list[int]:
    """Cycles between each run's end and the next run's start (``run_events``)."""
    return [b[0] - a[0] for a, b in zip(events, events[1:], strict=False)
            if a[1] == "done" and b[1] == "start"]


def depthwise_vs_golden(device, config, seed):
    """Depthwise convolution (stride 1 and 2, 12 channels: a partial channel group),
    average and global average pooling, and the zoo's per-tensor depthwise-separable
    block, on the RTL and the golden model side by side: outputs equal the reference
    on both, counters and trace agree, and the RTL's cycles are the golden model's
    within :data:`CYCLE_SLACK`."""
    rng = np.random.default_rng(seed)
    gaps = {}
    for name, graph in _depthwise_graphs(rng).items():
        rtl_session, gold_session = (_checked_session(graph, dev) for dev in
                                     (device, GoldenDevice(config)))
        shape = graph.tensors["x"].shape
        for i in range(int(os.environ.get("NPU_INPUTS", "2"))):
            inputs = {"x": rng.integers(-128, 128, shape, dtype=np.int8)}
            rtl, gold, exact = _run_both(rtl_session, gold_session, inputs)
            assert_same_inference(f"{name} input #{i}", rtl, gold, cycles=exact)
            gaps.setdefault(name, set()).add(rtl.cycles - gold.cycles)
            print(f"{name} input #{i}: {rtl.cycles} cycles on the RTL, {gold.cycles} golden")
    _zoo_file_vs_golden("dwsep.qdq-pt-s8.onnx", device, config, 1)
    # The golden model is an estimate here (docs/isa.md): a vbias of a partial tile
    # (4 of 8 columns) ends 2 cycles sooner on the RTL than the model says, and where
    # the compute queue fills up behind a long vector op its queue timing is off by a
    # cycle or two: a few cycles on these runs of 900 to 2,400.
    wrong = {k: v for k, v in gaps.items() if max(abs(gap) for gap in v) > CYCLE_SLACK}
    assert not wrong, f"RTL cycles minus golden cycles per graph: {wrong}"


CYCLE_SLACK = 4
"""Cycles an inference of :func:`depthwise_vs_golden` may take on the RTL more or
fewer than the golden model says (measured: 2 to 4 fewer)."""


def _depthwise_graphs(rng) -> dict:
    from firmware.quant import quantize_multiplier
    from host.builder import GraphBuilder
    from host.ir import Requant

    graphs = {}
    for stride in (1, 2):
        b = GraphBuilder(f"depthwise_s{stride}")
        x = b.input("x", (1, 12, 9, 7), scale=0.05, zp=3)
        w = rng.integers(-128, 128, (12, 1, 3, 3), dtype=np.int8)
        bias = rng.integers(-3000, 3000, 12).astype(np.int32)
        b.output(b.qconv(x, w, bias, strides=(stride, stride), pads=(1, 1, 1, 1), w_scale=0.01,
                         out_scale=0.4, out_zp=-5, relu=True, group=12), "y")
        graphs[b.graph.name] = b.build()
    # larger than the scratchpad: bands of output rows stream through the working
    # partition (per-channel requantization)
    b = GraphBuilder("depthwise_streamed")
    x = b.input("x", (1, 8, 64, 64), scale=0.05, zp=3)
    w = rng.integers(-128, 128, (8, 1, 3, 3), dtype=np.int8)
    mults, shifts = zip(*(quantize_multiplier(s) for s in rng.uniform(0.001, 0.01, 8)),
                        strict=True)
    b.output(b.qconv(x, w, None, pads=(1, 1, 1, 1), group=8,
                     requant=Requant(mults, shifts, 2, -128, 127)), "y")
    graphs["depthwise_streamed"] = b.build()
    # a depthwise + pointwise pair too large to run whole: fused, in bands, the
    # depthwise rows kept on chip for the pointwise GEMM (host/compiler/bandpair.py)
    b = GraphBuilder("pair_bands")
    x = b.input("x", (1, 8, 48, 48), scale=0.05, zp=3)
    h = b.qconv(x, rng.integers(-128, 128, (8, 1, 3, 3), dtype=np.int8),
                rng.integers(-999, 999, 8).astype(np.int32), pads=(1, 1, 1, 1), w_scale=0.01,
                out_scale=0.4, relu=True, group=8)
    b.output(b.qconv(h, rng.integers(-128, 128, (16, 8, 1, 1), dtype=np.int8),
                     rng.integers(-999, 999, 16).astype(np.int32), w_scale=0.01,
                     out_scale=0.4, out_zp=-3, relu=True), "y")
    graphs["pair_bands"] = b.build()
    b = GraphBuilder("avgpool")
    x = b.input("x", (1, 12, 9, 7), scale=0.05, zp=3)
    b.output(b.avgpool(x, (3, 3), (1, 1), (1, 1, 1, 1), out_scale=0.3, out_zp=1), "y")
    graphs["avgpool"] = b.build()
    b = GraphBuilder("global_pool")
    x = b.input("x", (1, 12, 9, 7), scale=0.05, zp=3)
    b.output(b.avgpool(x, None, out_scale=0.2, out_zp=-3), "y")
    graphs["global_pool"] = b.build()
    return graphs
