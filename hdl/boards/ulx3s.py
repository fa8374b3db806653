"""ULX3S (Lattice ECP5 LFE5U-85F) board top: the board SoC behind a PLL, on the FTDI UART.

* Clock: the 25 MHz oscillator through an ``EHXPLLL`` to :data:`CLK_HZ`; the NPU
  stays in reset until the PLL locks. The reset runs on a global network
  (:func:`global_reset`).
* UART: the FTDI FT231X (``/dev/ttyUSB0`` on the host), :data:`BAUD` baud, 8N1.
* LEDs: 0 = NPU interrupt, 1 = bridge rejected a frame (stretched to ~0.1 s so it
  shows), 6 = PLL locked, 7 = heartbeat (~1 Hz: the clock runs).

The NPU build (:data:`CONFIG`) is the ``small`` one (4x4 array) at 60 MHz, the build
that routes and meets timing (11 to 77 minutes in the builds measured); its int8 multipliers and
the vector unit's requantization map to the ECP5's ``MULT18X18D`` DSP blocks. The 85F
also holds the 8x8 ``default`` build (``make synth CONFIG=default FREQ=40``), whose
routing takes hours (docs/fpga.md).
:data:`RAM_BYTES` of block RAM stand in for DRAM (the bundled models need at most
~13 KiB of constants and activations).
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Instance, Module, Signal
from amaranth.lib import io

from firmware.config import CONFIGS, NPUConfig

from .soc import BoardSoC, clock_and_uart, heartbeat, stretch

__all__ = ["CONFIG", "RAM_BYTES", "CLK_HZ", "BAUD", "FAMILY", "TOOL_OPTIONS", "ULX3STop",
           "make_top", "pll_params", "platform", "global_reset"]

CONFIG = CONFIGS["small"]
"""The ULX3S NPU build (host/profiles.py ``ulx3s``; equal to the ``small`` build)."""

RAM_BYTES = 128 * 1024
"""On-chip RAM standing in for DRAM (64 of the 208 DP16KD blocks)."""

CLK_HZ = 60_000_000
"""NPU clock target (the synth report says whether it is met). Routed builds of
:data:`CONFIG` reach 65 to 72 MHz (docs/fpga-timing.md); ``FREQ=`` builds
against another target."""

BAUD = 115_200
"""UART rate of the bridge."""

FAMILY = "ecp5"

TOOL_OPTIONS = {"nextpnr_opts": "--placer-heap-timingweight 80"}
"""Extra options for ``platform.build`` (yosys's ``synth_ecp5`` maps multipliers to DSPs
by default). nextpnr's HeAP placer weighs timing 8x its default (10): the whole
build's slow paths are mostly wire between blocks the placer spread apart, and the
higher weight routed 1.8 MHz higher on average over three seeds (docs/fpga-timing.md)."""

OSC_HZ = 25_000_000

_VCO_MIN, _VCO_MAX = 400e6, 800e6
_PFD_MIN, _PFD_MAX = 3.125e6, 400e6


def pll_params(f_in: float, f_out: float) -> dict[str, int]:
    """Return ``EHXPLLL`` dividers that make ``f_out`` from ``f_in`` (both in Hz).

    Returns ``{"CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "f_out"}`` where ``f_out`` is the
    frequency actually produced, the closest reachable one (with the VCO nearest
    600 MHz among equals, as ``ecppll`` picks):
    PFD ``f_in / CLKI_DIV`` in 3.125..400 MHz, VCO ``f_out * CLKOP_DIV`` in
    400..800 MHz, feedback from CLKOP.
    """
    if not (f_in > 0 and f_out > 0):
        raise ValueError(f"frequencies must be positive, got f_in={f_in!r}, f_out={f_out!r}")
    best = None
    for ref in range(1, 129):
        pfd = f_in / ref
        if not _PFD_MIN <= pfd <= _PFD_MAX:
            continue
        for fb in range(1, 81):
            out = pfd * fb
            for div in range(1, 129):
                vco = out * div
                if _VCO_MIN <= vco <= _VCO_MAX:
                    # closest frequency first, then a VCO near mid-range (least jitter)
                    key = (round(abs(out - f_out)), abs(vco - 600e6), ref, fb, div, out)
                    best = key if best is None or key < best else best
    if best is None:
        raise ValueError(f"no EHXPLLL setting makes {f_out} Hz from {f_in} Hz")
    _, _, ref, fb, div, out = best
    return {"CLKI_DIV": ref, "CLKFB_DIV": fb, "CLKOP_DIV": div, "f_out": out}


def make_top(**kwargs) -> ULX3STop:
    """The board top with this module's defaults (keyword arguments override them)."""
    return ULX3STop(**kwargs)


def global_reset(m: Module, rst):
    """``rst`` through a ``DCCA`` onto a primary clock network, which reaches the
    slices' LSR inputs: nextpnr-ecp5 promotes clocks to globals but not resets, and
    on general routing the reset (the LSR of over 20,000 flip-flops, from one
    flip-flop) spans the whole chip. nextpnr then treats the net as a clock and does
    not time it; skew in the release is harmless because the NPU and the bridge sit
    idle until the host sends a frame."""
    out = Signal(name="rst_global")
    m.submodules.reset_dcc = Instance("DCCA", i_CLKI=rst, i_CE=1, o_CLKO=out)
    return out


def platform():
    """A fresh ``ULX3S_85F_Platform`` (amaranth-boards)."""
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    return ULX3S_85F_Platform()


class ULX3STop(Elaboratable):
    """The ULX3S 85F board top.

    Parameters
    ----------
    config : NPUConfig
    ram_bytes : int
    clk_freq : int
        NPU clock in Hz, made by the PLL from the 25 MHz oscillator (the closest
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
        m.submodules.clk25 = clk25 = io.Buffer("i", platform.request("clk25", 0, dir="-"))

        clk = Signal(name="pll_clk")
        locked = Signal(name="pll_locked")
        p = self.pll
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(OSC_HZ // 1_000_000),
            a_FREQUENCY_PIN_CLKOP=f"{self.clk_freq / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED", p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=p["CLKI_DIV"], p_CLKFB_DIV=p["CLKFB_DIV"],
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=p["CLKOP_DIV"],
            p_CLKOP_CPHASE=p["CLKOP_DIV"] - 1, p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            i_RST=0, i_STDBY=0, i_CLKI=clk25.i, i_CLKFB=clk,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
            i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clk, o_LOCK=locked,
        )
        soc = self.soc
        clock_and_uart(m, platform, soc, clk, locked, self.clk_freq, reset_buffer=global_reset)

        leds = []
        for i in (0, 1, 6, 7):
            m.submodules[f"led{i}"] = led = io.Buffer("o", platform.request("led", i, dir="-"))
            leds.append(led)
        m.d.comb += [leds[0].o.eq(soc.irq), leds[2].o.eq(locked)]
        m.d.comb += leds[1].o.eq(stretch(m, soc.error, self.clk_freq // 10, "error"))
        m.d.comb += leds[3].o.eq(heartbeat(m, self.clk_freq, "heartbeat"))
        return m

