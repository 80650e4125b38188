"""Commands on submitted jobs, named by job name or handle: ``status``, ``logs``, ``cancel``, ``list``, ``clean``."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import itertools
import json
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from smddp_sdk import job_index, launcher
from smddp_sdk.cli.common import console, load_scheduler_class, parse_hosts, parse_ranks, scheduler_named
from smddp_sdk.cli.output import color_enabled, state_text
from smddp_sdk.cli.params import key_value
from smddp_sdk.errors import SmddpError, SpecError, SpecIssue, did_you_mean
from smddp_sdk.schedulers.base import Listed, Scheduler, brief, newest
from smddp_sdk.specs import goodput
from smddp_sdk.specs.status import SCHEDULER_NAMES, JobHandle, JobState, JobStatus, LogLine

JOB_HELP = ("JOB is the job name `run` printed, or its handle: local://<job>, docker://<job> or "
            "sagemaker://<region>/<job>. Names are looked up in this machine's job index.")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def complete_jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Names of the jobs this machine knows (index and local job root); nothing when that fails."""
    try:
        if "://" in incomplete:  # a handle being typed
            names = sorted({entry.handle for entry in job_index.entries()} | {f"local://{name}" for name in job_index.known_names()})
        else:
            names = job_index.known_names()
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the user's shell
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


# Decorators, each making a fresh parameter wherever it is applied.
job_argument = click.argument("job", metavar="JOB", shell_complete=complete_jobs)
scheduler_option = click.option("-o", "--scheduler-option", "options", multiple=True, metavar="KEY=VALUE", callback=key_value,
                                help="A scheduler option; repeatable (the user config's options apply too).")


def job_target(job: str, options: Sequence[tuple[str, str]]) -> tuple[JobHandle, Scheduler, job_index.IndexEntry | None]:
    """The handle of JOB, a scheduler that can reach it (with the job root or profile it was run with) and
    JOB's entry in the job index (None when it has none)."""
    handle, entry = job_index.resolve(job)
    remembered = [(key, value) for key, value in (entry.options.items() if entry else ()) if key not in dict(options)]
    return handle, scheduler_named(handle.scheduler, [*remembered, *options]), entry


@click.command(short_help="Show a job's state.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (for scripts).")
@click.pass_context
def status(ctx: click.Context, job: str, options: list[tuple[str, str]], as_json: bool) -> None:
    """Show the state of JOB, its hosts, where its model went (and any file left out of the archives) and,
    when it failed, the root cause.

    --json prints every field of the status: handle, state, message, failure, other_failures, hosts,
    model_data, output_data, archive_skipped, submitted, started, ended (seconds since the epoch), duration,
    attempt, attempts, retries_left (local and docker jobs), interruptions, transitions, training_seconds,
    billable_seconds, goodput (wall, productive and ratio; per attempt trained, redone and productive seconds;
    per recovery its phases detect, stop, restart, cold_start and restore, its total and the work redone; per host replaced alone
    its marks fault, detected, reformed and training), scheduler_job_id (Slurm's job id, SageMaker's ARN), job_dir, logs, undescribed, and
    details: what only that scheduler reports (Slurm's slurm_state and nodes; SageMaker's TrainingJobStatus
    and SecondaryStatus)."""
    handle, scheduler, _ = job_target(job, options)
    job_status = scheduler.status(handle)
    if as_json:
        click.echo(json.dumps(status_as_dict(job_status), indent=2, default=str))
        return
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    click.echo(render_status(job_status, color), color=color)  # click strips styles off a terminal unless told
    if job_status.state is JobState.FAILED and job_status.failure is not None:
        console(ctx).say(launcher.failure_summary(job_status))


@click.command(short_help="Print a job's logs, or follow them.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends (reconnects if the stream drops).")
@click.option("--rank", "ranks", callback=parse_ranks, metavar="RANKS", help="Only these ranks, e.g. 0,3 or 8-11.")
@click.option("--host", "hosts", callback=parse_hosts, metavar="HOSTS", help="Only these hosts, e.g. algo-2 or 1,2.")
@click.option("-n", "--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines (then new ones with --follow).")
@click.option("--since", metavar="WHEN", help="Only lines since a time ago (30s, 10m, 2h, 1d) or a time (2026-01-31T12:00). Needs timestamped lines.")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines whose text matches this regular expression.")
@click.option("-t", "--timestamps", is_flag=True, help="Show each line's time, where the scheduler recorded one.")
@click.pass_context
def logs(ctx: click.Context, job: str, options: list[tuple[str, str]], follow: bool, ranks: list[int] | None,
         hosts: list[str] | None, tail: int | None, since: str | None, pattern: str | None, timestamps: bool) -> None:
    """Print JOB's logs with [host/rank] prefixes (coloured on a terminal unless NO_COLOR is set)."""
    handle, scheduler, _ = job_target(job, options)
    keep = line_filter(ctx, since, pattern)
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    shown = 0
    for line in select_lines(scheduler, handle, hosts=hosts, ranks=ranks, follow=follow, tail=tail, keep=keep):
        stamp = f"{_clock(line.timestamp)} " if timestamps else ""
        click.echo(stamp + launcher.format_line(line, colour=color), color=color)
        shown += 1
    if shown == 0 and (ranks or hosts):
        _explain_empty_filter(scheduler, handle, hosts, ranks)
    if since and keep.untimed:
        console(ctx).say(f"note: --since left out {keep.untimed} line{'s' if keep.untimed != 1 else ''} that carry no time "
                         "(written before this version kept per-line times); use --tail or --grep instead")


def select_lines(scheduler: Scheduler, handle: JobHandle, *, hosts: list[str] | None, ranks: list[int] | None, follow: bool, tail: int | None, keep: Any) -> Iterator[LogLine]:
    """The lines to print: filtered, the last ``tail`` of what exists, then (with ``follow``) new ones."""
    seen = 0
    if tail is not None or not follow:
        last: deque[LogLine] | list[LogLine] = deque(maxlen=tail) if tail is not None else []
        for line in scheduler.logs(handle, hosts=hosts, ranks=ranks, follow=False):
            seen += 1
            if keep(line):
                last.append(line)
        yield from last
        if not follow:
            return
    for line in launcher.follow_lines(scheduler, handle, hosts=hosts, ranks=ranks, skip=seen):
        if keep(line):
            yield line


def line_filter(ctx: click.Context, since: str | None, pattern: str | None) -> Any:
    """A predicate for --since and --grep (bad values are usage errors, exit 2)."""
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as err:
        raise click.BadParameter(f"{pattern!r} is not a regular expression: {err}", ctx=ctx, param_hint="--grep") from None
    start = parse_since(since) if since else None
    if since and start is None:
        raise click.BadParameter(f"{since!r} is neither a duration (30s, 10m, 2h, 1d) nor a time (2026-01-31T12:00)", ctx=ctx, param_hint="--since")

    def keep(line: LogLine) -> bool:
        if regex is not None and not regex.search(line.text):
            return False
        if start is not None and line.timestamp is None:
            keep.untimed += 1  # type: ignore[attr-defined]
            return False
        return start is None or line.timestamp >= start  # type: ignore[operator]

    keep.untimed = 0  # type: ignore[attr-defined]
    return keep


def parse_since(text: str, now: float | None = None) -> float | None:
    """``10m`` -> ten minutes ago; an ISO time -> that time (local time zone when none is given)."""
    now = time.time() if now is None else now
    match = _DURATION.match(text.strip())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def _clock(timestamp: float | None) -> str:
    if timestamp is None:
        return "-" * 23
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def _explain_empty_filter(scheduler: Scheduler, handle: JobHandle, hosts: list[str] | None, ranks: list[int] | None) -> None:
    """``logs --rank 9`` on a 4-rank job is a mistake: say which hosts and ranks the job has (exit 2)."""
    all_lines = list(scheduler.logs(handle, follow=False))
    if not all_lines:
        return  # nothing written yet: an empty answer is the truth
    known_hosts = sorted({line.host for line in all_lines})
    known_ranks = sorted({line.rank for line in all_lines if line.rank is not None})
    wanted = ", ".join(part for part in (f"hosts {','.join(hosts)}" if hosts else "", f"ranks {','.join(map(str, ranks))}" if ranks else "") if part)
    raise SpecError(SpecIssue("logs", f"{handle} has no lines from {wanted}", f"its lines come from hosts {', '.join(known_hosts)} and ranks {_ranges(known_ranks) or 'none'}"))


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``: runs of consecutive numbers share their difference to their index."""
    runs = ([number for _, number in run] for _, run in itertools.groupby(enumerate(numbers), lambda item: item[1] - item[0]))
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


@click.command(short_help="Stop a job.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.pass_context
def cancel(ctx: click.Context, job: str, options: list[tuple[str, str]]) -> None:
    """Stop JOB: every host and rank (SIGTERM, then SIGKILL after the grace period); it ends CANCELLED.
    Cancelling a job that already ended changes nothing and says so."""
    handle, scheduler, _ = job_target(job, options)
    before = scheduler.status(handle)
    if before.state.is_terminal:
        console(ctx).say(f"{handle} already ended ({before.state.value}); nothing to cancel")
        return
    scheduler.cancel(handle)
    console(ctx).say(f"Cancel requested: {handle}")


def comma_choices(choices: Sequence[str], *, upper: bool = False) -> Any:
    """A callback for a repeatable option that also takes comma lists (``--state failed,cancelled``), each item
    one of ``choices`` (case-insensitive); a bad one is a usage error (exit 2) with a did-you-mean."""

    def parse(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> tuple[str, ...]:
        picked = []
        for item in (part.strip() for value in values for part in value.split(",")):
            name = item.upper() if upper else item.lower()
            if name not in choices:
                hint = did_you_mean(name, choices) or f"one of {', '.join(choices)}"
                raise click.BadParameter(f"{item!r} is not a {param.name.rstrip('s')} ({hint})", ctx=ctx, param=param)  # type: ignore[union-attr]
            picked.append(name)
        return tuple(dict.fromkeys(picked))

    return parse


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which jobs ``list`` and ``clean`` see, safe on a machine shared by several users: by default only the
    caller's own (the owner of the job's directory; a job without one here is in the caller's own index),
    and with ``patterns`` only jobs whose name (or handle) matches one of those globs."""

    patterns: tuple[str, ...] = ()
    all_users: bool = False

    def keeps(self, handle: JobHandle, directory: Path | None) -> bool:
        name = handle.job_id.rsplit("/", 1)[-1]
        if self.patterns and not any(fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(str(handle), pattern) for pattern in self.patterns):
            return False
        return self.all_users or directory is None or _owned(directory)


def _owned(directory: Path) -> bool:
    try:
        return directory.stat().st_uid == os.getuid()
    except OSError:
        return True  # gone or unreadable: nobody else's files to protect


def _entry_dir(entry: job_index.IndexEntry) -> Path | None:
    """An indexed job's directory on this machine, where its scheduler keeps one (its job root)."""
    root = entry.options.get("job_root")
    return Path(str(root)).expanduser() / entry.job_handle.job_id if root else None


all_users_option = click.option("--all-users", is_flag=True, help="Other users' jobs too (by default only yours: the owner of a job's directory).")


@click.command("list", short_help="List jobs, newest first.")
@click.argument("patterns", nargs=-1, metavar="[NAME]...")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Show at most this many.")
@click.option("--state", "states", multiple=True, metavar="STATE[,STATE]", callback=comma_choices([state.value for state in JobState], upper=True),
              help="Only jobs in these states (pending, starting, running, succeeded, failed, cancelled, unknown); repeatable.")
@click.option("--scheduler", "schedulers", multiple=True, metavar="NAME[,NAME]", callback=comma_choices(SCHEDULER_NAMES),
              help="Only these schedulers' jobs (local, docker, slurm, sagemaker); repeatable. Naming sagemaker adds the "
                   "region's own listing (jobs not submitted from here too).")
@click.option("-o", "--scheduler-option", "options", multiple=True, metavar="KEY=VALUE", callback=key_value,
              help="An option of the schedulers named by --scheduler (each takes those it has; without --scheduler, the local one), e.g. job_root or region; repeatable.")
@all_users_option
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON, each as `status --json` prints one (for scripts).")
@click.pass_context
def list_command(ctx: click.Context, patterns: tuple[str, ...], limit: int, states: tuple[str, ...], schedulers: tuple[str, ...], options: list[tuple[str, str]],
                 all_users: bool, as_json: bool) -> None:
    """List your jobs, newest first, with when each started and how long it ran (so far): every job submitted
    from this machine (the job index) and every job directory under the job root (~/.smddp/jobs or
    SMDDP_JOB_ROOT) that is yours, local, docker, slurm and SageMaker alike. NAME keeps only jobs whose name
    matches, globs allowed ('cnn-*'). -n counts the jobs the filters keep.

    A job that cannot be described is one UNKNOWN line that says why: a job directory whose record is
    broken, a job gone from its job root or from SageMaker, a SageMaker job the credentials in use cannot
    see. To drop such a line: smddp-launch clean JOB."""
    wanted = [JobState(state) for state in states]
    statuses = list_statuses(schedulers, wanted, options, limit, Selection(patterns, all_users))
    if as_json:
        click.echo(json.dumps([status_as_dict(item) for item in statuses], indent=2, default=str))
        return
    if not statuses:
        which = " ".join(part for part in ("/".join(states).lower(), "/".join(schedulers)) if part)
        named = f" named {' or '.join(patterns)}" if patterns else ""
        console(ctx).say(f"No {which + ' ' if which else ''}jobs{named}{'' if which or named else ' yet. Start one with: smddp-launch job.yaml'}")
        return
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    click.echo(render_listing(statuses, color), color=color)
    undescribed = sum(1 for item in statuses if item.undescribed)
    if undescribed:
        console(ctx).say(f"{undescribed} job{'s' if undescribed != 1 else ''} could not be described; "
                         "`smddp-launch clean JOB...` forgets the ones you no longer need")


def render_listing(statuses: Sequence[JobStatus], color: bool) -> str:
    """One line per job: handle, state, start time, duration and its message."""
    rows = [(str(item.handle), item.state, _started(item), _duration(item), item.message) for item in statuses]
    width = max(len(row[0]) for row in rows)
    lines = [f"{'HANDLE'.ljust(width)}  {'STATE'.ljust(9)}  {'STARTED'.ljust(19)}  {'DURATION'.rjust(8)}  MESSAGE"]
    for handle, state, started, duration, message in rows:
        padding = " " * (9 - len(state.value))
        lines.append(f"{handle.ljust(width)}  {state_text(state, color)}{padding}  {started.ljust(19)}  {duration.rjust(8)}  {message}".rstrip())
    return "\n".join(lines)


def list_statuses(schedulers: Sequence[str], states: Collection[JobState], options: Sequence[tuple[str, str]], limit: int, selection: Selection = Selection()) -> list[JobStatus]:
    """The newest ``limit`` jobs of ``schedulers`` in ``states`` (any when empty) that ``selection`` keeps, each
    described only when it is shown: what each scheduler lists (without ``schedulers``, those that list only
    this machine's files: the job directories under the job root; SageMaker, when named, the region's newest
    training jobs) and the jobs in the index."""
    listed: list[Listed] = []
    for name in schedulers or local_listings():
        sched = scheduler_named(name, _options_of(name, options, schedulers or ("local",)))
        listed += [item for item in sched.listed(limit, states) if selection.keeps(item.handle, sched.job_path(item.handle))]
    seen = {str(item.handle) for item in listed}
    scheduler_for = functools.cache(scheduler_named)  # one per scheduler and options, not one per job
    for entry in reversed(job_index.entries()):
        if entry.handle not in seen and entry.scheduler in (schedulers or SCHEDULER_NAMES) and selection.keeps(entry.job_handle, _entry_dir(entry)):
            seen.add(entry.handle)
            listed.append(Listed(entry.job_handle, entry.submitted, functools.partial(_indexed_status, entry, scheduler_for)))
    listed.sort(key=lambda item: item.submitted, reverse=True)
    return newest(listed, limit, states)


def local_listings() -> list[str]:
    """The schedulers whose listing reads only this machine's files (``capabilities.lists_locally``): what
    `list` shows unless told which schedulers to ask."""
    return [name for name in SCHEDULER_NAMES if load_scheduler_class(name).capabilities.lists_locally]


def _options_of(name: str, options: Sequence[tuple[str, str]], named: Sequence[str]) -> list[tuple[str, str]]:
    """The -o options for scheduler ``name``: those it declares, and those no ``named`` scheduler declares (so
    that a misspelt one is still an error, with a did-you-mean); none unless it is named."""
    if name not in named:
        return []
    declared = {key for other in named for key in load_scheduler_class(other).options.names()}
    own = load_scheduler_class(name).options.names()
    return [(key, value) for key, value in options if key in own or key not in declared]


def _indexed_status(entry: job_index.IndexEntry, scheduler_for: Callable[..., Scheduler]) -> JobStatus:
    """A remembered job's listing row; a scheduler that cannot even be built (a missing package) says why."""
    try:
        scheduler = scheduler_for(entry.scheduler, tuple(sorted(entry.options.items())))
    except SmddpError as err:
        return JobStatus(entry.job_handle, JobState.UNKNOWN, brief(err), submitted=entry.submitted, undescribed=True)
    return scheduler.listed_status(entry.job_handle, entry.submitted)


@click.command(short_help="Remove your finished local and docker jobs and docker leftovers; forget others.")
@click.argument("jobs", nargs=-1, metavar="[JOB|GLOB]...", shell_complete=complete_jobs)
@click.option("--older-than", "older_than", default="0s", show_default=True, metavar="AGE", help="Only jobs that ended at least this long ago (30m, 12h, 7d).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("-y", "--yes", is_flag=True, help="Remove more than one job without asking (needed where no terminal can ask).")
@all_users_option
@click.pass_context
def clean(ctx: click.Context, jobs: tuple[str, ...], older_than: str, dry_run: bool, yes: bool, all_users: bool) -> None:
    """Remove your finished local and docker jobs (their directories, logs and outputs under the job root),
    stopped containers and unused networks docker jobs left behind, and their index entries. Running jobs
    are kept. JOB names exact jobs; a GLOB ('cnn-*') the finished jobs whose names match; with neither, all
    your finished jobs. Removing more than one job that was not named exactly asks first (--yes answers).

    A named job this machine only remembers is forgotten (its index entry dropped, so `list` no longer shows
    it): a SageMaker or slurm job (SageMaker and the cluster keep the job), or a job gone from its job root. A
    named local or docker job whose record is broken is removed."""
    match = _DURATION.match(older_than.strip())
    if not match:
        raise click.BadParameter(f"{older_than!r} is not an age like 30m, 12h or 7d", ctx=ctx, param_hint="--older-than")
    cutoff = time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    out = console(ctx)
    exact = tuple(job for job in jobs if not _is_glob(job))
    globs = tuple(job for job in jobs if _is_glob(job))
    targets, forgotten = _clean_targets(exact, cutoff, Selection((), all_users)) if exact else ([], [])
    unnamed: list[tuple[Scheduler, JobStatus]] = []
    if globs or not jobs:
        named = {str(status_.handle) for _, status_ in targets}
        unnamed = [(sched, status_) for sched, status_ in _clean_targets((), cutoff, Selection(globs, all_users))[0] if str(status_.handle) not in named]
    if not dry_run and not yes and len(unnamed) > 1:
        _confirm(ctx, out, unnamed)
    targets += unnamed
    for sched, status_ in targets:
        out.say(f"{'would remove' if dry_run else 'removing'} {status_.handle} ({_state_or_why(status_)}) {sched.job_path(status_.handle)}")
        if not dry_run:
            _remove(sched, status_)
    for status_ in forgotten:
        out.say(f"{'would forget' if dry_run else 'forgetting'} {status_.handle} ({_state_or_why(status_)})")
    if not dry_run:
        job_index.forget(str(item.handle) for item in [*(status_ for _, status_ in targets), *forgotten])
    leftovers = _leftovers({str(s.handle) for _, s in targets}, dry_run, out)
    summary = f"{'Would remove' if dry_run else 'Removed'} {len(targets)} job{'s' if len(targets) != 1 else ''}"
    if leftovers:
        summary += f" and {leftovers} leftover{'s' if leftovers != 1 else ''}"
    if forgotten:
        summary += f"; {'would forget' if dry_run else 'forgot'} {len(forgotten)}"
    out.say(summary + ".")


def _is_glob(text: str) -> bool:
    return any(char in text for char in "*?[")


def _confirm(ctx: click.Context, out: Any, targets: Sequence[tuple[Scheduler, JobStatus]]) -> None:
    """Ask before removing several jobs at once; where no one can answer (no terminal), refuse and say how."""
    for _, status_ in targets:
        out.say(f"would remove {status_.handle} ({_state_or_why(status_)})")
    question = f"Remove these {len(targets)} jobs?"
    if not click.get_text_stream("stdin").isatty():
        raise click.UsageError(f"clean would remove {len(targets)} jobs and there is no terminal to ask: pass --yes to remove them, "
                               "name the jobs (or a glob such as 'cnn-*'), or see them first with --dry-run", ctx=ctx)
    if not click.confirm(question, default=False, err=True):
        raise click.Abort()


def removable() -> list[str]:
    """The schedulers whose finished jobs `clean` removes (``capabilities.remove``); others' are only forgotten."""
    return [name for name in SCHEDULER_NAMES if load_scheduler_class(name).capabilities.remove]


def _clean_targets(jobs: tuple[str, ...], cutoff: float, selection: Selection) -> tuple[list[tuple[Scheduler, JobStatus]], list[JobStatus]]:
    """(scheduler, status) of every finished job to remove, and the named jobs only to forget. Without
    ``jobs``, the finished jobs ``selection`` keeps; a named job of another user needs ``--all-users``."""
    if jobs:
        found = [job_target(job, ())[:2] for job in jobs]
    else:
        found = [(item.handle, sched) for sched in map(scheduler_named, removable()) for item in sched.listed()]
    targets, forgotten = [], []
    for handle, sched in found:
        directory = sched.job_path(handle) if sched.capabilities.remove else None
        if not selection.keeps(handle, directory):
            if jobs:
                raise SpecError(SpecIssue("job", f"{handle} belongs to another user (its directory {directory} is not yours)", "pass --all-users to remove it"))
            continue
        item = sched.listed_status(handle, directory=directory)
        if directory is None or (item.undescribed and not directory.is_dir()):
            forgotten.append(item)  # only a named job gets here: every unnamed one has its directory
        elif item.undescribed:
            if jobs:  # a broken record, named: its directory goes; unnamed ones are kept for a look
                targets.append((sched, item))
        elif not item.state.is_terminal:
            if jobs:
                raise SpecError(SpecIssue("job", f"{handle} is {item.state.value}", f"cancel it first: smddp-launch cancel {handle.job_id}"))
        elif _ended(sched, item) <= cutoff:
            targets.append((sched, item))
    return targets, forgotten


def _ended(sched: Scheduler, job_status: JobStatus) -> float:
    path = sched.job_path(job_status.handle)
    if job_status.ended is not None:
        return job_status.ended
    return path.stat().st_mtime if path is not None and path.exists() else 0.0


def _remove(sched: Scheduler, job_status: JobStatus) -> None:
    """Remove a job's directory: through its scheduler, which checks that it ended, unless its record is broken."""
    path = sched.job_path(job_status.handle)
    if job_status.undescribed and path is not None:
        shutil.rmtree(path, ignore_errors=True)
    else:
        sched.remove(job_status.handle)


def _state_or_why(job_status: JobStatus) -> str:
    return job_status.message if job_status.undescribed else job_status.state.value


def _leftovers(removed: set[str], dry_run: bool, out: Any) -> int:
    """What jobs left outside their directories (a docker job's stopped containers and networks), of jobs
    gone or being removed, from every scheduler whose jobs `clean` removes."""
    count = 0
    for sched in map(scheduler_named, removable()):
        found = sched.leftovers({handle.partition("://")[2] for handle in removed if handle.startswith(f"{sched.name}://")})
        for kind, ids in found.items():
            if ids:
                out.say(f"{'would remove' if dry_run else 'removing'} {len(ids)} {sched.name} {kind}{'s' if len(ids) != 1 else ''}")
        if not dry_run:
            sched.remove_leftovers(found)
        count += sum(len(ids) for ids in found.values())
    return count


def _started(job_status: JobStatus) -> str:
    started = job_status.started
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started is not None else "-"


def duration_seconds(job_status: JobStatus) -> float | None:
    """How long the job ran: from its start to its end, or to now while it runs; None before it started."""
    started, ended = job_status.started, job_status.ended
    if started is None:
        return None
    if ended is None:
        if job_status.state.is_terminal or job_status.undescribed:
            return None  # ended, but when is not recorded
        ended = time.time()
    return max(0.0, ended - started)


def _duration(job_status: JobStatus) -> str:
    seconds = duration_seconds(job_status)
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def render_status(job_status: JobStatus, color: bool) -> str:
    lines = [f"{job_status.handle}  {state_text(job_status.state, color)}"]
    if job_status.message:
        lines.append(f"  {job_status.message}")
    if duration_seconds(job_status) is not None:
        lines.append(f"  started {_started(job_status)}, {'ran' if job_status.state.is_terminal else 'running for'} {_duration(job_status)}")
    for host in job_status.hosts:
        code = "" if host.exit_code is None or host.state is JobState.CANCELLED else f"  exit {host.exit_code}"
        lines.append(f"  {host.host:<8} {state_text(host.state, color)}{code}")
    if job_status.model_data:
        lines.append(f"  model: {job_status.model_data}")
    lines += [f"  left out of {skipped}" for skipped in job_status.archive_skipped]
    if job_status.scheduler_job_id:
        restarts = job_status.details.get("restarts")  # where the scheduler counts them (Slurm's requeues)
        lines.append(f"  {job_status.handle.scheduler} job id: {job_status.scheduler_job_id}" + (f", restarts {restarts}" if restarts is not None else ""))
    return "\n".join(lines + attempt_lines(job_status) + goodput_lines(job_status))


def attempt_lines(job_status: JobStatus) -> list[str]:
    """The attempt, its interruptions and billed seconds (per instance), and the status transitions with their
    times (SageMaker's SecondaryStatusTransitions), for jobs whose scheduler records them; else the attempt
    alone once there was more than one (a requeued Slurm job)."""
    if not job_status.transitions:
        return [f"  attempt {job_status.attempt}"] if job_status.attempt > 1 else []
    head = f"  attempt {job_status.attempt}, interruptions {job_status.interruptions}"
    if job_status.training_seconds is not None:
        head += f"; training seconds {job_status.training_seconds}, billable seconds {job_status.billable_seconds} (per instance)"
    lines = [head]
    for item in job_status.transitions:
        clock = datetime.fromtimestamp(item.start).strftime("%H:%M:%S") if item.start else "--:--:--"
        lines.append(f"  {clock} {item.status:<20} {item.message}".rstrip())
    return lines


def goodput_lines(job_status: JobStatus) -> list[str]:
    """Productive training over wall time and each recovery's phases (``specs.goodput``), where recorded."""
    return [f"  {line}" for line in goodput.render(job_status.goodput)] if job_status.goodput is not None else []


def status_as_dict(job_status: JobStatus) -> dict[str, Any]:
    """The JSON of ``status --json`` and of each ``list --json`` item: the status, and its duration in seconds."""
    out = dataclasses.asdict(job_status)
    out["handle"] = str(job_status.handle)
    out["duration"] = duration_seconds(job_status)
    return out


COMMANDS = (status, logs, cancel, list_command, clean)
