"""The node runtime (``python -m smddp_sdk.runtime``) fed hostile config files and environment: each case
exits 2 with a one-line reason, prints no traceback, starts no rank and writes nothing outside its tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from smddp_sdk.specs import contract

RESOURCE = {"current_host": "algo-1", "hosts": ["algo-1"]}
HYPERPARAMETERS = {"sagemaker_program": '"train.py"'}


def _tree(base: Path, resource: object = RESOURCE, hyperparameters: object = HYPERPARAMETERS, input_data: object = None) -> None:
    config = base / "input" / "config"
    config.mkdir(parents=True)
    for name, value in (("resourceconfig.json", resource), ("hyperparameters.json", hyperparameters), ("inputdataconfig.json", input_data)):
        if value is not None:
            (config / name).write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
    (base / "code").mkdir()
    (base / "code" / "train.py").write_text("open('RAN', 'w').close()\n")


def _raw_hps(text: str) -> bytes:
    return ('{"sagemaker_program": "\\"train.py\\"", ' + text + "}").encode()


# case -> (how to make the tree, extra environment, what the reason says)
CASES: dict[str, tuple[Callable[[Path], None], dict[str, str], str]] = {
    "resourceconfig not UTF-8": (lambda b: _tree(b, resource=b"\xff\xfe{}"), {}, "not UTF-8"),
    "hyperparameters nested 100000 deep": (lambda b: _tree(b, hyperparameters=b"[" * 100_000 + b"]" * 100_000), {}, "nested too deeply"),
    "instance_groups: 5": (lambda b: _tree(b, resource={**RESOURCE, "instance_groups": 5}), {}, "'instance_groups' must be a list"),
    "instance_groups: [5]": (lambda b: _tree(b, resource={**RESOURCE, "instance_groups": [5]}), {}, "instance_groups[0]"),
    "hosts: 5": (lambda b: _tree(b, resource={"current_host": "algo-1", "hosts": 5}), {}, "'hosts' must be"),
    "resourceconfig a list": (lambda b: _tree(b, resource=[1]), {}, "must hold a JSON object"),
    "channel name with ../": (lambda b: _tree(b, input_data={"../../etc": {}}), {}, "channel name '../../etc'"),
    "channel name ..": (lambda b: _tree(b, input_data={"..": {}}), {}, "channel name '..'"),
    "NUL in a hyperparameter": (lambda b: _tree(b, hyperparameters=_raw_hps('"lr": "\\"a\\u0000b\\""')), {}, "NUL"),
    "surrogate in a hyperparameter name": (lambda b: _tree(b, hyperparameters=_raw_hps('"\\ud800": "1"')), {}, "lone surrogate"),
    "surrogate in a hyperparameter value": (lambda b: _tree(b, hyperparameters=_raw_hps('"x": "\\"\\udc00\\""')), {}, "lone surrogate"),
    "hyperparameter over 128 KiB": (lambda b: _tree(b, hyperparameters=_raw_hps('"big": "' + "x" * 140_000 + '"')), {}, "hyperparameters take more than 131072 bytes"),
    "SMDDP_STOP_GRACE=nan": (_tree, {contract.STOP_GRACE_ENV: "nan"}, "SMDDP_STOP_GRACE='nan' must be a number of seconds"),
    "SMDDP_STOP_GRACE=inf": (_tree, {contract.STOP_GRACE_ENV: "inf"}, "SMDDP_STOP_GRACE"),
    "SMDDP_AGENT_TIMEOUT=-1": (_tree, {contract.AGENT_TIMEOUT_ENV: "-1"}, "SMDDP_AGENT_TIMEOUT"),
    "SMDDP_NUM_GPUS=100000": (_tree, {contract.NUM_GPUS_ENV: "100000"}, "SMDDP_NUM_GPUS='100000' must be a non-negative integer up to 512"),
    "SMDDP_NUM_GPUS=1e3": (_tree, {contract.NUM_GPUS_ENV: "1e3"}, "SMDDP_NUM_GPUS"),
    "SMDDP_HOST_ADDRESSES nested deep": (_tree, {contract.HOST_ADDRESSES_ENV: "[" * 100_000}, "SMDDP_HOST_ADDRESSES"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_runtime_input_exits_2_with_one_line_and_writes_nothing_outside(tmp_path: Path, case: str) -> None:
    make, extra, reason = CASES[case]
    base = tmp_path / "opt_ml"
    base.mkdir()
    make(base)
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, contract.BASE_DIR_ENV: str(base), "SMDDP_RUNTIME_STORE": "0", **extra}
    env.pop(contract.NUM_GPUS_ENV, None) if contract.NUM_GPUS_ENV not in extra else None
    result = subprocess.run([sys.executable, "-m", "smddp_sdk.runtime"], env=env, cwd=tmp_path, capture_output=True, text=True, errors="replace", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and reason in output, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1, output  # one line says what is wrong
    assert not (base / "code" / "RAN").exists()  # no rank started
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside the tree
    failure = (base / "output" / "failure").read_text()
    assert reason in failure and "\n" not in failure.rstrip("\n"), failure
