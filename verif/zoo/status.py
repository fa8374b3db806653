"""What the importer makes of the zoo: a status report, not a test.

For every file in the manifest: ``host.onnx_import.load_onnx(path,
allow_cpu_fallback=True)``; where that imports, compile the graph and run the test
inputs through a :class:`host.runtime.Session` on the golden model with
``check=True`` (as ``npu run`` does: every inference is also compared with the
reference interpreter), then compare the outputs with the oracle's ``literal``
outputs. One line per file:

* ``exact``: imported, ran, every output equal to onnxruntime's;
* ``mismatch``: imported and ran, outputs differ: the largest error in LSBs of the
  output's scale (the scale of the ``DequantizeLinear`` that writes it), in float
  for float outputs, or the count of differing integer outputs (labels);
* ``refused``: ``load_onnx`` raised (first line of its error);
* ``fails``: imported, but compiling or running it raised (first line).

Needs neither torch nor onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from firmware.config import CONFIGS
from host.compiler import compile_model
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.runtime import Session

from . import expected_file, load_manifest, output_key


def output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Each graph output's quantization scale: that of the ``DequantizeLinear`` that
    writes it (through ``Identity`` nodes), for outputs a DequantizeLinear writes."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    scales = {}
    for out in g.output:
        node = producer.get(out.name)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            scale = numpy_helper.to_array(inits[node.input[1]])
            if scale.size == 1:
                scales[out.name] = float(scale.reshape(()))
    return scales


def compare(got: np.ndarray, want: np.ndarray, scale: float | None) -> str | None:
    """None when equal; else how far apart, in the unit the output is read in."""
    got = np.asarray(got).reshape(want.shape)
    if np.array_equal(got, want):
        return None
    if want.dtype.kind in "iub":
        return f"{int(np.sum(got != want))}/{want.size} values differ"
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    if scale:
        return f"max {err / scale:.3g} LSB (scale {scale:.3g})"
    return f"max abs error {err:.3g} (float output)"


def _first_line(e: BaseException) -> str:
    """The error's first line, less the importer's list of supported operators (the
    same on every refusal)."""
    text = (str(e).strip() or type(e).__name__).splitlines()[0]
    return f"{type(e).__name__}: {text.split('; supported: ')[0]}"


def run_on_golden(graph, inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Each graph output over ``inputs`` (one inference per row, stacked), run by a
    golden-model :class:`Session` with ``check=True`` (a difference from the
    reference interpreter raises ``MismatchError``)."""
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    session = Session(drv, compile_model(graph, drv.config), check=True)
    session.load()
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    runs = [session.run({name: x.reshape(shape)}).outputs for x in inputs]
    return {out: np.stack([r[out] for r in runs]) for out in runs[0]}


def file_status(path: Path, inputs: np.ndarray, expected: dict[str, np.ndarray]) -> str:
    """The status line's verdict for one zoo file."""
    try:
        graph = load_onnx(path, allow_cpu_fallback=True)
    except Exception as e:
        return f"refused: {_first_line(e)}"
    try:
        got = run_on_golden(graph, inputs)
    except Exception as e:
        return f"fails: {_first_line(e)}"
    scales = output_scales(onnx.load(str(path)))
    problems = []
    for out, want in expected.items():
        if out not in got:
            problems.append(f"{out}: not an output of the imported graph")
            continue
        diff = compare(got[out], want, scales.get(out))
        if diff:
            problems.append(f"{out}: {diff}")
    return "mismatch: " + "; ".join(problems) if problems else "exact"


def status_lines(zoo_dir: Path) -> list[tuple[str, str]]:
    """(file, verdict) for every file of the manifest, in manifest order."""
    manifest = load_manifest(zoo_dir)
    data = {m: np.load(zoo_dir / expected_file(m)) for m in manifest["models"]}
    lines = []
    for f in manifest["files"]:
        npz = data[f["model"]]
        expected = {o: npz[output_key(f["variant"], o, "literal")] for o in f["outputs"]}
        lines.append((f["file"], file_status(zoo_dir / f["file"], npz["input"], expected)))
    return lines


def print_status(zoo_dir: Path) -> int:
    """Print the table; always 0: a refusal is the state of the importer, not an error."""
    lines = []
    for file, verdict in status_lines(zoo_dir):
        line = f"{file:<32} {verdict}"
        print(line, flush=True)
        lines.append(verdict.split(":")[0])
    counts = {k: lines.count(k) for k in ("exact", "mismatch", "refused", "fails")}
    print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" of {len(lines)} files")
    return 0
