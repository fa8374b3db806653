"""The saved adaptive report (``npu report MODEL --json``) names no key that
docs/runtime.md's "The saved report" table does not document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from host import cli
from host.adaptive.bottleneck import CAUSE_FIELDS, Bottleneck
from host.adaptive.saved import REPORT_SCHEMA, Maybe
from host.adaptive.specialize_units import Trial
from host.compiler.variants import DEFAULT as NO_VARIANT

DOC = Path(__file__).resolve().parent.parent / "docs" / "runtime.md"
SECTION = "### The saved report (`npu report MODEL --json`)"


def documented() -> list[re.Pattern]:
    """The key paths the table names, as patterns (``<...>``: any one key)."""
    text = DOC.read_text()
    assert SECTION in text, f"docs/runtime.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    paths = {tok for line in body.splitlines() if line.startswith("| `")
             for tok in re.findall(r"`([a-z_]+(?:\[\]|\.[a-z_]+|\.<[A-Za-z]+>)*)`", line)}
    paths |= {p.removesuffix("[]") for p in paths}  # `units[]` names the list `units` too
    return [re.compile("^" + re.sub(r"<[A-Za-z]+>", "[^.]+", re.escape(p)) + "$")
            for p in paths]


def key_paths(value, prefix: str = ""):
    """Every key path of a JSON value (``[]`` for a list's items)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from key_paths(sub, path)
    elif isinstance(value, list):
        for item in value:
            yield from key_paths(item, f"{prefix}[]")


def schema_paths(schema, prefix: str = ""):
    """The key paths of a reader's schema (host/adaptive/saved.py)."""
    if isinstance(schema, Maybe):
        yield from schema_paths(schema.schema, prefix)
    elif isinstance(schema, dict):
        for key, sub in schema.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from schema_paths(sub, path)
    elif isinstance(schema, list):
        yield from schema_paths(schema[0], f"{prefix}[]")


def undocumented(paths) -> list[str]:
    known = documented()
    return sorted({p for p in paths if not any(k.match(p) for k in known)})


def test_the_table_reads_as_key_paths():
    known = documented()
    assert len(known) > 100
    assert any(k.match("batch_sizes.4") for k in known)  # a data key
    assert not any(k.match("no_such_key") for k in known)


def test_every_key_the_reader_checks_is_documented():
    assert undocumented(schema_paths(REPORT_SCHEMA)) == []


def test_every_key_of_a_specializer_trial_is_documented():
    counts = dict.fromkeys(CAUSE_FIELDS, 0.0)
    trial = Trial(("fc1",), NO_VARIANT, NO_VARIANT, Bottleneck("memory", counts),
                  (100.0, counts), [(90.0, counts)], "kept")
    assert undocumented(key_paths({"specializations": [trial.as_dict()]})) == []


def test_every_key_of_a_saved_report_is_documented(tmp_path, monkeypatch, capsys):
    """A run with batching, speculation, the specializer and the sparsity profile on
    saves a report with every section filled; each key is in the table."""
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    assert cli.main(["run", "moe", "--adaptive", "--inline-compile", "--specialize",
                     "--sparsity", "--digits", "16", "--batch", "4"]) == cli.ExitCode.OK
    capsys.readouterr()
    assert cli.main(["report", "moe", "--json"]) == cli.ExitCode.OK
    rep = json.loads(capsys.readouterr().out)
    assert rep["batch_sizes"] and rep["sparsity"] and rep["costgraph"]["nodes"]
    assert undocumented(key_paths(rep)) == []


@pytest.mark.parametrize("bad", ["swaps_total", "costgraph.nodes[].watts"])
def test_an_unnamed_key_is_caught(bad):
    assert undocumented([bad]) == [bad]
