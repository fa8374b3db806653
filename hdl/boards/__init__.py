"""FPGA board builds: the board SoC, the board tops and the open synthesis flow.

* :mod:`hdl.boards.ram` -- on-chip memory standing in for DRAM (AXI4 + AXI4-Lite).
* :mod:`hdl.boards.soc` -- the NPU, that memory and the UART bridge, wired.
* :mod:`hdl.boards.ulx3s`, :mod:`hdl.boards.icebreaker` -- board tops and their configs.
* :mod:`hdl.boards.synth` -- ``python -m hdl.boards.synth --board NAME``: bitstream + report.
"""
