"""``make bench-datapath``: datapath figures measured in RTL simulation.

* array MAC utilization streaming a long tile sequence with weight double-buffering
  (Verilator),
* vector-unit elements per cycle (Amaranth's simulator),
* DMA bytes per cycle against the bus width, with and without backpressure (Verilator).
"""

from __future__ import annotations

from bench import bench_array, bench_dma, bench_vector
from bench.common import report


def main():
    figures = {
        "array": bench_array.run(),
        "vector": bench_vector.run(),
        "dma": bench_dma.run(),
    }
    report("datapath", figures)


if __name__ == "__main__":
    main()
