"""Reference pages generated from code must not drift from it."""

from pathlib import Path

from smddp_sdk.specs.instance_types import markdown_table

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_instance_type_table_matches_the_catalogue():
    text = (DOCS / "instance-types.md").read_text()
    assert markdown_table() in text, "regenerate the table in docs/instance-types.md from markdown_table()"
