"""Build tooling that is not gateware (``tools.fpga``: FPGA synthesis and its reports)."""
