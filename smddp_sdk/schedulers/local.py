"""The local scheduler: N simulated hosts as process trees on this machine, no Docker and no AWS.

This module is the plan: ``dryrun`` computes every host's command, environment and config files, and
``schedule`` writes the job directory (see ``local_job``): a code snapshot and one ``/opt/ml`` tree per
host (``host_trees``). The run itself belongs to the one host-tree lifecycle (``hosts``): the detached
supervisor starts the runtime once per host through the process backend (``python -m
smddp_sdk.runtime``, never imported), and ``status``, ``logs`` and ``cancel`` come from ``hosts.jobs``.

Options (``scheduler_options`` / ``get_scheduler("local", **options)``):

- ``job_root``: where job directories go (default ``$SMDDP_JOB_ROOT`` or ``~/.smddp/jobs``);
- ``processes_per_host``: simulated GPUs per host, i.e. ranks per host for distributed jobs (default: the
  instance type's GPU count from the catalogue; ``local`` has none, so 1; ``local_gpu`` probes this machine);
- ``keep_job_dir``: keep the per-host trees and the code snapshot after a successful job (default True;
  the record, logs and artifacts are always kept);
- ``stop_grace_period``: seconds between SIGTERM and SIGKILL when a job is cancelled (default 10).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.schedulers import fidelity
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.host_trees import config_files, host_names, largest_entries, prepare_host_trees, stage_code
from smddp_sdk.schedulers.hosts.jobs import HostTreeScheduler, package_parent
from smddp_sdk.schedulers.hosts.process_backend import PORT_PLACEHOLDER, TOKEN_PLACEHOLDER
from smddp_sdk.schedulers.local_job import JobDir, default_job_root
from smddp_sdk.specs import contract, limits
from smddp_sdk.specs.job import JobSpec, TrainingInput, make_job_name
from smddp_sdk.specs.status import JobHandle

LOOPBACK = "127.0.0.1"
NUM_GPUS_ENV = contract.NUM_GPUS_ENV  # simulated GPUs per host (the runtime plans that many ranks per host)
JOB_TOKEN_ENV = contract.JOB_TOKEN_ENV  # shared secret the runtimes of one job prove to each other
BIND_OPT_ML_ENV = contract.BIND_OPT_ML_ENV  # each host's runtime binds its tree on a private /opt/ml
ENV_CACHE_ENV = contract.ENV_CACHE_ENV  # requirements.txt virtualenvs, keyed by the file's hash
_OPTIONS = ("job_root", "processes_per_host", "keep_job_dir", "stop_grace_period")


class LocalScheduler(HostTreeScheduler):
    """Runs a job as simulated hosts ``algo-1..N`` on this machine, each a runtime process tree."""

    name: ClassVar[str] = "local"

    def __init__(
        self,
        job_root: str | os.PathLike[str] | None = None,
        processes_per_host: int | None = None,
        keep_job_dir: bool = True,
        stop_grace_period: float = 10.0,
        **unknown: Any,
    ) -> None:
        issues = [
            SpecIssue(f"scheduler_options.{key}", "unknown option of the local scheduler", did_you_mean(key, _OPTIONS) or f"expected one of {', '.join(_OPTIONS)}")
            for key in unknown
        ]
        issues += limits.processes_per_host_issues(processes_per_host, "scheduler_options.processes_per_host")
        if not isinstance(keep_job_dir, bool):
            issues.append(SpecIssue("scheduler_options.keep_job_dir", f"must be true or false, got {keep_job_dir!r}"))
        if isinstance(stop_grace_period, bool) or not isinstance(stop_grace_period, (int, float)) or stop_grace_period < 0:
            issues.append(SpecIssue("scheduler_options.stop_grace_period", f"must be a number of seconds >= 0, got {stop_grace_period!r}"))
        if issues:
            raise SpecError(issues)
        self.job_root = Path(job_root).expanduser().absolute() if job_root else default_job_root().absolute()
        self.processes_per_host = processes_per_host
        self.keep_job_dir = keep_job_dir
        self.stop_grace_period = float(stop_grace_period)

    # --- planning ---------------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        """What this machine cannot run: S3 code or output, spot, Pipe mode, model parallelism, a name clash."""
        per_host = spec.distribution.mpi_processes_per_host or self._simulated_gpus(spec) or 1
        return [*self._location_issues(spec), *self._feature_issues(spec), *fidelity.issues(spec),
                *limits.local_processes_issues(spec.instance_count, per_host)]

    def _location_issues(self, spec: JobSpec) -> list[SpecIssue]:
        issues = []
        if spec.source_dir and spec.source_dir.startswith("s3://"):
            issues.append(SpecIssue("source_dir", "local mode runs code from this machine, not from S3", "give a local directory"))
        if spec.output_path and spec.output_path.startswith("s3://"):
            issues.append(SpecIssue("output_path", "local mode writes artifacts to this machine", "use a local path or file:// URI, or leave it unset"))
        elif problem := _unwritable(Path(_local(spec.output_path)) if spec.output_path else self.job_root):
            issues.append(SpecIssue("output_path" if spec.output_path else "scheduler_options.job_root", problem))
        if spec.job_name and JobDir(self.job_root / spec.job_name).path.exists():
            issues.append(SpecIssue("job_name", f"a local job named {spec.job_name!r} already exists in {self.job_root}", "choose another job_name, or remove that job's directory"))
        return issues

    @staticmethod
    def _feature_issues(spec: JobSpec) -> list[SpecIssue]:
        issues = []
        if spec.use_spot_instances:
            issues.append(SpecIssue("use_spot_instances", "spot training is not supported in local mode", "drop it, or use scheduler='sagemaker'"))
        if spec.distribution.modelparallel is not None:
            issues.append(SpecIssue("distribution.smdistributed.modelparallel", "the bundled runtime cannot run SageMaker model parallelism (it needs AWS's SMP containers)", "use scheduler='sagemaker' with an AWS image"))
        return issues

    def dryrun(self, spec: JobSpec) -> DryRun:
        """Everything ``schedule`` will write and start; ports and the job token are made at start."""
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        job_dir = JobDir(self.job_root / job_name)
        hosts = host_names(spec.instance_count)
        submit_directory = f"file://{job_dir.code_dir}"
        output_dir = Path(_local(spec.output_path)).expanduser().absolute() if spec.output_path else self.job_root
        artifacts = output_dir / job_name / "output"
        num_gpus = self._simulated_gpus(spec)
        request = {
            "job_name": job_name,
            "handle": str(JobHandle(self.name, job_name)),
            "job_dir": str(job_dir.path),
            "code": {"source": spec.source_dir or spec.entry_point, "dependencies": list(spec.dependencies), "snapshot": str(job_dir.code_dir)},
            "hosts": [self._host_request(spec, job_dir, job_name, hosts, host, submit_directory, num_gpus) for host in hosts],
            "ranks": _rank_summary(spec, len(hosts), num_gpus),
            "inputs": {name: _input_request(channel, name) for name, channel in spec.inputs.items()},
            "artifacts": {"model_data": str(artifacts / "model.tar.gz"), "output_data": str(artifacts / "output.tar.gz")},
            "backend": "process",
            "max_run": spec.max_run,
            "stop_grace_period": self.stop_grace_period,
            "keep_job_dir": self.keep_job_dir,
        }
        return DryRun(self.name, spec, job_name, request, (*_notes(spec), *fidelity.notes(spec, self.name, len(hosts))))

    def _host_request(self, spec: JobSpec, job_dir: JobDir, job_name: str, hosts: list[str], host: str, submit_directory: str, num_gpus: int | None) -> dict[str, Any]:
        environment = {
            contract.BASE_DIR_ENV: str(job_dir.host_dir(host)),
            "TRAINING_JOB_NAME": job_name,
            contract.HOST_ADDRESSES_ENV: _json_compact({name: LOOPBACK for name in hosts}),
            contract.MASTER_PORT_ENV: PORT_PLACEHOLDER,
            contract.SERVER_PORT_ENV: PORT_PLACEHOLDER,
            contract.AGENT_PORT_ENV: PORT_PLACEHOLDER,
            JOB_TOKEN_ENV: TOKEN_PLACEHOLDER,
            BIND_OPT_ML_ENV: "1",  # each host's runtime puts its tree on /opt/ml (the job's environment may say 0)
            ENV_CACHE_ENV: os.environ.get(ENV_CACHE_ENV) or str(self.job_root / ".envs"),  # requirements.txt venvs
            **({NUM_GPUS_ENV: str(num_gpus)} if num_gpus is not None else {}),
            **dict(spec.environment),
        }
        # The runtime must import smddp_sdk; the user's own PYTHONPATH (if any) comes after it.
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent(), spec.environment.get("PYTHONPATH")]))
        return {
            "host": host,
            "base_dir": str(job_dir.host_dir(host)),
            "command": [sys.executable, "-m", "smddp_sdk.runtime"],
            "environment": environment,
            "config_files": config_files(spec, job_name=job_name, hosts=hosts, current_host=host, submit_directory=submit_directory),
        }

    def _simulated_gpus(self, spec: JobSpec) -> int | None:
        """SMDDP_NUM_GPUS for every host; None lets the runtime count this machine's GPUs (``local_gpu``)."""
        if self.processes_per_host is not None:
            return self.processes_per_host
        if spec.instance_type == "local_gpu":
            return None
        instance = spec.instance
        return instance.gpus if instance is not None else 0

    # --- running ----------------------------------------------------------------------------------

    def schedule(self, dryrun: DryRun, *, owner_pid: int | None = None) -> JobHandle:
        """Write the job directory and start its supervisor; returns at once.

        With ``owner_pid`` (the estimator's ``fit(wait=True)`` and ``smddp-launch`` without ``--detach``
        pass their own pid) the job is cancelled if that process goes away before the job ends; without
        it the job keeps running after the caller exits.
        """
        if dryrun.scheduler != self.name:
            raise SpecError(SpecIssue("scheduler", f"this dryrun was made for the {dryrun.scheduler!r} scheduler, not 'local'"))
        issues = self.validate(dryrun.spec)
        if issues:
            raise SpecError(issues)
        fidelity.warn(dryrun.notes)
        return self._start_job(dryrun, owner_pid)

    def _write_job_dir(self, dryrun: DryRun, job_dir: JobDir) -> None:
        spec, request = dryrun.spec, dryrun.request
        stage_code(spec, job_dir.code_dir)
        _warn_if_large(job_dir.code_dir)
        hosts = [host["host"] for host in request["hosts"]]
        prepare_host_trees(spec, job_dir.path, dryrun.job_name, hosts, submit_directory=f"file://{job_dir.code_dir}")


LARGE_CODE_BYTES = 100 * 2**20


def _warn_if_large(code_dir: Path) -> None:
    """A big snapshot usually means data or a virtualenv sits in source_dir; say which entries are big."""
    total, largest = largest_entries(code_dir)
    if total >= LARGE_CODE_BYTES:
        biggest = ", ".join(f"{name} ({size / 2**20:.0f} MB)" for name, size in largest)
        print(
            f"smddp: warning: the code snapshot is {total / 2**20:.0f} MB (largest: {biggest}); "
            "keep data out of source_dir and pass it with fit(inputs=...)",
            file=sys.stderr,
        )


def _local(uri: str) -> str:
    return uri.removeprefix("file://")


def _unwritable(path: Path) -> str:
    """Why ``path`` (existing or to be created) cannot receive files, or "" when it can."""
    path = path.expanduser()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(probe)!r} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{str(probe)!r} is not writable"
    return ""


def _rank_summary(spec: JobSpec, host_count: int, num_gpus: int | None) -> dict[str, Any]:
    if spec.distribution.launcher == "none":
        return {"launcher": "none", "processes_per_host": 1, "world_size": host_count}
    per_host: Any = spec.distribution.mpi_processes_per_host or num_gpus or (1 if num_gpus == 0 else "one per GPU found")
    world: Any = per_host * host_count if isinstance(per_host, int) else "hosts x GPUs found"
    return {"launcher": spec.distribution.launcher, "processes_per_host": per_host, "world_size": world}


def _notes(spec: JobSpec) -> tuple[str, ...]:
    notes = []
    if spec.image_uri:
        notes.append(f"image_uri {spec.image_uri!r} is not used locally: the runtime runs on this machine's Python (use scheduler='docker' to run the image)")
    if spec.role:
        notes.append("role is not needed locally and is ignored")
    if spec.code_location:
        notes.append("code_location is not used locally: the code is snapshotted into the job directory")
    if spec.instance_type == "local_gpu" and spec.instance_count > 1:
        notes.append("local_gpu: every simulated host sees all of this machine's GPUs, so the hosts share them")
    instance = spec.instance
    if instance is not None and instance.gpus:
        notes.append(f"{spec.instance_type} has {instance.gpus} GPUs: each host plans that many ranks; on a CPU machine they run on CPU")
    return tuple(notes)


def _input_request(channel: TrainingInput, name: str) -> dict[str, str]:
    source = str(channel.local_path) if channel.local_path is not None else channel.s3_data
    sharded = {"distribution": channel.distribution} if channel.distribution != "FullyReplicated" else {}
    return {"source": source, **sharded, "target": f"input/data/{name}"}


def _json_compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
