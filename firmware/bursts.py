"""How the DMA splits a DRAM row into AXI4 bursts (the rule both the DMA and the
golden model's cycle costs follow), and what a slow memory adds to a transfer's time
(:class:`DramLatency`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_BURST_BEATS", "PAGE", "DramLatency", "burst_plan"]

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


@dataclass(frozen=True)
class DramLatency:
    """Extra cycles of a slow DRAM: a property of the memory system, not of the NPU
    build (CAPS do not report it; the compiler does not know it).

    The memory serves one burst at a time per direction, like a DRAM controller
    without command pipelining behind an interconnect. ``read``: a read burst's first
    beat comes no earlier than this many cycles after the memory took the burst up
    (the cycle its address arrived, or the cycle the burst before it queued its last
    beat). ``write``:
    a write burst's response comes no earlier than this many cycles after its last
    beat arrived, and the memory takes no data of the next burst meanwhile.

    Each is 0 (the simulation's AxiRam) or at least :attr:`MIN_CYCLES`: from there on
    the memory alone sets the pace of a transfer's bursts after the first, which is
    what :meth:`read_gaps` and :meth:`store_cycles` count (tests/test_slowmem.py
    holds them to the RTL's cycles).
    """

    read: int = 0
    write: int = 0

    MIN_CYCLES = 16

    def __post_init__(self):
        for name in ("read", "write"):
            v = getattr(self, name)
            if not isinstance(v, int) or not (v == 0 or v >= self.MIN_CYCLES):
                raise ValueError(f"DramLatency.{name}={v!r}: must be 0 or an integer "
                                 f">= {self.MIN_CYCLES} (cycles)")

    def __bool__(self) -> bool:
        return bool(self.read or self.write)

    def read_gaps(self, beats: list[int]) -> list[int]:
        """Cycles the memory adds before each read burst's first beat (``beats``: the
        bursts' beats, in order), beyond a beat a cycle.

        The first burst waits ``read``; each later one is taken up as the burst before
        it queues its last beat, which the memory's two-entry R queue holds for
        ``min(beats, 2)`` cycles: that much of the wait is hidden.
        """
        if not self.read or not beats:
            return [0] * len(beats)
        return [self.read] + [self.read - min(b, 2) for b in beats[:-1]]

    def store_cycles(self, beats: list[int]) -> int:
        """Cycles from a store's first data beat to the end of its last burst's
        response wait (``beats``: its bursts' beats, in order; ``write`` > 0).

        The first burst's beats come a cycle each, then its response waits ``write``;
        each later burst is taken up then with two beats already in the memory's W
        queue (a burst of at most two beats takes no more cycles, a longer one a cycle
        per beat after its first) and waits ``write`` after its last beat.
        """
        return beats[0] + self.write + sum(self.write + (b - 1 if b > 2 else 0)
                                           for b in beats[1:])
