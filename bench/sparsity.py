"""``make bench-sparsity``: input-driven variants on the bundled digits models and the zoo.

* **Digits models** (``mlp``, ``moe``, ``early_exit``, ``cnn``): the adaptive runtime
  on the golden model at batch 1 over ``--digits`` held-out digits of every
  class (seed 0, inline compiles), without and with sparsity variants
  (``npu run MODEL --adaptive [--sparsity] --digits N``). Figures: mean cycles per
  inference over the second half, the share of all inputs and of the second
  half's that took the fast path, guard failures, and the trials (the variant's
  warm cycles against the generic plan's).
* **MLPerf Tiny zoo**: which model inputs only GEMMs read (what a sparsity
  variant can skip), their elements' zero rates on the sample inputs, and per
  layer the share of all-zero K-tiles in its input (reference interpreter,
  tiles of the array's rows), the largest per model; all-zero 8x8 weight tiles
  of every GEMM (bundled models too).
* **Value ranges**: clamps narrower than int8 per model (a ReLU whose zero point
  is -128 is the requantizer's int8 saturation: nothing to drop), and what
  dropping a clamp fused into ``vreq`` saves: the ``mlp`` with a narrower clamp on
  ``fc2``, compiled with and without it, cycles on the golden model.

Writes ``bench/results/sparsity.json``. ``python -m bench.sparsity [--digits N]
[--models ...]``.
"""

from __future__ import annotations

import argparse
import resource

import numpy as np

from bench.common import report
from firmware.config import CONFIGS
from host.adaptive.engine import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.input_stats import clamped_nodes, gemm_inputs, layer_tile_zeros
from host.adaptive.sparsity import SparsityConfig
from host.cli import model_path
from host.compiler import compile_model
from host.compiler.plan import simplify
from host.datasets import class_mix_stream
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.ir import QGemm, Requant
from host.onnx_import import load_onnx
from host.reference import run_reference
from host.runtime import Session
from verif.model_scenarios import model_inputs

DIGITS = ("mlp", "moe", "early_exit", "cnn")
ZOO = ("resnet8", "ds_cnn", "mobilenet_v1_025", "fc_autoencoder")
ALL = {c: 1.0 for c in range(10)}


def serve(name: str, n: int, sparsity: SparsityConfig | None) -> dict:
    """The adaptive runtime over ``n`` digits: cycles and the fast path's share."""
    rt = AdaptiveRuntime(NPUDriver(GoldenDevice(CONFIGS["default"])), load_onnx(model_path(name)),
                         AdaptiveConfig(async_compile=False, sparsity=sparsity))
    rt.load()
    inp = rt.graph.inputs[0]
    shape = rt.graph.tensors[inp].shape
    res = [rt.run({inp: s.x.reshape(shape).astype(np.float32)})
           for s in class_mix_stream(n, [ALL], 0)]
    rt.close()
    half = res[n // 2:]
    fast = [("@sparse" in r.model.graph.name) for r in res]
    out = {"cycles_second_half": float(np.mean([r.cycles for r in half])),
           "equal_reference": sum(r.checked for r in res), "inferences": n}
    if sparsity is not None:
        sp = rt.report()["sparsity"]
        out.update(fast_path_share=float(np.mean(fast)),
                   fast_path_share_second_half=float(np.mean(fast[n // 2:])),
                   guard_failures=sum(e.kind == "guard-failed" for e in rt.events),
                   trials=sp["trials"], gemm_inputs=[p["input"] for p in sp["inputs"]],
                   always_zero_elements=[sum(r >= 0.999 for r in p["element_zero_rate"])
                                         for p in sp["inputs"]])
    return out


def zero_weight_tiles(graph, rows: int, cols: int) -> tuple[int, int]:
    """(weight tiles of every NPU GEMM, those all zero)."""
    tiles = zero = 0
    for _g, n in graph.walk():
        if not (isinstance(n, QGemm) and n.device == "npu" and n.weight.ndim == 2):
            continue
        k, m = n.weight.shape
        w = np.ones((-(-k // rows) * rows, -(-m // cols) * cols), np.int8)
        w[:k, :m] = n.weight
        t = (w.reshape(-1, rows, w.shape[1] // cols, cols) == 0).all(axis=(1, 3))
        tiles, zero = tiles + t.size, zero + int(t.sum())
    return tiles, zero


def zoo_figures(name: str, rows: int, cols: int) -> dict:
    g, _ = simplify(load_onnx(model_path(name), allow_cpu_fallback=True))
    xs = model_inputs(name, g)
    inputs = {}
    for src in gemm_inputs(g):
        zero = np.stack([src.quantized(g, x[src.input]) == src.zero for x in xs])
        inputs[src.input] = {"k": src.k, "max_element_zero_rate": float(zero.mean(0).max()),
                             "always_zero_elements": int(zero.all(0).sum())}
    layers: dict[str, list[float]] = {}
    for x in xs:
        for layer, rate in layer_tile_zeros(g, run_reference(g, x, keep_all=True), rows).items():
            layers.setdefault(layer, []).append(rate)
    worst = max(layers.items(), key=lambda kv: np.mean(kv[1]))
    tiles, zero = zero_weight_tiles(g, rows, cols)
    return {"samples": len(xs), "gemm_inputs": inputs,
            "max_layer_zero_k_tile_share": {"layer": worst[0], "share": float(np.mean(worst[1]))},
            "gemm_weight_tiles": tiles, "all_zero_weight_tiles": zero,
            "clamps_narrower_than_int8": len(clamped_nodes(g))}


def fused_clamp_saving() -> dict:
    """Cycles of the ``mlp`` with a clamp fused into fc2's ``vreq`` and without it."""
    g, _ = simplify(load_onnx(model_path("mlp")))
    x = {"input": next(iter(class_mix_stream(1, [ALL], 0))).x.reshape(1, 64).astype(np.float32)}
    cycles = {}
    for what, hi in (("clamped", 100), ("unclamped", 127)):
        fc2 = g.node("fc2")
        rq = fc2.requant
        fc2.requant = Requant(rq.mult, rq.shift, rq.zp, lo=rq.lo, hi=hi)
        m = compile_model(g, CONFIGS["default"], simplified=True)
        s = Session(NPUDriver(GoldenDevice(CONFIGS["default"])), m, check=True)
        s.load()
        s.run(x)
        cycles[what] = s.run(x).cycles  # warm
    cycles["saved"] = cycles["clamped"] - cycles["unclamped"]
    return cycles


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--digits", type=int, default=96, help="digits per stream")
    ap.add_argument("--models", nargs="*", default=list(DIGITS + ZOO))
    opts = ap.parse_args(argv)
    hw = CONFIGS["default"]
    figures: dict = {"digits": {}, "zoo": {}}
    for name in opts.models:
        if name in DIGITS:
            off, on = serve(name, opts.digits, None), serve(name, opts.digits, SparsityConfig())
            g, _ = simplify(load_onnx(model_path(name)))
            tiles, zero = zero_weight_tiles(g, hw.rows, hw.cols)
            figures["digits"][name] = {
                "cycles_adaptive": off["cycles_second_half"],
                "cycles_adaptive_sparsity": on["cycles_second_half"],
                "speedup": off["cycles_second_half"] / on["cycles_second_half"],
                **{k: v for k, v in on.items() if k != "cycles_second_half"},
                "gemm_weight_tiles": tiles, "all_zero_weight_tiles": zero,
                "clamps_narrower_than_int8": len(clamped_nodes(g))}
        elif name in ZOO:
            figures["zoo"][name] = zoo_figures(name, hw.rows, hw.cols)
    figures["fused_clamp_cycles"] = fused_clamp_saving()
    figures["process_cpu_seconds"] = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    for name, f in figures["digits"].items():
        print(f"{name:12} adaptive {f['cycles_adaptive']:7.1f}  with sparsity "
              f"{f['cycles_adaptive_sparsity']:7.1f}  ({f['speedup']:.3f}x)  fast path "
              f"{100 * f['fast_path_share']:.0f}% (second half "
              f"{100 * f['fast_path_share_second_half']:.0f}%), guard failures "
              f"{f['guard_failures']}, {f['equal_reference']}/{f['inferences']} equal the "
              "reference")
    for name, f in figures["zoo"].items():
        w = f["max_layer_zero_k_tile_share"]
        print(f"{name:16} GEMM inputs {list(f['gemm_inputs']) or '-'}; most zero K-tiles in "
              f"a layer's input: {100 * w['share']:.1f}% ({w['layer']}); all-zero weight "
              f"tiles {f['all_zero_weight_tiles']}/{f['gemm_weight_tiles']}")
    report("sparsity", figures, quiet=True)


if __name__ == "__main__":
    main()
