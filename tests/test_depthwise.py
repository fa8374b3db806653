"""Depthwise and grouped convolution, average and global average pooling on the NPU.

Graphs from the builder (random seeded weights and inputs) are compiled for both
configurations and run on the golden model through ``Session(check=True)``: every
output equals the reference interpreter bit for bit. The reference itself is checked
against a plain per-channel loop, and models written by onnxruntime's quantizer
(QDQ and QOperator) import onto the NPU and agree with onnxruntime within 1 LSB.
"""

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from firmware.config import CONFIGS
from firmware.quant import quantize_multiplier
from host.builder import GraphBuilder
from host.compiler import compile_model, simplify
from host.compiler.depthwise import engine_rows_cycles, on_engine
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.errors import UnsupportedOpError
from host.ir import CpuOp, QAvgPool, QConv, Requant
from host.onnx_import import load_onnx
from host.reference import conv2d, run_reference, window_sum
from host.runtime import Session


def _run_checked(graph, config, x, runs=2):
    """Run ``graph`` on the golden model (outputs checked against the reference)."""
    model = compile_model(graph, config)
    s = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    s.load()
    for _ in range(runs):  # the second run hits the weight tags
        r = s.run(x)
        assert r.checked
    return model, r


def _depthwise_graph(rng, c, h, w, k, stride, pad, *, group=None, mult=1, relu=True, zp=3):
    b = GraphBuilder("dw")
    x = b.input("x", (1, c, h, w), scale=0.05, zp=zp)
    group = group or c
    weight = rng.integers(-128, 128, (c * mult, c // group, k, k), dtype=np.int8)
    bias = rng.integers(-3000, 3000, c * mult).astype(np.int32)
    y = b.qconv(x, weight, bias, strides=(stride, stride), pads=(pad,) * 4, w_scale=0.01,
                out_scale=0.4, out_zp=-5, relu=relu, group=group)
    b.output(y, "y")
    return b.build()


# (channels, height, width, kernel, stride, pad): channels below, at and above the
# array width and not multiples of it, stride 2, pad 0/1/2, 5x5, 1x1.
SHAPES = [(8, 6, 6, 3, 1, 1), (12, 7, 5, 3, 2, 1), (3, 5, 6, 3, 1, 0), (20, 9, 11, 5, 2, 2),
          (16, 4, 9, 1, 1, 0), (9, 8, 3, 3, 1, 1)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_depthwise_conv_bit_exact(shape, config, seed):
    rng = np.random.default_rng(seed)
    c, h, w = shape[:3]
    graph = _depthwise_graph(rng, *shape)
    x = {"x": rng.integers(-128, 128, (1, c, h, w), dtype=np.int8)}
    model, r = _run_checked(graph, CONFIGS[config], x)
    (conv,) = [n for n in model.graph.nodes if isinstance(n, QConv)]
    assert conv.is_depthwise and conv.device == "npu"
    _, _, oh, ow = graph.tensors["y"].shape
    macs = r.counters["macs"]
    cols = CONFIGS[config].cols
    if on_engine(conv, CONFIGS[config]):  # the depthwise engine counts the layer's MACs
        assert "dwconv" in model.source
        assert macs == oh * ow * shape[3] ** 2 * c
    else:
        # The array counts every product of its diagonal tiles: n_j x n_j per pixel
        # and tap.
        groups = [min(cols, c - j) for j in range(0, c, cols)]
        assert macs == oh * ow * shape[3] ** 2 * sum(n * n for n in groups)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("c, group", [(12, 12), (12, 3)], ids=["depthwise", "grouped"])
def test_per_channel_requantization_bit_exact(c, group, config, seed):
    """One multiplier and shift per output channel (vqtab per channel group)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("pc")
    x = b.input("x", (1, c, 6, 5), scale=0.05, zp=3)
    scales = rng.uniform(0.001, 0.01, c)
    mults, shifts = zip(*(quantize_multiplier(s) for s in scales), strict=True)
    weight = rng.integers(-128, 128, (c, c // group, 3, 3), dtype=np.int8)
    b.output(b.qconv(x, weight, rng.integers(-3000, 3000, c).astype(np.int32),
                     pads=(1, 1, 1, 1), group=group,
                     requant=Requant(mults, shifts, -4, -4, 127)), "y")
    model, _ = _run_checked(b.build(), CONFIGS[config],
                            {"x": rng.integers(-128, 128, (1, c, 6, 5), dtype=np.int8)})
    assert "tab=1" in model.source


@pytest.mark.parametrize("group, mult", [(2, 1), (4, 2), (6, 2)])
def test_grouped_conv_bit_exact(group, mult, seed):
    """Several channels per group (or a channel multiplier): the block-diagonal dense
    convolution."""
    rng = np.random.default_rng(seed)
    graph = _depthwise_graph(rng, 12, 6, 5, 3, 1, 1, group=group, mult=mult)
    x = {"x": rng.integers(-128, 128, (1, 12, 6, 5), dtype=np.int8)}
    _run_checked(graph, CONFIGS["default"], x)


def test_depthwise_output_rows_in_groups_of_the_accumulators(seed):
    """More output pixels than accumulator rows (small: 256): rows run in groups."""
    rng = np.random.default_rng(seed)
    graph = _depthwise_graph(rng, 5, 24, 20, 3, 1, 1)
    x = {"x": rng.integers(-128, 128, (1, 5, 24, 20), dtype=np.int8)}
    model, _ = _run_checked(graph, CONFIGS["small"], x, runs=1)
    assert "output rows 12..23" in model.source


@pytest.mark.parametrize("c, side, stride", [(40, 12, 1), (20, 11, 2)])
def test_depthwise_groups_take_turns_on_the_accumulator(c, side, stride, seed):
    """With two accumulator read ports a channel group's depthwise passes run beside
    the requantization of the group before (the groups alternate between the
    accumulator's halves): bit-exact, faster than with one port, and as
    ``engine_rows_cycles`` predicts within 10 %."""
    rng = np.random.default_rng(seed)
    graph = _depthwise_graph(rng, c, side, side, 3, stride, 1)
    x = {"x": rng.integers(-128, 128, (1, c, side, side), dtype=np.int8)}
    two = CONFIGS["default"]
    one = replace(two, acc_ports=1)
    model, turns = _run_checked(graph, two, x)
    _, apart = _run_checked(graph, one, x)
    (conv,) = [n for n in model.graph.nodes if isinstance(n, QConv)]
    _, _, oh, ow = graph.tensors["y"].shape
    saved = apart.counters["cycles"] - turns.counters["cycles"]
    predicted = engine_rows_cycles(one, conv, oh, ow) - engine_rows_cycles(two, conv, oh, ow)
    assert abs(saved - predicted) <= 0.1 * predicted, (saved, predicted)


def _pool_graph(x_shape, kernel, stride, pad, zp, out_zp):
    b = GraphBuilder("pool")
    x = b.input("x", x_shape, scale=0.05, zp=zp)
    y = b.avgpool(x, kernel, (stride, stride) if stride else None, (pad,) * 4,
                  out_scale=0.03, out_zp=out_zp)
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("x_shape, kernel, stride, pad", [
    ((1, 8, 6, 6), (3, 3), 1, 1), ((1, 12, 7, 5), (2, 2), 2, 0), ((1, 5, 9, 9), (3, 3), 2, 1),
    ((2, 10, 4, 4), (2, 2), 0, 0), ((1, 20, 6, 5), None, 0, 0), ((1, 3, 5, 4), None, 0, 0),
    ((2, 16, 3, 3), None, 0, 0),
    ((1, 16, 5, 3), (4, 3), 0, 0), ((1, 12, 5, 4), (4, 3), 0, 0)], ids=str)  # one window
@pytest.mark.parametrize("zp", [0, -7])
def test_average_pooling_bit_exact(x_shape, kernel, stride, pad, zp, config, seed):
    rng = np.random.default_rng(seed)
    graph = _pool_graph(x_shape, kernel, stride, pad, zp, out_zp=2)
    x = {"x": rng.integers(-128, 128, x_shape, dtype=np.int8)}
    model, _ = _run_checked(graph, CONFIGS[config], x)
    assert any(isinstance(n, QAvgPool) and n.device == "npu" for n in model.graph.nodes)


def test_global_pooling_code_does_not_grow_with_the_image():
    sizes = {}
    for side in (4, 11):  # both outputs within a store's offset immediate
        graph = _pool_graph((1, 16, side, side), None, 0, 0, 3, 0)
        sizes[side] = len(compile_model(graph, CONFIGS["default"]).program)
    assert sizes[4] == sizes[11], sizes


def test_depthwise_code_does_not_grow_with_the_image(seed):
    rng = np.random.default_rng(seed)
    # (both outputs within a store's offset immediate)
    sizes = {h: len(compile_model(_depthwise_graph(rng, 8, h, 6, 3, 1, 1),
                                  CONFIGS["default"]).program) for h in (4, 20, 40)}
    # An image of one dwconv strip is shorter code; taller ones loop the middle strips.
    assert sizes[4] <= sizes[20] == sizes[40], sizes


@pytest.mark.parametrize("c, side, stride", [(8, 64, 1), (16, 64, 2), (32, 40, 1)],
                         ids=["64x64x8", "64x64x16-s2", "40x40x32"])
def test_depthwise_larger_than_the_working_area_streams(c, side, stride, seed):
    """Depthwise layers larger than the scratchpad (as MobileNetV1-0.25's 48x48x8
    and 24x24x32 are larger than its working partition): bands of output rows stream
    through the working partition on the depthwise engine, in a loop (the program
    does not grow with the image)."""
    rng = np.random.default_rng(seed)
    graph = _depthwise_graph(rng, c, side, side, 3, stride, 1)
    x = {"x": rng.integers(-128, 128, (1, c, side, side), dtype=np.int8)}
    model, r = _run_checked(graph, CONFIGS["default"], x, runs=1)
    (unit,) = [u for u in model.units if u.resources.get("streamed_steps")]
    assert unit.resources["streamed_steps"] > 1 and "dwconv" in model.source
    assert r.counters["macs"] == (side // stride) ** 2 * 9 * c
    assert len(model.program) < 300


# ---- the reference interpreter -----------------------------------------------------------


def test_reference_grouped_conv_is_per_group_convolution(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (2, 6, 5, 7), dtype=np.int8)
    w = rng.integers(-128, 128, (9, 2, 3, 3), dtype=np.int8)  # group 3: 2 in, 3 out each
    got = conv2d(x, w, (1, 2), (1, 0, 1, 2), -4, group=3)
    want = np.concatenate([conv2d(x[:, 2 * g:2 * g + 2], w[3 * g:3 * g + 3], (1, 2),
                                  (1, 0, 1, 2), -4) for g in range(3)], axis=1)
    assert np.array_equal(got, want)


def test_reference_window_sum_counts_padding_as_zero(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 2, 4, 5), dtype=np.int8)
    got = window_sum(x, (3, 3), (1, 1), (1, 1, 1, 1), 9)
    xp = np.pad(x.astype(np.int64) - 9, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(xp[:, :, i:i + 4, j:j + 5] for i in range(3) for j in range(3))
    assert np.array_equal(got, want)


# ---- onnxruntime's quantizer as the oracle -----------------------------------------------


def _float_pool_model(c=12, h=9, w=7, count_include_pad=1):
    """Depthwise Conv + Relu, AveragePool 3x3 stride 2 pad 1, GlobalAveragePool."""
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.3, (c, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=c, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1], count_include_pad=count_include_pad,
                              name="avg"),
             helper.make_node("GlobalAveragePool", ["p"], ["y"], name="gap")]
    g = helper.make_graph(nodes, "pool",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 1, 1])],
                          [numpy_helper.from_array(weight, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _quantized(tmp_path, fmt: str, count_include_pad=1):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(1)
    src, out = tmp_path / "float.onnx", tmp_path / f"{fmt}.onnx"
    onnx.save(_float_pool_model(count_include_pad=count_include_pad), src)
    batches = [{"x": rng.normal(0, 1, (1, 12, 9, 7)).astype(np.float32)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    qdq = fmt == "qdq"
    quantize_static(str(src), str(out), Reader(),
                    quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator,
                    activation_type=QuantType.QInt8 if qdq else QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return onnx.load(str(out))


def _ort_literal(model, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _output_scale(model) -> float:
    producer = {o: n for n in model.graph.node for o in n.output}
    dq = producer[model.graph.output[0].name]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(inits[dq.input[1]])


@pytest.mark.parametrize("fmt", ["qdq", "qop"])
def test_quantizer_pooling_models_run_on_the_npu(fmt, tmp_path, seed):
    """Depthwise Conv, AveragePool and GlobalAveragePool as onnxruntime's quantizer
    writes them (QDQ int8; QOperator uint8 with com.microsoft QLinearAveragePool and
    QLinearGlobalAveragePool): NPU nodes, bit-exact with the reference on the golden
    model, within 1 LSB of onnxruntime."""
    model = _quantized(tmp_path, fmt)
    graph = load_onnx(model)  # no CPU fallback: every layer maps onto the NPU
    npu = [n for n in graph.nodes if n.device == "npu"]
    assert [type(n) for n in npu if isinstance(n, (QConv, QAvgPool))] == \
        [QConv, QAvgPool, QAvgPool]
    assert npu[0].is_depthwise
    s = Session(NPUDriver(GoldenDevice(CONFIGS["default"])),
                compile_model(graph, CONFIGS["default"]), check=True)
    s.load()
    rng = np.random.default_rng(seed)
    lsb = _output_scale(model)
    for _ in range(4):
        x = rng.normal(0, 1, (1, 12, 9, 7)).astype(np.float32)
        got = s.run({"x": x}).outputs["y"]
        want = _ort_literal(model, x)
        assert np.abs(got - want).max() <= lsb * 1.001, (got - want) / lsb


def test_count_exclude_pad_with_padding_falls_back(tmp_path):
    model = _quantized(tmp_path, "qdq", count_include_pad=0)
    with pytest.raises(UnsupportedOpError, match="count_include_pad=0"):
        load_onnx(model)
    graph = load_onnx(model, allow_cpu_fallback=True)
    cpu = [n for n in graph.nodes if isinstance(n, CpuOp)]
    assert [n.name for n in cpu] == ["avg"]
    x = np.random.default_rng(0).normal(0, 1, (1, 12, 9, 7)).astype(np.float32)
    got = run_reference(graph, {"x": x})["y"]
    assert np.abs(got - _ort_literal(model, x)).max() <= _output_scale(model) * 1.001


def test_fused_depthwise_separable_block_keeps_intermediates_on_chip(seed):
    """Depthwise, pointwise and global pooling merged into one unit (as the adaptive
    runtime fuses them): bit-exact, and only the input and output cross DRAM."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("block")
    x = b.input("x", (1, 16, 6, 5), scale=0.05, zp=3)
    h = b.qconv(x, rng.integers(-128, 128, (16, 1, 3, 3), dtype=np.int8),
                rng.integers(-999, 999, 16).astype(np.int32), pads=(1, 1, 1, 1), w_scale=0.01,
                out_scale=0.4, relu=True, group=16)
    h = b.qconv(h, rng.integers(-128, 128, (24, 16, 1, 1), dtype=np.int8), None,
                w_scale=0.01, out_scale=0.4, relu=True)
    b.output(b.avgpool(h, None, out_scale=0.2, out_zp=1), "y")
    graph, _ = simplify(b.build())
    unit = [n.name for n in graph.nodes if n.device == "npu"]
    model = compile_model(graph, CONFIGS["default"], [unit], simplified=True)
    s = Session(NPUDriver(GoldenDevice(CONFIGS["default"])), model, check=True)
    s.load()
    r = s.run({"x": rng.integers(-128, 128, (1, 16, 6, 5), dtype=np.int8)})
    assert r.checked and len(model.regions) == 1
    assert r.counters["dram_write_bytes"] == 24  # the pooled output alone


@pytest.mark.parametrize("stride", [(1, 1), (1, 2)])
def test_depthwise_reads_a_convolution_output_at_its_gemm_pitch(stride, seed):
    """A convolution whose only reader on chip is the depthwise engine keeps its
    output at the long mapping's pitch (one requantization per column tile); the
    engine reads those rows as they are, the pixels past each row's end unread."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("pitch")
    x = b.input("x", (1, 4, 13, 12), scale=0.05, zp=-7)
    h = b.qconv(x, rng.integers(-128, 128, (16, 4, 3, 3), dtype=np.int8),
                rng.integers(-999, 999, 16).astype(np.int32), strides=stride,
                pads=(1, 1, 1, 1), w_scale=0.01, out_scale=0.4, out_zp=-9, relu=True)
    h = b.qconv(h, rng.integers(-128, 128, (16, 1, 3, 3), dtype=np.int8),
                rng.integers(-999, 999, 16).astype(np.int32), pads=(1, 1, 1, 1),
                w_scale=0.01, out_scale=0.4, relu=True, group=16)
    b.output(h, "y")
    graph, _ = simplify(b.build())
    unit = [n.name for n in graph.nodes if n.device == "npu"]
    model = compile_model(graph, CONFIGS["default"], [unit], simplified=True)
    _, _, oh, ow = graph.tensors[graph.nodes[-1].inputs[0]].shape
    strides = [int(line.split()[-1]) for line in model.source.splitlines()
               if line.strip().startswith("cfg.in_stride")]
    assert any(s > ow * 16 for s in strides)  # rows at the pitch, wider than the image
    s = Session(NPUDriver(GoldenDevice(CONFIGS["default"])), model, check=True)
    s.load()
    for _ in range(2):
        r = s.run({"x": rng.integers(-128, 128, (1, 4, 13, 12), dtype=np.int8)})
        assert r.checked
