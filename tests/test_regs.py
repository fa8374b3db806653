"""The CSR map definition is consistent for every configuration."""

import dataclasses

import pytest

from firmware import regs
from firmware.config import CONFIGS, NPUConfig


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_register_map_is_consistent(name):
    config = CONFIGS[name]
    rs = regs.registers(config)
    addrs = [r.addr for r in rs]
    assert len(set(addrs)) == len(addrs)
    assert all(a % 4 == 0 and a < 0x1000 for a in addrs)
    names = regs.addresses(config)
    for cname in regs.counter_names(config):
        assert names[f"CNT_{cname.upper()}_HI"] == names[f"CNT_{cname.upper()}_LO"] + 4
    for r in rs:
        for f in r.fields:
            assert 0 <= f.lo and f.lo + f.bits <= 32, (r.name, f.name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_caps_round_trip(name):
    config = CONFIGS[name]
    values = {f"CAPS_{f.name.upper()}": getattr(config, f.name)
              for f in dataclasses.fields(NPUConfig)}
    assert regs.caps_to_config(values) == config


def test_counters_match_golden_model():
    from firmware.golden import Machine

    golden = Machine().counters
    for name, _ in regs.COUNTERS:
        assert name in golden, name
    assert set(golden) - {n for n, _ in regs.COUNTERS} == {"tag_hits", "tag_misses"}
