"""Read one host's /opt/ml contract once into a frozen ``TrainingEnv``.

Everything the runtime needs (topology, hyperparameters, channels, GPU count, ports, addresses) is
resolved here, with the training toolkit's defaults, so that later steps are pure functions of it.
Every problem raises ``ContractError`` naming the file (or variable) and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from smddp_sdk.errors import ContractError
from smddp_sdk.runtime.plan import truthy
from smddp_sdk.specs import contract, limits
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import validate_entry_point

N = TypeVar("N", int, float)

DEFAULT_LOG_LEVEL = 20  # logging.INFO, the toolkit's default for sagemaker_container_log_level

# Framework flags that switch on a distributed launch; any of them makes the current group a
# distribution group by default (the toolkit's rule).
DISTRIBUTION_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_torch_distributed_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
)


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    hosts: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "instance_group_name": self.name, "instance_type": self.instance_type}


@dataclass(frozen=True)
class Ports:
    master: int = contract.DEFAULT_MASTER_PORT
    server: int = contract.DEFAULT_SERVER_PORT
    agent: int = contract.DEFAULT_AGENT_PORT


@dataclass(frozen=True)
class TrainingEnv:
    """One host's view of the job, read once from the contract files and the environment."""

    opt_ml: OptMl
    current_host: str
    hosts: tuple[str, ...]
    current_instance_type: str
    current_group_name: str
    instance_groups: tuple[InstanceGroup, ...]
    network_interface_name: str
    resource_config: Mapping[str, Any]
    input_data_config: Mapping[str, Any]
    hyperparameters: Mapping[str, Any]  # user hyperparameters, decoded
    framework_params: Mapping[str, Any]  # the other sagemaker_* keys, decoded
    user_entry_point: str
    submit_directory: str | None
    job_name: str | None
    log_level: int
    num_gpus: int
    num_cpus: int
    framework_module: str = ""
    num_neurons: int = 0
    topology: Any = None
    host_addresses: Mapping[str, str] = field(default_factory=dict)
    ports: Ports = Ports()
    job_token: str = ""
    is_smddprun_installed: bool = False
    is_smddpmprun_installed: bool = False
    is_modelparallel_enabled: bool | str | None = None  # the toolkit's ``mp and mp != "{}"``, value for value
    # Where the rank processes see this host's tree: /opt/ml when the runtime bound it there (local mode),
    # else None (the tree is where SAGEMAKER_BASE_DIR says, /opt/ml itself in a container).
    visible_base: Path | None = None
    planned_gpus: int | None = None  # GPUs to plan ranks for when they differ from what SM_NUM_GPUS reports
    restart_count: int = 0  # the job's retries before this attempt (TORCHELASTIC_RESTART_COUNT)

    @property
    def rank_opt_ml(self) -> OptMl:
        """The /opt/ml paths as the user's script sees them (SM_MODEL_DIR, SM_CHANNEL_*, its cwd)."""
        return OptMl(self.visible_base) if self.visible_base is not None else self.opt_ml

    @property
    def gpus_for_planning(self) -> int:
        return self.num_gpus if self.planned_gpus is None else self.planned_gpus

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(sorted(self.input_data_config))

    @property
    def distribution_instance_groups(self) -> tuple[str, ...]:
        """Groups whose hosts run the distributed launch (explicit list, else the current group if a flag is on)."""
        explicit = self.framework_params.get("sagemaker_distribution_instance_groups")
        if explicit:
            return tuple(str(name) for name in explicit)
        if any(truthy(self.framework_params.get(flag)) for flag in DISTRIBUTION_FLAGS):
            return (self.current_group_name,)
        return ()

    @property
    def distribution_hosts(self) -> tuple[str, ...]:
        """Hosts of the distribution groups in file order (not sorted); ``hosts`` when the file has no groups."""
        wanted = self.distribution_instance_groups
        if not wanted:
            return ()
        if not self.instance_groups:
            return self.hosts
        by_name = {group.name: group for group in self.instance_groups}
        return tuple(host for name in wanted if name in by_name for host in by_name[name].hosts)

    @property
    def ordered_hosts(self) -> tuple[str, ...]:
        """The job's host order: distribution hosts, else ``hosts``. Rank 0 and the master live on the first."""
        return self.distribution_hosts or self.hosts

    @property
    def master_hostname(self) -> str:
        return self.ordered_hosts[0]

    @property
    def is_master(self) -> bool:
        return self.current_host == self.master_hostname

    @property
    def current_instance_group_hosts(self) -> tuple[str, ...]:
        return next((group.hosts for group in self.instance_groups if group.name == self.current_group_name), ())

    @property
    def module_name(self) -> str:
        return self.user_entry_point.removesuffix(".py")

    @property
    def instance_type(self) -> str:
        """What SAGEMAKER_INSTANCE_TYPE reports: the ``sagemaker_instance_type`` hyperparameter, else this host's type."""
        return str(self.framework_params.get("sagemaker_instance_type") or self.current_instance_type)

    def address_of(self, host: str) -> str:
        """Where a rank connects to reach ``host``: the scheduler's mapping, else the name itself (DNS)."""
        return self.host_addresses.get(host, host)


def read_training_env(environ: Mapping[str, str] | None = None) -> TrainingEnv:
    """Read the three config files under SAGEMAKER_BASE_DIR (default /opt/ml) plus the runtime's env knobs."""
    environ = os.environ if environ is None else environ
    opt_ml = OptMl.from_env(environ)
    resource = contract.read_json_file(opt_ml.resource_config_file, required=True)
    raw_hps = contract.read_json_file(opt_ml.hyperparameters_file, default={})
    input_data = contract.read_json_file(opt_ml.input_data_config_file, default={})
    _require_object(opt_ml.hyperparameters_file, raw_hps)
    if environ.get(contract.DRIVER_HYPERPARAMETERS_ENV):  # a v3-shaped job: the framework's from its driver
        driver = Path(environ[contract.DRIVER_HYPERPARAMETERS_ENV])
        driver_hps = contract.read_json_file(driver, required=True)
        _require_object(driver, driver_hps)
        raw_hps = {**raw_hps, **driver_hps}
    _require_object(opt_ml.input_data_config_file, input_data)
    _check_hyperparameters(opt_ml.hyperparameters_file, raw_hps)
    _check_channel_names(opt_ml.input_data_config_file, input_data)
    decoded = {key: contract.decode_hyperparameter(value) if isinstance(value, str) else value for key, value in raw_hps.items()}
    user_hps, framework = contract.split_hyperparameters(decoded)
    topology = _read_topology(opt_ml, resource)
    entry_point = _entry_point(opt_ml, decoded, environ)
    num_gpus, planned_gpus = _gpu_counts(environ)
    return TrainingEnv(
        opt_ml=opt_ml,
        **topology,
        resource_config=resource,
        input_data_config=input_data,
        hyperparameters=user_hps,
        framework_params=framework,
        user_entry_point=entry_point,
        submit_directory=_optional_str(opt_ml, decoded, "sagemaker_submit_directory"),
        job_name=environ.get("TRAINING_JOB_NAME") or _optional_str(opt_ml, decoded, "sagemaker_job_name"),
        log_level=_log_level(opt_ml, decoded),
        num_gpus=num_gpus,
        planned_gpus=planned_gpus,
        num_cpus=os.cpu_count() or 1,
        framework_module=environ.get("SAGEMAKER_TRAINING_MODULE", ""),
        host_addresses=_host_addresses(environ, topology["hosts"]),
        ports=Ports(
            master=_port(environ, contract.MASTER_PORT_ENV, contract.DEFAULT_MASTER_PORT),
            server=_port(environ, contract.SERVER_PORT_ENV, contract.DEFAULT_SERVER_PORT),
            agent=_port(environ, contract.AGENT_PORT_ENV, contract.DEFAULT_AGENT_PORT),
        ),
        job_token=environ.get(contract.JOB_TOKEN_ENV) or _derived_token(opt_ml, topology["hosts"], environ),
        restart_count=_restart_count(environ),
        is_smddprun_installed=shutil.which("smddprun") is not None,
        is_smddpmprun_installed=shutil.which("smddpmprun") is not None,
        # The toolkit's expression, kept as it is so SM_TRAINING_ENV matches it (null when unset).
        is_modelparallel_enabled=(mp := environ.get("SM_HP_MP_PARAMETERS")) and mp != "{}",
    )


# --- resourceconfig.json --------------------------------------------------------------------------


def _read_topology(opt_ml: OptMl, resource: Any) -> dict[str, Any]:
    path = opt_ml.resource_config_file
    _require_object(path, resource)
    hosts = resource.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ContractError(f"{path}: field 'hosts' must be a non-empty list of host names, got {_short(hosts)}")
    if len(hosts) > limits.MAX_INSTANCE_COUNT:
        raise ContractError(f"{path}: field 'hosts' lists {len(hosts)} hosts; a job has at most {limits.MAX_INSTANCE_COUNT} (split the work into several jobs)")
    bad = next((host for host in hosts if not _HOST_NAME.fullmatch(host)), None)
    if bad is not None:
        raise ContractError(f"{path}: host name {bad[:80]!r} must be a DNS name such as algo-1: letters, digits, '-' and '_' in dot-separated labels of at most 63, 253 in all")
    if len(set(hosts)) != len(hosts):
        raise ContractError(f"{path}: field 'hosts' lists a host twice: {_short(hosts)}")
    current = resource.get("current_host")
    if current not in hosts:
        raise ContractError(f"{path}: field 'current_host' must be one of 'hosts' {_short(hosts)}, got {_short(current)}")
    raw_groups = resource.get("instance_groups") or []
    if not isinstance(raw_groups, list):
        raise ContractError(f"{path}: field 'instance_groups' must be a list of groups, got {raw_groups!r}")
    groups = tuple(_instance_group(path, index, raw, hosts) for index, raw in enumerate(raw_groups))
    return {
        "current_host": current,
        "hosts": tuple(hosts),
        "current_instance_type": str(resource.get("current_instance_type") or "local"),
        "current_group_name": str(resource.get("current_group_name") or contract.DEFAULT_GROUP_NAME),
        "instance_groups": groups,
        "network_interface_name": _interface_name(path, resource.get("network_interface_name") or contract.DEFAULT_NETWORK_INTERFACE),
        "topology": resource.get("topology"),
    }


# A DNS name (SageMaker's algo-N, Slurm's node names): labels of 1-63 characters, 253 in all.
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*")


def _interface_name(path: Any, name: Any) -> str:
    """Linux's rule for a network interface name (dev_valid_name): 1-15 bytes, no '/', ':' or whitespace."""
    if not isinstance(name, str) or not 0 < len(name.encode()) < 16 or name in (".", "..") or any(c in "/:" or c.isspace() for c in name):
        raise ContractError(f"{path}: field 'network_interface_name' must name a network interface (1-15 characters, no '/', ':' or spaces, as eth0), got {_short(name)}")
    return name


def _short(value: Any, limit: int = 120) -> str:
    """A value as a message shows it: its repr cut short (a list of a million hosts is not printed)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} items)" if isinstance(value, (list, dict)) else text[:limit] + "..."


def _instance_group(path: Any, index: int, raw: Any, hosts: list[str]) -> InstanceGroup:
    where = f"{path}: field 'instance_groups[{index}]'"
    if not isinstance(raw, dict):
        raise ContractError(f"{where} must be an object with instance_group_name, instance_type and hosts")
    group_hosts = raw.get("hosts")
    if not isinstance(group_hosts, list) or not all(isinstance(h, str) for h in group_hosts):
        raise ContractError(f"{where}.hosts must be a list of host names, got {group_hosts!r}")
    unknown = [h for h in group_hosts if h not in hosts]
    if unknown:
        raise ContractError(f"{where}.hosts names hosts missing from 'hosts': {unknown!r}")
    name = raw.get("instance_group_name")
    if not isinstance(name, str) or not name:
        raise ContractError(f"{where}.instance_group_name must be a non-empty string, got {name!r}")
    return InstanceGroup(name=name, instance_type=str(raw.get("instance_type") or ""), hosts=tuple(group_hosts))


# --- hyperparameters.json ---------------------------------------------------------------------------


def _entry_point(opt_ml: OptMl, decoded: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    name = environ.get("SAGEMAKER_PROGRAM") or decoded.get("sagemaker_program")
    path = opt_ml.hyperparameters_file
    if name is None or name == "":
        raise ContractError(f'{path}: field \'sagemaker_program\' is missing (and SAGEMAKER_PROGRAM is not set); name the script to run, e.g. "sagemaker_program": "\\"train.py\\""')
    if not isinstance(name, str):
        raise ContractError(f"{path}: field 'sagemaker_program' must be a string, got {name!r}")
    problem = validate_entry_point(name)
    if problem:
        raise ContractError(f"{path}: field 'sagemaker_program' {name!r} {problem}")
    return name


def _optional_str(opt_ml: OptMl, decoded: Mapping[str, Any], key: str) -> str | None:
    value = decoded.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ContractError(f"{opt_ml.hyperparameters_file}: field {key!r} must be a string, got {value!r}")
    return value


def _log_level(opt_ml: OptMl, decoded: Mapping[str, Any]) -> int:
    value = decoded.get("sagemaker_container_log_level", DEFAULT_LOG_LEVEL)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{opt_ml.hyperparameters_file}: field 'sagemaker_container_log_level' must be an integer logging level such as 20, got {value!r}")
    return value


_CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # SageMaker's ChannelName


def _check_channel_names(path: Any, input_data: Mapping[str, Any]) -> None:
    """Channel names become directories under input/data: SageMaker's rule, and never '.' or '..'."""
    if len(input_data) > limits.MAX_CHANNELS:
        raise ContractError(f"{path}: {len(input_data)} channels; a job has at most {limits.MAX_CHANNELS} (SageMaker's limit): put related data under one channel")
    for name in input_data:
        if not _CHANNEL_NAME.fullmatch(name) or name in (".", ".."):
            raise ContractError(f"{path}: channel name {name[:80]!r} must be 1-64 letters, digits, '.', '-' or '_' (not '.' or '..')")


def _check_hyperparameters(path: Any, raw: Mapping[str, Any]) -> None:
    """What a rank's argv and environment cannot carry, by the job file's own rules (specs/limits.py): a
    name with NUL, '=' or whitespace, text that is not Unicode (lone surrogates), values nested deeper than
    MAX_JSON_DEPTH, or more than MAX_HYPERPARAMETERS_BYTES in all (found here, not as a rank that fails to start)."""
    total = 0
    for key, value in raw.items():
        text = value if isinstance(value, str) else json.dumps(value)
        name = key.encode("utf-8", "replace")[:60].decode("utf-8", "replace")
        for what, item in (("name", key), ("value", text)):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ContractError(f"{path}: hyperparameter {name!r}: its {what} is not valid Unicode (a lone surrogate)") from None
            if "\0" in item:
                raise ContractError(f"{path}: hyperparameter {name!r}: its {what} holds a NUL character, which no argument can carry")
        problem = limits.hyperparameter_name_problem(key)
        if problem:
            raise ContractError(f"{path}: hyperparameter name {name!r} {problem}; rename it (letters, digits, '_', '-', '.')")
        decoded = contract.decode_hyperparameter(value) if isinstance(value, str) else value
        if contract.json_depth(decoded, limits.MAX_JSON_DEPTH) > limits.MAX_JSON_DEPTH:
            raise ContractError(f"{path}: hyperparameter {name!r}: its value nests deeper than {limits.MAX_JSON_DEPTH} levels; pass structured data as a file")
        if not key.startswith("sagemaker_") and key not in contract.RESERVED_HYPERPARAMETERS:  # the job file's count: what reaches argv
            total += len(key.encode()) + len(text.encode()) + 4  # "--key value" as two argv strings
        if total > limits.MAX_HYPERPARAMETERS_BYTES:
            raise ContractError(f"{path}: the script's hyperparameters take more than {limits.MAX_HYPERPARAMETERS_BYTES} bytes ({len(raw)} in the file); pass large data as an input channel or a file in the code")


def _require_object(path: Any, value: Any) -> None:
    if not isinstance(value, dict):
        raise ContractError(f"{path}: must hold a JSON object, got {type(value).__name__}")


# --- environment knobs ------------------------------------------------------------------------------


def _gpu_counts(environ: Mapping[str, str]) -> tuple[int, int | None]:
    """(SM_NUM_GPUS, GPUs to plan ranks for, None when the same).

    Without SMDDP_NUM_GPUS both are this machine's GPUs. With it (a simulated instance type), ranks are
    planned for that many GPUs, and SM_NUM_GPUS reports it only where this machine has GPUs at all: on a
    CPU-only machine it is 0, so scripts that pick their device from it (``use_cuda = num_gpus > 0``) take
    their CPU path instead of failing in ``torch.cuda``.
    """
    if not environ.get(contract.NUM_GPUS_ENV, "").strip():
        return probe_gpu_count(), None
    simulated = number_env(environ, contract.NUM_GPUS_ENV, 0, int, limits.MAX_PROCESSES_PER_HOST)
    reported = simulated if simulated and probe_gpu_count() > 0 else 0
    return reported, (simulated if simulated != reported else None)


def probe_gpu_count() -> int:
    """GPUs on this machine as the toolkit counts them: ``nvidia-smi --list-gpus`` lines starting 'GPU '."""
    try:
        listing = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def number_env(environ: Mapping[str, str], name: str, default: N, kind: type[N], maximum: N | None = None) -> N:
    """A finite number from 0 to ``maximum`` from the environment (``kind`` is int or float), or ``default``
    when unset; nan, inf and anything out of range is a ContractError."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = kind(-1)
    if not 0 <= value <= (math.inf if maximum is None else maximum):  # false for nan too
        what = "a non-negative integer" if kind is int else "a number of seconds (>= 0)"
        bounds = f" up to {maximum:g}" if maximum is not None else ""
        raise ContractError(f"environment variable {name}={raw[:40]!r} must be {what}{bounds}")
    return value


def _port(environ: Mapping[str, str], name: str, default: int) -> int:
    port = number_env(environ, name, default, int)
    if not 0 < port < 65536:
        raise ContractError(f"environment variable {name}={port} must be a TCP port between 1 and 65535")
    return port


def _host_addresses(environ: Mapping[str, str], hosts: tuple[str, ...]) -> dict[str, str]:
    raw = environ.get(contract.HOST_ADDRESSES_ENV, "").strip()
    if not raw:
        return {}
    name = contract.HOST_ADDRESSES_ENV
    try:
        mapping = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ContractError(f'environment variable {name} is not valid JSON ({exc}); expected {{"algo-1": "127.0.0.1", ...}}') from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in mapping.items()):
        raise ContractError(f"environment variable {name} must map host names to address strings, got {raw!r}")
    missing = [host for host in hosts if host not in mapping]
    if missing:
        raise ContractError(f"environment variable {name} has no address for hosts {missing!r}")
    return mapping


def _derived_token(opt_ml: OptMl, hosts: tuple[str, ...], environ: Mapping[str, str]) -> str:
    """A job identity every host can compute alike: the hyperparameters file, the host list and the job name."""
    digest = hashlib.sha256()
    with suppress(OSError):
        digest.update(opt_ml.hyperparameters_file.read_bytes())
    digest.update(json.dumps(sorted(hosts)).encode())
    digest.update(environ.get("TRAINING_JOB_NAME", "").encode())
    return digest.hexdigest()


def _restart_count(environ: Mapping[str, str]) -> int:
    """Retries before this attempt: the supervisor's count (local and docker), else Slurm's requeues."""
    for name in (contract.RESTART_COUNT_ENV, "SLURM_RESTART_COUNT"):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0
