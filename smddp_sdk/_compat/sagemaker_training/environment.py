"""`sagemaker_training.environment.Environment`, read from what the smddp runtime exports.

The runtime sets SM_TRAINING_ENV (one JSON object) and the individual SM_* variables, as SageMaker's
training toolkit does; this class reads them back so scripts that build ``Environment()`` keep working.
It never shells out (the toolkit runs nvidia-smi and friends on every construction).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from smddp_sdk.runtime.env import toolkit_variables

TRAINING_ENV_KEYS = (
    "additional_framework_parameters", "channel_input_dirs", "current_host", "current_instance_group",
    "current_instance_group_hosts", "current_instance_type", "distribution_hosts", "distribution_instance_groups",
    "framework_module", "hosts", "hyperparameters", "input_config_dir", "input_data_config", "input_dir",
    "instance_groups", "instance_groups_dict", "is_hetero", "is_master", "is_modelparallel_enabled",
    "is_smddpmprun_installed", "is_smddprun_installed", "job_name", "log_level", "master_hostname", "model_dir",
    "module_dir", "module_name", "network_interface_name", "num_cpus", "num_gpus", "num_neurons",
    "output_data_dir", "output_dir", "output_intermediate_dir", "resource_config", "topology", "user_entry_point",
)
# SM_* variable names that differ from "SM_" + key.upper()
_ENV_NAMES = {"hyperparameters": "SM_HPS", "input_data_config": "SM_INPUT_DATA_CONFIG", "resource_config": "SM_RESOURCE_CONFIG"}
_DEFAULTS: dict[str, Any] = {
    "hosts": [], "current_host": "", "hyperparameters": {}, "additional_framework_parameters": {},
    "channel_input_dirs": {}, "num_gpus": 0, "num_cpus": os.cpu_count() or 1, "num_neurons": 0, "log_level": 20,
    "model_dir": "/opt/ml/model", "input_dir": "/opt/ml/input", "input_config_dir": "/opt/ml/input/config",
    "output_dir": "/opt/ml/output", "output_data_dir": "/opt/ml/output/data",
    "output_intermediate_dir": "/opt/ml/output/intermediate", "network_interface_name": "eth0",
    "is_master": True, "is_hetero": False, "is_modelparallel_enabled": False,
}


def _decode(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _from_variables(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in TRAINING_ENV_KEYS:
        name = _ENV_NAMES.get(key, "SM_" + key.upper())
        if name in environ:
            values[key] = _decode(environ[name])
    channels = {k[len("SM_CHANNEL_"):].lower(): v for k, v in environ.items() if k.startswith("SM_CHANNEL_") and k != "SM_CHANNELS"}
    if channels and "channel_input_dirs" not in values:
        values["channel_input_dirs"] = channels
    return values


class Environment(Mapping[str, Any]):
    """The training environment as a read-only mapping with one attribute per SM_TRAINING_ENV key."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        values = dict(_DEFAULTS)
        values.update(_from_variables(environ))
        if environ.get("SM_TRAINING_ENV"):
            values.update(json.loads(environ["SM_TRAINING_ENV"]))
        values.setdefault("master_hostname", (values.get("hosts") or [values.get("current_host", "")])[0])
        self._values = values
        self._user_args = _decode(environ.get("SM_USER_ARGS", "[]"))

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"Environment has no attribute {name!r}; known: {', '.join(sorted(self.__dict__['_values']))}") from None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def properties(self) -> list[str]:
        """The public property names, as the toolkit's ``Environment.properties()`` lists them."""
        return sorted(self._values)

    def to_cmd_args(self) -> list[str]:
        """The user's hyperparameters as argv (what the entry point received)."""
        return list(self._user_args) if isinstance(self._user_args, list) else []

    def to_env_vars(self) -> dict[str, str]:
        """The toolkit's ``to_env_vars()``: the same SM_* names and encodings (str as-is, None as "",
        everything else sorted compact JSON), nothing more."""
        return toolkit_variables(self._values, self.to_cmd_args())

    def __repr__(self) -> str:
        return f"Environment(current_host={self._values.get('current_host')!r}, hosts={self._values.get('hosts')!r})"
