"""The one interface every place a job can run implements (torchx's shape).

``dryrun`` and ``schedule`` are templates, the same for every scheduler: ``dryrun`` resolves the spec
against the scheduler's options, validates it once and plans; ``schedule`` checks that the plan was
made for this scheduler, warns about what the plan notes, and runs it. A scheduler implements the
steps (``resolve``, ``validate``, ``plan``, ``run``), declares its options (``options``) and what it
can do (``capabilities``).
"""

from __future__ import annotations

import abc
import functools
import itertools
import json
import textwrap
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from smddp_sdk.errors import SmddpError, SpecError, SpecIssue
from smddp_sdk.schedulers.options import SchedulerOptions
from smddp_sdk.specs.archives import code_ignore, code_tree_issues
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus, LogLine

if TYPE_CHECKING:  # the optional operations' types, defined where the jobs that have them live
    from smddp_sdk.schedulers.hosttree.attempts import Interruption
    from smddp_sdk.schedulers.stacks import RankStack

RECORD_FILE = "job.json"  # every job directory's record, written once when the job is submitted


Request = TypeVar("Request")


@runtime_checkable
class Shown(Protocol):
    """A typed request that says how the dry run shows it (e.g. summarised when it is large)."""

    def shown(self) -> Any: ...


@dataclass(frozen=True)
class DryRun(Generic[Request]):
    """What ``schedule`` would do, computed without side effects: the exact request and where it goes.

    The request is the scheduler's own type (torchx's ``AppDryRunInfo[Request]``): a host-tree job's
    ``HostTreePlan``, a Slurm job's ``BatchPlan``, SageMaker's CreateTrainingJob mapping; ``schedule`` runs
    that very value, and the job's record keeps it.
    """

    scheduler: str
    spec: JobSpec
    job_name: str
    request: Request
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        """The request as indented JSON, the form ``--dryrun`` prints."""
        shown = self.request.shown() if isinstance(self.request, Shown) else self.request
        return json.dumps(shown, indent=2, sort_keys=False, default=str)


@dataclass(frozen=True)
class Listed:
    """A job a listing may show: its handle, when it was submitted (the listing's order) and how to describe
    it (called only for the rows shown, as describing a job may cost a call to its scheduler)."""

    handle: JobHandle
    submitted: float
    describe: Callable[[], JobStatus]

    @classmethod
    def of(cls, job_status: JobStatus) -> Listed:
        """An entry already described (e.g. from a listing call that returns each job's state)."""
        return cls(job_status.handle, job_status.submitted or 0.0, lambda: job_status)


def newest(listed: Iterable[Listed], limit: int | None, states: Collection[JobState] = ()) -> list[JobStatus]:
    """The first ``limit`` of ``listed`` (newest first) that are in ``states`` (any when empty), described."""
    rows = (item.describe() for item in listed)
    return list(itertools.islice((row for row in rows if not states or row.state in states), limit))


def brief(err: Exception) -> str:
    """An error in the few words a listing row has room for (its first line, without the advice)."""
    if isinstance(err, SpecError):
        return err.issues[0].message
    if isinstance(err, KeyError):
        return f"its record lacks {err} (written by another version?)"
    text = str(err).splitlines()[0] if isinstance(err, SmddpError) else f"{type(err).__name__}: {err}"
    return textwrap.shorten(text, 100, placeholder=" ...")


def broken_record(directory: Path) -> str:
    """What is wrong with a job directory's JSON files (its record and state), or "" when they read well."""
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            return f"{path.name} cannot be read ({err.strerror})"
        except ValueError:
            return f"{path.name} is not valid JSON"
        if not isinstance(data, dict):
            return f"{path.name} is not a JSON object"
    return ""


# The optional operations, each a capability of the same name and a method of ``Scheduler`` that only a
# scheduler declaring it implements; what each does, for the message that refuses it.
OPTIONAL_OPERATIONS = {
    "interrupt": "interrupt a job as a spot reclaim would",
    "stacks": "show the ranks' Python stacks",
    "remove": "remove a finished job's directory",
}


@dataclass(frozen=True)
class Capabilities:
    """What a scheduler can do beyond the interface. The CLI and the estimator ask for a capability, never
    for a name or a type; ``Scheduler.require`` refuses an operation a scheduler lacks, naming both, with
    the scheduler's own advice (``instead``)."""

    bound_to_owner: bool = False  # schedule(owner_pid=...) ends the job when that process goes away
    cancel_on_interrupt: bool = False  # Ctrl-C while following cancels the job (it runs on this machine)
    lists_locally: bool = False  # its listing reads only this machine's files: `list` includes it unasked
    interrupt: bool = False  # Scheduler.interrupt: rehearse a spot reclaim of a running job
    stacks: bool = False  # Scheduler.stacks: every rank's Python stack of a running job
    remove: bool = False  # Scheduler.remove: delete a finished job's directory (`clean`)
    runs_here: bool = False  # its ranks run on this machine (torchrun's --nproc-per-node auto counts its CPUs)
    instead: Mapping[str, str] = field(default_factory=dict)  # operation it lacks -> what to do instead

    def has(self, operation: str) -> bool:
        return bool(getattr(self, operation))


class Scheduler(abc.ABC):
    """Runs jobs on one target. ``dryrun`` is pure; the rest act on the target."""

    name: ClassVar[str]
    options: ClassVar[SchedulerOptions] = SchedulerOptions()
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The common rule, checked when a scheduler is defined: it implements an optional operation exactly
        when it declares the capability (a declaration cannot promise what is not there, nor hide it)."""
        super().__init_subclass__(**kwargs)
        for operation in OPTIONAL_OPERATIONS:
            implemented = getattr(cls, operation) is not getattr(Scheduler, operation)
            if implemented != cls.capabilities.has(operation):
                state = "implements" if implemented else "declares"
                raise TypeError(f"{cls.__qualname__} {state} {operation!r} but {'does not declare' if implemented else 'does not implement'} it: "
                                f"set capabilities = Capabilities({operation}=...) to match the method")

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
    def logs(self, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, follow: bool = False) -> Iterator[LogLine]:
        """The job's output lines; with ``follow`` it keeps yielding until the job ends."""

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Stop the job. Cancelling a finished or already cancelled job does nothing."""

    # --- optional operations (``OPTIONAL_OPERATIONS``: each only where ``capabilities`` declares it) ------

    def require(self, operation: str) -> None:
        """Refuse ``operation`` unless this scheduler declares it: the error names both and what to do instead."""
        if not self.capabilities.has(operation):
            raise SpecError(SpecIssue("job", f"the {self.name} scheduler cannot {OPTIONAL_OPERATIONS[operation]}",
                                      self.capabilities.instead.get(operation, "")))

    def interrupt(self, handle: JobHandle, interruption: Interruption) -> None:
        """Rehearse a managed spot interruption of a running spot job (``capabilities.interrupt``)."""
        self.require("interrupt")

    def stacks(self, handle: JobHandle, *, timeout: float) -> list[RankStack]:
        """Every rank's Python stack, asked for now, rank by rank (``capabilities.stacks``)."""
        self.require("stacks")
        return []

    def remove(self, handle: JobHandle) -> None:
        """Delete a finished job's directory; a running job is refused (``capabilities.remove``)."""
        self.require("remove")

    def job_path(self, handle: JobHandle) -> Path | None:
        """The job's directory on this machine, or None where the target alone keeps the job."""
        return None

    def leftovers(self, removed: Collection[str]) -> dict[str, list[str]]:
        """What this scheduler's jobs left outside their directories that no job needs any more (those gone,
        or named in ``removed``, whose directories `clean` is removing), by kind; nothing by default."""
        return {}

    def remove_leftovers(self, found: Mapping[str, list[str]]) -> None:
        """Remove what ``leftovers`` found."""

    # --- listing ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def list_jobs(self, limit: int | None = None, states: Collection[JobState] = ()) -> list[JobStatus]:
        """This target's jobs, newest first: at most ``limit``, only those in ``states`` when given."""

    def listed(self, limit: int | None = None, states: Collection[JobState] = ()) -> list[Listed]:
        """What a listing across schedulers merges: this target's newest jobs (enough for ``limit`` of those
        in ``states``), each described only when shown. By default ``list_jobs``' rows, described already."""
        return [Listed.of(item) for item in self.list_jobs(limit, states)]

    def listed_status(self, handle: JobHandle, submitted: float | None = None, directory: Path | None = None) -> JobStatus:
        """``status`` for a listing: a job that cannot be described is one UNKNOWN row that says why in a few
        words, never a traceback, and the listing goes on."""
        try:
            job_status = self.status(handle)
        except Exception as err:  # noqa: BLE001 - a job's unreadable record costs its row, not the listing
            reason = (broken_record(directory) if directory else "") or self.undescribed(err)
            job_status = JobStatus(handle, JobState.UNKNOWN, reason, undescribed=True)
        return job_status.with_submitted(submitted)

    def undescribed(self, err: Exception) -> str:
        """Why ``status`` failed, in the few words a listing row has room for."""
        return brief(err)

    def wait(self, handle: JobHandle, *, poll: float = 1.0, timeout: float | None = None) -> JobStatus:
        """Poll ``status`` until the job reaches a terminal state (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(handle)
            if status.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                return status
            self._pause(poll)

    def _pause(self, poll: float) -> None:
        time.sleep(poll)


class JobRootScheduler(Scheduler):
    """A scheduler that keeps every job's directory, holding its ``job.json``, under ``job_root`` (host-tree
    and slurm jobs): the job's name is its directory's, and the job root is all a listing reads."""

    job_root: Path

    def _local_issues(self, spec: JobSpec) -> list[SpecIssue]:
        """What a job whose code and archives stay on this machine's file system cannot have: S3, a name taken."""
        issues = []
        if spec.source_dir and spec.source_dir.startswith("s3://"):
            issues.append(SpecIssue("source_dir", f"{self.name} jobs run code from this machine, not from S3", "give a local directory"))
        if spec.output_path and spec.output_path.startswith("s3://"):
            issues.append(SpecIssue("output_path", f"{self.name} jobs write their archives on this machine's file system", "use a local path or file:// URI, or leave it unset"))
        if spec.job_name and (self.job_root / spec.job_name).exists():
            issues.append(self._name_taken(spec.job_name))
        return [*issues, *code_tree_issues(spec.code_trees, code_ignore(self.job_root))]  # what the code's snapshot would refuse

    def _name_taken(self, job_name: str) -> SpecIssue:
        return SpecIssue("job_name", f"a {self.name} job named {job_name!r} already exists in {self.job_root}", "choose another job_name, or remove that job's directory")

    def job_path(self, handle: JobHandle) -> Path:
        """The job's directory (whether or not it exists)."""
        return self.job_root / handle.job_id

    def _check_handle(self, handle: JobHandle) -> None:
        if handle.scheduler != self.name:
            raise SpecError(SpecIssue("handle", f"{handle} is not a {self.name} job", f"use get_scheduler({handle.scheduler!r})"))

    def list_jobs(self, limit: int | None = None, states: Collection[JobState] = ()) -> list[JobStatus]:
        return newest(self.listed(), limit, states)

    def listed(self, limit: int | None = None, states: Collection[JobState] = ()) -> list[Listed]:
        """The job directories under the job root, newest record first (all of them: each is described only
        when shown, so ``limit`` and ``states`` are the caller's to apply)."""
        found = []
        for path in self.job_root.iterdir() if self.job_root.is_dir() else ():
            try:
                submitted = (path / RECORD_FILE).stat().st_mtime
            except OSError:
                continue  # not a job directory, or removed meanwhile
            handle = JobHandle(self.name, path.name)
            found.append(Listed(handle, submitted, functools.partial(self.listed_status, handle, submitted, path)))
        return sorted(found, key=lambda item: item.submitted, reverse=True)
