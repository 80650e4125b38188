"""The plan of a host-tree job, typed: what the local and docker planners build once, what the dry run shows,
what ``job.json`` stores and what the supervisor, its backends and the checkpoint sync read (once per process:
``JobDir.plan``).

Its size grows with the hosts, never with hosts x hosts: the config files are held once (``ConfigFiles``) and
a local host's launch is shared (``Process``), so a plan of a thousand hosts is made and stored in milliseconds.
The dry run shows it whole up to ``SHOWN_HOSTS`` hosts, and summarised beyond (``shown``).

The defaults live here and nowhere else: a record written by hand (tests) gets them; a record from before this
schema is refused with what to do (``from_record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers.job_files import Artifacts, ConfigFiles
from smddp_sdk.schedulers.options import STOP_GRACE_PERIOD
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec, RetryPolicy

DEFAULT_MAX_RUN: int = JobSpec.__dataclass_fields__["max_run"].default
SHOWN_HOSTS = 8  # the dry run shows every host up to this many, then the first, the last and a count
_SHOWN_TEXT = 200  # characters of one value shown in a summarised plan


@dataclass(frozen=True)
class HostPlan:
    """One host: its ``/opt/ml`` tree, and for a container its name and exact ``docker create`` argv."""

    host: str
    opt_ml: Path
    container: str = ""
    create: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> HostPlan:
        container = item.get("container") or {}
        return cls(item["host"], Path(item.get("opt_ml", "")), container.get("name", ""), tuple(container.get("argv", ())))

    def to_json(self) -> dict[str, Any]:
        container = {"container": {"name": self.container, "argv": list(self.create)}} if self.container else {}
        return {"host": self.host, "opt_ml": str(self.opt_ml), **container}


@dataclass(frozen=True)
class Process:
    """How every local host's runtime starts: one command and one environment for all, each host's own tree
    added as ``SAGEMAKER_BASE_DIR`` (``HostTreePlan.environment``)."""

    command: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Process:
        return cls(tuple(data.get("command", ())), dict(data.get("environment", {})))

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "environment": dict(self.environment)}


@dataclass(frozen=True)
class Ranks:
    """The ranks the hosts will run (``job_files.ranks_per_host``); None where a host counts its GPUs."""

    launcher: str
    processes_per_host: int | None
    world_size: int | None

    def to_json(self) -> dict[str, Any]:
        found = "one per GPU found"
        return {"launcher": self.launcher, "processes_per_host": self.processes_per_host or found,
                "world_size": self.world_size or "hosts x GPUs found"}


@dataclass(frozen=True)
class Spot:
    """Managed spot: every attempt together within ``max_wait``; ``interrupt_after`` rehearses reclaims."""

    max_wait: int
    interrupt_after: tuple[float, ...] = ()


@dataclass(frozen=True)
class Checkpoints:
    """``checkpoint_s3_uri``, synced from every host's ``checkpoint_local_path`` while the hosts run."""

    s3_uri: str
    local_path: str | None = None


@dataclass(frozen=True)
class HostTreePlan:
    job_name: str
    hosts: tuple[HostPlan, ...]
    artifacts: Artifacts
    config_files: ConfigFiles = field(default_factory=lambda: ConfigFiles((), ""))
    handle: str = ""
    job_dir: Path = Path()
    code: Mapping[str, Any] = field(default_factory=dict)  # source, dependencies, snapshot (and docker's mount)
    backend: str = "process"  # or "container"
    process: Process | None = None  # local: every host's runtime
    image: str = ""  # docker
    network: tuple[str, ...] = ()  # docker: the ``docker network create`` argv
    ranks: Ranks | None = None  # local: how many; docker: how many spares a standby starts (warm_restart)
    inputs: Mapping[str, Any] = field(default_factory=dict)  # local: where each channel comes from
    max_run: int = DEFAULT_MAX_RUN
    grace: float = STOP_GRACE_PERIOD.default  # seconds between SIGTERM and SIGKILL
    retry: RetryPolicy = RetryPolicy()
    spot: Spot | None = None
    checkpoints: Checkpoints | None = None
    keep_job_dir: bool = True
    keep_containers: bool = False
    docker_cli: str = "docker"
    experiment_config: Mapping[str, str] = field(default_factory=dict)

    def host(self, name: str) -> HostPlan:
        return next(item for item in self.hosts if item.host == name)

    def environment(self, host: str) -> dict[str, str]:
        """A local host's runtime environment: the shared one and its own tree."""
        shared = self.process.environment if self.process else {}
        return {contract.BASE_DIR_ENV: str(self.host(host).opt_ml), **shared}

    # --- job.json ---------------------------------------------------------------------------------

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> HostTreePlan:
        """The plan of a ``job.json`` record; one from before this schema is refused with what to do."""
        if "plan" not in record and "request" in record:
            raise SpecError(SpecIssue(
                "job",
                f"{record.get('handle', 'this job')} was written by an older smddp-sdk, whose job.json this version does not read",
                f"use the version that started it, or remove its directory by hand: rm -rf {(record.get('request') or {}).get('job_dir', '<its job directory>')}",
            ))
        return cls.from_json(record["plan"])

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostTreePlan:
        spot, saved = data.get("spot"), data.get("checkpoints")
        ranks = data.get("ranks")
        return cls(
            job_name=str(data.get("job_name", "")),
            hosts=tuple(HostPlan.from_json(item) for item in data.get("hosts", ())),
            artifacts=Artifacts.from_json(data.get("artifacts") or {}),
            config_files=ConfigFiles.from_json(data.get("config_files") or {}),
            handle=str(data.get("handle", "")),
            job_dir=Path(data.get("job_dir", "")),
            code=dict(data.get("code") or {}),
            backend=str(data.get("backend", "process")),
            process=Process.from_json(data["process"]) if data.get("process") else None,
            image=str(data.get("image", "")),
            network=tuple(data.get("network", ())),
            ranks=Ranks(ranks["launcher"], _count(ranks["processes_per_host"]), _count(ranks["world_size"])) if ranks else None,
            inputs=dict(data.get("inputs") or {}),
            max_run=int(data.get("max_run") or DEFAULT_MAX_RUN),
            grace=float(data.get("stop_grace_period", STOP_GRACE_PERIOD.default)),
            retry=RetryPolicy.from_json(data.get("retry")),
            spot=Spot(int(spot["max_wait"]), tuple(float(t) for t in spot.get("interrupt_after", ()))) if spot else None,
            checkpoints=Checkpoints(saved["s3_uri"], saved.get("local_path")) if saved else None,
            keep_job_dir=bool(data.get("keep_job_dir", True)),
            keep_containers=bool(data.get("keep_containers", False)),
            docker_cli=str(data.get("docker_cli") or "docker"),
            experiment_config=dict(data.get("experiment_config") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        """The plan as ``job.json`` keeps it and the dry run prints it (every host)."""
        return {
            "job_name": self.job_name,
            "handle": self.handle,
            "job_dir": str(self.job_dir),
            "code": dict(self.code),
            **({"image": self.image, "network": list(self.network)} if self.backend == "container" else {}),
            "hosts": [item.to_json() for item in self.hosts],
            "config_files": self.config_files.to_json(),
            **({"process": self.process.to_json()} if self.process else {}),
            **({"ranks": self.ranks.to_json()} if self.ranks else {}),
            **({"inputs": dict(self.inputs)} if self.process else {}),
            "artifacts": self.artifacts.to_json(),
            "backend": self.backend,
            "max_run": self.max_run,
            "stop_grace_period": self.grace,
            "retry": self.retry.to_json(),
            "spot": {"max_wait": self.spot.max_wait, "interrupt_after": list(self.spot.interrupt_after)} if self.spot else None,
            "checkpoints": {"s3_uri": self.checkpoints.s3_uri, "local_path": self.checkpoints.local_path} if self.checkpoints else None,
            "keep_job_dir": self.keep_job_dir,
            **({"keep_containers": self.keep_containers, "docker_cli": self.docker_cli} if self.backend == "container" else {}),
            **({"experiment_config": dict(self.experiment_config)} if self.experiment_config else {}),
        }

    def shown(self) -> dict[str, Any]:
        """What the dry run prints: the whole plan up to ``SHOWN_HOSTS`` hosts; beyond, the host lists cut to
        their first and last hosts with a count between, and long values cut (``job.json`` keeps them whole)."""
        whole = self.to_json()
        if len(self.hosts) <= SHOWN_HOSTS:
            return whole
        whole["hosts"] = _cut(whole["hosts"])
        whole["config_files"]["hosts"] = _cut(whole["config_files"]["hosts"])
        if self.process is not None:
            whole["process"]["environment"] = {key: _short(value) for key, value in self.process.environment.items()}
        return whole


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _cut(items: list[Any]) -> list[Any]:
    return [*items[:2], f"... {len(items) - 3} more hosts like these ...", items[-1]]


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN_TEXT else f"{text[:_SHOWN_TEXT]}... ({len(text)} characters)"
