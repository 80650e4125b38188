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
    result = CliRunner().invoke(cli, ["run", "job.yaml"], env={"SMDDP_JOB_ROOT": str(job_root)}, catch_exceptions=False)
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert elapsed < 10, f"validation took {elapsed:.1f} s"
    reported = [line for line in result.stderr.splitlines() if line.startswith("job.yaml:")]
    assert reported == [line.replace("{root}", str(job_root)).replace("{work}", str(workdir)) for line in expected]
    assert not job_root.exists(), "nothing may be written when validation fails"


def test_settings_from_variables_and_flags_are_read_with_the_same_bounds(workdir: Path) -> None:
    """``SMDDP_HYPERPARAMETERS`` and ``--set`` are YAML too: an alias bomb there is refused as in a file."""
    bomb = "{a0: &a0 [x, x, x, x, x, x, x, x, x, x], " + ", ".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)) + "}"
    started = time.monotonic()
    runner = CliRunner()
    by_env = runner.invoke(cli, ["validate", "--entry-point", "train.py", "--instance-type", "local"], env={"SMDDP_HYPERPARAMETERS": bomb})
    by_flag = runner.invoke(cli, ["validate", "--entry-point", "train.py", "--instance-type", "local", "--set", f"hyperparameters={bomb}"])
    assert time.monotonic() - started < 10
    for result, where in ((by_env, "SMDDP_HYPERPARAMETERS: "), (by_flag, "Error: Invalid value for '--set': ")):
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert any(line.startswith(where) and "aliases expand to more than 100000 values" in line for line in result.stderr.splitlines()), result.stderr


def test_an_endless_file_is_read_only_up_to_the_limit(workdir: Path) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["validate", "/dev/zero"])
    assert time.monotonic() - started < 10
    assert result.exit_code == 2
    assert "/dev/zero:1:1: YAML syntax error: the file is larger than 1048576 bytes, the limit for job files" in result.stderr
    assert "\0" not in result.stderr


def test_a_code_directory_holding_the_job_root_is_snapshotted_without_it(workdir: Path) -> None:
    """``SMDDP_JOB_ROOT=./jobs`` with ``source_dir: .`` used to copy the snapshot into itself until the
    path was too long (a traceback); the snapshot now leaves the job root out."""
    from smddp_sdk.schedulers.job_files import stage_code
    from smddp_sdk.specs.job import JobSpec

    (workdir / "job.yaml").write_text("entry_point: train.py\nsource_dir: .\ninstance_type: local\n")
    result = CliRunner().invoke(cli, ["validate", "job.yaml"], env={"SMDDP_JOB_ROOT": str(workdir / "jobs")})
    assert result.exit_code == 0, result.output
    (workdir / "jobs" / "older-job" / "code").mkdir(parents=True)
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "mod.py").write_text("x = 1\n")
    dest = workdir / "jobs" / "new-job" / "code"
    stage_code(JobSpec.from_mapping({"entry_point": "train.py", "source_dir": ".", "instance_type": "local"}, base_dir=workdir), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["job.yaml", "pkg", "src", "train.py"]
