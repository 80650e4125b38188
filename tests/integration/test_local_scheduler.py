"""The estimator and the local scheduler end to end: real runtimes, real ranks, simulated hosts on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

import smddp_sdk
from smddp_sdk import PyTorch
from smddp_sdk.errors import JobFailedError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.specs.status import JobHandle, JobState

pytestmark = pytest.mark.integration

PACKAGE_ROOT = str(Path(smddp_sdk.__file__).resolve().parent.parent)
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}
TORCH_DISTRIBUTED = {"torch_distributed": {"enabled": True}}
needs_smddp = pytest.mark.skipif(
    importlib.util.find_spec("smddp_sdk.collectives") is None,
    reason="the smddp backend (smddp_sdk.collectives) is not in this tree yet",
)

SMDDP_SCRIPT = """
import os
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
import torch
import torch.distributed as dist

dist.init_process_group("smddp")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank{rank}.txt"), "w") as handle:
    handle.write(os.environ["SM_CURRENT_HOST"])
if rank == 0:
    torch.save({"world": world, "sum": total.item(), "host": os.environ["SM_CURRENT_HOST"]},
               os.path.join(os.environ["SM_MODEL_DIR"], "rank0.pt"))
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""

FAILING_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 3:
    time.sleep(0.5)
    {failure}
time.sleep(60)
"""

SLEEPING_SCRIPT = """
import os, time
print(f"rank {os.environ['RANK']} sleeping", flush=True)
time.sleep(120)
"""

CHANNEL_SCRIPT = """
import os
host = os.environ["SM_CURRENT_HOST"]
data = open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "numbers.txt")).read()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"{host}.txt"), "w") as handle:
    handle.write(f"{host} read {data}")
"""


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def write_script(directory: Path, text: str, name: str = "train.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(textwrap.dedent(text))
    return directory


def two_by_two(source_dir: Path, distribution: dict = TORCH_DISTRIBUTED, **overrides) -> PyTorch:
    arguments = dict(
        entry_point="train.py", source_dir=str(source_dir), instance_count=2, instance_type="local",
        distribution=distribution, scheduler_options={"processes_per_host": 2, "stop_grace_period": 2},
    )
    arguments.update(overrides)
    return PyTorch(**arguments)


def processes_of(job_dir: Path) -> list[int]:
    """Live processes that belong to a job: its supervisor (by argv) and everything under its host trees (by env)."""
    marker = str(job_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if marker in (entry / "cmdline").read_bytes() or marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def no_processes_left(job_dir: Path) -> None:
    """The job's state is final before its supervisor exits; give that last step a moment."""
    wait_for(lambda: not processes_of(job_dir), timeout=10)


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@needs_smddp
def test_fit_two_hosts_two_ranks_over_smddp_saves_rank0_model(workdir, capsys):
    estimator = two_by_two(write_script(workdir / "src", SMDDP_SCRIPT), distribution=SMDDP)
    estimator.fit()
    with tarfile.open(estimator.model_data) as archive:
        assert archive.getnames() == ["rank0.pt"]
        archive.extractall(workdir / "model", filter="data")
    import torch

    saved = torch.load(workdir / "model" / "rank0.pt")
    assert saved == {"world": 4, "sum": 10.0, "host": "algo-1"}
    output_data = Path(estimator.model_data).with_name("output.tar.gz")
    with tarfile.open(output_data) as archive:
        assert sorted(archive.getnames()) == ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]
        assert archive.extractfile("rank3.txt").read() == b"algo-2"
    printed = capsys.readouterr().out
    for rank, host in ((0, "algo-1"), (1, "algo-1"), (2, "algo-2"), (3, "algo-2")):
        assert f"[{host}/rank{rank}]: rank {rank} done" in printed
    assert estimator.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    no_processes_left(Path(estimator.model_data).parents[1])


@pytest.mark.parametrize(
    ("failure", "exit_code", "error"),
    [("raise ValueError('rank 3 broke on purpose')", 1, "ValueError: rank 3 broke on purpose"), ("sys.exit(5)", 5, "sys.exit(5)")],
)
def test_a_failing_rank_raises_an_error_naming_host_and_rank(workdir, capsys, failure, exit_code, error):
    estimator = two_by_two(write_script(workdir / "src", FAILING_SCRIPT.replace("{failure}", failure)))
    started = time.monotonic()
    with pytest.raises(JobFailedError) as info:
        estimator.fit()
    assert time.monotonic() - started < 30
    assert f"rank 3 on host algo-2 exited with code {exit_code}" in str(info.value)
    assert error in str(info.value)
    assert (info.value.exit_code, info.value.rank_exit_code) == (1, exit_code)  # the launcher exits 1; the rank's code is kept
    summary = capsys.readouterr().err
    assert summary.rstrip().endswith(f"Logs: smddp-launch logs {estimator.latest_training_job.handle} --rank 3")
    status = estimator.latest_training_job.status()
    assert status.state is JobState.FAILED and (status.failure.host, status.failure.rank) == ("algo-2", 3)
    assert Path(status.failure.log_file).is_file()
    no_processes_left(Path(status.job_dir))


def test_channels_output_path_and_merged_model_dirs_without_distribution(workdir):
    (workdir / "data").mkdir()
    (workdir / "data" / "numbers.txt").write_text("1 2 3")
    estimator = two_by_two(write_script(workdir / "src", CHANNEL_SCRIPT), distribution=None, output_path=f"file://{workdir}/artifacts",
                           scheduler_options={"keep_job_dir": False})
    estimator.fit({"train": "data"}, job_name="channels", logs=False)
    assert estimator.model_data == f"{workdir}/artifacts/channels/output/model.tar.gz"
    with tarfile.open(estimator.model_data) as archive:
        assert sorted(archive.getnames()) == ["algo-1.txt", "algo-2.txt"]
        assert archive.extractfile("algo-2.txt").read() == b"algo-2 read 1 2 3"
    job_dir = workdir / "jobs" / "channels"
    assert sorted(path.name for path in job_dir.iterdir()) == ["console.log", "console.times", "events.jsonl", "job.json", "state.json", "supervisor.log"]


def test_a_detached_job_outlives_its_caller_and_is_cancelled_from_another_process(workdir):
    source = write_script(workdir / "src", SLEEPING_SCRIPT)
    caller = f"""
from smddp_sdk import PyTorch
estimator = PyTorch(entry_point="train.py", source_dir={str(source)!r}, instance_count=2, instance_type="local",
                    distribution={TORCH_DISTRIBUTED!r}, scheduler_options={{"processes_per_host": 2, "stop_grace_period": 2}})
estimator.fit(wait=False)
print(estimator.latest_training_job.handle)
"""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    handle_text = subprocess.run([sys.executable, "-c", caller], env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    handle = JobHandle.parse(handle_text)
    scheduler = get_scheduler("local")
    wait_for(lambda: sum(1 for line in scheduler.logs(handle) if line.text.endswith("sleeping")) == 4)
    assert scheduler.status(handle).state is JobState.RUNNING  # the caller is gone, the job is not

    attached = PyTorch.attach(handle_text)
    assert attached.instance_count == 2 and attached.latest_training_job.name == handle.job_id
    canceller = f"from smddp_sdk.schedulers import get_scheduler; from smddp_sdk.specs.status import JobHandle; get_scheduler('local').cancel(JobHandle.parse({handle_text!r}))"
    subprocess.run([sys.executable, "-c", canceller], env=env, check=True, timeout=60)
    status = scheduler.status(handle)
    assert status.state is JobState.CANCELLED
    described = attached.latest_training_job.describe()
    assert described["TrainingJobStatus"] == "Stopped"
    assert described["ResourceConfig"] == {"InstanceType": "local", "InstanceCount": 2, "VolumeSizeInGB": 30}
    no_processes_left(Path(status.job_dir))
    scheduler.cancel(handle)  # idempotent


@pytest.mark.parametrize("how", ["ctrl-c", "caller killed"])
def test_an_attached_job_ends_with_its_caller(workdir, how):
    source = write_script(workdir / "src", SLEEPING_SCRIPT)
    caller = f"""
import sys
from smddp_sdk import PyTorch
estimator = PyTorch(entry_point="train.py", source_dir={str(source)!r}, instance_count=2, instance_type="local",
                    distribution={TORCH_DISTRIBUTED!r}, scheduler_options={{"processes_per_host": 2, "stop_grace_period": 2}},
                    job_name="attached")
try:
    estimator.fit()
except KeyboardInterrupt:
    sys.exit(130)
"""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    process = subprocess.Popen([sys.executable, "-c", caller], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scheduler = get_scheduler("local")
    handle = JobHandle("local", "attached")
    wait_for(lambda: (workdir / "jobs" / "attached" / "console.log").exists()
             and sum(1 for line in scheduler.logs(handle) if line.text.endswith("sleeping")) == 4)
    process.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
    _, err = process.communicate(timeout=60)
    if how == "ctrl-c":
        assert process.returncode == 130
        assert "smddp: local://attached cancelled" in err
    wait_for(lambda: scheduler.status(handle).state.is_terminal)
    assert scheduler.status(handle).state is JobState.CANCELLED
    no_processes_left(workdir / "jobs" / "attached")


def test_status_and_logs_read_the_job_directory_only(workdir):
    estimator = two_by_two(write_script(workdir / "src", "print('hello from a rank')\n"), job_name="quick")
    estimator.fit(logs=False)
    record = json.loads((workdir / "jobs" / "quick" / "job.json").read_text())
    assert record["handle"] == "local://quick" and record["spec"]["instance_count"] == 2
    fresh = get_scheduler("local")
    lines = [line for line in fresh.logs(JobHandle("local", "quick"), ranks=[0, 3])]
    assert sorted((line.host, line.rank) for line in lines) == [("algo-1", 0), ("algo-2", 3)]
    assert {line.text for line in lines} == {"hello from a rank"}
    assert [status.handle.job_id for status in fresh.list_jobs()] == ["quick"]


def test_max_run_stops_a_job_that_runs_too_long(workdir):
    estimator = two_by_two(write_script(workdir / "src", SLEEPING_SCRIPT), max_run=2)
    with pytest.raises(JobFailedError, match="MaxRuntimeExceeded"):
        estimator.fit(logs=False)
    status = estimator.latest_training_job.status()
    assert status.state is JobState.FAILED and status.ended - status.started < 15
    no_processes_left(Path(status.job_dir))


def test_two_jobs_at_once_get_their_own_ports_and_directories(workdir):
    source = write_script(workdir / "src", "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    first, second = two_by_two(source, job_name="first"), two_by_two(source, job_name="second")
    first.fit(wait=False)
    second.fit(wait=False)
    statuses = [job.latest_training_job.wait(logs=False) for job in (first, second)]
    assert [status.state for status in statuses] == [JobState.SUCCEEDED, JobState.SUCCEEDED]
    ports = [json.loads((workdir / "jobs" / name / "state.json").read_text())["ports"] for name in ("first", "second")]
    assert not set(ports[0].values()) & set(ports[1].values())
    for name in ("first", "second"):
        texts = sorted(line.text for line in get_scheduler("local").logs(JobHandle("local", name)) if line.rank is not None)
        assert texts == [f"rank {rank} of 4" for rank in range(4)]


def test_a_job_root_reached_through_a_symlink_is_the_same_job(workdir):
    source = write_script(workdir / "src", SLEEPING_SCRIPT)
    estimator = two_by_two(source, job_name="linked")
    estimator.fit(wait=False)
    (workdir / "alias").symlink_to(workdir / "jobs")
    other = get_scheduler("local", job_root=str(workdir / "alias"))
    handle = JobHandle("local", "linked")
    wait_for(lambda: other.status(handle).state is JobState.RUNNING)
    assert other.status(handle).state is JobState.RUNNING  # its supervisor is recognised through the alias
    other.cancel(handle)
    assert estimator.latest_training_job.status().state is JobState.CANCELLED
    no_processes_left(workdir / "jobs" / "linked")
