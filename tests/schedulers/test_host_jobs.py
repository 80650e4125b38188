"""The scheduler side of host-tree jobs: unique names, private job directories, records of older versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.specs.job import JobSpec


def test_two_jobs_in_the_same_millisecond_get_different_names(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    scheduler = LocalScheduler(job_root=tmp_path / "jobs")
    dryrun = scheduler.dryrun(JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local"}))
    first, first_dir = scheduler._claim_job_dir(dryrun)
    second, second_dir = scheduler._claim_job_dir(dryrun)  # the same generated name: taken, so renamed
    assert first.job_name != second.job_name and first_dir != second_dir
    assert second.request.job_dir == second_dir.path and second.request.handle.endswith(second.job_name)
    for job_dir in (first_dir, second_dir):
        assert job_dir.path.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "jobs").stat().st_mode & 0o077 == 0


# job.json as versions before the one schema wrote it: local hosts with a ``base_dir``, docker's ``containers``.
OLD_REQUESTS = {
    "local": {"hosts": [{"host": "algo-1", "base_dir": "algo-1", "command": ["python3", "-m", "smddp_sdk.runtime"], "environment": {}}]},
    "docker": {"containers": [{"host": "algo-1", "name": "old-algo-1", "opt_ml": "algo-1", "argv": ["create"]}], "backend": "container"},
}


@pytest.mark.parametrize("scheduler", ["local", "docker"])
def test_a_job_written_by_an_older_version_says_so_and_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheduler: str) -> None:
    job_dir = tmp_path / "jobs" / ("docker" if scheduler == "docker" else "") / "old-job"  # docker jobs have a root of their own
    job_dir.mkdir(parents=True)
    request = {"job_name": "old-job", "handle": f"{scheduler}://old-job", "job_dir": str(job_dir), **OLD_REQUESTS[scheduler]}
    (job_dir / "job.json").write_text(json.dumps({"handle": request["handle"], "job_name": "old-job", "spec": {}, "request": request}))
    (job_dir / "state.json").write_text(json.dumps({"state": "SUCCEEDED"}))
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    for command in ("status", "logs", "cancel"):
        result = CliRunner().invoke(cli, [command, f"{scheduler}://old-job"])
        assert result.exit_code == 2, (command, result.output)
        assert "written by an older smddp-sdk" in result.stderr and f"rm -rf {job_dir}" in result.stderr, result.stderr
    # clean, named, is the way out: it removes the directory it cannot describe, saying why
    result = CliRunner().invoke(cli, ["clean", f"{scheduler}://old-job"])
    assert result.exit_code == 0 and "written by an older smddp-sdk" in result.output, result.output
    assert not job_dir.exists()
