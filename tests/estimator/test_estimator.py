"""The PyTorch estimator: v2 arguments, collect-all validation, scheduler choice, and its pure dryrun."""

import json
import subprocess
import sys

import pytest

from smddp_sdk import Estimator, PyTorch
from smddp_sdk.errors import SpecError
from smddp_sdk.estimator import spec_from_dict
from smddp_sdk.specs.contract import decode_hyperparameters

SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A source dir with an entry point and a data dir; the cwd is the project (relative paths resolve here)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helpers.py").write_text("X = 1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.csv").write_text("1,2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    return tmp_path


def estimator(**overrides):
    arguments = dict(entry_point="train.py", source_dir="src", instance_count=2, instance_type="local", distribution=SMDDP)
    arguments.update(overrides)
    return PyTorch(**arguments)


def issues_of(**overrides):
    with pytest.raises(SpecError) as info:
        estimator(**overrides)
    return [str(issue) for issue in info.value.issues]


def test_every_problem_is_reported_at_once(project):
    found = issues_of(
        instance_cout=2,
        instance_count=0,
        rules=["a debugger rule"],
        scheduler="locl",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}, "modelparallel": {"enabled": True}}},
        source_dir="missing",
    )
    assert "instance_cout: unknown argument (did you mean 'instance_count'?)" in found
    assert "instance_count: must be at least 1, got 0" in found
    assert any(issue.startswith("rules: is a SageMaker SDK v2 argument") and "Debugger" in issue for issue in found)
    assert "scheduler: unknown scheduler 'locl' (did you mean 'local'?)" in found
    assert any("dataparallel and modelparallel cannot be used together" in issue for issue in found)
    assert "source_dir: directory 'missing' does not exist" in found
    assert len(found) == 6


def test_nothing_is_written_when_arguments_are_bad(project):
    with pytest.raises(SpecError):
        estimator(instance_count="two")
    assert not (project / "jobs").exists()


@pytest.mark.parametrize(
    ("argument", "hint"),
    [("git_config", "source_dir"), ("instance_groups", "instance_count"), ("model_uri", "fit(inputs="), ("container_entry_point", "entry_point")],
)
def test_v2_arguments_without_meaning_here_say_what_to_do_instead(project, argument, hint):
    (found,) = issues_of(**{argument: "x"})
    assert found.startswith(f"{argument}: is a SageMaker SDK v2 argument smddp-sdk does not support")
    assert hint in found


def test_scheduler_options_typo_is_caught_before_anything_runs(project):
    bad = estimator(scheduler_options={"processes_per_hots": 2})
    with pytest.raises(SpecError) as info:
        bad.dryrun()
    assert str(info.value.issues[0]) == "scheduler_options.processes_per_hots: unknown option of the local scheduler (did you mean 'processes_per_host'?)"


def test_scheduler_is_inferred_from_the_instance_type(project):
    assert estimator(instance_type="local").scheduler == "local"
    assert estimator(instance_type="local_gpu").scheduler == "local"
    assert estimator(instance_type="ml.p4d.24xlarge", framework_version="2.2.0", py_version="py310").scheduler == "sagemaker"
    assert estimator(instance_type="ml.p4d.24xlarge", scheduler="local").scheduler == "local"


def test_v2_positional_order_and_attributes(project):
    job = PyTorch("train.py", "2.2.0", "py310", "src", {"epochs": 2, "model": "resnet"}, None, SMDDP, instance_type="local")
    assert job.framework_version == "2.2.0" and job.py_version == "py310" and job.instance_count == 1
    assert job.source_dir == str(project / "src")
    assert job.hyperparameters() == {"epochs": "2", "model": '"resnet"'}
    with pytest.raises(AttributeError):
        job.no_such_attribute  # noqa: B018


def test_generic_estimator_takes_keywords(project):
    job = Estimator(entry_point="src/train.py", instance_type="local")
    assert job.spec.program == "train.py"
    assert job.model_data is None and job.latest_training_job is None


def test_dryrun_is_pure_and_shows_the_exact_per_host_files(project):
    job = estimator(hyperparameters={"epochs": 3, "lr": 0.1}, scheduler_options={"processes_per_host": 2}, dependencies=["lib"])
    dryrun = job.dryrun(inputs={"train": "data"}, job_name="my-job")
    assert not (project / "jobs").exists()
    request = dryrun.request
    assert dryrun.scheduler == "local" and dryrun.job_name == "my-job" and request.handle == "local://my-job"
    assert request.ranks.to_json() == {"launcher": "smddp", "processes_per_host": 2, "world_size": 4}
    assert [host.host for host in request.hosts] == ["algo-1", "algo-2"]
    second = request.hosts[1]
    assert second.opt_ml == project / "jobs" / "my-job" / "algo-2"
    assert request.process.command[1:] == ("-m", "smddp_sdk.runtime")
    environment = request.environment("algo-2")
    assert environment["SAGEMAKER_BASE_DIR"] == str(second.opt_ml)
    assert json.loads(environment["SMDDP_HOST_ADDRESSES"]) == {"algo-1": "127.0.0.1", "algo-2": "127.0.0.1"}
    assert environment["SMDDP_NUM_GPUS"] == "2"
    config = request.config_files.for_host("algo-2")
    assert config["resource"]["current_host"] == "algo-2"
    assert config["resource"]["hosts"] == ["algo-1", "algo-2"]
    assert config["input_data"] == {"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}}
    hyperparameters = config["hyperparameters"]
    assert list(hyperparameters) == [
        "epochs", "lr", "sagemaker_submit_directory", "sagemaker_program", "sagemaker_container_log_level",
        "sagemaker_job_name", "sagemaker_distributed_dataparallel_enabled", "sagemaker_instance_type",
        "sagemaker_distributed_dataparallel_custom_mpi_options",
    ]
    assert hyperparameters["sagemaker_program"] == '"train.py"'
    assert decode_hyperparameters(hyperparameters)["sagemaker_submit_directory"] == f"file://{project / 'jobs' / 'my-job' / 'code'}"
    assert request.inputs["train"] == {"source": str(project / "data"), "target": "input/data/train"}
    assert request.artifacts.model_data == project / "jobs" / "my-job" / "output" / "model.tar.gz"
    assert json.loads(dryrun.render())["job_name"] == "my-job"


def test_dryrun_output_path_and_instance_catalogue(project):
    dryrun = estimator(instance_type="ml.p4d.24xlarge", scheduler="local", output_path=f"file://{project}/out").dryrun(job_name="j")
    assert dryrun.request.ranks.processes_per_host == 8 and dryrun.request.ranks.world_size == 16
    assert dryrun.request.artifacts.model_data == project / "out" / "j" / "output" / "model.tar.gz"
    assert any("8 GPUs" in note for note in dryrun.notes)


def test_dryrun_without_distribution_runs_one_process_per_host(project):
    dryrun = estimator(distribution=None, instance_type="ml.g5.12xlarge", scheduler="local").dryrun()
    assert dryrun.request.ranks.to_json() == {"launcher": "none", "processes_per_host": 1, "world_size": 2}
    assert dryrun.job_name.startswith("pytorch-training-")


def test_local_scheduler_rejects_what_it_cannot_run(project):
    # S3 inputs, checkpoint_s3_uri, an S3 output_path (tests/estimator/test_rehearse_v2.py) and spot are emulated
    # (tests/fidelity, tests/faults); Pipe mode and outside-/opt/ml checkpoints are not.
    job = estimator(use_spot_instances=True, max_wait=100, output_path="s3://bucket/out", checkpoint_s3_uri="s3://bucket/ckpt",
                    checkpoint_local_path="/tmp/ckpt", input_mode="Pipe")
    with pytest.raises(SpecError) as info:
        job.dryrun(inputs={"train": "s3://bucket/train"})
    paths = [issue.path for issue in info.value.issues]
    assert paths == ["input_mode", "checkpoint_local_path"]


def test_modelparallel_is_translated_but_not_run_locally(project):
    job = estimator(distribution={"smdistributed": {"modelparallel": {"enabled": True, "parameters": {"tensor_parallel_degree": 2}}}})
    with pytest.raises(SpecError) as info:
        job.dryrun()
    assert info.value.issues[0].path == "distribution.smdistributed.modelparallel"
    assert "SMP" in str(info.value)


def test_unwritable_output_path_is_a_spec_error(project):
    (project / "file").write_text("not a directory")
    with pytest.raises(SpecError) as info:
        estimator(output_path=str(project / "file" / "out")).dryrun()
    assert "is not a directory" in str(info.value)


def test_fit_rejects_a_bad_logs_value_before_starting(project):
    with pytest.raises(SpecError, match="logs"):
        estimator().fit(logs="Everything")
    assert not (project / "jobs").exists()


def test_logs_and_attach_without_a_job_explain_themselves(project):
    with pytest.raises(SpecError, match="call fit"):
        estimator().logs()
    with pytest.raises(SpecError, match="no local job 'nope'"):
        PyTorch.attach("local://nope")
    with pytest.raises(SpecError, match="no job named 'some-sagemaker-job' was submitted from this machine"):
        PyTorch.attach("some-sagemaker-job")
    with pytest.raises(SpecError, match="region"):
        PyTorch.attach("some-sagemaker-job", scheduler="sagemaker")


def test_spec_survives_a_round_trip_through_its_record(project):
    spec = estimator(inputs={"train": "data"}, tags=[{"Key": "team", "Value": "ml"}], dependencies=["lib"]).spec
    assert spec_from_dict(json.loads(json.dumps(spec.as_dict()))) == spec


@pytest.mark.parametrize(
    "module",
    ["smddp_sdk.estimator", "smddp_sdk.launcher", "smddp_sdk.schedulers.local", "smddp_sdk.schedulers.hosttree.supervisor", "smddp_sdk.schedulers.docker"],
)
def test_client_side_modules_never_import_heavy_packages(module):
    blocked = ("torch", "boto3", "botocore", "click", "yaml", "docker")
    code = f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\nimport {module}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
