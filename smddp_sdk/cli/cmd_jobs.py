"""Commands on submitted jobs, named by job name or handle: ``status``, ``logs``, ``cancel``, ``list``, ``clean``."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

from smddp_sdk import job_index, launcher
from smddp_sdk.cli.common import console, parse_hosts, parse_ranks, scheduler_named
from smddp_sdk.cli.output import color_enabled, state_text
from smddp_sdk.cli.params import key_value
from smddp_sdk.errors import SmddpError, SpecError, SpecIssue
from smddp_sdk.schedulers.base import Scheduler
from smddp_sdk.specs.status import SCHEDULER_NAMES, JobHandle, JobState, JobStatus, LogLine

if TYPE_CHECKING:
    from smddp_sdk.schedulers.hosttree.jobs import HostTreeScheduler

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


def job_argument(func: Any) -> Any:
    return click.argument("job", metavar="JOB", shell_complete=complete_jobs)(func)


def scheduler_option(func: Any) -> Any:
    return click.option("-o", "--scheduler-option", "options", multiple=True, metavar="KEY=VALUE", callback=key_value,
                        help="A scheduler option; repeatable (the user config's options apply too).")(func)


def job_target(job: str, options: Sequence[tuple[str, str]]) -> tuple[JobHandle, Scheduler]:
    """The handle of JOB and a scheduler that can reach it (with the job root or profile it was run with)."""
    handle, entry = job_index.resolve(job)
    remembered = [(key, value) for key, value in (entry.options.items() if entry else ()) if key not in dict(options)]
    return handle, scheduler_named(handle.scheduler, [*remembered, *options])


@click.command(short_help="Show a job's state.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (for scripts).")
@click.pass_context
def status(ctx: click.Context, job: str, options: list[tuple[str, str]], as_json: bool) -> None:
    """Show the state of JOB, its hosts, where its model went and, when it failed, the root cause."""
    handle, scheduler = job_target(job, options)
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
    handle, scheduler = job_target(job, options)
    keep = line_filter(ctx, since, pattern)
    stdout = click.get_text_stream("stdout")
    color = color_enabled(stdout, (ctx.find_root().obj or {}).get("color_mode", "auto"))
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


def select_lines(scheduler: Scheduler, handle: JobHandle, *, hosts: list[str] | None, ranks: list[int] | None, follow: bool,
                 tail: int | None, keep: Any) -> Iterator[LogLine]:
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
    raise SpecError(SpecIssue("logs", f"{handle} has no lines from {wanted}",
                              f"its lines come from hosts {', '.join(known_hosts)} and ranks {_ranges(known_ranks) or 'none'}"))


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return ""
    parts, low, prev = [], numbers[0], numbers[0]
    for number in numbers[1:] + [None]:  # type: ignore[list-item]
        if number is not None and number == prev + 1:
            prev = number
            continue
        parts.append(f"{low}-{prev}" if prev != low else str(low))
        if number is not None:
            low = prev = number
    return ",".join(parts)


@click.command(short_help="Stop a job.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.pass_context
def cancel(ctx: click.Context, job: str, options: list[tuple[str, str]]) -> None:
    """Stop JOB: every host and rank (SIGTERM, then SIGKILL after the grace period); it ends CANCELLED.
    Cancelling a job that already ended changes nothing and says so."""
    handle, scheduler = job_target(job, options)
    before = scheduler.status(handle)
    if before.state.is_terminal:
        console(ctx).say(f"{handle} already ended ({before.state.value}); nothing to cancel")
        return
    scheduler.cancel(handle)
    console(ctx).say(f"Cancel requested: {handle}")


@click.command("list", short_help="List jobs, newest first.")
@click.option("--scheduler", type=click.Choice(SCHEDULER_NAMES), help="Only this scheduler's jobs; for sagemaker, the region's whole listing (not only jobs from here).")
@scheduler_option
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON (for scripts).")
@click.pass_context
def list_command(ctx: click.Context, scheduler: str | None, options: list[tuple[str, str]], limit: int, as_json: bool) -> None:
    """List jobs, newest first: by default every job submitted from this machine (local, docker and
    SageMaker, from the job index under ~/.smddp/jobs or SMDDP_JOB_ROOT)."""
    statuses = list_statuses(scheduler, options, limit)[:limit]
    if as_json:
        click.echo(json.dumps([status_as_dict(item) for item in statuses], indent=2, default=str))
        return
    if not statuses:
        console(ctx).say(f"No {scheduler + ' ' if scheduler else ''}jobs yet. Start one with: smddp-launch job.yaml")
        return
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    rows = [(str(item.handle), item.state, _started(item), item.message) for item in statuses]
    width = max(len(row[0]) for row in rows)
    click.echo(f"{'HANDLE'.ljust(width)}  {'STATE'.ljust(9)}  {'STARTED'.ljust(19)}  MESSAGE")
    for handle, state, started, message in rows:
        click.echo(f"{handle.ljust(width)}  {state_text(state, color)}{' ' * (9 - len(state.value))}  {started.ljust(19)}  {message}".rstrip(), color=color)


def list_statuses(scheduler: str | None, options: Sequence[tuple[str, str]], limit: int = 20) -> list[JobStatus]:
    """``scheduler``'s jobs, or (None) every job this machine submitted and every local job, newest first."""
    if scheduler is not None:
        return scheduler_named(scheduler, options).list_jobs(limit)
    found: dict[str, JobStatus] = {}
    for item in scheduler_named("local", options).list_jobs():
        found[str(item.handle)] = item
    for entry in reversed(job_index.entries()):
        if entry.handle in found or entry.scheduler == "local" or len(found) >= limit * 2:
            continue
        found[entry.handle] = _indexed_status(entry)
    return sorted(found.values(), key=lambda item: item.details.get("started") or item.details.get("submitted") or 0, reverse=True)


def _indexed_status(entry: job_index.IndexEntry) -> JobStatus:
    """A remembered job's status; when its scheduler cannot answer, the reason (the listing goes on)."""
    handle = entry.job_handle
    try:
        item = scheduler_named(handle.scheduler, list(entry.options.items())).status(handle)
    except SmddpError as err:
        return JobStatus(handle, JobState.UNKNOWN, str(err).splitlines()[0], details={"submitted": entry.submitted})
    item.details.setdefault("started", entry.submitted)
    return item


@click.command(short_help="Remove finished local and docker jobs and docker leftovers.")
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=complete_jobs)
@click.option("--older-than", "older_than", default="0s", show_default=True, metavar="AGE",
              help="Only jobs that ended at least this long ago (30m, 12h, 7d).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.pass_context
def clean(ctx: click.Context, jobs: tuple[str, ...], older_than: str, dry_run: bool) -> None:
    """Remove finished local and docker jobs (their directories, logs and outputs under the job root), stopped
    containers and unused networks docker jobs left behind, and their index entries. Running jobs are kept;
    SageMaker jobs are never touched. With JOB names only those jobs; default all finished ones."""
    match = _DURATION.match(older_than.strip())
    if not match:
        raise click.BadParameter(f"{older_than!r} is not an age like 30m, 12h or 7d", ctx=ctx, param_hint="--older-than")
    cutoff = time.time() - float(match.group(1)) * _UNITS[match.group(2)]
    out = console(ctx)
    targets = _clean_targets(jobs, cutoff)
    removed = []
    for sched, status_ in targets:
        out.say(f"{'would remove' if dry_run else 'removing'} {status_.handle} ({status_.state.value}) {sched.job_path(status_.handle)}")
        if not dry_run:
            sched.remove(status_.handle)
            removed.append(str(status_.handle))
    if removed:
        job_index.forget(removed)
    leftovers = _docker_leftovers({s.handle.job_id for _, s in targets if s.handle.scheduler == "docker"}, dry_run, out)
    out.say(f"{'Would remove' if dry_run else 'Removed'} {len(targets)} job{'s' if len(targets) != 1 else ''}"
            f"{f' and {leftovers} docker leftover' + ('s' if leftovers != 1 else '') if leftovers else ''}.")


def _clean_targets(jobs: tuple[str, ...], cutoff: float) -> list[tuple[HostTreeScheduler, JobStatus]]:
    """(scheduler, status) of every finished local/docker job to remove."""
    if jobs:
        candidates = [job_index.resolve(job)[0] for job in jobs]
        for handle in candidates:
            if handle.scheduler == "sagemaker":
                raise SpecError(SpecIssue("job", f"{handle} runs on SageMaker; clean removes only local and docker jobs"))
    else:
        candidates = [item.handle for name in ("local", "docker") for item in scheduler_named(name).list_jobs()]
    from smddp_sdk.schedulers.hosttree.jobs import HostTreeScheduler  # loaded only for clean

    targets = []
    for handle in candidates:
        sched = scheduler_named(handle.scheduler)
        assert isinstance(sched, HostTreeScheduler)  # local or docker, checked above
        item = sched.status(handle)
        if not item.state.is_terminal:
            if jobs:
                raise SpecError(SpecIssue("job", f"{handle} is {item.state.value}", f"cancel it first: smddp-launch cancel {handle.job_id}"))
            continue
        path = sched.job_path(handle)
        ended = item.details.get("ended") or (path.stat().st_mtime if path.exists() else 0)
        if isinstance(ended, (int, float)) and ended <= cutoff and path.is_dir():
            targets.append((sched, item))
    return targets


def _docker_leftovers(removed: set[str], dry_run: bool, out: Any) -> int:
    """Leftover containers and networks of docker jobs from this job root that are gone or being removed."""
    from smddp_sdk.schedulers.docker import DockerScheduler

    docker = scheduler_named("docker")
    assert isinstance(docker, DockerScheduler)
    found = docker.leftovers(removed)
    for kind, ids in found.items():
        if ids:
            out.say(f"{'would remove' if dry_run else 'removing'} {len(ids)} docker {kind}{'s' if len(ids) != 1 else ''}")
    if not dry_run:
        docker.remove_leftovers(found)
    return sum(len(ids) for ids in found.values())


def _started(job_status: JobStatus) -> str:
    started = job_status.details.get("started")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "-"


def render_status(job_status: JobStatus, color: bool) -> str:
    lines = [f"{job_status.handle}  {state_text(job_status.state, color)}"]
    if job_status.message:
        lines.append(f"  {job_status.message}")
    for host in job_status.hosts:
        code = "" if host.exit_code is None or host.state is JobState.CANCELLED else f"  exit {host.exit_code}"
        lines.append(f"  {host.host:<8} {state_text(host.state, color)}{code}")
    if job_status.model_data:
        lines.append(f"  model: {job_status.model_data}")
    return "\n".join(lines + attempt_lines(job_status.details))


def attempt_lines(details: dict[str, Any]) -> list[str]:
    """The attempt, its interruptions and billed seconds (per instance), and the status transitions with their
    times (SageMaker's SecondaryStatusTransitions), for jobs whose scheduler records them."""
    transitions = details.get("transitions") or []
    if not transitions:
        return []
    head = f"  attempt {details.get('attempt', 1)}, interruptions {details.get('interruptions', 0)}"
    if details.get("training_seconds") is not None:
        head += f"; training seconds {details['training_seconds']}, billable seconds {details.get('billable_seconds')} (per instance)"
    lines = [head]
    for item in transitions:
        clock = datetime.fromtimestamp(item["start"]).strftime("%H:%M:%S") if item.get("start") else "--:--:--"
        lines.append(f"  {clock} {item['status']:<20} {item.get('message') or ''}".rstrip())
    return lines


def status_as_dict(job_status: JobStatus) -> dict[str, Any]:
    out = dataclasses.asdict(job_status)
    out["handle"] = str(job_status.handle)
    return out


COMMANDS = (status, logs, cancel, list_command, clean)
