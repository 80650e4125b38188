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

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smddp_sdk import launcher
from smddp_sdk.errors import JobFailedError, SpecError, SpecIssue, did_you_mean
from smddp_sdk.schedulers import get_scheduler, infer_scheduler
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs import contract
from smddp_sdk.specs.distribution import parse_distribution
from smddp_sdk.specs.job import JobSpec, TrainingInput
from smddp_sdk.specs.status import SCHEDULER_NAMES, JobHandle, JobState, JobStatus

_OWN_ARGUMENTS = ("scheduler", "scheduler_options")
# v2 arguments that have no meaning here, each with what to do instead.
_UNSUPPORTED_V2_ARGUMENTS = {
    "sagemaker_session": "not needed: the sagemaker scheduler makes its own boto3 client; set the region with scheduler_options={'region': ...} or AWS_REGION",
    "instance_groups": "heterogeneous clusters are not supported; use instance_type and instance_count",
    "rules": "SageMaker Debugger rules are not supported",
    "profiler_config": "the profiler is not supported; disable_profiler=True is accepted",
    "tensorboard_output_config": "TensorBoard output sync is not supported; write event files to SM_OUTPUT_DATA_DIR",
    "git_config": "clone the repository yourself and pass its directory as source_dir",
    "model_uri": "pass the model as an input channel instead: fit(inputs={'model': <location>})",
    "model_channel_name": "pass the model as an input channel instead: fit(inputs={'model': <location>})",
    "compiler_config": "SageMaker Training Compiler is not supported",
    "training_recipe": "HyperPod recipes are not supported; use entry_point",
    "recipe_overrides": "HyperPod recipes are not supported; use entry_point",
    "container_entry_point": "the container runs the smddp runtime (`train`); use entry_point and hyperparameters",
    "container_arguments": "the container runs the smddp runtime (`train`); use entry_point and hyperparameters",
    "disable_output_compression": "model.tar.gz is always compressed",
    "enable_remote_debug": "remote debugging is not supported",
    "enable_session_tag_chaining": "session tag chaining is not supported",
    "training_plan": "SageMaker training plans are not supported",
    "instance_placement_config": "instance placement is not supported",
    "enable_infra_check": "infrastructure checks are not supported",
    "training_repository_access_mode": "private image repositories are not supported; push the image to ECR",
    "training_repository_credentials_provider_arn": "private image repositories are not supported; push the image to ECR",
    "volume_kms_key": "KMS keys are not supported yet",
    "output_kms_key": "KMS keys are not supported yet",
}
_LOG_CHOICES = {True: True, False: False, "All": True, "Training": True, "Rules": True, "None": False}
_DESCRIBE_STATUS = {
    JobState.PENDING: "InProgress", JobState.STARTING: "InProgress", JobState.RUNNING: "InProgress",
    JobState.SUCCEEDED: "Completed", JobState.FAILED: "Failed", JobState.CANCELLED: "Stopped", JobState.UNKNOWN: "InProgress",
}


class Estimator:
    """A training job description you can run, watch and attach to again; v2's ``EstimatorBase`` surface."""

    def __init__(
        self,
        entry_point: str | None = None,
        *,
        scheduler: str | None = None,
        scheduler_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        arguments = {"entry_point": entry_point, **kwargs}
        self._arguments = {key: value for key, value in arguments.items() if value is not None}
        self._base_dir = Path.cwd()
        self.scheduler_options: dict[str, Any] = dict(scheduler_options or {}) if isinstance(scheduler_options, Mapping) else {}
        issues = self._argument_issues(scheduler_options)
        spec: JobSpec | None = None
        try:
            spec = JobSpec.from_mapping(self._spec_arguments(), base_dir=self._base_dir)
        except SpecError as error:
            issues += error.issues
        self.scheduler: str = scheduler or infer_scheduler(str(self._arguments.get("instance_type", "")))
        if self.scheduler not in SCHEDULER_NAMES:
            issues.append(SpecIssue("scheduler", f"unknown scheduler {self.scheduler!r}", did_you_mean(str(self.scheduler), SCHEDULER_NAMES) or f"expected one of {', '.join(SCHEDULER_NAMES)}"))
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
            if name in _UNSUPPORTED_V2_ARGUMENTS:
                issues.append(SpecIssue(name, "is a SageMaker SDK v2 argument smddp-sdk does not support", _UNSUPPORTED_V2_ARGUMENTS[name]))
            elif name not in known:
                issues.append(SpecIssue(name, "unknown argument", did_you_mean(name, known)))
        if scheduler_options is not None and not isinstance(scheduler_options, Mapping):
            issues.append(SpecIssue("scheduler_options", f"must be a mapping of option names to values, got {type(scheduler_options).__name__}"))
        return issues

    def _spec_arguments(self, **overrides: Any) -> dict[str, Any]:
        fields = JobSpec.field_names()
        data = {key: value for key, value in self._arguments.items() if key in fields}
        data.update({key: value for key, value in overrides.items() if value is not None})
        return data

    # --- v2 attributes --------------------------------------------------------------------------

    @property
    def spec(self) -> JobSpec:
        """The validated job description every scheduler receives."""
        if self._spec is None:
            raise SpecError(SpecIssue("", f"this estimator was attached to {self._handle_text()} and its arguments are unknown", "build a new estimator to run a job"))
        return self._spec

    def __getattr__(self, name: str) -> Any:
        # v2 exposes its constructor arguments as attributes (estimator.instance_type, ...).
        if name.startswith("_") or name not in JobSpec.field_names():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.spec, name)

    def hyperparameters(self) -> dict[str, str]:
        """The user's hyperparameters JSON-encoded as v2 sends them."""
        return contract.encode_hyperparameters(self.spec.hyperparameters)

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
        return JobSpec.from_mapping(self._spec_arguments(inputs=inputs, job_name=job_name), base_dir=self._base_dir)

    def dryrun(self, inputs: Any = None, job_name: str | None = None) -> DryRun:
        """The exact request ``fit`` would make (pure: nothing written, started or uploaded; nothing printed).
        ``print(estimator.dryrun().render())`` shows it."""
        spec = self.job_spec(inputs, job_name)
        scheduler = self._get_scheduler()
        issues = scheduler.validate(spec)
        if issues:
            raise SpecError(issues)
        return scheduler.dryrun(spec)

    def plan(self, instances: Any = "1,2,4,8,16,32", **options: Any) -> Any:
        """Predicted step time, scaling efficiency and cost per instance count, as ``smddp-launch plan``
        (options: profile, compute_ms, gradient_mb, instance_type, price_per_hour, ...; docs/planning.md)."""
        from smddp_sdk.planning import plan_for_spec

        return plan_for_spec(self.spec, instances, **options)

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool | str = True, job_name: str | None = None) -> None:
        """Run the job. ``inputs``: a location or ``{channel: location or TrainingInput}``; local paths and
        ``file://`` work locally. With ``wait`` it streams the logs (``logs``) until the job ends and raises
        ``JobFailedError`` naming the root-cause host and rank if it fails; Ctrl-C cancels local jobs."""
        show_logs = _log_choice(logs)
        dryrun = self.dryrun(inputs, job_name)
        handle = launcher.schedule(self._get_scheduler(), dryrun, attached=wait)
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

    def _handle_text(self) -> str:
        return str(self.latest_training_job.handle) if self.latest_training_job else "a job"

    # --- attaching ------------------------------------------------------------------------------

    @classmethod
    def attach(
        cls,
        training_job_name: str,
        sagemaker_session: Any = None,
        model_channel_name: str = "model",
        *,
        scheduler: str | None = None,
        scheduler_options: Mapping[str, Any] | None = None,
    ) -> Estimator:
        """An estimator bound to an existing job: a handle (``local://<job>``, ``sagemaker://<region>/<job>``)
        or a bare job name (looked up in the local job root, else on SageMaker unless ``scheduler`` says)."""
        if sagemaker_session is not None:
            raise SpecError(SpecIssue("sagemaker_session", "is a SageMaker SDK v2 argument smddp-sdk does not support", _UNSUPPORTED_V2_ARGUMENTS["sagemaker_session"]))
        options = dict(scheduler_options or {})
        handle = _resolve_handle(training_job_name, scheduler, options)
        estimator = cls.__new__(cls)
        estimator._arguments, estimator._base_dir = {}, Path.cwd()
        estimator.scheduler, estimator.scheduler_options = handle.scheduler, options
        estimator._scheduler = None
        estimator._spec = None
        job_scheduler = estimator._get_scheduler()
        record = getattr(job_scheduler, "job_record", None)
        if record is not None:  # the local scheduler keeps the spec it ran
            spec_dict = record(handle)["spec"]
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
        super().__init__(
            entry_point,
            framework_version=framework_version,
            py_version=py_version,
            source_dir=source_dir,
            hyperparameters=hyperparameters,
            image_uri=image_uri,
            distribution=distribution,
            **kwargs,
        )


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
        for key, detail in (("TrainingStartTime", "started"), ("TrainingEndTime", "ended")):
            if status.details.get(detail):
                described[key] = status.details[detail]
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
            print(f"smddp: {self.handle} {status.state.value} after {time.monotonic() - started:.1f} s", flush=True)
        if check and status.state is not JobState.SUCCEEDED:
            if status.state is JobState.FAILED:
                print(launcher.failure_summary(status), file=sys.stderr, flush=True)
            launcher.raise_for_status(status)
        return status

    def _interrupted(self) -> None:
        if self.handle.scheduler in ("local", "docker"):
            print(f"\nsmddp: cancelling {self.handle} ...", file=sys.stderr, flush=True)
            self.scheduler.cancel(self.handle)
            print(f"smddp: {self.handle} cancelled", file=sys.stderr, flush=True)
        else:
            print(f"\nsmddp: {self.handle} keeps running; follow it again with: smddp-launch logs --follow {self.handle}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        """Cancel the job (does nothing once it has ended)."""
        self.scheduler.cancel(self.handle)


def spec_from_dict(data: Mapping[str, Any]) -> JobSpec:
    """Rebuild a ``JobSpec`` from ``JobSpec.as_dict()`` without re-checking files (they may have moved)."""
    values = dict(data)
    values["distribution"], _ = parse_distribution(values.get("distribution") or None)
    values["inputs"] = {name: TrainingInput(**channel) for name, channel in (values.get("inputs") or {}).items()}
    for name in ("dependencies", "tags", "subnets", "security_group_ids", "metric_definitions"):
        values[name] = tuple(values.get(name) or ())
    known = set(JobSpec.field_names())
    return JobSpec(**{key: value for key, value in values.items() if key in known})


def _resolve_handle(name: str, scheduler: str | None, options: Mapping[str, Any]) -> JobHandle:
    if "://" in name:
        handle = JobHandle.parse(name)
        if scheduler is not None and scheduler != handle.scheduler:
            raise SpecError(SpecIssue("scheduler", f"{name!r} is a {handle.scheduler} job, not a {scheduler} one"))
        return handle
    if scheduler is None:
        local = get_scheduler("local", **{k: v for k, v in options.items() if k == "job_root"})
        has_job = getattr(local, "has_job", None)
        scheduler = "local" if has_job is not None and has_job(name) else "sagemaker"
    if scheduler == "sagemaker":
        region = options.get("region")
        if not region:
            raise SpecError(SpecIssue("training_job_name", f"cannot tell which region {name!r} runs in", "pass sagemaker://<region>/<job> or scheduler_options={'region': ...}"))
        return JobHandle("sagemaker", f"{region}/{name}")
    return JobHandle.parse(f"{scheduler}://{name}")


def _log_choice(logs: bool | str) -> bool:
    if logs not in _LOG_CHOICES:
        raise SpecError(SpecIssue("logs", f"must be True, False, 'All', 'Training', 'Rules' or 'None', got {logs!r}"))
    return _LOG_CHOICES[logs]


def _shape(dryrun: DryRun | None) -> str:
    if dryrun is None or not isinstance(dryrun.request, Mapping) or "ranks" not in dryrun.request:
        return ""
    per_host = dryrun.request["ranks"].get("processes_per_host")
    hosts = dryrun.spec.instance_count
    return f" ({hosts} host{'s' if hosts != 1 else ''} x {per_host} rank{'s' if per_host != 1 else ''}, {dryrun.scheduler} scheduler)"


__all__ = ["Estimator", "PyTorch", "TrainingJob", "JobFailedError"]
