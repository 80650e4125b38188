"""``smddp-launch drill`` on a real local job (2 simulated hosts x 1 rank, torch on CPU): a lost host and a
spot interruption at seeded random times, each recovery's phases recorded, the final parameters equal to a
straight run's, and the planner's goodput for the drill's own figures within 15 % of the goodput measured
(``-m faults``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.specs.goodput import PHASES

pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_a_drill_reports_each_recovery_equal_parameters_and_a_goodput_the_planner_predicts(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry_point: resume_train.py\nsource_dir: {SCRIPTS}\ninstance_type: local\ninstance_count: 2\n"
        "distribution: {smdistributed: {dataparallel: {enabled: true}}}\n"
        f"checkpoint_s3_uri: file://{tmp_path / 'checkpoints'}\nmax_run: 900\n"
        "hyperparameters: {epochs: 24, pause: 1.0}\n", encoding="utf-8")
    command = [sys.executable, "-m", "smddp_sdk.cli", "drill", str(job), "--kind", "host,spot", "--rounds", "2", "--random", "6-10", "--seed", "3",
               "-o", f"job_root={tmp_path / 'jobs'}", "-o", "processes_per_host=1", "-o", "stop_grace_period=3", "--timeout", "600", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1100)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["equal"] is True, report
    assert [(item["kind"], item["host"]) for item in report["faults"]] == [("host", "algo-2"), ("spot", "algo-2")]
    assert all(6 <= item["after"] <= 10 for item in report["faults"])
    status = report["status"]
    assert [item["outcome"] for item in status["attempts"]] == ["Restarting", "Interrupted", "Completed"]
    recoveries = status["goodput"]["recoveries"]
    assert len(recoveries) == 2
    for recovery in recoveries:
        assert all(recovery[name] is not None and recovery[name] >= 0 for name in (*PHASES, "total", "redone")), recovery
        assert recovery["total"] == pytest.approx(sum(recovery[name] for name in PHASES), abs=0.05)
    measured, predicted = report["measured_goodput"], report["predicted_goodput"]
    assert measured is not None and predicted is not None, report
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured, report["model"])
