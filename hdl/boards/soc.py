"""The board SoC: the NPU, on-chip RAM standing in for DRAM, and the UART bridge.

::

    rx/tx  <->  UartBridge --csr--> NPU.csr
                    |                NPU.axi --> DualPortRam.axi
                    +------mem-----------------> DualPortRam.lite
    irq    <--  NPU.irq (also into the bridge)

The host sees DRAM address ``a`` at RAM byte ``a`` through the bridge's memory
commands, exactly where the NPU's DMA finds it.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect

from firmware.config import NPUConfig

from ..top import NPU
from .ram import DualPortRam

__all__ = ["BoardSoC", "heartbeat", "stretch"]


class BoardSoC(wiring.Component):
    """One NPU build with its memory and host link, ready for a board top.

    Parameters
    ----------
    config : NPUConfig
        The NPU build (its ``bus_bytes`` is the RAM's AXI4 width).
    ram_bytes : int
        On-chip RAM standing in for DRAM (see :class:`~hdl.boards.ram.DualPortRam`).
    clk_freq : int
        The ``sync`` clock frequency in Hz (the UART's bit timing).
    baud : int
        UART baud rate.

    Attributes
    ----------
    npu, ram, bridge
        The three blocks, for simulation access.

    Members
    -------
    rx : In(1)
        UART receive (idle high).
    tx : Out(1)
        UART transmit (idle high).
    irq : Out(1)
        The NPU's interrupt line.
    error : Out(1)
        Pulses when the bridge rejects a bad frame.
    """

    def __init__(self, config: NPUConfig, ram_bytes: int, clk_freq: int, baud: int):
        self._MustUse__silence = True  # until the arguments are known good
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        for name, value in (("clk_freq", clk_freq), ("baud", baud)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        if baud * 4 > clk_freq:
            raise ValueError(f"baud={baud!r}: too fast for clk_freq={clk_freq!r} "
                             "(a UART needs several clocks per bit)")
        # Imported here so that the rest of hdl.boards works without the bridge.
        from ..bridge import UartBridge

        self.config = config
        self.clk_freq = clk_freq
        self.baud = baud
        self.ram = DualPortRam(ram_bytes, config.bus_bytes)  # checks ram_bytes first
        self.npu = NPU(config)
        try:
            self.bridge = UartBridge(clk_freq, baud, self.ram.addr_width)
        except Exception:
            self.ram._MustUse__silence = self.npu._MustUse__silence = True
            raise
        self._MustUse__silence = False
        super().__init__({"rx": In(1), "tx": Out(1), "irq": Out(1), "error": Out(1)})

    @property
    def ram_bytes(self) -> int:
        """Bytes of on-chip RAM (DRAM addresses ``0 .. ram_bytes - 1``)."""
        return self.ram.size_bytes

    def elaborate(self, platform):
        m = Module()
        m.submodules.npu = npu = self.npu
        m.submodules.ram = ram = self.ram
        m.submodules.bridge = bridge = self.bridge
        connect(m, npu.axi, ram.axi)
        connect(m, bridge.csr, npu.csr)
        connect(m, bridge.mem, ram.lite)
        m.d.comb += [
            bridge.rx.eq(self.rx),
            self.tx.eq(bridge.tx),
            bridge.irq.eq(npu.irq),
            self.irq.eq(npu.irq),
            self.error.eq(bridge.error),
        ]
        return m


def stretch(m: Module, pulse, cycles: int, name: str):
    """Return a signal that is high for ``cycles`` after each ``pulse`` (so an LED shows it)."""
    count = Signal(range(cycles + 1), name=f"{name}_stretch")
    with m.If(pulse):
        m.d.sync += count.eq(cycles)
    with m.Elif(count != 0):
        m.d.sync += count.eq(count - 1)
    return count != 0


def heartbeat(m: Module, clk_freq: int, name: str):
    """Return a ~1 Hz square wave (an LED that shows the clock runs)."""
    half = max(1, clk_freq // 2)
    count = Signal(range(half), name=f"{name}_count")
    beat = Signal(name=name)
    with m.If(count == half - 1):
        m.d.sync += [count.eq(0), beat.eq(~beat)]
    with m.Else():
        m.d.sync += count.eq(count + 1)
    return beat


def clock_and_uart(m: Module, platform, soc: BoardSoC, clk, locked, clk_freq: int,
                   reset_buffer=None) -> None:
    """What every board top does around its PLL: the sync domain on the PLL's
    output (held in reset until it locks, constrained to ``clk_freq``) and the
    board's UART pins wired to the SoC.

    ``reset_buffer(m, rst) -> rst`` puts the synchronized reset on a global
    network where the place-and-route tool does not do it by itself (ECP5): the
    reset reaches most of the design's flip-flops, across the whole chip.
    """
    from amaranth.hdl import ClockDomain, ClockSignal, ResetSignal
    from amaranth.lib import io
    from amaranth.lib.cdc import ResetSynchronizer

    m.domains.sync = ClockDomain("sync")
    m.d.comb += ClockSignal("sync").eq(clk)
    # The synchronizer drives the reset of its own domain (same clock), which then
    # reaches the sync domain through the board's buffer, if any.
    m.domains.reset_src = ClockDomain("reset_src")
    m.d.comb += ClockSignal("reset_src").eq(clk)
    m.submodules.reset_sync = ResetSynchronizer(~locked, domain="reset_src")
    rst = ResetSignal("reset_src")
    m.d.comb += ResetSignal("sync").eq(reset_buffer(m, rst) if reset_buffer else rst)
    # nextpnr also derives this from the oscillator's constraint and the PLL setting
    # (the net may be renamed by synthesis, which nextpnr then warns about).
    platform.add_clock_constraint(clk, clk_freq)
    m.submodules.soc = soc
    uart = platform.request("uart", 0, dir="-")
    m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
    m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
    m.d.comb += [soc.rx.eq(rx.i), tx.o.eq(soc.tx)]
