"""The job token (SMDDP_JOB_TOKEN, from which the mesh secret and the coordinator's token come) of docker and
Slurm jobs: random per job, the same in every container of an attempt, never on a command line (every local
user reads /proc/*/cmdline) and only in files the caller alone can read. Docker runs as the fake CLI
(tests/schedulers/fake_docker.py), which logs every argv it was given and every container it created."""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

import pytest

from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.schedulers.hosttree.backend import TOKEN_PLACEHOLDER
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobState
from tests.slurm.test_slurm_plan import FakeSlurm, spec_for

FAKE = Path(__file__).with_name("fake_docker.py")
TOKEN = contract.JOB_TOKEN_ENV


@pytest.fixture()
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DockerScheduler:
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(tmp_path / "engine"))
    monkeypatch.setenv(TOKEN, "the-callers-own-token")  # a job started from inside another must not pass it on
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return DockerScheduler(job_root=tmp_path / "jobs", docker=str(cli), image="fake:1", processes_per_host=1, stop_grace_period=2)


def spec(tmp_path: Path, name: str, max_retry_attempts: int | None = None, **environment: str) -> JobSpec:
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('never run by the fake engine')\n")
    return JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(code), "instance_type": "local", "instance_count": 2,
                                 "job_name": name, "environment": environment, "max_retry_attempts": max_retry_attempts})


def run_job(scheduler: DockerScheduler, tmp_path: Path, name: str, **options) -> None:
    handle = scheduler.submit(spec(tmp_path, name, **options))
    status = scheduler.wait(handle, poll=0.1, timeout=60)
    assert status.state is JobState.SUCCEEDED, status


def tokens_by_container(tmp_path: Path, job: str) -> list[tuple[str, str | None]]:
    """(container, its SMDDP_JOB_TOKEN) for every container the engine created for ``job``, in order."""
    created = [json.loads(line) for line in (tmp_path / "engine" / "created.log").read_text().splitlines()]
    return [(item["Name"], item["Env"].get(TOKEN)) for item in created if item["Name"].startswith(f"{job}-")]


def every_argv(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "engine" / "argv.log").read_text().splitlines()]


def test_every_container_of_a_job_gets_its_random_token_which_no_command_line_shows(scheduler: DockerScheduler, tmp_path: Path) -> None:
    run_job(scheduler, tmp_path, "tok-a")
    run_job(scheduler, tmp_path, "tok-b")
    a, b = tokens_by_container(tmp_path, "tok-a"), tokens_by_container(tmp_path, "tok-b")
    assert [name for name, _ in a] == ["tok-a-algo-1", "tok-a-algo-2"]
    assert len({token for _, token in a}) == 1 and len({token for _, token in b}) == 1  # one per job
    token_a, token_b = a[0][1], b[0][1]
    assert token_a and token_b and re.fullmatch(r"[0-9a-f]{32}", token_a) and token_a != token_b  # random per job
    argvs = every_argv(tmp_path)
    creates = [argv for argv in argvs if argv[0] == "create"]
    assert len(creates) == 4 and all(argv[argv.index(TOKEN) - 1] == "-e" for argv in creates)  # by name alone
    assert not any(token in word for argv in argvs for word in argv for token in (token_a, token_b, "the-callers-own-token"))
    written = [path for path in (tmp_path / "jobs").rglob("*") if path.is_file() and token_a.encode() in path.read_bytes()]
    assert written == []  # never written down: each attempt makes its own


def test_a_retried_attempt_gets_a_token_for_all_its_containers(scheduler: DockerScheduler, tmp_path: Path) -> None:
    # algo-2's container is killed by the engine once (137, the platform's fault): the job is retried and succeeds.
    run_job(scheduler, tmp_path, "tok-retry", max_retry_attempts=1, FAKE_RUN="exit:0:0.5", FAKE_RUN_ALGO_2="die-once:0.1")
    created = tokens_by_container(tmp_path, "tok-retry")
    assert [name for name, _ in created] == ["tok-retry-algo-1", "tok-retry-algo-2"] * 2
    first, second = {token for _, token in created[:2]}, {token for _, token in created[2:]}
    assert len(first) == len(second) == 1 and None not in first | second
    assert first != second  # as in local mode: every attempt starts all its hosts with a fresh token
    assert not any(token in word for argv in every_argv(tmp_path) for word in argv for token in first | second)


def test_the_dry_run_shows_a_placeholder_for_the_token(scheduler: DockerScheduler, tmp_path: Path) -> None:
    dryrun = scheduler.dryrun(spec(tmp_path, "tok-plan"))
    for host in dryrun.request.hosts:
        values = [host.create[i + 1] for i, word in enumerate(host.create) if word == "-e"]
        assert [value for value in values if value.startswith(TOKEN)] == [TOKEN]  # the name, no value
    assert any(TOKEN in note and TOKEN_PLACEHOLDER in note for note in dryrun.notes)


def test_the_slurm_token_file_is_the_callers_alone(tmp_path: Path) -> None:
    code = tmp_path / "src"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm()).submit(spec_for(code))
    job_dir = tmp_path / "jobs" / "job-1"
    holders = [path for path in job_dir.rglob("*") if path.is_file() and b"job_token" in path.read_bytes()]
    assert holders, "the node file with the job token was not found"
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    for path in holders:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert re.fullmatch(r"[0-9a-f]{32}", json.loads(path.read_text())["job_token"])
