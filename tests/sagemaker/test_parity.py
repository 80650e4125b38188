"""Parity with SageMaker SDK v2: for the same estimator arguments, our CreateTrainingJob request equals
the one ``sagemaker<3`` builds (captured under moto), apart from the job name's timestamp.

The oracle runs in its own virtualenv (scripts/setup-sagemaker-oracle.sh) so that v2's pins never touch
the project's environment; ``SMDDP_SAGEMAKER_ORACLE_PYTHON`` points at another interpreter that has it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.sagemaker import images
from smddp_sdk.specs.distribution import parse_distribution
from smddp_sdk.specs.job import JobSpec

REPO = Path(__file__).resolve().parents[2]
ORACLE_SCRIPT = Path(__file__).with_name("v2_oracle.py")
ACCOUNT = "123456789012"  # moto's account
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}
BASE = {"entry_point": "train.py", "source_dir": "{src}", "role": ROLE, "instance_count": 2,
        "instance_type": "ml.p4d.24xlarge", "framework_version": "2.2.0", "py_version": "py310"}

CASES: dict[str, dict[str, Any]] = {
    "minimal-smddp": {**BASE, "distribution": SMDDP,
                      "hyperparameters": {"epochs": 10, "lr": 0.01, "model": "resnet50", "amp": True, "layers": [1, 2]}},
    "full": {**BASE, "distribution": SMDDP, "hyperparameters": {"epochs": 10},
             "output_path": "s3://my-bucket/out", "code_location": "s3://my-code-bucket/prefix",
             "environment": {"NCCL_DEBUG": "INFO"}, "max_run": 3600, "volume_size": 100,
             "checkpoint_s3_uri": "s3://my-bucket/ckpt", "use_spot_instances": True, "max_wait": 7200,
             "base_job_name": "my-smddp", "dependencies": ["{dep}"], "container_log_level": 10,
             "tags": [{"Key": "team", "Value": "ml"}], "disable_profiler": True, "debugger_hook_config": False,
             "keep_alive_period_in_seconds": 600, "max_retry_attempts": 2,
             "inputs": {"train": "s3://my-bucket/data/train",
                        "val": {"s3_data": "s3://my-bucket/data/val", "distribution": "ShardedByS3Key", "content_type": "application/x-npy"}}},
    "no-distribution-cpu": {**BASE, "instance_count": 1, "instance_type": "ml.c5.xlarge", "framework_version": "2.5.1", "py_version": "py311"},
    "smddp-disabled": {**BASE, "distribution": {"smdistributed": {"dataparallel": {"enabled": False}}}},
    "smddp-custom-mpi": {**BASE, "distribution": {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-verbose -x NCCL_DEBUG=INFO"}}}},
    "pytorchddp": {**BASE, "distribution": {"pytorchddp": {"enabled": True}}},
    "torch-distributed": {**BASE, "instance_type": "ml.g5.12xlarge", "framework_version": "2.3.0", "py_version": "py311",
                          "distribution": {"torch_distributed": {"enabled": True}}},
    "smddp-and-torch-distributed-p5": {**BASE, "instance_type": "ml.p5.48xlarge",
                                       "distribution": {**SMDDP, "torch_distributed": {"enabled": True}}},
    "mpi": {**BASE, "instance_type": "ml.g5.12xlarge", "distribution": {"mpi": {"enabled": True, "processes_per_host": 4, "custom_mpi_options": "-x FOO=1"}}},
    "smp-v2": {**BASE, "distribution": {"torch_distributed": {"enabled": True},
                                        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {"tensor_parallel_degree": 8, "hybrid_shard_degree": 1}}}}},
    "custom-image": {**{k: v for k, v in BASE.items() if k not in ("framework_version", "py_version")}, "distribution": SMDDP,
                     "image_uri": f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:latest"},
    "channels-plain": {**BASE, "inputs": {"train": "s3://my-bucket/data/train", "test": "s3://my-bucket/data/test"}},
    "channels-all-options": {**BASE, "input_mode": "FastFile", "inputs": {"train": {
        "s3_data": "s3://my-bucket/manifest", "distribution": "ShardedByS3Key", "content_type": "text/csv",
        "compression": "Gzip", "record_wrapping": "RecordIO", "s3_data_type": "ManifestFile", "input_mode": "Pipe"}}},
    "input-string-is-training-channel": {**BASE, "inputs": "s3://my-bucket/data"},
    "network-vpc-metrics-checkpoints": {**BASE, "distribution": SMDDP, "enable_network_isolation": True,
                                        "encrypt_inter_container_traffic": True, "subnets": ["subnet-1"], "security_group_ids": ["sg-1"],
                                        "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
                                        "checkpoint_s3_uri": "s3://my-bucket/ckpt", "checkpoint_local_path": "/opt/ml/checkpoints",
                                        "enable_sagemaker_metrics": False},
    "retries-spot-checkpoints": {**BASE, "distribution": SMDDP, "max_retry_attempts": 1, "use_spot_instances": True, "max_run": 1800,
                                 "max_wait": 1800, "checkpoint_s3_uri": "s3://my-bucket/ckpt/run-1", "checkpoint_local_path": "/opt/ml/checkpoints/model"},
    "region-without-debugger": {**BASE, "region": "eu-central-2"},
    "china-region": {**BASE, "region": "cn-north-1", "role": "arn:aws-cn:iam::123456789012:role/SageMakerRole"},
    "s3-source-tarball": {**BASE, "source_dir": "s3://my-bucket/code/sourcedir.tar.gz"},
    "entry-point-only": {**{k: v for k, v in BASE.items() if k != "source_dir"}, "entry_point": "{script}", "instance_count": 1},
    "explicit-job-name": {**BASE, "job_name": "my-exact-job"},
    "legacy-1.6-on-p4d": {**BASE, "framework_version": "1.6.0", "py_version": "py3", "distribution": SMDDP},
    "version-alias": {**BASE, "framework_version": "2.2", "py_version": "py310"},
    "output-path-prefix": {**BASE, "output_path": "s3://my-bucket/some/prefix/"},
    "output-uncompressed": {**BASE, "distribution": SMDDP, "disable_output_compression": True},
}


IMAGE_REGIONS = ("us-west-2", "us-east-1", "cn-north-1", "us-gov-west-1", "us-iso-east-1", "us-isob-east-1",
                 "il-central-1", "af-south-1", "eu-central-2", "mx-central-1")
IMAGE_INSTANCES = ("ml.c5.xlarge", "ml.p4d.24xlarge", "ml.g5.2xlarge")
SMP = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {"enabled": True}}}


def image_cases() -> list[dict[str, Any]]:
    """Every published version and Python version, in regions of every partition, on CPU and GPU."""
    table = images._data()["frameworks"]
    cases = []
    for framework, distribution in (("pytorch", None), ("pytorch-smp", SMP)):
        config = table[framework]
        versions = {**{v: v for v in config["versions"]}, **config["version_aliases"]}
        for version, key in versions.items():
            for py in config["versions"][key]["py_versions"]:
                for region in IMAGE_REGIONS:
                    for instance in IMAGE_INSTANCES if framework == "pytorch" else ("ml.p4d.24xlarge", "ml.p5.48xlarge"):
                        cases.append({"region": region, "framework_version": version, "py_version": py,
                                      "instance_type": instance, "distribution": distribution})
    return cases


def _oracle_python() -> Path | None:
    configured = os.environ.get("SMDDP_SAGEMAKER_ORACLE_PYTHON")
    candidate = Path(configured) if configured else REPO / ".oracle" / "venv" / "bin" / "python"
    return candidate if candidate.exists() else None


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("parity")
    src = root / "src"
    (src / "utils").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "requirements.txt").write_text("\n")
    (src / "utils" / "helpers.py").write_text("X = 1\n")
    dep = root / "dep_lib"
    dep.mkdir()
    (dep / "dep.py").write_text("Y = 2\n")
    script = root / "solo" / "solo_train.py"
    script.parent.mkdir()
    script.write_text("print('solo')\n")
    return {"src": str(src), "dep": str(dep), "script": str(script)}


def _fill(value: Any, paths: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**paths) if value.startswith("{") else value
    if isinstance(value, list):
        return [_fill(item, paths) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, paths) for key, item in value.items()}
    return value


def _oracle_case(arguments: dict[str, Any]) -> dict[str, Any]:
    estimator = copy.deepcopy(arguments)
    region = estimator.pop("region", "us-west-2")
    inputs = estimator.pop("inputs", None)
    job_name = estimator.pop("job_name", None)
    buckets = sorted({uri[5:].split("/")[0] for uri in re.findall(r"s3://[^\"']+", json.dumps(arguments))})
    return {"region": region, "estimator": estimator, "inputs": inputs, "job_name": job_name, "buckets": buckets}


def run_oracle(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    python = _oracle_python()
    if python is None:
        pytest.skip("SageMaker SDK v2 oracle not installed: run scripts/setup-sagemaker-oracle.sh "
                    "(scripts/test.sh does) or set SMDDP_SAGEMAKER_ORACLE_PYTHON")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PYTHON"))}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    result = subprocess.run([str(python), str(ORACLE_SCRIPT)], input=json.dumps(cases), capture_output=True,
                            text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def oracle_answers(code: dict[str, str]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """One oracle run for every case (importing v2 alone takes seconds): the requests, then the images."""
    requests = [_oracle_case(_fill(arguments, code)) for arguments in CASES.values()]
    answers = run_oracle(requests + [{"image": case} for case in image_cases()])
    return dict(zip(CASES, answers[: len(requests)], strict=True)), answers[len(requests) :]


@pytest.fixture(scope="module")
def oracle(oracle_answers: tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return oracle_answers[0]


def ours(arguments: dict[str, Any]) -> dict[str, Any]:
    arguments = copy.deepcopy(arguments)
    region = arguments.pop("region", "us-west-2")
    spec = JobSpec.from_mapping(arguments)
    scheduler = get_scheduler("sagemaker", region=region, account_id=ACCOUNT)
    return scheduler.dryrun(spec).request


def _without_job_name(request: dict[str, Any]) -> dict[str, Any]:
    name = request["TrainingJobName"]
    return json.loads(json.dumps(request).replace(name, "<job-name>"))


def _job_name_base(name: str) -> str:
    return re.sub(r"-\d{4}(-\d{2}){5}-\d{3}$", "", name)


@pytest.mark.parametrize("case", list(CASES))
def test_request_matches_sagemaker_sdk_v2(case: str, oracle: dict[str, dict[str, Any]], code: dict[str, str]) -> None:
    expected = oracle[case]
    assert "request" in expected, f"v2 rejected the case: {expected.get('error')}"
    actual = ours(_fill(CASES[case], code))
    assert _without_job_name(actual) == _without_job_name(expected["request"])
    assert _job_name_base(actual["TrainingJobName"]) == _job_name_base(expected["request"]["TrainingJobName"])
    assert list(actual["HyperParameters"]) == list(expected["request"]["HyperParameters"]), "hyperparameter order differs"


def test_image_uris_match_sagemaker_sdk_v2(oracle_answers: tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]) -> None:
    cases = image_cases()
    expected = oracle_answers[1]
    mismatches = []
    for case, want in zip(cases, expected, strict=True):
        distribution, _ = parse_distribution(case["distribution"])
        got, issues = images.training_image_uri(region=case["region"], framework_version=case["framework_version"],
                                                py_version=case["py_version"], instance_type=case["instance_type"],
                                                distribution=distribution)
        if got != want.get("image") or (got is None) != bool(issues):
            mismatches.append((case, want, got, [str(i) for i in issues]))
    assert len(cases) > 500
    assert not mismatches, mismatches[:5]
