"""The pure side: validation before anything is uploaded, the dryrun request, images and names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.errors import EXIT_SPEC, SpecError, UnavailableError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.sagemaker import images, request
from smddp_sdk.specs.distribution import parse_distribution
from tests.sagemaker.conftest import ACCOUNT, REGION, ROLE


def scheduler(**options):
    return get_scheduler("sagemaker", region=REGION, **options)


def issue_paths(error: SpecError) -> dict[str, str]:
    return {issue.path: str(issue) for issue in error.issues}


def test_dryrun_shows_placeholders_for_what_needs_the_account(make_spec) -> None:
    dry = scheduler().dryrun(make_spec())
    bucket = f"sagemaker-{REGION}-<account-id>"
    assert dry.request["OutputDataConfig"]["S3OutputPath"] == f"s3://{bucket}/"
    submit = dry.request["HyperParameters"]["sagemaker_submit_directory"]
    assert submit == f'"s3://{bucket}/{dry.job_name}/source/sourcedir.tar.gz"'
    assert any("would upload sourcedir.tar.gz" in note for note in dry.notes)
    assert any(f"would create s3://{bucket}" in note for note in dry.notes)
    assert '"TrainingJobName": "' + dry.job_name in dry.render()


def test_dryrun_with_known_account_and_role_name_expands_the_arn(make_spec) -> None:
    dry = scheduler(account_id=ACCOUNT, role="MyRole").dryrun(make_spec(role=None))
    assert dry.request["RoleArn"] == f"arn:aws:iam::{ACCOUNT}:role/MyRole"
    assert "<account-id>" not in dry.render()


def test_role_name_in_china_gets_the_china_partition(make_spec) -> None:
    dry = get_scheduler("sagemaker", region="cn-north-1", account_id=ACCOUNT).dryrun(make_spec(role="R"))
    assert dry.request["RoleArn"] == f"arn:aws-cn:iam::{ACCOUNT}:role/R"
    assert dry.request["AlgorithmSpecification"]["TrainingImage"].startswith("727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/")


class NoAws:
    """A boto3 session that fails the test if anything asks it for a client (nothing may be sent)."""

    region_name = None  # as with no region in the environment or ~/.aws/config

    def client(self, service: str, **_: object) -> None:
        raise AssertionError(f"a dry run asked for a {service} client")


def test_a_dry_run_needs_no_region_role_or_credentials_and_says_what_is_a_placeholder(make_spec, monkeypatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    unconfigured = get_scheduler("sagemaker", session=NoAws())
    dry = unconfigured.dryrun(make_spec(role=None))
    assert dry.request["RoleArn"] == "arn:aws:iam::<account-id>:role/<execution-role>"
    assert dry.request["HyperParameters"]["sagemaker_region"] == '"us-east-1"'
    assert dry.request["OutputDataConfig"]["S3OutputPath"] == "s3://sagemaker-us-east-1-<account-id>/"
    placeholders = [note for note in dry.notes if note.startswith("placeholder: ")]
    assert [note.split(" (")[0].split(" in ")[0] for note in placeholders] == [
        "placeholder: region us-east-1",
        "placeholder: role arn:aws:iam::<account-id>:role/<execution-role>",
        "placeholder: <account-id>",
    ]
    assert "the role ARN and the bucket s3://sagemaker-us-east-1-<account-id>" in placeholders[2]
    # Submitting it is refused before AWS is asked anything: a role first (exit 2), then a region (exit 3).
    with pytest.raises(SpecError) as caught:
        unconfigured.schedule(dry)
    assert caught.value.exit_code == EXIT_SPEC
    assert "role: is required to run on SageMaker" in str(caught.value)
    assert "arn:aws:iam::<account>:role/<name>" in str(caught.value)


def test_a_configured_region_and_role_are_no_placeholders(make_spec) -> None:
    dry = scheduler(account_id=ACCOUNT).dryrun(make_spec())
    assert not [note for note in dry.notes if note.startswith("placeholder: ")]


def test_every_problem_is_reported_at_once(make_spec, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    spec = make_spec(
        role="arn:aws:iam::12:user/me", output_path=f"file://{tmp_path}", inputs={"train": str(data)}, checkpoint_s3_uri="/local/ckpt", image_uri="docker.io/library/python:3.11", subnets=["subnet-1"]
    )
    with pytest.raises(SpecError) as caught:
        scheduler().dryrun(spec)
    paths = issue_paths(caught.value)
    assert "is not an IAM role ARN" in paths["role"]
    assert "output_path must be an s3:// URI on SageMaker" in paths["output_path"]
    assert "file:// and local paths only work with the local and docker schedulers" in paths["output_path"]
    assert "input data must be an s3:// URI" in paths["inputs.train.s3_data"]
    assert "checkpoint_s3_uri" in paths
    assert "scripts/push-ecr.sh" in paths["image_uri"]
    assert "needs both subnets and security_group_ids" in paths["security_group_ids"]


def test_local_instance_type_points_at_the_local_scheduler(make_spec) -> None:
    with pytest.raises(SpecError, match="runs on this machine, not on SageMaker"):
        scheduler().dryrun(make_spec(instance_type="local", instance_count=1))


@pytest.mark.parametrize(
    ("overrides", "path", "text"),
    [
        ({"framework_version": "9.9"}, "framework_version", "AWS publishes no PyTorch training image for version '9.9'"),
        ({"framework_version": None, "py_version": None}, "framework_version", "is required when image_uri is not given"),
        ({"py_version": "py38"}, "py_version", "images are built for py310, not 'py38'"),
        ({"instance_type": "ml.trn1.32xlarge", "distribution": None}, "instance_type", "no TRN build"),
    ],
)
def test_image_problems_are_found_before_upload(make_spec, overrides, path, text) -> None:
    with pytest.raises(SpecError) as caught:
        scheduler().dryrun(make_spec(**overrides))
    assert text in issue_paths(caught.value)[path]


def test_region_without_the_image_says_to_set_image_uri(make_spec) -> None:
    with pytest.raises(SpecError, match="no PyTorch 0.4.0 training image in region 'il-central-1'"):
        get_scheduler("sagemaker", region="il-central-1").dryrun(make_spec(framework_version="0.4.0", py_version="py3"))


def test_p5_with_smddp_needs_torch_distributed_before_upload(make_spec) -> None:
    with pytest.raises(SpecError, match="add 'torch_distributed'"):
        scheduler().dryrun(make_spec(instance_type="ml.p5.48xlarge"))


def test_api_limits_are_checked_before_upload(make_spec) -> None:
    with pytest.raises(SpecError) as not_json:  # the spec itself refuses values JSON cannot carry
        make_spec(hyperparameters={"path": Path("data")})
    assert "a value of type PosixPath is not JSON" in issue_paths(not_json.value)["hyperparameters.path"]
    spec = make_spec(hyperparameters={"blob": "x" * 3000}, environment={"E": "y" * 600})
    with pytest.raises(SpecError) as caught:
        scheduler().dryrun(spec)
    paths = issue_paths(caught.value)
    assert "SageMaker allows 2500" in paths["hyperparameters.blob"]
    assert "SageMaker allows 512" in paths["environment.E"]
    with pytest.raises(SpecError) as caught:  # values that are not JSON are refused for every scheduler
        make_spec(hyperparameters={"path": Path("data")})
    assert "a value of type PosixPath is not JSON" in issue_paths(caught.value)["hyperparameters.path"]


def test_api_ranges_are_checked_before_upload(make_spec) -> None:
    spec = make_spec(use_spot_instances=True, max_run=7200, max_wait=3600, keep_alive_period_in_seconds=7200)
    with pytest.raises(SpecError) as caught:
        scheduler().dryrun(spec)
    paths = issue_paths(caught.value)
    assert "must be at least max_run (7200), got 3600" in paths["max_wait"]
    assert "at most 3600 s" in paths["keep_alive_period_in_seconds"]  # max_retry_attempts: the spec's own bound (test_retry_policy)


def test_no_region_is_a_placeholder_in_a_dry_run_and_unavailable_at_submit(make_spec, monkeypatch, tmp_path) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    unconfigured = get_scheduler("sagemaker")
    dry = unconfigured.dryrun(make_spec())  # boto3 finds no region in the (missing) config: a placeholder
    assert any(note.startswith("placeholder: region us-east-1") for note in dry.notes)
    with pytest.raises(UnavailableError) as caught:
        unconfigured.schedule(dry)
    assert caught.value.exit_code == 3
    assert "AWS_REGION" in str(caught.value)


def test_job_names_follow_v2() -> None:
    name = request.job_name_for(_spec_stub(), "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.2.0-gpu-py310")
    assert re.fullmatch(r"pytorch-training-\d{4}(-\d{2}){5}-\d{3}", name)
    assert images.base_job_name_from_image("123.dkr.ecr.x.amazonaws.com/my_repo.v2@sha256:" + "a" * 64) == "my-repo-v2"
    assert images.base_job_name_from_image("localhost:5000/team/smddp:latest") == "smddp"


def _spec_stub():
    from smddp_sdk.specs.job import JobSpec

    return JobSpec(entry_point="train.py", instance_type="ml.c5.xlarge")


@pytest.mark.parametrize(
    ("version", "py", "instance", "distribution", "expected"),
    [
        ("2.2.0", "py310", "ml.c5.xlarge", None, "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.2.0-cpu-py310"),
        ("2.8", None, "ml.g5.2xlarge", None, "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.8-gpu-py312"),
        ("1.6.0", "py3", "ml.p4d.24xlarge", None, "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:1.6.0-gpu-py3-cu110-ubuntu18.04"),
        (
            "2.2.0",
            "py310",
            "ml.p4d.24xlarge",
            {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {"enabled": True}}},
            "658645717510.dkr.ecr.us-west-2.amazonaws.com/smdistributed-modelparallel:2.2.0-gpu-py310-cu121",
        ),
    ],
)
def test_aws_image_resolution(version, py, instance, distribution, expected) -> None:
    dist, _ = parse_distribution(distribution)
    uri, issues = images.training_image_uri(region=REGION, framework_version=version, py_version=py, instance_type=instance, distribution=dist)
    assert issues == []
    assert uri == expected


def test_request_builder_and_dryrun_import_without_boto3(code_dir: Path) -> None:
    program = (
        "import sys\n"
        "for name in ('boto3', 'botocore', 'torch'): sys.modules[name] = None\n"
        "from smddp_sdk.schedulers import get_scheduler\n"
        "from smddp_sdk.specs.job import JobSpec\n"
        f"spec = JobSpec.from_mapping(dict(entry_point='train.py', source_dir={str(code_dir)!r}, role={ROLE!r},"
        " instance_type='ml.g5.2xlarge', framework_version='2.5.1', py_version='py311'))\n"
        f"print(get_scheduler('sagemaker', region={REGION!r}).dryrun(spec).request['AlgorithmSpecification']['TrainingImage'])\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False, cwd=Path(request.__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("pytorch-training:2.5.1-gpu-py311")
