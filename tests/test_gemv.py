"""GEMV mapping (host/compiler/gemv.py): one-row GEMMs with the input stationary in the
array, the transposed weights streaming as gemm rows, and ``vreqb`` adding each
output row's bias.

Every program runs on the golden NPU through the runtime, bit for bit against the
reference interpreter, race-free, with every token channel empty at the end.
"""

import numpy as np
import pytest
from test_compiler_streaming import run_checked, steps

from firmware.config import CONFIGS
from host.builder import GraphBuilder
from host.compiler import compile_model
from host.compiler.gemv import GemvBlob, gemv_cycles, takes_gemv, tiled_cycles
from verif.mlperf_shapes import fc_autoencoder, streamed_gemm

SMALL, DEFAULT = CONFIGS["small"], CONFIGS["default"]


def dense(seed, k, n, *, rows=1, bias=True, per_channel=False):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("dense")
    # Without a bias and with input zero point 0 the node has no bias at all.
    zp = int(rng.integers(-20, 20)) if bias else 0
    x = b.input("x", (rows, k), scale=0.05, zp=zp)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    w_scale = (rng.uniform(0.5, 1.5, n) if per_channel else 1.0) / (40.0 * np.sqrt(k))
    y = b.qgemm(x, w, rng.integers(-5000, 5000, n) if bias else None, w_scale=w_scale,
                out_scale=0.05, out_zp=-3, relu=bool(rng.integers(2)))
    b.output(y, "y")
    return b.build()


def gemv_nodes(model) -> list[str]:
    return [name for name, blob in model.place.blobs.items() if isinstance(blob, GemvBlob)]


@pytest.mark.parametrize("config", ["default", "small"])
@pytest.mark.parametrize("k, n", [
    (640, 128),  # the autoencoder's first layer: streamed in many steps
    (128, 640),  # its last: one chunk is a step
    (37, 200),  # a partial last chunk
    (8, 128),  # one chunk
    (24, 40),  # three chunks, resident
    (300, 33),
    (64, 700),  # three output blocks; on small more than the accumulator rows
])
def test_gemv_equals_the_reference(config, k, n, seed):
    rng = np.random.default_rng(seed)
    model = run_checked(dense(seed, k, n), CONFIGS[config], rng)
    assert gemv_nodes(model), "the one-row GEMM did not take the GEMV mapping"
    assert "vreqb" in model.source


def test_a_gemv_deeper_than_a_column_tile_fits_streams(seed):
    """K = 4000: one column tile of the GEMM mapping (16 KB) does not fit the small
    NPU; the GEMV streams chunks of 4 inputs."""
    rng = np.random.default_rng(seed)
    model = run_checked(dense(seed, 4000, 8), SMALL, rng, runs=1)
    assert gemv_nodes(model) and steps(model)[0]


def test_gemv_without_bias_requantizes_with_vreq(seed):
    rng = np.random.default_rng(seed)
    graph = dense(seed, 96, 64, bias=False)
    for node in graph.nodes:
        node.bias = None  # as a QLinearMatMul imports: the builder always folds one
    model = run_checked(graph, DEFAULT, rng)
    assert gemv_nodes(model) and "vreqb" not in model.source


@pytest.mark.parametrize("k", [64, 96, 128, 160, 256])
def test_streamed_gemv_step_counts(k, seed):
    """One to several steps per buffer: the three-buffer pipeline's prologue, loop and
    tail balance their tokens at every step count."""
    rng = np.random.default_rng(seed)
    model = run_checked(streamed_gemm(seed, k=k, n=512), SMALL, rng, runs=1)
    assert gemv_nodes(model) and steps(model)[0]


def test_streamed_gemv_program_does_not_grow_with_its_depth(seed):
    sizes = {}
    for k in (512, 1024, 2048, 4096):
        model = compile_model(streamed_gemm(seed, k=k), SMALL)
        assert gemv_nodes(model)
        sizes[k] = model.instructions
    # Only a run's remainder modulo the three buffers (at most two steps of about
    # eight instructions) sits outside the loop.
    assert max(sizes.values()) - min(sizes.values()) <= 16, sizes


def test_per_channel_and_batched_gemms_keep_the_gemm_mapping(seed):
    rng = np.random.default_rng(seed)
    assert not gemv_nodes(run_checked(dense(seed, 96, 64, per_channel=True), DEFAULT, rng))
    assert not gemv_nodes(run_checked(dense(seed, 96, 64, rows=4), DEFAULT, rng))


def test_the_estimate_keeps_narrow_layers_tiled():
    # 128 -> 8: a chunk's 8 rows are shorter than the wload it waits for.
    assert tiled_cycles(128, 8, 1, DEFAULT) < gemv_cycles(128, 8, DEFAULT)
    assert gemv_cycles(128, 128, DEFAULT) < tiled_cycles(128, 128, 1, DEFAULT)
    graph = fc_autoencoder(0)
    narrow = [n for n in graph.nodes if n.weight.shape[1] == 8]
    assert narrow and not takes_gemv(narrow[0], 1, DEFAULT)
