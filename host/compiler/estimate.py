"""Refuse hopeless work before lowering: lower bounds of instructions and memory.

Lowering emits M tiles unrolled (:mod:`.lower`), so a model whose declared shapes
are huge would take minutes to emit a program that an instruction bank cannot
hold. :func:`check_fits` bounds the program from below in one pass over the
nodes, from the limits every lowering obeys:

* one ``gemm`` fills at most ``min(acc_rows, 4096)`` accumulator rows, and each
  such M tile of a GEMM (each group of output rows of a batch of images'
  convolution) needs at least a ``wload``, a ``gemm`` and a ``vreq``; one image's
  convolution may stream its bands in one loop, so it needs at least those three;
* every other NPU operator needs at least one instruction;
* every tensor the NPU touches, and all of them together with the weights, must
  be addressable by the 32-bit DMA address registers.

The bounds are lower bounds of what :class:`~.compile._Compiler` emits
(tests/test_compile_estimate.py checks them against compiled programs), so a
model refused here would be refused after lowering too, only much later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from firmware.config import NPUConfig

from ..ir import ArgMax, Clip, Graph, If, MaxPool, QAdd, QAvgPool, QConv, QGemm
from .plan import CompileError

GEMM_ROWS = 4096  # rows of one gemm instruction (its 12-bit row count)
PER_TILE = 3  # wload, gemm, vreq
ADDRESS_SPACE = 1 << 32  # bytes the DMA's 32-bit address registers reach


@dataclass
class Estimate:
    """Lower bounds of a program's size and memory need.

    Members
    -------
    instructions : instructions the program needs at least.
    dram_bytes : bytes of DRAM (constants and NPU tensors) it needs at least.
    largest : (instructions, node name) of the node that needs the most.
    """

    instructions: int = 0
    dram_bytes: int = 0
    largest: tuple[int, str] = (0, "")


def estimate(graph: Graph, config: NPUConfig) -> Estimate:
    """Lower bounds for ``graph`` (simplified) on ``config``, in time linear in
    its nodes (never in its shapes)."""
    est = Estimate()
    segments = set()
    for scope, n in graph.walk():
        if n.device != "npu" or isinstance(n, If):
            continue
        if scope is graph:
            segments.add(n.name)
        need = _node_instructions(n, scope, config)
        est.instructions += need
        est.largest = max(est.largest, (need, n.name))
        for t in (*n.inputs, *n.outputs):
            tensor = scope.tensors.get(t)
            if tensor is not None and not tensor.is_const:
                est.dram_bytes = max(est.dram_bytes, _bytes(tensor.shape))
        for w in (getattr(n, "weight", None), getattr(n, "bias", None)):
            if w is not None:
                est.dram_bytes += int(w.nbytes)
    est.instructions += 1 if segments else 0  # the segment's ``end``
    return est


def check_fits(graph: Graph, config: NPUConfig, paging: bool = False) -> Estimate:
    """Raise :class:`CompileError` when ``graph`` cannot fit ``config`` by the
    lower bounds of :func:`estimate`; return the estimate otherwise.

    Without ``paging`` the whole program must fit one instruction bank; with it
    (:mod:`.pages`) each top-level unit must fit a page, and a node's bound is a
    lower bound of the unit (or ``If``) that holds it."""
    est = estimate(graph, config)
    need, node = est.largest
    per_tile = f"its rows in tiles of at most {min(config.acc_rows, GEMM_ROWS)}"
    if paging and need > config.imem_depth - 1:  # each page ends with ``end``
        raise CompileError(f"node {node!r} alone needs at least {need} instructions "
                           f"({per_tile}); a page of the instruction bank holds "
                           f"{config.imem_depth - 1}")
    if not paging and est.instructions > config.imem_depth:
        raise CompileError(f"the program needs at least {est.instructions} instructions "
                           f"({need} for node {node!r} alone: {per_tile}); an "
                           f"instruction bank holds {config.imem_depth}")
    if est.dram_bytes >= ADDRESS_SPACE:
        raise CompileError(f"the model needs at least {est.dram_bytes} bytes of NPU memory "
                           f"(weights and its largest tensor); the NPU addresses "
                           f"{ADDRESS_SPACE} bytes")
    return est


def _bytes(shape) -> int:
    return math.prod(int(d) for d in shape)  # exact: a declared shape may overflow int64


def _node_instructions(n, scope: Graph, config: NPUConfig) -> int:
    rows_per_gemm = min(config.acc_rows, GEMM_ROWS)
    if isinstance(n, QGemm):
        x = scope.tensors.get(n.inputs[0])
        k = int(n.weight.shape[-2]) or 1
        rows = _bytes(x.shape) // k if x is not None else 1
        return PER_TILE * max(1, -(-rows // rows_per_gemm))
    if isinstance(n, (QConv, QAvgPool)):  # average pooling runs as a depthwise convolution
        y = scope.tensors.get(n.outputs[0])
        if y is None or len(y.shape) != 4:
            return PER_TILE
        bn, _, oh, ow = (int(d) for d in y.shape)
        if ow > config.acc_rows or bn == 1:
            # refused by the lowering with its own message, or one image, which may
            # stream its bands in one hardware loop (:mod:`.stream`)
            return PER_TILE
        per = oh if oh * ow <= config.acc_rows else max(1, config.acc_rows // max(ow, 1))
        return PER_TILE * max(1, bn * -(-oh // per))
    if isinstance(n, MaxPool):
        x = scope.tensors.get(n.inputs[0])
        return max(1, int(x.shape[0])) if x is not None and x.shape else 1
    if isinstance(n, (QAdd, Clip, ArgMax)):
        return 1
    return 0  # aliases (Flatten, Reshape) and branch conditions emit nothing of their own
