"""``metrics``: a job's ``metric_definitions`` applied to its logs, printed or drawn."""

from __future__ import annotations

import json
from typing import Any

import click

from smddp_sdk.cli.cmd_jobs import JOB_HELP, job_argument, job_target, scheduler_option
from smddp_sdk.cli.common import console, parse_ranks
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.metrics import TrainingJobAnalytics, summary, write_csv, write_plot


def _definition(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[dict[str, str]]:
    out = []
    for value in values:
        name, sep, regex = value.partition("=")
        if not sep or not name or not regex:
            raise click.BadParameter(f"{value!r} is not NAME=REGEX, e.g. 'train:loss=loss ([0-9.]+)'", ctx=ctx, param=param)
        out.append({"Name": name, "Regex": regex})
    return out


@click.command(short_help="Print or plot a job's metrics.", epilog=JOB_HELP)
@job_argument
@scheduler_option
@click.option("-m", "--define", "defined", multiple=True, callback=_definition, metavar="NAME=REGEX", help="A metric definition; repeatable; added to (or replacing) the job's own metric_definitions.")
@click.option("--metric", "names", multiple=True, metavar="NAME", help="Only this metric; repeatable.")
@click.option("--plot", "plot", metavar="FILE", help="Draw the metrics into FILE: .svg (no extra package) or .png (needs matplotlib).")
@click.option("--all", "every", is_flag=True, help="Every value, not only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Every value as JSON (for scripts).")
@click.option("--csv", "csv_file", metavar="FILE", help="Every value into a CSV file (timestamp in seconds since the job's first line, metric_name, value, step, host, rank).")
@click.option("--rank", "ranks", callback=parse_ranks, metavar="RANKS", help="These ranks' values, e.g. 0,3 or 8-11 (default: rank 0, as v2 reads the first host).")
@click.option("--all-ranks", is_flag=True, help="Every rank's values (each rank its own series).")
@click.pass_context
def metrics(
    ctx: click.Context,
    job: str,
    options: list[tuple[str, str]],
    defined: list[dict[str, str]],
    names: tuple[str, ...],
    plot: str | None,
    every: bool,
    as_json: bool,
    csv_file: str | None,
    ranks: list[int] | None,
    all_ranks: bool,
) -> None:
    """Apply JOB's metric_definitions (regular expressions over its log lines, as SageMaker does; the first
    capture group is the value) and print each metric's count, last, min and max for rank 0 (or --rank,
    --all-ranks); `--plot loss.svg` draws them. Works for every scheduler. Exit 2 when nothing matched."""
    handle, scheduler, entry = job_target(job, options)
    own = list(entry.metric_definitions) if entry and entry.metric_definitions else _job_definitions(scheduler, handle)
    merged = {item["Name"]: dict(item) for item in own}
    merged.update({item["Name"]: item for item in defined})
    if not merged:
        raise SpecError(SpecIssue("metric_definitions", f"{handle} has no metric_definitions", "give some with -m NAME=REGEX, e.g. -m 'loss=loss ([0-9.]+)', or set metric_definitions in the job"))
    unknown = [name for name in names if name not in merged]
    if unknown:
        raise SpecError(SpecIssue("metric", f"no metric named {', '.join(unknown)}", f"this job defines {', '.join(merged)}"))
    if ranks and all_ranks:
        raise click.UsageError("give --rank or --all-ranks, not both")
    analytics = TrainingJobAnalytics(scheduler, handle, list(merged.values()), list(names) or None, ranks=None if all_ranks else (ranks or [0]))
    points = analytics.points()
    if not points:
        whose = "any rank's" if all_ranks else f"rank {','.join(map(str, ranks or [0]))}'s"
        raise SpecError(
            SpecIssue(
                "metric_definitions",
                f"no line of {whose} logs of {handle} matched {', '.join(d['Regex'] for d in analytics.metric_definitions if d['Name'] in analytics.metric_names)}",
                f"try the regex on a line from `smddp-launch logs {handle} --grep WORD`; other ranks: --rank N or --all-ranks",
            )
        )
    if csv_file:
        write_csv(analytics.rows(), csv_file)
        console(ctx).say(f"wrote {len(points)} values to {csv_file}")
    if plot:
        written = write_plot(points, plot, title=analytics.name)
        console(ctx).say(f"wrote {written}")
    if as_json:
        click.echo(json.dumps(analytics.rows(), indent=2))
        return
    if every:
        for row in analytics.rows():
            where = f"{row['host']}/rank{row['rank']}" if row["rank"] is not None else row["host"]
            click.echo(f"{row['metric_name']}\t{row['step']}\t{row['value']:.6g}\t{where}")
        return
    _print_summary(summary(points))


def _job_definitions(scheduler: Any, handle: Any) -> list[dict[str, str]]:
    from smddp_sdk.estimator import job_arguments

    spec = job_arguments(scheduler, handle) or {}
    return [dict(item) for item in spec.get("metric_definitions") or ()]


def _print_summary(rows: list[dict[str, Any]]) -> None:
    width = max(len("METRIC"), *(len(row["metric_name"]) for row in rows))
    click.echo(f"{'METRIC'.ljust(width)}  {'COUNT':>6}  {'LAST':>12}  {'MIN':>12}  {'MAX':>12}")
    for row in rows:
        click.echo(f"{row['metric_name'].ljust(width)}  {row['count']:>6}  {row['last']:>12.6g}  {row['min']:>12.6g}  {row['max']:>12.6g}")


COMMANDS = (metrics,)
