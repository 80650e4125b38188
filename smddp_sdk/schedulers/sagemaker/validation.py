"""What SageMaker would reject, found before anything is uploaded: the role, S3 locations, the instance
type rules, the image reference and the API's limits. Pure: no boto3, no network."""

from __future__ import annotations

import re

from smddp_sdk.errors import SpecIssue
from smddp_sdk.schedulers.sagemaker import request as req
from smddp_sdk.specs import smddp_support
from smddp_sdk.specs.contract import encode_hyperparameters
from smddp_sdk.specs.job import JobSpec

_IMAGE = re.compile(r"^[a-z0-9][a-z0-9.-]*(:\d+)?/[a-z0-9._/-]+(:[\w.-]{1,128})?(@sha256:[0-9a-f]{64})?$")
_ECR_IMAGE = re.compile(r"^\d{12}\.dkr\.ecr(-fips)?\.[a-z0-9-]+\.[a-z0-9.]+/")
# Limits of the CreateTrainingJob API, checked here so a mistake costs no upload.
_MAX_HYPERPARAMETERS = 100
_MAX_HYPERPARAMETER_VALUE = 2500
_MAX_ENVIRONMENT_VALUE = 512
_MAX_TAGS = 50
_MAX_KEEP_ALIVE = 3600


def spec_issues(spec: JobSpec) -> list[SpecIssue]:
    """Every problem SageMaker would have with ``spec`` (the image choice itself is checked by ``images``).
    A missing role is no problem yet: a dry run shows a placeholder, and ``run`` requires one."""
    issues = req.role_issues(spec.role) if spec.role else []
    issues += _location_issues(spec)
    issues += _instance_issues(spec)
    issues += smddp_issues(spec)
    issues += _image_issues(spec)
    issues += _limit_issues(spec)
    return issues + _range_issues(spec)


def _location_issues(spec: JobSpec) -> list[SpecIssue]:
    issues = [issue for name in ("output_path", "code_location", "checkpoint_s3_uri") for issue in req.s3_uri_issues(name, getattr(spec, name), name)]
    for name, channel in spec.inputs.items():
        issues += req.s3_uri_issues(f"inputs.{name}.s3_data", channel.s3_data, "input data")
    if spec.source_dir and spec.source_dir.startswith("s3://"):
        if not spec.source_dir.endswith(".tar.gz"):
            issues.append(SpecIssue("source_dir", f"an S3 source_dir must be a .tar.gz archive, got {spec.source_dir!r}"))
        if spec.dependencies:
            issues.append(SpecIssue("dependencies", "are packed only with a local source_dir", "put them inside the S3 archive, or use a local source_dir"))
    if bool(spec.subnets) != bool(spec.security_group_ids):
        issues.append(SpecIssue("subnets" if not spec.subnets else "security_group_ids", "a VPC needs both subnets and security_group_ids", "set both, or neither"))
    return issues


def _instance_issues(spec: JobSpec) -> list[SpecIssue]:
    issues = []
    if spec.instance_type.startswith("local"):
        issues.append(SpecIssue("instance_type", f"{spec.instance_type!r} runs on this machine, not on SageMaker", "use an ml.* instance type, or the local/docker scheduler"))
    dist = spec.distribution
    if "p5.48xlarge" in spec.instance_type and (dist.smddp or dist.modelparallel is not None) and not dist.torch_distributed:
        issues.append(SpecIssue("distribution", "smdistributed on p5 instances needs torch_distributed too", "add 'torch_distributed': {'enabled': True}"))
    return issues


# SageMaker SDK v2's fw_utils.SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS["pytorch"]: v2 refuses smdistributed
# dataparallel with any other framework_version unless image_uri is given (frozen at 2.2.0 in v2).
SMDDP_FRAMEWORK_VERSIONS = (
    "1.6",
    "1.6.0",
    "1.7",
    "1.7.1",
    "1.8",
    "1.8.0",
    "1.8.1",
    "1.9",
    "1.9.0",
    "1.9.1",
    "1.10",
    "1.10.0",
    "1.10.2",
    "1.11",
    "1.11.0",
    "1.12",
    "1.12.0",
    "1.12.1",
    "1.13.1",
    "2.0.0",
    "2.0.1",
    "2.1.0",
    "2.1.2",
    "2.2.0",
)


def smddp_issues(spec: JobSpec) -> list[SpecIssue]:
    """smdistributed dataparallel on AWS's images: v2's framework and Python rules, and the instance
    types AWS's SMDDP supports. v2 stopped checking the instance type in 2.221.1 (its list is dead code),
    so there the job fails only once it runs; we refuse it up front. With image_uri every rule is
    skipped, as in v2: the image brings its own collectives (ours runs anywhere)."""
    if not spec.distribution.smddp or spec.image_uri:
        return []
    issues = []
    if spec.framework_version and spec.framework_version not in SMDDP_FRAMEWORK_VERSIONS:
        issues.append(
            SpecIssue(
                "framework_version",
                f"Provided framework_version {spec.framework_version} is not supported by smdataparallel (SageMaker SDK v2's rule)",
                f"use one of {', '.join(SMDDP_FRAMEWORK_VERSIONS)}, or set image_uri",
            )
        )
    if spec.py_version and "py3" not in spec.py_version:
        issues.append(SpecIssue("py_version", f"Provided py_version {spec.py_version} is not supported by smdataparallel", "use py_version>=py3"))
    if not spec.instance_type.startswith("local") and not smddp_support.instance_type_supported(spec.instance_type):
        supported = ", ".join(smddp_support.SUPPORTED_INSTANCE_TYPES)
        issues.append(
            SpecIssue(
                "instance_type",
                f"AWS's SMDDP library does not support {spec.instance_type}; it runs on {supported}",
                "pick one of those, use torch_distributed (torchrun with NCCL) on other types, or set image_uri to an image that brings its own smddp backend, such as this project's",
            )
        )
    return issues


def _image_issues(spec: JobSpec) -> list[SpecIssue]:
    image = spec.image_uri
    if image is None:
        return []
    if not _IMAGE.match(image):
        return [SpecIssue("image_uri", f"{image!r} is not an image reference", "expected <registry>/<repository>[:tag], e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:latest")]
    if not _ECR_IMAGE.match(image):
        return [
            SpecIssue("image_uri", f"SageMaker pulls training images from Amazon ECR, not from {image.split('/', 1)[0]!r}", "push the image to ECR with scripts/push-ecr.sh and use the URI it prints")
        ]
    return []


def _limit_issues(spec: JobSpec) -> list[SpecIssue]:
    issues = []
    if len(spec.hyperparameters) > _MAX_HYPERPARAMETERS - 10:  # v2 adds up to 10 sagemaker_* keys
        issues.append(
            SpecIssue(
                "hyperparameters",
                f"SageMaker takes at most {_MAX_HYPERPARAMETERS} hyperparameters including the sagemaker_* ones; got {len(spec.hyperparameters)}",
                "pass a config file in source_dir instead",
            )
        )
    for key, value in spec.hyperparameters.items():
        try:
            encoded = encode_hyperparameters({key: value})[key]
        except (TypeError, ValueError):
            issues.append(SpecIssue(f"hyperparameters.{key}", f"{type(value).__name__} values cannot be sent to SageMaker", "use strings, numbers, booleans, lists or mappings of them"))
            continue
        if len(encoded) > _MAX_HYPERPARAMETER_VALUE:
            issues.append(
                SpecIssue(f"hyperparameters.{key}", f"is {len(encoded)} characters once JSON-encoded; SageMaker allows {_MAX_HYPERPARAMETER_VALUE}", "put large values in a file in source_dir")
            )
    for key, value in spec.environment.items():
        if len(value) > _MAX_ENVIRONMENT_VALUE:
            issues.append(SpecIssue(f"environment.{key}", f"is {len(value)} characters; SageMaker allows {_MAX_ENVIRONMENT_VALUE}"))
    if len(spec.tags) > _MAX_TAGS:
        issues.append(SpecIssue("tags", f"SageMaker allows at most {_MAX_TAGS} tags, got {len(spec.tags)}"))
    return issues


def _range_issues(spec: JobSpec) -> list[SpecIssue]:
    """Ranges CreateTrainingJob enforces, so a mistake is caught before the upload."""
    issues = []
    if spec.max_wait is not None and spec.max_wait < spec.max_run:
        issues.append(SpecIssue("max_wait", f"must be at least max_run ({spec.max_run}), got {spec.max_wait}", "it bounds the spot wait plus the run"))
    if spec.keep_alive_period_in_seconds is not None and spec.keep_alive_period_in_seconds > _MAX_KEEP_ALIVE:
        issues.append(SpecIssue("keep_alive_period_in_seconds", f"SageMaker keeps warm pools at most {_MAX_KEEP_ALIVE} s, got {spec.keep_alive_period_in_seconds}"))
    return issues
