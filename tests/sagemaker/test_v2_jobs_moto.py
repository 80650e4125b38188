"""v2 habits and jobs by name on SageMaker, against moto: Session, attach, list, logs, metrics, experiments."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from smddp_sdk import PyTorch, job_index
from smddp_sdk.cli.main import cli
from smddp_sdk.inputs import TrainingInput
from smddp_sdk.session import Session, get_execution_role
from tests.sagemaker.conftest import ACCOUNT, REGION, ROLE
from tests.sagemaker.test_flow_moto import write_host_logs

pytestmark = pytest.mark.usefixtures("moto_aws")
METRICS = [{"Name": "loss", "Regex": r"step (\d+)"}]


def estimator(code_dir: Path, **overrides) -> PyTorch:
    arguments = {"entry_point": "train.py", "source_dir": str(code_dir), "role": ROLE, "instance_count": 2,
                 "instance_type": "ml.p4d.24xlarge", "framework_version": "2.2.0", "py_version": "py310",
                 "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}, "metric_definitions": METRICS,
                 "hyperparameters": {"epochs": 3}, "scheduler_options": {"region": REGION, "poll": 0.0, "min_poll": 0.0}}
    arguments.update(overrides)
    return PyTorch(**arguments)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_session_default_bucket_upload_and_download(tmp_path: Path) -> None:
    session = Session()
    assert session.boto_region_name == REGION
    assert session.default_bucket() == f"sagemaker-{REGION}-{ACCOUNT}"
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_text("1\n")
    (data / "sub" / "b.csv").write_text("2\n")
    uri = session.upload_data(str(data), key_prefix="datasets/train")
    assert uri == f"s3://sagemaker-{REGION}-{ACCOUNT}/datasets/train"
    keys = sorted(o["Key"] for o in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=session.default_bucket())["Contents"])
    assert keys == ["datasets/train/a.csv", "datasets/train/sub/b.csv"]
    fetched = session.download_data(str(tmp_path / "back"), session.default_bucket(), "datasets/train")
    assert sorted(Path(p).relative_to(tmp_path / "back").as_posix() for p in fetched) == ["a.csv", "sub/b.csv"]


def test_get_execution_role_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMDDP_ROLE", ROLE)
    assert get_execution_role() == ROLE


def test_fit_with_session_input_and_experiment_config_then_attach_by_name(code_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[dict] = []
    client = boto3.client("sagemaker", region_name=REGION)
    client.meta.events.register("provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: captured.append(params))
    job = estimator(code_dir, sagemaker_session=Session(sagemaker_client=client), scheduler_options={"poll": 0.0, "min_poll": 0.0, "sagemaker_client": client})
    experiment = {"ExperimentName": "exp", "TrialName": "trial", "RunName": "run-1"}
    job.fit(TrainingInput("s3://my-bucket/train", "ShardedByS3Key"), logs=False, experiment_config=experiment)
    assert captured[-1]["ExperimentConfig"] == experiment
    channel = captured[-1]["InputDataConfig"][0]
    assert channel["ChannelName"] == "training" and channel["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "ShardedByS3Key"

    name = job.latest_training_job.name
    assert job_index.find(name).handle == f"sagemaker://{REGION}/{name}"
    attached = PyTorch.attach(name)  # the index knows the region
    assert attached.scheduler == "sagemaker"
    assert (attached.entry_point, attached.instance_count, attached.instance_type) == ("train.py", 2, "ml.p4d.24xlarge")
    assert attached.hyperparameters() == {"epochs": "3"}
    assert attached.role == ROLE and attached.metric_definitions == tuple(METRICS)
    assert attached.spec.distribution.smddp is True
    assert attached.model_data == f"s3://sagemaker-{REGION}-{ACCOUNT}/{name}/output/model.tar.gz"
    # a job submitted elsewhere: a region is enough
    job_index.forget([f"sagemaker://{REGION}/{name}"])
    assert PyTorch.attach(name, scheduler_options={"region": REGION}).instance_count == 2
    assert PyTorch.attach(f"sagemaker://{REGION}/{name}").instance_count == 2


def test_list_status_logs_and_metrics_by_name(code_dir: Path) -> None:
    job = estimator(code_dir)
    job.fit(wait=False)
    name = job.latest_training_job.name
    write_host_logs(name, hosts=2, lines_per_host=3)

    listed = invoke("list")
    assert listed.exit_code == 0 and f"sagemaker://{REGION}/{name}" in listed.stdout
    region_listing = invoke("list", "--scheduler", "sagemaker", "-o", f"region={REGION}")
    assert region_listing.exit_code == 0 and region_listing.stdout.splitlines()[1].startswith(f"sagemaker://{REGION}/{name}  SUCCEEDED")

    status = invoke("status", name)
    assert status.exit_code == 0 and status.stdout.startswith(f"sagemaker://{REGION}/{name}  SUCCEEDED")
    logs = invoke("logs", name, "--host", "2", "--tail", "2", "--timestamps")
    assert [line.split(" ", 2)[2] for line in logs.stdout.splitlines()] == ["[algo-2/rank8]: step 1", "[algo-2/rank8]: step 2"]
    assert invoke("logs", name, "--grep", "step 2$").stdout.splitlines() == ["[algo-1/rank0]: step 2", "[algo-2/rank8]: step 2"]
    assert invoke("logs", name, "--since", "1d").stdout.count("step") == 6
    assert invoke("logs", name, "--since", "1s").stdout == ""  # the lines are a minute old
    missing = invoke("logs", name, "--rank", "9")
    assert missing.exit_code == 2 and "has no lines from ranks 9" in missing.stderr and "ranks 0,8" in missing.stderr

    metrics = invoke("metrics", name)  # the job's own metric_definitions, from the index
    assert metrics.exit_code == 0, metrics.stderr
    assert metrics.stdout.splitlines()[1].split() == ["loss", "3", "2", "0", "2"]  # rank 0's, as v2 reads algo-1's
    assert invoke("metrics", name, "--all-ranks").stdout.splitlines()[1].split() == ["loss", "6", "2", "0", "2"]
    analytics = job.training_job_analytics
    assert [row["value"] for row in analytics.rows()] == [0.0, 1.0, 2.0]


def test_cli_without_boto3_is_exit_3_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for module in [m for m in sys.modules if m.startswith("smddp_sdk.schedulers.sagemaker")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "boto3", None)
    for args in (("status", f"sagemaker://{REGION}/some-job"), ("list", "--scheduler", "sagemaker")):
        result = invoke(*args)
        assert result.exit_code == 3, result.output
        assert "pip install 'smddp-sdk[aws]'" in result.stderr
