"""The NPU's Verilator model with a C++ DRAM and driver, as a shared library.

``python -m verif.fastsim.build --config NAME`` builds it (or finds it cached) and
prints its path; :class:`host.verilator_device.VerilatorDevice` loads it with ctypes.
See harness.cpp for the C ABI and the timing model.

:func:`run_scenario` is the fast counterpart of :func:`verif.rtl_device.run_scenario`:
the same host scenario (``fn(device, config, seed)``) on the same RTL, in this process,
with no Python per clock cycle.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from firmware.bursts import DramLatency
from firmware.config import CONFIGS, NPUConfig

DRAM_BYTES = 1 << 20  # as the cocotb testbench's AxiRam (verif.rtl_device.DRAM_BYTES)


@contextlib.contextmanager
def _environment(extra: dict | None) -> Iterator[None]:
    """Scenarios read their knobs from the environment, as they do in the simulator."""
    saved = {k: os.environ.get(k) for k in extra or {}}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def open_device(config: NPUConfig | str = "default", *, dram_bytes: int = DRAM_BYTES,
                backpressure: bool = False, seed: int = 0, profiled: bool = False,
                dram_latency: DramLatency | None = None):
    """A fresh :class:`~host.verilator_device.VerilatorDevice` for ``config`` (built in
    this process when needed; profile-guided if asked, see :mod:`.build`), with DRAM
    backpressure on 30 % of the cycles if asked, and a slow DRAM's ``dram_latency``."""
    from host.verilator_device import VerilatorDevice

    from .build import build

    config = CONFIGS[config] if isinstance(config, str) else config
    device = VerilatorDevice(build(config, profiled=profiled), dram_bytes=dram_bytes,
                             dram_latency=dram_latency)
    if backpressure:
        device.set_backpressure(seed, 30)
    return device


def run_scenario(spec: str, config: NPUConfig | str = "default", *, seed: int = 0,
                 backpressure: bool = False, extra_env: dict | None = None,
                 profiled: bool = False, dram_latency: DramLatency | None = None) -> None:
    """Run the host scenario ``"package.module:function"`` on the fast RTL model
    (profile-guided if asked; with a slow DRAM's ``dram_latency`` if given).

    The function receives the device, the configuration and the seed, and raises on a
    mismatch (see :func:`verif.rtl_device.run_scenario`).
    """
    from verif.rtl_device import scenario_function

    config = CONFIGS[config] if isinstance(config, str) else config
    device = open_device(config, backpressure=backpressure, seed=seed, profiled=profiled,
                         dram_latency=dram_latency)
    try:
        with _environment(extra_env):
            scenario_function(spec)(device, config=config, seed=seed)
    finally:
        device.close()
