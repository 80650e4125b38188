"""Docker mode for real: the image, and 2-host x 2-rank smddp jobs as containers on a job network."""

from __future__ import annotations

import json
import signal
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from smddp_sdk.errors import UnavailableError
from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState

from .conftest import leftovers

pytestmark = pytest.mark.docker

JOB_TIMEOUT = 180  # seconds; a 4-rank job takes about 10 s here

TRAIN = textwrap.dedent(
    """
    import argparse, json, os, time
    import torch
    import torch.distributed as dist
    import smddp_sdk.collectives  # registers the "smddp" backend

    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0)
    args = parser.parse_args()

    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == args.fail_rank:
        raise RuntimeError(f"planned failure on rank {rank}")
    time.sleep(args.sleep)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank}/{world} sum {total.item()}", flush=True)
    host = os.environ["SM_CURRENT_HOST"]
    if os.environ["LOCAL_RANK"] == "0":
        with open(os.path.join(os.environ["SM_MODEL_DIR"], f"model-{host}.json"), "w") as out:
            json.dump({"host": host, "rank": rank, "world": world, "sum": total.item()}, out)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture()
def source_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    return code


def job_spec(source_dir: Path, name: str, **hyperparameters) -> JobSpec:
    return JobSpec.from_mapping(
        {
            "entry_point": "train.py",
            "source_dir": str(source_dir),
            "instance_type": "local",
            "instance_count": 2,
            "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
            "hyperparameters": hyperparameters,
            "job_name": name,
        }
    )


def run_to_end(scheduler: DockerScheduler, spec: JobSpec):
    handle = scheduler.submit(spec)
    try:
        lines = list(scheduler.logs(handle, follow=True))
        status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    finally:
        scheduler.cancel(handle)  # no-op once finished; frees the engine if an assertion fails first
    return handle, lines, status


def test_image_runs_train_and_works_for_any_user(smddp_image):
    check = "import shutil, torch, smddp_sdk.runtime, smddp_sdk.collectives; print(shutil.which('train'), torch.__version__)"
    for user in ("0:0", "4321:4321"):
        result = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--user", user, smddp_image, "python", "-c", check],
            capture_output=True, text=True, check=False, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[0] == "/usr/local/bin/train"


def test_two_hosts_two_ranks_smddp_job(smddp_image, source_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", stop_grace_period=10, processes_per_host=2)
    handle, lines, status = run_to_end(scheduler, job_spec(source_dir, "docker-ok"))

    assert status.state is JobState.SUCCEEDED, status
    sums = sorted((line.host, line.rank, line.text) for line in lines if line.text.startswith("rank "))
    assert sums == [
        ("algo-1", 0, "rank 0/4 sum 10.0"),
        ("algo-1", 1, "rank 1/4 sum 10.0"),
        ("algo-2", 2, "rank 2/4 sum 10.0"),
        ("algo-2", 3, "rank 3/4 sum 10.0"),
    ]
    for index, host in enumerate(("algo-1", "algo-2")):
        model = tmp_path / "jobs" / "docker-ok" / host / "model" / f"model-{host}.json"
        assert json.loads(model.read_text()) == {"host": host, "rank": 2 * index, "world": 4, "sum": 10.0}
        assert model.stat().st_uid == os.getuid()  # outputs belong to the caller, not to root
    with tarfile.open(status.model_data) as model_tar:  # every host's model dir, merged as SageMaker does
        assert sorted(model_tar.getnames()) == ["model-algo-1.json", "model-algo-2.json"]
    assert leftovers("docker-ok") == ([], [])
    # After cleanup the job is still known: saved result and logs.
    assert scheduler.status(handle).state is JobState.SUCCEEDED
    assert any(line.rank == 3 for line in scheduler.logs(handle, ranks=[3]))


def test_a_failing_rank_fails_the_job_with_its_host_code_and_last_lines(smddp_image, source_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", stop_grace_period=10, processes_per_host=2)
    _, _, status = run_to_end(scheduler, job_spec(source_dir, "docker-fail", **{"fail-rank": 3}))

    assert status.state is JobState.FAILED, status
    assert status.failure is not None
    assert status.failure.host == "algo-2"
    assert status.failure.exit_code != 0
    assert "planned failure on rank 3" in status.failure.traceback
    assert leftovers("docker-fail") == ([], [])


def test_cancel_stops_and_removes_everything(smddp_image, source_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", stop_grace_period=5, processes_per_host=2)
    handle = scheduler.submit(job_spec(source_dir, "docker-cancel", sleep=300))
    try:
        deadline = time.monotonic() + 120  # the supervisor creates and starts the containers
        while scheduler.status(handle).state is not JobState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scheduler.status(handle).state is JobState.RUNNING
        assert leftovers("docker-cancel")[0], "its containers should be running"
    finally:
        scheduler.cancel(handle)
    assert scheduler.status(handle).state is JobState.CANCELLED
    assert leftovers("docker-cancel") == ([], [])
    scheduler.cancel(handle)  # idempotent


def test_missing_image_says_how_to_build_it(docker_engine, source_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", image="smddp-sdk:no-such-tag")
    with pytest.raises(UnavailableError, match="build-image.sh"):
        scheduler.submit(job_spec(source_dir, "docker-noimage"))
    assert leftovers("docker-noimage") == ([], [])


def test_estimator_fit_runs_the_job_in_containers(smddp_image, source_dir, tmp_path, capsys):
    from smddp_sdk import PyTorch

    estimator = PyTorch(
        entry_point="train.py",
        source_dir=str(source_dir),
        instance_type="local",
        instance_count=2,
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        job_name="docker-estimator",
        scheduler="docker",
        scheduler_options={"job_root": str(tmp_path / "jobs"), "processes_per_host": 2, "stop_grace_period": 10},
    )
    try:
        estimator.fit()
    finally:
        estimator.latest_training_job.stop()  # no-op once the job has ended
    printed = capsys.readouterr().out
    assert "[algo-2/rank3]: rank 3/4 sum 10.0" in printed
    assert estimator.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    for host in ("algo-1", "algo-2"):
        model = tmp_path / "jobs" / "docker-estimator" / host / "model" / f"model-{host}.json"
        assert json.loads(model.read_text())["sum"] == 10.0
    assert leftovers("docker-estimator") == ([], [])


def test_smddp_launch_runs_a_job_file_in_containers(smddp_image, source_dir, tmp_path):
    pytest.importorskip("smddp_sdk.cli.main", reason="smddp-launch (smddp_sdk/cli) is not in this checkout")
    import smddp_sdk

    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        textwrap.dedent(
            f"""
            entry_point: train.py
            source_dir: {source_dir}
            instance_type: local
            instance_count: 2
            job_name: docker-cli
            distribution:
              smdistributed:
                dataparallel:
                  enabled: true
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(Path(smddp_sdk.__file__).resolve().parent.parent), "NO_COLOR": "1"}
    result = subprocess.run(
        [
            sys.executable, "-m", "smddp_sdk.cli", "run", str(job_file), "--scheduler", "docker",
            "-o", f"job_root={tmp_path / 'jobs'}", "-o", "processes_per_host=2", "-o", "stop_grace_period=10",
        ],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=JOB_TIMEOUT + 120, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[algo-1/rank0]: rank 0/4 sum 10.0" in result.stdout
    for host in ("algo-1", "algo-2"):
        model = tmp_path / "jobs" / "docker-cli" / host / "model" / f"model-{host}.json"
        assert json.loads(model.read_text())["world"] == 4
    assert leftovers("docker-cli") == ([], [])


def test_max_run_stops_the_job_as_sagemaker_does(smddp_image, source_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", stop_grace_period=5, processes_per_host=1)
    spec = job_spec(source_dir, "docker-maxrun", sleep=300).replace(max_run=5)
    handle = scheduler.submit(spec)
    try:
        status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    finally:
        scheduler.cancel(handle)
    assert status.state is JobState.FAILED
    assert status.message.startswith("MaxRuntimeExceeded")
    assert scheduler.status(handle).message.startswith("MaxRuntimeExceeded")  # kept after cleanup
    assert leftovers("docker-maxrun") == ([], [])


OWNER = textwrap.dedent(
    """
    import sys, time
    from smddp_sdk import launcher
    from smddp_sdk.schedulers.docker import DockerScheduler
    from smddp_sdk.specs.job import JobSpec

    scheduler = DockerScheduler(job_root=sys.argv[1], processes_per_host=1, stop_grace_period=5)
    spec = JobSpec.from_mapping({"entry_point": "train.py", "source_dir": sys.argv[2], "instance_type": "local",
                                 "instance_count": 2, "job_name": "docker-owner", "hyperparameters": {"sleep": 300}})
    print(launcher.schedule(scheduler, scheduler.dryrun(spec), attached=True), flush=True)
    time.sleep(600)
    """
)


def test_an_attached_job_ends_when_its_owner_is_killed(smddp_image, source_dir, tmp_path):
    import smddp_sdk

    env = {**os.environ, "PYTHONPATH": str(Path(smddp_sdk.__file__).resolve().parent.parent)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "jobs"), str(source_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "docker://docker-owner"
        deadline = time.monotonic() + 120  # the supervisor creates and starts the containers
        while not leftovers("docker-owner")[0] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert leftovers("docker-owner")[0], "the job should be running"
    finally:
        owner.kill()  # SIGKILL: the owner cannot clean up after itself
        owner.wait()
    deadline = time.monotonic() + 90
    while leftovers("docker-owner") != ([], []) and time.monotonic() < deadline:
        time.sleep(1)
    assert leftovers("docker-owner") == ([], [])
    assert DockerScheduler(job_root=tmp_path / "jobs").status(JobHandle("docker", "docker-owner")).state is JobState.CANCELLED


def test_containers_stop_when_the_supervisor_is_killed_and_cancel_cleans_up(smddp_image, source_dir, tmp_path):
    """The lifeline: the runtime in each container stops once the supervisor holding the FIFO is gone."""
    image = os.environ.get("SMDDP_TEST_LIFELINE_IMAGE", smddp_image)
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", stop_grace_period=5, processes_per_host=1, image=image)
    handle = scheduler.submit(job_spec(source_dir, "docker-lifeline", sleep=300))
    job_dir = tmp_path / "jobs" / "docker-lifeline"
    try:
        deadline = time.monotonic() + 120
        while "started ranks" not in _text(job_dir / "console.log") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # both runtimes have opened the lifeline by now
        supervisor = json.loads((job_dir / "state.json").read_text())["supervisor_pid"]
        os.kill(supervisor, signal.SIGKILL)
        killed = time.monotonic()
        while _running_containers("docker-lifeline") and time.monotonic() - killed < 60:
            time.sleep(0.2)
        assert not _running_containers("docker-lifeline"), "the containers kept running without their supervisor"
        assert time.monotonic() - killed < 15
        assert scheduler.status(handle).state is JobState.FAILED  # recorded: it never stays RUNNING
    finally:
        scheduler.cancel(handle)
    assert leftovers("docker-lifeline") == ([], [])


def _running_containers(job: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-q", "--filter", f"label=ai.smddp.job={job}"], capture_output=True, text=True, check=True).stdout.split()


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
