"""Interfaces shared between NPU blocks: the contract every block is built against.

Signatures are written from the requester's side; the block that serves them uses
``wiring.flipped(...)``. Command layouts carry *resolved* operands: the sequencer
reads registers, applies defaults (a zero stride means dense), translates
partition offsets into absolute scratchpad byte addresses and checks every bound
before a command reaches an engine. Engines therefore never see an illegal
command; the only error an engine can raise is a DMA bus error.

Scratchpad
----------
``sp_bytes`` bytes in ``sp_banks`` SRAM banks of ``W = bus_bytes``-byte words,
interleaved by word: word ``w`` lives in bank ``w % sp_banks`` at row
``w // sp_banks``. A requester sees a *window port*: it names any byte address
``a`` and reads or writes the ``W`` bytes ``[a, a + W)`` (lane ``i`` is byte
``a + i``). A window touches at most two neighbouring words, so at most two banks;
the scratchpad grants a request when all the banks it needs are free this cycle
(each bank has one read and one write port; reads and writes do not compete).
Read data arrives :data:`SP_READ_LATENCY` cycles after the grant: the banks' block
RAM outputs are registered before the window is realigned, so that on an FPGA the
RAM's slow clock-to-output and the wire to the requester are not one cycle.

Accumulator
-----------
``acc_rows`` rows of ``cols`` int32 lanes, one row per access, owned by the compute
engine: the GEMM engine and the vector unit never use it at the same time (the
compute queue orders them), so its ports have no handshake.
"""

from __future__ import annotations

import enum

from amaranth.hdl import Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig

# ---- widths ----------------------------------------------------------------------


def sp_word_bytes(config: NPUConfig) -> int:
    """Bytes per scratchpad word and per window: one AXI data beat."""
    return config.bus_bytes


def sp_addr_bits(config: NPUConfig) -> int:
    """Width of an absolute scratchpad *byte* address."""
    return max(1, ceil_log2(config.sp_bytes))


def acc_addr_bits(config: NPUConfig) -> int:
    """Width of an accumulator row index."""
    return max(1, ceil_log2(config.acc_rows))


DRAM_ADDR_BITS = 32
M_BITS = 13  # row counts 1..4096
N_BITS = 13  # byte/element counts 1..4096
STRIDE_BITS = 24  # resolved strides (cfg strides are < 2**20, DMA strides are registers)
SP_READ_LATENCY = 2  # cycles from a scratchpad read's grant to its ``rvalid``


# ---- scratchpad window port ---------------------------------------------------------


def sp_window_signature(config: NPUConfig) -> wiring.Signature:
    """One requester's window into the scratchpad.

    Members (requester view)
    ------------------------
    valid : Out(1)
        A request is presented; it stays presented, unchanged, until ``ready``.
    ready : In(1)
        The scratchpad accepts the request this cycle.
    addr : Out(sp_addr_bits)
        Absolute byte address of lane 0. The window wraps at ``sp_bytes``.
    we : Out(1)
        Write (1) or read (0).
    wdata : Out(W * 8)
        Write data; lane ``i`` (bits ``8i..8i+7``) goes to byte ``addr + i``.
    wstrb : Out(W)
        Lanes to write. Lanes outside the strobe are left untouched.
    rvalid : In(1)
        Read data is valid: exactly :data:`SP_READ_LATENCY` cycles after the read
        was accepted. Requesters must take it (no backpressure on responses).
    rdata : In(W * 8)
        Lane ``i`` holds byte ``addr + i`` of the accepted read.
    """
    w = sp_word_bytes(config)
    return wiring.Signature({
        "valid": Out(1),
        "ready": In(1),
        "addr": Out(sp_addr_bits(config)),
        "we": Out(1),
        "wdata": Out(w * 8),
        "wstrb": Out(w),
        "rvalid": In(1),
        "rdata": In(w * 8),
    })


# ---- accumulator port -----------------------------------------------------------------


def acc_port_signature(config: NPUConfig) -> wiring.Signature:
    """One user's port into the accumulator buffer (no handshake, see module doc).

    Members (requester view)
    ------------------------
    ren, raddr : Out
        Read row ``raddr``; ``rdata`` holds it on the next cycle.
    rdata : In(cols * 32)
        Lane ``j`` (bits ``32j..32j+31``) is column ``j``, two's complement.
    wen, waddr, wdata : Out
        Write row ``waddr`` at the end of this cycle.
    wmask : Out(cols)
        Columns to write; the others keep their value.

    A read of a row written in the same cycle returns the old value.
    """
    a = acc_addr_bits(config)
    row = config.cols * 32
    return wiring.Signature({
        "ren": Out(1),
        "raddr": Out(a),
        "rdata": In(row),
        "wen": Out(1),
        "waddr": Out(a),
        "wdata": Out(row),
        "wmask": Out(config.cols),
    })


# ---- DMA ------------------------------------------------------------------------------


def dma_command_layout(config: NPUConfig) -> data.StructLayout:
    """A resolved ``load`` or ``store``: ``rows`` rows of ``nbytes`` bytes.

    Row ``i`` is ``dram + i*stride`` in DRAM and ``sp + i*nbytes`` in the
    scratchpad (rows are dense in the scratchpad). ``stride`` is already resolved
    (never 0 for dense; the sequencer substitutes ``nbytes``). Addresses wrap
    modulo 2**32 like the golden model's.
    """
    return data.StructLayout({
        "dram": DRAM_ADDR_BITS,
        "stride": DRAM_ADDR_BITS,
        "rows": 9,  # 1..256
        "nbytes": N_BITS,  # 1..4096
        "sp": sp_addr_bits(config),
    })


DMA_DONE_LAYOUT = data.StructLayout({
    "error": 1,  # the transfer met SLVERR/DECERR (the rest of it was abandoned)
    "addr": DRAM_ADDR_BITS,  # on error: DRAM address of the first byte of the failing row
})
"""Completion of one DMA command, one per command, in command order."""


# ---- GEMM engine (systolic array) ----------------------------------------------------


class ArrayOp(enum.IntEnum):
    WLOAD = 0
    GEMM = 1


def array_command_layout(config: NPUConfig) -> data.StructLayout:
    """A resolved ``wload`` or ``gemm``.

    ``wload``: ``k`` x ``n`` int8 weights, row-major and dense at ``sp``, into
    the shadow weight buffer (the rest of the buffer becomes zero).
    ``gemm``: if ``swap``, make the shadow weights active first; then for
    ``i < m`` stream the ``k`` bytes at ``sp + i*stride`` (``stride`` resolved,
    nonzero) through the array and write (or, with ``accumulate``, add) the
    ``n`` int32 results to accumulator row ``acc + i``; ``k`` and ``n`` of a
    gemm are those of the tile it uses (the sequencer tracks them).
    """
    return data.StructLayout({
        "op": ArrayOp,
        "sp": sp_addr_bits(config),
        "stride": STRIDE_BITS,
        "k": range(config.rows + 1),
        "n": range(config.cols + 1),
        "m": M_BITS,
        "acc": acc_addr_bits(config),
        "accumulate": 1,
        "swap": 1,
    })


# ---- vector unit -----------------------------------------------------------------------


class VectorOp(enum.IntEnum):
    CFG = 0  # cfg[field] = value (range already checked)
    BIAS = 1  # acc[acc+i][j] += int32le(sp[a + 4j]), i < m, j < n
    REQ = 2  # sp[d + i*ostride + j] = requant(acc[acc+i][j])
    ADD = 3  # sp[d + i*ostride + j] = requant_add(sp[a + i*istride + j], sp[b + ...])
    CLIP = 4  # sp[d + i*ostride + j] = clamp(sp[a + i*istride + j])
    MAX = 5  # sp[d + i*ostride + j] = max_t sp[a + i*pool_istride + t*pool_stride + j]
    ARGMAX = 6  # result = first argmax of int8 sp[a : a+n]
    QTAB = 7  # requantization table[j] = (int32le(sp[a + 8j]), sp[a + 8j + 4] & 63), j < n
    REQB = 8  # sp[d + i*ostride + j] = requant(acc[acc+i][j] + int32le(sp[b + 4i]))


def vector_command_layout(config: NPUConfig) -> data.StructLayout:
    """A resolved vector instruction (or a ``cfg`` write).

    The vector unit holds the configuration registers (``firmware.isa.CfgField``),
    resets them to ``CFG_RESET`` on ``run_start`` and resolves zero strides itself
    (``istride``/``ostride`` = ``cfg.in_stride``/``cfg.out_stride`` or ``n``).
    ``a``/``b`` are source addresses, ``d`` the destination, all absolute; ``tab``
    makes a ``REQ`` take column ``j``'s multiplier and shift from the table ``QTAB``
    loads.
    """
    sp = sp_addr_bits(config)
    return data.StructLayout({
        "op": VectorOp,
        "field": 4,
        "value": 32,
        "d": sp,
        "a": sp,
        "b": sp,
        "acc": acc_addr_bits(config),
        "m": M_BITS,
        "n": N_BITS,
        "tab": 1,  # REQ, REQB: per-column multipliers and shifts from the table
        "col": 1,  # REQB: one bias word per column at b (read first), not one per row
    })


def delayed(m, value, cycles: int, name: str) -> list:
    """``value`` registered ``cycles`` times in ``m.d.sync``: the list of the stages,
    ``[value one cycle late, ..., value cycles late]`` (for what a requester keeps
    with its scratchpad reads until their data arrives)."""
    stages = []
    for i in range(cycles):
        q = Signal.like(value, name=f"{name}_d{i + 1}")
        m.d.sync += q.eq(value)
        stages.append(q)
        value = q
    return stages


def command_stream(layout) -> wiring.Signature:
    """A command stream (``amaranth.lib.stream``: valid, ready, payload)."""
    return stream.Signature(layout)


__all__ = [
    "DRAM_ADDR_BITS", "M_BITS", "N_BITS", "STRIDE_BITS", "SP_READ_LATENCY", "DMA_DONE_LAYOUT",
    "ArrayOp", "VectorOp",
    "sp_word_bytes", "sp_addr_bits", "acc_addr_bits",
    "sp_window_signature", "acc_port_signature",
    "dma_command_layout", "array_command_layout", "vector_command_layout",
    "command_stream", "delayed",
]
