"""Generated documents must match their sources."""

from pathlib import Path

from firmware import docgen, isa

ROOT = Path(__file__).resolve().parent.parent


def test_generated_docs_are_current():
    for name, render in docgen.DOCS.items():
        committed = (ROOT / "docs" / name).read_text()
        assert committed == render(), f"docs/{name} is stale: run `make docs`"


def test_isa_doc_names_every_instruction_and_error():
    text = docgen.render()
    for spec in isa.SPECS:
        assert f"#### {spec.mnemonic}\n" in text
    for code in isa.ErrorCode:
        assert f"`{code.name}`" in text
