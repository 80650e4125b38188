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
    assert (tmp_path / "jobs" / "cnn-e2e" / "algo-2" / "output" / "logs" / "rank-3.log").is_file(), "the second host ran no rank 3"
    assert not any(line.startswith("[algo-2]:") for line in lines), lines  # its set-up lines are DEBUG's; the master host speaks for the job
    summary = done.stderr.splitlines()[-5:]
    assert summary[0].startswith("local://cnn-e2e SUCCEEDED in ") and summary[0].endswith(" s")
    assert summary[1].startswith("  model:   ") and summary[1].endswith("model.tar.gz")
    assert summary[2:] == ["  status:  smddp-launch status cnn-e2e", "  logs:    smddp-launch logs cnn-e2e", "  metrics: smddp-launch metrics cnn-e2e"]
    assert list((tmp_path / "jobs").glob("cnn-e2e/**/model.tar.gz")), "the model artifact was not collected"

    # The commands the summary shows work with the bare name, and metrics read the loss back from the logs.
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "smddp_sdk.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)

    status = cli("status", "cnn-e2e")
    assert status.returncode == 0 and status.stdout.startswith("local://cnn-e2e  SUCCEEDED"), status.stderr
    grep = cli("logs", "cnn-e2e", "--grep", "epoch 1: loss", "--rank", "0")
    assert grep.returncode == 0 and len(grep.stdout.splitlines()) == 1, grep.stdout + grep.stderr
    metrics = cli("metrics", "cnn-e2e", "-m", r"loss=loss ([0-9.]+)", "-m", r"accuracy=accuracy ([0-9.]+)", "--plot", "m.svg")
    assert metrics.returncode == 0, metrics.stderr
    rows = {line.split()[0]: line.split()[1:] for line in metrics.stdout.splitlines()[1:]}
    assert rows["loss"][0] == "1" and rows["accuracy"][0] == "1"  # one epoch, printed by rank 0
    svg = (tmp_path / "m.svg").read_text()
    assert svg.startswith("<svg") and "loss (last" in svg and "accuracy (last" in svg and svg.count("<circle") == 3  # one value each: loss, accuracy and the job's own test:accuracy
    own = cli("metrics", "cnn-e2e")  # the example's own metric_definitions, as the run's last line suggests
    assert own.returncode == 0 and {line.split()[0] for line in own.stdout.splitlines()[1:]} == {"loss", "test:accuracy"}, own.stderr


def test_run_example_installs_nothing_that_is_already_there() -> None:
    done = subprocess.run(["bash", "scripts/run-example.sh", "--dryrun"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stdout + done.stderr and '"job_name": "cnn-example-' in done.stdout
