"""The compiler refuses hopeless work before lowering (host/compiler/estimate.py).

The estimate's bounds must never exceed what the compiler emits (else it would
refuse a model that compiles): checked on the bundled models and on tiled GEMMs
and convolutions on both profiles. A model with a huge declared shape is refused
by the estimate with its one-line reason; the time it takes is printed (the
``-s`` output), not asserted.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from firmware.config import CONFIGS
from host import cli
from host.builder import GraphBuilder
from host.cli import ExitCode
from host.compiler import CompileError, compile_model, simplify
from host.compiler.estimate import ADDRESS_SPACE, estimate
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session

MODELS = ["mlp", "cnn", "moe", "early_exit"]


def rand_int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def gemm_graph(rng, m, k, n):
    b = GraphBuilder("g")
    x = b.input("x", (m, k), scale=0.05)
    h = b.qgemm(x, rand_int8(rng, (k, n)), rng.integers(-3000, 3000, n), w_scale=0.01,
                out_scale=0.2, relu=True)
    b.output(b.clip(h, -100, 100), "y")
    return b.build()


def conv_graph(rng, n, c, h, w, oc):
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, h, w), scale=0.05)
    y = b.qconv(x, rand_int8(rng, (oc, c, 3, 3)), None, pads=(1, 1, 1, 1), w_scale=0.01,
                out_scale=0.3, relu=True)
    b.output(b.maxpool(y, kernel=(2, 2)), "z")
    return b.build()


def bound_holds(graph, config):
    model = compile_model(graph, config)
    est = estimate(model.graph, config)
    assert 0 < est.instructions <= len(model.program), (est, len(model.program))
    # every tensor lives in DRAM (the arena) or on chip (the scratchpad)
    assert est.dram_bytes <= model.place.const_bytes + max(model.place.arena_bytes,
                                                           config.sp_bytes)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", MODELS)
def test_bounds_of_the_bundled_models(name, config):
    bound_holds(load_onnx(f"host/models/{name}.onnx"), CONFIGS[config])


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("path", sorted(Path("host/models/mlperf").glob("*.onnx")),
                         ids=lambda p: p.stem)
def test_bounds_of_the_mlperf_models(path, config):
    graph = load_onnx(path, allow_cpu_fallback=True)
    try:
        compile_model(graph, CONFIGS[config])
    except CompileError as err:  # the compiler's own refusal, not the estimate's
        assert "needs at least" not in str(err)
        return
    bound_holds(graph, CONFIGS[config])


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("m", [1, 255, 257, 1025, 3000])
def test_bounds_of_tiled_gemms(m, config, seed):
    bound_holds(gemm_graph(np.random.default_rng(seed), m, 18, 10), CONFIGS[config])


@pytest.mark.parametrize("geom", [(1, 3, 20, 19, 4), (2, 2, 9, 70, 3)])
def test_bounds_of_grouped_convolutions(geom, seed):
    bound_holds(conv_graph(np.random.default_rng(seed), *geom), CONFIGS["small"])


def huge_mlp(tmp_path, rows: int) -> str:
    """The bundled MLP with a declared batch of ``rows`` (the issue's hang)."""
    m = onnx.load("host/models/mlp.onnx")
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = rows
    path = tmp_path / f"mlp_{rows}.onnx"
    onnx.save(m, path)
    return str(path)


@pytest.mark.parametrize("rows", [10**6, 10**12])
def test_a_huge_declared_shape_is_refused_before_lowering(tmp_path, rows):
    graph = load_onnx(huge_mlp(tmp_path, rows))
    t0 = time.perf_counter()
    with pytest.raises(CompileError, match=r"needs at least \d+ instructions .* node 'fc"):
        compile_model(graph, CONFIGS["default"])
    print(f"\nrefused {rows} rows in {1000 * (time.perf_counter() - t0):.2f} ms")


def test_npu_compile_refuses_it_in_one_line(tmp_path, capsys):
    code = cli.main(["compile", huge_mlp(tmp_path, 10**9)])
    err = capsys.readouterr().err
    assert code == ExitCode.UNSUPPORTED
    line, = err.strip().splitlines()
    assert line.startswith("npu: the compiler cannot map the model onto this NPU: the "
                           "program needs at least"), line


def test_a_tensor_beyond_the_address_space_is_refused():
    """An element-wise unit needs one instruction, but not 8 GiB of NPU memory."""
    b = GraphBuilder("wide")
    x = b.input("x", (1 << 17, 1 << 16), scale=0.1)
    b.output(b.clip(x, -5, 5), "y")
    graph, _ = simplify(b.build())
    assert estimate(graph, CONFIGS["default"]).dram_bytes >= ADDRESS_SPACE
    with pytest.raises(CompileError, match="bytes of NPU memory"):
        compile_model(graph, CONFIGS["default"], simplified=True)


def gemm_chain(rng, depth: int):
    b = GraphBuilder("chain")
    x = b.input("x", (1, 8), scale=0.05)
    for _ in range(depth):
        x = b.qgemm(x, rand_int8(rng, (8, 8)), rng.integers(-3000, 3000, 8), w_scale=0.01,
                    out_scale=0.2, relu=True)
    b.output(x, "y")
    return b.build()


def test_paging_bounds_each_node_by_a_page_not_the_program_by_a_bank():
    """A chain of small GEMMs bounded beyond one bank but pageable is refused
    without paging, and with paging compiles into pages that run as the reference."""
    config = dataclasses.replace(CONFIGS["default"], imem_depth=64)
    graph = gemm_chain(np.random.default_rng(0), 25)
    assert estimate(simplify(graph)[0], config).instructions > config.imem_depth
    with pytest.raises(CompileError, match="needs at least"):
        compile_model(graph, config)
    model = compile_model(graph, config, paging=True)
    assert len(model.pages) > 1
    session = Session(NPUDriver(GoldenDevice(config)), model, check=True)
    session.load()
    got = session.run({"x": rand_int8(np.random.default_rng(1), (1, 8))})
    assert got.checked


def test_paging_refuses_a_node_beyond_a_page_before_lowering(tmp_path):
    graph = load_onnx(huge_mlp(tmp_path, 10**6))
    with pytest.raises(CompileError, match=r"node 'fc\d' alone needs at least \d+ "
                       r"instructions .*a page of the instruction bank holds 2047"):
        compile_model(graph, CONFIGS["default"], paging=True)
