"""What every scheduler reports: job handles, states, failures and log lines."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.specs.contract import LogLine as LogLine  # what every scheduler's ``logs`` yields, parsed there
from smddp_sdk.specs.failure import FailureRecord
from smddp_sdk.specs.goodput import Goodput

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
class Transition:
    """One of SageMaker's SecondaryStatusTransitions; local and docker jobs record theirs alike."""

    status: str
    start: float | None = None
    end: float | None = None
    message: str = ""


@dataclass(frozen=True)
class Attempt:
    """An ended attempt of a job that was retried, requeued or interrupted: how and when it ended."""

    attempt: int
    outcome: str  # the secondary status it ended in: Restarting, Interrupted, Completed, Failed, Stopped
    reason: str = ""
    started: float | None = None
    ended: float | None = None


@dataclass(frozen=True)
class JobStatus:
    """What every scheduler reports of a job, typed; ``details`` keeps what only one scheduler has (Slurm's
    own state and nodes, SageMaker's statuses), as that scheduler names it."""

    handle: JobHandle
    state: JobState
    message: str = ""
    failure: FailureRecord | None = None  # the root cause of a failed job
    hosts: tuple[HostStatus, ...] = ()
    model_data: str | None = None
    output_data: str | None = None
    archive_skipped: tuple[str, ...] = ()  # files left out of the archives, one line each
    other_failures: tuple[FailureRecord, ...] = ()  # every failure but the root cause, oldest first
    submitted: float | None = None  # seconds since the epoch, as are started and ended
    started: float | None = None
    ended: float | None = None
    attempt: int = 1  # the attempt running or last run: 1 + retries, requeues and interruptions
    attempts: tuple[Attempt, ...] = ()  # the ended ones, oldest first, where the scheduler records them
    retries_left: int | None = None  # of the job's RetryPolicy, where the scheduler counts them (local, docker)
    interruptions: int = 0
    transitions: tuple[Transition, ...] = ()
    training_seconds: int | None = None  # per instance, as SageMaker bills
    billable_seconds: int | None = None
    goodput: Goodput | None = None  # productive training over wall time, and each recovery's phases (specs.goodput)
    scheduler_job_id: str | None = None  # the target's own id: Slurm's job id, SageMaker's job ARN
    job_dir: str | None = None  # the job's directory on this machine (local, docker, slurm)
    logs: str | None = None  # where its logs are kept: a file or a folder
    undescribed: bool = False  # the scheduler could not describe it: ``message`` says why
    details: dict[str, Any] = field(default_factory=dict)

    def with_submitted(self, submitted: float | None) -> JobStatus:
        """This status with the submission time a listing knows, where the scheduler did not say."""
        return self if self.submitted is not None or submitted is None else dataclasses.replace(self, submitted=submitted)


# SageMaker's last secondary status of an ended job, by its state; the limits end a job with their own name.
FINAL_STATUS = {JobState.SUCCEEDED: "Completed", JobState.FAILED: "Failed", JobState.CANCELLED: "Stopped"}
_FINAL_STATUSES = frozenset({*FINAL_STATUS.values(), "MaxRuntimeExceeded", "MaxWaitTimeExceeded"})
_LIVE = frozenset({JobState.PENDING, JobState.STARTING, JobState.RUNNING})


def settled(status: JobStatus) -> JobStatus:
    """``status`` as an ended job reads, so that it never contradicts itself: no host still live and the
    transitions closed by the job's end. Whoever ended a job without its supervisor (it died, or a cancel
    took over) knows the job's end, not each host's or the timeline's."""
    if not status.state.is_terminal:
        return status
    hosts = tuple(dataclasses.replace(host, state=status.state) if host.state in _LIVE else host for host in status.hosts)
    transitions = status.transitions
    if transitions and transitions[-1].status not in _FINAL_STATUSES:
        last, end = transitions[-1], status.ended
        transitions = (*transitions[:-1], dataclasses.replace(last, end=last.end or end), Transition(FINAL_STATUS[status.state], end, end, status.message))
    return dataclasses.replace(status, hosts=hosts, transitions=transitions)


def transitions_of(items: Iterable[Mapping[str, Any]]) -> tuple[Transition, ...]:
    """Transitions from their JSON form (state.json, SageMaker's description turned into the same keys)."""
    return tuple(Transition(str(item.get("status", "")), item.get("start"), item.get("end"), item.get("message") or "") for item in items)


def attempts_of(items: Iterable[Mapping[str, Any]]) -> tuple[Attempt, ...]:
    """Ended attempts from their JSON form (state.json)."""
    return tuple(Attempt(int(item.get("attempt", 1)), str(item.get("outcome", "")), item.get("reason") or "", item.get("started"), item.get("ended")) for item in items)


def billing_lines(training: int | None, billable: int | None, *, instances: int, spot: bool) -> list[str]:
    """What SageMaker SDK v2 prints when a job ends, from per-instance seconds (TrainingTimeInSeconds and
    BillableTimeInSeconds) times the instance count, with the spot savings."""
    lines = []
    if training is not None:
        lines.append(f"Training seconds: {training * instances}")
    if billable is not None:
        lines.append(f"Billable seconds: {billable * instances}")
        if spot and training:
            # Rounded per-instance seconds can put billable a second above training: no saving, never a negative one.
            lines.append(f"Managed Spot Training savings: {max(0.0, 1 - billable / training) * 100:.1f}%")
    return lines
