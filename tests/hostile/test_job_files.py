"""Every hostile job file: exit 2 within seconds, the exact messages, no traceback, nothing started."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from tests.hostile.job_files import CASES

NAMES = [name for name, _, _ in CASES]
_CLEARED_PREFIXES = ("SMDDP_", "AWS_", "NO_COLOR", "XDG_CONFIG_HOME", "COLUMNS")


def test_the_corpus_is_large_and_named_uniquely() -> None:
    assert len(CASES) >= 100
    assert len(set(NAMES)) == len(NAMES)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith(_CLEARED_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "src" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("name", NAMES)
def test_hostile_job_file(name: str, workdir: Path) -> None:
    _, text, expected = CASES[NAMES.index(name)]
    (workdir / "job.yaml").write_text(text() if callable(text) else text, encoding="utf-8")
    job_root = workdir / "jobs"  # inside the work dir, so a source_dir of "." holds it
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["validate", "job.yaml"], env={"SMDDP_JOB_ROOT": str(job_root)}, catch_exceptions=False)
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert elapsed < 10, f"validation took {elapsed:.1f} s"
    reported = [line for line in result.stderr.splitlines() if line.startswith("job.yaml:")]
    assert reported == [line.replace("{root}", str(job_root)).replace("{work}", str(workdir)) for line in expected]
    assert not job_root.exists(), "nothing may be written when validation fails"
