"""The estimator on top of the SageMaker scheduler, against moto: v2's ``PyTorch(...).fit()`` surface."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import SpecError
from smddp_sdk.specs.status import JobState
from tests.sagemaker.conftest import ACCOUNT, REGION, ROLE

pytestmark = pytest.mark.usefixtures("moto_aws")


def estimator(code_dir: Path, **overrides) -> PyTorch:
    arguments = {"entry_point": "train.py", "source_dir": str(code_dir), "role": ROLE, "instance_count": 2,
                 "instance_type": "ml.p4d.24xlarge", "framework_version": "2.2.0", "py_version": "py310",
                 "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
                 "scheduler_options": {"region": REGION, "poll": 0.0, "min_poll": 0.0}}
    arguments.update(overrides)
    return PyTorch(**arguments)


def test_fit_submits_follows_and_reports_model_data(code_dir: Path, capsys) -> None:
    job = estimator(code_dir)
    job.fit({"train": "s3://my-bucket/train"})
    assert job.latest_training_job.status().state is JobState.SUCCEEDED
    name = job.latest_training_job.name
    assert job.model_data == f"s3://sagemaker-{REGION}-{ACCOUNT}/{name}/output/model.tar.gz"
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    assert described["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == "s3://my-bucket/train"
    printed = capsys.readouterr()
    assert "[sagemaker]: " in printed.out and "Starting - Preparing the instances for training" in printed.out


def test_dryrun_shows_the_request_and_local_data_is_rejected(code_dir: Path, tmp_path: Path) -> None:
    job = estimator(code_dir)
    request = job.dryrun().request
    assert request["ResourceConfig"] == {"VolumeSizeInGB": 30, "InstanceCount": 2, "InstanceType": "ml.p4d.24xlarge"}
    with pytest.raises(SpecError, match="file:// and local paths only work with the local and docker schedulers"):
        job.fit({"train": str(tmp_path)})
    assert boto3.client("s3", region_name=REGION).list_buckets()["Buckets"] == []
