"""Ranks per Slurm node (runtime/slurm_node.py, the dry run's note): by default, or with ``processes_per_host: auto``
(torchrun's ``--nproc-per-node auto``), a CPU node runs one rank per CPU Slurm allots the job there, which
``--exclusive`` makes every core; a number is that number (1 as on a SageMaker CPU instance). GPUs are
counted by a fake ``nvidia-smi`` on PATH, the process the node runtime asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.runtime import slurm_node
from smddp_sdk.runtime.plan import LaunchShape, processes_per_host
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.specs import contract
from smddp_sdk.specs.slurm_job import JOB_DIR_ENV
from tests.slurm.test_slurm_plan import FakeSlurm, spec_for


@pytest.fixture
def code(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('hi')\n")
    return source


def node_env(tmp_path: Path, code: Path, cpus: str = "96", **options) -> dict[str, str]:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm(), **options)
    scheduler.submit(spec_for(code, instance_type="ml.p4d.24xlarge"))  # 8 GPUs on SageMaker, none here
    environ = {JOB_DIR_ENV: str(tmp_path / "jobs" / "job-1"), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "0",
               "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": cpus}
    return slurm_node.node_environ(environ)


def ranks(env: dict[str, str]) -> int:
    """What the runtime's plan makes of the node's environment (a CPU node: no GPU found)."""
    return processes_per_host(LaunchShape.SMDISTRIBUTED, {}, int(env.get(contract.NUM_GPUS_ENV, "0")))


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def with_gpus(count: int) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(count)))
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return with_gpus


def test_a_cpu_node_runs_a_rank_per_allotted_cpu_by_default(tmp_path: Path, code: Path) -> None:
    assert ranks(node_env(tmp_path, code, cpus="96", extra_sbatch=["--exclusive"])) == 96


def test_auto_is_one_rank_per_allotted_cpu_and_a_number_is_that_number(tmp_path: Path, code: Path) -> None:
    assert ranks(node_env(tmp_path / "auto", code, cpus="6", processes_per_host="auto")) == 6
    assert ranks(node_env(tmp_path / "one", code, cpus="6", processes_per_host=1)) == 1
    assert ranks(node_env(tmp_path / "three", code, cpus="6", processes_per_host=3)) == 3


def test_auto_on_a_gpu_node_is_its_gpus(tmp_path: Path, code: Path, gpus) -> None:
    gpus(4)
    env = node_env(tmp_path, code, cpus="96", processes_per_host="auto")
    assert contract.NUM_GPUS_ENV not in env  # the runtime counts the 4 GPUs itself, as without the option


def test_the_dry_run_says_how_many_ranks_a_node_runs(tmp_path: Path, code: Path) -> None:
    def notes(**options) -> str:
        dry = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm(), **options).dryrun(spec_for(code))
        return "\n".join(note for note in dry.notes if note.startswith("ranks per node"))
    assert "else one per CPU" in notes() and notes() == notes(processes_per_host="auto")
    assert "every core of the node (--exclusive)" in notes(processes_per_host="auto", extra_sbatch=["--exclusive"])
    assert "SLURM_CPUS_ON_NODE" in notes(processes_per_host="auto")
    assert notes(processes_per_host=4) == ""
    dry = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm(), processes_per_host="auto").dryrun(spec_for(code))
    assert dry.request.to_json()["processes_per_host"] == "auto"


@pytest.mark.parametrize("value", ["all", 0, True, 10_000])
def test_anything_else_is_refused(tmp_path: Path, value) -> None:
    with pytest.raises(SpecError, match="processes_per_host"):
        get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm(), processes_per_host=value)


def test_torchruns_nproc_per_node_auto_reaches_slurm_as_auto_and_sagemaker_as_its_gpu_rule() -> None:
    from smddp_sdk.cli.torchrun import _per_host

    assert _per_host("auto", {"scheduler": "slurm"}) == "auto"  # counted on each node, not on the login node
    assert _per_host("auto", {"scheduler": "sagemaker"}) is None
