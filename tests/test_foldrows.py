"""Rows folded into channels (host/compiler/foldrows.py): the folded graph computes
the same values, the NPU runs it equal to the reference, and the fold is taken only
where it saves reduction tiles on an input the host writes."""

import numpy as np
import pytest
from test_compiler_streaming import run_checked

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.compiler.foldrows import fold_rows
from host.compiler.plan import simplify
from host.ir import Clip, FoldRows, Tensor
from host.reference import run_reference
from verif.conv_shapes import conv_layer

DEFAULT = CONFIGS["default"]

# (C, H, W, OC, (KH, KW), strides, pads): DS-CNN's first convolution, a row stride
# of 3, and an odd top pad (a fill row above the image) on two channels; kernel
# rows folded all at once (rows read twice): MobileNet's stem, and a top pad.
SHAPES = {
    "ds_cnn_stem": (1, 49, 10, 16, (10, 4), (2, 2), (4, 1, 5, 1)),
    "stride_3": (1, 20, 9, 8, (7, 3), (3, 1), (2, 1, 3, 1)),
    "odd_top_pad": (2, 15, 12, 12, (5, 2), (2, 2), (1, 0, 2, 1)),
    "mobilenet_stem": (3, 20, 18, 8, (3, 3), (2, 2), (0, 0, 1, 1)),
    "kernel_rows_top_pad": (3, 13, 11, 12, (3, 3), (2, 2), (1, 1, 1, 1)),
}
# The fold each shape takes, (factor, step): by the row stride (step 0: no row read
# twice), or every kernel row at once, the stride apart. A row stride of 3 under a
# 7-row kernel takes all seven rows (3 reduction tiles, not 7; the host writes each
# row 7/3 times).
FOLDS = {"ds_cnn_stem": (2, 0), "stride_3": (7, 3), "odd_top_pad": (2, 0),
         "mobilenet_stem": (3, 2), "kernel_rows_top_pad": (3, 2)}


def conv_graph(seed: int, *shape, on_chip: bool = False):
    """One convolution of an int8 graph input (``conv_layer``), with ``on_chip``
    after an NPU clip that hands it its input."""
    graph = conv_layer(seed, *shape)
    if on_chip:
        (conv,) = graph.nodes
        x = graph.tensors[conv.inputs[0]]
        graph.add_tensor(Tensor("x_clipped", x.shape, "int8", quant=x.quant))
        graph.nodes.insert(0, Clip("clip", [x.name], ["x_clipped"], lo=-100, hi=100))
        conv.inputs = ["x_clipped"]
        graph.validate()
    return graph


def folds(graph) -> list[FoldRows]:
    return [n for n in graph.nodes if isinstance(n, FoldRows)]


@pytest.mark.parametrize("name", SHAPES)
def test_folded_rows_compute_the_same_values(name, seed):
    graph, _ = simplify(conv_graph(seed, *SHAPES[name]))
    log: list[str] = []
    folded = fold_rows(graph, DEFAULT, log)
    assert len(folds(folded)) == 1 and "reduction tiles" in log[0]
    assert not folds(graph)  # the caller's graph is left as it was
    rng = np.random.default_rng(seed)
    for _ in range(3):
        x = {"x": rng.integers(-128, 128, graph.tensors["x"].shape, dtype=np.int8)}
        assert np.array_equal(run_reference(graph, x)["y"], run_reference(folded, x)["y"])


@pytest.mark.parametrize("name", SHAPES)
def test_folded_convolution_runs_equal_to_the_reference(name, seed):
    graph = conv_graph(seed, *SHAPES[name])
    model = run_checked(graph, DEFAULT, np.random.default_rng(seed))
    (fold,) = folds(model.graph)
    assert fold.row_step == SHAPES[name][5][0]
    assert (fold.factor, fold.step) == FOLDS[name]


def test_the_ds_cnn_stem_runs_five_full_tiles(seed):
    # Unfolded: 10 tiles of 4-byte kernel rows per column tile; folded: 5 of 8.
    model = compile_model(conv_graph(seed, *SHAPES["ds_cnn_stem"]), DEFAULT, fuse=False)
    wloads = [line.split(",")[2:4] for line in model.source.splitlines()
              if line.strip().startswith("wload")]
    assert [[int(v) for v in w] for w in wloads] == [[8, 8]] * 5


def test_the_mobilenet_stem_runs_its_kernel_rows_in_four_tiles(seed):
    # Unfolded: 3 kernel rows of 9 bytes, 6 tiles (8 + 1 each); every kernel row
    # folded: one window of 27 bytes, 4 tiles.
    model = compile_model(conv_graph(seed, *SHAPES["mobilenet_stem"]), DEFAULT, fuse=False)
    wloads = [line.split(",")[2:4] for line in model.source.splitlines()
              if line.strip().startswith("wload")]
    assert {int(w[0]) for w in wloads} == {8, 3}  # no 1-row tile (a loop runs the 8s)
    (fold,) = folds(model.graph)
    assert (fold.factor, fold.row_step) == (3, 2)
    (conv,) = [n for n in model.graph.nodes if n.device == "npu"]
    assert conv.weight.shape == (8, 9, 1, 3) and conv.strides == (1, 2)


def test_no_fold_without_a_saved_tile_or_a_host_input(seed):
    # 3x3, 8 channels, stride 2: 9 tiles unfolded, 12 by the stride, 9 by the kernel.
    mobilenet = conv_graph(seed, 8, 16, 16, 8, 3, (2, 2), (0, 0, 1, 1))
    # An input the NPU produces stays as it is (the fold runs on the CPU).
    on_chip = conv_graph(seed, *SHAPES["ds_cnn_stem"], on_chip=True)
    for graph in (mobilenet, on_chip):
        g, _ = simplify(graph)
        assert fold_rows(g, DEFAULT, []) is g
