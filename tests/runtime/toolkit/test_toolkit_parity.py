"""Our SM_* environment and the compat ``Environment`` against what AWS's sagemaker-training toolkit computed
for the same job (``toolkit_output.json``, recorded by ``record_toolkit.py`` from sagemaker-training 5.1.4)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk._compat.sagemaker_training.environment import Environment
from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime import plan as planning
from smddp_sdk.runtime.training_env import read_training_env
from tests.runtime.toolkit.record_toolkit import write_tree

HERE = Path(__file__).resolve().parent
JOB = json.loads((HERE / "job.json").read_text())
TOOLKIT = json.loads((HERE / "toolkit_output.json").read_text())
# What depends on the machine the record was made on, not on the job.
MACHINE_KEYS = ("num_cpus", "num_gpus")


def _normalise_vars(variables: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = dict(variables)
    for key in MACHINE_KEYS:
        out.pop(f"SM_{key.upper()}", None)
    training = json.loads(out.pop("SM_TRAINING_ENV"))
    return {**out, "SM_TRAINING_ENV": _normalise_properties(training)}


def _normalise_properties(properties: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in properties.items() if key not in MACHINE_KEYS}


@pytest.fixture()
def our_sm_env(tmp_path: Path) -> dict[str, str]:
    """The SM_* variables our runtime gives the ranks of this job (its tree seen at /opt/ml, as when bound)."""
    write_tree(tmp_path, JOB)
    environ = {"SAGEMAKER_BASE_DIR": str(tmp_path), **JOB["environment"]}
    env = dataclasses.replace(read_training_env(environ), visible_base=Path("/opt/ml"))
    shape = planning.launch_shape(env.framework_params, env.current_host in env.distribution_hosts)
    plan = planning.plan_ranks(env.ordered_hosts, env.current_host, shape, 1, planning.total_processes(shape, env.framework_params))
    return rank_env.sm_env(env, plan)


def test_rank_sm_variables_are_the_toolkits(our_sm_env: dict[str, str]) -> None:
    assert _normalise_vars(our_sm_env) == _normalise_vars(TOOLKIT["to_env_vars"])


def test_compat_environment_matches_the_toolkit(our_sm_env: dict[str, str]) -> None:
    environment = Environment(our_sm_env)
    assert _normalise_vars(environment.to_env_vars()) == _normalise_vars(TOOLKIT["to_env_vars"])
    assert _normalise_properties(dict(environment)) == _normalise_properties(TOOLKIT["properties"])
    assert environment.to_cmd_args() == TOOLKIT["to_cmd_args"]
    assert environment.hyperparameters == TOOLKIT["properties"]["hyperparameters"]
    assert environment.channel_input_dirs == {"test": "/opt/ml/input/data/test", "train": "/opt/ml/input/data/train"}
    assert environment.num_cpus == (os.cpu_count() or 1)


def test_no_name_beyond_the_toolkits(our_sm_env: dict[str, str]) -> None:
    assert sorted(our_sm_env) == sorted(TOOLKIT["to_env_vars"])
