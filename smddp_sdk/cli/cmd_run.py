"""``run`` (the default command) and ``validate``."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from smddp_sdk import launcher
from smddp_sdk.cli import torchrun
from smddp_sdk.cli.common import build_scheduler, console, job_summary, parse_hosts, parse_ranks, plan_job, resolve_from_cli
from smddp_sdk.cli.output import Console, color_enabled, render_resolved
from smddp_sdk.cli.params import OUTPUT_GROUP, GroupedOption, JobCommand, job_options
from smddp_sdk.config.job_file import JobFileError, LocatedIssue, ResolvedJob
from smddp_sdk.config.layers import Source
from smddp_sdk.config.yaml_io import YamlSyntaxError
from smddp_sdk.errors import EXIT_INTERRUPTED, JobFailedError, SpecError, SpecIssue, UnavailableError
from smddp_sdk.schedulers import scheduler_class
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import script_hint
from smddp_sdk.specs.status import JobHandle, JobStatus


def complete_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


RUN_EPILOG = """\b
Examples:
  smddp-launch job.yaml
  smddp-launch run job.yaml --dryrun
  smddp-launch run job.yaml --instance-count 4 -H epochs=3 -- --lr 0.1
  smddp-launch run job.yaml --scheduler sagemaker --detach
  smddp-launch --hosts 2 --nproc-per-host 2 train.py --epochs 3   # a script, torchrun-style
\b
After a script, every argument reaches it untouched (torchrun's rule; launcher options go before the
script, a warning names those typed after it). The code is the script's working directory, as under
torchrun: the current directory when the script lies in it, else the script's own (--source-dir names
another); the dry run says what ships and how big, and over 100 MB or 10000 files is refused. After a
job file, arguments after -- are hyperparameters: --name value pairs, values read as YAML as -H reads
them.
Precedence: defaults < user config < job file < SMDDP_* variables < flags; --dryrun shows each
value's source."""


@click.command(cls=JobCommand, epilog=RUN_EPILOG, short_help="Run a job and follow its logs (the default command).",
               context_settings={"token_normalize_func": torchrun.underscores_as_dashes})
@click.argument("job_file", required=False, metavar="[JOB_FILE]", shell_complete=complete_files)
@job_options
@torchrun.torchrun_options
@click.option("--dryrun", is_flag=True, cls=GroupedOption, help_group=OUTPUT_GROUP, help="Print the resolved job and the exact request on stdout; start nothing.")
@click.option("--as", "as_api", type=click.Choice(("v2", "v3")), cls=GroupedOption, help_group=OUTPUT_GROUP,
              help="With --dryrun: the request as that SageMaker SDK sends it, and the job written as its launcher (v2 PyTorch, v3 ModelTrainer).")
@click.option("-d", "--detach", is_flag=True, cls=GroupedOption, help_group=OUTPUT_GROUP, help="Return after submitting: the handle on stdout, next steps on stderr.")
@click.option("--rank", "ranks", callback=parse_ranks, metavar="RANKS", cls=GroupedOption, help_group=OUTPUT_GROUP, help="Show only these ranks' logs, e.g. 0,3 or 8-11 (files keep all).")
@click.option("--host", "hosts", callback=parse_hosts, metavar="HOSTS", cls=GroupedOption, help_group=OUTPUT_GROUP, help="Show only these hosts' logs, e.g. algo-2 or 1,2.")
@click.pass_context
def run(ctx: click.Context, job_file: str | None, dryrun: bool, as_api: str | None, detach: bool, ranks: list[int] | None, hosts: list[str] | None, **params: Any) -> None:
    """Run JOB_FILE (a job.yaml, or a training script: `smddp-launch train.py --lr 0.1`) and follow its
    logs until it ends; then print its status, duration, model location and the commands to look again.

    Everything is validated first: nothing is packaged, uploaded or started while any problem is left.
    Exit code: 0 on success, 1 when the job fails (the failing rank's own code is in the summary),
    2 for a bad job or command line, 3 when something needed is unavailable, 130 when interrupted.
    """
    out = console(ctx)
    for note in torchrun.apply_torchrun_flags(params):
        out.say(f"note: {note}")
    job_file = script_defaults(ctx, job_file, params)
    if as_api and not dryrun:
        raise click.UsageError("--as goes with --dryrun; to run a job as the other API, set api: v2 or v3 in its job file")
    job, scheduler, plan = prepare(ctx, out, job_file, params, as_api)
    code = shipped_code(ctx, job, scheduler)
    if dryrun:
        click.echo(render_dryrun(job, plan, code))
        if as_api:
            from smddp_sdk.train.forms import written_as

            launcher_code = written_as(job.spec, plan, processes_per_host=job.scheduler_options.get("processes_per_host"))
            click.echo(f"=== AS {as_api.upper()} LAUNCHER ===\n{launcher_code}")
        return
    if code is not None:
        out.say(f"Code: {code.describe()}")
    # The scheduler may print its own progress (packaging, uploads), so this stage takes two lines.
    out.say(f"{out.mark('⚙', fg='cyan')}Submitting to {job.scheduler}")
    # Attached local jobs end with this process; detached ones (and remote ones) outlive it.
    handle = launcher.schedule(scheduler, plan, attached=not detach)
    out.say(f"{out.mark('✓', fg='green')}Submitted {handle}")
    if detach:
        click.echo(str(handle))
        out.next_steps(handle)
        return
    ctx.exit(follow_job(ctx, out, scheduler, handle, hosts=hosts, ranks=ranks))


def script_defaults(ctx: click.Context, job_file: str | None, params: dict[str, Any]) -> str | None:
    """``run train.py`` (or ``run -m pkg.train``), torchrun-style: the script is the entry point and its
    working directory the code (``torchrun.code_dir_for``: the current directory when the script lies in
    it, else the script's; ``--source-dir`` names another). Unless flags say otherwise it runs here
    (instance_type local) with torch_distributed, as torchrun would, and the arguments after it reach it
    untouched (torchrun's rule). Returns the job file left to read (None for a script)."""
    module = params.pop("module", None)
    if module is not None and job_file is not None:
        raise click.UsageError(f"-m {module} runs a module; {job_file!r} is a second thing to run: give one of them")
    if module is None and (job_file is None or not job_file.endswith(".py")):
        return job_file
    if job_file is not None and not Path(job_file).is_file():
        script = Path(job_file)
        raise SpecError(SpecIssue("entry_point", f"script {job_file!r} does not exist", script_hint(script.resolve()) or "give the path of a training script, or a job.yaml"))
    if params.get("source_dir"):
        code_dir = Path(params["source_dir"]).resolve()
    else:
        code_dir, reason = (Path.cwd().resolve(), "the current directory") if module else torchrun.code_dir_for(Path(job_file or ""))
        params["source_dir"] = str(code_dir)
        ctx.meta["implicit_code_dir"] = reason  # measured and size-checked once the scheduler is known
    if module is not None:
        params["entry_point"] = params.get("entry_point") or torchrun.module_file(module, code_dir)
        params["environment"] = [*params.get("environment", ()), (contract.ENTRY_MODULE_ENV, module)]
    else:
        script = Path(job_file or "").resolve()
        if code_dir not in script.parents:
            raise SpecError(SpecIssue("source_dir", f"the script {job_file} is not inside --source-dir {params['source_dir']}", "give a --source-dir that holds the script"))
        params["entry_point"] = params.get("entry_point") or script.relative_to(code_dir).as_posix()
    params["instance_type"] = params.get("instance_type") or "local"
    params["distribution_kind"] = params.get("distribution_kind") or "torch_distributed"
    params["base_job_name"] = params.get("base_job_name") or Path(params["entry_point"]).stem.replace("_", "-").strip("-") or "module"
    script_args = ctx.meta.pop("script_args", [])
    if script_args:
        params["environment"] = [*params.get("environment", ()), (contract.SCRIPT_ARGS_ENV, json.dumps(script_args))]
    return None


def shipped_code(ctx: click.Context, job: ResolvedJob, scheduler: Scheduler) -> torchrun.CodeDir | None:
    """The code directory a torchrun-style run chose itself, measured and refused when too big (None
    when the job file or --source-dir named it)."""
    reason = ctx.meta.get("implicit_code_dir")
    if reason is None or not job.spec.source_dir:
        return None
    job_root = getattr(scheduler, "job_root", None)
    code = torchrun.measure(Path(job.spec.source_dir), reason, Path(job_root) if job_root else None)
    torchrun.check_size(code)
    return code


@click.command(cls=JobCommand, short_help="Check a job file without running it.")
@click.argument("job_file", required=False, metavar="[JOB_FILE]", shell_complete=complete_files)
@job_options
@click.option("--json", "as_json", is_flag=True, cls=GroupedOption, help_group=OUTPUT_GROUP, help="Print the result as JSON on stdout (problems with file, line and column), for editors and CI.")
@click.pass_context
def validate(ctx: click.Context, job_file: str | None, as_json: bool, **params: Any) -> None:
    """Check JOB_FILE and the settings that apply to it; list every problem (exit 2) or print a summary.

    The same checks run before every `run`; this starts nothing and needs no network.
    """
    try:
        job = checked_job(ctx, job_file, params)
    except SpecError as err:
        if not as_json:
            raise
        click.echo(json.dumps({"valid": False, "problems": problems_as_json(err)}, indent=2))
        ctx.exit(err.exit_code)
    name = job.spec.job_name or f"{job.spec.base_job_name or 'pytorch-training'}-<timestamp>"
    if as_json:
        click.echo(json.dumps({"valid": True, "job_name": name, "scheduler": job.scheduler, "spec": job.spec.as_dict()}, indent=2, default=str))
        return
    click.echo(f"{job_file or 'job'}: valid · {job_summary(job, name)}")


def checked_job(ctx: click.Context, job_file: str | None, params: dict[str, Any]) -> ResolvedJob:
    """The resolved job, also checked by its scheduler when that scheduler is installed."""
    job = resolve_from_cli(ctx, job_file, params)
    try:
        plan_job(job, build_scheduler(job.scheduler, job.scheduler_options, job))
    except UnavailableError as err:  # the spec is still checked; say what could not be
        console(ctx).say(f"note: {job.scheduler} scheduler checks skipped: {err}")
    return job


def problems_as_json(err: SpecError) -> list[dict[str, Any]]:
    if isinstance(err, YamlSyntaxError):
        return [{"file": err.name, "line": err.mark.line, "column": err.mark.column, "source": None, "path": "", "message": f"YAML syntax error: {err.problem}", "hint": ""}]
    located = err.located if isinstance(err, JobFileError) else [LocatedIssue("", issue) for issue in err.issues]
    return [_problem(item) for item in located]


def _problem(item: LocatedIssue) -> dict[str, Any]:
    file = item.where.rsplit(":", 2)[0] if item.mark else None
    return {
        "file": file,
        "line": item.mark.line if item.mark else None,
        "column": item.mark.column if item.mark else None,
        "source": None if item.mark else (item.where or None),
        "path": item.issue.path,
        "message": item.issue.message,
        "hint": item.issue.hint,
    }


def prepare(ctx: click.Context, out: Console, job_file: str | None, params: dict[str, Any], api: str | None = None) -> tuple[ResolvedJob, Scheduler, DryRun]:
    """Resolve and validate the job (as the SageMaker SDK ``api`` would send it, when given), build its
    scheduler and compute the (pure) dryrun."""
    with out.stage(f"Validating {job_file or 'job'}"):
        job = resolve_from_cli(ctx, job_file, params)
        scheduler = build_scheduler(job.scheduler, job.scheduler_options, job)
        plan = plan_job(job, scheduler)
        if api and api != job.spec.api:  # v3 needs the image v2 resolved from framework_version
            request = plan.request if isinstance(plan.request, dict) else {}
            image = job.spec.image_uri or request.get("AlgorithmSpecification", {}).get("TrainingImage")
            sources = {**job.sources, "api": Source("flag", "--as")}
            job = dataclasses.replace(job, spec=job.spec.replace(api=api, image_uri=image), sources=sources)
            plan = plan_job(job, scheduler)
    out.say(f"{out.mark('⚙', fg='cyan')}Job {job_summary(job, plan.job_name)}")
    return job, scheduler, plan


def render_dryrun(job: ResolvedJob, plan: DryRun, code: torchrun.CodeDir | None = None) -> str:
    parts = ["=== JOB ===", render_resolved(job, plan.job_name), f"=== REQUEST ({plan.scheduler}) ===", plan.render()]
    shipped = [f"code: {code.describe()} ships as the job's code, the script runs there as torchrun runs it from here"] if code else []
    notes = [*shipped, *plan.notes, *dryrun_only_notes(job)]
    if notes:
        parts += ["=== NOTES ===", *[f"- {note}" for note in notes]]
    return "\n".join(parts)


def dryrun_only_notes(job: ResolvedJob) -> list[str]:
    """Differences from SageMaker worth one line in the dry run, but no warning on every run."""
    count = len(job.spec.metric_definitions)
    if not count or job.scheduler == "sagemaker":
        return []
    return [f"metric_definitions ({count}) are not scraped into CloudWatch here; `smddp-launch metrics <job>` and training_job_analytics read them from the logs, as on SageMaker"]


def follow_job(ctx: click.Context, out: Console, scheduler: Scheduler, handle: JobHandle, *, hosts: list[str] | None, ranks: list[int] | None) -> int:
    """Stream the job's logs until it ends; print the failure summary; return the exit code.

    Ctrl-C cancels local and docker jobs first; remote jobs keep running and the reattach command is shown.
    """
    stdout = click.get_text_stream("stdout")
    color = color_enabled(stdout, (ctx.find_root().obj or {}).get("color_mode", "auto"))
    started = time.monotonic()
    try:
        status: JobStatus = launcher.follow(
            scheduler, handle, out=stdout, hosts=hosts, ranks=ranks, color=color, before_first_line=out.progress(f"Starting {handle}: hosts, then ranks (importing torch)")
        )
    except KeyboardInterrupt:
        interrupted(out, scheduler, handle)
        return EXIT_INTERRUPTED
    try:
        launcher.raise_for_status(status)
    except JobFailedError as err:
        out.say(launcher.failure_summary(status))
        return err.exit_code
    first, *rest = launcher.end_summary(status, time.monotonic() - started)
    out.say(f"{out.mark('✓', fg='green')}{first}")
    for line in rest:
        out.say(line)
    return 0


def interrupted(out: Console, scheduler: Scheduler, handle: JobHandle) -> None:
    out.say("")
    if scheduler_class(handle.scheduler).capabilities.cancel_on_interrupt:
        with out.stage(f"Interrupted: cancelling {handle}"):
            scheduler.cancel(handle)
        return
    out.say(f"Interrupted. The job keeps running on {handle.scheduler}:")
    out.say(f"  smddp-launch logs {handle} --follow    # reattach")
    out.say(f"  smddp-launch cancel {handle}           # stop it")


COMMANDS = (run, validate)
