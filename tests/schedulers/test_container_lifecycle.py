"""The docker scheduler's whole lifecycle -- supervisor, container backend, status, cancel -- against a
fake docker CLI (tests/schedulers/fake_docker.py), so it runs in the default suite without an engine."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState

FAKE = Path(__file__).with_name("fake_docker.py")


@pytest.fixture()
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DockerScheduler:
    state = tmp_path / "engine"
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return DockerScheduler(job_root=tmp_path / "jobs", docker=str(cli), image="fake:1", processes_per_host=1, stop_grace_period=2)


def submit(scheduler: DockerScheduler, tmp_path: Path, name: str, **environment: str) -> JobHandle:
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('never run by the fake engine')\n")
    spec = JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(code), "instance_type": "local",
                                 "instance_count": 2, "job_name": name, "environment": environment})
    return scheduler.submit(spec)


def engine_objects(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "engine").glob("*.json"))


def test_a_successful_job_runs_is_logged_collected_and_cleaned_up(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = submit(scheduler, tmp_path, "fake-ok", FAKE_RUN="exit:0:0.2")
    status = scheduler.wait(handle, poll=0.1, timeout=60)
    assert status.state is JobState.SUCCEEDED, status
    assert Path(status.model_data or "").is_file()
    lines = [(line.host, line.rank, line.text) for line in scheduler.logs(handle)]
    assert ("algo-2", 0, "fake container of fake-ok running") in lines
    assert ("algo-1", None, "a line without a prefix") in lines
    assert engine_objects(tmp_path) == []  # containers and network removed
    job_dir = tmp_path / "jobs" / "fake-ok"
    assert oct(job_dir.stat().st_mode & 0o777) == "0o700" and (job_dir / "job.json").stat().st_mode & 0o077 == 0


def test_a_container_killed_by_the_engine_is_the_root_cause(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = submit(scheduler, tmp_path, "fake-oom", FAKE_RUN="sleep", FAKE_RUN_ALGO_2="die:0.3")
    status = scheduler.wait(handle, poll=0.1, timeout=60)
    assert status.state is JobState.FAILED
    assert status.failure is not None
    assert (status.failure.host, status.failure.rank, status.failure.exit_code, status.failure.signal) == ("algo-2", None, 137, "SIGKILL")
    assert [(h.host, h.exit_code) for h in status.hosts] == [("algo-1", 143), ("algo-2", 137)]  # algo-1 was stopped
    assert engine_objects(tmp_path) == []


def test_cancel_stops_the_containers_and_records_it(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = submit(scheduler, tmp_path, "fake-cancel", FAKE_RUN="sleep")
    deadline = time.monotonic() + 60
    while scheduler.status(handle).state is not JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    scheduler.cancel(handle)
    assert scheduler.status(handle).state is JobState.CANCELLED
    assert engine_objects(tmp_path) == []
    scheduler.cancel(handle)  # idempotent


def test_cancel_without_a_supervisor_removes_the_containers_itself(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = submit(scheduler, tmp_path, "fake-orphan", FAKE_RUN="sleep")
    job_dir = tmp_path / "jobs" / "fake-orphan"
    deadline = time.monotonic() + 60
    while scheduler.status(handle).state is not JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(json.loads((job_dir / "state.json").read_text())["supervisor_pid"], 9)
    time.sleep(0.3)
    assert scheduler.status(handle).state is JobState.FAILED  # recorded, never left RUNNING
    scheduler.cancel(handle)
    assert engine_objects(tmp_path) == []
