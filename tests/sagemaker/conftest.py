"""Fixtures for the SageMaker scheduler tests: fake AWS credentials, moto, and a code directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.specs.job import JobSpec

ACCOUNT = "123456789012"  # moto's account
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
REGION = "us-west-2"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and a region; nothing of this machine's AWS config leaks in, and no IMDS probe."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
def moto_aws(aws_env: None) -> Iterator[None]:
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "utils").mkdir(parents=True)
    (src / "train.py").write_text("print('hello from train.py')\n")
    (src / "requirements.txt").write_text("\n")
    (src / "utils" / "helpers.py").write_text("X = 1\n")
    return src


@pytest.fixture
def make_spec(code_dir: Path):
    def build(**overrides: Any) -> JobSpec:
        fields = {"entry_point": "train.py", "source_dir": str(code_dir), "role": ROLE, "instance_count": 2,
                  "instance_type": "ml.p4d.24xlarge", "framework_version": "2.2.0", "py_version": "py310",
                  "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}}
        fields.update(overrides)
        return JobSpec.from_mapping({k: v for k, v in fields.items() if v is not None})

    return build


class Recorder:
    """Collects what the scheduler prints, for assertions."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        self.lines.extend(text.splitlines())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)
