"""Docker jobs found by name: run a script in containers, then list, status, logs, metrics, attach, clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import smddp_sdk
from smddp_sdk.schedulers.docker import LABEL_JOB

pytestmark = pytest.mark.docker
PACKAGE_PARENT = str(Path(smddp_sdk.__file__).resolve().parent.parent)
TRAIN = "import os\nprint(f\"rank {os.environ['RANK']} loss {1.0 / (1 + int(os.environ['RANK']))}\", flush=True)\n"


def cli(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT, "NO_COLOR": "1", "SMDDP_JOB_ROOT": str(tmp_path / "jobs"), "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "smddp_sdk.cli", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout, check=False)


def test_a_docker_job_is_found_by_name_everywhere(smddp_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    ran = cli(tmp_path, "--scheduler", "docker", "-o", f"image={smddp_image}", "--hosts", "2", "--nproc-per-host", "2",
              "--job-name", "dock-named", "train.py")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "  status:  smddp-launch status dock-named" in ran.stderr

    listed = cli(tmp_path, "list", "--scheduler", "docker")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].startswith("docker://dock-named  SUCCEEDED"), listed.stdout + listed.stderr
    assert "docker://dock-named" in cli(tmp_path, "list").stdout
    status = cli(tmp_path, "status", "dock-named")
    assert status.returncode == 0 and status.stdout.startswith("docker://dock-named  SUCCEEDED")
    assert cli(tmp_path, "logs", "dock-named", "--rank", "3").stdout.splitlines() == ["[algo-2/rank3]: rank 3 loss 0.25"]
    for flags, row in (((), ("loss", "1", "1", "1")), (("--all-ranks",), ("loss", "4", "0.25", "1"))):  # rank 0 unless asked
        metrics = cli(tmp_path, "metrics", "dock-named", "-m", "loss=loss ([0-9.]+)", *flags)
        name, count, _last, low, high = metrics.stdout.splitlines()[1].split()
        assert (name, count, low, high) == row, metrics.stdout + metrics.stderr

    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    from smddp_sdk import PyTorch

    attached = PyTorch.attach("dock-named")
    assert attached.scheduler == "docker" and attached.instance_count == 2 and attached.entry_point.endswith("train.py")
    assert attached.latest_training_job.status().state.value == "SUCCEEDED"

    # a stopped container a docker job of this job root left behind, and the job itself, go with clean;
    # the same container of another job root stays
    gone_dir, other_dir = tmp_path / "jobs" / "docker" / "dock-leftover", tmp_path / "elsewhere" / "docker" / "dock-other"
    for job, job_dir in (("dock-leftover", gone_dir), ("dock-other", other_dir)):
        subprocess.run(["docker", "create", "--label", f"{LABEL_JOB}={job}", "--label", f"ai.smddp.job-dir={job_dir}", smddp_image, "true"],
                       capture_output=True, check=True)
    cleaned = cli(tmp_path, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removing docker://dock-named" in cleaned.stderr and "removing 1 docker container" in cleaned.stderr and "1 leftover" in cleaned.stderr
    assert not (tmp_path / "jobs" / "docker" / "dock-named").exists()
    def containers(job: str) -> list[str]:
        return subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_JOB}={job}"], capture_output=True, text=True, check=True).stdout.split()

    assert containers("dock-leftover") == []
    others = containers("dock-other")
    assert len(others) == 1
    subprocess.run(["docker", "rm", "-f", *others], capture_output=True, check=True)
