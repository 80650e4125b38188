"""SageMaker SDK v3's configuration objects (``sagemaker.train.configs``) with v3's names and defaults.

    from smddp_sdk.train.configs import SourceCode, Compute, InputData   # was: from sagemaker.train.configs import ...

Plain keyword-only dataclasses: ``ModelTrainer`` reads them into one ``JobSpec``, which checks every value
at once. Fields of v3 for what smddp-sdk does not run are accepted only at their default; anything else
raises ``NotOfferedError`` saying what to do instead. Names v3 has and this module lacks say so on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from smddp_sdk.errors import NotOfferedError

_IGNORED_BY_DEFAULT = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"]


class _Config:
    """Refuses, at construction, the v3 fields listed in ``_not_offered`` when they are set."""

    _not_offered: dict[str, str] = {}

    def __post_init__(self) -> None:
        for name, instead in self._not_offered.items():
            if getattr(self, name) is not None:
                raise NotOfferedError(f"{type(self).__name__}({name}=...)", instead, sdk="v3")

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, by v3's names."""
        return {item.name: getattr(self, item.name) for item in fields(self) if getattr(self, item.name) is not None}  # type: ignore[arg-type]


@dataclass(kw_only=True)
class SourceCode(_Config):
    """The code to run: ``entry_script`` in ``source_dir``; ``requirements`` is a file in it that is
    pip-installed first (v3 installs none unless named)."""

    source_dir: str | None = None
    requirements: str | None = None
    entry_script: str | None = None
    command: str | None = None
    args: list[Any] | None = None
    ignore_patterns: list[str] | None = field(default_factory=lambda: list(_IGNORED_BY_DEFAULT))
    _not_offered = {
        "command": "smddp-sdk runs a Python entry script: give entry_script=... (and its arguments as hyperparameters)",
        "args": "pass the script's arguments as hyperparameters: each reaches it as --name value, as on SageMaker",
    }


@dataclass(kw_only=True)
class Compute(_Config):
    """The instances: type, count, volume, spot."""

    instance_type: str | None = None
    instance_count: int | None = None
    volume_size_in_gb: int | None = 30
    volume_kms_key_id: str | None = None
    keep_alive_period_in_seconds: int | None = None
    instance_groups: list[Any] | None = None
    training_plan_arn: str | None = None
    instance_preferences: list[Any] | None = None
    enable_managed_spot_training: bool | None = None
    _not_offered = {
        "volume_kms_key_id": "volume encryption keys are not passed on yet; encrypt the volume with the account's default key",
        "instance_groups": "heterogeneous clusters (instance_groups) are not run here; use one instance_type",
        "training_plan_arn": "training plans are not offered; give instance_type and instance_count",
        "instance_preferences": "capacity fallback lists are not offered; give one instance_type",
    }


@dataclass(kw_only=True)
class Networking(_Config):
    """VPC and isolation of the SageMaker job (local and docker jobs note what they cannot emulate)."""

    security_group_ids: list[str] | None = None
    subnets: list[str] | None = None
    enable_network_isolation: bool | None = None
    enable_inter_container_traffic_encryption: bool | None = None


@dataclass(kw_only=True)
class StoppingCondition(_Config):
    """How long the job may run (v3's default: an hour) and, for spot jobs, wait."""

    max_runtime_in_seconds: int | None = None
    max_wait_time_in_seconds: int | None = None
    max_pending_time_in_seconds: int | None = None
    _not_offered = {"max_pending_time_in_seconds": "a pending-time limit is not offered; max_runtime_in_seconds bounds the job"}


@dataclass(kw_only=True)
class OutputDataConfig(_Config):
    """Where model.tar.gz and output.tar.gz go (default ``s3://<bucket>/<base job name>``)."""

    s3_output_path: str | None = None
    kms_key_id: str | None = None
    compression_type: str | None = None
    _not_offered = {"kms_key_id": "output encryption keys are not passed on yet; use the bucket's default encryption"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression_type not in (None, "GZIP"):
            raise NotOfferedError(f"OutputDataConfig(compression_type={self.compression_type!r})", "the model always arrives as model.tar.gz: leave compression_type out or give 'GZIP'", sdk="v3")


@dataclass(kw_only=True)
class CheckpointConfig(_Config):
    """Checkpoints synced between ``local_path`` and ``s3_uri`` (default ``<bucket>/<base job name>/<job>/checkpoints``)."""

    s3_uri: str | None = None
    local_path: str | None = "/opt/ml/checkpoints"


@dataclass(kw_only=True)
class S3DataSource(_Config):
    """An S3 channel with its options (v3's ``sagemaker.core.shapes.S3DataSource``)."""

    s3_data_type: str = "S3Prefix"
    s3_uri: str = ""
    s3_data_distribution_type: str | None = None
    attribute_names: list[str] | None = None
    instance_group_names: list[str] | None = None
    _not_offered = {
        "attribute_names": "augmented manifest files are not read here; use S3Prefix or ManifestFile data",
        "instance_group_names": "heterogeneous clusters are not run here; every host receives every channel",
    }


@dataclass(kw_only=True)
class InputData(_Config):
    """One channel: ``/opt/ml/input/data/<channel_name>``; ``data_source`` is an ``s3://`` URI, a local
    path (local, docker and Slurm jobs mount it) or an ``S3DataSource``."""

    channel_name: str
    data_source: str | S3DataSource
    content_type: str | None = None


@dataclass(kw_only=True)
class RetryStrategy(_Config):
    """``with_retry_strategy``: restart a job the platform failed, at most this many times."""

    maximum_retry_attempts: int


@dataclass(kw_only=True)
class MetricDefinition(_Config):
    """``with_metric_definitions``: a metric read from the logs by a regular expression with one group."""

    name: str
    regex: str


@dataclass(kw_only=True)
class Tag(_Config):
    key: str
    value: str


_NOT_OFFERED = {
    "HyperPodCompute": "HyperPod jobs run through the slurm scheduler: ModelTrainer(..., scheduler='slurm')",
    "FileSystemDataSource": "EFS/FSx channels are not offered; give an s3:// URI or a local path",
    "DatasetSource": "dataset channels are not offered; give an s3:// URI or a local path",
    "TrainingImageConfig": "private registries are not offered; push the image to ECR",
    "TensorBoardOutputConfig": "TensorBoard output is not synced yet; write event files under /opt/ml/output and read output.tar.gz",
    "InfraCheckConfig": "infrastructure checks are SageMaker's own and not offered",
    "RemoteDebugConfig": "remote debugging is not offered; `smddp-launch stacks JOB` dumps a local job's ranks",
    "SessionChainingConfig": "session chaining is not offered",
    "InstanceGroup": "heterogeneous clusters are not run here; use one instance_type",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_OFFERED:
        raise NotOfferedError(f"sagemaker.train.configs.{name}", _NOT_OFFERED[name], sdk="v3")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SourceCode", "Compute", "Networking", "StoppingCondition", "OutputDataConfig", "CheckpointConfig", "S3DataSource", "InputData", "RetryStrategy", "MetricDefinition", "Tag"]
