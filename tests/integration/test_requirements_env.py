"""requirements.txt in local mode: one virtualenv per job (cached by the file's hash), offline from a
wheelhouse, and the interpreter that runs the tests unchanged."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import tarfile
import zipfile
from pathlib import Path

import pytest

from smddp_sdk import PyTorch

pytestmark = pytest.mark.integration

PACKAGE = "smddp_fixture_pkg"

SCRIPT = """
import os, sys
import smddp_fixture_pkg
import torch  # the system's packages stay visible in the job's environment
open(f"/opt/ml/model/{os.environ['SM_CURRENT_HOST']}.txt", "w").write(f"{smddp_fixture_pkg.VALUE} {sys.prefix}")
"""


def build_wheel(wheelhouse: Path) -> Path:
    """A minimal pure-Python wheel, made by hand so the test needs neither network nor build tools."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist_info = f"{PACKAGE}-1.0.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": 'VALUE = "from-the-wheelhouse"\n',
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: smddp-fixture-pkg\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n"
    wheel = wheelhouse / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def installed() -> list[str]:
    return sorted(str(dist.metadata["Name"]) for dist in importlib.metadata.distributions())


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    monkeypatch.delenv("SMDDP_ENV_CACHE", raising=False)
    return tmp_path


def run_job(workdir: Path, wheelhouse: Path) -> tuple[PyTorch, str]:
    source = workdir / "src"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(SCRIPT)
    (source / "requirements.txt").write_text("smddp-fixture-pkg==1.0\n")
    estimator = PyTorch(
        entry_point="train.py", source_dir=str(source), instance_count=2, instance_type="local",
        environment={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)},  # offline: the wheelhouse only
    )
    estimator.fit()
    console = Path(estimator.latest_training_job.status().logs).read_text()
    return estimator, console


def test_requirements_go_to_one_cached_virtualenv_never_to_this_interpreter(workdir):
    wheelhouse = workdir / "wheelhouse"
    build_wheel(wheelhouse)
    before = installed()
    estimator, console = run_job(workdir, wheelhouse)
    envs = [path for path in (workdir / "jobs" / ".envs").iterdir() if path.is_dir()]
    assert len(envs) == 1 and envs[0].name.startswith("req-")
    with tarfile.open(estimator.model_data) as archive:
        for host in ("algo-1", "algo-2"):
            value, prefix = archive.extractfile(f"{host}.txt").read().decode().split(" ", 1)
            assert (value, prefix) == ("from-the-wheelhouse", str(envs[0]))
    assert console.count("creating ") == 1  # once per job, not once per host
    assert console.count("requirements already installed") == 1
    assert installed() == before
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("smddp-fixture-pkg")

    _, again = run_job(workdir, wheelhouse)  # same file: the environment is reused, nothing is installed
    assert "creating " not in again and again.count("requirements already installed") == 2
