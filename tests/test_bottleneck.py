"""host.adaptive.bottleneck: the class of a unit's bottleneck from the counters by cause."""

import pytest

from host.adaptive.bottleneck import BUSY_SHARE, CAUSE_FIELDS, CONFLICT_SHARE, classify


def _counts(**kw):
    return {f: kw.get(f, 0) for f in CAUSE_FIELDS}


@pytest.mark.parametrize("counts, kind", [
    (_counts(busy_load=82, busy_array=31), "memory"),
    (_counts(busy_store=60, busy_vector=40), "memory"),
    (_counts(busy_array=90, busy_load=50), "compute"),
    (_counts(busy_vector=70), "compute"),
    (_counts(busy_array=49, busy_load=49), "overhead"),  # nothing busy half the time
    (_counts(), "overhead"),
    (_counts(busy_array=95, sp_conflicts=10), "conflict"),  # conflicts win over busy
    (_counts(busy_array=95, sp_conflicts=9), "compute"),
])
def test_classes(counts, kind):
    got = classify(100, counts)
    assert got.kind == kind
    assert got.shares["busy_load"] == counts["busy_load"] / 100
    assert got.describe().startswith(f"{kind}-bound (")


def test_thresholds_are_the_documented_ones():
    assert classify(100, _counts(busy_load=100 * BUSY_SHARE)).kind == "memory"
    assert classify(100, _counts(busy_array=100 * BUSY_SHARE - 1)).kind == "overhead"
    assert classify(100, _counts(sp_conflicts=100 * CONFLICT_SHARE)).kind == "conflict"


def test_describe_names_the_busiest_engines():
    assert classify(100, _counts(busy_load=82, busy_array=31)).describe() == \
        "memory-bound (load 82%, array 31%)"


def test_no_cycles_is_overhead():
    assert classify(0, _counts()).kind == "overhead"


def test_bad_input():
    with pytest.raises(ValueError, match="missing: sp_conflicts"):
        classify(10, {f: 0 for f in CAUSE_FIELDS[:-1]})
    with pytest.raises(ValueError, match="negative"):
        classify(10, _counts(busy_load=-1))
