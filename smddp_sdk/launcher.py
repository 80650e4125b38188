"""Watching a job from the caller's side, shared by the estimator and ``smddp-launch``.

- ``follow(scheduler, handle, ...)`` streams the job's log lines with ``[algo-2/rank3]:`` prefixes while it
  runs and returns its final ``JobStatus``;
- ``failure_summary(status)`` renders a failed job in the torchrun style, root cause last;
- ``raise_for_status(status)`` turns a failed or cancelled job into a ``JobFailedError``;
- ``schedule(scheduler, dryrun, attached=...)`` starts a job, tied to the calling process when attached.

These names are stable: the CLI builds on them.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TextIO

from smddp_sdk import job_index
from smddp_sdk.errors import JobFailedError, SmddpError, UnavailableError
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs.failure import BORDER, render_summary
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus, LogLine

_HOST_COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")  # cyan, yellow, magenta, green, blue, ...
_RESET = "\033[0m"


def schedule(scheduler: Scheduler, dryrun: DryRun, *, attached: bool) -> JobHandle:
    """Start the job. ``attached`` jobs end with the calling process on schedulers that can do that
    (the local one: ``owner_pid``); remote jobs always outlive their caller."""
    handle = scheduler.schedule(dryrun, owner_pid=os.getpid() if attached else None)
    _index(scheduler, dryrun, handle)
    return handle


def _index(scheduler: Scheduler, dryrun: DryRun, handle: JobHandle) -> None:
    """Remember the job by name (``smddp-launch status <name>``); a failure to write only warns."""
    options = {key: getattr(scheduler, key, None) for key in ("job_root", "profile")}
    try:
        job_index.record(
            handle, name=handle.job_id.rsplit("/", 1)[-1], options=job_index.plain_options(options), metric_definitions=dryrun.spec.metric_definitions, entry_point=dryrun.spec.entry_point
        )
    except OSError as err:
        print(f"smddp: warning: could not add {handle} to the job index ({err}); use its handle to find it", file=sys.stderr)


def use_colour(out: IO[str] | None, color: bool | None = None) -> bool:
    """Colour only when asked for or when ``out`` is a terminal, and never when NO_COLOR is set."""
    if os.environ.get("NO_COLOR"):
        return False
    if color is not None:
        return color
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def format_line(line: LogLine, *, colour: bool = False) -> str:
    """``[algo-2/rank3]: text``; with colour the prefix takes its host's colour. A progress bar's ``\r``
    redraws each start with the prefix again, so the terminal never shows one without it."""
    prefix = line.prefix
    if colour:
        prefix = f"\033[{_host_colour(line.host)}m{prefix}{_RESET}"
    return f"{prefix} " + line.text.replace("\r", f"\r{prefix} ")


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
    before_first_line: Callable[[], None] | None = None,
) -> JobStatus:
    """Print the job's log lines as they arrive until it ends; return its final status.

    ``hosts``/``ranks`` filter what is printed (the per-rank log files always hold everything).
    Colour follows ``use_colour``. ``before_first_line`` runs once, before the first line is printed
    (a start-up progress line is cleared there). KeyboardInterrupt propagates: the caller decides
    whether that cancels the job (local) or detaches from it (SageMaker).
    """
    out = sys.stdout if out is None else out
    colour = use_colour(out, color)
    for line in follow_lines(scheduler, handle, hosts=hosts, ranks=ranks):
        if before_first_line is not None:
            before_first_line()
            before_first_line = None
        out.write(format_line(line, colour=colour) + "\n")
        out.flush()
    return scheduler.wait(handle, poll=0.2)


def follow_lines(
    scheduler: Scheduler, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, skip: int = 0, retries: int = 5, pause: float = 1.0
) -> Iterator[LogLine]:
    """The job's lines until it ends, reconnecting when the stream stops early or breaks (a docker logs
    process killed, a network error): each reconnect skips the lines already yielded. ``skip`` lines
    at the start are not yielded (the caller printed them already)."""
    seen, failures = skip, 0
    while True:
        count = 0
        try:
            for line in scheduler.logs(handle, hosts=hosts, ranks=ranks, follow=True):
                count += 1
                if count > seen:
                    seen += 1
                    failures = 0
                    yield line
        except (OSError, SmddpError) as err:
            failures += 1
            if failures > retries:
                raise
            print(f"smddp: log stream of {handle} broke ({err}); reconnecting", file=sys.stderr, flush=True)
        if scheduler.status(handle).state.is_terminal:
            if count < seen or failures:  # the ended job's last lines may have come after the break
                yield from itertools.islice(scheduler.logs(handle, hosts=hosts, ranks=ranks, follow=False), seen, None)
            return
        failures += 1 if count <= seen else 0
        if failures > retries:
            return
        time.sleep(pause)


def failure_summary(status: JobStatus) -> str:
    """A failed job in the torchrun style (``specs.failure.render_summary``): other failures first, the
    root cause last, then where the logs are."""
    title = f"{status.handle.job_id} {status.state.value}"
    if status.failure is None:
        return "\n".join([BORDER, title, f"  {status.message or 'no failure was recorded'}", BORDER, *_log_hints(status)])
    return render_summary(status.failure, status.other_failures, title=title, hints=_log_hints(status))


def _log_hints(status: JobStatus) -> list[str]:
    hints = []
    failure = status.failure
    if failure is not None and failure.error_file:
        hints.append(f"Error file: {failure.error_file}")
    if failure is not None and failure.log_file:
        hints.append(f"Rank log: {failure.log_file}")
    if status.model_data:  # a failed job's archives hold what it wrote, as SageMaker uploads them
        hints.append(f"Archives: {status.model_data}, {status.output_data or 'no output.tar.gz'}")
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
    raise JobFailedError(f"job {status.handle} failed: {where} exited with code {failure.exit_code}: {failure.error}", rank_exit_code=failure.exit_code, failure=failure)


def end_summary(status: JobStatus, duration: float | None = None) -> list[str]:
    """How a followed job ended: state and duration, where the model went, and the commands to look again."""
    took = f" in {format_duration(duration)}" if duration is not None else ""
    lines = [f"{status.handle} {status.state.value}{took}"]
    if status.model_data:
        lines.append(f"  model:   {status.model_data}")
    name = status.handle.job_id.rsplit("/", 1)[-1]
    lines += [f"  status:  smddp-launch status {name}", f"  logs:    smddp-launch logs {name}", f"  metrics: smddp-launch metrics {name}"]
    return lines


def format_duration(seconds: float) -> str:
    """``42.0 s``, ``3 min 05 s``, ``2 h 01 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


# Optional packages and the command that installs each (a missing one is exit 3, never a traceback).
INSTALL_COMMANDS = {
    "boto3": "pip install 'smddp-sdk[aws]'",
    "botocore": "pip install 'smddp-sdk[aws]'",
    "s3transfer": "pip install 'smddp-sdk[aws]'",
    "pandas": "pip install pandas",
    "matplotlib": "pip install matplotlib",
}


def missing_package(err: ModuleNotFoundError) -> UnavailableError | None:
    """The UnavailableError for a missing optional package (None when ``err`` is about something else)."""
    top = (err.name or "").split(".")[0]
    if top not in INSTALL_COMMANDS:
        return None
    return UnavailableError(f"this needs the Python package {top!r}, which is not installed: {INSTALL_COMMANDS[top]}")
