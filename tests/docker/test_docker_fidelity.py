"""Docker mode as a SageMaker rehearsal: AWS-style scripts with literal /opt/ml paths and the imports SageMaker's
PyTorch containers satisfy, the packages the image carries, and requirements.txt from a mounted wheelhouse."""

from __future__ import annotations

import os
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk.schedulers.docker import DockerScheduler
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobState
from tests.integration.test_requirements_env import build_wheel

from .conftest import REPO, leftovers

pytestmark = pytest.mark.docker

JOB_TIMEOUT = 240

# In the manner of AWS's newer SMDDP MNIST example: packaging for the version check, the smddp backend,
# SM_* defaults for argparse, literal /opt/ml paths; only the device lines are CPU ones, and the data is
# made up (no dataset download in a container without network).
MNIST_STYLE = textwrap.dedent(
    """
    import argparse, os
    from packaging import version
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, 1)
            self.fc = nn.Linear(4 * 26 * 26, 10)

        def forward(self, x):
            return F.log_softmax(self.fc(torch.flatten(F.relu(self.conv(x)), 1)), dim=1)

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--model-dir", type=str, default=os.environ["SM_MODEL_DIR"])
    args = parser.parse_args()
    assert version.parse(torch.__version__) >= version.parse("2.0")

    dist.init_process_group(backend="smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    device = torch.device("cpu")
    model = DDP(Net().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        data, target = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        print(f"rank {rank}/{world} epoch {epoch} loss {loss.item():.3f}", flush=True)
    if rank == 0:
        assert args.model_dir == "/opt/ml/model"
        torch.save(model.module.state_dict(), "/opt/ml/model/model.pth")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> str:
    """SMDDP_TEST_IMAGE names an image built from this checkout under another tag; else the usual one."""
    return os.environ.get("SMDDP_TEST_IMAGE") or request.getfixturevalue("smddp_image")


def run_job(scheduler: DockerScheduler, spec: JobSpec):
    handle = scheduler.submit(spec)
    try:
        lines = list(scheduler.logs(handle, follow=True))
        status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
    finally:
        scheduler.cancel(handle)
    return lines, status


def spec_for(source: Path, name: str, count: int, **extra) -> JobSpec:
    return JobSpec.from_mapping(
        {"entry_point": "train.py", "source_dir": str(source), "instance_type": "local", "instance_count": count,
         "job_name": name, **extra}
    )


def test_aws_style_mnist_script_runs_unchanged_over_two_hosts(image, tmp_path):
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text(MNIST_STYLE)
    scheduler = DockerScheduler(image=image, job_root=tmp_path / "jobs", stop_grace_period=10, processes_per_host=2)
    spec = spec_for(source, "fidelity-mnist", 2, hyperparameters={"epochs": 2},
                    distribution={"smdistributed": {"dataparallel": {"enabled": True}}})
    lines, status = run_job(scheduler, spec)
    assert status.state is JobState.SUCCEEDED, (status, [line.text for line in lines][-30:])
    assert sum(1 for line in lines if line.text.startswith("rank ") and "epoch 1" in line.text) == 4
    with tarfile.open(status.model_data) as archive:
        assert archive.getnames() == ["model.pth"]
    assert leftovers("fidelity-mnist") == ([], [])


def test_image_carries_the_packages_it_lists(image):
    names = [line.split("#")[0].strip() for line in (REPO / "container" / "image-requirements.txt").read_text().splitlines()]
    names = [name for name in names if name]
    check = "import importlib.metadata as m, sys; print(' '.join(m.version(n) for n in sys.argv[1:]))"
    result = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python", "-c", check, *names],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.split()) == len(names)


def test_requirements_install_offline_from_a_mounted_wheelhouse(image, tmp_path):
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text(
        "import smddp_fixture_pkg\nopen('/opt/ml/model/value.txt', 'w').write(smddp_fixture_pkg.VALUE)\n"
    )
    (source / "requirements.txt").write_text("smddp-fixture-pkg==1.0\n")
    wheelhouse = tmp_path / "wheelhouse"
    build_wheel(wheelhouse)
    scheduler = DockerScheduler(image=image, job_root=tmp_path / "jobs", stop_grace_period=10, wheelhouse=str(wheelhouse))
    lines, status = run_job(scheduler, spec_for(source, "fidelity-wheelhouse", 1))
    assert status.state is JobState.SUCCEEDED, (status, [line.text for line in lines][-30:])
    with tarfile.open(status.model_data) as archive:
        assert archive.extractfile("value.txt").read() == b"from-the-wheelhouse"
