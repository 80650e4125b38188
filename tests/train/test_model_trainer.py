"""``smddp_sdk.train``: v3's names reach the same JobSpec as the v2 estimator's, the scheduler follows
``training_mode`` or ``scheduler=``, v3-shaped jobs are submitted (moto) with smddp-sdk's driver, and the
runtime reads that driver's hyperparameters."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from smddp_sdk import PyTorch
from smddp_sdk.cli.main import cli
from smddp_sdk.errors import NotOfferedError, SpecError
from smddp_sdk.runtime.training_env import read_training_env
from smddp_sdk.schedulers.sagemaker import request_v3
from smddp_sdk.specs import contract
from smddp_sdk.train import Mode, ModelTrainer
from smddp_sdk.train.configs import CheckpointConfig, Compute, InputData, Networking, RetryStrategy, S3DataSource, SourceCode, StoppingCondition
from smddp_sdk.train.distributed import MPI, Torchrun
from tests.sagemaker.conftest import ACCOUNT, REGION, ROLE, Recorder

IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/smddp-sdk:latest"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "utils").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "utils" / "helpers.py").write_text("X = 1\n")
    return src


def trainer(code: Path, **overrides) -> ModelTrainer:
    arguments = {
        "training_image": IMAGE,
        "role": ROLE,
        "source_code": SourceCode(source_dir=str(code), entry_script="train.py"),
        "compute": Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
        "distributed": Torchrun(),
        **overrides,
    }
    return ModelTrainer(**arguments)


def test_the_same_job_as_the_v2_estimator_but_the_api(code: Path) -> None:
    v3 = trainer(
        code,
        hyperparameters={"epochs": 3},
        environment={"A": "1"},
        networking=Networking(subnets=["subnet-1"], security_group_ids=["sg-1"]),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=1800, max_wait_time_in_seconds=3600),
        compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2, enable_managed_spot_training=True),
        checkpoint_config=CheckpointConfig(s3_uri="s3://my-bucket/ckpt"),
        input_data_config=[InputData(channel_name="train", data_source="s3://my-bucket/train")],
    ).with_retry_strategy(RetryStrategy(maximum_retry_attempts=2))
    v2 = PyTorch(
        entry_point="train.py",
        source_dir=str(code),
        image_uri=IMAGE,
        role=ROLE,
        instance_type="ml.p4d.24xlarge",
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={"epochs": 3},
        environment={"A": "1"},
        subnets=["subnet-1"],
        security_group_ids=["sg-1"],
        max_run=1800,
        max_wait=3600,
        use_spot_instances=True,
        checkpoint_s3_uri="s3://my-bucket/ckpt",
        checkpoint_local_path="/opt/ml/checkpoints",
        max_retry_attempts=2,
        scheduler="sagemaker",
    )
    ours = v3._estimator().job_spec(), v2.job_spec(inputs={"train": "s3://my-bucket/train"})
    assert ours[0].replace(api="v2", inputs={}) == ours[1].replace(inputs={})
    assert ours[0].inputs["train"].s3_data == ours[1].inputs["train"].s3_data
    assert ours[0].api == "v3"


@pytest.mark.parametrize(("mode", "scheduler"), [(Mode.LOCAL_CONTAINER, "docker"), (Mode.SAGEMAKER_TRAINING_JOB, "sagemaker")])
def test_training_mode_picks_the_scheduler(code: Path, mode: Mode, scheduler: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMDDP_SCHEDULER", raising=False)
    assert trainer(code, training_mode=mode).scheduler == scheduler
    assert trainer(code, training_mode=mode, scheduler="slurm").scheduler == "slurm"
    monkeypatch.setenv("SMDDP_SCHEDULER", "local")
    assert trainer(code, training_mode=mode).scheduler == "local"


@pytest.mark.parametrize("where", [{"scheduler": "slurm"}, {"training_mode": Mode.LOCAL_CONTAINER, "scheduler": None}, {"scheduler": "local"}])
def test_every_scheduler_plans_the_same_spec(code: Path, where: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMDDP_SCHEDULER", raising=False)
    v3 = trainer(code, **where, distributed=Torchrun(process_count_per_node=2), compute=Compute(instance_type="ml.g5.12xlarge", instance_count=2))
    plan = v3.dryrun()
    assert plan.scheduler == (where["scheduler"] or "docker")
    assert plan.spec == v3._estimator().spec and plan.spec.api == "v3" and plan.spec.distribution.torch_distributed
    assert "train.py" in plan.render()


def test_process_count_per_node_is_the_ranks_per_host_off_sagemaker(code: Path) -> None:
    local = trainer(code, scheduler="local", distributed=Torchrun(process_count_per_node=2))
    assert local.dryrun().request.ranks.processes_per_host == 2
    mpi = trainer(code, scheduler="local", distributed=MPI(process_count_per_node=3, mpi_additional_options=["-x", "A=1"]))
    assert mpi._estimator().spec.distribution.mpi_custom_mpi_options == "-x A=1"


def test_every_problem_at_construction(code: Path) -> None:
    with pytest.raises(SpecError) as info:
        ModelTrainer(source_code=SourceCode(source_dir=str(code)), compute=Compute(instance_type="ml.nope", instance_count=0), scheduler="local")
    text = str(info.value)
    assert "source_code: smddp-sdk runs a Python entry script" in text
    assert "compute.instance_type: " in text and "compute.instance_count: " in text


@pytest.mark.parametrize(
    "build",
    [
        lambda: SourceCode(entry_script="train.py", command="python train.py"),
        lambda: Compute(instance_type="ml.p4d.24xlarge", instance_groups=[]),
        lambda: S3DataSource(s3_uri="s3://b/x", attribute_names=["a"]),
        lambda: ModelTrainer(algorithm_name="xgboost"),
    ],
)
def test_what_is_not_offered_says_what_to_do(build) -> None:
    with pytest.raises(NotOfferedError, match="SageMaker SDK v3 feature smddp-sdk does not offer; "):
        build()


def test_unknown_config_names_say_so_on_import() -> None:
    with pytest.raises(NotOfferedError, match="FileSystemDataSource"):
        from smddp_sdk.train.configs import FileSystemDataSource  # noqa: F401


def test_hyperparameters_from_a_file(code: Path, tmp_path: Path) -> None:
    (tmp_path / "hp.json").write_text(json.dumps({"epochs": 2, "name": "x"}))
    (tmp_path / "hp.yaml").write_text("epochs: 2\nname: x\n")
    assert trainer(code, hyperparameters=str(tmp_path / "hp.json")).hyperparameters == {"epochs": 2, "name": "x"}
    assert trainer(code, hyperparameters=str(tmp_path / "hp.yaml")).hyperparameters == {"epochs": 2, "name": "x"}


@pytest.mark.usefixtures("moto_aws")
def test_v3_jobs_are_submitted_with_smddp_sdks_driver(code: Path) -> None:
    echo = Recorder()
    v3 = trainer(code, hyperparameters={"epochs": 3}, scheduler_options={"region": REGION, "echo": echo, "log_sink": Recorder(), "poll": 0.0, "sleep": lambda _: None})
    v3.train(wait=False)
    job = v3._latest_training_job
    assert job is not None
    assert job.training_job_name == job.name and job.training_job_status in ("InProgress", "Completed")  # moto ends jobs at once
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=job.name)
    assert described["HyperParameters"] == {"epochs": "3"}
    assert described["AlgorithmSpecification"]["ContainerArguments"] == request_v3.ARGUMENTS
    s3 = boto3.client("s3", region_name=REGION)
    bucket, base = f"sagemaker-{REGION}-{ACCOUNT}", f"smddp-sdk-job/{job.name}/input"
    keys = {item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix=base)["Contents"]}
    assert keys == {f"{base}/code/train.py", f"{base}/code/utils/helpers.py", f"{base}/sm_drivers/sm_train.sh", f"{base}/sm_drivers/hyperparameters.json"}
    framework = json.loads(s3.get_object(Bucket=bucket, Key=f"{base}/sm_drivers/hyperparameters.json")["Body"].read())
    assert contract.decode_hyperparameters(framework)["sagemaker_program"] == "train.py"
    assert contract.decode_hyperparameters(framework)["sagemaker_torch_distributed_enabled"] is True
    assert "epochs" not in framework


def test_the_runtime_reads_the_drivers_hyperparameters(tmp_path: Path) -> None:
    opt_ml = tmp_path / "opt" / "ml"
    (opt_ml / "input" / "config").mkdir(parents=True)
    (opt_ml / "input" / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (opt_ml / "input" / "config" / "hyperparameters.json").write_text(json.dumps({"epochs": "3"}))
    (tmp_path / "train.py").write_text("")
    spec = ModelTrainer(source_code=SourceCode(source_dir=str(tmp_path), entry_script="train.py"), distributed=Torchrun(), scheduler="local")._estimator().spec
    driver = tmp_path / "hyperparameters.json"
    driver.write_text(request_v3.driver_files(spec, job_name="j", region=REGION)["hyperparameters.json"])
    env = read_training_env({"SAGEMAKER_BASE_DIR": str(opt_ml), contract.DRIVER_HYPERPARAMETERS_ENV: str(driver)})
    assert env.user_entry_point == "train.py"
    assert env.hyperparameters == {"epochs": 3}
    assert env.framework_params["sagemaker_torch_distributed_enabled"] is True


def test_dryrun_as_the_other_api(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text(
        "entry_point: train.py\ninstance_type: ml.p4d.24xlarge\ninstance_count: 2\nframework_version: 2.2.0\n"
        "py_version: py310\ndependencies: [.]\ndistribution: {smdistributed: {dataparallel: {enabled: true}}}\n"
        "hyperparameters: {epochs: 3}\nscheduler: sagemaker\nscheduler_options: {sagemaker: {region: us-west-2}}\n"
    )
    as_v3 = CliRunner().invoke(cli, ["run", str(tmp_path / "job.yaml"), "--dryrun", "--as", "v3"])
    assert as_v3.exit_code == 0, as_v3.output
    assert '"ContainerArguments"' in as_v3.output and '"sagemaker_program"' not in as_v3.output.split("=== REQUEST")[1]
    launcher = as_v3.output.split("=== AS V3 LAUNCHER ===\n")[1]
    assert "distributed=Torchrun()" in launcher and "pytorch-training:2.2.0-gpu-py310" in launcher
    assert "# dependencies=" in launcher and "#5668" in launcher
    (tmp_path / "v3.yaml").write_text("api: v3\nentry_point: train.py\ninstance_type: ml.c5.xlarge\nimage_uri: 123456789012.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:1\nscheduler: sagemaker\n")
    as_v2 = CliRunner().invoke(cli, ["run", str(tmp_path / "v3.yaml"), "--dryrun", "--as", "v2"])
    assert as_v2.exit_code == 0, as_v2.output
    assert '"sagemaker_program"' in as_v2.output and "estimator = PyTorch(" in as_v2.output and "image_uri='123456789012.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:1'" in as_v2.output
    refused = CliRunner().invoke(cli, ["run", str(tmp_path / "v3.yaml"), "--as", "v2"])
    assert refused.exit_code == 2 and "--as goes with --dryrun" in refused.output
