"""Slurm's leftovers of #38 and #39 on a real cluster (scripts/slurm-cluster.sh): a cancelled job's logs carry
none of Slurm's exit-code lines; a whole CPU node (``--exclusive``) runs a rank per core unless processes_per_host
says otherwise; and a job that Slurm requeues mid-training recovers without a checkpoint: the stopped ranks
keep their last completed step in the nodes' scratch in the shared job directory, the requeued job's ranks
restore it from a peer, and the parameters end bitwise equal to a straight run's."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import torch

from smddp_sdk.schedulers.slurm import SlurmScheduler
from smddp_sdk.specs import events
from smddp_sdk.specs.status import JobHandle, JobState
from tests.slurm.test_slurm_cluster import JOB_TIMEOUT, SLEEPING, slurm, spec_for, wait_until_running

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpointless" / "train.py"
DONE = re.compile(r"rank 0: step (\d+) done")
PLANNED = "import os\nprint('planned', os.environ['WORLD_SIZE'], os.environ.get('SLURM_CPUS_ON_NODE'), flush=True)\n"


def test_a_cancelled_jobs_logs_carry_no_exit_code_from_slurm(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, processes_per_host=1)
    handle = scheduler.submit(spec_for(tmp_path, SLEEPING, 2, "cancelled"))
    wait_until_running(scheduler, handle, "sleeping")
    scheduler.cancel(handle)
    status = scheduler.wait(handle, poll=0.5, timeout=60)
    assert status.state is JobState.CANCELLED and status.failure is None, status
    time.sleep(1)  # srun's last words reach batch.log after the job's state
    batch = (Path(status.job_dir) / "logs" / "batch.log").read_text()
    assert "Exited with exit code" in batch or "Terminated" in batch, batch  # what Slurm itself wrote (kept there)
    assert "Job step aborted" not in batch and "forcing job termination" not in batch, batch  # srun --quiet
    logged = [line.text for line in scheduler.logs(handle)]
    assert not [text for text in logged if "exit code" in text or "Terminated" in text or "error" in text], logged
    assert any(text.startswith("cancelled at ") for text in logged), logged


def test_a_whole_cpu_node_runs_a_rank_per_core_unless_processes_per_host_says_one(tmp_path: Path) -> None:
    for options, name in (({"processes_per_host": 1}, "one"), ({}, "auto")):
        scheduler = slurm(tmp_path, extra_sbatch=["--exclusive"], **options)
        status = scheduler.wait(scheduler.submit(spec_for(tmp_path, PLANNED, 1, f"whole-{name}")), poll=0.5, timeout=JOB_TIMEOUT)
        assert status.state is JobState.SUCCEEDED, status
        planned = [line.text.split() for line in scheduler.logs(status.handle) if line.text.startswith("planned")]
        cpus = int(planned[0][2])
        expected = 1 if name == "one" else cpus
        assert len(planned) == expected and all(int(words[1]) == expected for words in planned), (name, planned)


def run_example(tmp_path: Path, name: str, *, requeue_after: int | None = None) -> tuple[dict, SlurmScheduler, JobHandle]:
    scheduler = slurm(tmp_path, processes_per_host=1)
    spec = spec_for(tmp_path, EXAMPLE.read_text(), 2, name, max_retry_attempts=1, hyperparameters={"steps": 60, "pause": 0.1})
    handle = scheduler.submit(spec)
    if requeue_after is not None:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not any(int(step) >= requeue_after for step in DONE.findall(_log(scheduler, handle))):
            assert time.monotonic() < deadline, f"step {requeue_after} not reached: {_log(scheduler, handle)[-3000:]}"
            time.sleep(0.2)
        subprocess.run(["scontrol", "requeue", scheduler.job_record(handle)["slurm_job_id"]], check=True, capture_output=True)
    status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT + 120)
    assert status.state is JobState.SUCCEEDED, f"{status}\n{_log(scheduler, handle)[-4000:]}"
    assert not (Path(status.job_dir) / "scratch").exists()  # the nodes' scratch went with the job's end
    with tarfile.open(status.model_data) as archive:
        member = archive.extractfile("params.pt")
        assert member is not None
        return torch.load(io.BytesIO(member.read())), scheduler, handle


def _log(scheduler: SlurmScheduler, handle: JobHandle) -> str:
    return "\n".join(f"[{line.host}/{line.rank}] {line.text}" for line in scheduler.logs(handle))


def test_a_requeued_job_restores_its_state_from_a_peer_bitwise_equal_to_a_straight_run(tmp_path: Path) -> None:
    straight, _, _ = run_example(tmp_path, "straight")
    recovered, scheduler, handle = run_example(tmp_path, "requeued", requeue_after=20)
    assert straight.keys() == recovered.keys()
    for name, tensor in straight.items():
        assert tensor.numpy().tobytes() == recovered[name].numpy().tobytes(), name
    log = _log(scheduler, handle)
    assert "kept the state of step" in log, log[-4000:]
    job_dir = Path(scheduler.status(handle).job_dir)
    restored = [e for tree in sorted((job_dir / "nodes").iterdir()) for e in events.read(tree / "output" / events.FILE_NAME) if e["event"] == events.STATE_RESTORED]
    assert sorted((e["attempt"], e["rank"], e["source"]) for e in restored) == [(2, 0, "peer"), (2, 1, "peer")], restored
    resumed = restored[0]["step"]
    done = [int(step) for step in DONE.findall(log)]
    assert resumed >= 20 and all(done.count(step) == 1 for step in done), (resumed, done)  # no completed step ran again
