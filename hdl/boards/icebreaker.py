"""iCEBreaker (Lattice iCE40 UP5K) board top: the board SoC behind a PLL, on the FTDI UART.

* Clock: the 12 MHz oscillator through an ``SB_PLL40_PAD`` to :data:`CLK_HZ`; the
  NPU stays in reset until the PLL locks.
* UART: the FT2232H's second channel (``/dev/ttyUSB1`` on the host; the first is
  the flash programmer), :data:`BAUD` baud, 8N1.
* LEDs: red = bridge rejected a frame (stretched to ~0.1 s), green = NPU interrupt.

The UP5K is small (5280 logic cells, 30 4-Kbit block RAMs, 4 SPRAMs, 8 DSPs), so
the build (:data:`CONFIG`) is the smallest useful NPU; see docs/fpga.md for why each
parameter is what it is. The RAM standing in for DRAM (:data:`RAM_BYTES`) is built
from two SPRAMs (:class:`~hdl.boards.ram.DualPortRam` instantiates them on this
device).
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Instance, Module, Signal
from amaranth.lib import io

from firmware.config import NPUConfig

from .soc import BoardSoC, clock_and_uart, stretch

__all__ = ["CONFIG", "RAM_BYTES", "CLK_HZ", "BAUD", "FAMILY", "TOOL_OPTIONS", "ICEBreakerTop",
           "make_top", "pll_params", "platform"]

CONFIG = NPUConfig(rows=4, cols=4, sp_bytes=6 * 1024, sp_banks=2, acc_rows=64,
                   partitions=2, pt_sets=1, tag_slots=4, imem_depth=320, bus_bytes=4,
                   loop_depth=2, region_depth=2, trace_depth=4, queue_depth=2)
"""The iCEBreaker NPU build (host/profiles.py ``icebreaker``)."""

RAM_BYTES = 64 * 1024
"""On-chip RAM standing in for DRAM: two SPRAMs side by side (32-bit words)."""

CLK_HZ = 24_000_000
"""NPU clock target (the synth report says whether it is met)."""

BAUD = 115_200
"""UART rate of the bridge."""

FAMILY = "ice40"

TOOL_OPTIONS = {"synth_opts": "-dsp"}
"""Extra options for ``platform.build``: map multipliers to the SB_MAC16 DSPs."""

OSC_HZ = 12_000_000

# SB_PLL40 limits (iCE40 datasheet / icepll): PFD 10..133 MHz, VCO 533..1066 MHz.
_PFD_MIN, _PFD_MAX = 10e6, 133e6
_VCO_MIN, _VCO_MAX = 533e6, 1066e6
_FILTER = ((17e6, 1), (26e6, 2), (44e6, 3), (66e6, 4), (101e6, 5), (float("inf"), 6))


def pll_params(f_in: float, f_out: float) -> dict[str, int]:
    """Return ``SB_PLL40`` settings that make ``f_out`` from ``f_in`` (both in Hz).

    Returns ``{"DIVR", "DIVF", "DIVQ", "FILTER_RANGE", "f_out"}``, ``f_out`` being
    the closest reachable frequency: ``f_in * (DIVF + 1) / ((DIVR + 1) * 2**DIVQ)``
    (simple feedback), as ``icepll`` picks.
    """
    if not (f_in > 0 and f_out > 0):
        raise ValueError(f"frequencies must be positive, got f_in={f_in!r}, f_out={f_out!r}")
    best = None
    for divr in range(16):
        pfd = f_in / (divr + 1)
        if not _PFD_MIN <= pfd <= _PFD_MAX:
            continue
        for divf in range(128):
            vco = pfd * (divf + 1)
            if not _VCO_MIN <= vco <= _VCO_MAX:
                continue
            for divq in range(1, 7):
                out = vco / (1 << divq)
                key = (round(abs(out - f_out)), divr, divf, divq, out)
                best = key if best is None or key < best else best
    if best is None:
        raise ValueError(f"no SB_PLL40 setting makes {f_out} Hz from {f_in} Hz")
    _, divr, divf, divq, out = best
    filt = next(r for limit, r in _FILTER if f_in / (divr + 1) < limit)
    return {"DIVR": divr, "DIVF": divf, "DIVQ": divq, "FILTER_RANGE": filt, "f_out": out}


class ICEBreakerTop(Elaboratable):
    """The iCEBreaker board top.

    Parameters
    ----------
    config : NPUConfig
    ram_bytes : int
        A multiple of 64 KiB (two SPRAMs per 32-bit row), at most 128 KiB.
    clk_freq : int
        NPU clock in Hz, made by the PLL from the 12 MHz oscillator (the closest
        reachable frequency is used; ``self.clk_freq`` is it, rounded to Hz).
    baud : int

    Attributes
    ----------
    soc : BoardSoC
    """

    def __init__(self, config: NPUConfig = CONFIG, ram_bytes: int = RAM_BYTES,
                 clk_freq: int = CLK_HZ, baud: int = BAUD):
        self.pll = pll_params(OSC_HZ, clk_freq)
        self.clk_freq = round(self.pll["f_out"])
        self.config = config
        self.soc = BoardSoC(config, ram_bytes, self.clk_freq, baud)

    def elaborate(self, platform):
        m = Module()
        # The PLL takes the oscillator straight from its pad (pin 35 is the PLL's input).
        clk12 = platform.request("clk12", 0, dir="-")
        clk = Signal(name="pll_clk")
        locked = Signal(name="pll_locked")
        p = self.pll
        m.submodules.pll = Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH="SIMPLE",
            p_DIVR=p["DIVR"], p_DIVF=p["DIVF"], p_DIVQ=p["DIVQ"],
            p_FILTER_RANGE=p["FILTER_RANGE"],
            i_PACKAGEPIN=clk12.io,
            i_RESETB=1, i_BYPASS=0,
            o_PLLOUTGLOBAL=clk, o_LOCK=locked,
        )
        soc = self.soc
        clock_and_uart(m, platform, soc, clk, locked, self.clk_freq)
        m.submodules.led_r = led_r = io.Buffer("o", platform.request("led_r", 0, dir="-"))
        m.submodules.led_g = led_g = io.Buffer("o", platform.request("led_g", 0, dir="-"))
        m.d.comb += [
            led_r.o.eq(stretch(m, soc.error, self.clk_freq // 10, "error")),
            led_g.o.eq(soc.irq),
        ]
        return m


def make_top(**kwargs) -> ICEBreakerTop:
    """The board top with this module's defaults (keyword arguments override them)."""
    return ICEBreakerTop(**kwargs)


def platform():
    """A fresh ``ICEBreakerPlatform`` (amaranth-boards)."""
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    return ICEBreakerPlatform()
