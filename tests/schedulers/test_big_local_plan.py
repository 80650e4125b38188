"""A plan of many hosts answers in seconds: summarised, or refused with the limit and why (issue 35 point 5: a
local dry run of 1000 hosts took 105 s, 353 MB and printed 80 MB).

Local mode runs every simulated host on this machine, a runtime and its ranks each: 1000 hosts are more
processes than it may start (``limits.MAX_LOCAL_PROCESSES``), 500 are planned and shown summarised; docker
plans 1000; more than ``limits.MAX_INSTANCE_COUNT`` hosts no job may have. The bound is generous (15 s on a
loaded 2-core machine; about 2 s idle, most of it Python starting up)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs import limits
from smddp_sdk.specs.job import JobSpec

BOUND_SECONDS = 15.0
SHOWN_BYTES = 64 * 1024  # what the dry run prints: a summary, not every host's files


def dryrun(tmp_path: Path, hosts: int) -> tuple[subprocess.CompletedProcess[str], float]:
    """``smddp-launch --dryrun`` of ``hosts`` local hosts, one rank each, and how long it took."""
    (tmp_path / "train.py").write_text("print('hello')\n")
    env = {**os.environ, "SMDDP_JOB_ROOT": str(tmp_path / "jobs")}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "smddp_sdk.cli", "run", "--dryrun", "--instance-type", "local", "--instance-count", str(hosts), "train.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert not (tmp_path / "jobs").exists()  # a dry run writes nothing
    return result, time.monotonic() - started


def test_a_local_dry_run_of_500_hosts_answers_in_seconds_with_a_summary(tmp_path: Path) -> None:
    result, seconds = dryrun(tmp_path, 500)
    assert result.returncode == 0, result.stderr
    assert seconds < BOUND_SECONDS, f"{seconds:.1f} s"
    assert len(result.stdout.encode()) < SHOWN_BYTES, len(result.stdout)
    assert '"algo-500"' in result.stdout and "... 497 more hosts like these ..." in result.stdout
    assert "500 hosts: the dry run shows the first and last ones; the job's record keeps every one" in result.stdout


def test_a_local_dry_run_of_1000_hosts_is_refused_at_once_with_the_limit_and_why(tmp_path: Path) -> None:
    result, seconds = dryrun(tmp_path, 1000)
    assert result.returncode == 2 and seconds < BOUND_SECONDS, (result.returncode, seconds)
    assert (f"instance_count: 1000 hosts x (1 runtime + 1 rank) plan 2000 processes, and every simulated host runs on this machine; "
            f"the limit is {limits.MAX_LOCAL_PROCESSES} (use fewer hosts or ranks per host, or scheduler='sagemaker')") in result.stderr


@pytest.mark.parametrize("hosts", [limits.MAX_INSTANCE_COUNT + 1, 5000])
def test_more_hosts_than_a_job_may_have_are_refused_at_once_with_the_limit(tmp_path: Path, hosts: int) -> None:
    result, seconds = dryrun(tmp_path, hosts)
    assert result.returncode == 2 and seconds < BOUND_SECONDS, (result.returncode, seconds)
    assert f"instance_count: must be at most {limits.MAX_INSTANCE_COUNT}, got {hosts} (split the work into several jobs)" in result.stderr


def test_a_docker_plan_of_1000_hosts_is_made_in_seconds(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hello')\n")
    spec = JobSpec.from_mapping({"entry_point": str(tmp_path / "train.py"), "instance_type": "local", "instance_count": 1000})
    started = time.monotonic()
    planned = DockerScheduler(job_root=tmp_path / "jobs").dryrun(spec)
    shown = planned.render()
    assert time.monotonic() - started < BOUND_SECONDS
    assert len(planned.request.hosts) == 1000 and len(shown.encode()) < SHOWN_BYTES
