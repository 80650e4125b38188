"""The JSON Schema and the reference pages are generated from the code and cannot drift from it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from smddp_sdk.cli.docs import cli_reference
from smddp_sdk.cli.main import cli
from smddp_sdk.config.docs import job_file_reference
from smddp_sdk.config.schema import EXTRA_KEYS, FIELD_DOCS, job_schema
from smddp_sdk.config.template import JobTemplate
from smddp_sdk.specs.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]
MALFORMED = Path(__file__).parent / "malformed"


def test_every_job_field_and_extra_key_is_documented_in_the_schema():
    schema = job_schema()
    names = [f.name for f in dataclasses.fields(JobSpec)]
    assert list(schema["properties"]) == [*names, *EXTRA_KEYS]
    assert set(FIELD_DOCS) == set(schema["properties"])
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["entry_point", "instance_type"]


def test_schema_defaults_are_the_specs_defaults():
    properties = job_schema()["properties"]
    assert properties["max_run"]["default"] == JobSpec.__dataclass_fields__["max_run"].default
    assert properties["input_mode"]["enum"] == ["File", "Pipe", "FastFile"]
    assert properties["distribution"] == {"$ref": "#/$defs/distribution", "description": FIELD_DOCS["distribution"], "default": {}}


class TestSchemaAgainstTheValidator:
    """Editors and smddp-launch must agree: what the schema rejects, validation rejects too."""

    jsonschema = pytest.importorskip("jsonschema")

    def validator(self):
        schema = job_schema()
        self.jsonschema.Draft202012Validator.check_schema(schema)
        return self.jsonschema.Draft202012Validator(schema)

    def test_the_init_template_and_a_full_job_are_accepted(self):
        full = {
            "entry_point": "train.py", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
            "distribution": {"smdistributed": {"dataparallel": {"enabled": True, "custom_mpi_options": "-x A"}}, "torch_distributed": {"enabled": True}},
            "inputs": {"train": {"s3_data": "s3://b/t", "distribution": "ShardedByS3Key", "input_mode": "FastFile"}, "test": "s3://b/x"},
            "tags": [{"Key": "team", "Value": "ml"}], "hyperparameters": {"lr": 0.1}, "environment": {"A": "1"},
            "use_spot_instances": True, "max_wait": 100, "scheduler": "sagemaker", "scheduler_options": {"region": "us-west-2"},
        }
        validator = self.validator()
        assert list(validator.iter_errors(full)) == []
        assert list(validator.iter_errors(yaml.safe_load(JobTemplate().render()))) == []

    @pytest.mark.parametrize("case", ["unknown_field", "unknown_distribution", "unknown_dataparallel_option", "instance_type_typo",
                                      "input_mode_lowercase", "instance_count_zero", "environment_number", "tags_missing_value",
                                      "scheduler_typo", "channel_distribution_bad", "conflict_dataparallel_and_modelparallel"])
    def test_malformed_files_are_rejected_by_the_schema_too(self, case):
        data = yaml.safe_load((MALFORMED / f"{case}.yaml").read_text())
        assert list(self.validator().iter_errors(data)), f"{case}.yaml passes the schema"


def test_schema_command_prints_the_generated_schema(invoke, isolated):
    result = invoke("schema")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == job_schema()
    assert invoke("schema", "-o", "s.json").exit_code == 0
    assert json.loads((isolated / "s.json").read_text()) == job_schema()


def test_committed_reference_pages_match_the_code():
    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference(cli), "run: python3 scripts/gen_docs.py"
    assert (ROOT / "docs" / "job-file.md").read_text() == job_file_reference(), "run: python3 scripts/gen_docs.py"


def test_gen_docs_check_mode_agrees():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
