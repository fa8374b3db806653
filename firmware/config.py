"""NPU configuration parameters, shared by the golden model, the RTL and the host.

The host never imports this to learn the hardware: it reads the same numbers back
from the device's CAPS registers. This module is where they are defined.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class NPUConfig:
    """One NPU build.

    Parameters
    ----------
    rows, cols : systolic array size (reduction rows x output columns).
    sp_bytes : scratchpad size in bytes.
    sp_banks : scratchpad SRAM banks, word-interleaved (bandwidth; invisible to
        programs). A power of two >= 2.
    acc_rows : accumulator rows, each ``cols`` int32 wide.
    partitions : partition-table entries per table.
    pt_sets : partition tables per instruction bank (selected by ``ptsel``).
    tag_slots : tile-tag slots (numbered 1..tag_slots in ``load``).
    imem_depth : instructions per instruction bank (two banks).
    bus_bytes : AXI4 data width in bytes.
    loop_depth : hardware loop stack depth.
    region_depth : region-mark nesting depth.
    trace_depth : region-trace FIFO entries.
    queue_depth : entries in each of the load / compute / store queues.
    dw_rows : input rows the depthwise engine (``dwload``/``dwconv``) holds per
        column, 3..16; 0 builds no depthwise engine (its instructions are then
        BAD_OPERAND).
    acc_ports : read ports of the accumulator buffer, 1 or 2. With 1 the array and
        the vector unit take turns; with 2 (the buffer held twice, one copy read by
        each) a ``gemm`` or ``wload`` runs while a ``vreq``/``vreqb`` requantizes
        other accumulator rows into scratchpad bytes it does not read.
    """

    rows: int = 8
    cols: int = 8
    sp_bytes: int = 64 * 1024
    sp_banks: int = 8
    acc_rows: int = 1024
    partitions: int = 8
    pt_sets: int = 2
    tag_slots: int = 16
    # 2048-deep banks: MobileNetV1-0.25's program (1,923 instructions) fits one bank
    # (docs/compiler.md, "Program size").
    imem_depth: int = 2048
    bus_bytes: int = 8
    loop_depth: int = 4
    region_depth: int = 4
    trace_depth: int = 64
    queue_depth: int = 8
    dw_rows: int = 10
    acc_ports: int = 2

    def __post_init__(self):
        def need(cond, name, why):
            if not cond:
                raise ValueError(f"NPUConfig.{name}={getattr(self, name)!r}: {why}")

        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "dw_rows":  # 0: no depthwise engine
                need(isinstance(v, int) and (v == 0 or 3 <= v <= 16), f.name,
                     "must be 0 (no depthwise engine) or 3..16")
                continue
            need(isinstance(v, int) and v > 0, f.name, "must be a positive integer")
        need(self.acc_ports in (1, 2), "acc_ports", "must be 1 or 2")
        need(self.rows <= 256, "rows", "array dimensions are at most 256")
        need(self.cols <= 256, "cols", "array dimensions are at most 256")
        need(self.bus_bytes in (4, 8, 16, 32, 64), "bus_bytes", "must be 4, 8, 16, 32 or 64")
        need(self.sp_banks >= 2 and self.sp_banks & (self.sp_banks - 1) == 0, "sp_banks",
             "must be a power of two >= 2 (a byte window spans two banks)")
        need(self.sp_bytes % (self.sp_banks * self.bus_bytes) == 0, "sp_bytes",
             "must divide into sp_banks words of bus_bytes")
        need(self.rows <= self.bus_bytes, "rows",
             f"at most bus_bytes={self.bus_bytes} (one scratchpad window per array row)")
        need(self.cols <= self.bus_bytes, "cols",
             f"at most bus_bytes={self.bus_bytes} (one scratchpad window per output row)")
        need(self.partitions <= 8, "partitions", "at most 8 (3-bit partition fields)")
        need(self.pt_sets <= 4, "pt_sets", "at most 4 (2-bit ptsel field)")
        need(self.tag_slots <= 63, "tag_slots", "at most 63 (6-bit tag fields)")
        need(self.imem_depth <= 1 << 16, "imem_depth", "at most 65536 (16-bit targets)")
        need(self.sp_bytes <= 1 << 24, "sp_bytes", "at most 16 MiB")

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.rows * self.cols

    def as_dict(self) -> dict:
        return asdict(self)


CONFIGS = {
    "default": NPUConfig(),
    # 1024-deep banks: the FC autoencoder's program (806 instructions) fits one bank, at
    # 5 more DP16KD block RAMs than 512 (docs/compiler.md, "Program size").
    # One accumulator read port: a second copy of its buffer costs block RAM the board
    # needs elsewhere (docs/hardware.md, "Accumulator").
    "small": NPUConfig(rows=4, cols=4, sp_bytes=16 * 1024, sp_banks=4, acc_rows=256,
                       partitions=4, tag_slots=8, imem_depth=1024, trace_depth=32, dw_rows=0,
                       acc_ports=1),
}
"""Named configurations; the FPGA board configs join them with their board tops."""

