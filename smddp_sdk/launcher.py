"""Watching a job from the caller's side, shared by the estimator and ``smddp-launch``.

- ``follow(scheduler, handle, ...)`` streams the job's log lines with ``[algo-2/rank3]:`` prefixes while it
  runs and returns its final ``JobStatus``;
- ``failure_summary(status)`` renders a failed job in the torchrun style, root cause last;
- ``raise_for_status(status)`` turns a failed or cancelled job into a ``JobFailedError``;
- ``schedule(scheduler, dryrun, attached=...)`` starts a job, tied to the calling process when attached.

These names are stable: the CLI builds on them.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from smddp_sdk.errors import JobFailedError
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs.failure import FailureRecord, render_summary
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus, LogLine

_RULE_WIDTH = 60
_HOST_COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")  # cyan, yellow, magenta, green, blue, ...
_RESET = "\033[0m"


def schedule(scheduler: Scheduler, dryrun: DryRun, *, attached: bool) -> JobHandle:
    """Start the job. ``attached`` jobs end with the calling process on schedulers that can do that
    (the local one: ``owner_pid``); remote jobs always outlive their caller."""
    if attached and "owner_pid" in inspect.signature(scheduler.schedule).parameters:
        return scheduler.schedule(dryrun, owner_pid=os.getpid())  # type: ignore[call-arg]
    return scheduler.schedule(dryrun)


def use_colour(out: TextIO, color: bool | None = None) -> bool:
    """Colour only when asked for or when ``out`` is a terminal, and never when NO_COLOR is set."""
    if os.environ.get("NO_COLOR"):
        return False
    if color is not None:
        return color
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def format_line(line: LogLine, *, colour: bool = False) -> str:
    """``[algo-2/rank3]: text``; with colour the prefix takes its host's colour."""
    prefix = line.prefix
    if colour:
        prefix = f"\033[{_host_colour(line.host)}m{prefix}{_RESET}"
    return f"{prefix} {line.text}"


def _host_colour(host: str) -> str:
    digits = "".join(ch for ch in host if ch.isdigit())
    index = int(digits) - 1 if digits else sum(map(ord, host))
    return _HOST_COLOURS[index % len(_HOST_COLOURS)]


def follow(
    scheduler: Scheduler,
    handle: JobHandle,
    *,
    out: TextIO | None = None,
    hosts: Sequence[str] | None = None,
    ranks: Sequence[int] | None = None,
    color: bool | None = None,
) -> JobStatus:
    """Print the job's log lines as they arrive until it ends; return its final status.

    ``hosts``/``ranks`` filter what is printed (the per-rank log files always hold everything).
    Colour follows ``use_colour``. KeyboardInterrupt propagates: the caller decides whether that
    cancels the job (local) or detaches from it (SageMaker).
    """
    out = sys.stdout if out is None else out
    colour = use_colour(out, color)
    for line in scheduler.logs(handle, hosts=hosts, ranks=ranks, follow=True):
        out.write(format_line(line, colour=colour) + "\n")
        out.flush()
    return scheduler.wait(handle, poll=0.2)


def failure_summary(status: JobStatus) -> str:
    """A failed job in the torchrun style (``specs.failure.render_summary``): other failures first, the
    root cause last, then where the logs are."""
    others = [FailureRecord.from_json(other) for other in status.details.get("other_failures") or [] if isinstance(other, dict)]
    title = f"{status.handle.job_id} {status.state.value}"
    if status.failure is None:
        rule = "=" * _RULE_WIDTH
        return "\n".join([rule, title, f"  {status.message or 'no failure was recorded'}", rule, *_log_hints(status)])
    return render_summary(status.failure, others, title=title, hints=_log_hints(status))


def _log_hints(status: JobStatus) -> list[str]:
    hints = []
    if status.details.get("error_file"):
        hints.append(f"Error file: {status.details['error_file']}")
    if status.details.get("rank_log"):
        hints.append(f"Rank log: {status.details['rank_log']}")
    failure = status.failure
    rank = f" --rank {failure.rank}" if failure is not None and failure.rank is not None else ""
    hints.append(f"Logs: smddp-launch logs {status.handle}{rank}")
    return hints


def raise_for_status(status: JobStatus) -> JobStatus:
    """Return a succeeded job's status; raise ``JobFailedError`` for any other end.

    The error names the root-cause host, rank and exit code; its ``exit_code`` is 1 (the launcher's
    code for a failed job) and ``rank_exit_code`` is the rank's own.
    """
    if status.state is JobState.SUCCEEDED:
        return status
    failure = status.failure
    if status.state is JobState.CANCELLED:
        raise JobFailedError(f"job {status.handle} was cancelled: {status.message}", failure=failure)
    if failure is None:
        raise JobFailedError(f"job {status.handle} ended {status.state.value}: {status.message or 'no reason was recorded'}")
    where = f"rank {failure.rank} on host {failure.host}" if failure.rank is not None else f"host {failure.host} (its runtime)"
    raise JobFailedError(
        f"job {status.handle} failed: {where} exited with code {failure.exit_code}: {failure.error}",
        rank_exit_code=failure.exit_code,
        failure=failure,
    )
