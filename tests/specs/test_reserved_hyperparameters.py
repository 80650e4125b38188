"""Hyperparameters the toolkit owns are refused, not silently replaced or dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.errors import EXIT_SPEC, SpecError
from smddp_sdk.specs.job import JobSpec


@pytest.mark.parametrize("key", ["sagemaker_program", "sagemaker_submit_directory", "sagemaker_job_name", "sagemaker_region"])
def test_reserved_hyperparameters_are_refused_with_what_to_do(tmp_path: Path, key: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(SpecError) as caught:
        JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "hyperparameters": {key: "x", "lr": 0.1}})
    assert caught.value.exit_code == EXIT_SPEC
    assert [issue.path for issue in caught.value.issues] == [f"hyperparameters.{key}"]
    assert "rename it" in str(caught.value)


def test_ordinary_hyperparameters_pass(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "hyperparameters": {"lr": 0.1, "sagemaker_mpi_custom_mpi_options": ""}})
    assert spec.hyperparameters["lr"] == 0.1
