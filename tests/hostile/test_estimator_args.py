"""Bad estimator arguments raise ``SpecError`` (exit 2) at construction with the exact issues; nothing is
written or started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import EXIT_SPEC, SpecError
from tests.hostile.estimator_args import BASE, CASES

NAMES = [name for name, _, _ in CASES]


def test_the_corpus_is_large_and_named_uniquely() -> None:
    assert len(CASES) >= 40
    assert len(set(NAMES)) == len(NAMES)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith(("SMDDP_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", NAMES)
def test_bad_estimator_arguments(name: str, workdir: Path) -> None:
    _, arguments, expected = CASES[NAMES.index(name)]
    with pytest.raises(SpecError) as caught:
        PyTorch(**{**BASE, **arguments})
    assert caught.value.exit_code == EXIT_SPEC
    assert [str(issue) for issue in caught.value.issues] == expected
    assert not (workdir / "jobs").exists()
