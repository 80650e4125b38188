"""Start one process per rank of a benchmark on this machine (simulated hosts via SM_CURRENT_HOST)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def host_names(world_size: int, hosts: int) -> list[str]:
    """Ranks split evenly over `hosts` simulated hosts named algo-1..algo-N, in rank order."""
    per_host = -(-world_size // hosts)
    return [f"algo-{rank // per_host + 1}" for rank in range(world_size)]


def run_ranks(script: str, args: list[str], world_size: int, hosts: int = 1, env: dict[str, str] | None = None) -> int:
    """Run `python script --rank-process args...` world_size times; returns the worst exit code."""
    port = pick_free_ports(1)[0]
    names = host_names(world_size, hosts)
    procs = []
    for rank in range(world_size):
        rank_env = dict(os.environ)
        rank_env.update({
            "RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "LOCAL_RANK": str(names[:rank].count(names[rank])), "LOCAL_WORLD_SIZE": str(names.count(names[rank])),
            "SM_CURRENT_HOST": names[rank], "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
        })
        rank_env.update(env or {})
        procs.append(subprocess.Popen([sys.executable, script, "--rank-process", *args], env=rank_env))
    codes = [proc.wait() for proc in procs]
    return max(codes, key=abs)
