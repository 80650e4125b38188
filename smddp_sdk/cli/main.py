"""The ``smddp-launch`` entry point: the command group, the ``smddp-launch job.yaml`` shorthand, and the
one place errors become messages and exit codes.

Exit codes (smddp_sdk.errors): 0 success; the root-cause rank's code (or 1) when the job fails; 2 a
spec or usage error; 3 something the job needs is unavailable; 130 interrupted. User errors print no
traceback unless ``--debug`` (or ``SMDDP_DEBUG=1``).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from smddp_sdk import __version__, launcher
from smddp_sdk.cli.output import Console
from smddp_sdk.cli.torchrun import underscores_as_dashes
from smddp_sdk.config.job_file import JobFileError
from smddp_sdk.config.yaml_io import YamlSyntaxError
from smddp_sdk.errors import EXIT_INTERRUPTED, EXIT_SPEC, SmddpError

PROG_NAME = "smddp-launch"
DEBUG_ENV = "SMDDP_DEBUG"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_JOB_FILE_SUFFIXES = (".yaml", ".yml", ".json")
_GLOBAL_FLAGS = ("--debug", "--version", "-h", "--help")


class LaunchGroup(click.Group):
    """Runs a job file given without a command, and turns every error into a message and exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, insert_default_command(args, self.commands))

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = "--debug" in argv[: argv.index("--")] if "--" in argv else "--debug" in argv
        debug = debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
        code = run_guarded(lambda: super(LaunchGroup, self).main(argv, prog_name or PROG_NAME, complete_var, standalone_mode=False, **extra), debug)
        if standalone_mode:
            sys.exit(code)
        return code


# Launcher flags a torchrun user may type after the script by habit: they reach the script (torchrun's
# rule, nothing is lost), and a warning says so, since the job then runs as if they had not been given.
_LAUNCHER_HABITS = ("--dryrun", "--detach", "--scheduler", "--hosts", "--nnodes", "--nproc-per-node", "--nproc-per-host", "--max-restarts",
                    "--standalone", "--instance-type", "--instance-count")


def script_mode(args: list[str], commands: dict[str, click.Command]) -> list[str] | None:
    """``smddp-launch [run] [options] train.py [script args]`` (the torchrun habit) as ``run`` arguments:
    the options before the script are ``run``'s (each with its value, so ``-e CFG=conf.py train.py`` runs
    train.py), the script is the first word that is no option or option value and ends in ``.py`` (or
    ``-m MODULE``), and everything after it is the script's. None when the command line is no such run."""
    leading, rest = _global_flags(args)
    if rest[:1] == ["run"]:
        rest = rest[1:]
    elif rest[:1] and rest[0] in commands:
        return None
    takes_value = _value_options()
    index = 0
    while index < len(rest):
        arg = rest[index]
        name = _option_name(arg)
        if arg == "--" or arg == "-":
            return None
        if name in ("-m", "--module"):
            cut = index + (1 if "=" in arg else 2)
            break
        if arg.startswith("-"):
            index += 2 if name in takes_value and "=" not in arg else 1
            continue
        if arg.endswith(_JOB_FILE_SUFFIXES) and index:
            return [*leading, "run", *rest]  # run's options before a job file: smddp-launch --nnodes 2 job.yaml
        if not arg.endswith(".py"):
            return None  # a job file first, or no script at all: click reads it
        cut = index + 1
        break
    else:
        return None
    after = rest[cut:]
    if habits := sorted({_option_name(arg) for arg in after} & set(_LAUNCHER_HABITS)):
        shown = " ".join(habits)
        click.echo(f"warning: {shown} after the script go{'es' if len(habits) == 1 else ''} to the script, as torchrun passes everything after the "
                   f"script to it; smddp-launch did not read {'it' if len(habits) == 1 else 'them'} and the job runs without: put launcher flags before the script", err=True)
    return [*leading, "run", *rest[:cut], "--", *after]


def _option_name(arg: str) -> str:
    """``--nproc_per_node=4`` -> ``--nproc-per-node`` (as ``run`` reads it); other words unchanged."""
    name = arg.partition("=")[0]
    return underscores_as_dashes(name) if name.startswith("--") else name


def _global_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """The group's own flags at the front (``--debug``, ``--color MODE``), and what follows them."""
    index = 0
    while index < len(args):
        if args[index] == "--debug" or args[index].startswith("--color="):
            index += 1
        elif args[index] == "--color":
            index += 2
        else:
            break
    return args[:index], args[index:]


def _value_options() -> set[str]:
    """Every spelling of ``run``'s options that takes a value."""
    from smddp_sdk.cli.cmd_run import run

    return {name for param in run.params if isinstance(param, click.Option) and not param.is_flag for name in (*param.opts, *param.secondary_opts)}


def insert_default_command(args: list[str], commands: dict[str, click.Command]) -> list[str]:
    """``smddp-launch job.yaml ...`` means ``smddp-launch run job.yaml ...``; ``smddp-launch train.py ...``
    runs the script (see ``script_mode``)."""
    scripted = script_mode(args, commands)
    if scripted is not None:
        return scripted
    for index, arg in enumerate(args):
        if arg in _GLOBAL_FLAGS or arg.startswith("--color"):
            continue
        if arg not in commands and not arg.startswith("-") and (arg.endswith(_JOB_FILE_SUFFIXES) or Path(arg).is_file()):
            return [*args[:index], "run", *args[index:]]
        return args  # a command, an option, "--" or anything else comes first
    return args


def run_guarded(call: Any, debug: bool) -> int:
    """Call the CLI; map each outcome to an exit code and print user errors without a traceback."""
    console = Console(os.environ.get("SMDDP_COLOR", "auto"))
    try:
        result = call()
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except (click.Abort, KeyboardInterrupt):
        console.say("Interrupted.")
        return EXIT_INTERRUPTED
    except (SmddpError, ModuleNotFoundError) as err:
        error = launcher.missing_package(err) if isinstance(err, ModuleNotFoundError) else err  # exit 3 for an optional package
        if error is None:
            raise
        if debug:
            traceback.print_exc()
        report_error(console, error)
        return error.exit_code
    except BrokenPipeError:  # `smddp-launch logs ... | head`
        sys.stderr.close()
        return 0
    return result if isinstance(result, int) else 0


def report_error(console: Console, err: SmddpError) -> None:
    if isinstance(err, YamlSyntaxError):
        console.say(err.render())
        console.say("1 problem found. Fix the YAML syntax first; the rest of the file is checked after that.")
    elif isinstance(err, JobFileError):
        for item in err.located:
            console.say(item.render())
        console.say(err.summary())
    else:
        console.error(str(err))
        if err.exit_code == EXIT_SPEC and not str(err):
            console.say("See smddp-launch --help.")


@click.group(PROG_NAME, cls=LaunchGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name=PROG_NAME)
@click.option("--debug", is_flag=True, help=f"Show the traceback behind every error. [env: {DEBUG_ENV}=1]")
@click.option("--color", "color_mode", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              envvar="SMDDP_COLOR", help="Colour: auto means only on a terminal; never in any mode when NO_COLOR is set.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, color_mode: str) -> None:
    """Run a distributed PyTorch job described once: locally as simulated hosts, in Docker, or on SageMaker.

    \b
    smddp-launch job.yaml                 run it and follow its logs (same as `run job.yaml`)
    smddp-launch --hosts 2 train.py       run a script on 2 simulated hosts, torchrun-style: torchrun's
                                          --nnodes, --nproc-per-node, --max-restarts, --standalone, -m
                                          and --rdzv-* go before it (`smddp-launch run --help` lists them)
    smddp-launch logs JOB --tail 20       a job by the name run printed (also status, cancel, metrics)
    smddp-launch run job.yaml --dryrun    show the resolved job and the exact request; start nothing
    smddp-launch init                     write a commented job.yaml to start from
    """
    ctx.obj = {"debug": debug, "console": Console(color_mode), "color_mode": color_mode}


def main() -> None:
    cli.main(prog_name=PROG_NAME)


def _register() -> None:
    from smddp_sdk.cli import cmd_drill, cmd_image, cmd_interrupt, cmd_jobs, cmd_metrics, cmd_plan, cmd_run, cmd_setup, cmd_stacks

    for module in (cmd_run, cmd_jobs, cmd_stacks, cmd_interrupt, cmd_drill, cmd_metrics, cmd_image, cmd_setup, cmd_plan):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()

if __name__ == "__main__":
    main()
