"""The environment a rank starts with: the toolkit's ``SM_*`` table, the hyperparameter argv, the rank variables.

Encodings follow the SageMaker training toolkit exactly: keys ``"SM_" + key.upper()``; strings as
they are, None as "", anything else as sorted-key compact JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from smddp_sdk.errors import ContractError
from smddp_sdk.runtime.plan import LaunchShape, RankPlan, RankSlot
from smddp_sdk.runtime.training_env import TrainingEnv
from smddp_sdk.specs import contract

# glibc malloc otherwise returns multi-MB tensors (gradients, activations) to the kernel when they are
# freed and page-faults them in again on the next step: ~10k faults a step for a 10M-parameter model on
# CPU. Keeping freed memory (mmap only above 32 MiB, trim only above 1 GiB free) removes that, like
# torch's caching allocator does on GPUs. A GLIBC_TUNABLES the user sets wins.
MALLOC_KEEPS_MEMORY = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def encode_env_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def hyperparameter_argv(hyperparameters: Mapping[str, Any]) -> list[str]:
    """The toolkit's argv rendering: sorted keys, ``-k`` for one-letter keys, ``a=1,b=c`` (sorted) for dicts, str() otherwise."""
    argv: list[str] = []
    for key in sorted(hyperparameters):
        value = hyperparameters[key]
        argv.append(f"-{key}" if len(key) == 1 else f"--{key}")
        if isinstance(value, dict):
            argv.append(",".join(f"{k}={v}" for k, v in sorted(value.items())))
        else:
            argv.append(str(value))
    return argv


def script_argv(environ: Mapping[str, str]) -> list[str]:
    """The arguments typed after the script (``smddp-launch train.py --fp16 data.csv``), exactly as typed."""
    raw = environ.get(contract.SCRIPT_ARGS_ENV, "")
    if not raw:
        return []
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the parser's depth
        args = None
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        shown = raw if len(raw) <= 80 else raw[:77] + "..."
        raise ContractError(f'{contract.SCRIPT_ARGS_ENV} must be a JSON list of strings such as ["--epochs", "3"], got {shown!r}')
    return args


def training_env_dict(env: TrainingEnv, plan: RankPlan) -> dict[str, Any]:
    """The toolkit's ``SM_TRAINING_ENV`` document (the keys it has, with our host order for the master).
    Paths are where the ranks see them (/opt/ml when the runtime bound the host's tree there)."""
    opt_ml = env.rank_opt_ml
    return {
        "additional_framework_parameters": dict(env.framework_params),
        "channel_input_dirs": {name: str(opt_ml.channel_dir(name)) for name in env.channels},
        "current_host": env.current_host,
        "current_instance_group": env.current_group_name,
        "current_instance_group_hosts": list(env.current_instance_group_hosts),
        "current_instance_type": env.current_instance_type,
        "distribution_hosts": list(env.distribution_hosts),
        "distribution_instance_groups": list(env.distribution_instance_groups),
        "framework_module": env.framework_module,
        "hosts": list(env.hosts),
        "hyperparameters": dict(env.hyperparameters),
        "input_config_dir": str(opt_ml.config_dir),
        "input_data_config": dict(env.input_data_config),
        "input_dir": str(opt_ml.input_dir),
        "instance_groups": [group.name for group in env.instance_groups],
        "instance_groups_dict": {group.name: group.as_dict() for group in env.instance_groups},
        "is_hetero": len(env.instance_groups) > 1,  # the toolkit's rule (groups, not instance types)
        "is_master": env.is_master,
        "is_modelparallel_enabled": env.is_modelparallel_enabled,
        "is_smddpmprun_installed": env.is_smddpmprun_installed,
        "is_smddprun_installed": env.is_smddprun_installed,
        "job_name": env.job_name,
        "log_level": env.log_level,
        "master_hostname": env.master_hostname,
        "model_dir": str(opt_ml.model_dir),
        "module_dir": env.submit_directory,
        "module_name": env.module_name,
        "network_interface_name": env.network_interface_name,
        "num_cpus": env.num_cpus,
        "num_gpus": env.num_gpus,
        "num_neurons": env.num_neurons,
        "output_data_dir": str(opt_ml.output_data_dir),
        "output_dir": str(opt_ml.output_dir),
        "output_intermediate_dir": str(opt_ml.intermediate_dir),
        "resource_config": dict(env.resource_config),
        "topology": env.topology if env.topology is not None else [],
        "user_entry_point": env.user_entry_point,
    }


# The training-environment keys the toolkit's ``to_env_vars()`` exports under their own names.
ENV_TABLE_KEYS = (
    "hosts", "network_interface_name", "resource_config", "input_data_config", "output_data_dir",
    "current_host", "current_instance_type", "current_instance_group", "current_instance_group_hosts",
    "instance_groups", "instance_groups_dict", "distribution_instance_groups", "is_hetero", "module_name",
    "log_level", "framework_module", "input_dir", "input_config_dir", "output_dir", "num_cpus", "num_gpus",
    "num_neurons", "model_dir", "module_dir", "output_intermediate_dir", "user_entry_point",
)


def sm_env(env: TrainingEnv, plan: RankPlan) -> dict[str, str]:
    """Every ``SM_*`` variable the toolkit exports to the user process (its ``to_env_vars()``), and no other."""
    return toolkit_variables(training_env_dict(env, plan), hyperparameter_argv(env.hyperparameters))


def toolkit_variables(training: Mapping[str, Any], user_args: Sequence[str]) -> dict[str, str]:
    """The toolkit's ``to_env_vars()`` of an ``SM_TRAINING_ENV`` document; shared with the compat
    ``sagemaker_training.environment``. Nothing beyond the toolkit's names: a script that leaned on an
    extra SM_* variable here would fail on SageMaker."""
    table: dict[str, Any] = {key: training.get(key) for key in ENV_TABLE_KEYS}
    channels, hyperparameters = training.get("channel_input_dirs", {}), training.get("hyperparameters", {})
    table.update(hps=hyperparameters, framework_params=training.get("additional_framework_parameters", {}), channels=sorted(channels), training_env=dict(training), user_args=list(user_args))
    if training.get("topology"):  # the toolkit exports it only when the platform gave one
        table["topology"] = training["topology"]
    table.update({f"channel_{name}": path for name, path in channels.items()})
    table.update({f"hp_{name}": value for name, value in hyperparameters.items()})
    return {f"SM_{key.upper()}": encode_env_value(value) for key, value in table.items()}


def rank_env(env: TrainingEnv, plan: RankPlan, slot: RankSlot) -> dict[str, str]:
    """The launcher variables of one rank, for mpirun-style and torchrun-style scripts alike; the mpirun-style
    ones (``OMPI_COMM_WORLD_*``, ``SMDATAPARALLEL_LOCAL_RANK``) only where SageMaker's launcher sets them, not
    for torch_distributed (scripts that detect MPI by them would take the wrong path)."""
    master = env.address_of(env.master_hostname)
    if plan.standalone:  # like the toolkit's plain process runner: where the master is, but no rank of its world
        return {"MASTER_ADDR": master, "MASTER_PORT": str(env.ports.master), "SM_CURRENT_HOST": slot.host}
    local_world = plan.local_world_size
    values = {
        "RANK": slot.rank,
        "LOCAL_RANK": slot.local_rank,
        "WORLD_SIZE": plan.world_size,
        "LOCAL_WORLD_SIZE": local_world,
        "GROUP_RANK": slot.node_rank,
        "NODE_RANK": slot.node_rank,
        "GROUP_WORLD_SIZE": len(plan.hosts),
        "MASTER_ADDR": master,
        "MASTER_PORT": env.ports.master,
        "SMDATAPARALLEL_SERVER_ADDR": master,
        "SMDATAPARALLEL_SERVER_PORT": env.ports.server,
        "SAGEMAKER_INSTANCE_TYPE": env.instance_type,
        "SM_CURRENT_HOST": slot.host,
        contract.MESH_SECRET_ENV: contract.mesh_secret(env.job_token),
    }
    if plan.shape is not LaunchShape.TORCH_DISTRIBUTED:  # SageMaker's torchrun sets no MPI-style variables
        values.update({
            "SMDATAPARALLEL_LOCAL_RANK": slot.local_rank,
            "OMPI_COMM_WORLD_RANK": slot.rank,
            "OMPI_COMM_WORLD_LOCAL_RANK": slot.local_rank,
            "OMPI_COMM_WORLD_SIZE": plan.world_size,
            "OMPI_COMM_WORLD_LOCAL_SIZE": local_world,
        })
    return {key: str(value) for key, value in values.items()}


# What torchelastic_env sets: inherited values would make a script think torchrun launched it. Not
# TORCHELASTIC_USE_AGENT_STORE: that one is the rendezvous store's (runtime/store.py) or the user's choice.
_ELASTIC_LAUNCH_VARIABLES = frozenset({"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE"})


def torchelastic_env(env: TrainingEnv, plan: RankPlan, slot: RankSlot, error_file: str) -> dict[str, str]:
    """What torchrun's agent gives each worker, for the torch_distributed launcher (SageMaker runs torchrun).

    ``dist.is_torchelastic_launched()`` is True, and torch's ``@record`` writes its error file where the
    runtime looks for a failed rank's cause. No agent store: the ranks rendezvous through MASTER_ADDR/PORT.
    """
    if plan.standalone or plan.shape is not LaunchShape.TORCH_DISTRIBUTED:
        return {}
    return {
        "TORCHELASTIC_RUN_ID": env.job_name or "none",  # torchrun's default rdzv id is "none"
        "TORCHELASTIC_RESTART_COUNT": str(env.restart_count),  # the job's retries so far (the runtime never restarts ranks alone)
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_ERROR_FILE": str(contract.torchelastic_error_file(Path(error_file))),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(slot.rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
    }


def process_env(base: Mapping[str, str], env: TrainingEnv, plan: RankPlan, slot: RankSlot, *, python_path: Sequence[str], error_file: str) -> dict[str, str]:
    """The complete environment of one rank: inherited variables, SM_*, rank variables, PYTHONPATH."""
    # Inherited launcher state would mislead the ranks (a shell inside torchrun, a runtime's own tree path).
    merged = {key: value for key, value in base.items() if key != contract.ERROR_FILE_ENV and key not in _ELASTIC_LAUNCH_VARIABLES}
    if env.visible_base is not None:  # the script sees its tree at /opt/ml, as on SageMaker (no base dir set)
        merged.pop(contract.BASE_DIR_ENV, None)
    merged.update(sm_env(env, plan))
    merged.update(rank_env(env, plan, slot))
    merged.update(torchelastic_env(env, plan, slot, error_file))
    if "TORCHELASTIC_RUN_ID" in merged:
        merged.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default for its workers
    merged["PYTHONPATH"] = ":".join(python_path)
    merged[contract.ERROR_FILE_ENV] = error_file
    merged[contract.STACKS_FILE_ENV] = str(env.opt_ml.rank_stacks_file(slot.rank))
    merged[contract.PARENT_PID_ENV] = str(os.getpid())  # the rank's bootstrap dies with this runtime
    merged[contract.HOST_SESSION_ENV] = str(os.getsid(0))  # how the host's sweep finds the ranks and their children
    merged.pop(contract.LIFELINE_ENV, None)  # the runtime's to watch, not the ranks'
    merged.setdefault("PYTHONUNBUFFERED", "1")  # logs reach the console as they are written
    merged.setdefault("GLIBC_TUNABLES", MALLOC_KEEPS_MEMORY)
    if plan.local_world_size > 1 and "OMP_NUM_THREADS" not in base:
        # torchrun's reasoning: N ranks each using every core oversubscribe the host.
        merged["OMP_NUM_THREADS"] = str(max(1, env.num_cpus // plan.local_world_size))
    if not env.host_addresses and "NCCL_SOCKET_IFNAME" not in base:
        merged["NCCL_SOCKET_IFNAME"] = env.network_interface_name  # real hosts: the platform's interface
    return merged
