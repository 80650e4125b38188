"""The ``CreateTrainingJob`` request for a JobSpec with ``api: v3``, shaped as SageMaker SDK v3's
``ModelTrainer.train()`` sends it.

v3 ships no code tarball in a hyperparameter: the code directory and a directory of drivers become two
input channels (``code`` and ``sm_drivers``) uploaded under ``<bucket>/<base job name>/<job>/input/``,
and the container's entrypoint runs ``sm_drivers/sm_train.sh``. The hyperparameters are the user's
alone, strings as they are and every other value JSON-encoded. Pure, like request.py: the account is a
placeholder until the client knows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from smddp_sdk.schedulers.sagemaker.request import S3Location, role_arn, stopping_condition, switched_on
from smddp_sdk.specs.contract import encode_hyperparameters as encode_v2_hyperparameters
from smddp_sdk.specs.job import JobSpec, TrainingInput

CODE_CHANNEL = "code"
DRIVERS_CHANNEL = "sm_drivers"
DRIVERS_PATH = f"/opt/ml/input/data/{DRIVERS_CHANNEL}"
TRAIN_SCRIPT = "sm_train.sh"
ENTRYPOINT = ["/bin/bash"]
ARGUMENTS = ["-c", f"chmod +x {DRIVERS_PATH}/{TRAIN_SCRIPT} && {DRIVERS_PATH}/{TRAIN_SCRIPT}"]
DEFAULT_MAX_RUN = 3600  # v3's StoppingCondition default (v2's is a day)


def base_job_name(spec: JobSpec) -> str:
    """``base_job_name``, else the image's repository with ``-job`` (v3's rule)."""
    if spec.base_job_name:
        return spec.base_job_name
    repository = (spec.image_uri or "smddp-sdk").rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return f"{repository}-job"


def job_name_for(spec: JobSpec) -> str:
    """``job_name`` verbatim, else ``<base>-<UTC yyyymmddHHMMSS>`` in at most 63 characters."""
    if spec.job_name:
        return spec.job_name
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    return f"{base_job_name(spec)[: 63 - len(stamp) - 1]}-{stamp}"


def encode_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, str]:
    """v3's encoding: a string as it is, anything else as JSON (v2 JSON-encodes strings too)."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in hyperparameters.items()}


def input_prefix(spec: JobSpec, job_name: str, default_bucket: str) -> S3Location:
    """Where v3 uploads the job's local inputs: ``<bucket>/<base job name>/<job>/input``."""
    return S3Location(default_bucket, f"{base_job_name(spec)}/{job_name}/input")


def default_output_path(spec: JobSpec, default_bucket: str) -> str:
    return f"s3://{default_bucket}/{base_job_name(spec)}"


def build_request(spec: JobSpec, *, job_name: str, region: str, role: str, default_bucket: str, account: str | None = None) -> dict[str, Any]:
    """The ``CreateTrainingJob`` parameters, field for field what v3's ``ModelTrainer.train()`` sends."""
    algorithm: dict[str, Any] = {"TrainingInputMode": spec.input_mode, "TrainingImage": spec.image_uri, "ContainerEntrypoint": list(ENTRYPOINT), "ContainerArguments": list(ARGUMENTS)}
    if spec.metric_definitions:
        algorithm["MetricDefinitions"] = [dict(metric) for metric in spec.metric_definitions]
    request: dict[str, Any] = {
        "TrainingJobName": job_name,
        "HyperParameters": _hyperparameters(spec),
        "AlgorithmSpecification": algorithm,
        "RoleArn": role_arn(role, region, account),
        "InputDataConfig": _channels(spec, input_prefix(spec, job_name, default_bucket)),
        "OutputDataConfig": {"S3OutputPath": spec.output_path or default_output_path(spec, default_bucket), "CompressionType": "GZIP"},
        "ResourceConfig": _resources(spec),
        "StoppingCondition": stopping_condition(spec),
    }
    if spec.subnets or spec.security_group_ids:
        request["VpcConfig"] = {key: list(values) for key, values in (("SecurityGroupIds", spec.security_group_ids), ("Subnets", spec.subnets)) if values}
    if spec.tags:
        request["Tags"] = [dict(tag) for tag in spec.tags]
    if spec.environment:
        request["Environment"] = dict(spec.environment)
    request.update(switched_on(spec))
    if spec.checkpoint_s3_uri or spec.checkpoint_local_path:
        request["CheckpointConfig"] = _checkpoints(spec, job_name, default_bucket)
    if spec.max_retry_attempts is not None:
        request["RetryStrategy"] = {"MaximumRetryAttempts": spec.max_retry_attempts}
    return request


DRIVER_SCRIPT = """#!/bin/bash
# smddp-sdk's driver for a job sent the way SageMaker SDK v3 sends it: the code channel becomes
# /opt/ml/code and the image's `train` (the smddp-sdk runtime) runs the entry script, with the framework
# hyperparameters v2 would have sent (program, distribution) read from hyperparameters.json beside this file.
set -euo pipefail
mkdir -p /opt/ml/code
if [ -d /opt/ml/input/data/code ]; then cp -a /opt/ml/input/data/code/. /opt/ml/code/; fi
export SMDDP_DRIVER_HYPERPARAMETERS=/opt/ml/input/data/sm_drivers/hyperparameters.json
exec train
"""


def driver_files(spec: JobSpec, *, job_name: str, region: str) -> dict[str, str]:
    """The ``sm_drivers`` channel's files: smddp-sdk's own driver (not v3's) and the framework hyperparameters."""
    everything = spec.training_hyperparameters(job_name=job_name, submit_directory="", region=region)
    framework = {key: value for key, value in everything.items() if key not in spec.hyperparameters and key != "sagemaker_submit_directory"}
    return {TRAIN_SCRIPT: DRIVER_SCRIPT, "hyperparameters.json": json.dumps(encode_v2_hyperparameters(framework), indent=2)}


def _hyperparameters(spec: JobSpec) -> dict[str, str]:
    encoded = encode_hyperparameters(spec.hyperparameters)
    smp = spec.distribution.modelparallel
    if smp is not None:  # Torchrun(smp=SMP(...)): v3 sends SMP's parameters as one JSON hyperparameter
        encoded["mp_parameters"] = json.dumps(dict(smp.get("parameters") or {}))
    return encoded


def _channels(spec: JobSpec, prefix: S3Location) -> list[dict[str, Any]]:
    channels = [_channel(name, channel) for name, channel in spec.inputs.items()]
    if spec.source_dir:
        channels.append(_channel(CODE_CHANNEL, TrainingInput(_prefixed(prefix, CODE_CHANNEL), input_mode="File")))
    channels.append(_channel(DRIVERS_CHANNEL, TrainingInput(_prefixed(prefix, DRIVERS_CHANNEL), input_mode="File")))
    return channels


def _prefixed(prefix: S3Location, name: str) -> str:
    return S3Location(prefix.bucket, f"{prefix.key}/{name}").uri


def _channel(name: str, channel: TrainingInput) -> dict[str, Any]:
    """v3 names the input mode of a channel it made from a URI ("File"), not of an ``S3DataSource``'s."""
    source = {"S3DataType": channel.s3_data_type, "S3Uri": channel.s3_data, "S3DataDistributionType": channel.distribution}
    config: dict[str, Any] = {"ChannelName": name, "DataSource": {"S3DataSource": source}}
    if channel.content_type is not None:
        config["ContentType"] = channel.content_type
    if channel.input_mode is not None:
        config["InputMode"] = channel.input_mode
    return config


def _resources(spec: JobSpec) -> dict[str, Any]:
    resources: dict[str, Any] = {"InstanceType": spec.instance_type, "InstanceCount": spec.instance_count, "VolumeSizeInGB": spec.volume_size}
    if spec.keep_alive_period_in_seconds is not None:
        resources["KeepAlivePeriodInSeconds"] = spec.keep_alive_period_in_seconds
    return resources



def _checkpoints(spec: JobSpec, job_name: str, default_bucket: str) -> dict[str, str]:
    """v3 always names the local path (``/opt/ml/checkpoints`` unless told) and, without an S3 URI,
    checkpoints to ``<bucket>/<base job name>/<job>/checkpoints``."""
    uri = spec.checkpoint_s3_uri or f"s3://{default_bucket}/{base_job_name(spec)}/{job_name}/checkpoints"
    return {"S3Uri": uri, "LocalPath": spec.checkpoint_local_path or "/opt/ml/checkpoints"}
