"""Fixtures for the CLI tests: an isolated environment, a click runner, and golden-file checks.

Golden files live in tests/cli/golden/. After an intended output change, rewrite them with
``SMDDP_UPDATE_GOLDEN=1 python3 -m pytest tests/cli`` and review the diff.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from smddp_sdk.cli.main import cli

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_ENV = "SMDDP_UPDATE_GOLDEN"
UPDATE_GOLDEN = os.environ.get(UPDATE_ENV) == "1"  # read at import: the isolated fixture clears SMDDP_*
_CLEARED_PREFIXES = ("SMDDP_", "AWS_", "NO_COLOR", "XDG_CONFIG_HOME", "COLUMNS")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cwd and HOME, with no SMDDP_*/AWS_* variables and no user config leaking in."""
    for name in list(os.environ):
        if name.startswith(_CLEARED_PREFIXES):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work


@pytest.fixture
def invoke(isolated: Path):
    """Run smddp-launch in-process; returns click's Result (stdout and stderr kept apart)."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(cli, list(args), input=input, env=env, catch_exceptions=False, terminal_width=100)

    return run


def normalise(text: str, *replacements: tuple[str, str]) -> str:
    """Make output stable across machines: given paths become placeholders, timestamps are masked."""
    for old, new in replacements:
        text = text.replace(old, new)
    text = re.sub(r"\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{3}", "<timestamp>", text)
    return re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", "<time>", text)


def assert_golden(name: str, text: str) -> None:
    """Compare with tests/cli/golden/<name>; rewrite it instead when SMDDP_UPDATE_GOLDEN=1."""
    path = GOLDEN_DIR / name
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"golden file {name} is missing; create it with {UPDATE_ENV}=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"output differs from golden/{name}; if intended, rerun with {UPDATE_ENV}=1 and review the diff"
