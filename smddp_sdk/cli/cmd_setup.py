"""Commands that need no job: ``init``, ``schema``, ``options``, ``env`` and ``completion``."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from smddp_sdk.cli.common import console, load_scheduler_class
from smddp_sdk.cli.params import DISTRIBUTIONS
from smddp_sdk.config.schema import SCHEMA_FILE_NAME, job_schema
from smddp_sdk.config.template import JobTemplate
from smddp_sdk.specs import instance_types, limits
from smddp_sdk.specs.status import SCHEDULER_NAMES

COMPLETE_VAR = "_SMDDP_LAUNCH_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


@click.command(short_help="Write a commented job.yaml to start from.")
@click.argument("path", default="job.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--entry-point", help="Training script. [default: train.py]")
@click.option("--source-dir", help="Directory shipped as the job's code.")
@click.option("--instance-type", type=click.Choice(sorted(instance_types.CATALOG)), metavar="TYPE", help="Host type. [default: ml.g5.2xlarge]")
@click.option("--instance-count", type=click.IntRange(*limits.BOUNDS["instance_count"][:2]), help="Number of hosts. [default: 2]")
@click.option("--distribution", type=click.Choice(list(DISTRIBUTIONS)), help="How ranks launch. [default: smddp]")
@click.option("--scheduler", type=click.Choice(SCHEDULER_NAMES), help="Where it runs. [default: local]")
@click.option("-y", "--yes", "--non-interactive", "non_interactive", is_flag=True, help="Ask nothing; use flags and defaults (automatic without a terminal).")
@click.option("--interactive", is_flag=True, help="Ask even without a terminal (notebooks, piped answers).")
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
@click.option("--no-schema", is_flag=True, help=f"Do not write {SCHEMA_FILE_NAME} next to PATH.")
@click.pass_context
def init(ctx: click.Context, path: Path, non_interactive: bool, interactive: bool, force: bool, no_schema: bool, **given: object) -> None:
    """Write PATH (default job.yaml): a commented job file, plus the JSON Schema editors use to check it.

    On a terminal it asks for the values not given as flags (plain prompts, so it also works in
    notebooks); without one, or with --yes, it uses the flags and defaults.
    """
    if path.exists() and not force:
        raise click.UsageError(f"{path} already exists; use --force to overwrite it or give another PATH")
    interactive = interactive or (not non_interactive and sys.stdin.isatty())
    start = JobTemplate(file_name=path.name)
    template = _ask(start, given) if interactive else _fill(start, given)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(template.render(), encoding="utf-8")
    out = console(ctx)
    out.say(f"Wrote {path}")
    if not no_schema:
        schema_path = path.parent / SCHEMA_FILE_NAME
        schema_path.write_text(json.dumps(job_schema(), indent=2) + "\n", encoding="utf-8")
        out.say(f"Wrote {schema_path} (editor completion and checks)")
    code_dir = path.parent / (template.source_dir or "")
    if not (code_dir / template.entry_point).exists():
        out.say(f"Next: create {code_dir / template.entry_point}, then run: smddp-launch {path}")
    else:
        out.say(f"Next: smddp-launch {path}")


def _fill(template: JobTemplate, given: dict[str, object]) -> JobTemplate:
    return replace(template, **{key: value for key, value in given.items() if value is not None})


def _ask(template: JobTemplate, given: dict[str, object]) -> JobTemplate:
    """Prompt (click.prompt: no raw-terminal menus) for every value not given as a flag."""
    template = _fill(template, given)
    prompts = {  # in the order asked: the text, and click.prompt's type
        "scheduler": ("Scheduler", {"type": click.Choice(SCHEDULER_NAMES)}),
        "entry_point": ("Training script", {}),
        "instance_type": ("Instance type", {"type": click.Choice(sorted(instance_types.CATALOG)), "show_choices": False}),
        "instance_count": ("Number of hosts", {"type": click.IntRange(*limits.BOUNDS["instance_count"][:2])}),
        "distribution": ("Distribution", {"type": click.Choice(list(DISTRIBUTIONS))}),
    }
    answers = {key: click.prompt(text, default=getattr(template, key), **kind) for key, (text, kind) in prompts.items() if given.get(key) is None}
    return _fill(template, answers)


@click.command(short_help="Print the job file's JSON Schema.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write it to this file instead of stdout.")
def schema(output: Path | None) -> None:
    """Print the JSON Schema (draft 2020-12) of job files, generated from the job spec.

    \b
    Point your editor at it, e.g. with the YAML language server:
      smddp-launch schema -o smddp-job.schema.json
      # yaml-language-server: $schema=smddp-job.schema.json   (first line of job.yaml)
    """
    text = json.dumps(job_schema(), indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


@click.command(short_help="List a scheduler's options.")
@click.argument("scheduler", type=click.Choice(SCHEDULER_NAMES))
def options(scheduler: str) -> None:
    """List the options SCHEDULER accepts in scheduler_options: (or -o KEY=VALUE), with defaults."""
    declared = list(load_scheduler_class(scheduler).options)
    settable = [option for option in declared if not option.code_only]
    if not settable:
        click.echo(f"The {scheduler} scheduler takes no options.")
        return
    header = ("OPTION", "TYPE", "DEFAULT", "DESCRIPTION")
    rows = [(option.name, option.type, repr(option.default), option.help) for option in settable]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        click.echo("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[3]]).rstrip())
    code_only = [option.name for option in declared if option.code_only]
    if code_only:
        click.echo(f"\nFor Python callers only (objects, not YAML values): {', '.join(code_only)}")


@click.command(short_help="Show versions and what is available here (for bug reports).")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def env(as_json: bool) -> None:
    """Show smddp-sdk, Python and library versions, the Docker engine, GPUs, and whether AWS
    credentials are present. Credentials themselves are never printed."""
    from smddp_sdk.cli import envinfo  # probes docker and GPUs; loaded only for this command

    facts = envinfo.collect()
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    width = max(len(name) for name in facts)
    for name, value in facts.items():
        click.echo(f"{name.ljust(width)}  {value}")


@click.command(short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL. Enable it with one line in your shell's rc file:

    \b
      bash: eval "$(smddp-launch completion bash)"
      zsh:  eval "$(smddp-launch completion zsh)"
      fish: smddp-launch completion fish | source
    """
    completion_class = get_completion_class(shell)
    assert completion_class is not None  # click ships all three
    root = ctx.find_root().command
    click.echo(completion_class(root, {}, "smddp-launch", COMPLETE_VAR).source())


COMMANDS = (init, schema, options, env, completion)
