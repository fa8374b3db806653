"""Interfaces shared between NPU blocks.

Signatures are written from the requester's side; the block that serves them uses
``wiring.flipped(...)``.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from firmware.config import NPUConfig


def sp_word_bytes(config: NPUConfig) -> int:
    """Bytes per scratchpad word: one AXI data beat."""
    return config.bus_bytes


def sp_addr_bits(config: NPUConfig) -> int:
    """Width of a scratchpad *word* address."""
    return max(1, ceil_log2(config.sp_bytes // sp_word_bytes(config)))


def sp_port_signature(config: NPUConfig) -> wiring.Signature:
    """One requester's port into the scratchpad (word granularity).

    Members (requester view)
    ------------------------
    valid : Out(1)
        A request is presented. It stays presented until ``ready``.
    ready : In(1)
        The scratchpad accepts the request this cycle (arbitration granted).
    addr : Out(sp_addr_bits)
        Word address (byte address // bus_bytes).
    we : Out(1)
        Write (1) or read (0).
    wdata : Out(bus_bytes * 8)
        Write data, byte lane i at bits [8i, 8i+8).
    wstrb : Out(bus_bytes)
        Byte enables of a write.
    rvalid : In(1)
        Read data is valid: exactly one cycle after the read request was accepted,
        in order. Requesters must take it (no backpressure on responses).
    rdata : In(bus_bytes * 8)
        Read data.
    """
    word = sp_word_bytes(config)
    return wiring.Signature({
        "valid": Out(1),
        "ready": In(1),
        "addr": Out(sp_addr_bits(config)),
        "we": Out(1),
        "wdata": Out(word * 8),
        "wstrb": Out(word),
        "rvalid": In(1),
        "rdata": In(word * 8),
    })
