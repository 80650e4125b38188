"""The slurm scheduler without a cluster: the batch script (the dry run), staging, options, states and the
node runtime's reading of Slurm's environment. Slurm itself is a fake client here; tests marked ``slurm``
run the real thing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from smddp_sdk.config.job_file import check_scheduler_options
from smddp_sdk.errors import ContractError, SpecError, SpecIssue
from smddp_sdk.runtime import slurm_node
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.slurm.client import JobInfo
from smddp_sdk.schedulers.slurm.script import BatchPlan, render, time_limit
from smddp_sdk.schedulers.slurm.states import job_state
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec, RetryPolicy
from smddp_sdk.specs.slurm_job import JOB_DIR_ENV, SlurmJobDir
from smddp_sdk.specs.status import JobHandle, JobState


class FakeSlurm:
    """Answers as sbatch/scontrol would; records what was asked."""

    def __init__(self, *, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.submitted: list[Path] = []
        self.cancelled: list[str] = []
        self.info: JobInfo | None = JobInfo("PENDING", "Resources")

    def check(self, script: Path) -> None:
        assert script.is_file()
        if self.refuse:
            raise SpecError(SpecIssue("instance_count", f"Slurm cannot run this job: {self.refuse}"))

    def submit(self, script: Path) -> str:
        self.submitted.append(script)
        return "42"

    def job_info(self, job_id: str) -> JobInfo | None:
        assert job_id == "42"
        return self.info

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    for name in ("a.csv", "b.csv", "c.csv"):
        (tmp_path / "data" / name).write_text(name)
    return source


def spec_for(code: Path, **extra) -> JobSpec:
    data = {
        "entry_point": "train.py",
        "source_dir": str(code),
        "instance_type": "local",
        "instance_count": 2,
        "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
        "max_run": 3600,
        "job_name": "job-1",
        **extra,
    }
    return JobSpec.from_mapping(data)


def test_script_asks_for_one_task_per_node_and_runs_the_node_runtime(tmp_path: Path) -> None:
    script = render(BatchPlan("job-1", tmp_path / "job-1", 3, 90, "/usr/bin/python3", "/code"))
    directives = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "--job-name=job-1",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--time=0-00:02:00",
        f"--chdir={tmp_path / 'job-1'}",
        f"--output={tmp_path / 'job-1' / 'logs' / 'batch.log'}",
        "--open-mode=append",
        "--no-requeue",
    ]
    assert f'srun --quiet --ntasks-per-node=1 --kill-on-bad-exit=0 --open-mode=append --output={tmp_path}/job-1/logs/%N.log "${{auto_resume[@]}}" /usr/bin/python3 -m smddp_sdk.runtime\n' in script
    assert f"export {JOB_DIR_ENV}={tmp_path / 'job-1'}\n" in script
    assert script.rstrip().endswith('exit "$code"')
    assert "if [ -d /opt/sagemaker_cluster ]; then auto_resume=(--auto-resume=1); fi" in script  # auto: decided on the node
    assert "container" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0  # valid bash and "requeue" not in script.split("--no-requeue")[1]


def test_script_renders_every_option(tmp_path: Path) -> None:
    plan = BatchPlan(
        "j",
        tmp_path,
        2,
        86_400 * 2 + 61,
        "python3",
        "/code",
        partition="gpu",
        account="ml",
        extra_sbatch=("--exclusive", "--gres=gpu:8"),
        retry=RetryPolicy(3, script_errors=True),
        auto_resume=True,
        container_image="nvcr.io#nvidia/pytorch:24.01-py3",
        environment={"A": "x y"},
    )
    script = render(plan)
    for line in (
        "#SBATCH --time=2-00:02:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --exclusive",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --requeue",
        "export A='x y'",
        '[ "${SLURM_RESTART_COUNT:-0}" -lt 3 ]',
        'scontrol requeue "$SLURM_JOB_ID"',
    ):
        assert line in script, line
    step = next(line for line in script.splitlines() if line.startswith("srun --quiet --ntasks-per-node"))
    assert "--auto-resume=1" in step and "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in step and f"--container-mounts={tmp_path}:{tmp_path}" in step


@pytest.mark.parametrize(("seconds", "limit"), [(1, "0-00:01:00"), (60, "0-00:01:00"), (3601, "0-01:01:00"), (86_400, "1-00:00:00")])
def test_time_limit_rounds_up_to_minutes(seconds: int, limit: str) -> None:
    assert time_limit(seconds) == limit


def test_dryrun_is_the_script_and_touches_nothing(tmp_path: Path, code: Path) -> None:
    fake = FakeSlurm()
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), partition="debug", client=fake)
    plan = scheduler.dryrun(spec_for(code))
    assert not (tmp_path / "jobs").exists() and not fake.submitted
    rendered = plan.render()
    assert rendered.endswith(render(plan.request)) and "#SBATCH --partition=debug" in rendered
    assert plan.request.handle == "slurm://job-1"
    assert plan.request.artifacts.model_data == tmp_path / "jobs" / "job-1" / "output" / "model.tar.gz"


def test_schedule_stages_code_trees_and_channels_then_submits(tmp_path: Path, code: Path) -> None:
    fake = FakeSlurm()
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), processes_per_host=2, client=fake)
    spec = spec_for(code, inputs={"train": {"s3_data": str(tmp_path / "data"), "distribution": "ShardedByS3Key"}})
    handle = scheduler.submit(spec)
    job_dir = SlurmJobDir(tmp_path / "jobs" / "job-1")
    assert handle == JobHandle("slurm", "job-1") and fake.submitted == [job_dir.script_file]
    assert (job_dir.code_dir / "train.py").is_file()
    shards = [sorted(p.name for p in (tree / "input" / "data" / "train").iterdir()) for tree in job_dir.node_trees()]
    assert shards == [["a.csv", "c.csv"], ["b.csv"]]
    node = json.loads(job_dir.node_file.read_text())
    assert node["processes_per_host"] == 2 and len(node["job_token"]) == 32 and job_dir.path.stat().st_mode & 0o077 == 0
    assert (job_dir.node_tree(0) / "checkpoints").resolve() == job_dir.checkpoint_dir.resolve()
    assert json.loads(job_dir.record_file.read_text())["slurm_job_id"] == "42"
    status = scheduler.status(handle)
    assert status.state is JobState.PENDING and "Resources" in status.message
    scheduler.cancel(handle)
    assert fake.cancelled == ["42"] and job_dir.cancel_file.exists()


def test_a_job_slurm_cannot_run_is_refused_and_leaves_nothing(tmp_path: Path, code: Path) -> None:
    fake = FakeSlurm(refuse="Requested node configuration is not available")
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=fake)
    with pytest.raises(SpecError, match="Requested node configuration is not available"):
        scheduler.submit(spec_for(code))
    assert not (tmp_path / "jobs" / "job-1").exists() and not fake.submitted


def test_every_wrong_option_at_once() -> None:
    with pytest.raises(SpecError) as caught:
        get_scheduler("slurm", partiton="x", retry_script_errors="yes", extra_sbatch=["exclusive"], auto_resume="yes")
    text = str(caught.value)
    for part in ("did you mean 'partition'", "retry_script_errors", "extra_sbatch", "auto_resume"):
        assert part in text


def test_a_name_taken_after_the_plan_is_refused_and_the_other_job_kept(tmp_path: Path, code: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm())
    plan = scheduler.dryrun(spec_for(code))
    scheduler.submit(spec_for(code))
    with pytest.raises(SpecError, match="already exists"):
        scheduler.schedule(plan)
    assert SlurmJobDir(tmp_path / "jobs" / "job-1").exists()


def test_a_job_file_gets_the_declared_checks() -> None:
    issues = check_scheduler_options("slurm", {"retry_script_errors": 99, "auto_resume": "yes", "client": "sbatch", "partition": ""})
    # names first (client is an object, given only from Python), then values, in the file's order
    assert [issue.path for issue in issues] == [f"scheduler_options.{name}" for name in ("client", "partition", "retry_script_errors", "auto_resume")]


def test_dryrun_validates_once_and_reports_every_problem(tmp_path: Path, code: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path), client=FakeSlurm())
    with pytest.raises(SpecError) as caught:
        scheduler.dryrun(spec_for(code, output_path="s3://b/p", use_spot_instances=True, max_wait=7200))
    assert {issue.path for issue in caught.value.issues} >= {"output_path", "use_spot_instances"}


def test_list_jobs_newest_first_and_limited(tmp_path: Path, code: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm())
    for name in ("job-a", "job-b", "job-c"):
        scheduler.submit(spec_for(code, job_name=name))
    for name, submitted in (("job-a", 1000), ("job-b", 3000), ("job-c", 2000)):
        os.utime(SlurmJobDir(tmp_path / "jobs" / name).record_file, (submitted, submitted))
    listed = scheduler.list_jobs(2)
    assert [item.handle.job_id for item in listed] == ["job-b", "job-c"] and {item.state for item in listed} == {JobState.PENDING}


def test_s3_output_and_spot_are_refused(tmp_path: Path, code: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path), client=FakeSlurm())
    paths = {issue.path for issue in scheduler.validate(spec_for(code, output_path="s3://b/p", use_spot_instances=True, max_wait=7200))}
    assert {"output_path", "use_spot_instances"} <= paths


@pytest.mark.parametrize(
    ("info", "result", "state", "words"),
    [
        (JobInfo("PENDING", "PartitionNodeLimit"), None, JobState.PENDING, "never start"),
        (JobInfo("RUNNING"), None, JobState.RUNNING, ""),
        (JobInfo("COMPLETED", exit_code=0), None, JobState.SUCCEEDED, ""),
        (JobInfo("NODE_FAIL", "NodeDown"), None, JobState.FAILED, "not requeued (no max_retry_attempts)"),
        (JobInfo("TIMEOUT"), None, JobState.FAILED, "time limit"),
        (JobInfo("FAILED", exit_code=127), None, JobState.FAILED, "exit code 127"),
        (JobInfo("CANCELLED"), None, JobState.CANCELLED, "scancel"),
        (None, {"exit_code": 0}, JobState.SUCCEEDED, ""),
        (None, {"exit_code": 3}, JobState.FAILED, "exit code 3"),
        (None, None, JobState.UNKNOWN, "no longer knows"),
    ],
)
def test_slurm_states(info, result, state, words) -> None:
    got, message = job_state(info, result, cancel_requested=False, retry=RetryPolicy())
    assert got is state and words in message


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu-[01-02,07],cpu9", ["gpu-01", "gpu-02", "gpu-07", "cpu9"]),
        ("ip-10-1-2-3,ip-10-1-2-4", ["ip-10-1-2-3", "ip-10-1-2-4"]),
        ("a[9-10]b", ["a9b", "a10b"]),
    ],
)
def test_nodelist_expansion(nodelist: str, hosts: list[str]) -> None:
    assert slurm_node.expand_nodelist(nodelist) == hosts


def test_node_environment_from_slurms(tmp_path: Path, code: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), processes_per_host=2, client=FakeSlurm())
    scheduler.submit(spec_for(code))
    job_dir = tmp_path / "jobs" / "job-1"
    environ = {JOB_DIR_ENV: str(job_dir), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "1", "SLURMD_NODENAME": "n2", "SLURM_JOB_ID": "7", contract.MASTER_PORT_ENV: "30000"}
    env = slurm_node.node_environ(environ)
    resource = json.loads((job_dir / "nodes" / "1" / "input" / "config" / "resourceconfig.json").read_text())
    assert resource["hosts"] == ["n1", "n2"] and resource["current_host"] == "n2"
    assert env[contract.BASE_DIR_ENV] == str(job_dir / "nodes" / "1") and env[contract.NUM_GPUS_ENV] == "2"
    assert env[contract.MASTER_PORT_ENV] == "30000"  # the job's own setting wins
    assert (env[contract.SERVER_PORT_ENV], env[contract.AGENT_PORT_ENV]) == tuple(str(p) for p in slurm_node.job_ports(7)[1:])
    assert set(json.loads(env[contract.HOST_ADDRESSES_ENV])) == {"n1", "n2"}
    with pytest.raises(ContractError, match="SLURM_NODEID is not set"):
        slurm_node.node_environ({JOB_DIR_ENV: str(job_dir), "SLURM_JOB_NODELIST": "n1"})
