"""``tests/zoo/README.md``, written from the manifest so its tables stay true."""

from __future__ import annotations

from pathlib import Path

from . import FLOAT, VARIANTS

_HEAD = """\
# The test zoo

Small models written by the real tools, not by this project: float models exported by
`torch.onnx.export` (TorchScript exporter, `dynamo=False`; `cnn_dynamo` by the
torch.export-based exporter, `dynamo=True`) and skl2onnx, quantized by
`onnxruntime.quantization.quant_pre_process` then `quantize_static` (MinMax
calibration through a `CalibrationDataReader`). They are the import tests'
conformance vectors; onnxruntime is their oracle. `tests/test_zoo.py` checks the
files against `MANIFEST.json` (sha256), that onnxruntime reproduces the outputs
stored here exactly, and that each file is in the layout its variant names.
`python -m verif.zoo --status` shows what the importer makes of each file.

Files: `{model}.{variant}.onnx`, `{model}.expected.npz` (key `input`: the test
inputs stacked, one inference per row; key `{variant}|{output}|{mode}`: the
oracle's outputs, mode `literal` = `ORT_DISABLE_ALL`, the QDQ graph executed node by
node, the reference for bit-level comparison; `default` = default session options,
what a user's session computes), `MANIFEST.json` (settings, input and outputs,
opsets, operator counts, tool versions, sha256 of each file, what the quantizer
refused).

Regenerate (needs the models extra: `.venv/bin/pip install -e '.[models]'`):

```sh
.venv/bin/python -m verif.zoo                   # rewrites every file here
.venv/bin/python -m verif.zoo dwsep             # one model here (the manifest keeps the rest)
.venv/bin/python -m verif.zoo --out /tmp/zoo dwsep   # one model elsewhere
```

Weights are seeded and trained on one thread; the bytes are reproducible on one
machine with the tool versions below, not across versions.
"""


def _variant_line(name: str, s: dict) -> str:
    act = f"{s['activation_type']} activations" + (
        ", symmetric" if s["activation_symmetric"] else ", asymmetric")
    weights = f"{s['weight_type']} weights " + ("per channel" if s["per_channel"]
                                                 else "per tensor")
    return f"| `{name}` | {s['quant_format']} | {act} | {weights} |"


def _short(error: str, limit: int = 240) -> str:
    return error if len(error) <= limit else error[:limit] + "..."


def write_readme(out: Path, manifest: dict) -> None:
    lines = [_HEAD, "## Models", "", "| model | what | exported by |", "|---|---|---|"]
    for name, info in manifest["models"].items():
        lines.append(f"| `{name}` | {info['what']} | {info['exporter']} |")
    lines += ["", "## Variants", "", "| variant | format | activations | weights |",
              "|---|---|---|---|", f"| `{FLOAT}` | float32, as exported | | |"]
    lines += [_variant_line(v.name, v.settings()) for v in VARIANTS]
    names = [FLOAT] + [v.name for v in VARIANTS]
    lines += ["", "## Files (bytes)", "", "| model | " + " | ".join(names) + " |",
              "|---" * (len(names) + 1) + "|"]
    size = {(f["model"], f["variant"]): f"{f['bytes']}" + ("*" if f.get("workaround") else "")
            for f in manifest["files"]}
    for model in manifest["models"]:
        cells = [str(size[model, n]) if (model, n) in size else "refused" for n in names]
        lines.append(f"| `{model}` | " + " | ".join(cells) + " |")
    lines += ["", "\\* made with a workaround after onnxruntime's quantizer refused the "
              "variant's settings (below).", "", "## Refused by the tools", ""]
    kept = {(f["model"], f["variant"]): f.get("workaround") for f in manifest["files"]}
    for r in manifest["refused"]:
        key = (r["model"], r["variant"])
        outcome = (f"kept, made with {kept[key]}" if kept.get(key) else
                   "no file" if key not in kept else "kept")
        lines.append(f"- `{r['model']}` `{r['variant']}`, "
                     f"{'with ' + r['tried'] if r['tried'] else 'as documented'}: "
                     f"{r['step']} raised `{_short(r['error'])}` ({outcome})")
    if not manifest["refused"]:
        lines.append("Nothing: every variant of every model.")
    tools = ", ".join(f"{k} {v}" for k, v in manifest["tools"].items())
    lines += ["", f"Made with {tools}.", ""]
    (out / "README.md").write_text("\n".join(lines))
