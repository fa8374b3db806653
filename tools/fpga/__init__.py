"""FPGA builds with the open flow (Yosys, nextpnr and the packers from PyPI).

* :mod:`tools.fpga.synth` -- ``make synth``: the ULX3S bitstream and its report.
* :mod:`tools.fpga.report` -- the tools' figures read back and the report written.
* :mod:`tools.fpga.hierarchy` -- ``make synth-hierarchy``: the NPU's cells by block.

The board tops themselves are gateware and live in :mod:`hdl.boards`.
"""
