"""FPGA board builds: the board SoC, the board tops and the open synthesis flow.

* :mod:`hdl.boards.ram` -- on-chip memory standing in for DRAM (AXI4 + AXI4-Lite).
* :mod:`hdl.boards.soc` -- the NPU, that memory and the UART bridge, wired.
* :mod:`hdl.boards.ulx3s`, :mod:`hdl.boards.icebreaker` -- board tops and their configs.
* :mod:`hdl.boards.synth` -- ``python -m hdl.boards.synth --board NAME``: bitstream + report.
* :mod:`hdl.boards.seeds` -- the build's nextpnr runs, side by side with one per seed.
* :mod:`hdl.boards.report` -- the report: the tools' figures read back and written out.
* :mod:`hdl.boards.endpoints`, :mod:`~hdl.boards.depth`, :mod:`~hdl.boards.congestion`,
  :mod:`~hdl.boards.blocks`, :mod:`~hdl.boards.hierarchy` -- finding slow paths and
  where the logic goes (docs/fpga-timing.md).
"""
