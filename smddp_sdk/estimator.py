"""SageMaker SDK v2's estimator surface on top of ``JobSpec`` and the schedulers.

    from smddp_sdk import PyTorch

    estimator = PyTorch(
        entry_point="train.py", source_dir="examples/cnn",
        instance_count=2, instance_type="local",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        scheduler_options={"processes_per_host": 2},
    )
    estimator.fit()            # 2 simulated hosts x 2 ranks on this machine
    estimator.model_data       # .../output/model.tar.gz

The constructor takes v2's arguments (the ``JobSpec`` fields) plus ``scheduler`` ("local", "docker",
"sagemaker"; inferred from ``instance_type`` when absent) and ``scheduler_options``. Everything is checked
at once when the estimator is built; nothing is written or started before ``fit``. This module never
imports torch or boto3: schedulers are looked up by name.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smddp_sdk import job_index, launcher
from smddp_sdk.errors import JobFailedError, NotOfferedAttributeError, SpecError, SpecIssue, did_you_mean
from smddp_sdk.inputs import normalise_inputs
from smddp_sdk.schedulers import get_scheduler, infer_scheduler, scheduler_class, unknown_scheduler
from smddp_sdk.schedulers.base import RECORD_FILE, DryRun, Scheduler
from smddp_sdk.specs import contract, v2_arguments
from smddp_sdk.specs.distribution import parse_distribution
from smddp_sdk.specs.job import JobSpec, TrainingInput
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus

_OWN_ARGUMENTS = ("scheduler", "scheduler_options")
_EXPERIMENT_KEYS = ("ExperimentName", "TrialName", "TrialComponentDisplayName", "RunName")
_LOG_CHOICES = {True: True, False: False, "All": True, "Training": True, "Rules": True, "None": False}
_DESCRIBE_STATUS = {**dict.fromkeys(JobState, "InProgress"), JobState.SUCCEEDED: "Completed", JobState.FAILED: "Failed", JobState.CANCELLED: "Stopped"}


class Estimator:
    """A training job description you can run, watch and attach to again; v2's ``EstimatorBase`` surface."""

    def __init__(self, entry_point: str | None = None, *, scheduler: str | None = None, scheduler_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.sagemaker_session = kwargs.pop("sagemaker_session", None)
        arguments = {"entry_point": entry_point, **kwargs}
        self._arguments = {key: value for key, value in arguments.items() if value is not None}
        self._base_dir = Path.cwd()
        self.scheduler_options: dict[str, Any] = dict(scheduler_options or {}) if isinstance(scheduler_options, Mapping) else {}
        issues = self._argument_issues(scheduler_options)
        self.scheduler: str = scheduler or infer_scheduler(str(self._arguments.get("instance_type", "")))
        spec: JobSpec | None = None
        try:
            spec = JobSpec.from_mapping(self._spec_arguments(), base_dir=self._base_dir)
        except SpecError as error:
            issues += error.issues
        if self.sagemaker_session is not None and self.scheduler == "sagemaker":
            # v2 takes region and credentials from its session; so does this estimator (explicit options win).
            self.scheduler_options = {**_session_options(self.sagemaker_session), **self.scheduler_options}
        if unknown := unknown_scheduler(self.scheduler):
            issues.append(unknown)
        elif isinstance(scheduler_options, Mapping):  # values now; unknown names when the scheduler is built
            issues += scheduler_class(self.scheduler).options.issues(scheduler_options, unknown=False)
        if issues:
            raise SpecError(issues)
        assert spec is not None
        self._spec: JobSpec | None = spec
        self._scheduler: Scheduler | None = None
        self.latest_training_job: TrainingJob | None = None

    def _argument_issues(self, scheduler_options: Any) -> list[SpecIssue]:
        issues = []
        known = (*JobSpec.field_names(), *_OWN_ARGUMENTS)
        for name in self._arguments:
            if name in v2_arguments.REFUSED_ARGUMENTS:  # each with what to do instead
                issues.append(SpecIssue(name, "is a SageMaker SDK v2 argument smddp-sdk does not support", v2_arguments.REFUSED_ARGUMENTS[name]))
            elif name not in known:
                issues.append(SpecIssue(name, "unknown argument", did_you_mean(name, known)))
        if scheduler_options is not None and not isinstance(scheduler_options, Mapping):
            issues.append(SpecIssue("scheduler_options", f"must be a mapping of option names to values, got {type(scheduler_options).__name__}"))
        return issues

    def _spec_arguments(self, **overrides: Any) -> dict[str, Any]:
        fields = JobSpec.field_names()
        data = {key: value for key, value in self._arguments.items() if key in fields}
        data.update({key: value for key, value in overrides.items() if value is not None})
        return rehearsed_s3(data)[0] if self.scheduler in REHEARSING_SCHEDULERS else data

    # --- v2 attributes --------------------------------------------------------------------------

    @property
    def spec(self) -> JobSpec:
        """The validated job description every scheduler receives."""
        if self._spec is None:
            raise SpecError(SpecIssue("", f"this estimator was attached to {self.latest_training_job.handle if self.latest_training_job else 'a job'} and its arguments are unknown", "build a new estimator to run a job"))
        return self._spec

    def __getattr__(self, name: str) -> Any:
        # v2 exposes its constructor arguments as attributes (estimator.instance_type, ...).
        if name in v2_arguments.REFUSED_METHODS:
            raise NotOfferedAttributeError(f"Estimator.{name}", v2_arguments.REFUSED_METHODS[name])
        if name.startswith("_") or name not in JobSpec.field_names():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.spec, name)

    def hyperparameters(self) -> dict[str, str]:
        """The user's hyperparameters JSON-encoded as v2 sends them."""
        return contract.encode_hyperparameters(self.spec.hyperparameters)

    def set_hyperparameters(self, **kwargs: Any) -> None:
        """Add or replace hyperparameters (v2's ``set_hyperparameters``); checked at once like the constructor's."""
        merged = {**dict(self.spec.hyperparameters), **kwargs}
        self._spec = JobSpec.from_mapping(self._spec_arguments(hyperparameters=merged), base_dir=self._base_dir)
        self._arguments["hyperparameters"] = merged

    def enable_network_isolation(self) -> bool:
        """Whether the job runs without network access (v2 exposes the argument as this method)."""
        return bool(self.spec.enable_network_isolation)

    def get_vpc_config(self, vpc_config_override: Any = "VPC_CONFIG_DEFAULT") -> dict[str, list[str]] | None:
        """``{"Subnets": [...], "SecurityGroupIds": [...]}`` as sent to SageMaker, or None without a VPC."""
        if vpc_config_override != "VPC_CONFIG_DEFAULT":
            return dict(vpc_config_override) if vpc_config_override else None
        if not self.spec.subnets and not self.spec.security_group_ids:
            return None
        return {"Subnets": list(self.spec.subnets), "SecurityGroupIds": list(self.spec.security_group_ids)}

    def training_image_uri(self) -> str | None:
        """The image the job runs in: ``image_uri``, the docker scheduler's image, or the SageMaker DLC for
        ``framework_version``/``py_version``. Local jobs run no image: None."""
        if self.spec.image_uri:
            return self.spec.image_uri
        if self.scheduler == "sagemaker":
            from smddp_sdk.schedulers.sagemaker import request as sagemaker_request

            scheduler = self._get_scheduler()
            image, issues = sagemaker_request.resolve_image(self.spec, scheduler.resolved_region())  # type: ignore[attr-defined]
            if issues:
                raise SpecError(issues)
            return image
        return getattr(self.dryrun().request, "image", None) or None  # a docker plan's image; local runs none

    @property
    def training_job_analytics(self) -> Any:
        """The latest job's metrics (``metric_definitions`` applied to its logs), as v2's
        ``TrainingJobAnalytics``: ``.dataframe()`` (pandas) or ``.rows()`` (no pandas needed)."""
        from smddp_sdk.metrics import TrainingJobAnalytics

        job = self._require_job()
        definitions = job.spec.metric_definitions if job.spec is not None else ()
        return TrainingJobAnalytics(job.scheduler, job.handle, definitions)

    @property
    def model_data(self) -> str | None:
        """Where the latest job's model.tar.gz is (a local path for local and docker jobs, s3:// on SageMaker)."""
        if self.latest_training_job is None:
            return None
        return self.latest_training_job.status().model_data

    # --- running --------------------------------------------------------------------------------

    def job_spec(self, inputs: Any = None, job_name: str | None = None) -> JobSpec:
        """The spec ``fit(inputs, job_name=...)`` would run, validated."""
        spec = self.spec  # raises for an attached job whose arguments are unknown
        if inputs is None and job_name is None:
            return spec
        return JobSpec.from_mapping(self._spec_arguments(inputs=normalise_inputs(inputs), job_name=job_name), base_dir=self._base_dir)

    def dryrun(self, inputs: Any = None, job_name: str | None = None) -> DryRun:
        """The exact request ``fit`` would make (pure: nothing written, started or uploaded; nothing printed).
        ``print(estimator.dryrun().render())`` shows it; its notes say where s3:// locations are rehearsed."""
        plan = self._get_scheduler().dryrun(self.job_spec(inputs, job_name))
        if self.scheduler not in REHEARSING_SCHEDULERS:
            return plan
        given = {**self._arguments, "inputs": normalise_inputs(inputs) if inputs is not None else None}
        return dataclasses.replace(plan, notes=(*rehearsed_s3({key: value for key, value in given.items() if value is not None})[1], *plan.notes))

    def plan(self, instances: Any = "1,2,4,8,16,32", **options: Any) -> Any:
        """Predicted step time, scaling efficiency and cost per instance count, as ``smddp-launch plan``
        (options: profile, compute_ms, gradient_mb, instance_type, price_per_hour, ...; docs/planning.md)."""
        from smddp_sdk.planning import plan_for_spec

        return plan_for_spec(self.spec, instances, **options)

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool | str = True, job_name: str | None = None, experiment_config: Mapping[str, str] | None = None) -> None:
        """Run the job. ``inputs``: a location, a ``TrainingInput`` (the ``training`` channel) or ``{channel:
        location or TrainingInput}``, v2's ``sagemaker.inputs.TrainingInput`` included; local paths and
        ``file://`` work locally. With ``wait`` it streams the logs (``logs``) until the job ends and raises
        ``JobFailedError`` naming the root-cause host and rank if it fails; Ctrl-C cancels local jobs.
        ``experiment_config`` goes to SageMaker as ``ExperimentConfig``; local and docker jobs record it."""
        show_logs = _log_choice(logs)
        experiment = _experiment_config(experiment_config)
        try:
            dryrun = self.dryrun(inputs, job_name)
            if experiment:
                dryrun = _with_experiment(dryrun, experiment)
            handle = launcher.schedule(self._get_scheduler(), dryrun, attached=wait)
        except ModuleNotFoundError as err:
            raise launcher.missing_package(err) or err from None
        self.latest_training_job = TrainingJob(self._get_scheduler(), handle, dryrun, dryrun.spec)
        if wait:
            self.latest_training_job.wait(logs=show_logs)

    def logs(self) -> None:
        """Stream the latest job's logs until it ends (v2's ``estimator.logs()``)."""
        self._require_job().wait(logs=True, check=False)

    def _require_job(self) -> TrainingJob:
        if self.latest_training_job is None:
            raise SpecError(SpecIssue("", "this estimator has not run a job yet", "call fit() first, or Estimator.attach(<handle>)"))
        return self.latest_training_job

    def _get_scheduler(self) -> Scheduler:
        if self._scheduler is None:
            self._scheduler = get_scheduler(self.scheduler, **self.scheduler_options)
        return self._scheduler

    # --- attaching ------------------------------------------------------------------------------

    @classmethod
    def attach(
        cls, training_job_name: str, sagemaker_session: Any = None, model_channel_name: str = "model", *, scheduler: str | None = None, scheduler_options: Mapping[str, Any] | None = None
    ) -> Estimator:
        """An estimator bound to an existing job, on any scheduler: a handle (``local://<job>``,
        ``docker://<job>``, ``sagemaker://<region>/<job>``) or the bare job name ``fit``/``run`` printed
        (looked up in this machine's job index; a SageMaker job submitted elsewhere needs a region:
        ``scheduler_options={'region': ...}`` or a ``sagemaker_session``). Its arguments are the job's own."""
        options = dict(scheduler_options or {})
        if sagemaker_session is not None:
            options = {**_session_options(sagemaker_session), **options}
        handle, entry = _resolve_handle(training_job_name, scheduler, options)
        if entry is not None:
            options = {**entry.options, **options}
        estimator = cls.__new__(cls)
        estimator._arguments, estimator._base_dir = {}, Path.cwd()
        estimator.scheduler, estimator.scheduler_options = handle.scheduler, options
        estimator.sagemaker_session, estimator._scheduler, estimator._spec = sagemaker_session, None, None
        job_scheduler = estimator._get_scheduler()
        spec_dict = job_arguments(job_scheduler, handle)
        if spec_dict is not None and entry is not None and entry.metric_definitions:
            spec_dict["metric_definitions"] = [dict(item) for item in entry.metric_definitions]  # as submitted from here
        if spec_dict is not None:
            estimator._spec = spec_from_dict(spec_dict)
            estimator._arguments = {key: value for key, value in spec_dict.items() if value not in (None, (), [], {})}
        estimator.latest_training_job = TrainingJob(job_scheduler, handle, None, estimator._spec)
        return estimator


class PyTorch(Estimator):
    """v2's ``sagemaker.pytorch.PyTorch``: same arguments, same positional order, same hyperparameters."""

    def __init__(
        self,
        entry_point: str | None = None,
        framework_version: str | None = None,
        py_version: str | None = None,
        source_dir: str | None = None,
        hyperparameters: Mapping[str, Any] | None = None,
        image_uri: str | None = None,
        distribution: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(entry_point, framework_version=framework_version, py_version=py_version, source_dir=source_dir,
                         hyperparameters=hyperparameters, image_uri=image_uri, distribution=distribution, **kwargs)


class TrainingJob:
    """The job an estimator started or attached to; v2's ``_TrainingJob`` backed by the scheduler."""

    def __init__(self, scheduler: Scheduler, handle: JobHandle, dryrun: DryRun | None, spec: JobSpec | None = None) -> None:
        self.scheduler = scheduler
        self.handle = handle
        self.dryrun = dryrun
        self.spec = spec

    @property
    def name(self) -> str:
        """The job name (for SageMaker jobs, without the region)."""
        return self.handle.job_id.rsplit("/", 1)[-1]

    @property
    def job_name(self) -> str:
        return self.name

    def status(self) -> JobStatus:
        return self.scheduler.status(self.handle)

    def describe(self) -> dict[str, Any]:
        """A ``DescribeTrainingJob``-shaped summary (the fields v2 users read most)."""
        status = self.status()
        described: dict[str, Any] = {
            "TrainingJobName": self.name,
            "TrainingJobStatus": _DESCRIBE_STATUS[status.state],
            "SecondaryStatus": status.state.value.title(),
            "Handle": str(self.handle),
            "ModelArtifacts": {"S3ModelArtifacts": status.model_data},
        }
        if status.failure is not None:
            described["FailureReason"] = status.failure.summary()
        elif status.state is JobState.FAILED:
            described["FailureReason"] = status.message
        for key, when in (("TrainingStartTime", status.started), ("TrainingEndTime", status.ended)):
            if when:
                described[key] = when
        if self.spec is not None:
            described["HyperParameters"] = contract.encode_hyperparameters(self.spec.hyperparameters)
            described["ResourceConfig"] = {"InstanceType": self.spec.instance_type, "InstanceCount": self.spec.instance_count, "VolumeSizeInGB": self.spec.volume_size}
            described["StoppingCondition"] = {"MaxRuntimeInSeconds": self.spec.max_run}
        return described

    def wait(self, logs: bool | str = True, *, check: bool = True) -> JobStatus:
        """Block until the job ends, streaming its logs; raise ``JobFailedError`` if it failed (with ``check``)."""
        started = time.monotonic()
        try:
            if _log_choice(logs):
                print(f"smddp: {self.handle} started{_shape(self.dryrun)}", flush=True)
                status = launcher.follow(self.scheduler, self.handle)
            else:
                status = self.scheduler.wait(self.handle, poll=0.5)
        except KeyboardInterrupt:
            self._interrupted()
            raise
        if _log_choice(logs):
            for line in launcher.end_summary(status, time.monotonic() - started):
                print(f"smddp: {line}", flush=True)
        if check and status.state is not JobState.SUCCEEDED:
            if status.state is JobState.FAILED:
                print(launcher.failure_summary(status), file=sys.stderr, flush=True)
            launcher.raise_for_status(status)
        return status

    def _interrupted(self) -> None:
        if self.scheduler.capabilities.cancel_on_interrupt:
            print(f"\nsmddp: cancelling {self.handle} ...", file=sys.stderr, flush=True)
            self.scheduler.cancel(self.handle)
            print(f"smddp: {self.handle} cancelled", file=sys.stderr, flush=True)
        else:
            print(f"\nsmddp: {self.handle} keeps running; follow it again with: smddp-launch logs --follow {self.handle}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        """Cancel the job (does nothing once it has ended)."""
        self.scheduler.cancel(self.handle)


# --- s3:// in a local rehearsal ----------------------------------------------------------------------

REHEARSING_SCHEDULERS = ("local", "docker")  # jobs whose data and archives stay on this machine
LOCAL_S3_ENV = "SMDDP_LOCAL_S3"


def local_s3_root() -> Path:
    """The folder that stands for S3 in a local rehearsal: ``$SMDDP_LOCAL_S3`` or ``~/.smddp/s3``."""
    return Path(os.environ.get(LOCAL_S3_ENV) or Path.home() / ".smddp" / "s3").expanduser()


def s3_stand_in(uri: str) -> Path:
    """``s3://bucket/a/b`` -> ``<local_s3_root>/bucket/a/b``."""
    return local_s3_root() / uri.removeprefix("s3://").strip("/")


def rehearsed_s3(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A v2 launcher's S3 locations for a job that runs on this machine, and a note for each. The rule:
    ``s3://bucket/key`` is ``<local_s3_root>/bucket/key`` when that root has a folder for the bucket, and
    always for ``output_path`` (archives stay on this machine); otherwise inputs and checkpoints go to S3
    with boto3, as SageMaker's local mode does (credentials needed)."""
    values, notes = dict(data), []
    for field in ("output_path", "checkpoint_s3_uri"):
        uri = values.get(field)
        if isinstance(uri, str) and uri.startswith("s3://") and (field == "output_path" or _has_stand_in(uri)):
            values[field] = str(s3_stand_in(uri))
            notes.append(f"{field} {uri} is {values[field]} in this rehearsal (S3 stands in as {local_s3_root()}, {LOCAL_S3_ENV}); no AWS needed")
        elif isinstance(uri, str) and uri.startswith("s3://"):
            notes.append(f"{field} {uri}: {_no_stand_in(uri)}")
    inputs = values.get("inputs")
    if isinstance(inputs, str):
        inputs = {"training": inputs}
    if isinstance(inputs, Mapping):
        values["inputs"] = {}
        for name, channel in inputs.items():
            uri = channel if isinstance(channel, str) else getattr(channel, "s3_data", None)
            values["inputs"][name] = channel
            if not (isinstance(uri, str) and uri.startswith("s3://")):
                continue
            if not _has_stand_in(uri):
                notes.append(f"channel {name!r}: {uri}: {_no_stand_in(uri)}")
                continue
            stand_in = str(s3_stand_in(uri))
            values["inputs"][name] = stand_in if isinstance(channel, str) else dataclasses.replace(channel, s3_data=stand_in)
            notes.append(f"channel {name!r}: {uri} is read from {stand_in} in this rehearsal; no AWS needed")
    return values, notes


def _has_stand_in(uri: str) -> bool:
    return (local_s3_root() / uri.removeprefix("s3://").split("/", 1)[0]).is_dir()


def _no_stand_in(uri: str) -> str:
    bucket = uri.removeprefix("s3://").split("/", 1)[0]
    return f"goes to S3 with boto3 (credentials needed): {local_s3_root() / bucket} does not exist; make it, with the data under it, to rehearse without AWS"


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    """Rebuild a ``JobSpec`` from ``JobSpec.as_dict()`` without re-checking files (they may have moved)."""
    values = dict(data)
    values["distribution"], _ = parse_distribution(values.get("distribution") or None)
    values["inputs"] = {name: TrainingInput(**channel) for name, channel in (values.get("inputs") or {}).items()}
    for name in ("dependencies", "tags", "subnets", "security_group_ids", "metric_definitions"):
        values[name] = tuple(values.get(name) or ())
    known = set(JobSpec.field_names())
    return JobSpec(**{key: value for key, value in values.items() if key in known})


def _resolve_handle(name: str, scheduler: str | None, options: Mapping[str, Any]) -> tuple[JobHandle, job_index.IndexEntry | None]:
    """A handle and index entry for a handle or job name; a name known nowhere here is a SageMaker job when
    a region is given, else an error with the closest known names."""
    if "://" in name:
        return job_index.resolve(name, scheduler=scheduler)
    root = Path(options["job_root"]).expanduser() if scheduler and options.get("job_root") else None
    if scheduler and root is not None and (root / name / RECORD_FILE).is_file():  # a job kept in that job root
        return JobHandle(scheduler, name), None
    try:
        return job_index.resolve(name, scheduler=scheduler)
    except SpecError:
        region = options.get("region")
        if scheduler in (None, "sagemaker") and region:
            return JobHandle("sagemaker", f"{region}/{name}"), None
        if scheduler == "sagemaker":
            raise SpecError(SpecIssue("training_job_name", f"cannot tell which region {name!r} runs in",
                                      "pass sagemaker://<region>/<job>, scheduler_options={'region': ...} or a sagemaker_session")) from None
        raise


def job_arguments(scheduler: Scheduler, handle: JobHandle) -> dict[str, Any] | None:
    """The attached job's own arguments (``JobSpec.as_dict()`` shape): the record a local or docker job
    keeps, or SageMaker's DescribeTrainingJob read back into v2's argument names."""
    record = getattr(scheduler, "job_record", None)  # local and docker: job.json
    if record is not None:
        return dict(record(handle)["spec"])
    describe = getattr(scheduler, "describe", None)
    return spec_dict_from_description(describe(handle)) if describe is not None else None


_DISTRIBUTION_FLAGS = (
    ("sagemaker_distributed_dataparallel_enabled", {"smdistributed": {"dataparallel": {"enabled": True}}}),
    ("sagemaker_torch_distributed_enabled", {"torch_distributed": {"enabled": True}}),
    ("sagemaker_pytorch_ddp_enabled", {"pytorchddp": {"enabled": True}}),
    ("sagemaker_mpi_enabled", {"mpi": {"enabled": True}}),
)


def spec_dict_from_description(described: Mapping[str, Any]) -> dict[str, Any]:
    """A ``DescribeTrainingJob`` answer as estimator arguments (what ``attach`` exposes)."""
    decoded = contract.decode_hyperparameters(described.get("HyperParameters") or {})
    user, framework = contract.split_hyperparameters(decoded)
    algorithm = described.get("AlgorithmSpecification") or {}
    resources = described.get("ResourceConfig") or {}
    stopping = described.get("StoppingCondition") or {}
    vpc = described.get("VpcConfig") or {}
    checkpoint = described.get("CheckpointConfig") or {}
    distribution = next((value for key, value in _DISTRIBUTION_FLAGS if framework.get(key) is True), None)
    inputs = {}
    for channel in described.get("InputDataConfig") or []:
        source = (channel.get("DataSource") or {}).get("S3DataSource") or {}
        inputs[channel["ChannelName"]] = {
            "s3_data": source.get("S3Uri", ""), "distribution": source.get("S3DataDistributionType", "FullyReplicated"),
            "s3_data_type": source.get("S3DataType", "S3Prefix"), "content_type": channel.get("ContentType"),
            "input_mode": channel.get("InputMode"), "compression": channel.get("CompressionType"), "record_wrapping": channel.get("RecordWrapperType"),
        }
    return {
        "entry_point": framework.get("sagemaker_program") or decoded.get("sagemaker_program") or "",
        "source_dir": framework.get("sagemaker_submit_directory") or decoded.get("sagemaker_submit_directory"),
        "instance_type": resources.get("InstanceType", ""),
        "instance_count": resources.get("InstanceCount", 1),
        "volume_size": resources.get("VolumeSizeInGB", 30),
        "hyperparameters": {key: value for key, value in user.items() if key != "mp_parameters"},
        "distribution": distribution,
        "inputs": inputs,
        "environment": dict(described.get("Environment") or {}),
        "role": described.get("RoleArn"),
        "image_uri": algorithm.get("TrainingImage"),
        "input_mode": algorithm.get("TrainingInputMode", "File"),
        "metric_definitions": [dict(item) for item in algorithm.get("MetricDefinitions") or []],
        "output_path": (described.get("OutputDataConfig") or {}).get("S3OutputPath"),
        "job_name": described.get("TrainingJobName"),
        "max_run": stopping.get("MaxRuntimeInSeconds", 86_400),
        "max_wait": stopping.get("MaxWaitTimeInSeconds"),
        "use_spot_instances": bool(described.get("EnableManagedSpotTraining", False)),
        "checkpoint_s3_uri": checkpoint.get("S3Uri"),
        "checkpoint_local_path": checkpoint.get("LocalPath"),
        "subnets": list(vpc.get("Subnets") or []),
        "security_group_ids": list(vpc.get("SecurityGroupIds") or []),
        "enable_network_isolation": bool(described.get("EnableNetworkIsolation", False)),
        "encrypt_inter_container_traffic": bool(described.get("EnableInterContainerTrafficEncryption", False)),
        "container_log_level": framework.get("sagemaker_container_log_level", 20),
    }


def _session_options(session: Any) -> dict[str, Any]:
    """Scheduler options from a Session (ours, or v2's own ``sagemaker.Session``)."""
    own = getattr(type(session), "scheduler_options", None)
    if callable(own):
        return dict(session.scheduler_options())
    if getattr(session, "local_mode", False):
        return {}
    given = {"region": getattr(session, "boto_region_name", None) or None, "session": getattr(session, "boto_session", None)}
    return {key: value for key, value in given.items() if value is not None}


def _experiment_config(config: Mapping[str, str] | None) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise SpecError(SpecIssue("experiment_config", f"must be a mapping, got {type(config).__name__}", f"keys: {', '.join(_EXPERIMENT_KEYS)}"))
    issues = [SpecIssue(f"experiment_config.{key}", "unknown key", did_you_mean(str(key), _EXPERIMENT_KEYS) or f"expected one of {', '.join(_EXPERIMENT_KEYS)}")
              for key in config if key not in _EXPERIMENT_KEYS]
    issues += [SpecIssue(f"experiment_config.{key}", f"must be a string, got {value!r}") for key, value in config.items() if not isinstance(value, str)]
    if issues:
        raise SpecError(issues)
    return dict(config)


def _with_experiment(dryrun: DryRun, experiment: Mapping[str, str]) -> DryRun:
    """SageMaker gets ``ExperimentConfig`` as v2 sends it; local, docker and Slurm jobs keep it in their plan."""
    if isinstance(dryrun.request, Mapping):
        return dataclasses.replace(dryrun, request={**dryrun.request, "ExperimentConfig": dict(experiment)})
    note = "experiment_config is recorded with the job; SageMaker Experiments is not emulated off SageMaker"
    return dataclasses.replace(dryrun, request=dataclasses.replace(dryrun.request, experiment_config=dict(experiment)), notes=(*dryrun.notes, note))


def _log_choice(logs: bool | str) -> bool:
    if logs not in _LOG_CHOICES:
        raise SpecError(SpecIssue("logs", f"must be True, False, 'All', 'Training', 'Rules' or 'None', got {logs!r}"))
    return _LOG_CHOICES[logs]


def _shape(dryrun: DryRun | None) -> str:
    ranks = getattr(dryrun.request, "ranks", None) if dryrun is not None else None
    if dryrun is None or ranks is None:
        return ""
    per_host = ranks.processes_per_host or "one per GPU found"
    hosts = dryrun.spec.instance_count
    return f" ({hosts} host{'s' if hosts != 1 else ''} x {per_host} rank{'s' if per_host != 1 else ''}, {dryrun.scheduler} scheduler)"


__all__ = ["Estimator", "PyTorch", "TrainingJob", "JobFailedError", "job_arguments", "spec_dict_from_description"]
