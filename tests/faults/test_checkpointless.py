"""Recovery without a checkpoint (docs/resuming.md): a 2 hosts x 2 ranks job that writes no checkpoint loses
algo-2's runtime mid-training; the survivors keep their last completed step, the retry's ranks receive it
from a peer, and the job ends bitwise equal to a straight run without redoing a step (``-m faults``; real
jobs, torch on CPU)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks.resume_bench import checkpointless_spec
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.specs import events
from smddp_sdk.specs.status import JobState

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

DONE = re.compile(r"rank 0: step (\d+) done")
TIMEOUT = 300.0


def run(workdir: Path, name: str, hyperparameters: dict, *, kill_after: int | None = None, warm: bool = False) -> tuple[JobState, str, dict, Path, str]:
    """The example as a local job; with ``kill_after``, algo-2's runtime is SIGKILLed once rank 0 has done that step."""
    scheduler = LocalScheduler(job_root=workdir / "jobs", processes_per_host=2, stop_grace_period=3, warm_restart=warm)
    spec = checkpointless_spec(f"checkpointless-{name}", hyperparameters)
    handle = scheduler.submit(spec)
    job_dir = workdir / "jobs" / handle.job_id
    if kill_after is not None:
        _wait(lambda: any(int(step) >= kill_after for step in DONE.findall(_log(job_dir))), f"step {kill_after}")
        os.kill(int(json.loads((job_dir / "state.json").read_text())["hosts"]["algo-2"]["pid"]), signal.SIGKILL)
    _wait(lambda: scheduler.status(handle).state.is_terminal, "the job's end")
    status = scheduler.status(handle)
    params = {}
    if status.state is JobState.SUCCEEDED and status.model_data:
        with tarfile.open(status.model_data) as archive:
            member = archive.extractfile("params.pt")
            params = torch.load(io.BytesIO(member.read())) if member is not None else {}
    return status.state, status.message, params, job_dir, _log(job_dir)


def _log(job_dir: Path) -> str:
    try:
        return (job_dir / "console.log").read_text(errors="replace")
    except OSError:
        return ""


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


# Both DDPs; ranks that pause between steps, and ranks that are nearly always inside a collective. In both the
# runtime's SIGTERM (it sees algo-2's runtime go) reached the survivors before their collective failed; either
# is accepted (tests/collectives/test_recovery.py keeps a state on a CollectiveError).
CASES = {
    "pause-between-steps-smddp-ddp": {"steps": 60, "pause": 0.1, "ddp": "smddp"},
    "always-in-step-torch-ddp": {"steps": 400, "pause": 0.0, "ddp": "torch"},
}
KEPT = re.compile(r"\[(algo-\d)/rank(\d)\]: rank \d: kept the state of step (\d+) for the restart (on SIGTERM|after \w+)")


@pytest.mark.parametrize("case", CASES)
def test_a_lost_host_recovers_from_its_peers_without_a_checkpoint_bitwise_equal_to_a_straight_run(tmp_path: Path, case: str) -> None:
    hyperparameters = CASES[case]
    steps = hyperparameters["steps"]
    state, message, straight, _, _ = run(tmp_path / "straight", "straight", hyperparameters)
    assert state is JobState.SUCCEEDED, message
    state, message, recovered, job_dir, log = run(tmp_path / "killed", "killed", hyperparameters, kill_after=20, warm=True)
    assert state is JobState.SUCCEEDED, f"{message}\n{log[-4000:]}"

    assert straight.keys() == recovered.keys()
    for name, tensor in straight.items():
        assert tensor.numpy().tobytes() == recovered[name].numpy().tobytes(), name
    kept = KEPT.findall(log)
    assert kept and {host for host, _, _, _ in kept} == {"algo-1"}, kept  # the survivors kept it; algo-2's ranks died with their runtime
    assert "the ranks of algo-1 kept their last completed step" in log and "from scratch" not in log, log[-4000:]  # the supervisor says so
    restored = [e for host in ("algo-1", "algo-2") for e in events.read(job_dir / host / "output" / events.FILE_NAME) if e["event"] == events.STATE_RESTORED]
    assert sorted((e["attempt"], e["rank"], e["source"]) for e in restored) == [(2, rank, "peer") for rank in range(4)], restored
    resumed = restored[0]["step"]
    first = [e for e in events.read(job_dir / "algo-2" / "output" / events.FILE_NAME) if e["event"] == events.FIRST_STEP]
    assert [(e["step"], e["time"] > restored[0]["time"]) for e in first] == [(resumed + 1, True)] * 2, first  # the new host's ranks trained again
    assert {e["step"] for e in restored} == {resumed} and resumed == max(int(step) for _, _, step, _ in kept) and resumed > 20, (restored, kept)
    done = [int(step) for step in DONE.findall(log)]
    assert all(done.count(step) == 1 for step in done), done  # no completed step ran again
    assert set(range(resumed - 1)) | set(range(resumed, steps)) <= set(done), done  # rank 0 logs each step it completes
