"""Errors the host raises for models it cannot take.

Each names the node at fault (its name, its index in its graph, its operator and
the operator's domain, once the importer has located it) and ends with what to do,
so a user can find the node in the model they wrote and act on one line.
"""

from __future__ import annotations

# How a library caller gets an unsupported operator run anyway; the ``npu`` command
# swaps it for its own flag.
CPU_FALLBACK_HINT = "or import with allow_cpu_fallback=True to run it on the CPU"

REPAIR_HINT = ("check the model with onnx.checker.check_model(model, full_check=True) and "
               "re-export or repair it")
"""What to do about a model that breaks an operator's specification (the default fix)."""


class ModelError(ValueError):
    """A malformed or inconsistent model: shape or dtype mismatch, missing
    initializer, dangling input, out-of-range quantization parameter.

    Members
    -------
    node : name of the offending node ("" when the fault is not in a node).
    reason : the problem alone, without the node's location and the fix.
    fix : what to do about it ("" until located, then :data:`REPAIR_HINT` unless
        the raiser knew better).
    index : the node's position in its graph's node list (None until located).
    op_type, domain : the node's operator and its domain (``"ai.onnx"`` for the
        default one; "" until located).
    """

    def __init__(self, message: str, node: str = "", *, fix: str = ""):
        self.reason, self.node, self.fix = message, node, fix
        self.index: int | None = None
        self.op_type = self.domain = ""
        super().__init__(self._text())

    def locate(self, node: str, index: int, op_type: str, domain: str,
               default_fix: str = REPAIR_HINT) -> ModelError:
        """Name the node's position, operator and domain in the message; return ``self``."""
        # protobuf hands back bytes for a string field that is not valid UTF-8
        node, op_type, domain = (_text_of(x) for x in (node, op_type, domain))
        self.node, self.index, self.op_type = node, index, op_type
        self.domain = domain or "ai.onnx"
        self.fix = self.fix or default_fix
        self.args = (self._text(),)
        return self

    @property
    def located(self) -> bool:
        return self.index is not None

    def _text(self) -> str:
        text = self.reason
        if self.node:
            facts = [f"#{self.index}"] if self.index is not None else []
            if self.op_type:
                facts += [self.op_type, f"domain {self.domain}"]
            where = f"node {self.node!r}" + (f" ({', '.join(facts)})" if facts else "")
            text = f"{where}: {text}"
        return f"{text}; {self.fix}" if self.fix else text


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
        what = f"unsupported operator {op_type}"
        if reason:
            what += f": {reason}"
        if alternatives:
            what += "; supported: " + ", ".join(alternatives)
        super().__init__(what, node, fix=CPU_FALLBACK_HINT)
        self.op_type, self.domain = op_type, domain or "ai.onnx"
        self.alternatives = tuple(alternatives)
        self.args = (self._text(),)


def _text_of(value) -> str:
    """A name from a model as text, whatever bytes it holds."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
