"""The /opt/ml contract module: layout, hyperparameter encoding, outputs."""

import json

import pytest

from smddp_sdk.errors import ContractError
from smddp_sdk.specs import contract
from smddp_sdk.specs.contract import OptMl


def test_base_dir_defaults_to_opt_ml_and_follows_env(tmp_path):
    assert OptMl.from_env({}).base.as_posix() == "/opt/ml"
    opt_ml = OptMl.from_env({"SAGEMAKER_BASE_DIR": str(tmp_path)})
    assert opt_ml.resource_config_file == tmp_path / "input/config/resourceconfig.json"
    assert opt_ml.channel_dir("train") == tmp_path / "input/data/train"
    assert opt_ml.failure_file == tmp_path / "output/failure"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(10, "10"), (0.01, "0.01"), (True, "true"), ([1, 2], "[1, 2]"), ("resnet50", '"resnet50"'), (None, "null")],
)
def test_hyperparameters_are_encoded_like_sdk_v2(value, encoded):
    assert contract.encode_hyperparameters({"k": value}) == {"k": encoded}
    assert contract.decode_hyperparameters({"k": encoded}) == {"k": value}


def test_undecodable_hyperparameter_stays_a_string():
    assert contract.decode_hyperparameter("abc") == "abc"


def test_split_drops_reserved_and_separates_framework_parameters():
    user, framework = contract.split_hyperparameters(
        {"epochs": 3, "sagemaker_program": "train.py", "sagemaker_distributed_dataparallel_enabled": True}
    )
    assert user == {"epochs": 3}
    assert framework == {"sagemaker_distributed_dataparallel_enabled": True}


def test_config_files_round_trip(tmp_path):
    opt_ml = OptMl(tmp_path)
    resource = contract.resource_config("algo-2", ["algo-1", "algo-2"], "ml.p4d.24xlarge")
    contract.write_config_files(
        opt_ml,
        resource=resource,
        hyperparameters=contract.encode_hyperparameters({"epochs": 1}),
        input_data=contract.input_data_config({"train": {}}),
    )
    assert contract.read_json_file(opt_ml.resource_config_file) == resource
    assert resource["instance_groups"][0]["hosts"] == ["algo-1", "algo-2"]
    assert json.loads(opt_ml.hyperparameters_file.read_text()) == {"epochs": "1"}
    assert contract.read_json_file(opt_ml.input_data_config_file)["train"]["TrainingInputMode"] == "File"
    assert opt_ml.model_dir.is_dir() and opt_ml.output_data_dir.is_dir()


def test_broken_config_file_names_the_file(tmp_path):
    path = tmp_path / "hyperparameters.json"
    path.write_text("{not json")
    with pytest.raises(ContractError, match="hyperparameters.json: not valid JSON"):
        contract.read_json_file(path)
    with pytest.raises(ContractError, match="missing"):
        contract.read_json_file(tmp_path / "absent.json", required=True)
    assert contract.read_json_file(tmp_path / "absent.json", default={}) == {}


def test_first_failure_wins_and_reason_is_truncated(tmp_path):
    opt_ml = OptMl(tmp_path)
    assert contract.write_failure(opt_ml, "root cause " + "x" * 2000)
    assert not contract.write_failure(opt_ml, "a later failure")
    reason = contract.read_failure(opt_ml)
    assert reason.startswith("root cause") and len(reason) == contract.FAILURE_REASON_LIMIT


@pytest.mark.parametrize(
    "cause",
    [
        contract.RootCause("algo-2", 3, 7, "ValueError: boom"),
        contract.RootCause("algo-1", None, 2, "ContractError: hyperparameters.json: not valid JSON"),
    ],
)
def test_root_cause_line_round_trips(cause):
    reason = f"{cause.line}\nExitCode {cause.exit_code}\n\nTraceback ..."
    assert contract.parse_root_cause(reason) == cause
    assert contract.parse_root_cause("AlgorithmError: " + reason) == cause  # as SageMaker reports it
    assert contract.parse_root_cause("AlgorithmError: something else") is None
