"""Helpers the commands share: turning flags into a resolved job, building schedulers, parsing filters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from smddp_sdk.cli.output import Console
from smddp_sdk.cli.params import flags_layer, yaml_value
from smddp_sdk.config.job_file import JobFileError, ResolvedJob, locate, resolve_job, user_scheduler_options
from smddp_sdk.errors import SpecError, UnavailableError
from smddp_sdk.schedulers import scheduler_class
from smddp_sdk.schedulers.base import DryRun, Scheduler


def console(ctx: click.Context) -> Console:
    obj = ctx.find_root().obj or {}
    return obj.get("console") or Console()


def resolve_from_cli(ctx: click.Context, job_file: str | None, params: Mapping[str, Any]) -> ResolvedJob:
    """The job from its file, the user config, SMDDP_* variables and this command's flags."""
    cwd = Path.cwd()
    flags = flags_layer(dict(params), ctx.meta.get("script_args", ()), cwd)
    job = resolve_job(Path(job_file) if job_file else None, flags=flags, cwd=cwd, job_file_name=job_file)
    for warning in job.warnings:
        console(ctx).say(f"warning: {warning}")
    return job


def load_scheduler_class(name: str) -> type[Scheduler]:
    """A scheduler's class; a missing module or package is 'unavailable' (exit 3) with an install hint."""
    try:
        return scheduler_class(name)
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("smddp_sdk"):
            raise UnavailableError(f"the {name} scheduler is not part of this installation of smddp-sdk") from err
        extra = "aws" if name == "sagemaker" else name
        raise UnavailableError(f"the {name} scheduler needs the Python package {err.name!r}: pip install 'smddp-sdk[{extra}]'") from err


def build_scheduler(name: str, options: Mapping[str, Any], job: ResolvedJob | None = None) -> Scheduler:
    """Create a scheduler; unavailable ones exit 3, options it rejects exit 2 (located when ``job`` is given)."""
    cls = load_scheduler_class(name)
    with located(job):
        return cls(**options)


def plan_job(job: ResolvedJob, scheduler: Scheduler) -> DryRun:
    """The scheduler's dry run of the job: its objections to the spec are located like every other problem."""
    with located(job):
        return scheduler.dryrun(job.spec)


@contextmanager
def located(job: ResolvedJob | None) -> Iterator[None]:
    """Spec problems raised inside, each placed where the job said it (file:line, variable or flag)."""
    try:
        yield
    except JobFileError:
        raise
    except SpecError as err:
        if job is None:
            raise
        raise JobFileError([locate(job.source(issue.path), issue, job.job_file) for issue in err.issues]) from err


def scheduler_named(name: str, option_pairs: Sequence[tuple[str, str]] = ()) -> Scheduler:
    """A scheduler for commands without a job file: the user config's options for it, then -o flags."""
    options = {**user_scheduler_options(name), **{key: yaml_value(f"-o {key}", raw) for key, raw in option_pairs}}
    return build_scheduler(name, options)


def parse_ranks(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """``0,3,8-11`` -> [0, 3, 8, 9, 10, 11]."""
    if not value:
        return None
    ranks: list[int] = []
    for part in value.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            ranks += list(range(int(low), int(high) + 1)) if sep else [int(low)]
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a rank or a range like 8-11", ctx=ctx, param=param) from None
    return ranks


def parse_hosts(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """``algo-1,algo-2`` (or bare numbers: ``1,2``) -> ["algo-1", "algo-2"]."""
    if not value:
        return None
    return [f"algo-{h}" if h.isdigit() else h for h in (part.strip() for part in value.split(",")) if h]


def job_summary(job: ResolvedJob, job_name: str) -> str:
    spec = job.spec
    hosts = f"{spec.instance_count} host{'s' if spec.instance_count != 1 else ''}"
    gpus = spec.instance.gpus if spec.instance else 0
    per_host = job.scheduler_options.get("processes_per_host") or spec.distribution.mpi_processes_per_host
    if per_host:  # what runs, not what the instance type would have
        kind = f"{spec.instance_type}, {per_host} rank{'s' if per_host != 1 else ''} each"
    else:
        kind = f"{spec.instance_type}, {gpus} GPU{'s' if gpus != 1 else ''} each" if gpus else spec.instance_type
    launch = spec.distribution.launcher
    distribution = "one process per host (no distribution)" if launch == "none" else f"distribution {launch}"
    return f"{job_name} · {hosts} × {kind} · {distribution} · scheduler {job.scheduler}"
