"""``smddp-launch drill`` on a real local job (2 simulated hosts x 1 rank, torch on CPU): a lost host and a
spot interruption at seeded random times, each recovery's phases recorded, the final parameters equal to a
straight run's, and the planner's goodput for the drill's own figures within 15 % of the goodput measured
(``-m faults``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.hosttree.drill import descendants, differences, drilled_spec, plan_faults, rank_pid, straight_spec
from smddp_sdk.specs.goodput import PHASES
from smddp_sdk.specs.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_faults_take_kinds_in_turn_and_a_seed_draws_the_same_delays_again() -> None:
    hosts = ["algo-1", "algo-2"]
    faults = plan_faults(["host", "spot", "rank"], 4, hosts, between=(5, 20), seed=7)
    assert [(fault.round, fault.kind, fault.host) for fault in faults] == [(1, "host", "algo-2"), (2, "spot", "algo-2"), (3, "rank", "algo-2"), (4, "host", "algo-2")]
    assert faults == plan_faults(["host", "spot", "rank"], 4, hosts, between=(5, 20), seed=7)
    assert faults != plan_faults(["host", "spot", "rank"], 4, hosts, between=(5, 20), seed=8)
    assert all(5 <= fault.after <= 20 for fault in faults)
    assert [fault.after for fault in plan_faults(["host"], 3, hosts, at=[10, 30], host="algo-1")] == [10, 30, 30]
    with pytest.raises(SpecError) as problems:
        plan_faults(["host", "meteor"], 0, hosts, host="algo-9")
    assert [issue.path for issue in problems.value.issues] == ["kind", "rounds", "host"]


def test_the_drilled_job_gets_retries_spot_capacity_and_checkpoints_of_its_own(tmp_path: Path) -> None:
    spec = JobSpec.from_mapping({"entry_point": "resume_train.py", "source_dir": str(SCRIPTS), "instance_type": "local", "instance_count": 2,
                                 "max_run": 600, "checkpoint_s3_uri": "s3://bucket/ckpt/"})
    faults = plan_faults(["host", "rank", "spot"], 3, ["algo-1", "algo-2"], at=[5])
    drilled = drilled_spec(spec, faults, "job-drill")
    assert (drilled.job_name, drilled.checkpoint_s3_uri, drilled.max_retry_attempts) == ("job-drill", "s3://bucket/ckpt/job-drill", 2)
    assert drilled.use_spot_instances and drilled.max_wait == 600
    assert straight_spec(spec, "job-straight").checkpoint_s3_uri == "s3://bucket/ckpt/job-straight"


def test_model_archives_are_compared_file_by_file(tmp_path: Path) -> None:
    def archive(name: str, files: dict[str, bytes]) -> str:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            for member, data in files.items():
                (tmp_path / member).write_bytes(data)
                tar.add(tmp_path / member, arcname=member)
        return str(path)

    same = archive("a.tar.gz", {"params.pt": b"x", "log.txt": b"1"})
    assert differences(same, archive("b.tar.gz", {"params.pt": b"x", "log.txt": b"1"})) == []
    assert differences(same, archive("c.tar.gz", {"params.pt": b"y"})) == ["log.txt: only in the drilled run", "params.pt: differs"]
    assert differences(None, None) == ["neither run left a model archive with files in it"]


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_a_drill_reports_each_recovery_equal_parameters_and_a_goodput_the_planner_predicts(tmp_path: Path) -> None:
    pytest.importorskip("torch")
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


def test_a_rank_is_found_below_its_hosts_runtime_by_its_rank(tmp_path: Path) -> None:
    runtime = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys, time
        ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RANK": str(rank)}) for rank in (2, 3)]
        print(" ".join(str(rank.pid) for rank in ranks), flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        two, three = map(int, runtime.stdout.readline().split())  # type: ignore[union-attr]
        assert rank_pid(runtime.pid, "algo-1", None) == three  # the host's last rank
        assert rank_pid(runtime.pid, "algo-1", 2) == two
        with pytest.raises(SpecError, match="no running rank 7"):
            rank_pid(runtime.pid, "algo-1", 7)
    finally:
        for pid in (*descendants(runtime.pid), runtime.pid):
            os.kill(pid, 9)
        runtime.wait()
