"""Every malformed job file exits 2, starts nothing, and points at the right line.

Each ``malformed/<case>.yaml`` has a ``<case>.expect`` beside it with one ``LINE: text`` row per problem
the file has: the line it must be reported on and words its message must contain. No other problem may
be reported.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

MALFORMED = Path(__file__).parent / "malformed"
CASES = sorted(path.stem for path in MALFORMED.glob("*.yaml"))


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40
    assert all((MALFORMED / f"{case}.expect").is_file() for case in CASES)


@pytest.fixture
def job_dir(isolated: Path) -> Path:
    """A copy of the malformed folder as cwd, so messages name files as users type them."""
    target = isolated / "jobs"
    shutil.copytree(MALFORMED, target)
    return target


@pytest.mark.parametrize("case", CASES)
def test_malformed_job_is_reported_at_its_line(case: str, job_dir: Path, invoke, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(job_dir)
    expected = [row.partition(": ") for row in (job_dir / f"{case}.expect").read_text().splitlines() if row]
    job_root = job_dir.parent / "job-root"
    result = invoke(f"{case}.yaml", env={"SMDDP_JOB_ROOT": str(job_root)})  # the default command: run
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == "", "nothing may be printed as a result when validation fails"
    for line, _, words in expected:
        reported = [text for text in result.stderr.splitlines() if text.startswith(f"{case}.yaml:{line}:")]
        assert reported, f"no problem reported on line {line}:\n{result.stderr}"
        assert any(words in text for text in reported), f"expected {words!r} on line {line}:\n{result.stderr}"
    count = len(expected)
    assert f"{count} problem{'s' if count > 1 else ''} found." in result.stderr, f"expected {count} problem(s):\n{result.stderr}"
    assert not job_root.exists(), "nothing may be started or written when validation fails"
