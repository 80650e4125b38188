"""Reading the contract into a TrainingEnv, the SM_* table and the hyperparameter argv."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.errors import ContractError
from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime.plan import LaunchShape, plan_ranks
from smddp_sdk.runtime.training_env import TrainingEnv, probe_gpu_count, read_training_env, validate_entry_point
from smddp_sdk.specs import contract
from smddp_sdk.specs.contract import OptMl

P4D_HPS = {
    "sagemaker_program": "train.py",
    "sagemaker_submit_directory": "s3://bucket/job/source/sourcedir.tar.gz",
    "sagemaker_container_log_level": 20,
    "sagemaker_job_name": "job-123",
    "sagemaker_region": "us-west-2",
    "sagemaker_distributed_dataparallel_enabled": True,
    "sagemaker_instance_type": "ml.p4d.24xlarge",
    "sagemaker_distributed_dataparallel_custom_mpi_options": "",
    "epochs": 10,
    "lr": 0.01,
    "model-type": "resnet",
}


def write_tree(base: Path, *, current: str = "algo-1", hosts=("algo-1", "algo-2"), group_hosts=None,
               hps: dict[str, Any] | None = None, resource: dict[str, Any] | None = None) -> OptMl:
    opt_ml = OptMl(base)
    res = resource or contract.resource_config(current, list(hosts), "ml.p4d.24xlarge")
    if group_hosts is not None:
        res["instance_groups"][0]["hosts"] = list(group_hosts)
    contract.write_config_files(
        opt_ml, resource=res, hyperparameters=contract.encode_hyperparameters(P4D_HPS if hps is None else hps),
        input_data=contract.input_data_config({"train": {"ContentType": "application/x-image"}, "test": {}}),
    )
    return opt_ml


def read(base: Path, **extra: str) -> TrainingEnv:
    return read_training_env({"SAGEMAKER_BASE_DIR": str(base), "SMDDP_NUM_GPUS": "8", **extra})


def test_reads_topology_hyperparameters_and_defaults(tmp_path):
    write_tree(tmp_path, current="algo-2")
    env = read(tmp_path)
    assert (env.current_host, env.hosts) == ("algo-2", ("algo-1", "algo-2"))
    assert env.hyperparameters == {"epochs": 10, "lr": 0.01, "model-type": "resnet"}
    assert env.framework_params["sagemaker_distributed_dataparallel_enabled"] is True
    assert "sagemaker_program" not in env.framework_params
    assert (env.user_entry_point, env.module_name, env.job_name) == ("train.py", "train", "job-123")
    assert env.channels == ("test", "train")
    assert env.gpus_for_planning == 8 and env.log_level == 20
    assert env.num_gpus == (8 if probe_gpu_count() else 0)  # SM_NUM_GPUS: none on a machine without GPUs
    assert env.ports.master == 7777 and env.ports.server == 7592


def test_local_mode_resource_config_gets_the_toolkit_defaults(tmp_path):
    # what SDK v2 local mode writes: no instance groups, no group name, no instance type
    write_tree(tmp_path, resource={"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"})
    env = read(tmp_path)
    assert (env.current_instance_type, env.current_group_name) == ("local", "homogeneousCluster")
    assert env.instance_groups == () and env.distribution_hosts == ("algo-1",)


def test_distribution_hosts_follow_instance_group_order_not_sorted(tmp_path):
    write_tree(tmp_path, hosts=("algo-1", "algo-2", "algo-3", "algo-4"), group_hosts=("algo-3", "algo-1", "algo-4", "algo-2"))
    env = read(tmp_path)
    assert env.distribution_hosts == ("algo-3", "algo-1", "algo-4", "algo-2")
    assert env.master_hostname == "algo-3" and not env.is_master


def test_without_a_distribution_flag_the_host_list_orders_the_job(tmp_path):
    write_tree(tmp_path, hps={"sagemaker_program": "train.py"}, group_hosts=("algo-2", "algo-1"))
    env = read(tmp_path)
    assert env.distribution_instance_groups == () and env.ordered_hosts == ("algo-1", "algo-2")


def test_program_env_var_wins_over_hyperparameter(tmp_path):
    write_tree(tmp_path)
    assert read(tmp_path, SAGEMAKER_PROGRAM="other.py").user_entry_point == "other.py"


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda o: o.resource_config_file.unlink(), "resourceconfig.json: file is missing"),
        (lambda o: o.resource_config_file.write_text("{not json"), "resourceconfig.json: not valid JSON"),
        (lambda o: o.resource_config_file.write_text('{"current_host": "algo-9", "hosts": ["algo-1"]}'), "field 'current_host'"),
        (lambda o: o.resource_config_file.write_text('{"current_host": "a", "hosts": []}'), "field 'hosts'"),
        (lambda o: o.hyperparameters_file.write_text("[1, 2]"), "hyperparameters.json: must hold a JSON object"),
        (lambda o: o.hyperparameters_file.write_text("{}"), "field 'sagemaker_program' is missing"),
        (lambda o: o.hyperparameters_file.write_text(json.dumps({"sagemaker_program": '"../x.py"'})), "'..'"),
        (lambda o: o.hyperparameters_file.write_text(json.dumps({"sagemaker_program": '"a b.py"'})), "sagemaker_program"),
        (lambda o: o.hyperparameters_file.write_text(json.dumps({"sagemaker_program": '"t.py"', "sagemaker_container_log_level": '"loud"'})), "sagemaker_container_log_level"),
        (lambda o: o.input_data_config_file.write_text('"train"'), "inputdataconfig.json: must hold a JSON object"),
    ],
)
def test_bad_contract_input_names_the_file_and_the_field(tmp_path, mutate, fragment):
    mutate(write_tree(tmp_path))
    with pytest.raises(ContractError, match=None) as caught:
        read(tmp_path)
    assert fragment in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("SMDDP_HOST_ADDRESSES", "{oops", "SMDDP_HOST_ADDRESSES is not valid JSON"),
        ("SMDDP_HOST_ADDRESSES", '{"algo-1": "127.0.0.1"}', "no address for hosts ['algo-2']"),
        ("SMDDP_MASTER_PORT", "seventy", "SMDDP_MASTER_PORT='seventy'"),
        ("SMDDP_AGENT_PORT", "70000", "between 1 and 65535"),
        ("SMDDP_NUM_GPUS", "-1", "non-negative integer"),
    ],
)
def test_bad_env_knobs_name_the_variable(tmp_path, name, value, fragment):
    write_tree(tmp_path)
    with pytest.raises(ContractError) as caught:
        read(tmp_path, **{name: value})
    assert fragment in str(caught.value)


@pytest.mark.parametrize("name", ["train.py", "src/train.py", "run-me.sh", "pkg_1/mod+x.py", "train"])
def test_plain_entry_points_are_accepted(name):
    assert validate_entry_point(name) is None


@pytest.mark.parametrize("name", ["/abs/train.py", "../train.py", "a/./b.py", "train.py; rm -rf /", "a b.py", "$(x).py", ""])
def test_dangerous_entry_points_are_refused(name):
    assert validate_entry_point(name) is not None


# --- argv -------------------------------------------------------------------------------------------


def test_argv_rendering_matches_the_toolkit():
    argv = rank_env.hyperparameter_argv(
        {"lr": 0.01, "b": 2, "flag": True, "off": False, "lst": [1, 2], "nested": {"a": 1, "b": "c"}, "model-type": "resnet", "n": None}
    )
    assert argv == [
        "-b", "2", "--flag", "True", "--lr", "0.01", "--lst", "[1, 2]", "--model-type", "resnet",
        "-n", "None", "--nested", "a=1,b=c", "--off", "False",
    ]


def test_a_value_with_shell_characters_stays_one_argument():
    assert rank_env.hyperparameter_argv({"x": "a b; echo INJECTED"}) == ["-x", "a b; echo INJECTED"]


# --- the SM_* table ---------------------------------------------------------------------------------


def _sm(tmp_path: Path, current: str = "algo-2") -> dict[str, str]:
    opt_ml = write_tree(tmp_path, current=current, group_hosts=("algo-2", "algo-1"))
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 8)
    assert opt_ml.base == tmp_path
    return rank_env.sm_env(env, plan)


def test_sm_table_has_the_toolkit_keys_and_encodings(tmp_path):
    sm = _sm(tmp_path)
    base = str(tmp_path)
    assert sm["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert sm["SM_CURRENT_HOST"] == "algo-2"
    assert sm["SM_CURRENT_INSTANCE_TYPE"] == "ml.p4d.24xlarge"
    assert sm["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert sm["SM_CURRENT_INSTANCE_GROUP_HOSTS"] == '["algo-2","algo-1"]'
    assert sm["SM_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert json.loads(sm["SM_INSTANCE_GROUPS_DICT"])["homogeneousCluster"]["hosts"] == ["algo-2", "algo-1"]
    assert sm["SM_DISTRIBUTION_INSTANCE_GROUPS"] == '["homogeneousCluster"]'
    assert sm["SM_IS_HETERO"] == "false"
    assert sm["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert sm["SM_NUM_GPUS"] == ("8" if probe_gpu_count() else "0") and sm["SM_NUM_NEURONS"] == "0"
    assert sm["SM_MODEL_DIR"] == f"{base}/model"
    assert (sm["SM_INPUT_DIR"], sm["SM_INPUT_CONFIG_DIR"]) == (f"{base}/input", f"{base}/input/config")
    assert sm["SM_OUTPUT_DATA_DIR"] == f"{base}/output/data"
    assert sm["SM_OUTPUT_INTERMEDIATE_DIR"] == f"{base}/output/intermediate"
    assert sm["SM_CHANNELS"] == '["test","train"]'
    assert sm["SM_CHANNEL_TRAIN"] == f"{base}/input/data/train"
    assert sm["SM_HPS"] == '{"epochs":10,"lr":0.01,"model-type":"resnet"}'
    assert (sm["SM_HP_EPOCHS"], sm["SM_HP_LR"], sm["SM_HP_MODEL-TYPE"]) == ("10", "0.01", "resnet")
    assert sm["SM_USER_ARGS"] == '["--epochs","10","--lr","0.01","--model-type","resnet"]'
    assert (sm["SM_USER_ENTRY_POINT"], sm["SM_MODULE_NAME"]) == ("train.py", "train")
    assert sm["SM_MODULE_DIR"] == "s3://bucket/job/source/sourcedir.tar.gz"
    assert sm["SM_FRAMEWORK_MODULE"] == ""
    assert json.loads(sm["SM_FRAMEWORK_PARAMS"])["sagemaker_distributed_dataparallel_enabled"] is True
    assert sm["SM_LOG_LEVEL"] == "20"
    assert json.loads(sm["SM_RESOURCE_CONFIG"])["current_host"] == "algo-2"
    assert "SM_TOPOLOGY" not in sm
    assert not {"SM_HOST_COUNT", "SM_CURRENT_HOST_RANK", "SM_MASTER_ADDR", "SM_MASTER_PORT"} & set(sm)


def test_training_env_document_has_every_toolkit_key(tmp_path):
    training = json.loads(_sm(tmp_path, current="algo-1")["SM_TRAINING_ENV"])
    expected = {
        "additional_framework_parameters", "channel_input_dirs", "current_host", "current_instance_group",
        "current_instance_group_hosts", "current_instance_type", "distribution_hosts", "distribution_instance_groups",
        "framework_module", "hosts", "hyperparameters", "input_config_dir", "input_data_config", "input_dir",
        "instance_groups", "instance_groups_dict", "is_hetero", "is_master", "is_modelparallel_enabled",
        "is_smddpmprun_installed", "is_smddprun_installed", "job_name", "log_level", "master_hostname", "model_dir",
        "module_dir", "module_name", "network_interface_name", "num_cpus", "num_gpus", "num_neurons",
        "output_data_dir", "output_dir", "output_intermediate_dir", "resource_config", "topology", "user_entry_point",
    }
    assert set(training) == expected
    assert training["master_hostname"] == "algo-2" and training["is_master"] is False
    assert training["distribution_hosts"] == ["algo-2", "algo-1"]


def test_rank_env_carries_own_host_and_launcher_variables(tmp_path):
    write_tree(tmp_path, current="algo-1", group_hosts=("algo-2", "algo-1"))
    env = read(tmp_path, SMDDP_HOST_ADDRESSES='{"algo-1": "10.0.0.1", "algo-2": "10.0.0.2"}', SMDDP_MASTER_PORT="29500")
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 8)
    slot = plan.local_slots[3]
    variables = rank_env.rank_env(env, plan, slot)
    assert variables == {
        "RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
        "NODE_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500",
        "SMDATAPARALLEL_LOCAL_RANK": "3", "SMDATAPARALLEL_SERVER_ADDR": "10.0.0.2", "SMDATAPARALLEL_SERVER_PORT": "7592",
        "SAGEMAKER_INSTANCE_TYPE": "ml.p4d.24xlarge", "OMPI_COMM_WORLD_RANK": "11", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "SM_CURRENT_HOST": "algo-1",
        "SMDDP_MESH_SECRET": contract.mesh_secret(env.job_token),  # the mesh's secret, never the job token itself
    }
    assert env.job_token not in variables.values()


def test_master_is_the_host_name_without_an_address_mapping(tmp_path):
    write_tree(tmp_path, current="algo-1")
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.TORCH_DISTRIBUTED, 1)
    assert rank_env.rank_env(env, plan, plan.local_slots[0])["MASTER_ADDR"] == "algo-1"


def test_process_env_puts_code_dir_first_and_overrides_stale_rank_variables(tmp_path):
    write_tree(tmp_path, current="algo-1")
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 2)
    inherited = {"PATH": "/usr/bin", "RANK": "99", "SM_CURRENT_HOST": "leader", "SMDDP_ERROR_FILE": "stale"}
    full = rank_env.process_env(inherited, env, plan, plan.local_slots[1], python_path=["/code", "/lib"], error_file="/e/1.json")
    assert full["PATH"] == "/usr/bin" and full["RANK"] == "1" and full["SM_CURRENT_HOST"] == "algo-1"
    assert full["PYTHONPATH"] == "/code:/lib" and full["SMDDP_ERROR_FILE"] == "/e/1.json"
    assert full["OMP_NUM_THREADS"] == str(max(1, env.num_cpus // 2))
    assert full["NCCL_SOCKET_IFNAME"] == "eth0"
    assert full["GLIBC_TUNABLES"] == rank_env.MALLOC_KEEPS_MEMORY


def test_a_users_glibc_tunables_are_kept(tmp_path):
    write_tree(tmp_path, current="algo-1")
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 1)
    mine = "glibc.malloc.arena_max=2"
    full = rank_env.process_env({"GLIBC_TUNABLES": mine}, env, plan, plan.local_slots[0], python_path=[], error_file="/e")
    assert full["GLIBC_TUNABLES"] == mine


def test_topology_is_exported_only_when_present(tmp_path):
    res = contract.resource_config("algo-1", ["algo-1"], "ml.p6e-gb200.36xlarge")
    res["topology"] = [{"hostName": "algo-1", "capacityUnitId": "u1"}]
    write_tree(tmp_path, resource=res)
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, LaunchShape.SMDISTRIBUTED, 1)
    assert rank_env.sm_env(env, plan)["SM_TOPOLOGY"] == '[{"capacityUnitId":"u1","hostName":"algo-1"}]'


def test_numeric_knobs_name_the_variable_and_what_is_expected():
    from smddp_sdk.errors import ContractError
    from smddp_sdk.runtime.training_env import number_env

    assert number_env({}, "SMDDP_STOP_GRACE", 5.0, float) == 5.0
    assert number_env({"SMDDP_STOP_GRACE": "2.5"}, "SMDDP_STOP_GRACE", 5.0, float) == 2.5
    with pytest.raises(ContractError, match=r"SMDDP_STOP_GRACE='soon' must be a number of seconds"):
        number_env({"SMDDP_STOP_GRACE": "soon"}, "SMDDP_STOP_GRACE", 5.0, float)
    with pytest.raises(ContractError, match="non-negative integer"):
        number_env({"SMDDP_AGENT_PORT": "1.5"}, "SMDDP_AGENT_PORT", 7778, int)


def test_script_argv_is_appended_verbatim_and_a_bad_value_is_a_contract_error():
    assert rank_env.script_argv({}) == []
    args = ["data.csv", "--fp16", "--lr=0.1", "--"]
    assert rank_env.script_argv({contract.SCRIPT_ARGS_ENV: json.dumps(args)}) == args
    with pytest.raises(ContractError, match="JSON list of strings"):
        rank_env.script_argv({contract.SCRIPT_ARGS_ENV: "--fp16"})
