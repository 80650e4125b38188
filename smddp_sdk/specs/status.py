"""What every scheduler reports: job handles, states, failures and log lines."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.specs.contract import LogLine as LogLine  # what every scheduler's ``logs`` yields, parsed there
from smddp_sdk.specs.failure import FailureRecord

SCHEDULER_NAMES = ("local", "docker", "sagemaker", "slurm")


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobHandle:
    """Names a job for later status/logs/cancel calls: ``local://<job>``, ``docker://<job>``,
    ``sagemaker://<region>/<TrainingJobName>``."""

    scheduler: str
    job_id: str

    @classmethod
    def parse(cls, text: str) -> JobHandle:
        scheduler, sep, job_id = text.partition("://")
        if not sep or not job_id:
            raise SpecError(SpecIssue("handle", f"{text!r} is not a job handle", "expected <scheduler>://<job>, e.g. local://pytorch-training-2026-01-01-00-00-00-000"))
        if scheduler not in SCHEDULER_NAMES:
            raise SpecError(SpecIssue("handle", f"unknown scheduler {scheduler!r} in {text!r}", did_you_mean(scheduler, SCHEDULER_NAMES)))
        return cls(scheduler, job_id)

    def __str__(self) -> str:
        return f"{self.scheduler}://{self.job_id}"


@dataclass(frozen=True)
class HostStatus:
    host: str
    state: JobState
    exit_code: int | None = None


@dataclass(frozen=True)
class JobStatus:
    handle: JobHandle
    state: JobState
    message: str = ""
    failure: FailureRecord | None = None  # the root cause of a failed job
    hosts: tuple[HostStatus, ...] = ()
    model_data: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def billing_lines(training: int | None, billable: int | None, *, instances: int, spot: bool) -> list[str]:
    """What SageMaker SDK v2 prints when a job ends, from per-instance seconds (TrainingTimeInSeconds and
    BillableTimeInSeconds) times the instance count, with the spot savings."""
    lines = []
    if training is not None:
        lines.append(f"Training seconds: {training * instances}")
    if billable is not None:
        lines.append(f"Billable seconds: {billable * instances}")
        if spot and training:
            lines.append(f"Managed Spot Training savings: {(1 - billable / training) * 100:.1f}%")
    return lines
