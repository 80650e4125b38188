"""The one interface every place a job can run implements (torchx's shape).

``dryrun`` and ``schedule`` are templates, the same for every scheduler: ``dryrun`` resolves the spec
against the scheduler's options, validates it once and plans; ``schedule`` checks that the plan was
made for this scheduler, warns about what the plan notes, and runs it. A scheduler implements the
steps (``resolve``, ``validate``, ``plan``, ``run``), declares its options (``options``) and what it
can do (``capabilities``).
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from smddp_sdk.errors import SmddpError, SpecError, SpecIssue
from smddp_sdk.schedulers.options import SchedulerOptions
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus, LogLine


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


@dataclass(frozen=True)
class Capabilities:
    """What a scheduler can do beyond the interface."""

    bound_to_owner: bool = False  # schedule(owner_pid=...) ends the job when that process goes away
    cancel_on_interrupt: bool = False  # Ctrl-C while following cancels the job (it runs on this machine)


class Scheduler(abc.ABC):
    """Runs jobs on one target. ``dryrun`` is pure; the rest act on the target."""

    name: ClassVar[str]
    options: ClassVar[SchedulerOptions] = SchedulerOptions()
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, **options: Any) -> None:
        """Every option checked at once against its declaration; each becomes an attribute."""
        for key, value in self.options.resolve(options).items():
            setattr(self, key, value)

    # --- the templates ----------------------------------------------------------------------------

    def dryrun(self, spec: JobSpec) -> DryRun:
        """The exact request for ``spec``, validated; touches no network, engine, bucket or file."""
        spec = self.resolve(spec)
        issues = self.validate(spec)
        if issues:
            raise SpecError(issues)
        return self.plan(spec)

    def schedule(self, dryrun: DryRun, *, owner_pid: int | None = None) -> JobHandle:
        """Start the job a dryrun describes and return its handle without waiting.

        With ``owner_pid`` (``capabilities.bound_to_owner``) the job is cancelled if that process goes
        away before the job ends; without it the job outlives its caller.
        """
        if dryrun.scheduler != self.name:
            raise SpecError(SpecIssue("scheduler", f"this dryrun was made for the {dryrun.scheduler!r} scheduler, not {self.name!r}"))
        self.warn(dryrun)
        return self.run(dryrun, owner_pid=owner_pid if self.capabilities.bound_to_owner else None)

    def submit(self, spec: JobSpec) -> JobHandle:
        return self.schedule(self.dryrun(spec))

    # --- the steps ----------------------------------------------------------------------------------

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec with what this scheduler's options supply filled in (e.g. a default role)."""
        return spec

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        """Problems this target has with an otherwise valid spec (e.g. a feature it cannot run)."""
        return []

    def warn(self, dryrun: DryRun) -> None:
        """Say, as the job starts, what the user should know of its plan (e.g. where a rehearsal differs)."""

    @abc.abstractmethod
    def plan(self, spec: JobSpec) -> DryRun:
        """The request for a resolved, valid spec (pure)."""

    @abc.abstractmethod
    def run(self, dryrun: DryRun, *, owner_pid: int | None) -> JobHandle:
        """Start what ``plan`` made."""

    # --- the job ------------------------------------------------------------------------------------

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

    @abc.abstractmethod
    def list_jobs(self, limit: int | None = None) -> list[JobStatus]:
        """This target's jobs, newest first (at most ``limit``; None: what the target lists at once)."""

    def _list_job_dirs(self, directories: list[Path], limit: int | None) -> list[JobStatus]:
        """Listing rows for job directories (each holding its ``job.json``), newest record first."""
        directories.sort(key=lambda path: (path / "job.json").stat().st_mtime, reverse=True)
        return [self._listed_status(JobHandle(self.name, path.name)) for path in directories[:limit]]

    def _listed_status(self, handle: JobHandle) -> JobStatus:
        """``status`` for a listing: a job whose status cannot be read says why, and the listing goes on."""
        try:
            return self.status(handle)
        except SmddpError as err:
            return JobStatus(handle, JobState.UNKNOWN, str(err).splitlines()[0])

    def wait(self, handle: JobHandle, *, poll: float = 1.0, timeout: float | None = None) -> JobStatus:
        """Poll ``status`` until the job reaches a terminal state (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(handle)
            if status.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                return status
            time.sleep(poll)
