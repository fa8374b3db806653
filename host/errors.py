"""Errors the host raises for models it cannot take.

Both name the node at fault, so a user can find it in the model they wrote.
"""

from __future__ import annotations

# How a library caller gets an unsupported operator run anyway; the ``npu`` command
# swaps it for its own flag.
CPU_FALLBACK_HINT = "or import with allow_cpu_fallback=True to run it on the CPU"


class ModelError(ValueError):
    """A malformed or inconsistent model: shape or dtype mismatch, missing
    initializer, dangling input, out-of-range quantization parameter.

    Members
    -------
    node : name of the offending node ("" when the fault is not in a node).
    """

    def __init__(self, message: str, node: str = ""):
        super().__init__(f"node {node!r}: {message}" if node else message)
        self.node = node


class UnsupportedOpError(ModelError):
    """An operator (or a form of one) that neither the NPU nor the importer supports.

    Members
    -------
    op_type : the ONNX operator type.
    node : name of the node.
    alternatives : the supported operators a model can use instead.
    domain : the operator's domain (``"ai.onnx"`` for the default one).
    """

    def __init__(self, op_type: str, node: str, reason: str = "",
                 alternatives: tuple[str, ...] = (), domain: str = ""):
        domain = domain or "ai.onnx"
        what = f"unsupported operator {op_type} (domain {domain})"
        if reason:
            what += f": {reason}"
        if alternatives:
            what += "; supported: " + ", ".join(alternatives)
        what += "; " + CPU_FALLBACK_HINT
        super().__init__(what, node)
        self.op_type = op_type
        self.domain = domain
        self.alternatives = tuple(alternatives)
