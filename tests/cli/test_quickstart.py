"""Every command of docs/quickstart.md, run as a user would from the checkout: one job file from local
mode to Docker to a SageMaker dry run. The local and dry-run commands run here; the Docker ones in
tests/docker/test_docker_quickstart.py (``-m docker``), through ``run_quickstart_command``.

Commands are the lines of the page's ```bash blocks. They run as written, with two changes said here:
training runs get one short epoch (``SHORTER``), and ``smddp-launch`` is this checkout's command line
(a shim on PATH running ``python -m smddp_sdk.cli``, what ``pip install -e .`` would install), so the
install line and the virtual environment's are not run (``NOT_RUN``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
SHORTER = {
    "bash scripts/run-example.sh": "--epochs 1 --samples 512",
    "smddp-launch examples/cnn/job.yaml": "-H epochs=1 -H samples=512",
    "smddp-launch examples/cnn/job.yaml --scheduler docker": "-H epochs=1 -H samples=512",
}
NOT_RUN = {
    "pip install -e .": "it would install into the tests' own Python; a shim gives the same smddp-launch",
    "python3 -m venv .venv": "a virtual environment in the checkout; the tests' own Python stands in for it",
    "source .venv/bin/activate": "as above",
}
DOCKER = ("--scheduler docker", "smddp-launch image build")


def quickstart_commands() -> list[str]:
    """The lines of the page's ```bash blocks, comments left out."""
    commands, in_bash = [], False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_bash = line == "```bash"
            continue
        command = line.split(" #")[0].strip()
        if in_bash and command:
            commands.append(command)
    return commands


def needs_docker(command: str) -> bool:
    return any(marker in command for marker in DOCKER)


def run_quickstart_command(command: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run one command from the checkout as a new user with no AWS set up, HOME and job root in ``home``."""
    shims = home / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    (shims / "smddp-launch").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m smddp_sdk.cli "$@"\n')
    (shims / "smddp-launch").chmod(0o755)
    if not (shims / "python3").exists():
        (shims / "python3").symlink_to(sys.executable)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SMDDP_", "AWS_", "NO_COLOR"))}
    env.update(
        {
            "PATH": f"{shims}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "HOME": str(home),
            "SMDDP_JOB_ROOT": str(home / "jobs"),
            "SMDDP_CONFIG": "",
            "AWS_CONFIG_FILE": str(home / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    line = f"{command} {SHORTER[command]}" if command in SHORTER else command
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


COMMANDS = quickstart_commands()
HERE = [command for command in COMMANDS if not needs_docker(command) and command not in NOT_RUN]


def test_the_quickstart_goes_from_local_to_docker_to_a_sagemaker_dry_run() -> None:
    assert "smddp-launch examples/cnn/job.yaml" in COMMANDS
    assert "smddp-launch examples/cnn/job.yaml --scheduler docker" in COMMANDS
    assert "smddp-launch examples/cnn/job.yaml --scheduler sagemaker --dryrun" in COMMANDS
    assert set(NOT_RUN) <= set(COMMANDS), "a command left unrun is no longer on the page"


@pytest.mark.integration
@pytest.mark.timeout(900)  # a short training run, on a machine that may be busy
@pytest.mark.parametrize("command", HERE)
def test_every_quickstart_command_runs_here(command: str, tmp_path: Path) -> None:
    done = run_quickstart_command(command, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output
    if command.startswith("bash scripts/run-example.sh"):
        assert "holds model.pt" in done.stdout.splitlines()[-1]
    elif command == "smddp-launch examples/cnn/job.yaml":
        assert "SUCCEEDED" in done.stderr
        # Routine settings of a job file that also runs on SageMaker: one line counting them, no warnings.
        assert "smddp: warning:" not in output
        assert "fidelity notes on how this local run differs from SageMaker" in done.stderr
    elif "--scheduler sagemaker --dryrun" in command:
        # Without credentials, role or region: the request with placeholders, each said.
        assert '"RoleArn": "arn:aws:iam::<account-id>:role/<execution-role>"' in done.stdout
        said = done.stdout if command.startswith("smddp-launch") else done.stderr
        for placeholder in ("placeholder: region us-east-1", "placeholder: role arn:aws:iam::<account-id>:role/<execution-role>", "placeholder: <account-id>"):
            assert placeholder in said, placeholder
