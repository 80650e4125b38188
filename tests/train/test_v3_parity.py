"""Parity with SageMaker SDK v3: for the same ``ModelTrainer`` arguments, our CreateTrainingJob request
equals the one ``sagemaker-train`` builds (captured under moto), apart from the job name's timestamp.

The oracle runs in its own virtualenv (scripts/setup-sagemaker-v3-oracle.sh) so that v3's pins never touch
the project's environment; ``SMDDP_SAGEMAKER_V3_ORACLE_PYTHON`` points at another interpreter that has it.
Each case is written once, as the oracle reads it: ModelTrainer's keyword arguments with every
configuration object as a mapping of its fields; ``build_trainer`` makes our trainer from the same text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.train import ModelTrainer, configs, distributed
from tests.train.v3_case_objects import train_inputs, trainer_arguments, with_builders

REPO = Path(__file__).resolve().parents[2]
ORACLE_SCRIPT = Path(__file__).with_name("v3_oracle.py")
ACCOUNT = "123456789012"  # moto's account
REGION = "us-west-2"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/smddp-sdk:latest"
BASE = {"training_image": IMAGE, "role": ROLE, "source_code": {"source_dir": "{src}", "entry_script": "train.py"}}
EVERY_JSON_TYPE = {"epochs": 10, "lr": 0.001, "model": "resnet50", "amp": True, "fp16": False, "layers": [64, 128], "optimizer": {"name": "adamw", "betas": [0.9, 0.999]}, "seed": None, "empty": ""}

CASES: dict[str, dict[str, Any]] = {
    "source-code-with-requirements": {"trainer": {**BASE, "source_code": {"source_dir": "{src}", "entry_script": "train.py", "requirements": "requirements.txt"}, "hyperparameters": EVERY_JSON_TYPE}},
    "several-channels": {
        "trainer": {
            **BASE,
            "input_data_config": [
                {"channel_name": "train", "data_source": "s3://my-bucket/data/train"},
                {"channel_name": "val", "data_source": {"s3_uri": "s3://my-bucket/data/val", "s3_data_type": "S3Prefix", "s3_data_distribution_type": "ShardedByS3Key"}},
                {"channel_name": "test", "data_source": "s3://my-bucket/data/test", "content_type": "application/x-npy"},
            ],
        },
        "inputs": [{"channel_name": "train", "data_source": "s3://my-bucket/data/train-v2"}, {"channel_name": "extra", "data_source": "s3://my-bucket/data/extra"}],
    },
    "torchrun-several-instances": {"trainer": {**BASE, "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 4}, "distributed": {"Torchrun": {"process_count_per_node": 8}}}},
    "torchrun-smp": {
        "trainer": {**BASE, "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2}, "distributed": {"Torchrun": {"smp": {"hybrid_shard_degree": 2, "tensor_parallel_degree": 8}}}}
    },
    "mpi": {
        "trainer": {
            **BASE,
            "compute": {"instance_type": "ml.g5.12xlarge", "instance_count": 2},
            "distributed": {"MPI": {"process_count_per_node": 4, "mpi_additional_options": ["-x", "NCCL_DEBUG=INFO"]}},
        }
    },
    "spot-with-checkpoints": {
        "trainer": {
            **BASE,
            "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2, "enable_managed_spot_training": True},
            "stopping_condition": {"max_runtime_in_seconds": 1800, "max_wait_time_in_seconds": 7200},
            "checkpoint_config": {"s3_uri": "s3://my-bucket/ckpt/run-1", "local_path": "/opt/ml/checkpoints/model"},
        }
    },
    "default-checkpoints": {"trainer": {**BASE, "compute": {"instance_type": "ml.c5.xlarge"}}, "with": {"checkpoint_config": {}}},
    "vpc": {
        "trainer": {**BASE, "networking": {"subnets": ["subnet-1", "subnet-2"], "security_group_ids": ["sg-1"], "enable_network_isolation": True, "enable_inter_container_traffic_encryption": True}}
    },
    "environment-output-tags": {
        "trainer": {
            **BASE,
            "environment": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"},
            "base_job_name": "my-smddp",
            "output_data_config": {"s3_output_path": "s3://my-bucket/out"},
            "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 1, "volume_size_in_gb": 200, "keep_alive_period_in_seconds": 600},
            "tags": [{"key": "team", "value": "ml"}],
            "training_input_mode": "FastFile",
        }
    },
    "retries-and-metrics": {"trainer": BASE, "with": {"retry_strategy": {"maximum_retry_attempts": 2}, "metric_definitions": [{"name": "loss", "regex": "loss=([0-9.]+)"}]}},
    "defaults": {"trainer": BASE},
}


def _oracle_python() -> Path | None:
    configured = os.environ.get("SMDDP_SAGEMAKER_V3_ORACLE_PYTHON")
    candidate = Path(configured) if configured else REPO / ".oracle" / "v3-venv" / "bin" / "python"
    return candidate if candidate.exists() else None


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    src = tmp_path_factory.mktemp("v3-parity") / "src"
    (src / "utils").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "requirements.txt").write_text("\n")
    (src / "utils" / "helpers.py").write_text("X = 1\n")
    return {"src": str(src)}


def _fill(value: Any, paths: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**paths) if value.startswith("{") else value
    if isinstance(value, list):
        return [_fill(item, paths) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, paths) for key, item in value.items()}
    return value


def run_oracle(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    python = _oracle_python()
    if python is None:
        pytest.skip("SageMaker SDK v3 oracle (sagemaker-train) not installed: run scripts/setup-sagemaker-v3-oracle.sh (scripts/test.sh does) or set SMDDP_SAGEMAKER_V3_ORACLE_PYTHON")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PYTHON"))}
    env.update({"AWS_EC2_METADATA_DISABLED": "true", "TZ": "UTC"})
    result = subprocess.run([str(python), str(ORACLE_SCRIPT)], input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def oracle(code: dict[str, str]) -> dict[str, dict[str, Any]]:
    """One oracle run for every case (importing v3 alone takes seconds)."""
    cases = []
    for case in CASES.values():
        filled = _fill(case, code)
        buckets = sorted({uri[5:].split("/")[0] for uri in re.findall(r"s3://[^\"']+", json.dumps(filled))})
        cases.append({"region": REGION, "buckets": buckets, **filled})
    return dict(zip(CASES, run_oracle(cases), strict=True))


def build_trainer(case: dict[str, Any]) -> tuple[ModelTrainer, list[configs.InputData] | None]:
    """Our trainer from a case's text, the way v3_oracle.py builds v3's (same classes by the same names)."""
    arguments = trainer_arguments(case["trainer"], configs, distributed)
    trainer = ModelTrainer(scheduler_options={"region": REGION, "account_id": ACCOUNT}, **arguments)
    return with_builders(trainer, case.get("with"), configs), train_inputs(case, configs)


def ours(case: dict[str, Any]) -> dict[str, Any]:
    trainer, inputs = build_trainer(case)
    return trainer.dryrun(inputs).request


def _without_job_name(request: dict[str, Any]) -> dict[str, Any]:
    name = request["TrainingJobName"]
    return json.loads(json.dumps(request).replace(name, "<job-name>"))


def _job_name_base(name: str) -> str:
    return re.sub(r"-\d{14}$", "", name)


@pytest.mark.parametrize("case", list(CASES))
def test_request_matches_sagemaker_sdk_v3(case: str, oracle: dict[str, dict[str, Any]], code: dict[str, str]) -> None:
    expected = oracle[case]
    assert "request" in expected, f"v3 rejected the case: {expected.get('error')}"
    actual = ours(_fill(CASES[case], code))
    assert _without_job_name(actual) == _without_job_name(expected["request"])
    assert _job_name_base(actual["TrainingJobName"]) == _job_name_base(expected["request"]["TrainingJobName"])
    assert re.search(r"-\d{14}$", actual["TrainingJobName"]), actual["TrainingJobName"]
    assert list(actual["HyperParameters"]) == list(expected["request"]["HyperParameters"]), "hyperparameter order differs"
