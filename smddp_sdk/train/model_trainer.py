"""SageMaker SDK v3's ``ModelTrainer`` on the v2 estimator's path: one ``JobSpec``, every scheduler.

    from smddp_sdk.train import ModelTrainer, Mode                 # was: from sagemaker.train import ...
    from smddp_sdk.train.configs import SourceCode, Compute
    from smddp_sdk.train.distributed import Torchrun

    trainer = ModelTrainer(
        source_code=SourceCode(source_dir="examples/cnn", entry_script="train.py"),
        compute=Compute(instance_type="ml.c5.xlarge", instance_count=2),
        distributed=Torchrun(process_count_per_node=2),
        scheduler="local",                  # v3 has no such argument; without it training_mode decides
    )
    trainer.train()                         # 2 simulated hosts x 2 ranks on this machine

The rule: the trainer's configuration objects are read into the v2 estimator's arguments (the ``JobSpec``
fields) with ``api: v3``, and an ``Estimator`` runs them; so the dry run, retries, spot, checkpoints and
``smddp-launch status/logs/metrics`` behave as for v2 jobs, and only the SageMaker request takes v3's shape.
``training_mode`` picks the scheduler (``LOCAL_CONTAINER``: docker, ``SAGEMAKER_TRAINING_JOB``: sagemaker)
unless ``scheduler=`` or the environment variable ``SMDDP_SCHEDULER`` names one. v3's defaults apply: one ``ml.m5.xlarge``, an hour's run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import types
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from smddp_sdk import estimator as estimator_module
from smddp_sdk.errors import NotOfferedError, SpecError, SpecIssue
from smddp_sdk.estimator import Estimator
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.sagemaker.request_v3 import DEFAULT_MAX_RUN
from smddp_sdk.specs.job import TrainingInput
from smddp_sdk.train.configs import (
    CheckpointConfig,
    Compute,
    InputData,
    MetricDefinition,
    Networking,
    OutputDataConfig,
    RetryStrategy,
    S3DataSource,
    SourceCode,
    StoppingCondition,
    Tag,
)
from smddp_sdk.train.distributed import DistributedConfig

DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"
SCHEDULER_ENV = "SMDDP_SCHEDULER"
_NOT_OFFERED = {
    "algorithm_name": "marketplace algorithms are not run here; give training_image and source_code",
    "training_image_config": "private registries are not offered; push the image to ECR",
    "input_s3_key_prefix": "inputs are staged under <bucket>/<base_job_name>/<job>/input; set base_job_name to group them",
    "model_package_config": "model packages (Nova RMP) are not offered",
}


class Mode(Enum):
    """Where ``train()`` runs the job when no ``scheduler=`` is given."""

    LOCAL_CONTAINER = "LOCAL_CONTAINER"  # the docker scheduler: one container per host
    SAGEMAKER_TRAINING_JOB = "SAGEMAKER_TRAINING_JOB"  # the sagemaker scheduler


_SCHEDULER_OF_MODE = {Mode.LOCAL_CONTAINER: "docker", Mode.SAGEMAKER_TRAINING_JOB: "sagemaker"}


class TrainingJob(estimator_module.TrainingJob):
    """The job a trainer started: the v2 estimator's job with the attribute names of v3's ``TrainingJob``
    resource (``training_job_name``, ``training_job_status``, ``model_artifacts.s3_model_artifacts``)."""

    @property
    def training_job_name(self) -> str:
        return self.name

    @property
    def training_job_status(self) -> str:
        return str(self.describe()["TrainingJobStatus"])

    @property
    def model_artifacts(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(s3_model_artifacts=self.status().model_data)

    def refresh(self) -> TrainingJob:
        return self  # every attribute above asks the scheduler afresh


class ModelTrainer:
    """v3's ``ModelTrainer``: keyword arguments and configuration objects as ``sagemaker.train`` names
    them, plus ``scheduler`` and ``scheduler_options`` as the v2 estimator takes them. Everything is
    checked when the trainer is built; nothing is written or started before ``train``."""

    def __init__(
        self,
        *,
        training_mode: Mode = Mode.SAGEMAKER_TRAINING_JOB,
        sagemaker_session: Any = None,
        role: str | None = None,
        base_job_name: str | None = None,
        source_code: SourceCode | None = None,
        distributed: DistributedConfig | None = None,
        compute: Compute | None = None,
        networking: Networking | None = None,
        stopping_condition: StoppingCondition | None = None,
        training_image: str | None = None,
        output_data_config: OutputDataConfig | None = None,
        input_data_config: Sequence[InputData] | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        training_input_mode: str | None = "File",
        environment: Mapping[str, str] | None = None,
        hyperparameters: Mapping[str, Any] | str | None = None,
        tags: Sequence[Tag | Mapping[str, str]] | None = None,
        local_container_root: str | None = None,
        scheduler: str | None = None,
        scheduler_options: Mapping[str, Any] | None = None,
        **not_offered: Any,
    ) -> None:
        for name, value in not_offered.items():
            if name not in _NOT_OFFERED:
                raise TypeError(f"ModelTrainer() got an unexpected keyword argument {name!r}")
            if value is not None:
                raise NotOfferedError(f"ModelTrainer({name}=...)", _NOT_OFFERED[name], sdk="v3")
        if not isinstance(training_mode, Mode):
            raise SpecError(SpecIssue("training_mode", f"must be Mode.LOCAL_CONTAINER or Mode.SAGEMAKER_TRAINING_JOB, got {training_mode!r}"))
        self.training_mode = training_mode
        self.sagemaker_session = sagemaker_session
        self.role = role
        self.base_job_name = base_job_name
        self.source_code = source_code
        self.distributed = distributed
        self.compute = compute or Compute(instance_type=DEFAULT_INSTANCE_TYPE, instance_count=1)
        self.networking = networking
        self.stopping_condition = stopping_condition or StoppingCondition(max_runtime_in_seconds=DEFAULT_MAX_RUN)
        self.training_image = training_image
        self.output_data_config = output_data_config
        self.input_data_config = list(input_data_config or [])
        self.checkpoint_config = checkpoint_config
        self.training_input_mode = training_input_mode or "File"
        self.environment = dict(environment or {})
        self.hyperparameters = _read_hyperparameters(hyperparameters)
        self.tags = list(tags or [])
        self.local_container_root = local_container_root
        # SMDDP_SCHEDULER lets an unchanged v3 launcher run locally or on Slurm: v3 has no such argument.
        self.scheduler = scheduler or os.environ.get(SCHEDULER_ENV) or _SCHEDULER_OF_MODE[training_mode]
        self.scheduler_options = dict(scheduler_options or {})
        self._retry_strategy: RetryStrategy | None = None
        self._metric_definitions: list[MetricDefinition] = []
        self._latest_training_job: TrainingJob | None = None
        self._estimator()  # every problem now, as v3 validates at construction

    # --- v3's with_* builders ---------------------------------------------------------------------

    def with_retry_strategy(self, retry_strategy: RetryStrategy) -> ModelTrainer:
        self._retry_strategy = retry_strategy
        return self

    def with_checkpoint_config(self, checkpoint_config: CheckpointConfig | None = None) -> ModelTrainer:
        self.checkpoint_config = checkpoint_config or CheckpointConfig()
        return self

    def with_metric_definitions(self, metric_definitions: Sequence[MetricDefinition]) -> ModelTrainer:
        self._metric_definitions = list(metric_definitions)
        return self

    def with_tensorboard_output_config(self, *args: Any, **kwargs: Any) -> ModelTrainer:
        raise NotOfferedError("ModelTrainer.with_tensorboard_output_config", "TensorBoard output is not synced yet; write event files under /opt/ml/output", sdk="v3")

    def with_infra_check_config(self, *args: Any, **kwargs: Any) -> ModelTrainer:
        raise NotOfferedError("ModelTrainer.with_infra_check_config", "infrastructure checks are SageMaker's own and not offered", sdk="v3")

    def with_session_chaining_config(self, *args: Any, **kwargs: Any) -> ModelTrainer:
        raise NotOfferedError("ModelTrainer.with_session_chaining_config", "session chaining is not offered", sdk="v3")

    def with_remote_debug_config(self, *args: Any, **kwargs: Any) -> ModelTrainer:
        raise NotOfferedError("ModelTrainer.with_remote_debug_config", "remote debugging is not offered; `smddp-launch stacks JOB` dumps a local job's ranks", sdk="v3")

    # --- running ----------------------------------------------------------------------------------

    def train(self, input_data_config: Sequence[InputData] | None = None, wait: bool = True, logs: bool = True, dry_run: bool = False) -> None:
        """Run the job; channels given here replace the trainer's of the same name. With ``wait`` it
        streams the logs (``logs``) and raises ``JobFailedError`` naming the root-cause host and rank if
        the job fails (on SageMaker too: v3's #5765, ``wait=True`` ignoring the session, does not apply).
        ``dry_run`` checks everything and starts nothing, as v3's."""
        estimator = self._estimator(input_data_config)
        with in_v3_names():
            if dry_run:
                estimator.dryrun()
                return
            estimator.fit(wait=wait, logs=logs)
        assert estimator.latest_training_job is not None
        job = estimator.latest_training_job
        self._latest_training_job = TrainingJob(job.scheduler, job.handle, job.dryrun, job.spec)

    def dryrun(self, input_data_config: Sequence[InputData] | None = None) -> DryRun:
        """The exact request ``train`` would make (pure; ``print(trainer.dryrun().render())`` shows it)."""
        estimator = self._estimator(input_data_config)
        with in_v3_names():
            return estimator.dryrun()

    @property
    def output_data(self) -> str:
        """Where the latest job's ``output.tar.gz`` is (a local path for local and docker jobs)."""
        status = self._require_job().status()
        if status.output_data is None:
            raise SpecError(SpecIssue("output_data", f"{self._require_job().handle} has no output.tar.gz yet", "wait for the job to end: train(wait=True)"))
        return status.output_data

    @property
    def model_data(self) -> str | None:
        """Where the latest job's ``model.tar.gz`` is (v3: ``_latest_training_job.model_artifacts``)."""
        return self._require_job().status().model_data

    def _require_job(self) -> TrainingJob:
        if self._latest_training_job is None:
            raise SpecError(SpecIssue("", "this ModelTrainer has not run a job yet", "call train() first"))
        return self._latest_training_job

    # --- the one path underneath: the v2 estimator's ----------------------------------------------

    def estimator_arguments(self, input_data_config: Sequence[InputData] | None = None) -> dict[str, Any]:
        """The v2 estimator's arguments (the ``JobSpec`` fields) this trainer stands for."""
        source = self.source_code or SourceCode()
        compute, network, stopping = self.compute, self.networking or Networking(), self.stopping_condition
        checkpoint = self.checkpoint_config
        arguments: dict[str, Any] = {
            "api": "v3",
            "entry_point": source.entry_script,
            "source_dir": source.source_dir,
            "image_uri": self.training_image,
            "role": self.role,
            "base_job_name": self.base_job_name,
            "instance_type": compute.instance_type or DEFAULT_INSTANCE_TYPE,
            "instance_count": 1 if compute.instance_count is None else compute.instance_count,
            "volume_size": 30 if compute.volume_size_in_gb is None else compute.volume_size_in_gb,
            "keep_alive_period_in_seconds": compute.keep_alive_period_in_seconds,
            "use_spot_instances": compute.enable_managed_spot_training or None,
            "max_run": stopping.max_runtime_in_seconds or DEFAULT_MAX_RUN,
            "max_wait": stopping.max_wait_time_in_seconds,
            "subnets": network.subnets,
            "security_group_ids": network.security_group_ids,
            "enable_network_isolation": network.enable_network_isolation,
            "encrypt_inter_container_traffic": network.enable_inter_container_traffic_encryption,
            "output_path": self.output_data_config.s3_output_path if self.output_data_config else None,
            "checkpoint_s3_uri": checkpoint.s3_uri if checkpoint else None,
            "checkpoint_local_path": checkpoint.local_path if checkpoint else None,
            "input_mode": self.training_input_mode,
            "environment": self.environment or None,
            "hyperparameters": self.hyperparameters or None,
            "tags": [_tag(tag) for tag in self.tags] or None,
            "inputs": _channels(self.input_data_config, input_data_config) or None,
            "distribution": self.distributed.distribution() if self.distributed else None,
            "max_retry_attempts": self._retry_strategy.maximum_retry_attempts if self._retry_strategy else None,
            "metric_definitions": [{"Name": m.name, "Regex": m.regex} for m in self._metric_definitions] or None,
        }
        return {key: value for key, value in arguments.items() if value is not None}

    def _estimator(self, input_data_config: Sequence[InputData] | None = None) -> Estimator:
        issues = []
        if self.source_code is None or not self.source_code.entry_script:
            issues.append(SpecIssue("source_code", "smddp-sdk runs a Python entry script", "pass source_code=SourceCode(source_dir=..., entry_script='train.py')"))
        requirements = self.source_code.requirements if self.source_code else None
        if requirements not in (None, "requirements.txt"):
            issues.append(SpecIssue("source_code.requirements", f"{requirements!r}: the job installs requirements.txt of source_dir", "name the file requirements.txt"))
        try:
            with in_v3_names():
                estimator = Estimator(scheduler=self.scheduler, scheduler_options=self._scheduler_options(), sagemaker_session=self.sagemaker_session, **self.estimator_arguments(input_data_config))
        except SpecError as error:
            said = {issue.path for issue in issues}
            issues += [issue for issue in error.issues if not (issue.path == "source_code.entry_script" and "source_code" in said)]
        if issues:
            raise SpecError(issues)
        return estimator

    def _scheduler_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        ranks = self.distributed.process_count_per_node if self.distributed else None
        if ranks is not None and self.scheduler != "sagemaker":  # on SageMaker the image's runtime decides
            options["processes_per_host"] = ranks
        if self.local_container_root is not None and self.scheduler == "docker":
            options["job_root"] = self.local_container_root
        return {**options, **self.scheduler_options}


# The estimator's argument names in problems, as the v3 user wrote them.
_V3_NAMES = {
    "entry_point": "source_code.entry_script",
    "source_dir": "source_code.source_dir",
    "image_uri": "training_image",
    "instance_type": "compute.instance_type",
    "instance_count": "compute.instance_count",
    "volume_size": "compute.volume_size_in_gb",
    "keep_alive_period_in_seconds": "compute.keep_alive_period_in_seconds",
    "use_spot_instances": "compute.enable_managed_spot_training",
    "max_run": "stopping_condition.max_runtime_in_seconds",
    "max_wait": "stopping_condition.max_wait_time_in_seconds",
    "subnets": "networking.subnets",
    "security_group_ids": "networking.security_group_ids",
    "enable_network_isolation": "networking.enable_network_isolation",
    "encrypt_inter_container_traffic": "networking.enable_inter_container_traffic_encryption",
    "output_path": "output_data_config.s3_output_path",
    "checkpoint_s3_uri": "checkpoint_config.s3_uri",
    "checkpoint_local_path": "checkpoint_config.local_path",
    "inputs": "input_data_config",
    "input_mode": "training_input_mode",
    "distribution": "distributed",
    "max_retry_attempts": "with_retry_strategy",
    "metric_definitions": "with_metric_definitions",
}


def _v3_path(path: str) -> str:
    head, dot, rest = path.partition(".")
    return _V3_NAMES.get(head, head) + dot + rest


@contextlib.contextmanager
def in_v3_names() -> Iterator[None]:
    """Re-raise a ``SpecError`` with each problem's path in v3's names (``compute.instance_count``)."""
    try:
        yield
    except SpecError as error:
        raise SpecError([dataclasses.replace(issue, path=_v3_path(issue.path)) for issue in error.issues]) from None


def _channels(own: Sequence[InputData], given: Sequence[InputData] | None) -> dict[str, TrainingInput]:
    """The trainer's channels, those given to ``train`` replacing same-named ones (v3's merge)."""
    merged = {channel.channel_name: channel for channel in own}
    merged.update({channel.channel_name: channel for channel in given or ()})
    return {name: _channel(channel) for name, channel in merged.items()}


def _channel(channel: InputData) -> TrainingInput:
    """A channel as v3 sends it: from a URI or path in File mode, from an ``S3DataSource`` as it says."""
    source = channel.data_source
    if isinstance(source, S3DataSource):
        return TrainingInput(source.s3_uri, distribution=source.s3_data_distribution_type or "FullyReplicated", s3_data_type=source.s3_data_type, content_type=channel.content_type)
    return TrainingInput(str(source), content_type=channel.content_type, input_mode="File")


def _tag(tag: Tag | Mapping[str, str]) -> dict[str, str]:
    if isinstance(tag, Tag):
        return {"Key": tag.key, "Value": tag.value}
    return {"Key": tag.get("key", tag.get("Key", "")), "Value": tag.get("value", tag.get("Value", ""))}


def _read_hyperparameters(hyperparameters: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """A mapping as given, or v3's path to a JSON or YAML file of them."""
    if hyperparameters is None or isinstance(hyperparameters, Mapping):
        return dict(hyperparameters or {})
    path = Path(hyperparameters)
    if not path.is_file():
        raise SpecError(SpecIssue("hyperparameters", f"{hyperparameters!r} is neither a mapping nor a file", "pass a dict or the path of a .json or .yaml file"))
    if path.suffix == ".json":
        loaded = json.loads(path.read_text())
    else:
        from smddp_sdk.config.yaml_io import load_yaml_file

        loaded = load_yaml_file(path).data
    if not isinstance(loaded, Mapping):
        raise SpecError(SpecIssue("hyperparameters", f"{hyperparameters}: must hold a mapping of names to values"))
    return dict(loaded)
