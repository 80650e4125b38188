"""The docker scheduler's ``wheelhouse`` option: a read-only mount and pip's own offline variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.docker import WHEELHOUSE_MOUNT, DockerScheduler
from smddp_sdk.specs.job import JobSpec


def spec(tmp_path: Path, **extra) -> JobSpec:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("")
    return JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(code), "instance_type": "local", "instance_count": 2, **extra})


def test_wheelhouse_is_mounted_read_only_and_pip_uses_only_it(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    request = DockerScheduler(job_root=tmp_path / "jobs", wheelhouse=str(wheels)).dryrun(spec(tmp_path)).request
    for host in request.hosts:
        argv = host.create
        assert f"{wheels}:{WHEELHOUSE_MOUNT}:ro" in argv
        assert "PIP_NO_INDEX=1" in argv and f"PIP_FIND_LINKS={WHEELHOUSE_MOUNT}" in argv


def test_the_jobs_environment_overrides_the_wheelhouse_settings(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    job = spec(tmp_path, environment={"PIP_NO_INDEX": "0"})
    argv = DockerScheduler(job_root=tmp_path / "jobs", wheelhouse=str(wheels)).dryrun(job).request.hosts[0].create
    assert "PIP_NO_INDEX=0" in argv and "PIP_NO_INDEX=1" not in argv


def test_without_a_wheelhouse_nothing_changes(tmp_path):
    argv = DockerScheduler(job_root=tmp_path / "jobs").dryrun(spec(tmp_path)).request.hosts[0].create
    assert not [arg for arg in argv if "PIP_" in arg or WHEELHOUSE_MOUNT in arg]


def test_a_missing_wheelhouse_is_a_spec_error_that_says_what_to_give(tmp_path):
    with pytest.raises(SpecError) as caught:
        DockerScheduler(wheelhouse=str(tmp_path / "nowhere"))
    assert "scheduler_options.wheelhouse" in str(caught.value) and "pip download" in str(caught.value)
