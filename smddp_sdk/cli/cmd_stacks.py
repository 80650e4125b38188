"""``stacks``: every rank's Python stack of a running job, to see where it hangs (schedulers with
``capabilities.stacks``: local and docker)."""

from __future__ import annotations

import click

from smddp_sdk.cli.cmd_jobs import JOB_HELP, job_argument, job_target, scheduler_option
from smddp_sdk.cli.common import console
from smddp_sdk.specs.contract import STACKS_SIGNAL


@click.command("stacks", short_help="Print every rank's Python stack of a running job.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("--timeout", type=click.FloatRange(min=0.5), default=10.0, show_default=True, metavar="SECONDS", help="How long to wait for the ranks to answer.")
@click.pass_context
def stacks_command(ctx: click.Context, job: str, options: list[tuple[str, str]], timeout: float) -> None:
    """Print where every rank of JOB is: all threads' Python stacks, rank by rank (local and docker jobs).

    Each rank writes them from a signal handler (faulthandler), so this works while a rank is stuck in
    a collective or in native code; they are also kept in the job's tree (<host>/output/stacks/).
    """
    handle, scheduler, _ = job_target(job, options)
    collected = scheduler.stacks(handle, timeout=timeout)
    silent = [stack for stack in collected if not stack.text]
    for stack in collected:
        if stack.text:
            click.echo(f"=== {stack.host}/rank{stack.rank} ===")
            click.echo(stack.text.rstrip("\n"))
    if silent:
        who = ", ".join(f"{stack.host}/rank{stack.rank}" for stack in silent)
        console(ctx).say(f"no stacks within {timeout:g} s from {who} (ended, or blocking {STACKS_SIGNAL.name})")
    if not collected:
        console(ctx).say(f"{handle}: no rank has started yet")


COMMANDS = (stacks_command,)
