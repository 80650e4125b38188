"""``smddp-launch drill NAME|job.yaml``: a fault drill on the user's own job (``schedulers.hosttree.drill``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from smddp_sdk import launcher
from smddp_sdk.cli.cmd_jobs import job_target, scheduler_option, status_as_dict
from smddp_sdk.cli.common import build_scheduler, console, scheduler_named
from smddp_sdk.cli.params import flags_layer
from smddp_sdk.config.job_file import resolve_job
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers.base import Scheduler
from smddp_sdk.schedulers.hosttree import drill as drills
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle

EPILOG = """\b
Examples:
  smddp-launch drill job.yaml                                  2 host kills, 5-20 s into training (seed 0)
  smddp-launch drill job.yaml --kind host,spot --rounds 4 --random 10-60 --seed 7
  smddp-launch drill my-job --kind rank --at 30 --no-compare   the job run earlier as my-job, drilled again
\b
The job runs under a name of its own, with a checkpoint location of its own (<checkpoint_s3_uri>/<name>),
so no earlier checkpoint is restored. How the report is computed: docs/resuming.md."""


def _seconds_range(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, float] | None:
    if value is None:
        return None
    low, sep, high = value.partition("-")
    try:
        bounds = (float(low), float(high)) if sep else (float(low), float(low))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a range of seconds like 5-20", ctx=ctx, param=param) from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise click.BadParameter(f"{value!r}: LOW-HIGH with 0 <= LOW <= HIGH", ctx=ctx, param=param)
    return bounds


def _seconds_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in (value or "").split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of seconds like 10,30", ctx=ctx, param=param) from None
    if any(delay < 0 for delay in delays):
        raise click.BadParameter(f"{value!r}: seconds are >= 0", ctx=ctx, param=param)
    return delays


@click.command(short_help="Rehearse interruptions on your own job and report what they cost.", epilog=EPILOG)
@click.argument("job", metavar="NAME|JOB_FILE")
@scheduler_option
@click.option("--kind", "kinds", default="host", show_default=True, metavar="KIND[,KIND]",
              help="Faults, in turn: host (a host's runtime or container SIGKILLed), rank (a rank SIGKILLed; local jobs), spot (the instance reclaimed).")
@click.option("--rounds", type=click.IntRange(1, 30), default=2, show_default=True, help="How many faults (one per attempt).")
@click.option("--at", "at", callback=_seconds_list, metavar="SECONDS[,SECONDS]", help="Seconds each attempt trains before its fault (the last one repeats).")
@click.option("--random", "between", callback=_seconds_range, metavar="LOW-HIGH", help="Draw each delay from this range instead (default 5-20).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the drawn delays: the same seed, the same drill.")
@click.option("--host", metavar="HOST", help="The host that suffers the faults (default: the last, algo-N).")
@click.option("--rank", type=click.IntRange(min=0), help="The rank killed by rank faults (default: the host's last).")
@click.option("--compare/--no-compare", default=True, show_default=True, help="Also run the job straight and compare the final parameters.")
@click.option("--checkpoint-seconds", type=click.FloatRange(min=0), default=0.0, show_default=True, help="What one checkpoint blocks training for, for the planner's prediction.")
@click.option("--checkpoint-interval", type=click.FloatRange(min=0, min_open=True), help="Seconds between checkpoints (default: measured from the checkpoint files' times).")
@click.option("--timeout", type=click.FloatRange(min=1), default=3600, show_default=True, help="Seconds to wait for any one step of the drill.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def drill(ctx: click.Context, job: str, options: list[tuple[str, str]], kinds: str, rounds: int, at: tuple[float, ...], between: tuple[float, float] | None,
          seed: int, host: str | None, rank: int | None, compare: bool, checkpoint_seconds: float, checkpoint_interval: float | None, timeout: float, as_json: bool) -> None:
    """Run JOB (a job file, or the name of a job run before) with interruptions of the chosen kinds at chosen
    or seeded random times, one per attempt, then report each recovery's phases (detect, stop, restart, cold
    start, restore), the work redone, the goodput, the planner's prediction for the same figures and, unless
    --no-compare, whether the final parameters equal those of the same job run straight. Local and docker
    jobs. Exit code 0 when the job succeeded and (when compared) its parameters are equal, else 1."""
    out = console(ctx)
    wanted = [kind.strip() for kind in kinds.split(",") if kind.strip()]
    spec, scheduler = _job(job, options, rank_faults="rank" in wanted)
    hosts = [f"algo-{index}" for index in range(1, spec.instance_count + 1)]
    faults = drills.plan_faults(wanted, rounds, hosts, at=at, between=between, seed=seed, host=host, rank=rank)
    name = f"{(spec.job_name or spec.base_job_name or 'pytorch-training')[:40]}-drill-{time.strftime('%Y%m%d-%H%M%S')}"
    drilled = drills.drilled_spec(spec, faults, name)
    if "rank" in wanted and scheduler.dryrun(drilled).request.backend != "process":
        raise SpecError(SpecIssue("kind", "rank faults are drilled on local jobs only", "use host or spot faults on docker jobs"))
    if not spec.checkpoint_s3_uri:
        out.say("warning: the job has no checkpoint_s3_uri: every attempt starts from scratch, and its work is redone")
    def submit(job_spec: JobSpec) -> JobHandle:  # attached: the drill's jobs end with it; indexed: `status NAME` finds them
        return launcher.schedule(scheduler, scheduler.dryrun(job_spec), attached=True)

    engine = drills.Drill(scheduler, submit, out.say, timeout=timeout)
    report = engine.run(drilled, faults, checkpoint_s=checkpoint_seconds, checkpoint_interval=checkpoint_interval)
    if compare:
        out.say(f"running {spec.job_name or 'the job'} straight, to compare the final parameters")
        straight = submit(drills.straight_spec(spec, f"{name}-straight"))
        report.straight = engine.wait_end(straight)
        if report.status is not None:
            report.differences = drills.differences(report.status.model_data, report.straight.model_data)
    if as_json:
        click.echo(json.dumps(report.to_json(status_as_dict(report.status) if report.status else None), indent=2, default=str))
    else:
        click.echo("\n".join(drills.render(report)))
    ctx.exit(0 if report.ok else 1)


def _job(job: str, options: list[tuple[str, str]], *, rank_faults: bool) -> tuple[JobSpec, Scheduler]:
    """The job's spec and a scheduler that can drill it: from a job file, or from the record of a job run
    before. Rank faults need the script's failures retried (retry_script_errors)."""
    extra = [("retry_script_errors", "true")] if rank_faults else []
    if Path(job).suffix in (".yaml", ".yml", ".json") or Path(job).is_file():
        flags = flags_layer({"scheduler_option": [*options, *extra]}, (), Path.cwd())  # -o as `run` reads it
        resolved = resolve_job(Path(job), flags=flags, cwd=Path.cwd(), job_file_name=job)
        scheduler = build_scheduler(resolved.scheduler, resolved.scheduler_options, resolved)
        return resolved.spec, _drillable(scheduler)
    handle, scheduler, _ = job_target(job, options)
    record: dict[str, Any] = _drillable(scheduler).job_record(handle)  # type: ignore[attr-defined]
    if not isinstance(record.get("spec"), dict):
        raise SpecError(SpecIssue("job", f"{handle} keeps no job description to run again", "drill its job file instead"))
    return JobSpec.from_mapping(record["spec"]), scheduler_named(handle.scheduler, [*options, *extra]) if extra else scheduler


def _drillable(scheduler: Scheduler) -> Scheduler:
    """Only a scheduler that restarts a job it interrupts can drill it (``capabilities.interrupt``)."""
    if not scheduler.capabilities.interrupt:
        raise SpecError(SpecIssue("job", f"the {scheduler.name} scheduler cannot restart a job it drills", scheduler.capabilities.instead.get("interrupt", "drill a local or docker job")))
    return scheduler


COMMANDS = (drill,)
