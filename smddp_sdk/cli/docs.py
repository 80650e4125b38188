"""The command reference page (docs/cli.md), rendered from the click commands' own help.

``scripts/gen_docs.py`` writes it; a test checks the committed page equals this output.
"""

from __future__ import annotations

import click

from smddp_sdk.config.docs import GENERATED_NOTE
from smddp_sdk.config.layers import CONFIG_ENV, ENV_PREFIX

HELP_WIDTH = 100


def cli_reference(root: click.Group) -> str:
    settings = {**root.context_settings, "max_content_width": HELP_WIDTH, "terminal_width": HELP_WIDTH}
    root_ctx = click.Context(root, info_name="smddp-launch", **settings)
    sections = ["# smddp-launch command reference", GENERATED_NOTE, _INTRO, "## smddp-launch", _help_block(root, root_ctx)]
    for name in _command_order(root):
        command = root.commands[name]
        ctx = click.Context(command, info_name=name, parent=root_ctx, terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH)
        sections += [f"## smddp-launch {name}", _help_block(command, ctx)]
    sections.append(_ENVIRONMENT)
    return "\n\n".join(sections) + "\n"


def _command_order(root: click.Group) -> list[str]:
    first = ["run", "validate", "status", "logs", "cancel", "list"]
    return [name for name in first if name in root.commands] + sorted(set(root.commands) - set(first))


def _help_block(command: click.Command, ctx: click.Context) -> str:
    return "```text\n" + command.get_help(ctx).rstrip() + "\n```"


_INTRO = f"""\
`smddp-launch` runs a job described in a job file ([job-file.md](job-file.md)) locally as simulated
hosts, in Docker, or on SageMaker, and then follows it: `status`, `logs`, `cancel`, `list`.
`smddp-launch job.yaml` is short for `smddp-launch run job.yaml`.

Exit codes ([exit-codes.md](exit-codes.md)): 0 success; 1 when the job fails (the root-cause rank's
own code is in the summary and in `status`); 2 a bad job file or command line (every problem listed, compiler style, no traceback unless
`--debug`); 3 something needed is unavailable (a Docker engine, AWS credentials, a scheduler's package);
130 interrupted (Ctrl-C cancels local and docker jobs first; SageMaker jobs keep running and the command
to reattach is printed).

Output: results (the handle after `--detach`, `--dryrun`'s job and request, logs, `status`) go to
stdout; stage lines, next steps, problems and the failure summary go to stderr. Colour is used only on a
terminal and never when `NO_COLOR` is set.

Arguments, torchrun's rule: `smddp-launch [launcher options] train.py [script args...]`. Launcher
options go before the script; everything after it reaches the script untouched, in order (flags
without values, positionals, even `--dryrun`). After a job file, `run job.yaml -- --lr 0.1` sets
hyperparameters instead (`--name value` pairs, as SageMaker passes them). torchrun's own launcher
options work there too: `--nnodes`/`--hosts`, `--nproc-per-node`/`--nproc-per-host` and
`--max-restarts N` (the job's retry policy, the same on local, docker and Slurm: `max_retry_attempts=N`
and `retry_script_errors`, so the script's own failures are retried too; `--max-restarts 0` sets none;
SageMaker refuses it, as it retries only its own failures).

Hyperparameter values follow one typing rule however they are given (job file, `-H`, after a job
file's `--`, `{ENV_PREFIX}HYPERPARAMETERS`): read as YAML, so `3` is a number, `0.1` a float, `true` a
boolean, anything else a string; quote to keep a string (`-H "tag='3'"`). The script sees them as
`--name value` arguments and typed in `SM_HPS` / `hyperparameters.json`.

Shell completion: `eval "$(smddp-launch completion bash)"` (or `zsh`; `smddp-launch completion fish | source`)."""

_ENVIRONMENT = f"""\
## Environment variables

| Variable | Effect |
|---|---|
| `{ENV_PREFIX}<KEY>` | any job-file key, e.g. `{ENV_PREFIX}INSTANCE_COUNT=4`, `{ENV_PREFIX}HYPERPARAMETERS='{{lr: 0.1}}'`; above the job file, below flags |
| `{CONFIG_ENV}` | the user config file (default `~/.config/smddp/config.yaml`); empty turns it off |
| `{ENV_PREFIX}DEBUG=1` | same as `--debug`: tracebacks for every error |
| `{ENV_PREFIX}COLOR` | same as `--color`: `auto`, `always` or `never` |
| `NO_COLOR` | no colour in any output |
| `{ENV_PREFIX}JOB_ROOT` | where the local scheduler keeps its jobs (default `~/.smddp/jobs`) |"""
