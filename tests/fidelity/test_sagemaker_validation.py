"""The SageMaker scheduler refuses smdistributed dataparallel where AWS's SMDDP cannot run, before any upload.

v2 (the oracle, when installed) is asked the same questions: it applies the framework/Python rules but,
since 2.221.1, not the instance-type list; our stricter rule is deliberate (docs/compat.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import EXIT_SPEC, SpecError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.specs import smddp_support
from smddp_sdk.specs.job import JobSpec
from tests.sagemaker.test_parity import _oracle_case, _oracle_python, run_oracle

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:latest"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('train')\n")
    return tmp_path / "src"


def _args(src: Path, **overrides) -> dict:
    return {"entry_point": "train.py", "source_dir": str(src), "role": ROLE, "instance_count": 2,
            "instance_type": "ml.p4d.24xlarge", "framework_version": "2.2.0", "py_version": "py310",
            "distribution": SMDDP, **overrides}


def _issues(arguments: dict) -> list:
    return get_scheduler("sagemaker", region="us-west-2", account_id="123456789012").validate(JobSpec.from_mapping(arguments))


def test_smddp_on_an_unsupported_instance_type_is_refused_with_the_list(src: Path) -> None:
    [issue] = _issues(_args(src, instance_type="ml.g5.12xlarge"))
    assert issue.path == "instance_type" and "does not support ml.g5.12xlarge" in issue.message
    assert all(name in issue.message for name in smddp_support.SUPPORTED_INSTANCE_TYPES)
    with pytest.raises(SpecError) as caught:  # before anything is uploaded: the dry run already refuses
        PyTorch(**_args(src, instance_type="ml.g5.12xlarge"), scheduler="sagemaker", scheduler_options={"region": "us-west-2"}).dryrun()
    assert caught.value.exit_code == EXIT_SPEC


@pytest.mark.parametrize("instance_type", smddp_support.SUPPORTED_INSTANCE_TYPES)
def test_supported_instance_types_pass(src: Path, instance_type: str) -> None:
    extra = {"distribution": {**SMDDP, "torch_distributed": {"enabled": True}}} if "p5" in instance_type else {}
    assert _issues(_args(src, instance_type=instance_type, **extra)) == []


def test_an_explicit_image_is_the_escape(src: Path) -> None:
    arguments = {k: v for k, v in _args(src, instance_type="ml.g5.12xlarge", image_uri=IMAGE).items() if k not in ("framework_version", "py_version")}
    assert _issues(arguments) == []


def test_v2_framework_and_python_rules(src: Path) -> None:
    [issue] = _issues(_args(src, framework_version="2.3.0", py_version="py311"))
    assert issue.path == "framework_version" and "2.3.0 is not supported by smdataparallel" in issue.message
    assert _issues(_args(src, distribution=None, instance_type="ml.g5.12xlarge")) == []  # no smddp: no rule


def test_what_v2_does_with_the_same_arguments(src: Path) -> None:
    if _oracle_python() is None:
        pytest.skip("SageMaker SDK v2 oracle not installed: run scripts/setup-sagemaker-oracle.sh")
    g5, new_torch = run_oracle([_oracle_case(_args(src, instance_type="ml.g5.12xlarge")),
                                _oracle_case(_args(src, framework_version="2.3.0", py_version="py311"))])
    assert "request" in g5, "v2 accepts smddp on ml.g5.12xlarge (its instance list is dead code): we refuse on purpose"
    assert "2.3.0 is not supported by smdataparallel" in new_torch["error"]
