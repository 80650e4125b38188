"""The plan of a host-tree job, typed: what the local and docker planners put in the dry run's request
(and so in ``job.json``), read here once for the supervisor, its backends and the checkpoint sync.

The defaults live here and nowhere else: a record written by hand (tests) or before a field was added gets them;
a record from before this schema is refused with what to do (``_check_schema``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers.options import STOP_GRACE_PERIOD
from smddp_sdk.specs.job import JobSpec

DEFAULT_MAX_RUN: int = JobSpec.__dataclass_fields__["max_run"].default


@dataclass(frozen=True)
class HostPlan:
    """One host: its ``/opt/ml`` tree and how it starts (a process's argv and environment, or a container)."""

    host: str
    opt_ml: Path
    command: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    container: str = ""  # the container's name
    create: tuple[str, ...] = ()  # the exact ``docker create`` argv

    @classmethod
    def from_record(cls, item: Mapping[str, Any]) -> HostPlan:
        """One entry of the request's ``hosts``: ``host``, ``opt_ml``, and ``process`` or ``container``."""
        process, container = item.get("process") or {}, item.get("container") or {}
        return cls(
            item["host"],
            Path(item.get("opt_ml", "")),
            command=tuple(process.get("command", ())),
            environment=dict(process.get("environment", {})),
            container=container.get("name", ""),
            create=tuple(container.get("argv", ())),
        )


@dataclass(frozen=True)
class HostTreePlan:
    job_name: str
    hosts: tuple[HostPlan, ...]
    model_data: Path
    output_data: Path
    backend: str = "process"  # or "container"
    max_run: int = DEFAULT_MAX_RUN
    max_wait: int | None = None  # managed spot: every attempt together, waits for capacity included
    retry_script_errors: bool = False  # retry a failed script too, not only the platform's failures
    interrupt_after: tuple[float, ...] = ()  # spot interruptions planned, in seconds since the job's start
    grace: float = STOP_GRACE_PERIOD.default  # seconds between SIGTERM and SIGKILL
    keep_job_dir: bool = True
    keep_containers: bool = False
    docker_cli: str = "docker"
    network: tuple[str, ...] = ()  # the ``docker network create`` argv

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> HostTreePlan:
        _check_schema(request)
        hosts = [HostPlan.from_record(item) for item in request.get("hosts", ())]
        artifacts = request.get("artifacts") or {}
        return cls(
            job_name=str(request.get("job_name", "")),
            hosts=tuple(hosts),
            model_data=Path(artifacts.get("model_data", "")),
            output_data=Path(artifacts.get("output_data", "")),
            backend=str(request.get("backend", "process")),
            max_run=int(request.get("max_run") or DEFAULT_MAX_RUN),
            max_wait=int(request["max_wait"]) if request.get("max_wait") else None,
            retry_script_errors=bool(request.get("retry_script_errors", False)),
            interrupt_after=tuple(float(t) for t in request.get("interrupt_after") or ()),
            grace=float(request.get("stop_grace_period", STOP_GRACE_PERIOD.default)),
            keep_job_dir=bool(request.get("keep_job_dir", True)),
            keep_containers=bool(request.get("keep_containers", False)),
            docker_cli=str(request.get("docker_cli") or "docker"),
            network=tuple(request.get("network", ())),
        )

    def host(self, name: str) -> HostPlan:
        return next(item for item in self.hosts if item.host == name)


def _check_schema(request: Mapping[str, Any]) -> None:
    """Refuse a record from before the one job.json schema (local's hosts with a ``base_dir``, docker's
    ``containers``): read as this one, it would be a job without hosts or trees."""
    if "containers" in request or any("base_dir" in item for item in request.get("hosts", ())):
        raise SpecError(
            SpecIssue(
                "job",
                f"{request.get('handle', 'this job')} was written by an older smddp-sdk, whose job.json this version does not read",
                f"use the version that started it, or remove its directory by hand: rm -rf {request.get('job_dir', '<its job directory>')}",
            )
        )
