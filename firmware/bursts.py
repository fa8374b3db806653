"""How the DMA splits a DRAM row into AXI4 bursts (the rule both the DMA and the
golden model's cycle costs follow)."""

from __future__ import annotations

__all__ = ["MAX_BURST_BEATS", "PAGE", "burst_plan"]

MAX_BURST_BEATS = 256
"""AXI4 INCR bursts are at most 256 beats."""

PAGE = 4096
"""AXI4 bursts never cross a 4 KiB boundary."""
_ADDR_MASK = (1 << 32) - 1  # DRAM addresses are 32 bits


def burst_plan(addr: int, nbytes: int, bus_bytes: int) -> list[tuple[int, int]]:
    """Return the bursts the DMA issues for one row, as ``(beat address, beats)``.

    The row is the ``nbytes`` bytes at DRAM ``addr``; beat addresses are aligned to
    ``bus_bytes``. Bursts are as long as possible: they end at the row's last beat,
    after :data:`MAX_BURST_BEATS` beats or at a 4 KiB boundary, whichever is first.
    This is the reference the hardware is tested against.
    """
    if nbytes < 1:
        raise ValueError(f"nbytes={nbytes!r}: a row has at least one byte")
    bursts = []
    cur, end = addr - addr % bus_bytes, addr + nbytes
    while cur < end:
        need = -(-(end - cur) // bus_bytes)
        beats = min(need, MAX_BURST_BEATS, (PAGE - cur % PAGE) // bus_bytes)
        bursts.append((cur & _ADDR_MASK, beats))
        cur += beats * bus_bytes
    return bursts
