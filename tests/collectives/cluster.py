"""Spawn real rank processes for collective tests, each with its own simulated host name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
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


def run_scenario(worker: str, scenario: str, hosts: list[str], env_of: Callable[[int], dict[str, str]], timeout: float,
                 meanwhile: Callable[[dist.TCPStore], None] = lambda store: None) -> list[dict]:
    """One rank per host entry running `python -m worker scenario` (env_of(rank) added to its environment)
    against a fresh TCPStore, meanwhile(store) while they run; each rank's report under
    report/<scenario>/<rank>, or {"crash": its output} where it left none."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    procs = [subprocess.Popen([sys.executable, "-m", worker, scenario], cwd=PROJECT_ROOT, env=rank_env(r, hosts, store.port, env_of(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(len(hosts))]
    meanwhile(store)
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate()[0] + "\n(timed out)")
    key = f"report/{scenario}/"
    return [json.loads(store.get(key + str(r))) if store.check([key + str(r)]) else {"crash": outputs[r]} for r in range(len(hosts))]


def join_test_group(pg_timeout_s: float = 60) -> tuple[dist.TCPStore, int, int]:
    """A worker's start: the test's TCPStore (SMDDP_TEST_STORE), then the smddp group; (store, rank, size)."""
    host, port = os.environ["SMDDP_TEST_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=120))
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("smddp", store=dist.PrefixStore("pg/", store), rank=rank, world_size=size, timeout=timedelta(seconds=pg_timeout_s))
    return store, rank, size


def report_and_exit(store: dist.TCPStore, scenario: str, rank: int, run: Callable[[], dict], clean: Callable[[dict], bool]) -> None:
    """A worker's end: run the scenario, leave its report (or its traceback) where run_scenario reads it,
    leave the group where clean(report), and exit at once: a failed group's threads must not hold the exit."""
    try:
        report = run()
    except Exception:  # noqa: BLE001 - the test reads it
        report = {"crash": traceback.format_exc()}
    store.set(f"report/{scenario}/{rank}", json.dumps(report))
    if clean(report):
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


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
