"""The Docker commands of docs/quickstart.md, run as written (tests/cli/test_quickstart.py runs the rest):
the image build and the example's job file with ``--scheduler docker``. Needs the engine (``-m docker``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_quickstart import COMMANDS, needs_docker, run_quickstart_command

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


@pytest.mark.parametrize("command", [command for command in COMMANDS if needs_docker(command)])
def test_every_docker_command_of_the_quickstart_runs(command: str, tmp_path: Path, smddp_image: str) -> None:
    done = run_quickstart_command(command, tmp_path)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    if "--scheduler docker" in command:
        assert "docker://" in done.stderr and "SUCCEEDED" in done.stderr
        assert "smddp: warning:" not in done.stdout + done.stderr
