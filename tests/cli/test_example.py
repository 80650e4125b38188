"""`smddp-launch examples/cnn/job.yaml` runs the example job locally, end to end, as a user would."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cnn" / "job.yaml"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/cnn/job.yaml is not in this checkout"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "smddp_sdk.collectives", "smddp_sdk.schedulers.local")),
                       reason="needs torch, the collectives and the local scheduler"),
]


def test_the_cnn_example_runs_locally_end_to_end(tmp_path: Path):
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SMDDP_", "NO_COLOR"))}
    env.update({"PYTHONPATH": str(ROOT), "SMDDP_JOB_ROOT": str(tmp_path / "jobs"), "SMDDP_CONFIG": "", "HOME": str(tmp_path)})
    # One short epoch keeps the test quick; everything else is the example as shipped.
    command = [sys.executable, "-m", "smddp_sdk.cli", "examples/cnn/job.yaml", "--job-name", "cnn-e2e",
               "-H", "epochs=1", "-H", "samples=512"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "[algo-1/rank0]: training on 4 ranks, 512 images, 1 epochs" in lines  # 2 hosts x 2 simulated GPUs
    assert any(line.startswith("[algo-1/rank0]: epoch 1: loss") for line in lines)
    assert any(line.startswith("[algo-2]:") for line in lines), "the second host's runtime said nothing"
    assert done.stderr.splitlines()[-1] == "✓ local://cnn-e2e SUCCEEDED"
    assert list((tmp_path / "jobs").glob("cnn-e2e/**/model.tar.gz")), "the model artifact was not collected"
