"""Warm restart and recovery without a checkpoint in docker mode, on a real engine (``-m docker``).

A killed container and a spot interruption are each followed by a restart that wakes the standby containers
made while the attempt trained; the job ends bitwise equal to a straight run and leaves no container or network.
Then the checkpointless example loses algo-2's container: the survivors' snapshots, in their hosts' scratch
folders in the job directory, outlive the containers, and every rank of the restart receives the state from a peer.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.resume_bench import load_params, run_interrupted, run_straight
from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs import events
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobState

from .conftest import leftovers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]  # a loaded 2-core machine: the standbys import torch beside the training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpointless"
DONE = re.compile(r"rank 0: step (\d+) done")


def scheduler(image: str, root: Path, *, ranks: int = 1, warm: bool = True) -> DockerScheduler:
    return DockerScheduler(job_root=root / "jobs", image=image, processes_per_host=ranks, stop_grace_period=5, gpus="none", warm_restart=warm)


def test_a_killed_container_and_an_interruption_restart_warm_bitwise_equal(smddp_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    straight = run_straight(tmp_path / "straight", scheduler=scheduler(smddp_image, tmp_path / "straight", warm=False))
    warm = run_interrupted(tmp_path / "warm", scheduler=scheduler(smddp_image, tmp_path / "warm"), warm=True)
    assert straight.status.state is JobState.SUCCEEDED, straight.status
    assert warm.status.state is JobState.SUCCEEDED, warm.status
    assert [item.outcome for item in warm.status.attempts] == ["Restarting", "Interrupted", "Completed"]
    expected, got = load_params(straight.params), load_params(warm.params)
    assert all(tensor.numpy().tobytes() == got[name].numpy().tobytes() for name, tensor in expected.items())
    job_dir = tmp_path / "warm" / "jobs" / warm.status.handle.job_id
    started = [event for event in events.read(job_dir / events.FILE_NAME) if event["event"] == events.HOSTS_STARTED]
    assert [(event["attempt"], event["warm"]) for event in started] == [(1, False), (2, True), (3, True)]  # both restarts woke standbys
    with capsys.disabled():
        kill, interrupt = warm.seconds_to_training
        print(f"\ndocker warm restart, fault -> training again: container SIGKILL {kill:.1f} s, spot interruption {interrupt:.1f} s")
    assert leftovers(warm.status.handle.job_id) == ([], [])
    assert not (job_dir / "scratch").exists()


def test_a_lost_container_recovers_from_its_peers_without_a_checkpoint(smddp_image: str, tmp_path: Path) -> None:
    hyperparameters = {"steps": 60, "pause": 0.1, "ddp": "smddp"}
    straight, _, _ = run_example(scheduler(smddp_image, tmp_path / "straight", ranks=2, warm=False), "straight", hyperparameters)
    recovered, job_dir, log = run_example(scheduler(smddp_image, tmp_path / "killed", ranks=2), "killed", hyperparameters, kill_after=20)
    assert straight.keys() == recovered.keys() and straight, log[-4000:]
    for name, tensor in straight.items():
        assert tensor.numpy().tobytes() == recovered[name].numpy().tobytes(), name
    assert "the ranks of algo-1 kept their last completed step" in log and "from scratch" not in log, log[-4000:]
    restored = [e for host in ("algo-1", "algo-2") for e in events.read(job_dir / host / "output" / events.FILE_NAME) if e["event"] == events.STATE_RESTORED]
    assert sorted((e["attempt"], e["rank"], e["source"]) for e in restored) == [(2, rank, "peer") for rank in range(4)], restored
    assert min(e["step"] for e in restored) > 20
    assert leftovers("checkpointless-killed") == ([], [])
    assert not (job_dir / "scratch").exists()


def run_example(docker: DockerScheduler, name: str, hyperparameters: dict[str, Any], *, kill_after: int | None = None) -> tuple[dict[str, Any], Path, str]:
    """The checkpointless example; with ``kill_after``, algo-2's container is SIGKILLed once rank 0 has done that step."""
    import torch

    spec = JobSpec.from_mapping({
        "entry_point": "train.py", "source_dir": str(EXAMPLE), "instance_type": "local", "instance_count": 2,
        "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}, "job_name": f"checkpointless-{name}",
        "max_retry_attempts": 1, "max_run": 1800, "hyperparameters": hyperparameters,
    })
    handle = docker.submit(spec)
    job_dir = docker.job_root / handle.job_id
    log = job_dir / "console.log"
    if kill_after is not None:
        _wait(lambda: any(int(step) >= kill_after for step in DONE.findall(log.read_text(errors="replace") if log.exists() else "")), f"step {kill_after}")
        container = json.loads((job_dir / "state.json").read_text())["hosts"]["algo-2"]["container"]
        subprocess.run(["docker", "kill", "--signal", "KILL", container], check=True, capture_output=True, timeout=60)
    _wait(lambda: docker.status(handle).state.is_terminal, "the job's end")
    status = docker.status(handle)
    params: dict[str, Any] = {}
    if status.state is JobState.SUCCEEDED and status.model_data:
        with tarfile.open(status.model_data) as archive:
            member = archive.extractfile("params.pt")
            params = torch.load(io.BytesIO(member.read())) if member is not None else {}
    return params, job_dir, log.read_text(errors="replace")


def _wait(condition: Any, what: str, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
