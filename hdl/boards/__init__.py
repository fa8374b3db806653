"""FPGA board builds: the board SoC and the board tops.

* :mod:`hdl.boards.ram` -- on-chip memory standing in for DRAM (AXI4 + AXI4-Lite).
* :mod:`hdl.boards.soc` -- the NPU, that memory and the UART bridge, wired.
* :mod:`hdl.boards.ulx3s` -- the ULX3S (ECP5) board top and its NPU build.

Synthesis and its reports are build tooling, in :mod:`tools.fpga`.
"""
