"""Spawn real rank processes for collective tests, each with its own simulated host name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

import smddp_sdk

PROJECT_ROOT = Path(smddp_sdk.__file__).resolve().parent.parent


def rank_env(rank: int, hosts: list[str], store_port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(len(hosts)), "LOCAL_RANK": str(hosts[:rank].count(hosts[rank])),
        "SM_CURRENT_HOST": hosts[rank], "SMDDP_TEST_STORE": f"127.0.0.1:{store_port}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    })
    env.update(extra or {})
    return env


NATIVE_PATHS = ["1", "0", "mixed"]
NATIVE_IDS = ["native", "python", "mixed"]


def native_setting(path: str, rank: int) -> str:
    """SMDDP_NATIVE for a rank: "1" (native core and kernels), "0" (pure Python), or "mixed": even ranks
    native, odd ranks Python, so every collective meets both implementations of the protocol."""
    return ("1" if rank % 2 == 0 else "0") if path == "mixed" else path


class Cluster:
    """One rank process per entry of hosts, all joined in one smddp group, driven through a TCPStore."""

    def __init__(self, hosts: list[str], scenario: str = "serve", env: dict[str, str] | None = None,
                 native: str | None = None) -> None:
        self.hosts = hosts
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "tests.collectives.worker", scenario], cwd=PROJECT_ROOT,
                             env=rank_env(r, hosts, self.store.port, {**(env or {}), **self._native_env(native, r)}),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(len(hosts))
        ]
        self._next_case = 0

    @staticmethod
    def _native_env(native: str | None, rank: int) -> dict[str, str]:
        return {} if native is None else {"SMDDP_NATIVE": native_setting(native, rank)}

    def wait_ready(self) -> None:
        self.store.wait([f"ready/{r}" for r in range(len(self.hosts))])

    def run(self, case: dict) -> list[str]:
        """Send one case to every rank and return each rank's verdict ("ok", "skip" or an error)."""
        k = self._next_case
        self._next_case += 1
        self.store.set(f"case/{k}", json.dumps(case))
        return [self.store.get(f"result/{k}/{r}").decode() for r in range(len(self.hosts))]

    def finish(self, timeout: float = 60) -> list[tuple[int, str]]:
        """Wait for every rank to exit; returns (exit code, output) per rank."""
        results = []
        for proc in self.procs:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            results.append((proc.returncode, out))
        return results

    def close(self) -> list[tuple[int, str]]:
        self.store.set(f"case/{self._next_case}", json.dumps({"op": "stop"}))
        return self.finish()
