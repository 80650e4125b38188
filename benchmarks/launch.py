"""Start one process per rank of a benchmark on this machine (simulated hosts via SM_CURRENT_HOST)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def host_names(world_size: int, hosts: int) -> list[str]:
    """Ranks split evenly over `hosts` simulated hosts named algo-1..algo-N, in rank order."""
    per_host = -(-world_size // hosts)
    return [f"algo-{rank // per_host + 1}" for rank in range(world_size)]


HOSTS_ENV = "SMDDP_BENCH_HOSTS"  # under mpirun: over how many simulated hosts the ranks are split


def rank_env(rank: int, world_size: int, hosts: int, port: int) -> dict[str, str]:
    """What one rank of a benchmark is told: its place in the world and on its simulated host."""
    names = host_names(world_size, hosts)
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "LOCAL_RANK": str(names[:rank].count(names[rank])), "LOCAL_WORLD_SIZE": str(names.count(names[rank])),
        "SM_CURRENT_HOST": names[rank],
    }


def run_ranks(script: str, args: list[str], world_size: int, hosts: int = 1, env: dict[str, str] | None = None,
              mpirun: bool = False) -> int:
    """Run `python script --rank-process args...` world_size times; returns the worst exit code. With
    mpirun the ranks are Open MPI's too (one world for mpi4py in the same processes); each takes its
    place from Open MPI's numbering (adopt_mpi_rank)."""
    port = pick_free_ports(1)[0]
    common = {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    command = [sys.executable, script, "--rank-process", *args]
    if mpirun:
        return _run_under_mpirun(command, world_size, hosts, port, common)
    procs = [subprocess.Popen(command, env={**os.environ, **rank_env(rank, world_size, hosts, port), **common})
             for rank in range(world_size)]
    codes = [proc.wait() for proc in procs]
    return max(codes, key=abs)


def _run_under_mpirun(command: list[str], world_size: int, hosts: int, port: int, common: dict[str, str]) -> int:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit("--backends mpi needs Open MPI and mpi4py: run benchmarks/setup-mpi.sh first")
    exported = {**common, "MASTER_PORT": str(port), HOSTS_ENV: str(hosts)}
    forward = [flag for name in exported for flag in ("-x", name)]
    # unbound ranks, as ours are; --oversubscribe: more ranks than cores is a case the benchmarks measure
    launch = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(world_size), *forward]
    return subprocess.run([*launch, *command], env={**os.environ, **exported}).returncode


def adopt_mpi_rank(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Under mpirun: RANK, WORLD_SIZE, LOCAL_* and SM_CURRENT_HOST from Open MPI's numbering of this rank."""
    if "OMPI_COMM_WORLD_RANK" in environ:
        rank, size = int(environ["OMPI_COMM_WORLD_RANK"]), int(environ["OMPI_COMM_WORLD_SIZE"])
        environ.update(rank_env(rank, size, int(environ[HOSTS_ENV]), int(environ["MASTER_PORT"])))
