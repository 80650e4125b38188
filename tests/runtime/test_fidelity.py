"""What a rank sees that SageMaker also gives it: TORCHELASTIC_* under torch_distributed, error records in
either format, SM_NUM_GPUS on machines with and without GPUs, /opt/ml paths when the tree is bound."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime.failures import rank_failure
from smddp_sdk.runtime.plan import LaunchShape, plan_ranks
from smddp_sdk.runtime.training_env import probe_gpu_count, read_training_env
from smddp_sdk.specs import contract
from tests.runtime.test_env import write_tree


def _rank_env(tmp_path: Path, shape: LaunchShape, **extra: str) -> dict[str, str]:
    write_tree(tmp_path, current="algo-2")
    env = read_training_env({"SAGEMAKER_BASE_DIR": str(tmp_path), "SMDDP_NUM_GPUS": "2", **extra})
    plan = plan_ranks(env.ordered_hosts, env.current_host, shape, 2)
    base = {"TORCHELASTIC_RUN_ID": "inherited", "SAGEMAKER_BASE_DIR": str(tmp_path)}
    slot = plan.local_slots[1]
    return rank_env.process_env(base, env, plan, slot, python_path=[], error_file=str(env.opt_ml.rank_error_file(slot.rank)))


def test_torch_distributed_ranks_get_torchruns_elastic_variables(tmp_path):
    variables = _rank_env(tmp_path, LaunchShape.TORCH_DISTRIBUTED)
    assert variables["TORCHELASTIC_RUN_ID"] == "job-123"
    assert (variables["TORCHELASTIC_RESTART_COUNT"], variables["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
    assert variables["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "output" / "errors" / "rank-3.torchelastic.json")
    assert (variables["ROLE_NAME"], variables["ROLE_RANK"], variables["ROLE_WORLD_SIZE"]) == ("default", "3", "4")
    assert variables["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "TORCHELASTIC_USE_AGENT_STORE" not in variables  # not ours to set: the rendezvous store decides


def test_the_rendezvous_stores_switch_passes_through(tmp_path):
    """runtime/store.py hands the ranks TORCHELASTIC_USE_AGENT_STORE in their base environment: it stays."""
    write_tree(tmp_path, current="algo-2")
    env = read_training_env({"SAGEMAKER_BASE_DIR": str(tmp_path), "SMDDP_NUM_GPUS": "2"})
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.TORCH_DISTRIBUTED, 2)
    base = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "7"}
    variables = rank_env.process_env(base, env, plan, plan.local_slots[0], python_path=[], error_file="e")
    assert variables["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert variables["TORCHELASTIC_RESTART_COUNT"] == "0"


@pytest.mark.parametrize("shape", [LaunchShape.SMDISTRIBUTED, LaunchShape.PYTORCHDDP, LaunchShape.MPI])
def test_mpirun_style_launchers_set_no_elastic_variable(tmp_path, shape):
    variables = _rank_env(tmp_path, shape)
    assert not [key for key in variables if key.startswith("TORCHELASTIC_")]  # an inherited RUN_ID is dropped too


def test_sm_num_gpus_reports_gpus_only_where_the_machine_has_them(tmp_path):
    write_tree(tmp_path)
    env = read_training_env({"SAGEMAKER_BASE_DIR": str(tmp_path), "SMDDP_NUM_GPUS": "8"})
    assert env.gpus_for_planning == 8  # ranks per host follow the simulated instance type either way
    if probe_gpu_count():
        assert (env.num_gpus, env.planned_gpus) == (8, None)
    else:
        assert env.num_gpus == 0 and env.planned_gpus == 8
    unset = read_training_env({"SAGEMAKER_BASE_DIR": str(tmp_path)})
    assert unset.num_gpus == unset.gpus_for_planning == probe_gpu_count()


def test_bound_tree_shows_opt_ml_paths_and_no_base_dir(tmp_path):
    write_tree(tmp_path)
    env = dataclasses.replace(read_training_env({"SAGEMAKER_BASE_DIR": str(tmp_path)}), visible_base=Path("/opt/ml"))
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 1)
    variables = rank_env.process_env({"SAGEMAKER_BASE_DIR": str(tmp_path)}, env, plan, plan.local_slots[0], python_path=[], error_file="e")
    assert variables["SM_MODEL_DIR"] == "/opt/ml/model" and variables["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert json.loads(variables["SM_TRAINING_ENV"])["output_data_dir"] == "/opt/ml/output/data"
    assert "SAGEMAKER_BASE_DIR" not in variables


def test_error_record_reads_torchs_record_when_the_bootstrap_left_none(tmp_path):
    own = tmp_path / "rank-3.json"
    torch_file = contract.torchelastic_error_file(own)
    torch_file.write_text(json.dumps({"message": {"message": "ValueError: bad shard", "extraInfo": {
        "py_callstack": "Traceback ...\nValueError: bad shard\n", "timestamp": "1700000000"}}}))
    path, record = contract.error_record(own)
    assert path == torch_file
    assert (record["error_type"], record["message"], record["timestamp"]) == ("ValueError", "bad shard", 1700000000.0)
    assert "Traceback" in record["traceback"]
    own.write_text(json.dumps({"error_type": "KeyError", "message": "'x'", "timestamp": time.time()}))
    assert contract.error_record(own)[0] == own  # the bootstrap's own record wins (finer timestamp)


def test_a_rank_failure_names_torchs_error_file(tmp_path):
    own = tmp_path / "rank-0.json"
    contract.torchelastic_error_file(own).write_text(json.dumps({"message": "RuntimeError: lost", "timestamp": 5}))
    failure = rank_failure(host="algo-1", rank=0, local_rank=0, pid=1, returncode=1, error_file=own, log_tail="")
    assert (failure.error_type, failure.message, failure.timestamp) == ("RuntimeError", "lost", 5.0)
    assert failure.error_file.endswith("rank-0.torchelastic.json")
    assert contract.error_record(tmp_path / "missing.json") is None
