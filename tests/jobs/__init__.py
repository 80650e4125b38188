"""Job files shared by the suites that run one job on several schedulers.

``same_everywhere/job.yaml`` is an AWS-style smddp script (literal /opt/ml paths) that the docker and
slurm suites run with ``--scheduler local`` and with their own scheduler: the model archives must hold
the same files and the same trained weights.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

SAME_JOB = Path(__file__).resolve().parent / "same_everywhere" / "job.yaml"
REPO = Path(__file__).resolve().parents[2]


def run_same_job(scheduler: str, job_root: Path, *options: str, timeout: float = 600) -> Path:
    """Run ``SAME_JOB`` with ``smddp-launch run --scheduler SCHEDULER`` to the end; its model archive."""
    output = job_root / "artifacts"
    env = {**os.environ, "SMDDP_JOB_ROOT": str(job_root), "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "smddp_sdk.cli", "run", str(SAME_JOB), "--scheduler", scheduler, "--job-name", f"same-{scheduler}", "--output-path", str(output), *options]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert result.returncode == 0, f"{scheduler}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return output / f"same-{scheduler}" / "output" / "model.tar.gz"


def archive_contents(model_tar: Path) -> dict[str, Any]:
    """The archive's file names, each with the weights it holds (``*.pth``) or its bytes."""
    import torch

    contents: dict[str, Any] = {}
    with tarfile.open(model_tar) as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            data = archive.extractfile(member).read()  # type: ignore[union-attr]
            contents[member.name] = torch.load(io.BytesIO(data)) if member.name.endswith(".pth") else data
    return contents


def assert_same_archives(one: Path, other: Path) -> None:
    """The same files; the same weights, bit for bit; the same bytes otherwise."""
    import torch

    left, right = archive_contents(one), archive_contents(other)
    assert sorted(left) == sorted(right), f"{one}: {sorted(left)} != {other}: {sorted(right)}"
    for name, value in left.items():
        if isinstance(value, dict):
            assert value.keys() == right[name].keys() and all(torch.equal(value[k], right[name][k]) for k in value), f"{name} differs"
        else:
            assert value == right[name], f"{name} differs"
