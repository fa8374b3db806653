"""Write the zoo: float models, their quantized variants, the oracle's outputs, a manifest.

For each model of :mod:`verif.zoo.models`: export the float model, run
``onnxruntime.quantization.quant_pre_process`` on it (as onnxruntime's docs tell
users to) and ``quantize_static`` once per :data:`verif.zoo.VARIANTS` entry with a
MinMax calibration over the model's calibration inputs. What the quantizer raises,
or writes but onnxruntime cannot then run, is recorded as refused in the manifest
and no file is kept. The oracle's outputs on the model's test inputs go to one npz
per model; ``MANIFEST.json`` records every file's settings, graph facts and sha256,
and ``README.md`` is rewritten from it.
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

from . import (
    FLOAT,
    MANIFEST,
    MODEL_NAMES,
    ORACLE_MODES,
    VARIANTS,
    Variant,
    expected_file,
    load_manifest,
    model_file,
    oracle,
    output_key,
    sha256,
)
from .models import BUILDERS, INPUT, ZooModel
from .readme import write_readme


class _Reader(CalibrationDataReader):
    """Feeds the calibration inputs one inference at a time."""

    def __init__(self, inputs: np.ndarray):
        self._rows = iter(inputs)

    def get_next(self):
        x = next(self._rows, None)
        return None if x is None else {INPUT: x}


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return f"{type(e).__name__}: {text.splitlines()[0]}"


def _quantize(src: Path, dst: Path, calibration: np.ndarray, v: Variant,
              extra: dict | None = None) -> None:
    options = {"ActivationSymmetric": True} if v.activation_symmetric else {}
    quantize_static(
        src, dst, _Reader(calibration),
        quant_format=getattr(QuantFormat, v.quant_format),
        per_channel=v.per_channel,
        activation_type=getattr(QuantType, v.activation_type),
        weight_type=getattr(QuantType, v.weight_type),
        extra_options={**options, **(extra or {})} or None)


class Workaround(NamedTuple):
    """A change of settings a user tries when the quantizer refuses a variant."""

    name: str
    formats: tuple[str, ...]  # the quant_formats it applies to
    extra_options: dict
    skip_optimization: bool  # quantize the model quant_pre_process left unoptimized


#: Tried in order when ``quantize_static`` raises or writes a model onnxruntime cannot
#: run. The per-channel int32-bias weight-scale adjustment assumes a 1-D bias and
#: raises on a Gemm with a (1, N) bias, which quant_pre_process makes by fusing
#: MatMul + Add (onnxruntime issue 24815): its documented switch turns the adjustment
#: off (QDQ only), and skipping quant_pre_process's optimization keeps MatMul + Add
#: unfused.
WORKAROUNDS = (
    Workaround("extra_options QDQDisableWeightAdjustForInt32Bias=True", ("QDQ",),
               {"QDQDisableWeightAdjustForInt32Bias": True}, skip_optimization=False),
    Workaround("quant_pre_process(skip_optimization=True)", ("QDQ", "QOperator"), {},
               skip_optimization=True),
)


def _graph_facts(path: Path) -> dict:
    """What a reader of the manifest wants without opening the file."""
    m = onnx.load(str(path))
    g = m.graph
    inits = {i.name for i in g.initializer}
    inp = next(i for i in g.input if i.name not in inits)
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    ops = Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in g.node)
    return {
        "input": {"name": inp.name, "shape": dims},
        "outputs": [o.name for o in g.output],
        "opsets": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "ops": dict(sorted(ops.items())),
    }


def _tool_versions() -> dict:
    import onnxscript
    import skl2onnx
    import sklearn
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "onnxscript": onnxscript.__version__,
            "onnxruntime": ort.__version__, "onnx": onnx.__version__,
            "skl2onnx": skl2onnx.__version__, "scikit-learn": sklearn.__version__,
            "numpy": np.__version__}


def _attempt(src: Path, dst: Path, zm: ZooModel, v: Variant,
             extra: dict) -> tuple[str, str] | None:
    """Quantize ``src`` into ``dst`` and check onnxruntime runs the result in both
    oracle modes; None on success, else (the step that failed, its error)."""
    try:
        _quantize(src, dst, zm.calibration, v, extra)
    except Exception as e:
        return "quantize_static", _first_line(e)
    try:
        for mode in ORACLE_MODES:
            oracle.run(oracle.session(dst, mode), zm.test_inputs[:1])
    except Exception as e:
        return f"onnxruntime runs the quantized model ({mode})", _first_line(e)
    return None


def build_model(zm: ZooModel, out: Path, work: Path) -> tuple[list[dict], list[dict]]:
    """Write one model's files into ``out``; return (manifest entries, refusals)."""
    entries, refused = [], []
    float_path = out / model_file(zm.name, FLOAT)
    onnx.save(zm.export(), str(float_path))
    entries.append({"variant": FLOAT, "settings": None})

    pre, pre_unoptimized = work / f"{zm.name}.pre.onnx", work / f"{zm.name}.pre-noopt.onnx"
    try:
        quant_pre_process(float_path, pre)
        quant_pre_process(float_path, pre_unoptimized, skip_optimization=True)
        preprocessed = True
    except Exception as e:  # the quantizer still runs on the model as exported
        refused.append({"model": zm.name, "variant": "*", "tried": None,
                        "step": "quant_pre_process", "error": _first_line(e)})
        shutil.copy(float_path, pre)
        shutil.copy(float_path, pre_unoptimized)
        preprocessed = False

    for v in VARIANTS:
        path = out / model_file(zm.name, v.name)
        attempts = [(None, pre, {})] + [
            (w.name, pre_unoptimized if w.skip_optimization else pre, w.extra_options)
            for w in WORKAROUNDS if v.quant_format in w.formats]
        for workaround, src, extra in attempts:
            failure = _attempt(src, path, zm, v, extra)
            if failure is None:
                entries.append({"variant": v.name, "settings": v.settings(),
                                "quant_pre_process": preprocessed, "workaround": workaround})
                break
            step, error = failure
            refused.append({"model": zm.name, "variant": v.name, "tried": workaround,
                            "step": step, "error": error})
        else:
            path.unlink(missing_ok=True)

    for entry in entries:
        entry["file"] = model_file(zm.name, entry["variant"])
    write_expected(zm, entries, out)
    return entries, refused


def write_expected(zm: ZooModel, entries: list[dict], out: Path) -> None:
    """The oracle's outputs on ``zm``'s test inputs for every file of ``entries``
    (each names its ``variant`` and ``file``) into ``{model}.expected.npz``; adds
    the model and graph facts to each entry."""
    arrays = {INPUT: zm.test_inputs}
    for entry in entries:
        path = out / entry["file"]
        for mode in ORACLE_MODES:
            for name, value in oracle.run(oracle.session(path, mode), zm.test_inputs).items():
                arrays[output_key(entry["variant"], name, mode)] = value
        entry.update(model=zm.name, **_graph_facts(path))
    np.savez_compressed(out / expected_file(zm.name), **arrays)


def _keep_others(out: Path, models: list[str], files: list, refused: list, described: dict):
    """Merge the records of the models not regenerated this time from ``out``'s manifest
    (in :data:`verif.zoo.MODEL_NAMES` order), so regenerating one model keeps the rest."""
    if not (out / MANIFEST).is_file():
        return files, refused, described
    old = json.loads((out / MANIFEST).read_text())
    kept = {m: info for m, info in old["models"].items() if m not in models}
    described = {m: ({**kept, **described})[m] for m in MODEL_NAMES
                 if m in kept or m in described}
    order = {m: i for i, m in enumerate(MODEL_NAMES)}
    files = sorted([f for f in old["files"] if f["model"] in kept] + files,
                   key=lambda f: order[f["model"]])
    refused = sorted([r for r in old["refused"] if r["model"] in kept] + refused,
                     key=lambda r: order[r["model"]])
    return files, refused, described


def generate(out: Path, models: list[str]) -> dict:
    """Regenerate the zoo in ``out``; returns the manifest written there."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.onnx"), *out.glob("*.npz")]:
        if stale.name.split(".")[0] in models:
            stale.unlink()
    files, refused, described = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            zm = BUILDERS[name]()
            print(f"{name}: {zm.what}", flush=True)
            entries, why = build_model(zm, out, Path(tmp))
            files += entries
            refused += why
            described[name] = {"what": zm.what, "exporter": zm.exporter,
                               "expected": expected_file(name),
                               "test_inputs": list(zm.test_inputs.shape),
                               "calibration_inputs": len(zm.calibration)}
            for r in why:
                print(f"  refused {r['variant']} (tried {r['tried'] or 'as documented'}) "
                      f"at {r['step']}: {r['error'][:200]}", flush=True)
    files, refused, described = _keep_others(out, models, files, refused, described)
    write_manifest(out, files, described, refused, ".venv/bin/python -m verif.zoo",
                   {v.name: v.settings() for v in VARIANTS})
    manifest = load_manifest(out)
    write_readme(out, manifest)
    return manifest


def write_manifest(out: Path, files: list[dict], described: dict, refused: list[dict],
                   regenerate: str, variants: dict) -> None:
    """``MANIFEST.json``: every file's settings, graph facts and sha256, the tools."""
    for entry in files:
        path = out / entry["file"]
        entry.update(bytes=path.stat().st_size, sha256=sha256(path))
    for info in described.values():
        info["expected_sha256"] = sha256(out / info["expected"])
    manifest = {
        "regenerate": regenerate,
        "tools": _tool_versions(),
        "oracle": {"literal": "onnxruntime, graph_optimization_level=ORT_DISABLE_ALL",
                   "default": "onnxruntime, default session options"},
        "calibration": "quantize_static, CalibrationMethod.MinMax",
        "variants": variants,
        "models": described,
        "files": files,
        "refused": refused,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
