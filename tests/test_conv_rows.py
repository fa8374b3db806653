"""Convolutions as long GEMMs (host/compiler/convrows.py and its lowering).

Every layer runs on the golden NPU through the runtime, bit for bit against the
reference interpreter, with balanced token channels and no races between the
queues (``run_checked``); the mapping the cost model picks is checked against the
golden model's cycles of the others.
"""

import dataclasses
import re

import numpy as np
import pytest
from test_compiler_streaming import run_checked

from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.cli import model_path
from host.compiler import CompileError, compile_model, convrows, stream
from host.compiler.compile import prices_to_fit
from host.compiler.lower import Lowering, TooBig
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.ir import QConv
from host.onnx_import import load_onnx
from host.runtime import Session
from verif.conv_shapes import LAYERS, conv_layer

DEFAULT, SMALL = CONFIGS["default"], CONFIGS["small"]


def gemm_rows(model) -> list[int]:
    return [int(m) for m in re.findall(r"gemm\.\w+ p\d, r\d+, r\d+, (\d+)", model.source)]


def test_groups_are_balanced_and_cover_the_rows():
    assert convrows.groups(32, 30) == [(0, 16), (16, 16)]
    assert convrows.groups(7, 3) == [(0, 3), (3, 2), (5, 2)]
    assert convrows.groups(5, 8) == [(0, 5)]


def test_tapered_bands_cover_the_rows_and_start_shorter():
    for oh, rb in ((oh, rb) for oh in range(1, 60) for rb in range(1, oh + 1)):
        assert stream.band_sizes(oh, rb, 1) == [rb] * (oh // rb) + [oh % rb] * (oh % rb > 0)
        try:
            sizes = stream.band_sizes(oh, rb, 2)
        except CompileError:  # a band of 1 row, or no second band taller than the first
            assert rb == 1 or oh - (rb + 1) // 2 <= (rb + 1) // 2
            continue
        assert sum(sizes) == oh and sizes[0] == (rb + 1) // 2 < sizes[1]
        assert max(sizes) <= rb and sizes[-1] > 0


def test_candidates_of_a_stride_2_layer():
    # (C, OH, OW, KH, SH, SW, W, PL, PR): ResNet-8's 16 -> 32 stage boundary.
    geom = (16, 16, 16, 3, 2, 2, 32, 0, 1)
    by = {(m.kind, m.phases): m for m in convrows.candidates(geom, 1024, copied=True)}
    assert by[("rows", 1)].pitch == 16
    assert by[("long", 1)].pitch == 33  # two input rows per output row
    phased = by[("long", 2)]
    assert (phased.wp, phased.pitch) == (34, 17)  # a phase row, widened to an even width
    assert phased.skew == 1  # the pad column before each row is the right pad
    assert phased.kernel_row_at(1, 16, 33, 2) == 17 * 34 * 16  # phase 1's first row
    assert phased.kernel_row_at(2, 16, 33, 2) == 34 * 16  # phase 0's second row
    assert ("long", 2) not in {(m.kind, m.phases) for m in
                               convrows.candidates(geom, 1024, copied=False)}


def test_a_copied_input_shares_its_pad_columns():
    geom = (16, 32, 32, 3, 1, 1, 32, 1, 1)
    copied = {m.kind: m for m in convrows.candidates(geom, 1024, copied=True)}
    as_they_come = {m.kind: m for m in convrows.candidates(geom, 1024, copied=False)}
    assert (copied["long"].pitch, copied["long"].skew) == (33, 0)
    assert (as_they_come["long"].pitch, as_they_come["long"].skew) == (34, 0)
    # Padding (0, 0, 1, 1): the shared column sits before each row's pixels.
    uneven = convrows.candidates((16, 32, 32, 3, 1, 1, 32, 0, 1), 1024, copied=True)
    assert {(m.pitch, m.skew) for m in uneven if m.kind == "long"} == {(33, 1)}


def test_a_group_fits_the_accumulators():
    for m in convrows.candidates((16, 32, 32, 3, 1, 1, 32, 1, 1), 1024, copied=False):
        assert m.gemm_rows(m.per, 32) <= 1024
    assert not convrows.candidates((16, 1, 2000, 3, 1, 1, 2000, 1, 1), 1024, copied=False)


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_equals_the_reference(name, seed):
    rng = np.random.default_rng(seed)
    model = run_checked(conv_layer(seed, *LAYERS[name]), DEFAULT, rng)
    assert model.instructions <= DEFAULT.imem_depth


def test_stride_1_runs_one_gemm_per_tile_over_the_padded_width(seed):
    """16x16 output rows, padded to 17 pixels (the right pad of a row is the left
    pad of the next), in 2 bands of 8: one gemm of 7 * 17 + 16 rows per reduction
    tile, and one vreq of them all per column tile (the output only goes to DRAM:
    its rows are written 17 pixels apart and stored as overlapping rows, the last
    alone)."""
    model = run_checked(conv_layer(seed, *LAYERS["long_pad1"]), DEFAULT,
                        np.random.default_rng(seed))
    assert set(gemm_rows(model)) == {7 * 17 + 16}
    assert re.search(r"vreqb? p1, r\d+, r\d+, 135, 8", model.source)
    assert not re.search(r"vreqb? p1, r\d+, r\d+, 16, 8", model.source)
    assert re.search(r"store p1, r\d+, r\d+, r\d+, 7, 272", model.source)


def test_stride_2_reads_its_rows_by_phase(seed):
    """16x16 in, 8x8 out: padded rows 18 pixels wide (17 widened to even), by
    phase: 9 gemm rows per output row, 7 * 9 + 8 per gemm."""
    model = run_checked(conv_layer(seed, *LAYERS["phased_stride2"]), DEFAULT,
                        np.random.default_rng(seed))
    assert set(gemm_rows(model)) == {7 * 9 + 8}


def test_pointwise_runs_as_one_gemm_over_all_pixels(seed):
    model = run_checked(conv_layer(seed, *LAYERS["pointwise"]), DEFAULT,
                        np.random.default_rng(seed))
    # one GEMM of all 125 pixels, whole or (two accumulator read ports: a tile's
    # requantization runs beside the next tile's GEMMs) in M tiles
    assert sum(set(gemm_rows(model))) == 25 * 5
    assert "vclip" not in model.source  # no padded copy


def test_weights_stream_when_the_image_fits_but_bands_would_be_thin(seed):
    model = run_checked(conv_layer(seed, *LAYERS["weights_stream"]), DEFAULT,
                        np.random.default_rng(seed))
    (unit,) = model.units
    assert "streamed weights" in unit.instructions[1]
    assert set(gemm_rows(model)) == {7 * 9 + 8}  # the whole image per gemm


def test_output_groups_beyond_the_accumulator_loop(seed, monkeypatch):
    """40 output rows 41 gemm rows apart exceed the 1024 accumulator rows: two
    groups of 20, one hardware loop (the layer kept whole)."""

    def refuse(low, u, why):
        raise CompileError("not streamed here")

    monkeypatch.setattr(stream, "stream_unit", refuse)
    model = run_checked(conv_layer(seed, 8, 40, 40, 8, 3, (1, 1), (1, 1, 1, 1)), DEFAULT,
                        np.random.default_rng(seed))
    assert set(gemm_rows(model)) == {19 * 41 + 40}
    assert "loop 2, groups_" in model.source


def _golden_cycles(graph, config, rows: convrows.ConvRows | None, monkeypatch) -> int:
    """Warm cycles of ``graph`` with its convolution mapped as ``rows`` (None: the
    mapping the cost model picks)."""
    def forced(self, n, copied, phased=True, wide=False):
        if rows.phases > 1 and not phased:  # an image band keeps its rows in order
            raise CompileError("not by phase")
        return dataclasses.replace(rows, wide=rows.wide and wide)

    if rows is not None:
        monkeypatch.setattr(Lowering, "conv_rows", forced)
    return _warm_cycles(graph, config, monkeypatch)


def _warm_cycles(graph, config, monkeypatch) -> int:
    """Compile ``graph`` (then undo ``monkeypatch``) and return the golden model's
    cycles of its second run on a zero input, checked against the reference."""
    model = compile_model(graph, config)
    monkeypatch.undo()
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    x = {"x": np.zeros(graph.tensors["x"].shape, dtype=np.int8)}
    s.run(x)
    return s.run(x).cycles


@pytest.mark.parametrize("name, bands, load, rows", [
    ("pointwise_stride2_bands", "4 bands of 6 output rows, the first of 3", (6, 512),
     {3 * 16, 6 * 16, 1 * 16}),
    ("phased_stride2_bands", "3 bands of 8 output rows, the first of 4", (9, 544),
     {3 * 17 + 16, 7 * 17 + 16}),
])
def test_a_strided_band_holds_its_rows_by_phase(name, bands, load, rows, seed):
    """ResNet-8's 16 -> 32 stride-2 layers on 32x32: streamed in bands of output
    rows (3, 6, 6 and 1 for the 1x1 shortcut, 4, 8 and 4 for the 3x3 layer), each band
    holding its even input rows (then, for the 3x3 layer with padding (0, 0, 1,
    1), its odd ones, the bottom pad row filled in the last band), loaded with a
    DRAM stride of two rows: the 1x1 shortcut loads only the rows it reads, and
    an output row of the 3x3 layer is 17 GEMM rows. Faster than the layers whole
    (their loads and stores overlap)."""
    model = run_checked(conv_layer(seed, *LAYERS[name]), DEFAULT,
                        np.random.default_rng(seed))
    (unit,) = model.units
    assert f"streamed image: {bands}" in unit.instructions[1]
    load_rows, load_bytes = load
    strided_load = rf"load p1, r\d+, r\d+, \1, {load_rows}, {load_bytes}"
    assert re.search(rf"li (r\d+), 1024\n(.*\n)*.*{strided_load}", model.source)
    assert set(gemm_rows(model)) == rows


def _band_cycles(graph, more: int | None, monkeypatch, taper: int = 1) -> int:
    """Warm golden cycles of ``graph``'s convolution streamed in bands: the fewest
    that fit plus ``more``, the first ``1 / taper`` as tall (``more`` None: the
    bands the cost model picks)."""
    def refuse(low, u):
        raise TooBig("streamed here")

    monkeypatch.setattr(Lowering, "_unit_whole", refuse)
    monkeypatch.setattr(stream._ConvWeightStream, "emit", lambda self: refuse(None, None))
    if more is not None:
        monkeypatch.setattr(stream, "_fewer_band_cycles",
                            lambda low, u, n: stream._ConvStream(low, u, n, more,
                                                                 taper=taper).emit())
    return _warm_cycles(graph, DEFAULT, monkeypatch)


@pytest.mark.parametrize("name", ["stem_c3", "long_pad1"])
def test_the_cost_model_picks_the_faster_band_count(name, seed, monkeypatch):
    """The fewest bands that fit, or up to ``MORE_CONV_BANDS`` more (shorter first
    load and last store, more fixed work per band), the first as tall as the
    others or shorter: the bands :func:`host.compiler.cost.band_cycles` picks are
    within 1 % of the fastest on the golden model."""
    graph = conv_layer(seed, *LAYERS[name])
    measured = []
    for more in range(stream.MORE_CONV_BANDS + 1):
        for taper in stream.TAPERS:
            try:
                measured.append(_band_cycles(graph, more, monkeypatch, taper))
            except CompileError:  # more bands than rows, or no shorter first: not a way
                monkeypatch.undo()
    picked = _band_cycles(graph, None, monkeypatch)
    assert picked in measured
    assert picked <= 1.01 * min(measured), (picked, measured)


@pytest.mark.parametrize("name", ["long_pad1", "phased_stride2", "pointwise_stride2",
                                  "stem_c3"])
def test_the_cost_model_picks_the_fastest_mapping(name, seed, monkeypatch):
    """Every mapping the layer allows, measured on the golden model (cycle-exact
    with the RTL): the one :func:`convrows.choose` picks is within 3 % of the
    fastest."""
    c, h, w, oc, k, strides, pads, batch = LAYERS[name]
    graph = conv_layer(seed, *LAYERS[name])
    conv = next(n for n in graph.nodes if isinstance(n, QConv))
    oh, ow = graph.tensors[conv.outputs[0]].shape[2:]
    geom = (c, oh, ow, k, strides[0], strides[1], w, pads[1], pads[3])
    measured = {m: _golden_cycles(graph, DEFAULT, m, monkeypatch)
                for m in convrows.candidates(geom, DEFAULT.acc_rows, copied=True, wide=True)}
    assert len(measured) >= 2
    picked = _golden_cycles(graph, DEFAULT, None, monkeypatch)
    assert picked <= 1.03 * min(measured.values()), (picked, measured)


def test_mobilenet_dense_layers_compile_on_the_default_profile(seed):
    """Every dense (group 1) convolution of MobileNetV1-0.25 at 96x96, alone in a
    graph with its real weights and requantization, compiles on ``default``: the
    3 -> 8 stem on the 96x96 image and the pointwise layers. The stem and the
    256 x 256 pointwise layer (64 KiB of weights, streamed as a GEMM's) equal the
    reference."""
    graph = load_onnx(model_path("mobilenet_v1_025"), allow_cpu_fallback=True)
    convs = [n for _, n in graph.walk() if isinstance(n, QConv) and n.group == 1]
    assert len(convs) == 14
    rng = np.random.default_rng(seed)
    for n in convs:
        b = GraphBuilder("layer")
        shape = graph.tensors[n.inputs[0]].shape
        x = b.input("x", shape, scale=0.05, zp=0)
        y = b.qconv(x, n.weight, n.bias, strides=n.strides, pads=n.pads,
                    requant=n.requant)
        b.output(y, "y")
        layer = b.build()
        if n is convs[0] or n.weight.shape[:2] == (256, 256):
            model = run_checked(layer, DEFAULT, rng, runs=1)
        else:
            model = compile_model(layer, DEFAULT)
        if n.weight.shape[:2] == (256, 256):
            assert model.units[0].resources.get("streamed_steps")


@pytest.mark.rtl
def test_conv_layers_on_the_rtl(seed):
    """Every layer of ``LAYERS`` under Verilator: outputs, exact counters, trace and
    (where the golden model says exact) cycles equal the golden model's, cold and
    warm."""
    from verif.fastsim import run_scenario

    run_scenario("verif.conv_shapes:conv_rows_vs_golden", "default", seed=seed)


def test_a_program_over_the_bank_trades_cycles_for_instructions():
    """ResNet-8's fastest lowering outgrows the 1024-deep bank: the compile is
    repeated with instructions priced in cycles, the least that fits, and a
    1000-deep bank takes a higher price."""
    graph = load_onnx(model_path("resnet8"), allow_cpu_fallback=True)
    fastest = compile_model(graph, DEFAULT)
    tight = compile_model(graph, dataclasses.replace(DEFAULT, imem_depth=1000))
    assert tight.instructions <= 1000 < fastest.instructions <= DEFAULT.imem_depth
    sizes = [[(100.0, 10), (90.0, 30)], [(50.0, 5), (40.0, 25)]]  # (cycles, instructions)
    # Priced at 0 the program is 55 + 100 long; 0.5 cycles an instruction (the
    # first unit's 10 cycles for 20 instructions) frees 20, 1e9 frees 40.
    assert prices_to_fit(sizes, 155, 136)[0] == pytest.approx(0.5)
    assert prices_to_fit(sizes, 155, 100) == [1e9]
