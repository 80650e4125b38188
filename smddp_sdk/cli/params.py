"""Shared click parameters: the job flags (the top of the precedence order), grouped help, and the
``--`` split that hands the rest of the command line to the training script."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from smddp_sdk.config.layers import ENV_PREFIX, Layer, Source, parse_setting
from smddp_sdk.specs.status import SCHEDULER_NAMES

F = TypeVar("F", bound=Callable[..., Any])

JOB_GROUP = "Job settings (override the job file, the user config and SMDDP_* variables)"
SCHEDULER_GROUP = "Scheduler"
OUTPUT_GROUP = "Output"

DISTRIBUTIONS: dict[str, dict[str, Any] | None] = {
    "smddp": {"smdistributed": {"dataparallel": {"enabled": True}}},
    "torch_distributed": {"torch_distributed": {"enabled": True}},
    "mpi": {"mpi": {"enabled": True}},
    "none": None,
}

# Job fields with a flag of their own: field -> (click type, help). Everything else: --set field=value.
FIELD_FLAGS: dict[str, tuple[Any, str]] = {
    "entry_point": (str, "Training script (relative to --source-dir when set)."),
    "source_dir": (str, "Directory packaged as the job's code."),
    "instance_type": (str, "local, local_gpu or an ml.* type."),
    "instance_count": (int, "Number of hosts."),  # bounds: the spec's (limits.BOUNDS), reported with the rest
    "role": (str, "IAM role ARN (SageMaker)."),
    "image_uri": (str, "Training image."),
    "output_path": (str, "Where model and output archives go."),
    "job_name": (str, "Exact job name."),
    "base_job_name": (str, "Prefix of generated job names."),
    "max_run": (int, "Seconds the job may run."),
}


class GroupedOption(click.Option):
    """An option shown under a titled section of ``--help``."""

    def __init__(self, *args: Any, help_group: str = "Options", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_group = help_group


class JobCommand(click.Command):
    """A command with sectioned help that keeps everything after ``--`` for the training script."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["script_args"] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(getattr(param, "help_group", "Options"), []).append(record)
        for title, records in sections.items():
            with formatter.section(title):
                formatter.write_dl(records)


def key_value(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[tuple[str, str]]:
    """Check ``KEY=VALUE`` arguments; a usage error (exit 2) names the bad one."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx, param=param)
        pairs.append((key, value))
    return pairs


def _option(*names: str, group: str, **kwargs: Any) -> Callable[[F], F]:
    return click.option(*names, cls=GroupedOption, help_group=group, **kwargs)


def job_options(func: F) -> F:
    """The flags that set job values; applied in this order: fields, --set, -H, -e, -i, --distribution."""
    decorators: list[Callable[[F], F]] = [
        _option(
            "--scheduler", group=SCHEDULER_GROUP, type=click.Choice(SCHEDULER_NAMES), help=f"Where to run (default: local for local* instance types, else sagemaker). [env: {ENV_PREFIX}SCHEDULER]"
        ),
        _option(
            "-o",
            "--scheduler-option",
            "scheduler_option",
            group=SCHEDULER_GROUP,
            multiple=True,
            metavar="KEY=VALUE",
            callback=key_value,
            help="A scheduler option (value read as YAML); repeatable. List them with `smddp-launch options SCHEDULER`.",
        ),
    ]
    for name, (click_type, help_text) in FIELD_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        decorators.append(_option(flag, name, group=JOB_GROUP, type=click_type, help=f"{help_text} [env: {ENV_PREFIX}{name.upper()}]"))
    decorators += [
        _option("--distribution", "distribution_kind", group=JOB_GROUP, type=click.Choice(list(DISTRIBUTIONS)), help="Shorthand for the distribution mapping (smddp = smdistributed dataparallel)."),
        _option("-H", "--hyperparameter", "hyperparameter", group=JOB_GROUP, multiple=True, metavar="KEY=VALUE", callback=key_value, help="A hyperparameter (value read as YAML); repeatable."),
        _option("-e", "--env", "environment", group=JOB_GROUP, multiple=True, metavar="KEY=VALUE", callback=key_value, help="An environment variable for every rank; repeatable."),
        _option("-i", "--input", "channel", group=JOB_GROUP, multiple=True, metavar="CHANNEL=URI", callback=key_value, help="A data channel: s3:// URI, file:// URI or local path; repeatable."),
        _option(
            "--set",
            "settings",
            group=JOB_GROUP,
            multiple=True,
            metavar="FIELD=VALUE",
            callback=key_value,
            help="Any job field, dotted for nested keys (value read as YAML), e.g. --set distribution.mpi.processes_per_host=2.",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def flags_layer(params: dict[str, Any], script_args: Sequence[str], cwd: Path) -> Layer:
    """The flags as the top settings layer, each value remembering the flag that set it."""
    layer = Layer()

    def flag(label: str) -> Source:
        return Source("flag", label, base_dir=cwd)

    if params.get("scheduler"):
        layer.patch(("scheduler",), params["scheduler"], flag("--scheduler"))
    for key, raw in params.get("scheduler_option", ()):
        layer.patch(("scheduler_options", key), yaml_value(f"-o {key}", raw), flag(f"-o {key}"))
    for name in FIELD_FLAGS:
        if params.get(name) is not None:
            layer.patch((name,), params[name], flag("--" + name.replace("_", "-")))
    for dotted, raw in params.get("settings", ()):
        if "[" in dotted:
            raise click.BadParameter(f"{dotted}: --set does not index into lists; set the whole list, e.g. --set 'tags=[{{Key: team, Value: ml}}]'", param_hint="'--set'")
        path = tuple(dotted.split("."))
        value, problem = parse_setting(dotted, raw)
        if problem:
            raise click.BadParameter(f"{dotted}={raw}: {problem}", param_hint="'--set'")
        layer.patch(path, value, flag(f"--set {dotted}"))
    if params.get("distribution_kind"):
        layer.patch(("distribution",), DISTRIBUTIONS[params["distribution_kind"]], flag("--distribution"))
    for key, raw in params.get("hyperparameter", ()):
        layer.patch(("hyperparameters", key), yaml_value(f"-H {key}", raw), flag(f"-H {key}"))
    for key, value in params.get("environment", ()):
        layer.patch(("environment", key), value, flag(f"-e {key}"))
    for channel, uri in params.get("channel", ()):
        layer.patch(("inputs", channel), uri, flag(f"-i {channel}"))
    for key, raw in script_hyperparameters(script_args):
        layer.patch(("hyperparameters", key), yaml_value(f"-- --{key}", raw), Source("args", "after --", base_dir=cwd))
    return layer


def script_hyperparameters(args: Sequence[str]) -> list[tuple[str, str]]:
    """``--epochs 3 --lr=0.1`` after a job file's ``--`` -> [("epochs", "3"), ("lr", "0.1")]: SageMaker hands
    hyperparameters to the script as ``--name value`` pairs, so that is the form they take here; the values
    are read as YAML, as ``-H`` reads them. (After a script, arguments go to it untouched instead.)"""
    pairs: list[tuple[str, str]] = []
    words = iter(args)
    for arg in words:
        if not arg.startswith("--") or arg == "--":
            raise click.UsageError(
                f"argument {arg!r} after the job file's -- is not a --name: they become hyperparameters, which reach the "
                "script as --name value pairs; write --name VALUE, or run the script directly "
                "(smddp-launch [options] train.py ARGS...) to pass arguments untouched"
            )
        name, sep, value = arg[2:].partition("=")
        if not sep:
            value = next(words, "--")  # none left reads as the next --name: no value
            if value.startswith("--"):
                raise click.UsageError(
                    f"argument {arg!r} after the job file's -- has no value: hyperparameters are --name value pairs; write "
                    f"{arg} true, or run the script directly (smddp-launch [options] train.py {arg}) to pass it untouched"
                )
        pairs.append((name, value))
    return pairs


def yaml_value(label: str, raw: str) -> Any:
    """A flag value read as YAML (``3`` is a number, ``true`` a flag); an empty value stays ""."""
    if raw == "":
        return ""
    value, problem = parse_setting("", raw)
    if problem:
        raise click.BadParameter(f"{label}={raw}: {problem}")
    return value
