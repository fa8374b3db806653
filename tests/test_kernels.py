"""Kernel templates (firmware.kernels) on the golden model: results equal numpy.

The streaming GEMM runs with random data on several configurations and shapes,
including forced tilings that split M into m-blocks, N into several groups and K
into several chunks, so every prefetch path and token is exercised. The golden model
runs the queues in program order, so each program also goes through the race finder
(``verif.randprog.find_races``): an access pair of two queues that no token orders is
a race the RTL may lose. The RTL runs of the template are below (marked ``rtl``) and in
tests/test_npu.py::test_gemm_kernel.
"""

import dataclasses

import numpy as np
import pytest

from firmware.config import CONFIGS, NPUConfig
from firmware.golden import Machine
from firmware.isa import ErrorCode
from firmware.kernels.gemm_stream import (
    Requant,
    Tiling,
    choose_tiling,
    gemm_stream,
    reference,
)
from firmware.quant import quantize_multiplier
from verif import fastsim
from verif.randprog import find_races

WIDE = dataclasses.replace(CONFIGS["default"], rows=8, cols=4, bus_bytes=16, sp_bytes=32768,
                           acc_rows=128)
CASES = [
    ("default", 16, 16, 16, None),
    ("default", 24, 32, 48, None),
    ("default", 24, 32, 48, Tiling(8, 2, 2)),  # 3 m-blocks x 3 groups x 2 chunks
    ("default", 40, 64, 16, Tiling(20, 1, 1)),  # 8 chunks of one k-tile
    ("default", 300, 272, 8, None),  # > 256 rows per DMA: split loads and stores
    ("small", 13, 24, 16, None),
    ("small", 300, 16, 12, None),  # M beyond the accumulator: m-blocks
    ("small", 64, 32, 32, Tiling(16, 2, 2)),
    ("wide", 40, 48, 24, None),
]


def run_golden(config: NPUConfig, M, K, N, tiling, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    mult, shift = quantize_multiplier(float(rng.uniform(0.2, 2.0)) / (K * 64))
    lo = int(rng.integers(-128, 0))
    rq = Requant(mult, shift, int(rng.integers(-20, 20)), lo, int(rng.integers(lo, 128)))
    a_addr, b_addr = 0x100, 0x100 + M * K + 0x40
    c_addr = b_addr + K * N + 0x80
    kern = gemm_stream(M, K, N, config, rq, a_addr, b_addr, c_addr, tiling)
    m = Machine(config, dram_bytes=1 << 20)
    m.dram[a_addr:a_addr + M * K] = a.view(np.uint8).ravel()
    m.dram[b_addr:b_addr + K * N] = b.view(np.uint8).ravel()
    m.dram[c_addr - 16:c_addr + M * N + 16] = 0xA5  # guard bytes around C
    result = m.load_and_run(kern.program, kern.partitions)
    return kern, m, result, a, b, rq, c_addr


@pytest.mark.parametrize("name, M, K, N, tiling", CASES)
def test_gemm_stream_equals_numpy(seed, name, M, K, N, tiling):
    config = WIDE if name == "wide" else CONFIGS[name]
    kern, m, result, a, b, rq, c_addr = run_golden(config, M, K, N, tiling, seed)
    assert result.error == ErrorCode.NONE, f"seed {seed}: {result}"
    c = m.dram[c_addr:c_addr + M * N].view(np.int8).reshape(M, N)
    want = reference(a, b, rq)
    bad = np.argwhere(c != want)
    assert bad.size == 0, f"seed {seed}: {len(bad)} wrong, first {tuple(bad[0])}"
    assert (m.dram[c_addr - 16:c_addr] == 0xA5).all(), "wrote below C"
    assert (m.dram[c_addr + M * N:c_addr + M * N + 16] == 0xA5).all(), "wrote past C"
    # the traffic and work the kernel promises
    assert m.counters["macs"] == kern.macs == M * K * N
    assert m.counters["dram_read_bytes"] == kern.dram_read_bytes
    assert m.counters["dram_write_bytes"] == kern.dram_write_bytes == M * N
    assert len(kern.program) < config.imem_depth
    assert find_races(config, kern.program, kern.partitions) == []


# Default tilings of one group and three or more A chunks: a second initial credit
# for a B buffer no group loads let the third A chunk's load overwrite the first
# chunk while its gemms read it (a wrong C on the RTL).
ONE_GROUP = [(64, 96, 64), (64, 128, 64), (32, 96, 32)]
RACE_SHAPES = [*ONE_GROUP, (16, 16, 16), (24, 32, 48), (32, 64, 32), (64, 64, 128),
               (128, 256, 64), (8, 512, 8)]


@pytest.mark.parametrize("name", ["default", "small"])
@pytest.mark.parametrize("M, K, N", RACE_SHAPES)
def test_gemm_stream_is_race_free(name, M, K, N):
    config = CONFIGS[name]
    rq = Requant(1 << 30, 38)
    try:
        kern = gemm_stream(M, K, N, config, rq, 0, 0x40000, 0x80000)
    except ValueError as e:
        pytest.skip(f"{M}x{K}x{N} does not fit {name}: {e}")
    assert find_races(config, kern.program, kern.partitions) == [], kern.tiling


@pytest.mark.rtl
@pytest.mark.parametrize("M, K, N", ONE_GROUP)
def test_gemm_stream_one_group_on_the_rtl(seed, M, K, N, tmp_path):
    """C equals numpy and the golden model on the Verilator NPU (the scenario checks)."""
    fastsim.run_scenario("verif.scenarios:gemm_bench", "default", seed=seed,
                         extra_env={"NPU_GEMM_MNK": f"{M},{K},{N}",
                                    "NPU_BENCH_OUT": str(tmp_path / "gemm.json")})


def test_reference_is_int32_matmul_requantized():
    a = np.array([[127, -128]], np.int8)
    b = np.array([[127], [-128]], np.int8)
    rq = Requant(1 << 30, 30 + 8)  # y = acc / 256, rounded half to even
    assert reference(a, b, rq).tolist() == [[(127 * 127 + 128 * 128 + 128) // 256]]


def test_default_tiling_streams_whole_m():
    """256^3 on the default NPU: each weight tile streams all 256 rows once."""
    t = choose_tiling(256, 256, 256, CONFIGS["default"])
    assert t.mb == 256 and t.ng * t.mb <= CONFIGS["default"].acc_rows


def test_golden_estimate_of_the_bench_gemm():
    """The golden cost model agrees the 256^3 GEMM is near the roofline bound."""
    kern, m, result, *_ = run_golden(CONFIGS["default"], 256, 256, 256, None, 1)
    assert result.ok
    assert kern.macs / (result.cycles * 64) > 0.9, result.cycles


@pytest.mark.parametrize("args, match", [
    ((16, 12, 16), "multiple of the array rows"),
    ((16, 16, 12), "multiple of the array cols"),
    ((0, 16, 16), "positive"),
    ((16, 16, 16, Tiling(16, 2, 3)), "does not fit"),
])
def test_gemm_stream_rejects(args, match):
    M, K, N, *t = args
    with pytest.raises(ValueError, match=match):
        gemm_stream(M, K, N, CONFIGS["default"], Requant(1, 0), 0, 0x1000, 0x2000,
                    t[0] if t else None)
