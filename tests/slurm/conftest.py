"""A real Slurm cluster for the slurm-marked tests: one that answers already (SLURM_CONF or the state
folder of scripts/slurm-cluster.sh), else one started with that script when running as root (and stopped
afterwards); otherwise the tests skip and say why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import smddp_sdk

SCRIPT = Path(smddp_sdk.__file__).resolve().parent.parent / "scripts" / "slurm-cluster.sh"


def cluster_script(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, check=False, timeout=600, env={**os.environ, "CI": "true"})


def _export(stdout: str) -> str | None:
    exports = [line.split("=", 1)[1] for line in stdout.splitlines() if line.startswith("export SLURM_CONF=")]
    return exports[-1] if exports else None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    """SLURM_CONF of a running cluster in os.environ for the session (the scheduler's sbatch reads it)."""
    previous = os.environ.get("SLURM_CONF")
    if cluster_script("status").returncode == 0:
        os.environ["SLURM_CONF"] = _export(cluster_script("env").stdout) or ""
        yield  # started outside this session: leave it running
        return
    if os.geteuid() != 0:
        pytest.skip("no local Slurm cluster runs and starting one needs root: run scripts/slurm-cluster.sh start as root")
    started = cluster_script("start")
    conf = _export(started.stdout)
    if started.returncode != 0 or conf is None:
        pytest.skip(f"could not start a local Slurm cluster: {started.stderr.strip()[-500:]}")
    os.environ["SLURM_CONF"] = conf
    try:
        yield
    finally:
        cluster_script("stop")
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
