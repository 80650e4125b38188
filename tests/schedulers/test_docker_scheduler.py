"""The docker scheduler without an engine: the planned request, the job tree, and errors that say what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.errors import EXIT_UNAVAILABLE, SpecError, UnavailableError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.docker import DEFAULT_IMAGE, LABEL_HOST, LABEL_JOB, DockerScheduler
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec

SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


@pytest.fixture()
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hello')\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"x")
    return code


def make_spec(code_dir: Path, **overrides) -> JobSpec:
    data = {
        "entry_point": "train.py",
        "source_dir": str(code_dir),
        "instance_type": "local",
        "instance_count": 2,
        "distribution": SMDDP,
        "hyperparameters": {"epochs": 3, "model-name": "cnn"},
        "job_name": "unit-job",
        **overrides,
    }
    return JobSpec.from_mapping(data)


def argv_of(dryrun, host_index: int = 0) -> list[str]:
    return list(dryrun.request.hosts[host_index].create)


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == option]


def test_registry_builds_the_docker_scheduler(tmp_path):
    scheduler = get_scheduler("docker", job_root=tmp_path)
    assert isinstance(scheduler, DockerScheduler)


def test_dryrun_plans_one_labelled_container_per_host_on_a_job_network(code_dir, tmp_path):
    dryrun = DockerScheduler(job_root=tmp_path / "jobs").dryrun(make_spec(code_dir))
    request = dryrun.request
    assert request.image == DEFAULT_IMAGE
    assert request.network[-1] == "smddp-unit-job"
    assert f"{LABEL_JOB}=unit-job" in request.network
    hosts = [item.host for item in request.hosts]
    assert hosts == ["algo-1", "algo-2"]
    for index, host in enumerate(hosts):
        argv = argv_of(dryrun, index)
        assert argv[0] == "create" and argv[-2:] == [DEFAULT_IMAGE, "train"]
        assert option_values(argv, "--hostname") == [host]
        assert option_values(argv, "--network-alias") == [host]
        assert option_values(argv, "--network") == ["smddp-unit-job"]
        assert f"{LABEL_JOB}=unit-job" in option_values(argv, "--label")
        assert f"{LABEL_HOST}={host}" in option_values(argv, "--label")
        job_dir = tmp_path / "jobs" / "unit-job"
        assert option_values(argv, "-v") == [f"{job_dir / host}:/opt/ml", f"{job_dir / 'code'}:/opt/smddp/code:ro", f"{job_dir / 'lifeline'}:/opt/smddp/lifeline", f"{job_dir / 'scratch' / host}:/opt/smddp/scratch"]
        assert "SMDDP_LIFELINE=/opt/smddp/lifeline" in option_values(argv, "-e")
        assert option_values(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
        assert option_values(argv, "--shm-size") == ["2g"]
        assert "--gpus" not in argv
    # Planning is pure: nothing written.
    assert not (tmp_path / "jobs").exists()


def test_dryrun_hyperparameters_point_at_the_code_in_the_container(code_dir, tmp_path):
    dryrun = DockerScheduler(job_root=tmp_path).dryrun(make_spec(code_dir))
    decoded = contract.decode_hyperparameters(dryrun.request.config_files.hyperparameters)
    assert decoded["sagemaker_submit_directory"] == "file:///opt/smddp/code"
    assert decoded["sagemaker_program"] == "train.py"
    assert decoded["epochs"] == 3 and decoded["model-name"] == "cnn"
    assert decoded["sagemaker_distributed_dataparallel_enabled"] is True


def test_user_environment_and_options_reach_every_container(code_dir, tmp_path):
    spec = make_spec(code_dir, environment={"SMDDP_NUM_GPUS": "2", "MY_FLAG": "on"}, image_uri="my/image:1")
    dryrun = DockerScheduler(job_root=tmp_path, shm_size="8g", user="1234:1234", processes_per_host=3).dryrun(spec)
    argv = argv_of(dryrun, 1)
    env = option_values(argv, "-e")
    assert {"TRAINING_JOB_NAME=unit-job", "SMDDP_NUM_GPUS=2", "MY_FLAG=on", "HOME=/tmp"} <= set(env)  # the user's env wins
    assert "SMDDP_NUM_GPUS=3" not in env
    assert option_values(argv, "--shm-size") == ["8g"]
    assert option_values(argv, "--user") == ["1234:1234"]
    assert argv[-2] == "my/image:1"


def test_gpu_instance_types_ask_for_gpus_unless_told_to_rehearse_on_cpu(code_dir, tmp_path):
    spec = make_spec(code_dir, instance_type="ml.p4d.24xlarge")
    auto = DockerScheduler(job_root=tmp_path).dryrun(spec)
    assert option_values(argv_of(auto), "--gpus") == ["all"]
    assert not any(e.startswith("SMDDP_NUM_GPUS=") for e in option_values(argv_of(auto), "-e"))
    cpu = DockerScheduler(job_root=tmp_path, gpus="none").dryrun(spec)
    assert "--gpus" not in argv_of(cpu)
    assert "SMDDP_NUM_GPUS=8" in option_values(argv_of(cpu), "-e")
    assert any("rehearsed on CPU" in note for note in cpu.notes)


def test_local_input_channels_are_mounted_read_only(code_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = make_spec(code_dir, inputs={"train": f"file://{data}"})
    argv = argv_of(DockerScheduler(job_root=tmp_path).dryrun(spec))
    assert f"{data.resolve()}:/opt/ml/input/data/train:ro" in option_values(argv, "-v")


def test_s3_inputs_are_downloaded_and_pipe_mode_is_refused(code_dir, tmp_path):
    spec = make_spec(code_dir, inputs={"train": "s3://bucket/prefix"})
    scheduler = DockerScheduler(job_root=tmp_path)
    assert scheduler.validate(spec) == []
    plan = scheduler.dryrun(spec)
    assert not any("/opt/ml/input/data/train" in v for v in option_values(argv_of(plan), "-v"))  # files in the tree
    assert any("downloaded through boto3" in note for note in plan.notes)
    issues = scheduler.validate(make_spec(code_dir, inputs={"train": {"s3_data": "s3://bucket/prefix", "input_mode": "Pipe"}}))
    assert [issue.path for issue in issues] == ["inputs.train"] and "Pipe mode" in issues[0].message


def test_sharded_local_channels_are_not_mounted_whole(code_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = make_spec(code_dir, inputs={"train": {"s3_data": str(data), "distribution": "ShardedByS3Key"}})
    argv = argv_of(DockerScheduler(job_root=tmp_path).dryrun(spec))
    assert not any("/opt/ml/input/data/train" in v for v in option_values(argv, "-v"))


def test_bad_options_are_all_reported_with_suggestions(tmp_path):
    with pytest.raises(SpecError) as caught:
        DockerScheduler(job_root=tmp_path, gpus="some", processes_per_host=0, user="me", keep_contaners=True)
    paths = [issue.path for issue in caught.value.issues]
    assert paths == [
        "scheduler_options.keep_contaners",
        "scheduler_options.gpus",
        "scheduler_options.processes_per_host",
        "scheduler_options.user",
    ]
    assert "keep_containers" in str(caught.value)


def test_processes_per_host_sets_the_ranks_of_every_host(code_dir, tmp_path):
    dryrun = DockerScheduler(job_root=tmp_path, processes_per_host=2).dryrun(make_spec(code_dir))
    assert all("SMDDP_NUM_GPUS=2" in option_values(list(host.create), "-e") for host in dryrun.request.hosts)


def test_job_tree_has_every_host_config_code_and_mount_points(code_dir, tmp_path):
    spec = make_spec(code_dir, inputs={"train": str(code_dir)})
    scheduler = DockerScheduler(job_root=tmp_path)
    dryrun = scheduler.dryrun(spec)
    dryrun, job_dir = scheduler._claim_job_dir(dryrun)
    assert job_dir == JobDir(dryrun.request.job_dir)
    assert job_dir.path.stat().st_mode & 0o777 == 0o700  # the job's files are the caller's alone
    scheduler._write_job_dir(dryrun, job_dir)
    assert (job_dir.code_dir / "train.py").read_text() == "print('hello')\n"
    assert not (job_dir.code_dir / "__pycache__").exists()
    assert (job_dir.path / "lifeline").is_fifo()
    for host, planned in zip(("algo-1", "algo-2"), dryrun.request.hosts):
        opt_ml = contract.OptMl(job_dir.host_dir(host))
        assert planned.opt_ml == opt_ml.base  # the dry run shows the trees that are written
        resource = json.loads(opt_ml.resource_config_file.read_text())
        assert resource["current_host"] == host and resource["hosts"] == ["algo-1", "algo-2"]
        assert resource == dryrun.request.config_files.for_host(host)["resource"]
        assert json.loads(opt_ml.hyperparameters_file.read_text()) == dryrun.request.config_files.hyperparameters
        assert json.loads(opt_ml.input_data_config_file.read_text())["train"]["TrainingInputMode"] == "File"
        # Mount points exist and are plain directories (the data is mounted, not linked).
        assert opt_ml.channel_dir("train").is_dir() and not opt_ml.channel_dir("train").is_symlink()
        assert opt_ml.code_dir.is_dir() and opt_ml.output_dir.is_dir()
    with pytest.raises(SpecError, match="already exists"):
        scheduler._claim_job_dir(dryrun)


def test_no_engine_is_unavailable_with_how_to_start_one(code_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    scheduler = DockerScheduler(job_root=tmp_path / "jobs")
    with pytest.raises(UnavailableError) as caught:
        scheduler.submit(make_spec(code_dir))
    assert caught.value.exit_code == EXIT_UNAVAILABLE
    assert "no Docker engine answers" in str(caught.value)
    assert "docker-engine.sh start" in str(caught.value)
    assert not (tmp_path / "jobs").exists()


def test_missing_docker_cli_is_unavailable(code_dir, tmp_path):
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", docker=str(tmp_path / "no-such-docker"))
    with pytest.raises(UnavailableError, match="is not installed"):
        scheduler.submit(make_spec(code_dir))


@pytest.mark.parametrize(
    ("raw", "host", "rank", "text"),
    [
        ("[algo-2/rank3]: loss 0.5\n", "algo-2", 3, "loss 0.5"),
        ("[algo-1/runtime]: started ranks\n", "algo-1", None, "started ranks"),
        ("[algo-1]: started ranks\n", "algo-1", None, "started ranks"),
        ("plain line\n", "algo-1", None, "plain line"),
    ],
)
def test_one_console_line_parser_for_every_mode(raw, host, rank, text):
    line = contract.parse_console_line(raw, "algo-1")
    assert (line.host, line.rank, line.text) == (host, rank, text)


def test_root_cause_is_read_from_the_runtime_failure_file():
    text = "Root cause: rank 3 on host algo-2 failed with exit code 1: RuntimeError: boom\nExitCode 1\n"
    cause = contract.parse_root_cause(text)
    assert (cause.host, cause.rank, cause.exit_code) == ("algo-2", 3, 1)
    cause = contract.parse_root_cause("Root cause: the runtime on host algo-1 failed with exit code 143: SIGTERM\n")
    assert (cause.host, cause.rank, cause.exit_code) == ("algo-1", None, 143)
    assert contract.parse_root_cause("something else") is None


def test_docker_scheduler_imports_no_heavy_module():
    code = (
        "import sys\n"
        "for name in ('torch', 'boto3', 'botocore', 'docker', 'click', 'yaml'): sys.modules[name] = None\n"
        "import smddp_sdk.schedulers.docker\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
