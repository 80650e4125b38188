"""A v3 user's launcher runs here with only its import lines changed: examples/cnn/launch_v3.py, run by the
command docs/migration-v3.md shows, trains 2 simulated hosts x 2 ranks, and the CLI's status, logs and
metrics work on its job. Against the v3 oracle, its imports with ``smddp_sdk.`` turned back into
``sagemaker.`` are all names ``sagemaker-train`` has, and nothing else in it is smddp-sdk's."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.train.test_v3_parity import _oracle_python

pytestmark = pytest.mark.jobs

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "examples" / "cnn" / "launch_v3.py"
DOC = REPO / "docs" / "migration-v3.md"


def doc_python_commands() -> list[str]:
    """The fenced shell lines of docs/migration-v3.md that run a Python launcher (smddp-launch lines are
    tests/cli/test_docs_commands.py's)."""
    commands, fenced = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and re.match(r"^(\w+=\S+ )*python3? ", line):
            commands.append(line)
    return commands


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smddp_sdk.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_the_v3_launcher_runs_locally_as_the_doc_says() -> None:
    commands = doc_python_commands()
    assert commands == ["SMDDP_SCHEDULER=local python examples/cnn/launch_v3.py"]
    *assignments, program, script = shlex.split(commands[0])
    env = {**os.environ, **dict(item.split("=", 1) for item in assignments), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable if program.startswith("python") else program, script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    model = Path(re.search(r"^model: (.+)$", result.stdout, re.M).group(1))
    with tarfile.open(model) as archive:
        assert "model.pt" in archive.getnames()
    job = re.search(r"local://(cnn-example-v3-\S+)", result.stdout).group(1)
    assert "SUCCEEDED" in cli("status", job).stdout
    logs = cli("logs", job).stdout
    assert "[algo-1/rank0]: saved the model" in logs
    assert (model.parent.parent / "algo-2" / "output" / "logs" / "rank-3.log").is_file(), "the second host ran no rank 3"
    metrics = cli("metrics", job)
    assert metrics.returncode == 0 and "loss" in metrics.stdout


def test_only_the_import_lines_are_smddp_sdks() -> None:
    tree = ast.parse(LAUNCHER.read_text())
    imported = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("smddp_sdk")]
    assert {node.module for node in imported} == {"smddp_sdk.train", "smddp_sdk.train.configs", "smddp_sdk.train.distributed"}
    body = [line for line in LAUNCHER.read_text().splitlines() if not line.startswith(("from ", "import "))]
    code_lines = [line.split("#")[0] for line in body if not line.lstrip().startswith("#")]
    docstring = ast.get_docstring(tree) or ""
    assert not [line for line in code_lines if "smddp_sdk" in line and line.strip() not in docstring], "smddp_sdk outside the import lines"
    python = _oracle_python()
    if python is None:
        pytest.skip("SageMaker SDK v3 oracle (sagemaker-train) not installed: run scripts/setup-sagemaker-v3-oracle.sh")
    v3_imports = "\n".join(f"from {node.module.replace('smddp_sdk.', 'sagemaker.', 1)} import {', '.join(alias.name for alias in node.names)}" for node in imported)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    result = subprocess.run([str(python), "-W", "ignore", "-c", v3_imports], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, f"{v3_imports}\n{result.stderr[-2000:]}"
