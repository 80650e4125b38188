"""``stacks``: where every rank of a running job is, grouped, with each distinct Python stack once, to see
where it hangs (schedulers with ``capabilities.stacks``: local, docker and Slurm)."""

from __future__ import annotations

import click

from smddp_sdk.cli.cmd_jobs import JOB_HELP, job_argument, job_target, scheduler_option
from smddp_sdk.cli.common import console
from smddp_sdk.schedulers.stacks import grouped, ranks_text
from smddp_sdk.specs.contract import STACKS_SIGNAL


@click.command("stacks", short_help="Print every rank's Python stack of a running job.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("--timeout", type=click.FloatRange(min=0.5), default=10.0, show_default=True, metavar="SECONDS", help="How long to wait for the ranks to answer.")
@click.pass_context
def stacks_command(ctx: click.Context, job: str, options: list[tuple[str, str]], timeout: float) -> None:
    """Print where every rank of JOB is (local, docker and Slurm jobs): one line per place, such as
    'ranks 0-2: all_reduce #41 (...) at train.py:37' and 'rank 3: time.sleep(60) at train.py:30', then each
    distinct stack of the script's thread once with the ranks that share it (without the launcher's frames;
    every thread is in the job's stacks files).

    Each rank writes its stacks from a signal handler (faulthandler), so this works while a rank is stuck in
    a collective or in native code; they are also kept in the job's tree (<host>/output/stacks/).
    """
    handle, scheduler, _ = job_target(job, options)
    collected = scheduler.stacks(handle, timeout=timeout)
    places, distinct = grouped(collected)
    if places:
        width = max(len(ranks_text(stacks)) for _, stacks in places) + 1
        click.echo("where each rank is:")
        for place, stacks in places:
            click.echo(f"  {ranks_text(stacks) + ':':<{width}} {place}")
    for text, stacks in distinct:
        hosts = ", ".join(dict.fromkeys(stack.host for stack in stacks))
        click.echo(f"=== {ranks_text(stacks)} ({hosts}) ===")
        click.echo(text)
    silent = [stack for stack in collected if not stack.text]
    if silent:
        who = ", ".join(f"{stack.host}/rank{stack.rank}" for stack in silent)
        console(ctx).say(f"no stacks within {timeout:g} s from {who} (ended, or blocking {STACKS_SIGNAL.name})")
    if not collected:
        console(ctx).say(f"{handle}: no rank has started yet")


COMMANDS = (stacks_command,)
