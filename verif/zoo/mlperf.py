"""Write the MLPerf Tiny models: one quantized file per model, onnxruntime's outputs.

``python -m verif.zoo --mlperf`` builds each model of
:mod:`verif.zoo.mlperf_models`, runs ``quant_pre_process`` and ``quantize_static``
with the settings of :data:`MLPERF_VARIANT` (QDQ, int8 activations, int8 weights per
tensor: the layout the NPU takes without a CPU fallback) and a MinMax calibration
over seeded inputs, and writes into ``host/models/mlperf/`` (where ``npu run
resnet8`` finds them):

* ``{model}.onnx``: the quantized model (the float model is not kept: the generator
  rebuilds it, and it would be four times the bytes);
* ``{model}.expected.npz``: the test inputs (key ``input``, one inference a row) and
  onnxruntime's outputs in both oracle modes (the test zoo's keys);
* ``MANIFEST.json`` (the test zoo's schema) and ``README.md``.

The files live under ``host/`` rather than ``tests/``: they are models a user runs
by name, shipped with the package like the bundled digit models.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import quant_pre_process

from host.models import MLPERF_DIR

from . import MLPERF_NAMES, MLPERF_VARIANT, expected_file, load_manifest
from .generate import _attempt, write_expected, write_manifest
from .mlperf_models import BUILDERS
from .workload import workload

REGENERATE = ".venv/bin/python -m verif.zoo --mlperf"


def model_file(model: str) -> str:
    """The quantized model's file name (``resnet8.onnx``)."""
    return f"{model}.onnx"


def generate_mlperf(out: Path = MLPERF_DIR, models: tuple[str, ...] = MLPERF_NAMES) -> dict:
    """Regenerate the MLPerf models in ``out``; returns the manifest written there.

    Raises RuntimeError when the quantizer refuses a model or onnxruntime cannot run
    what it wrote: these are the references, a workaround would make them something
    else.
    """
    out.mkdir(parents=True, exist_ok=True)
    v = MLPERF_VARIANT
    files, described = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            zm = BUILDERS[name]()
            print(f"{name}: {zm.what}", flush=True)
            src, pre = Path(tmp) / f"{name}.float.onnx", Path(tmp) / f"{name}.pre.onnx"
            onnx.save(zm.export(), str(src))
            quant_pre_process(src, pre)
            entry = {"variant": v.name, "settings": v.settings(), "quant_pre_process": True,
                     "workaround": None, "file": model_file(name)}
            failure = _attempt(pre, out / entry["file"], zm, v, {})
            if failure is not None:
                raise RuntimeError(f"{name}: {failure[0]} failed: {failure[1]}")
            write_expected(zm, [entry], out)
            files.append(entry)
            work = workload(out / entry["file"])
            described[name] = {"what": zm.what, "exporter": zm.exporter,
                               "expected": expected_file(name),
                               "test_inputs": list(zm.test_inputs.shape),
                               "calibration_inputs": len(zm.calibration),
                               "macs": work.macs, "weight_bytes": work.weight_bytes}
    write_manifest(out, files, described, [], REGENERATE, {v.name: v.settings()})
    manifest = load_manifest(out)
    write_mlperf_readme(out, manifest)
    return manifest


_HEAD = """\
# MLPerf Tiny reference models

The four reference architectures of MLPerf Tiny (mlcommons/tiny,
`benchmark/training/`), built layer for layer in PyTorch at their real sizes
(`verif/zoo/mlperf_models.py` says how each Keras layer maps), exported by
`torch.onnx.export` (TorchScript exporter) and quantized by onnxruntime's
`quant_pre_process` then `quantize_static`: QDQ, int8 activations, int8 weights
per tensor, MinMax calibration over {calibration} seeded synthetic inputs.

The weights are seeded, not trained (the data sets are not on this machine): Keras's
`he_normal`, BatchNorm statistics from synthetic inputs, BatchNorm folded into the
convolutions by the exporter. The figures a benchmark reads from them (MACs, bytes,
cycles) are those of the real models; their outputs classify nothing.

Run one by name: `npu run resnet8 --cpu-fallback` runs the sample inputs of
`resnet8.expected.npz` (what the NPU lacks runs on the CPU). `make bench-models`
measures all of them on the NPU (`bench/results/models.json`, the table in the
top-level README, which says which do not run yet).

Files: `{{model}}.onnx`, `{{model}}.expected.npz` (key `input`: the test inputs, one
inference a row; key `{{variant}}|{{output}}|{{mode}}`: onnxruntime's outputs, mode
`literal` = `ORT_DISABLE_ALL`, `default` = default session options),
`MANIFEST.json` (settings, operator counts, tool versions, sha256 of each file).

Regenerate (needs the models extra: `.venv/bin/pip install -e '.[models]'`):

```sh
.venv/bin/python -m verif.zoo --mlperf
```
"""


def write_mlperf_readme(out: Path, manifest: dict) -> None:
    """``README.md`` of the MLPerf models, from the manifest."""
    calibration = {info["calibration_inputs"] for info in manifest["models"].values()}
    lines = [_HEAD.format(calibration="/".join(map(str, sorted(calibration)))),
             "| model | architecture | MACs | weight bytes | input | file bytes |",
             "|---|---|---|---|---|---|"]
    files = {f["model"]: f for f in manifest["files"]}
    for name, info in manifest["models"].items():
        f = files[name]
        shape = "x".join(map(str, f["input"]["shape"]))
        lines.append(f"| `{name}` | {info['what']} | {info['macs']:,} | "
                     f"{info['weight_bytes']:,} | {shape} | {f['bytes']:,} |")
    tools = ", ".join(f"{k} {v}" for k, v in manifest["tools"].items())
    lines += ["", f"Made with {tools}; the bytes are reproducible on one machine with "
              "these versions, not across versions.", ""]
    (out / "README.md").write_text("\n".join(lines))
