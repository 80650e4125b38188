"""Real jobs through a real Slurm (scripts/slurm-cluster.sh: slurmctld and slurmd n1..n3 on this machine):
an AWS-style smddp script with literal /opt/ml paths, a failing rank, cancel, a node taken down mid-job,
logs, and a job the cluster can never run. Every job is small: the machine's cores are shared."""

from __future__ import annotations

import subprocess
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.slurm import SlurmScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState
from tests.jobs import SAME_JOB, assert_same_archives, run_same_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

JOB_TIMEOUT = 240

AWS_STYLE = (SAME_JOB.parent / "train.py").read_text()
FAILING = textwrap.dedent(
    """
    import time
    import torch.distributed as dist
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    dist.init_process_group(backend="smddp")
    if dist.get_rank() == 3:
        raise ValueError("rank 3 gave up on purpose")
    time.sleep(60)
    """
)
# Fails once after saving a checkpoint; the requeued attempt must find it on the shared file system.
RESUMING = textwrap.dedent(
    """
    import os, sys, time
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    checkpoint = "/opt/ml/checkpoints/step.txt"
    resumed = open(checkpoint).read() if os.path.exists(checkpoint) else None
    print(f"attempt {attempt} resumed from {resumed}", flush=True)
    if attempt == 0:
        if os.environ["RANK"] == "0":
            open(checkpoint, "w").write("step-5")
            sys.exit(3)
        time.sleep(60)
    if os.environ["RANK"] == "0":
        open("/opt/ml/model/resumed.txt", "w").write(str(resumed))
    """
)
SLEEPING = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n"


def spec_for(tmp_path: Path, script: str, hosts: int, name: str, **extra) -> JobSpec:
    source = tmp_path / f"src-{name}"
    source.mkdir()
    (source / "train.py").write_text(script)
    data = {
        "entry_point": "train.py",
        "source_dir": str(source),
        "instance_type": "local",
        "instance_count": hosts,
        "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
        "job_name": name,
        "max_run": 600,
        **extra,
    }
    return JobSpec.from_mapping(data)


def slurm(tmp_path: Path, **options) -> SlurmScheduler:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), **options)
    assert isinstance(scheduler, SlurmScheduler)
    return scheduler


def wait_until_running(scheduler: SlurmScheduler, handle: JobHandle, text: str) -> None:
    """Until every node's ranks print ``text`` (the job is RUNNING and the ranks are up)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        status = scheduler.status(handle)
        assert not status.state.is_terminal, status
        hosts = {line.host for line in scheduler.logs(handle) if line.text == text}
        if status.state is JobState.RUNNING and len(hosts) == scheduler.job_record(handle)["plan"]["nodes"]:
            return
        time.sleep(0.5)
    pytest.fail(f"{handle} did not start its ranks within {JOB_TIMEOUT} s")


def test_aws_style_script_on_three_nodes_matches_local_mode(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, AWS_STYLE, 3, "aws-style", hyperparameters={"epochs": 2})
    scheduler = slurm(tmp_path, processes_per_host=2)
    handle = scheduler.submit(spec)
    lines = list(scheduler.logs(handle, follow=True))  # follows until the job ends
    status = scheduler.status(handle)
    assert status.state is JobState.SUCCEEDED, (status, [line.prefix + line.text for line in lines])
    said = {(line.host, line.rank): line.text for line in lines if line.text.startswith("rank ")}
    assert said == {(f"n{rank // 2 + 1}", rank): f"rank {rank}/6 on n{rank // 2 + 1} of ['n1', 'n2', 'n3'] epochs 2" for rank in range(6)}
    assert [host.host for host in status.hosts] == ["n1", "n2", "n3"] and all(host.state is JobState.SUCCEEDED for host in status.hosts)
    assert status.model_data == str(tmp_path / "jobs" / "aws-style" / "output" / "model.tar.gz")
    with tarfile.open(status.model_data) as archive:
        slurm_members = sorted(archive.getnames())
    assert "model.pth" in slurm_members
    with tarfile.open(status.output_data) as archive:
        assert archive.extractfile("hosts.json").read() == b'["n1", "n2", "n3"]'

    local = get_scheduler("local", job_root=str(tmp_path / "local"), processes_per_host=2)
    local_status = local.wait(local.submit(spec_for(tmp_path, AWS_STYLE, 3, "aws-style-local", hyperparameters={"epochs": 2})), timeout=JOB_TIMEOUT)
    assert local_status.state is JobState.SUCCEEDED, local_status
    with tarfile.open(local_status.model_data) as archive:
        assert sorted(archive.getnames()) == slurm_members


def test_the_same_job_file_gives_the_same_model_archive_as_local_mode(tmp_path: Path) -> None:
    """tests/jobs/same_everywhere/job.yaml through the CLI, unchanged but for --scheduler."""
    assert_same_archives(run_same_job("local", tmp_path / "local"), run_same_job("slurm", tmp_path / "slurm"))


def test_failing_rank_is_the_root_cause_by_host_and_rank(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, processes_per_host=2)
    status = scheduler.wait(scheduler.submit(spec_for(tmp_path, FAILING, 2, "failing")), poll=0.5, timeout=JOB_TIMEOUT)
    assert status.state is JobState.FAILED, status
    assert status.failure is not None and (status.failure.host, status.failure.rank) == ("n2", 3), status.failure
    assert status.message == "rank 3 on host n2 failed with exit code 1: ValueError: rank 3 gave up on purpose"
    assert "raise ValueError" in status.failure.traceback
    assert all(other.rank != 3 for other in status.other_failures)


def test_cancel_stops_every_node(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path)
    handle = scheduler.submit(spec_for(tmp_path, SLEEPING, 2, "cancelled"))
    wait_until_running(scheduler, handle, "sleeping")
    started = time.monotonic()
    scheduler.cancel(handle)
    status = scheduler.wait(handle, poll=0.5, timeout=60)
    assert status.state is JobState.CANCELLED and status.details["slurm_state"] == "CANCELLED", status
    assert time.monotonic() - started < 30
    assert all(host.state is JobState.CANCELLED for host in status.hosts)
    scheduler.cancel(handle)  # idempotent
    assert scheduler.status(handle).state is JobState.CANCELLED


def test_a_node_taken_down_mid_job_fails_the_job_and_is_named(tmp_path: Path) -> None:
    """Without retries the job is not requeued: Slurm ends it with NODE_FAIL and status names the node."""
    scheduler = slurm(tmp_path)
    handle = scheduler.submit(spec_for(tmp_path, SLEEPING, 3, "node-down"))
    wait_until_running(scheduler, handle, "sleeping")
    try:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=smddp-test"], check=True, capture_output=True)
        status = scheduler.wait(handle, poll=0.5, timeout=90)
    finally:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True, check=False)
    assert status.state is JobState.FAILED and status.details["slurm_state"] == "NODE_FAIL", status
    assert status.message.startswith("node n2 failed: a node of the job failed and Slurm ended the job"), status.message
    assert status.message.endswith("not requeued (no max_retry_attempts)")
    assert status.failure is not None and status.failure.host == "n2" and status.failure.error_type == "NodeFailure"
    _wait_nodes_idle()


def test_the_retry_policy_requeues_a_failed_step_which_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path, retry_script_errors=True, processes_per_host=1)
    handle = scheduler.submit(spec_for(tmp_path, RESUMING, 2, "requeued", max_retry_attempts=1))
    status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    assert status.state is JobState.SUCCEEDED and status.attempt == 2, status
    texts = [line.text for line in scheduler.logs(handle, ranks=[0])]
    assert texts[:1] == ["attempt 0 resumed from None"] and "attempt 1 resumed from step-5" in texts, texts
    assert any("requeueing (restart 0 of 1)" in line.text for line in scheduler.logs(handle, hosts=["batch"]))
    with tarfile.open(status.model_data) as archive:
        assert archive.extractfile("resumed.txt").read() == b"step-5"


def test_a_node_python_that_cannot_run_fails_clearly(tmp_path: Path) -> None:
    """No runtime ever starts: no failure record, so status points at the logs that say why."""
    scheduler = slurm(tmp_path, python="/no/such/python3")
    handle = scheduler.submit(spec_for(tmp_path, SLEEPING, 2, "no-python"))
    status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    assert status.state is JobState.FAILED and status.failure is None, status
    assert status.message.startswith("the job failed (Slurm FAILED, exit code") and "batch.log" in status.message, status.message
    assert any("/no/such/python3" in line.text for line in scheduler.logs(handle)), list(scheduler.logs(handle))


def test_a_job_the_cluster_can_never_run_is_refused_at_once(tmp_path: Path) -> None:
    scheduler = slurm(tmp_path)
    started = time.monotonic()
    with pytest.raises(SpecError, match="Slurm cannot run this job: .*Requested node configuration is not available"):
        scheduler.submit(spec_for(tmp_path, SLEEPING, 4, "too-big"))
    assert time.monotonic() - started < 30
    assert not (tmp_path / "jobs" / "too-big").exists()


def _wait_nodes_idle(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, check=False).stdout.split()
        if states and all(state == "idle" for state in states):
            return
        subprocess.run(["scontrol", "update", "nodename=n[1-3]", "state=resume"], capture_output=True, check=False)
        time.sleep(1)
    pytest.fail(f"the nodes are not idle again: {states}")
