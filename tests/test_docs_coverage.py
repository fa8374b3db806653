"""docs/compiler.md's operator x format x device x test table is what the importer does."""

import pytest

from verif import coverage


@pytest.fixture(scope="module")
def table():
    return coverage.render()


def test_coverage_table_is_current(table):
    committed = coverage.current_section(coverage.DOC.read_text())
    assert committed == table, \
        "docs/compiler.md's coverage table is stale: run python -m verif.coverage --write"


def test_table_has_every_format_and_integer_op(table):
    for fmt in coverage.FORMATS:
        assert f"| {fmt} |" in table, fmt
    for op in ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger",
               "`com.microsoft` `QLinearConcat`", "`com.microsoft` `QLinearGlobalAveragePool`",
               "`com.microsoft` `QLinearAveragePool`"):
        assert op in table, op
