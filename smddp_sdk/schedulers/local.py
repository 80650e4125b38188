"""The local scheduler: N simulated hosts as process trees on this machine, no Docker and no AWS.

This module is the plan: every host's command (``python -m smddp_sdk.runtime``, never imported),
environment and config files. Everything after it -- the job directory, the supervisor that starts the
hosts through the process backend, ``status``, ``logs`` and ``cancel`` -- is ``hosttree``'s.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import ClassVar

from smddp_sdk.errors import SpecIssue
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.hosttree.backend import TOKEN_PLACEHOLDER
from smddp_sdk.schedulers.hosttree.host_trees import HostTree, host_names, largest_entries
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.jobs import HostTreeScheduler
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan, Process, Ranks
from smddp_sdk.schedulers.hosttree.process_backend import PORT_PLACEHOLDER
from smddp_sdk.schedulers.job_files import default_job_root, package_parent, ranks_per_host
from smddp_sdk.schedulers.options import INTERRUPT_AFTER, PROCESSES_PER_HOST, RETRY_SCRIPT_ERRORS, STOP_GRACE_PERIOD, WARM_RESTART, Option, SchedulerOptions, boolean, job_root, with_default
from smddp_sdk.specs import contract, limits
from smddp_sdk.specs.job import JobSpec, TrainingInput, make_job_name

LOOPBACK = "127.0.0.1"


class LocalScheduler(HostTreeScheduler):
    """Runs a job as simulated hosts ``algo-1..N`` on this machine, each a runtime process tree."""

    name: ClassVar[str] = "local"
    backend: ClassVar[str] = "process"
    options: ClassVar[SchedulerOptions] = SchedulerOptions.of(
        "local",
        job_root("where job directories go (default $SMDDP_JOB_ROOT or ~/.smddp/jobs)", default_job_root),
        with_default(PROCESSES_PER_HOST, None, "ranks per simulated host (default: the instance type's GPU count, else 1)"),
        Option("keep_job_dir", "bool", True, "keep the job directory (logs, /opt/ml trees) after the job", check=boolean),
        WARM_RESTART,
        Option("survive_host_loss", "bool", False, "replace a lost host alone while the other hosts' ranks train on, for scripts that loop with Recoverable.steps (docs/resuming.md)", check=boolean),
        STOP_GRACE_PERIOD,
        RETRY_SCRIPT_ERRORS,
        INTERRUPT_AFTER,
    )
    keep_job_dir: bool
    warm_restart: bool
    survive_host_loss: bool

    # --- planning ---------------------------------------------------------------------------------

    def _feature_issues(self, spec: JobSpec) -> list[SpecIssue]:
        issues = []
        if spec.distribution.modelparallel is not None:
            issues.append(SpecIssue("distribution.smdistributed.modelparallel", "the bundled runtime cannot run SageMaker model parallelism (it needs AWS's SMP containers)", "use scheduler='sagemaker' with an AWS image"))
        per_host = ranks_per_host(spec, self._num_gpus(spec)) or 1  # GPUs found: at least one rank
        return [*issues, *limits.local_processes_issues(spec.instance_count, per_host)]

    def _num_gpus(self, spec: JobSpec) -> int | None:
        return self._simulated_gpus(spec, gpus_passed=spec.instance_type == "local_gpu")

    def plan(self, spec: JobSpec) -> DryRun[HostTreePlan]:
        """Everything ``schedule`` will write and start; ports and the job token are made at start."""
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        num_gpus = self._num_gpus(spec)
        per_host = ranks_per_host(spec, num_gpus)
        plan = self._plan(
            spec, job_name,
            process=self._process(spec, job_name, num_gpus),
            ranks=Ranks(spec.distribution.launcher, per_host, per_host and per_host * spec.instance_count),
            inputs={name: _input_request(channel, name) for name, channel in spec.inputs.items()},
            keep_job_dir=self.keep_job_dir,
        )
        return self._dryrun(spec, plan, _notes(spec, per_host))

    def _process(self, spec: JobSpec, job_name: str, num_gpus: int | None) -> Process:
        """How every host starts: the runtime's command and environment (each host adds its own tree)."""
        hosts = host_names(spec.instance_count)
        environment = {
            "TRAINING_JOB_NAME": job_name,
            contract.HOST_ADDRESSES_ENV: json.dumps(dict.fromkeys(hosts, LOOPBACK), separators=(",", ":")),
            contract.MASTER_PORT_ENV: PORT_PLACEHOLDER,
            contract.SERVER_PORT_ENV: PORT_PLACEHOLDER,
            contract.AGENT_PORT_ENV: PORT_PLACEHOLDER,
            contract.JOB_TOKEN_ENV: TOKEN_PLACEHOLDER,
            contract.BIND_OPT_ML_ENV: "1",  # each host's runtime puts its tree on /opt/ml (the job's environment may say 0)
            contract.ENV_CACHE_ENV: os.environ.get(contract.ENV_CACHE_ENV) or str(self.job_root / ".envs"),  # requirements.txt venvs
            **({contract.NUM_GPUS_ENV: str(num_gpus)} if num_gpus is not None else {}),  # simulated GPUs: ranks per host
            **dict(spec.environment),
            **({contract.LINK_ENCRYPT_ENV: "1"} if spec.encrypt_inter_container_traffic else {}),  # the spec wins: never clear text by mistake
            **({contract.WARM_RESTART_ENV: "1"} if self.warm_restart else {}),
            **({contract.SURVIVORS_ENV: "1"} if self.survive_host_loss else {}),
        }
        # The runtime must import smddp_sdk; the user's own PYTHONPATH (if any) comes after it.
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent(), spec.environment.get("PYTHONPATH")]))
        return Process((sys.executable, "-m", "smddp_sdk.runtime"), environment)

    # --- running ----------------------------------------------------------------------------------

    def _write_job_dir(self, dryrun: DryRun[HostTreePlan], job_dir: JobDir) -> list[HostTree]:
        trees = super()._write_job_dir(dryrun, job_dir)
        _warn_if_large(job_dir.code_dir)
        return trees


def _warn_if_large(code_dir: Path) -> None:
    """A big snapshot usually means data or a virtualenv sits in source_dir; say which entries are big."""
    total, largest = largest_entries(code_dir)
    if total >= 100 * 2**20:
        biggest = ", ".join(f"{name} ({size / 2**20:.0f} MB)" for name, size in largest)
        print(
            f"smddp: warning: the code snapshot is {total / 2**20:.0f} MB (largest: {biggest}); "
            "keep data out of source_dir and pass it with fit(inputs=...)",
            file=sys.stderr,
        )


def _notes(spec: JobSpec, per_host: int | None) -> tuple[str, ...]:
    checks: list[tuple[bool, str]] = [
        (bool(spec.image_uri), f"image_uri {spec.image_uri!r} is not used locally: the runtime runs on this machine's Python (use scheduler='docker' to run the image)"),
        (bool(spec.role), "role is not needed locally and is ignored"),
        (bool(spec.code_location), "code_location is not used locally: the code is snapshotted into the job directory"),
        (spec.instance_type == "local_gpu" and spec.instance_count > 1, "local_gpu: every simulated host sees all of this machine's GPUs, so the hosts share them"),
    ]
    notes = [line for applies, line in checks if applies]
    instance = spec.instance
    if instance is not None and instance.gpus:
        ranks = f"each host runs {per_host} rank{'s' if per_host != 1 else ''}" if per_host else "each host runs one rank per GPU it finds"
        notes.append(f"{spec.instance_type} has {instance.gpus} GPUs: {ranks}; on a CPU machine they run on CPU tensors, which AWS's SMDDP refuses (on SageMaker, move the model and data to the GPU)")
    return tuple(notes)


def _input_request(channel: TrainingInput, name: str) -> dict[str, str]:
    source = str(channel.local_path) if channel.local_path is not None else channel.s3_data
    sharded = {"distribution": channel.distribution} if channel.distribution != "FullyReplicated" else {}
    return {"source": source, **sharded, "target": f"input/data/{name}"}
