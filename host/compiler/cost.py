"""The cost model: cycles and DRAM bytes of a unit, from its work and the profile.

A unit's work (:class:`host.compiler.emit.Work`: dynamic counts of DMA transfers
and bytes, weight loads, GEMM rows, vector rows and bytes, instructions) is known
at compile time. The model predicts steady-state figures (resident weights hit
their tags): DRAM bytes exactly, and cycles

* from the golden model's timeline when the work carries one (``timeline``: the
  unit's warm cycles when its plan ran on the golden model, which takes the
  RTL's cycles where it says exact; :mod:`host.adaptive.timeline`), plus a refitted extra latency
  per DMA transfer for a device whose memory is slower than the simulation's;
* otherwise as a linear function of the work whose initial coefficients come
  from the hardware profile (bus width, array size). A streamed unit
  (:mod:`host.compiler.stream`) moves its data while it computes: its DMA terms
  and its compute terms overlap, so it costs the larger of the two plus one
  step of the smaller (the first loads and the last stores overlap nothing).

:meth:`CostModel.fit` refits both on measured region cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.config import NPUConfig

# Features of the cycle model, computed from a unit's work (warm: tags hit).
TERMS = ("fixed", "instructions", "transfers", "dma_beats", "wload_rows", "gemm_rows",
         "gemms", "stream_gemms", "vector_ops", "vector_beats")
DMA_TERMS = ("transfers", "dma_beats")  # what a streamed unit overlaps with the rest


def warm_dram_bytes(work: dict) -> tuple[int, int]:
    """(read, write) DRAM bytes of one run of the unit once its weights are resident."""
    return work["load_bytes"] - work["tagged_bytes"], work["store_bytes"]


def features(work: dict, config: NPUConfig) -> dict:
    """The linear model's features of ``work`` (:data:`TERMS`), and its golden
    ``timeline`` cycles (None when it has none)."""
    read, write = warm_dram_bytes(work)
    return {
        "timeline": work.get("timeline"),
        "streamed": bool(work.get("streamed")),
        "steps": int(work.get("streamed") or 0),
        "fixed": 1,
        "instructions": work["instructions"],
        "transfers": work["loads"] + work["stores"],
        "dma_beats": -(-(read + write) // config.bus_bytes),
        "wload_rows": work["wload_rows"],
        "gemm_rows": work["gemm_rows"],
        "gemms": work["gemms"],
        "stream_gemms": work.get("stream_gemms", 0),  # work recorded before the term: none
        "vector_ops": work["vector_ops"],
        "vector_beats": -(-work["vector_bytes"] // config.cols),
    }


def initial_coefficients(config: NPUConfig) -> dict:
    """Cycles per feature unit, from the hardware profile (before any measurement)."""
    return {
        "fixed": 8.0,  # region marks drain the queues
        "instructions": 3.0,  # two or three sequencer cycles per instruction
        "transfers": 16.0,  # DRAM latency per DMA transfer
        "dma_beats": 1.0,  # one bus beat per cycle
        "wload_rows": 1.0,
        "gemm_rows": 1.0,
        "gemms": float(config.rows + config.cols),  # systolic fill and drain
        "stream_gemms": 2.0,  # intake of a GEMM behind one on the same weights
        "vector_ops": 4.0,  # vector pipeline depth
        "vector_beats": 1.0,
    }


@dataclass
class CostModel:
    """Predicts a unit's cycles; refits itself on measurements.

    Members
    -------
    config : the hardware profile.
    coef : cycles per feature (see :data:`TERMS`), for work without a timeline.
    transfer_extra : cycles per DMA transfer that the device takes beyond the
        golden timeline (0 until measured: the simulated memory's latency).
    samples : (features, measured cycles) pairs seen so far.
    """

    config: NPUConfig
    coef: dict = field(default_factory=dict)
    transfer_extra: float = 0.0
    samples: list = field(default_factory=list)

    def __post_init__(self):
        if not self.coef:
            self.coef = initial_coefficients(self.config)

    def predict(self, work: dict) -> float:
        return self._predict(features(work, self.config))

    def _predict(self, f: dict) -> float:
        if f["timeline"] is not None:
            return max(0.0, f["timeline"] + self.transfer_extra * f["transfers"])
        if f["streamed"]:
            dma = sum(self.coef[t] * f[t] for t in DMA_TERMS)
            rest = sum(self.coef[t] * f[t] for t in TERMS if t not in DMA_TERMS)
            # The first step's loads and the last one's stores have nothing to
            # overlap: about one step of the shorter side shows.
            return max(0.0, float(max(dma, rest) + min(dma, rest) / max(f["steps"], 1)))
        return max(0.0, float(sum(self.coef[t] * f[t] for t in TERMS)))

    def observe(self, work: dict, cycles: int, cold: bool = False):
        """Record a measured run of a unit. A cold run (tag misses: its weights were
        loading) is not the steady state the model predicts and is left out."""
        if not cold:
            self.samples.append((features(work, self.config), cycles))

    def error(self) -> float:
        """Mean relative error of the current model on the samples."""
        if not self.samples:
            return 0.0
        pred = np.array([self._predict(f) for f, _ in self.samples])
        y = np.array([c for _, c in self.samples], dtype=float)
        return float(np.mean(np.abs(pred - y) / np.maximum(y, 1)))

    def fit(self, ridge: float = 1e-3) -> float:
        """Refit on the samples, pulled towards the current coefficients where the
        samples do not tell (ridge); return the mean relative error afterwards."""
        if not self.samples:
            return 0.0
        timed = [(f, c) for f, c in self.samples if f["timeline"] is not None]
        if timed:
            # Least squares of (measured - timeline) on the transfers, ridged to 0.
            t = np.array([f["transfers"] for f, _ in timed], dtype=float)
            gap = np.array([c - f["timeline"] for f, c in timed], dtype=float)
            self.transfer_extra = float(t @ gap / (t @ t + ridge * max(len(t), 1)))
        self._fit_linear([(f, c) for f, c in self.samples if not f["streamed"]] or
                         self.samples, ridge)
        return self.error()

    def calibrate(self, model, ridge: float = 1e-3) -> None:
        """Fit the linear coefficients to the golden timelines of ``model``'s units
        (a :class:`~host.compiler.CompiledModel`), before any device run: units that
        have no timeline (a branch the golden run did not take) are then predicted
        from their neighbours' golden cycles rather than the profile's rough guesses."""
        works = (r.resources["work"] for r in model.regions.values() if "work" in r.resources)
        timed = [(features(w, self.config), w["timeline"]) for w in works
                 if w.get("timeline") is not None and not w.get("streamed")]
        if timed:
            self._fit_linear(timed, ridge)

    def _fit_linear(self, samples, ridge: float) -> None:
        """Refit the coefficients on (features, cycles) of units whose terms add up
        (streamed units overlap theirs and are left to the other units)."""
        x = np.array([[f[t] for t in TERMS] for f, _ in samples], dtype=float)
        y = np.array([c for _, c in samples], dtype=float)
        prior = np.array([self.coef[t] for t in TERMS])
        # min |x b - y|^2 + lam |b - prior|^2 with b >= 0 (no feature makes a unit
        # faster; the features are nearly collinear, and free signs would let the
        # fit trade one against another and price savings negatively). Active set:
        # pin negative coefficients at 0 and refit the others.
        gram = x.T @ x
        lam = ridge * max(np.trace(gram) / len(TERMS), 1.0)
        free = np.ones(len(TERMS), dtype=bool)
        b = np.zeros(len(TERMS))
        for _ in range(len(TERMS)):
            idx = np.flatnonzero(free)
            g = gram[np.ix_(idx, idx)] + lam * np.eye(len(idx))
            b[:] = 0
            b[idx] = np.linalg.solve(g, x[:, idx].T @ y + lam * prior[idx])
            if (b >= 0).all():
                break
            free &= b > 0
        self.coef = {t: max(0.0, float(v)) for t, v in zip(TERMS, b, strict=True)}


def beside_cycles(config: NPUConfig, array: float, vector: float, acc_rows: int) -> float:
    """Cycles of an output-column tile's last requantization (``vector``) that run
    beside the next tile's GEMMs (``array``): with two accumulator read ports, where
    the compiler gives consecutive tiles different accumulator rows (``acc_rows``
    each; :meth:`host.compiler.lower.Lowering._column_tiles`); else none."""
    if config.acc_ports != 2 or 2 * acc_rows > config.acc_rows:
        return 0.0
    return float(min(array, vector))


def conv_cycles(config: NPUConfig, plan, tiles: int, oc: int, copy_bytes: int = 0) -> float:
    """Predicted array and vector cycles of a convolution mapping
    (:mod:`host.compiler.convrows`), to rank mappings before emitting one.

    ``plan`` holds per group of output rows (rows of each ``gemm``, ``gemm``\\ s per
    reduction tile, accumulator rows, ``vreq``\\ s, rows they requantize); ``tiles``
    reduction tiles per output-column tile. A ``wload`` takes its ``k`` reads from
    the ``gemm`` streaming before it, and may not fill a bank before the rows of the
    ``gemm`` two before it have left the array, so a tile costs the longer of
    ``m + k + 2`` and the array's round trip; the vector unit waits for the array to
    drain and the array for the vector unit (``docs/isa.md``, the cycle rules), but
    for a tile's last ``vreq`` where it runs beside the next tile's GEMMs
    (:func:`beside_cycles`).
    """
    rows, cols, bus = config.rows, config.cols, config.bus_bytes
    round_trip = rows + cols + 10
    drain = rows + cols + 3
    ncol = -(-oc // cols)
    total = -(-copy_bytes // bus)
    for gemm_rows, gemms, acc_rows, vreqs, vreq_rows in plan:
        array = tiles * gemms * max(gemm_rows + rows + 2, round_trip)
        words = -(-4 * cols // bus)  # the bias words: vreqb col=1 reads them per vreq
        vector = min(vreqs * words, acc_rows + words + 7)  # (or one vbias pass)
        vector += vreq_rows + vreqs * VREQ_EXTRA  # vreq
        last = vector / max(vreqs, 1)
        total += ncol * (array + drain + vector) - (ncol - 1) * beside_cycles(
            config, array, last, acc_rows)
    return float(total)


def gemm_tile_cycles(config: NPUConfig, rows: int, k: int, n: int) -> float:
    """Predicted array and vector cycles of one GEMM of ``rows`` rows (``k`` x ``n``
    weights, resident), to choose its M tiles before emitting them.

    A reduction tile costs ``m + rows`` plus the ``wload`` reads' share of the
    ``gemm`` before it (measured: ``m + 8.4`` on 8x8 from 16 rows on), and no less
    than half the array's round trip when ``m`` is short (the ``wload`` two tiles on
    waits for the rows of this one to leave); per output-column tile the array
    drains before the requantization (``vreqb col=1``: the bias words, a row a
    cycle, its latency), which the array waits for (``docs/isa.md``), but for
    the part the next tile's GEMMs run beside (:func:`beside_cycles`)."""
    r, c, bus = config.rows, config.cols, config.bus_bytes
    red, ncol = -(-k // r), -(-n // c)
    tile = max(rows + r + 0.4, (rows + 2 * (r + c) + 0.5) / 2)
    vector = -(-4 * c // bus) + rows + 14
    hidden = beside_cycles(config, red * tile, vector, rows)
    return ncol * (red * tile + vector + r + c + 24) - (ncol - 1) * hidden


def m_tiled_cycles(config: NPUConfig, sizes: list[int], k: int, n: int,
                   in_row: int, out_row: int, const_bytes: int = 0) -> float:
    """Predicted cycles of a GEMM unit run as M tiles of ``sizes`` rows (one tile:
    whole): the first tile's loads (with ``const_bytes`` of weights that are not
    resident) and the last one's stores show, the others overlap the compute of
    the tile between them (inputs ``in_row``, outputs ``out_row`` bytes a row)."""
    bus = config.bus_bytes
    load = [-(-t * in_row // bus) for t in sizes]
    store = [-(-t * out_row // bus) for t in sizes]
    total = load[0] + -(-const_bytes // bus) + store[-1]
    for t, m in enumerate(sizes):
        nxt = load[t + 1] if t + 1 < len(sizes) else 0
        prev = store[t - 1] if t else 0
        total += max(gemm_tile_cycles(config, m, k, n), nxt, prev)
    return float(total)


BAND_DMA_LATENCY = 21  # a load's and a store's latency (docs/isa.md, the cycle rules)
BAND_FIXED = 30  # per band: the pad columns' fix-up vclip and the cfg writes
VREQ_EXTRA = 15  # a vreq beyond its rows: the vector pipeline's latency


def band_cycles(config: NPUConfig, plan, tiles: int, oc: int, first_load: int,
                last_store: int) -> float:
    """Predicted cycles of a convolution streamed in bands of output rows
    (``plan`` as :func:`conv_cycles`, a group per band): its array and vector
    work, each band's fixed work, and the first band's load (``first_load``
    bytes) and the last band's store (``last_store`` bytes), which no compute
    overlaps (the other transfers run behind the bands' compute)."""
    bus = config.bus_bytes
    exposed = -(-first_load // bus) + -(-last_store // bus) + BAND_DMA_LATENCY
    return conv_cycles(config, plan, tiles, oc) + len(plan) * BAND_FIXED + exposed


WHOLE_TRANSFER_LATENCY = 11  # a load's or a store's latency and gap (docs/isa.md)


def whole_conv_cycles(config: NPUConfig, plan, tiles: int, oc: int, work: dict) -> float:
    """Predicted cycles of a convolution emitted whole (``plan`` as
    :func:`conv_cycles`): its array and vector work, and its loads and stores
    (``work``), which no compute overlaps (they come before and after it)."""
    read, write = warm_dram_bytes(work)
    dma = -(-(read + write) // config.bus_bytes)
    return conv_cycles(config, plan, tiles, oc) + dma + \
        (work["loads"] + work["stores"]) * WHOLE_TRANSFER_LATENCY
