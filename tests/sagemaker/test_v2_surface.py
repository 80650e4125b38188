"""Every v2 estimator argument and method is accepted, emulated or refused with a reason: checked against v2.

The tables live in smddp_sdk/specs/v2_arguments.py; the oracle (scripts/setup-sagemaker-oracle.sh) reads
v2's own signatures, so an argument or method v2 has and the tables miss fails here.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import NotOfferedError, SpecError
from smddp_sdk.inputs import TrainingInput
from smddp_sdk.specs import v2_arguments
from smddp_sdk.specs.job import JobSpec
from tests.sagemaker.test_parity import _oracle_python

ORACLE = Path(__file__).with_name("v2_surface_oracle.py")
INPUT_CASES: list[tuple[list[Any], dict[str, Any]]] = [
    (["s3://bucket/train"], {}),
    (["s3://bucket/train", "ShardedByS3Key", "Gzip"], {}),
    (["s3://bucket/train", "FullyReplicated", None, "text/csv", "RecordIO", "ManifestFile"], {"input_mode": "FastFile"}),
    (["s3://bucket/train"], {"compression": "Gzip", "content_type": "application/x-image", "s3_data_type": "AugmentedManifestFile"}),
]


@pytest.fixture(scope="module")
def v2() -> dict[str, Any]:
    python = _oracle_python()
    if python is None:
        pytest.skip("SageMaker SDK v2 oracle not installed: run scripts/setup-sagemaker-oracle.sh")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PYTHON"))}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    done = subprocess.run([str(python), str(ORACLE)], input=json.dumps(INPUT_CASES), capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_v2_argument_is_accepted_emulated_or_refused(v2: dict[str, Any]) -> None:
    accepted = set(JobSpec.field_names())
    emulated, refused = set(v2_arguments.EMULATED_ARGUMENTS), set(v2_arguments.REFUSED_ARGUMENTS)
    unaccounted = [name for name in v2["arguments"] if name not in accepted | emulated | refused]
    assert unaccounted == [], f"v2 arguments with no decision in specs/v2_arguments.py: {unaccounted}"
    assert not (accepted & refused) and not (accepted & emulated)
    stale = sorted((emulated | refused) - set(v2["arguments"]))
    assert stale == [], f"arguments in specs/v2_arguments.py that v2 does not have: {stale}"


def test_every_v2_method_is_offered_or_refused(v2: dict[str, Any]) -> None:
    offered, refused = set(v2_arguments.OFFERED_METHODS), set(v2_arguments.REFUSED_METHODS)
    assert [name for name in v2["methods"] if name not in offered | refused] == []
    assert sorted((offered | refused) - set(v2["methods"])) == []
    for name in offered:
        assert hasattr(PyTorch, name), f"{name} is listed as offered but PyTorch has no {name}"


@pytest.mark.parametrize("name", sorted(v2_arguments.REFUSED_ARGUMENTS))
def test_refused_arguments_fail_with_the_reason(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SpecError) as info:
        PyTorch("train.py", instance_type="local", **{name: "x"})
    assert str(info.value) == f"{name}: is a SageMaker SDK v2 argument smddp-sdk does not support ({v2_arguments.REFUSED_ARGUMENTS[name]})"


def test_refused_methods_raise_not_offered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    estimator = PyTorch("train.py", instance_type="local")
    for name, reason in v2_arguments.REFUSED_METHODS.items():
        with pytest.raises(NotOfferedError, match=reason.split(";")[0].replace("(", r"\(").replace(")", r"\)")):
            getattr(estimator, name)


def test_training_input_has_v2s_parameters_in_v2s_order(v2: dict[str, Any]) -> None:
    ours = [name for name in inspect.signature(TrainingInput.__init__).parameters if name != "self"]
    assert ours == v2["training_input"]


def test_training_input_config_matches_v2(v2: dict[str, Any]) -> None:
    for (args, kwargs), expected in zip(INPUT_CASES, v2["configs"]):
        assert TrainingInput(*args, **kwargs).config == expected, (args, kwargs)
