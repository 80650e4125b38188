"""Warm restart and recovery scratch of docker jobs against the fake docker CLI (tests/schedulers/fake_docker.py):
standby containers made while an attempt trains, woken by the restart, removed on every way a job ends."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.schedulers.docker import SCRATCH_MOUNT, DockerScheduler
from smddp_sdk.specs import contract, events
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState

FAKE = Path(__file__).with_name("fake_docker.py")


@pytest.fixture()
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DockerScheduler:
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(tmp_path / "engine"))
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return DockerScheduler(job_root=tmp_path / "jobs", docker=str(cli), image="fake:1", processes_per_host=2, stop_grace_period=2, warm_restart=True)


def spec(tmp_path: Path, name: str, **environment: str) -> JobSpec:
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('never run by the fake engine')\n")
    return JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(code), "instance_type": "local", "instance_count": 2,
                                 "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}, "job_name": name, "max_retry_attempts": 1, "environment": environment})


def engine_objects(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "engine").glob("*.json"))


def created(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "engine" / "created.log").read_text().splitlines()]


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def state_of(tmp_path: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp_path / "jobs" / name / "state.json").read_text())


def test_the_option_is_declared_and_the_dry_run_says_it(scheduler: DockerScheduler, tmp_path: Path) -> None:
    assert "warm_restart" in DockerScheduler.options.names()
    dryrun = scheduler.dryrun(spec(tmp_path, "warm-plan"))
    notes = [note for note in dryrun.notes if note.startswith("warm_restart:")]
    assert len(notes) == 1 and "2 spare ranks" in notes[0] and contract.STANDBY_ENV in notes[0]
    for host in dryrun.request.hosts:
        assert f"{contract.WARM_RESTART_ENV}=1" in host.create
    assert not [note for note in DockerScheduler(docker=scheduler.docker).dryrun(spec(tmp_path, "cold-plan")).notes if note.startswith("warm_restart:")]


def test_a_retry_wakes_the_standby_containers_and_nothing_is_left(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = scheduler.submit(spec(tmp_path, "warm-retry", FAKE_RUN="exit:0:1.5", FAKE_RUN_ALGO_2="die-once:1.0"))
    status = scheduler.wait(handle, poll=0.1, timeout=90)
    assert status.state is JobState.SUCCEEDED, status
    assert [item.outcome for item in status.attempts] == ["Restarting", "Completed"]
    names = [item["Name"] for item in created(tmp_path)]
    # The first attempt and its standbys (restart 1, which ran it; none after it: no retry was left).
    assert names[:2] == ["warm-retry-algo-1", "warm-retry-algo-2"] and sorted(names[2:]) == ["warm-retry-algo-1-r1", "warm-retry-algo-2-r1"]
    standbys = [item for item in created(tmp_path) if item["Name"].endswith("-r1")]
    assert all(item["Env"][contract.STANDBY_ENV] == "2" and contract.JOB_TOKEN_ENV not in item["Env"] for item in standbys)  # the token comes on wake
    started = [event for event in events.read(tmp_path / "jobs" / "warm-retry" / events.FILE_NAME) if event["event"] == events.HOSTS_STARTED]
    assert [event["warm"] for event in started] == [False, True]
    assert {host["container"]: host["warm"] for host in state_of(tmp_path, "warm-retry")["hosts"].values()} == {"warm-retry-algo-1-r1": True, "warm-retry-algo-2-r1": True}
    lines = [line.text for line in scheduler.logs(handle) if line.host == "algo-2"]
    assert lines.count("fake container of warm-retry running") == 2 and "smddp: standby ready" not in lines
    assert engine_objects(tmp_path) == []  # every container (standbys too) and every network removed


def test_a_failed_standby_is_removed_and_its_host_starts_cold(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = scheduler.submit(spec(tmp_path, "warm-broken", FAKE_RUN="exit:0:1.5", FAKE_RUN_ALGO_2="die-once:1.0", FAKE_STANDBY_READY="fail"))
    status = scheduler.wait(handle, poll=0.1, timeout=90)
    assert status.state is JobState.SUCCEEDED, status
    hosts = state_of(tmp_path, "warm-broken")["hosts"]
    assert {host["container"]: host["warm"] for host in hosts.values()} == {"warm-broken-algo-1-r1": False, "warm-broken-algo-2-r1": False}
    said = [line.text for line in scheduler.logs(handle) if "had ended" in line.text]
    assert sorted(said) == [f"smddp: the standby container of {host} had ended; {host} starts cold" for host in ("algo-1", "algo-2")]
    assert engine_objects(tmp_path) == []


def test_cancel_removes_the_standbys(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = scheduler.submit(spec(tmp_path, "warm-cancel", FAKE_RUN="sleep"))
    wait_for(lambda: state_of(tmp_path, "warm-cancel").get("standbys_ready") is not None, "the standbys")
    assert len(engine_objects(tmp_path)) == 6  # 2 networks, 2 containers, 2 standbys
    scheduler.cancel(handle)
    assert scheduler.status(handle).state is JobState.CANCELLED
    assert engine_objects(tmp_path) == []


def test_cancel_after_the_supervisor_died_removes_the_standbys(scheduler: DockerScheduler, tmp_path: Path) -> None:
    handle = _running(scheduler, tmp_path, "warm-orphan")
    os.kill(state_of(tmp_path, "warm-orphan")["supervisor_pid"], 9)
    scheduler.cancel(handle)
    assert engine_objects(tmp_path) == []
    assert not (tmp_path / "jobs" / "warm-orphan" / "scratch").exists()


def test_each_container_has_its_own_scratch_that_outlives_it(scheduler: DockerScheduler, tmp_path: Path) -> None:
    dryrun = scheduler.dryrun(spec(tmp_path, "warm-scratch"))
    for host in dryrun.request.hosts:
        assert f"{dryrun.request.job_dir / 'scratch' / host.host}:{SCRATCH_MOUNT}" in host.create
        assert f"{contract.SCRATCH_ENV}={SCRATCH_MOUNT}" in host.create
    handle = scheduler.submit(spec(tmp_path, "warm-scratch", FAKE_RUN="exit:0:1.5", FAKE_RUN_ALGO_2="die-once:1.0", FAKE_SNAPSHOT="1"))
    scratch = tmp_path / "jobs" / "warm-scratch" / "scratch"
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700 and stat.S_IMODE((scratch / "algo-1").stat().st_mode) == 0o700
    status = scheduler.wait(handle, poll=0.1, timeout=90)
    assert status.state is JobState.SUCCEEDED, status
    said = [line.text for line in scheduler.logs(handle) if "kept their last completed step" in line.text]
    assert said and "algo-1, algo-2" in said[0]  # the supervisor found both hosts' snapshots after the containers were gone
    assert not scratch.exists()  # removed when the job ended


def _running(scheduler: DockerScheduler, tmp_path: Path, name: str) -> JobHandle:
    handle = scheduler.submit(spec(tmp_path, name, FAKE_RUN="sleep"))
    wait_for(lambda: state_of(tmp_path, name).get("standbys_ready") is not None, "the standbys")
    return handle
