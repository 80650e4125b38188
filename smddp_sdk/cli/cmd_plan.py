"""``smddp-launch plan``: predicted step time, scaling and cost of a job on 1-4096 instances, before renting."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import click

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.planning import plan_for_spec
from smddp_sdk.planning.hardware import CATALOG
from smddp_sdk.planning.plan import render_svg, render_table

EPILOG = (
    "The step comes from a profile (run the job once with SMDDP_PROFILE=<dir> in its environment) or from "
    "--compute-ms and --gradient-mb. Prices are not built in: give --price-per-hour for cost columns. "
    "How the model works and how well it predicts measured runs: docs/planning.md."
)


@click.command(short_help="Predict step time, scaling efficiency and cost on N instances.", epilog=EPILOG)
@click.argument("job_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--instance-type", metavar="TYPE", help=f"Host type to plan for (default: the job's). Known: {', '.join(sorted(CATALOG))}; sim:<rate>mbit[+<delay>ms].")
@click.option("--instances", default="1,2,4,8,16,32", show_default=True, metavar="N,N,...", help="Instance counts to compare.")
@click.option("--profile", type=click.Path(exists=True), help="A step profile (SMDDP_PROFILE dir or file).")
@click.option("--compute-ms", type=float, help="Compute per step on the target GPU (replaces the profile's, which is this machine's).")
@click.option("--gradient-mb", type=float, help="Gradient size in MB, when planning without a profile.")
@click.option("--bucket-mb", type=float, default=25.0, show_default=True, help="DDP bucket size, when planning without a profile.")
@click.option("--batch-size", type=int, help="Samples per rank and step (default: the job's batch-size hyperparameter).")
@click.option("--samples-per-epoch", type=int, help="Dataset size, for epoch time and cost per epoch.")
@click.option("--price-per-hour", type=float, help="USD per instance-hour, from your region's SageMaker pricing page.")
@click.option("--failure-rate", type=float, metavar="PER_INSTANCE_HOUR", help="Failures per instance-hour (default: Llama 3's 419 in 54 days on 16,384 GPUs, per GPU of the instance).")
@click.option("--checkpoint-interval", type=float, metavar="SECONDS", help="Training between checkpoints (default 1800); the plan suggests the best one.")
@click.option("--checkpoint-seconds", type=float, metavar="SECONDS", help="What one checkpoint blocks training for (default 30).")
@click.option("--recovery-seconds", type=float, metavar="SECONDS", help="From a fault to training again (default 600; `status` of a drilled job shows yours).")
@click.option("--recovery-from", metavar="JOB", help="Take the recovery time from JOB's recoveries (their median, as `status` shows them): a drilled job, say.")
@click.option("--spot-rate", type=float, metavar="PER_INSTANCE_HOUR", help="Spot interruptions per instance-hour, for a spot job (default 0).")
@click.option("--spot-price-per-hour", type=float, help="USD per spot instance-hour: costs under failures at this price.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--svg", type=click.Path(dir_okay=False, path_type=Path), help="Also write a plot of scaling efficiency.")
def plan(job_file: str | None, as_json: bool, svg: Path | None, recovery_from: str | None, **options: Any) -> None:
    """Predict, for JOB_FILE's step, the step time, scaling efficiency, throughput and cost on each instance
    count, for what runs there: AWS's SMDDP against NCCL on GPU instance types, this project's backend
    against gloo on CPU instance types and simulated hosts. The notes say which, and why wherever smddp is
    predicted slower. Then goodput and cost under failures: how often the job is interrupted, the share of
    its time that trains, the checkpoint interval that wastes least, and the cost of a productive hour."""
    if recovery_from:
        options["recovery_seconds"] = measured_recovery(recovery_from)
    result = plan_for_spec(_job_spec(job_file) if job_file else None, **options)
    if svg:
        svg.write_text(render_svg(result), encoding="utf-8")
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else render_table(result), nl=not as_json)
    if svg and not as_json:
        click.echo(f"plot written to {svg}")


def measured_recovery(job: str) -> float:
    """The median time from a fault to training again over JOB's recoveries (``specs.goodput``)."""
    from smddp_sdk.cli.cmd_jobs import job_target

    handle, scheduler, _ = job_target(job, ())
    found = scheduler.status(handle).goodput
    totals = [item.total for item in (found.recoveries if found else ()) if item.total is not None]
    if not totals:
        raise SpecError(SpecIssue("recovery_from", f"{handle} recorded no recovery that trained again", "drill it first (smddp-launch drill), or give --recovery-seconds"))
    return statistics.median(totals)


def _job_spec(job_file: str):
    from smddp_sdk.config.job_file import resolve_job

    return resolve_job(Path(job_file), cwd=Path.cwd(), job_file_name=job_file).spec


COMMANDS = [plan]
