"""The ``CreateTrainingJob`` request for a JobSpec, built exactly as SageMaker SDK v2 builds it.

Pure: no boto3, no network, no files read. What needs AWS to know (the account behind the default
bucket, a role given by name) is a ``<account-id>`` placeholder until the client fills it in, which
is what ``dryrun`` shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from smddp_sdk.errors import SpecIssue
from smddp_sdk.schedulers.sagemaker import images
from smddp_sdk.specs.contract import encode_hyperparameters
from smddp_sdk.specs.job import JobSpec, TrainingInput, make_job_name

ACCOUNT_PLACEHOLDER = "<account-id>"
SOURCE_TARBALL = "sourcedir.tar.gz"
# With network isolation the container cannot reach S3, so v2 hands it the code as an input channel.
CODE_CHANNEL = "code"
ISOLATED_SUBMIT_DIRECTORY = f"/opt/ml/input/data/{CODE_CHANNEL}/{SOURCE_TARBALL}"
# Regions where SageMaker Debugger and its profiler do not run (v2 leaves the configs out there).
_NO_DEBUGGER_REGIONS = frozenset({"us-iso-east-1", "us-isob-east-1", "ap-southeast-3", "ap-southeast-4", "eu-south-2", "me-central-1", "ap-south-2", "eu-central-2", "us-gov-east-1"})
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::(\d{12}|<account-id>):role/[\w+=,.@/-]{1,512}$")
_ROLE_NAME = re.compile(r"^[\w+=,.@-]{1,64}$")
_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9]|[a-z0-9.-]*<account-id>)(/.*)?$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return cls(bucket, key)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class Placement:
    """Everything about where a job goes that is not in its spec: region, role, image, S3 locations."""

    region: str
    role_arn: str
    image_uri: str
    output_path: str
    code: S3Location | None  # where sourcedir.tar.gz is uploaded; None when source_dir is already in S3
    submit_directory: str  # the S3 URI of the code tarball the container downloads
    default_bucket: str

    @property
    def needs_account(self) -> bool:
        return ACCOUNT_PLACEHOLDER in self.role_arn or ACCOUNT_PLACEHOLDER in self.default_bucket


def fill_account(request: Any, account: str) -> Any:
    """The request with every ``<account-id>`` replaced by ``account`` (the dry run's request, at submit)."""
    if isinstance(request, str):
        return request.replace(ACCOUNT_PLACEHOLDER, account)
    if isinstance(request, dict):
        return {key: fill_account(value, account) for key, value in request.items()}
    if isinstance(request, list):
        return [fill_account(value, account) for value in request]
    return request


def job_name_for(spec: JobSpec, image_uri: str) -> str:
    """``job_name`` verbatim, else ``<base>-<UTC timestamp>`` with the base from base_job_name or the image."""
    if spec.job_name:
        return spec.job_name
    return make_job_name(spec.base_job_name or images.base_job_name_from_image(image_uri))


def resolve_image(spec: JobSpec, region: str) -> tuple[str | None, list[SpecIssue]]:
    if spec.image_uri:
        return spec.image_uri, []
    return images.training_image_uri(region=region, framework_version=spec.framework_version, py_version=spec.py_version, instance_type=spec.instance_type, distribution=spec.distribution)


def role_arn(role: str, region: str, account: str | None) -> str:
    """A role ARN as given, or the ARN of a role given by name in the caller's account."""
    if role.startswith("arn:"):
        return role
    return f"arn:{images.partition(region)}:iam::{account or ACCOUNT_PLACEHOLDER}:role/{role}"


def role_issues(role: str | None) -> list[SpecIssue]:
    hint = "pass role='arn:aws:iam::<account>:role/<name>' (a role SageMaker can assume; see docs/sagemaker.md)"
    if not role:
        return [SpecIssue("role", "is required to run on SageMaker", hint)]
    if role.startswith("arn:") and not _ROLE_ARN.match(role):
        return [SpecIssue("role", f"{role!r} is not an IAM role ARN", hint)]
    if not role.startswith("arn:") and not _ROLE_NAME.match(role):
        return [SpecIssue("role", f"{role!r} is neither a role ARN nor a role name", hint)]
    return []


def s3_uri_issues(path: str, uri: str | None, what: str) -> list[SpecIssue]:
    if uri is None:
        return []
    if not uri.startswith("s3://"):
        local = "file:// and local paths only work with the local and docker schedulers"
        return [SpecIssue(path, f"{what} must be an s3:// URI on SageMaker, got {uri!r}", local)]
    if not _S3_URI.match(uri):
        return [SpecIssue(path, f"{uri!r} is not a valid S3 URI", "expected s3://<bucket>/<prefix>")]
    return []


def plan_placement(spec: JobSpec, *, job_name: str, region: str, role: str, image_uri: str, account: str | None = None, bucket: str | None = None) -> Placement:
    """Where the code, the output and the role are, by v2's rules (see docs/sagemaker.md, "S3 layout")."""
    default_bucket = bucket or f"sagemaker-{region}-{account or ACCOUNT_PLACEHOLDER}"
    output_path = spec.output_path or f"s3://{default_bucket}/"
    code, submit_directory = _code_location(spec, job_name, default_bucket)
    return Placement(region=region, role_arn=role_arn(role, region, account), image_uri=image_uri, output_path=output_path, code=code, submit_directory=submit_directory, default_bucket=default_bucket)


def _code_location(spec: JobSpec, job_name: str, default_bucket: str) -> tuple[S3Location | None, str]:
    if spec.source_dir and spec.source_dir.startswith("s3://"):
        return None, spec.source_dir
    if spec.code_location:
        base = S3Location.parse(spec.code_location)
    elif spec.output_path:
        base = S3Location(S3Location.parse(spec.output_path).bucket, "")  # v2 keeps only the bucket here
    else:
        base = S3Location(default_bucket, "")
    key = "/".join(part.strip("/") for part in (base.key, job_name, "source", SOURCE_TARBALL) if part.strip("/"))
    location = S3Location(base.bucket, key)
    return location, location.uri


def build_request(spec: JobSpec, *, job_name: str, placement: Placement) -> dict[str, Any]:
    """The ``CreateTrainingJob`` parameters, field for field what v2's ``PyTorch(...).fit()`` sends."""
    request: dict[str, Any] = {
        "AlgorithmSpecification": _algorithm(spec, placement),
        "OutputDataConfig": {"S3OutputPath": placement.output_path, **({"CompressionType": "NONE"} if spec.disable_output_compression else {})},
        "TrainingJobName": job_name,
        "StoppingCondition": stopping_condition(spec),
        "ResourceConfig": _resources(spec),
        "RoleArn": placement.role_arn,
    }
    channels = _channels(spec, placement)
    if channels:
        request["InputDataConfig"] = channels
    request["HyperParameters"] = _hyperparameters(spec, job_name, placement)
    if spec.environment:
        request["Environment"] = dict(spec.environment)
    if spec.tags:
        request["Tags"] = [dict(tag) for tag in spec.tags]
    if spec.subnets and spec.security_group_ids:
        request["VpcConfig"] = {"Subnets": list(spec.subnets), "SecurityGroupIds": list(spec.security_group_ids)}
    _add_flags(request, spec)
    request.update(_debugger(spec, placement))
    if spec.max_retry_attempts is not None:
        request["RetryStrategy"] = {"MaximumRetryAttempts": spec.max_retry_attempts}
    return request


def _algorithm(spec: JobSpec, placement: Placement) -> dict[str, Any]:
    algorithm: dict[str, Any] = {"TrainingInputMode": spec.input_mode, "TrainingImage": placement.image_uri}
    if spec.metric_definitions:
        algorithm["MetricDefinitions"] = [dict(metric) for metric in spec.metric_definitions]
    metrics = _sagemaker_metrics(spec)
    if metrics is not None:
        algorithm["EnableSageMakerMetricsTimeSeries"] = metrics
    return algorithm


def _sagemaker_metrics(spec: JobSpec) -> bool | None:
    """v2's PyTorch estimator turns SageMaker metrics on for framework versions from 1.3."""
    if spec.enable_sagemaker_metrics is not None:
        return spec.enable_sagemaker_metrics
    if spec.framework_version and tuple(int(part) for part in re.findall(r"\d+", spec.framework_version)[:3]) >= (1, 3):
        return True
    return None


def stopping_condition(spec: JobSpec) -> dict[str, int]:
    """CreateTrainingJob's StoppingCondition (v2 and v3 send the same)."""
    stopping = {"MaxRuntimeInSeconds": spec.max_run}
    if spec.max_wait is not None:
        stopping["MaxWaitTimeInSeconds"] = spec.max_wait
    return stopping


def _resources(spec: JobSpec) -> dict[str, Any]:
    resources: dict[str, Any] = {"VolumeSizeInGB": spec.volume_size}
    if spec.keep_alive_period_in_seconds is not None:
        resources["KeepAlivePeriodInSeconds"] = spec.keep_alive_period_in_seconds
    resources["InstanceCount"] = spec.instance_count
    resources["InstanceType"] = spec.instance_type
    return resources


def _channels(spec: JobSpec, placement: Placement) -> list[dict[str, Any]]:
    channels = [_channel(name, channel) for name, channel in spec.inputs.items()]
    if spec.enable_network_isolation and placement.code is not None:
        channels.append(_channel(CODE_CHANNEL, TrainingInput(placement.submit_directory)))
    return channels


def _channel(name: str, channel: TrainingInput) -> dict[str, Any]:
    config: dict[str, Any] = {"DataSource": {"S3DataSource": {"S3DataType": channel.s3_data_type, "S3Uri": channel.s3_data, "S3DataDistributionType": channel.distribution}}}
    optional = (("CompressionType", channel.compression), ("ContentType", channel.content_type), ("RecordWrapperType", channel.record_wrapping), ("InputMode", channel.input_mode))
    config.update({key: value for key, value in optional if value is not None})
    config["ChannelName"] = name
    return config


def _hyperparameters(spec: JobSpec, job_name: str, placement: Placement) -> dict[str, str]:
    submit_directory = ISOLATED_SUBMIT_DIRECTORY if spec.enable_network_isolation and placement.code else placement.submit_directory
    decoded = spec.training_hyperparameters(job_name=job_name, submit_directory=submit_directory, region=placement.region)
    return encode_hyperparameters(decoded)


def switched_on(spec: JobSpec) -> dict[str, bool]:
    """CreateTrainingJob's boolean switches the job turns on (v2 and v3 send them alike, only when on)."""
    switches = (("EnableNetworkIsolation", spec.enable_network_isolation),
                ("EnableInterContainerTrafficEncryption", spec.encrypt_inter_container_traffic),
                ("EnableManagedSpotTraining", spec.use_spot_instances))
    return {name: True for name, on in switches if on}


def _add_flags(request: dict[str, Any], spec: JobSpec) -> None:
    request.update(switched_on(spec))
    if spec.checkpoint_s3_uri:
        checkpoint = {"S3Uri": spec.checkpoint_s3_uri}
        if spec.checkpoint_local_path:
            checkpoint["LocalPath"] = spec.checkpoint_local_path
        request["CheckpointConfig"] = checkpoint


def _debugger(spec: JobSpec, placement: Placement) -> dict[str, Any]:
    """Debugger hook and profiler blocks, which v2 adds by default where the region has them."""
    supported = placement.region not in _NO_DEBUGGER_REGIONS
    out: dict[str, Any] = {}
    if supported and spec.debugger_hook_config is not False and not _debugger_auto_disabled(spec):
        out["DebugHookConfig"] = {"S3OutputPath": placement.output_path, "CollectionConfigurations": []}
    if spec.disable_profiler or not supported:
        out["ProfilerConfig"] = {"DisableProfiler": True}
    else:
        out["ProfilerConfig"] = {"S3OutputPath": placement.output_path, "DisableProfiler": False}
    return out


def _debugger_auto_disabled(spec: JobSpec) -> bool:
    """v2 drops the hook for distributed jobs that checkpoint to a local path (it would fight the checkpoints)."""
    distributed = spec.instance_count > 1 or bool(spec.distribution.given)
    return bool(spec.checkpoint_s3_uri and spec.checkpoint_local_path and distributed)
