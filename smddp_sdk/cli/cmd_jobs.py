"""Commands on a submitted job, named by its handle: ``status``, ``logs``, ``cancel``, ``list``."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import click
from click.shell_completion import CompletionItem

from smddp_sdk import launcher
from smddp_sdk.cli.common import console, parse_hosts, parse_ranks, scheduler_named
from smddp_sdk.cli.output import color_enabled, state_text
from smddp_sdk.cli.params import key_value
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.specs.status import SCHEDULER_NAMES, JobHandle, JobState, JobStatus

HANDLE_HELP = "HANDLE is what `run` printed: local://<job>, docker://<job> or sagemaker://<region>/<job>."


def _handle(ctx: click.Context, param: click.Parameter, value: str) -> JobHandle:
    return JobHandle.parse(value)


def complete_handles(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Handles of local jobs (the only ones listed without a network call); nothing when that fails."""
    try:
        handles = [str(job.handle) for job in list_statuses("local", ())]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the user's shell
        return []
    return [CompletionItem(handle) for handle in handles if handle.startswith(incomplete)]


def handle_argument(func: Any) -> Any:
    return click.argument("handle", callback=_handle, metavar="HANDLE", shell_complete=complete_handles)(func)


def scheduler_option(func: Any) -> Any:
    return click.option("-o", "--scheduler-option", "options", multiple=True, metavar="KEY=VALUE", callback=key_value,
                        help="A scheduler option; repeatable (the user config's options apply too).")(func)


@click.command(short_help="Show a job's state.", epilog=HANDLE_HELP)
@handle_argument
@scheduler_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (for scripts).")
@click.pass_context
def status(ctx: click.Context, handle: JobHandle, options: list[tuple[str, str]], as_json: bool) -> None:
    """Show the state of HANDLE's job, its hosts and, when it failed, the root cause."""
    job_status = scheduler_named(handle.scheduler, options).status(handle)
    if as_json:
        click.echo(json.dumps(status_as_dict(job_status), indent=2, default=str))
        return
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    click.echo(render_status(job_status, color))
    if job_status.state is JobState.FAILED and job_status.failure is not None:
        console(ctx).say(launcher.failure_summary(job_status))


@click.command(short_help="Print a job's logs, or follow them.", epilog=HANDLE_HELP)
@handle_argument
@scheduler_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--rank", "ranks", callback=parse_ranks, metavar="RANKS", help="Only these ranks, e.g. 0,3 or 8-11.")
@click.option("--host", "hosts", callback=parse_hosts, metavar="HOSTS", help="Only these hosts, e.g. algo-2 or 1,2.")
@click.pass_context
def logs(ctx: click.Context, handle: JobHandle, options: list[tuple[str, str]], follow: bool,
         ranks: list[int] | None, hosts: list[str] | None) -> None:
    """Print HANDLE's logs with [host/rank] prefixes (coloured on a terminal unless NO_COLOR is set)."""
    stdout = click.get_text_stream("stdout")
    color = color_enabled(stdout, (ctx.find_root().obj or {}).get("color_mode", "auto"))
    for line in scheduler_named(handle.scheduler, options).logs(handle, hosts=hosts, ranks=ranks, follow=follow):
        click.echo(launcher.format_line(line, colour=color), color=color)


@click.command(short_help="Stop a job.", epilog=HANDLE_HELP)
@handle_argument
@scheduler_option
@click.pass_context
def cancel(ctx: click.Context, handle: JobHandle, options: list[tuple[str, str]]) -> None:
    """Stop HANDLE's job. Cancelling a job that already ended does nothing."""
    scheduler_named(handle.scheduler, options).cancel(handle)
    console(ctx).say(f"Cancel requested: {handle}")


@click.command("list", short_help="List jobs, newest first.")
@click.option("--scheduler", type=click.Choice(SCHEDULER_NAMES), default="local", show_default=True, help="Whose jobs to list.")
@scheduler_option
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON (for scripts).")
@click.pass_context
def list_command(ctx: click.Context, scheduler: str, options: list[tuple[str, str]], limit: int, as_json: bool) -> None:
    """List the jobs a scheduler knows, newest first (local jobs live under ~/.smddp/jobs or SMDDP_JOB_ROOT)."""
    statuses = list_statuses(scheduler, options)[:limit]
    if as_json:
        click.echo(json.dumps([status_as_dict(item) for item in statuses], indent=2, default=str))
        return
    if not statuses:
        console(ctx).say(f"No {scheduler} jobs yet. Start one with: smddp-launch job.yaml")
        return
    color = color_enabled(click.get_text_stream("stdout"), (ctx.find_root().obj or {}).get("color_mode", "auto"))
    rows = [(str(item.handle), item.state, _started(item), item.message) for item in statuses]
    width = max(len(row[0]) for row in rows)
    click.echo(f"{'HANDLE'.ljust(width)}  {'STATE'.ljust(9)}  {'STARTED'.ljust(19)}  MESSAGE")
    for handle, state, started, message in rows:
        click.echo(f"{handle.ljust(width)}  {state_text(state, color)}{' ' * (9 - len(state.value))}  {started.ljust(19)}  {message}".rstrip(), color=color)


def list_statuses(scheduler: str, options: Sequence[tuple[str, str]]) -> list[JobStatus]:
    instance = scheduler_named(scheduler, options)
    lister = getattr(instance, "list_jobs", None)
    if lister is None:
        raise SpecError(SpecIssue("scheduler", f"the {scheduler} scheduler cannot list its jobs", "keep the handle `run --detach` printed"))
    statuses: list[JobStatus] = lister()
    return statuses


def _started(job_status: JobStatus) -> str:
    started = job_status.details.get("started")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "-"


def render_status(job_status: JobStatus, color: bool) -> str:
    lines = [f"{job_status.handle}  {state_text(job_status.state, color)}"]
    if job_status.message:
        lines.append(f"  {job_status.message}")
    for host in job_status.hosts:
        code = "" if host.exit_code is None else f"  exit {host.exit_code}"
        lines.append(f"  {host.host:<8} {state_text(host.state, color)}{code}")
    if job_status.model_data:
        lines.append(f"  model: {job_status.model_data}")
    return "\n".join(lines)


def status_as_dict(job_status: JobStatus) -> dict[str, Any]:
    out = dataclasses.asdict(job_status)
    out["handle"] = str(job_status.handle)
    return out


COMMANDS = (status, logs, cancel, list_command)
