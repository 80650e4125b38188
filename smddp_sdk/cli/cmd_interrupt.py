"""``smddp-launch interrupt JOB [--host algo-2]``: a managed spot interruption, on demand, of a job whose
scheduler can rehearse one (``capabilities.interrupt``: local and docker)."""

from __future__ import annotations

import click

from smddp_sdk.cli.cmd_jobs import JOB_HELP, job_argument, job_target, scheduler_option
from smddp_sdk.cli.common import console
from smddp_sdk.schedulers.hosttree.attempts import Interruption


@click.command(short_help="Interrupt a spot job, as a reclaim would (local and docker).", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("--host", metavar="HOST", help="The host whose instance is reclaimed, e.g. algo-2 (default: every host).")
@click.option("--wait", type=click.FloatRange(min=0), default=0.0, show_default=True, metavar="SECONDS", help="How long capacity takes to come back before the job restarts (counts against max_wait).")
@click.pass_context
def interrupt(ctx: click.Context, job: str, options: list[tuple[str, str]], host: str | None, wait: float) -> None:
    """Interrupt JOB as SageMaker's managed spot training does: the containers are stopped, the checkpoints
    synced, the job shows Interrupted, then Starting, restores the checkpoints and trains again."""
    handle, scheduler, _ = job_target(job, options)
    scheduler.interrupt(handle, Interruption(host, wait))
    console(ctx).say(f"Interruption requested: {handle}" + (f" ({host})" if host else ""))


COMMANDS = (interrupt,)
