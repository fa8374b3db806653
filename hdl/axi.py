"""AXI4 and AXI4-Lite signatures (manager view), named for cocotbext-axi.

Members are flat (``awaddr``, ``wdata``, ...), so a component member ``axi`` of
these signatures becomes Verilog ports ``axi__awaddr`` and friends, which
cocotbext-axi binds with ``AxiBus.from_prefix(dut, "axi_")`` (the prefix and
cocotbext's own ``_`` make the double underscore).
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

RESP_OKAY, RESP_EXOKAY, RESP_SLVERR, RESP_DECERR = 0, 1, 2, 3
BURST_INCR = 1


def axi4_signature(addr_width: int = 32, data_width: int = 64, id_width: int = 4
                   ) -> wiring.Signature:
    """Full AXI4 manager: INCR bursts, no locks/cache/QoS (subordinates default them)."""
    strb = data_width // 8
    return wiring.Signature({
        "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8),
        "awsize": Out(3), "awburst": Out(2), "awprot": Out(3),
        "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(strb), "wlast": Out(1),
        "wvalid": Out(1), "wready": In(1),
        "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
        "arsize": Out(3), "arburst": Out(2), "arprot": Out(3),
        "arvalid": Out(1), "arready": In(1),
        "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
        "rvalid": In(1), "rready": Out(1),
    })


def axi4_lite_signature(addr_width: int = 12, data_width: int = 32) -> wiring.Signature:
    """AXI4-Lite manager (the NPU's CSR port is the flipped form)."""
    return wiring.Signature({
        "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8),
        "wvalid": Out(1), "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
    })
