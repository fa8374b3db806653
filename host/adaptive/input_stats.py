"""Input statistics the host sees: zero rates of GEMM inputs, value ranges before clamps.

The host writes every model input into DRAM itself, so it sees each one whole.
For a model input that reaches the NPU only as the K axis of GEMMs (a
:class:`GemmInput`: the input, its boundary ``Quantize``, and the ``QGemm``
nodes that read the quantized tensor), :class:`ZeroProfile` keeps, per
element, how often it equals the quantized tensor's zero point, and from a
window of recent inputs the share of inputs in which a set of elements is all
zero. That share is what a sparsity variant's guard would pass
(:mod:`.sparsity`).

:class:`RangeProfile` keeps the range of each clamped requantization's values
*before* its clamp (a ReLU or Clip fused into ``vreq``, or a standalone
``Clip``), computed from the reference interpreter's tensors of the inferences
the runtime checks anyway: a clamp whose observed input never leaves its
bounds acted as the identity on them.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..ir import Clip, Graph, QConv, QGemm, Quantize, Requant
from ..reference import eval_node, to_internal


@dataclass(frozen=True)
class GemmInput:
    """A model input that the NPU reads only as the K axis of GEMMs.

    Members
    -------
    input : the model input's name.
    quantize : the boundary ``Quantize`` node the host runs on it (None when the
        model takes it as int8 already).
    tensor : the int8 tensor the GEMMs read.
    zero : its zero point (an element equal to it adds nothing to ``x - zx``).
    gemms : the ``QGemm`` nodes reading it (in any branch body).
    k : its length (the GEMMs' K).
    """

    input: str
    quantize: Quantize | None
    tensor: str
    zero: int
    gemms: tuple[str, ...]
    k: int

    def quantized(self, graph: Graph, value) -> np.ndarray:
        """The int8 values the NPU reads for the external input ``value`` (flat)."""
        x = to_internal(graph.tensors[self.input], value)
        if self.quantize is not None:
            x = eval_node(self.quantize, [x])[0]
        return np.asarray(x).reshape(-1)


def gemm_inputs(graph: Graph) -> list[GemmInput]:
    """The model inputs of ``graph`` (simplified) that only GEMMs read, as K.

    An input qualifies when its one reader is a ``Quantize`` (or nothing but
    GEMMs read it, int8 with a known zero point), the quantized tensor is
    ``(1, K)``, is no graph output, and every node reading it, in the graph or in
    a branch body, is an NPU ``QGemm`` with 2-D weights.
    """
    readers: dict[str, list] = {}
    for _g, n in graph.walk():
        for name in n.inputs:
            readers.setdefault(name, []).append(n)
    out = []
    for name in graph.inputs:
        users = readers.get(name, [])
        q, tensor = None, name
        if len(users) == 1 and isinstance(users[0], Quantize):
            q = users[0]
            tensor, zero = q.outputs[0], q.zp
        else:
            quant = graph.tensors[name].quant
            if graph.tensors[name].dtype != "int8" or quant is None:
                continue
            zero = quant.zero_point
        t = graph.tensors[tensor]
        gemms = readers.get(tensor, [])
        if len(t.shape) != 2 or t.shape[0] != 1 or tensor in graph.outputs or not gemms:
            continue
        if not all(isinstance(n, QGemm) and n.device == "npu" and n.weight.ndim == 2
                   and n.inputs[0] == tensor for n in gemms):
            continue
        out.append(GemmInput(name, q, tensor, int(zero), tuple(n.name for n in gemms),
                             int(t.shape[1])))
    return out


class ZeroProfile:
    """How often each element of a :class:`GemmInput` is zero (its zero point).

    Parameters
    ----------
    source : the input profiled.
    window : recent inputs kept (their zero masks) to measure guard hit rates.
    """

    def __init__(self, source: GemmInput, window: int = 64):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.source = source
        self.masks: deque[np.ndarray] = deque(maxlen=window)
        self.seen = 0
        self._zeros = np.zeros(source.k, dtype=np.int64)

    def observe(self, values: np.ndarray) -> np.ndarray:
        """Take one input's int8 values (flat); its zero mask."""
        mask = np.asarray(values).reshape(-1) == self.source.zero
        self.masks.append(mask)
        self._zeros += mask
        self.seen += 1
        return mask

    def element_rates(self) -> np.ndarray:
        """Per element, the share of every input seen in which it was zero."""
        return self._zeros / max(1, self.seen)

    def tile_rates(self, tile: int) -> np.ndarray:
        """Per aligned K-tile of ``tile`` elements (the array's rows), the share of
        the window's inputs in which the whole tile was zero."""
        if not self.masks:
            return np.zeros(-(-self.source.k // tile))
        m = np.stack(self.masks)
        return np.array([m[:, i:i + tile].all(axis=1).mean()
                         for i in range(0, self.source.k, tile)])

    def hit_rate(self, elements) -> float:
        """The share of the window's inputs in which every one of ``elements`` was zero."""
        if not self.masks:
            return 0.0
        return float(np.stack(self.masks)[:, list(elements)].all(axis=1).mean())

    def skip_set(self, tile: int, min_hit: float) -> tuple[tuple[int, ...], float]:
        """The most elements to skip, in whole K-tiles, that were all zero together
        in at least ``min_hit`` of the window's inputs: ``(elements, hit rate)``
        (``((), 1.0)`` when no tile qualifies).

        Skipping ``d`` elements leaves ``K - d`` for the GEMM: the tiles saved are
        ``ceil(K / tile) - ceil((K - d) / tile)``, so ``d`` is taken as the smallest
        count that saves ``t`` tiles, from the elements most often zero in the window
        (ties in element order), for the largest ``t`` that keeps the hit rate.
        """
        k = self.source.k
        if not self.masks:
            return (), 1.0
        m = np.stack(self.masks)
        order = np.argsort(-m.mean(axis=0), kind="stable")
        tiles = -(-k // tile)
        best: tuple[tuple[int, ...], float] = ((), 1.0)
        for t in range(1, tiles):
            d = k - tile * (tiles - t)
            chosen = order[:d]
            hit = float(m[:, chosen].all(axis=1).mean())
            if hit < min_hit:
                break
            best = tuple(sorted(int(i) for i in chosen)), hit
        return best

    def report(self, tile: int) -> dict:
        """JSON-ready: inputs seen, per-element and per-K-tile zero rates."""
        return {"input": self.source.input, "k": self.source.k, "inputs": self.seen,
                "zero_point": self.source.zero,
                "element_zero_rate": [round(float(r), 3) for r in self.element_rates()],
                "tile_zero_rate": [round(float(r), 3) for r in self.tile_rates(tile)]}


# ---- value ranges before a clamp --------------------------------------------------------------


def clamped_nodes(graph: Graph) -> list:
    """The nodes of ``graph`` (any branch body) whose output passes a clamp narrower
    than int8: a requantization with ``lo > -128`` or ``hi < 127``, or a ``Clip``."""
    out = []
    for _g, n in graph.walk():
        rq = getattr(n, "requant", None)
        if isinstance(n, Clip) or (isinstance(rq, Requant) and (rq.lo > -128 or rq.hi < 127)):
            out.append(n)
    return out


def clamp_bounds(node) -> tuple[int, int]:
    """``(lo, hi)`` of a clamped node's clamp."""
    if isinstance(node, Clip):
        return node.lo, node.hi
    return node.requant.lo, node.requant.hi


def unclamped(node):
    """A copy of a clamped node that computes its values without the clamp (int8
    saturation stays: it is the requantizer's, not the ReLU's)."""
    if isinstance(node, Clip):
        return None  # a Clip without its clamp is its input
    c = copy.copy(node)
    c.requant = Requant(node.requant.mult, node.requant.shift, node.requant.zp)
    return c


class RangeProfile:
    """Observed value ranges of clamped tensors before their clamp.

    Parameters
    ----------
    graph : the simplified model; its clamped nodes are profiled.
    """

    def __init__(self, graph: Graph):
        self.nodes = clamped_nodes(graph)
        self._open = [unclamped(n) for n in self.nodes]
        self.lo: dict[str, int] = {}
        self.hi: dict[str, int] = {}
        self.seen = 0

    def observe(self, env: dict) -> None:
        """Take the reference interpreter's tensors of one inference
        (``run_reference(..., keep_all=True)``); nodes of untaken branches are skipped."""
        self.seen += 1
        for n, free in zip(self.nodes, self._open, strict=True):
            if any(i not in env for i in n.inputs):
                continue
            v = env[n.inputs[0]] if free is None else \
                eval_node(free, [env[i] for i in n.inputs])[0]
            lo, hi = int(np.min(v)), int(np.max(v))
            self.lo[n.name] = min(lo, self.lo.get(n.name, lo))
            self.hi[n.name] = max(hi, self.hi.get(n.name, hi))

    def identity(self) -> list[str]:
        """The clamps that every observed value passed unchanged."""
        out = []
        for n in self.nodes:
            lo, hi = clamp_bounds(n)
            if n.name in self.lo and self.lo[n.name] >= lo and self.hi[n.name] <= hi:
                out.append(n.name)
        return out

    def report(self) -> dict:
        """JSON-ready: per clamped node its clamp and the range observed before it."""
        return {"inferences": self.seen, "identity": self.identity(),
                "clamps": {n.name: {"clamp": list(clamp_bounds(n)),
                                    "observed": [self.lo.get(n.name), self.hi.get(n.name)]}
                           for n in self.nodes}}


# ---- K-tile sparsity inside a model ----------------------------------------------------------


def layer_tile_zeros(graph: Graph, env: dict, rows: int) -> dict[str, float]:
    """Per NPU GEMM and (non-depthwise) convolution of ``graph``'s top level whose
    input has a known zero point, the share of its input's K-tiles that are all zero
    in the tensors ``env`` (``run_reference(..., keep_all=True)``): a GEMM's ``(.., K)``
    in tiles of ``rows`` along K, a convolution's NCHW input in groups of ``rows``
    channels per pixel (the K-tiles of one tap). What skipping tiles inside a model
    could save; the host sees these tensors only in the reference's shadow runs.
    """
    out = {}
    for n in graph.nodes:
        if n.device != "npu" or not isinstance(n, QGemm | QConv) or n.inputs[0] not in env:
            continue
        if isinstance(n, QConv) and n.is_depthwise:
            continue
        t = graph.tensors[n.inputs[0]]
        if t.quant is None or t.dtype != "int8":
            continue
        zero = np.asarray(env[n.inputs[0]]) == t.quant.zero_point
        if isinstance(n, QConv):
            c = zero.shape[1]
            pad = -c % rows
            z = np.concatenate([zero, np.ones((zero.shape[0], pad, *zero.shape[2:]), bool)], 1)
            z = z.reshape(z.shape[0], -1, rows, *z.shape[2:]).all(axis=2)
        else:
            k = zero.shape[-1]
            pad = -k % rows
            z = np.concatenate([zero, np.ones((*zero.shape[:-1], pad), bool)], -1)
            z = z.reshape(*z.shape[:-1], -1, rows).all(axis=-1)
        out[n.name] = float(z.mean())
    return out
