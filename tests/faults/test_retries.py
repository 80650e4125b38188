"""max_retry_attempts in local mode, with SageMaker's rule: the platform's failures are retried, the
script's are not (unless retry_script_errors). Real jobs of 2 hosts x 1 rank, no torch (``-m faults``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.cli.cmd_jobs import render_status
from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.hosttree.attempts import Interruption
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus

SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]


def submit(tmp_path: Path, *, retry_script_errors: bool = False, **spec: Any) -> tuple[LocalScheduler, JobHandle]:
    scheduler = LocalScheduler(job_root=tmp_path / "jobs", processes_per_host=1, stop_grace_period=3, retry_script_errors=retry_script_errors)
    base = {"entry_point": "no_checkpoints.py", "source_dir": str(SCRIPTS), "instance_type": "local", "instance_count": 2, "max_run": 300}
    return scheduler, scheduler.submit(JobSpec.from_mapping({**base, **spec}))


def wait(scheduler: LocalScheduler, handle: JobHandle, until: Any, timeout: float = 120.0) -> JobStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = scheduler.status(handle)
        if until(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"timed out: {scheduler.status(handle)}")


def statuses(status: JobStatus) -> list[str]:
    return [item.status for item in status.transitions]


def test_a_killed_runtime_is_retried_and_a_script_without_checkpoints_is_warned(tmp_path: Path) -> None:
    scheduler, handle = submit(tmp_path, max_retry_attempts=1, hyperparameters={"seconds": 4})
    running = wait(scheduler, handle, lambda s: s.state is JobState.RUNNING and all(h.state is JobState.RUNNING for h in s.hosts))
    state = (tmp_path / "jobs" / handle.job_id / "state.json").read_text()
    pid = __import__("json").loads(state)["hosts"]["algo-2"]["pid"]
    os.kill(pid, signal.SIGKILL)
    status = wait(scheduler, handle, lambda s: s.state.is_terminal)
    assert running.attempt == 1 and running.retries_left == 1
    assert status.state is JobState.SUCCEEDED, status
    assert status.attempt == 2 and status.retries_left == 0
    assert [a.outcome for a in status.attempts] == ["Restarting", "Completed"]
    assert "SIGKILL" in status.attempts[0].reason
    assert statuses(status) == ["Starting", "Training", "Restarting", "Starting", "Training", "Uploading", "Completed"]
    log = "\n".join(line.text for line in scheduler.logs(handle))
    assert "attempt 2 starts the script from scratch" in log
    assert "Billable seconds:" not in log  # nothing is billed here; only a spot rehearsal prints SageMaker's billing lines
    shown = render_status(status, color=False)
    assert "attempt 2, interruptions 0; training seconds" in shown and " Restarting " in shown


def test_a_failing_script_is_not_retried(tmp_path: Path) -> None:
    scheduler, handle = submit(tmp_path, max_retry_attempts=2, hyperparameters={"seconds": 0, "fail": 1})
    status = wait(scheduler, handle, lambda s: s.state.is_terminal)
    assert status.state is JobState.FAILED
    assert status.attempt == 1
    assert "ValueError" in status.message
    with pytest.raises(SpecError, match="does not use spot instances"):
        scheduler.interrupt(handle, Interruption("algo-2"))


def test_retry_script_errors_retries_a_failing_script_up_to_max_retry_attempts(tmp_path: Path) -> None:
    scheduler, handle = submit(tmp_path, retry_script_errors=True, max_retry_attempts=1, hyperparameters={"seconds": 0, "fail": 1})
    status = wait(scheduler, handle, lambda s: s.state.is_terminal)
    assert status.state is JobState.FAILED
    assert [a.outcome for a in status.attempts] == ["Restarting", "Failed"]
    assert (tmp_path / "jobs" / handle.job_id / "attempt-1" / "algo-1" / "output").is_dir()  # the first attempt's records kept


def test_max_wait_bounds_every_attempt_together(tmp_path: Path) -> None:
    scheduler, handle = submit(tmp_path, use_spot_instances=True, max_run=2, max_wait=2, hyperparameters={"seconds": 30})
    status = wait(scheduler, handle, lambda s: s.state.is_terminal)
    assert status.state is JobState.FAILED
    assert status.message.startswith("MaxWaitTimeExceeded"), status.message
    assert statuses(status)[-1] == "MaxWaitTimeExceeded"
    with pytest.raises(SpecError, match="is not running"):
        scheduler.interrupt(handle, Interruption())


def test_interrupt_after_reclaims_every_instance_at_the_planned_time_and_the_job_resumes(tmp_path: Path) -> None:
    scheduler = LocalScheduler(job_root=tmp_path / "jobs", processes_per_host=1, stop_grace_period=3, interrupt_after=[2])
    base = {"entry_point": "no_checkpoints.py", "source_dir": str(SCRIPTS), "instance_type": "local", "instance_count": 2}
    spec = JobSpec.from_mapping({**base, "use_spot_instances": True, "max_run": 120, "max_wait": 240, "hyperparameters": {"seconds": 4}})
    assert scheduler.dryrun(spec).request.spot.interrupt_after == (2.0,)
    handle = scheduler.submit(spec)
    status = wait(scheduler, handle, lambda s: s.state.is_terminal)
    assert status.state is JobState.SUCCEEDED, status
    assert [a.outcome for a in status.attempts] == ["Interrupted", "Completed"]
    assert statuses(status)[:4] == ["Starting", "Training", "Interrupted", "Starting"]
