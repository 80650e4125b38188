"""The one interface every place a job can run implements (torchx's shape)."""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from smddp_sdk.errors import SpecIssue
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobStatus, LogLine


@dataclass(frozen=True)
class DryRun:
    """What ``schedule`` would do, computed without side effects: the exact request and where it goes."""

    scheduler: str
    spec: JobSpec
    job_name: str
    request: Any
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        """The request as indented JSON, the form ``--dryrun`` prints."""
        return json.dumps(self.request, indent=2, sort_keys=False, default=str)


class Scheduler(abc.ABC):
    """Runs jobs on one target. ``dryrun`` is pure; the rest act on the target."""

    name: ClassVar[str]

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        """Problems this target has with an otherwise valid spec (e.g. a feature it cannot run)."""
        return []

    @abc.abstractmethod
    def dryrun(self, spec: JobSpec) -> DryRun:
        """The exact request for ``spec``; touches no network, engine, bucket or file."""

    @abc.abstractmethod
    def schedule(self, dryrun: DryRun) -> JobHandle:
        """Start the job a dryrun describes and return its handle without waiting."""

    @abc.abstractmethod
    def status(self, handle: JobHandle) -> JobStatus: ...

    @abc.abstractmethod
    def logs(
        self,
        handle: JobHandle,
        *,
        hosts: Sequence[str] | None = None,
        ranks: Sequence[int] | None = None,
        follow: bool = False,
    ) -> Iterator[LogLine]:
        """The job's output lines; with ``follow`` it keeps yielding until the job ends."""

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Stop the job. Cancelling a finished or already cancelled job does nothing."""

    def submit(self, spec: JobSpec) -> JobHandle:
        return self.schedule(self.dryrun(spec))

    def wait(self, handle: JobHandle, *, poll: float = 1.0, timeout: float | None = None) -> JobStatus:
        """Poll ``status`` until the job reaches a terminal state (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(handle)
            if status.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                return status
            time.sleep(poll)
