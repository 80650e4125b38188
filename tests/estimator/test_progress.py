"""Progress: bars on a terminal (or SMDDP_PROGRESS=1), plain start/end lines when piped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_DOCKER = """#!/bin/sh
# a docker CLI stand-in: `pull` prints the layer lines the real one prints
echo "latest: Pulling from library/python"
echo "aaaaaaaaaaaa: Pulling fs layer"
echo "bbbbbbbbbbbb: Pulling fs layer"
echo "aaaaaaaaaaaa: Pull complete"
echo "bbbbbbbbbbbb: Already exists"
echo "Status: Downloaded newer image for $2"
"""
STEPS = "import sys\nfor i in range(1, 4):\n    print(f'Step {i}/3 : RUN x', file=sys.stderr)\nprint('==> built', file=sys.stderr)\nprint('my/image:1')\n"


def run_python(code: str, progress: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SMDDP_PROGRESS": progress}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False)


@pytest.mark.parametrize(("setting", "expected"), [("0", False), ("1", True), ("", False)])
def test_enabled_follows_the_setting_and_the_terminal(setting: str, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from smddp_sdk import progress

    monkeypatch.setenv("SMDDP_PROGRESS", setting)
    assert progress.enabled() is expected  # pytest's stderr is not a terminal


def test_build_steps_become_a_bar_and_other_lines_pass_through(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(STEPS)
    code = "from smddp_sdk import progress; import sys; sys.exit(progress.run_with_steps([sys.executable, 'steps.py'], 'building'))"
    shown = run_python(code, "1", tmp_path)
    assert shown.returncode == 0 and shown.stdout == "my/image:1\n"
    assert "building" in shown.stderr and "3/3" in shown.stderr and "Step 1/3" not in shown.stderr and "==> built" in shown.stderr
    piped = run_python(code, "0", tmp_path)
    assert "Step 1/3 : RUN x" in piped.stderr and "\r" not in piped.stderr


def test_docker_pull_shows_layers_or_two_plain_lines(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    code = f"from smddp_sdk import progress; import sys; sys.exit(progress.docker_pull({str(fake)!r}, 'python:3.11'))"
    shown = run_python(code, "1", tmp_path)
    assert shown.returncode == 0 and "pulling python:3.11" in shown.stderr and "2/2" in shown.stderr
    piped = run_python(code, "0", tmp_path)
    assert piped.stderr.splitlines() == ["pulling python:3.11 (may take minutes) ...", "pulling python:3.11: done"]


def test_a_byte_bar_counts_what_the_callback_reports(tmp_path: Path) -> None:
    code = "from smddp_sdk import progress\nwith progress.bar(100, 'uploading', unit_bytes=True) as advance:\n    advance(40); advance(60)\n"
    assert "100%" in run_python(code, "1", tmp_path).stderr
    assert run_python(code, "0", tmp_path).stderr.splitlines() == ["uploading ...", "uploading: done"]
