"""The hardware-profile database: the NPU builds the host knows by name.

A hardware profile is an :class:`~firmware.config.NPUConfig` (the NPU build) behind a
memory. A running device reports its build (the driver reads CAPS into
``NPUDriver.config``); this module names the known builds so programs can be compiled
ahead of time for a device that is not attached (``npu precompile --profile NAME``) and
so a cache can say which build an entry was compiled for.

The memory's latency is not the build's: CAPS do not report it, and the compiler plans
without it (for the build alone), as a static compiler does. :data:`DRAM_LATENCY` names
the slow memories of the simulated profiles; ``slowmem`` is the default build behind
one (``npu run MODEL --profile slowmem``, ``python -m bench.models --config slowmem``),
where only measurement shows what the latency costs.

:func:`profile_key` is what the compiled-unit cache keys on: two devices that
report the same CAPS share every compiled program. :func:`measured_key` is what
measurements key on: the build and the memory's latency where the host knows it.
"""

from __future__ import annotations

import hashlib
import json

from firmware.bursts import DramLatency
from firmware.config import CONFIGS, NPUConfig

PROFILES: dict[str, NPUConfig] = {
    "default": CONFIGS["default"],
    "small": CONFIGS["small"],
    # The ULX3S board build (hdl/boards/ulx3s.py): the small build, the one that meets
    # timing in a routed build (profile_name() reports it as "small").
    "ulx3s": CONFIGS["small"],
    # The default build behind a slow DRAM (DRAM_LATENCY): the same CAPS and programs.
    "slowmem": CONFIGS["default"],
}
"""Known hardware profiles by name (insertion order: the preferred name first)."""

DRAM_LATENCY: dict[str, DramLatency] = {
    # A DRAM controller behind an interconnect that serves one burst at a time: 64
    # cycles to a read burst's first beat, 64 to a write burst's response.
    "slowmem": DramLatency(read=64, write=64),
}
"""The simulated memory's extra latency per profile; a profile not listed has the
simulation's AxiRam (no extra latency)."""


def profile_key(config: NPUConfig) -> str:
    """A stable digest of every field of ``config`` (16 hex digits).

    Equal configurations (two devices reporting the same CAPS) give the same
    key; a change to any field gives another. The key does not depend on the
    Python process, the field order or the profile's name.
    """
    if not isinstance(config, NPUConfig):
        raise TypeError(f"expected an NPUConfig, got {type(config).__name__}")
    text = json.dumps(sorted(config.as_dict().items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measured_key(config: NPUConfig, latency: DramLatency | None = None) -> str:
    """What measurements on a device are keyed by: :func:`profile_key` of its build
    and, where the host knows of one (``--profile slowmem``), the extra latency of its
    memory, which CAPS do not report. Programs are the same behind either memory;
    their measured cycles are not (``default`` and ``slowmem`` get different keys).
    """
    key = profile_key(config)
    if latency is None or not (latency.read or latency.write):
        return key
    return f"{key}+dram{latency.read}/{latency.write}"


def timing_key() -> str:
    """A digest of the hardware's timing as the golden model knows it (16 hex digits).

    CAPS name a build's shape, not its timing: an RTL change that moves a cycle
    (a pipeline stage, a latency) keeps the profile key. The golden cost model
    takes the RTL's cycles where its runs say exact (tests/test_golden.py), so its
    parameters change with the timing. Saved runtime profiles are keyed on this
    too: timings measured under another revision would steer the plan wrong.
    """
    from dataclasses import asdict

    from firmware.golden import CostModel

    text = json.dumps(sorted(asdict(CostModel()).items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def profile(name: str) -> NPUConfig:
    """The known profile called ``name``; ``KeyError`` lists the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"no hardware profile {name!r}; known profiles: "
                       f"{', '.join(PROFILES)}") from None


def dram_latency(name: str) -> DramLatency:
    """The simulated memory latency of the known profile called ``name`` (none for most:
    the simulation's AxiRam); ``KeyError`` as :func:`profile`."""
    profile(name)
    return DRAM_LATENCY.get(name, DramLatency())


def profile_name(config: NPUConfig) -> str | None:
    """The name of a known profile equal to ``config``, or None.

    When several names share one configuration, the first registered wins
    (``ulx3s`` is the ``small`` build).
    """
    key = profile_key(config)
    return next((name for name, c in PROFILES.items() if profile_key(c) == key), None)
