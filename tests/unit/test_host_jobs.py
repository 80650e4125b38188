"""The scheduler side of host-tree jobs: unique names, private job directories."""

from __future__ import annotations

from pathlib import Path

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
    assert second.request["job_dir"] == str(second_dir.path) and second.request["handle"].endswith(second.job_name)
    for job_dir in (first_dir, second_dir):
        assert job_dir.path.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "jobs").stat().st_mode & 0o077 == 0
