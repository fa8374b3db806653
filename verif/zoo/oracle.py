"""onnxruntime as the oracle: run a zoo file on stacked inputs, one inference a row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import ORACLE_MODES


def session(path: Path | str | bytes, mode: str) -> ort.InferenceSession:
    """An onnxruntime CPU session; ``mode`` is one of :data:`ORACLE_MODES`.

    ``literal`` disables every graph optimization, so a QDQ graph runs node by node
    (QuantizeLinear, float op on dequantized values, QuantizeLinear), the fair
    reference for bit-level comparison; ``default`` is what a user's session does.
    One thread: results must not depend on how the work is split.
    """
    if mode not in ORACLE_MODES:
        raise ValueError(f"unknown oracle mode {mode!r} (one of {ORACLE_MODES})")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    if mode == "literal":
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs by name, stacked over the rows of ``inputs`` (one inference each)."""
    name = sess.get_inputs()[0].name
    names = [o.name for o in sess.get_outputs()]
    rows = [sess.run(names, {name: x}) for x in inputs]
    return {n: np.stack([r[i] for r in rows]) for i, n in enumerate(names)}
