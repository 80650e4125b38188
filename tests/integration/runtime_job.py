"""Helpers for runtime integration tests: lay out simulated hosts and run one runtime process per host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import smddp_sdk
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports
from smddp_sdk.specs import contract
from smddp_sdk.specs.contract import OptMl

PACKAGE_ROOT = str(Path(smddp_sdk.__file__).resolve().parent.parent)


@dataclass
class SimulatedJob:
    """N simulated hosts on this machine, each with its own /opt/ml tree under ``root``."""

    root: Path
    hosts: tuple[str, ...]
    env: dict[str, str]

    def opt_ml(self, host: str) -> OptMl:
        return OptMl(self.root / host)

    def start(self, extra_env: Mapping[str, str] | None = None, wrapper: Sequence[str] = ()) -> dict[str, subprocess.Popen[str]]:
        """One runtime per host; ``wrapper`` (e.g. ``unshare --user``) goes in front of each command."""
        runtimes = {}
        for host in self.hosts:
            env = {**self.env, **(extra_env or {}), contract.BASE_DIR_ENV: str(self.opt_ml(host).base)}
            runtimes[host] = subprocess.Popen(
                [*wrapper, sys.executable, "-m", "smddp_sdk.runtime"], env=env, cwd=self.root,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )
        return runtimes


def make_job(
    root: Path,
    code_dir: Path,
    hosts: Sequence[str],
    hyperparameters: Mapping[str, Any],
    *,
    entry_point: str = "train.py",
    num_gpus: int = 0,
    group_hosts: Sequence[str] | None = None,
) -> SimulatedJob:
    master, server, agent = pick_free_ports(3)
    hps = {"sagemaker_program": entry_point, "sagemaker_submit_directory": f"file://{code_dir}", **hyperparameters}
    for host in hosts:
        resource = contract.resource_config(host, sorted(hosts), "ml.c5.xlarge")
        resource["instance_groups"][0]["hosts"] = list(group_hosts or hosts)
        contract.write_config_files(
            OptMl(root / host), resource=resource, hyperparameters=contract.encode_hyperparameters(hps),
            input_data=contract.input_data_config({"train": {}}),
        )
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith(("SMDDP_", "SM_", "SAGEMAKER_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))
    }
    env.update({
        "PYTHONPATH": PACKAGE_ROOT,
        contract.HOST_ADDRESSES_ENV: json.dumps({host: "127.0.0.1" for host in hosts}),
        contract.MASTER_PORT_ENV: str(master),
        contract.SERVER_PORT_ENV: str(server),
        contract.AGENT_PORT_ENV: str(agent),
        contract.NUM_GPUS_ENV: str(num_gpus),
        "OMP_NUM_THREADS": "1",
    })
    return SimulatedJob(root, tuple(hosts), env)


def wait_all(runtimes: Mapping[str, subprocess.Popen[str]], timeout: float) -> dict[str, tuple[int, str]]:
    """Wait for every runtime; kill the lot (and fail loudly) if they overrun ``timeout``."""
    deadline = time.monotonic() + timeout
    results = {}
    try:
        for host, proc in runtimes.items():
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results[host] = (proc.returncode, out)
    finally:
        for proc in runtimes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (read from /proc, no psutil)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
