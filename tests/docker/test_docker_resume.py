"""The resume proof in docker mode: the same supervisor retries a killed container and a spot interruption,
and the job ends bitwise equal to one that ran straight (2 containers x 1 rank; ``-m docker``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.resume_bench import load_params, run_interrupted, run_straight
from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs.status import JobState

from .conftest import leftovers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


def test_containers_killed_and_interrupted_resume_bitwise_equal(smddp_image: str, tmp_path: Path) -> None:
    def scheduler() -> DockerScheduler:
        return DockerScheduler(job_root=tmp_path / "jobs", image=smddp_image, processes_per_host=1, stop_grace_period=5, gpus="none")

    straight = run_straight(tmp_path, scheduler=scheduler())
    interrupted = run_interrupted(tmp_path, scheduler=scheduler())
    assert straight.status.state is JobState.SUCCEEDED, straight.status
    assert interrupted.status.state is JobState.SUCCEEDED, interrupted.status
    assert [item.outcome for item in interrupted.status.attempts] == ["Restarting", "Interrupted", "Completed"]
    expected, got = load_params(straight.params), load_params(interrupted.params)
    assert all(tensor.numpy().tobytes() == got[name].numpy().tobytes() for name, tensor in expected.items())
    assert leftovers(interrupted.status.handle.job_id) == ([], [])
