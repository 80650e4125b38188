"""Every `smddp-launch` command shown in README.md and docs/ parses with the real command line, and the
ones that can run here do run, against a sandbox with a finished local job.

Commands are taken from fenced code lines that start with `smddp-launch` and from inline code spans that
do. Placeholders (`<job>`, `<handle>`, example job names) are replaced by the sandbox's job. Commands that
need AWS, a Docker engine or a whole training run are parsed only; each such kind is listed in
``PARSE_ONLY`` with the reason. docs/cli.md is generated from the parser itself and is skipped.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import click
import pytest

from smddp_sdk.cli.main import cli, insert_default_command

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]
JOB = "doc-job"
PLACEHOLDERS = {
    r"<job name>": JOB, r"<job>": JOB, r"<handle>": f"local://{JOB}", r"<scheduler>": "local",
    r"cnn-example-\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d-\d{3}": JOB, r"<your region's price>": "32.77",
}
# Commands that are parsed but not run here, and why.
PARSE_ONLY = {
    "sagemaker://": "needs AWS (covered with moto in tests/sagemaker)",
    "--scheduler sagemaker": "needs AWS (covered with moto in tests/sagemaker)",
    "docker://": "needs a Docker engine (tests/docker)",
    "--scheduler docker": "needs a Docker engine (tests/docker)",
    "slurm://": "needs a Slurm cluster (tests/slurm)",
    "--scheduler slurm": "needs a Slurm cluster (tests/slurm)",
    "image build": "builds the training image (minutes; tests/docker)",
    "--follow": "follows until the job ends (exercised in tests/cli/test_run_local.py)",
    "smddp-launch stacks": "needs a running job (exercised in tests/cli/test_hangs.py)",
    "interrupt ": "needs a running spot job (exercised in tests/faults/test_resume.py)",
    "smddp-launch drill": "runs the job several times (exercised in tests/faults/test_drill.py)",
}


def doc_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        in_code = False
        pending = ""  # a shell command continued with a trailing backslash
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            where = f"{page.relative_to(ROOT)}:{number}"
            stripped = line.strip().removeprefix("$ ")
            if in_code and (pending or stripped.startswith("smddp-launch ")):
                command = pending + stripped.split("  #")[0].split(" # ")[0].strip()
                if command.endswith("\\"):
                    pending = command[:-1] + " "
                    continue
                pending = ""
                found.append((where, command))
            elif not in_code:
                # a bare `smddp-launch <command>` in prose names the command: its --help must work
                found += [(where, span if " " in span.strip()[len("smddp-launch "):] else f"{span} --help")
                          for span in re.findall(r"`(smddp-launch [^`]*)`", line)]
    return found


COMMANDS = doc_commands()


def as_args(command: str) -> list[str]:
    for pattern, value in PLACEHOLDERS.items():
        command = re.sub(pattern, value, command)
    return shlex.split(command)[1:]


def parse(args: list[str]) -> None:
    """What `smddp-launch ARGS` parses to, without running it: raises click's usage errors."""
    args = insert_default_command(list(args), cli.commands)
    ctx = cli.make_context("smddp-launch", list(args))
    with ctx:
        rest = [*ctx._protected_args, *ctx.args] if hasattr(ctx, "_protected_args") else [*ctx.protected_args, *ctx.args]
        if not rest:
            return
        name, command, sub_args = cli.resolve_command(ctx, rest)
        assert command is not None, f"no command {name}"
        command.make_context(name or "", sub_args, parent=ctx).close()


def test_docs_show_commands() -> None:
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_documented_command_parses(where: str, command: str) -> None:
    try:
        parse(as_args(command))
    except click.exceptions.Exit:
        pass  # --help, --version
    except click.UsageError as err:
        pytest.fail(f"{where}: `{command}` does not parse: {err.format_message()}")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the examples, a job.yaml, and a finished local job named doc-job (one short epoch)."""
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("docs-sandbox") / "work"  # the job root lives beside it, not inside the code
    root.mkdir()
    shutil.copytree(ROOT / "examples", root / "examples")
    if (ROOT / "docs" / "data").is_dir():
        shutil.copytree(ROOT / "docs" / "data", root / "docs" / "data")  # inputs some pages' commands read
    shutil.copy(ROOT / "examples" / "cnn" / "job.yaml", root / "job.yaml")
    (root / "train.py").write_text("import os\nprint(f\"rank {os.environ['RANK']} loss 0.5\", flush=True)\n")
    patch = pytest.MonkeyPatch()
    patch.setenv("SMDDP_JOB_ROOT", str(root.parent / "jobs"))
    patch.setenv("HOME", str(root))
    patch.chdir(root)
    metrics = "metric_definitions=[{Name: loss, Regex: 'loss ([0-9.]+)'}]"
    done = CliRunner().invoke(cli, ["--job-name", JOB, "--set", metrics, "train.py"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    yield root
    patch.undo()


# `clean` runs last: it removes the sandbox's finished job that the other commands look at.
RUNNABLE = sorted(((where, command) for where, command in COMMANDS if not any(marker in command for marker in PARSE_ONLY)),
                  key=lambda item: item[1].startswith("smddp-launch clean"))


@pytest.mark.integration
@pytest.mark.parametrize(("where", "command"), RUNNABLE, ids=[where for where, _ in RUNNABLE])
def test_every_documented_command_that_can_run_here_runs(where: str, command: str, sandbox: Path) -> None:
    from click.testing import CliRunner

    args = as_args(command)
    if args and not args[0].startswith("-") and args[0] not in cli.commands and args[0].endswith((".yaml", ".yml")):
        args = [*args, "--dryrun"]  # a whole training run is exercised by tests/cli/test_example.py
    if args[:1] == ["run"] and "--dryrun" not in args:
        args.append("--dryrun")
    if args[:1] == ["init"]:
        args.append("--force")
    result = CliRunner().invoke(cli, args, catch_exceptions=False, env={"SMDDP_JOB_ROOT": str(sandbox.parent / "jobs")})
    assert result.exit_code == 0, f"{where}: `{command}` exited {result.exit_code}:\n{result.output}"
