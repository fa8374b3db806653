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


def test_field_helpers_follow_the_map():
    from firmware.regs import field_mask, pack_fields, unpack_fields

    assert field_mask("STATUS", "busy") == 1 and field_mask("IMEM_ADDR", "bank") == 1 << 31
    word = pack_fields("PT_SELECT", partition=5, set=1, bank=1)
    assert word == 5 | (1 << 8) | (1 << 31)
    assert unpack_fields("PT_SELECT", word) == {"partition": 5, "set": 1, "bank": 1}
    with pytest.raises(KeyError, match="no field"):
        field_mask("STATUS", "nope")
    with pytest.raises(ValueError, match="does not fit"):
        pack_fields("PT_SELECT", partition=8)
