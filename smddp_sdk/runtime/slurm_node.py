"""One node of a Slurm job: build this node's ``/opt/ml`` contract from Slurm's environment, then run the
same node runtime as everywhere else (``python -m smddp_sdk.runtime`` with ``SMDDP_SLURM_JOB_DIR`` set).

The scheduler staged the tree of node ``i`` (``SLURM_NODEID``) in the shared job directory: code,
hyperparameters, channels. Only Slurm knows the node names, so this writes ``resourceconfig.json``
(``hosts`` in ``SLURM_JOB_NODELIST`` order, ``current_host`` this node) and hands the runtime the
addresses (each node's ``NodeAddr``), the job token and ports derived from the Slurm job id (several
nodes may share one address, as on a test machine: only the first node listens, on ports of its job).

``python -m smddp_sdk.runtime.slurm_node finish CODE`` runs once after the job step (in the batch
script): it merges the nodes' ``model`` and ``output/data`` into the two archives and records the result.

Stdlib only, like the rest of the runtime.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from smddp_sdk.errors import ContractError, SmddpError
from smddp_sdk.runtime.training_env import probe_gpu_count
from smddp_sdk.specs import contract, events, limits
from smddp_sdk.specs.archives import write_archive
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.json_files import read_json_object, write_json_atomic
from smddp_sdk.specs.slurm_job import AUTO_RANKS, JOB_DIR_ENV, SlurmJobDir, scontrol_records

PORT_BASE = 20000  # below the kernel's ephemeral range, so no outgoing connection is handed one
PORT_SLOTS = 4000  # distinct port triples; two live jobs on one node collide only 1 in 4000


def wanted(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(JOB_DIR_ENV))


def main(environ: Mapping[str, str] | None = None) -> int:
    """This node's share of the job: the runtime's exit code (2 when Slurm's environment is unusable)."""
    from smddp_sdk.runtime.main import main as run_runtime

    try:
        node_env = node_environ(os.environ if environ is None else environ)
    except SmddpError as exc:
        print(f"[{os.environ.get('SLURMD_NODENAME', 'slurm')}]: error: {exc}", flush=True)
        return exc.exit_code
    return run_runtime(node_env)


def node_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The runtime's environment for this node, after writing its resourceconfig.json."""
    job_dir = SlurmJobDir(Path(environ[JOB_DIR_ENV]))
    node = read_json_object(job_dir.node_file)
    if node is None:
        raise ContractError(f"{job_dir.node_file} is missing or unreadable: is the job directory on a file system every node shares?")
    nodelist = _required(environ, "SLURM_JOB_NODELIST")
    hosts = expand_nodelist(nodelist)
    index = int(_required(environ, "SLURM_NODEID"))
    current = environ.get("SLURMD_NODENAME") or hosts[index]
    tree = OptMl(job_dir.node_tree(index))
    if not tree.base.is_dir():
        raise ContractError(f"no staged tree for node {index} at {tree.base}")
    for path in (tree.failure_file, tree.failures_file, tree.success_file):  # a requeued job starts again in the same tree
        path.unlink(missing_ok=True)
    contract.write_config_files(
        tree,
        resource=contract.resource_config(current, hosts, node["instance_type"]),
        hyperparameters=contract.read_json_file(tree.hyperparameters_file, required=True),
        input_data=contract.read_json_file(tree.input_data_config_file, default={}),
    )
    # The node's scratch in the shared job directory, not on the node: a requeued job runs again, maybe on other
    # nodes, and its ranks restore the state the stopped ones kept there (collectives/recovery.py).
    scratch = job_dir.node_scratch(index)
    scratch.parent.mkdir(mode=0o700, exist_ok=True)
    scratch.mkdir(mode=0o700, exist_ok=True)
    master, server, agent = job_ports(int(_required(environ, "SLURM_JOB_ID")))
    env = dict(environ)
    env.update(
        {
            contract.BASE_DIR_ENV: str(tree.base),
            "TRAINING_JOB_NAME": node["job_name"],
            contract.HOST_ADDRESSES_ENV: json.dumps(node_addresses(hosts, nodelist, environ), separators=(",", ":")),
            contract.JOB_TOKEN_ENV: node["job_token"],
        }
    )
    if node.get("encrypt_links"):  # the job's encrypt_inter_container_traffic, over its environment
        env[contract.LINK_ENCRYPT_ENV] = "1"
    # The job's own settings win (environment: in the job spec reaches here through the batch script).
    env.setdefault(contract.MASTER_PORT_ENV, str(master))
    env.setdefault(contract.SERVER_PORT_ENV, str(server))
    env.setdefault(contract.AGENT_PORT_ENV, str(agent))
    env.setdefault(contract.BIND_OPT_ML_ENV, "1")
    env.setdefault(contract.SCRATCH_ENV, str(scratch))
    env.setdefault(events.ATTEMPT_ENV, str(1 + int(environ.get("SLURM_RESTART_COUNT") or 0)))  # a requeue is the next attempt
    ranks = node.get("processes_per_host")
    if ranks in (None, AUTO_RANKS):  # as torchrun's --nproc-per-node auto: the GPUs, else a rank per CPU Slurm allotted here
        ranks = None if probe_gpu_count() else cpu_ranks(environ)
    if ranks is not None:
        env.setdefault(contract.NUM_GPUS_ENV, str(ranks))
    return env


def cpu_ranks(environ: Mapping[str, str]) -> int:
    """The ranks of a CPU node: the CPUs Slurm allotted the job on it (SLURM_CPUS_ON_NODE), else the cores
    this task may run on; at most MAX_PROCESSES_PER_HOST."""
    allotted = environ.get("SLURM_CPUS_ON_NODE", "").strip()
    cores = int(allotted) if allotted.isdigit() and int(allotted) > 0 else len(os.sched_getaffinity(0))
    return min(cores, limits.MAX_PROCESSES_PER_HOST)


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise ContractError(f"{name} is not set: the node runtime must run as a task of a Slurm job step (srun)")
    return value


def job_ports(job_id: int) -> tuple[int, int, int]:
    """Master (rendezvous), server and agent ports of a job: fixed per job, different between jobs."""
    base = PORT_BASE + (job_id % PORT_SLOTS) * 3
    return base, base + 1, base + 2


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """``n[1-3,5],gpu-a[01-02]`` -> ``n1 n2 n3 n5 gpu-a01 gpu-a02`` (Slurm's order, zero padding kept)."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        prefix, bracket, rest = item.partition("[")
        if not bracket:
            hosts.append(item)
            continue
        ranges, _, suffix = rest.partition("]")
        for part in ranges.split(","):
            match = _RANGE.match(part)
            if match is None:
                raise ContractError(f"cannot read the node list {nodelist!r} (range {part!r})")
            low, high = match[1], match[2] or match[1]
            hosts += [f"{prefix}{number:0{len(low)}d}{suffix}" for number in range(int(low), int(high) + 1)]
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for position, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(nodelist[start:position])
            start = position + 1
    items.append(nodelist[start:])
    return [item for item in items if item]


def node_addresses(hosts: list[str], nodelist: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Each node's ``NodeAddr`` as the controller knows it (the name itself where it cannot say)."""
    try:
        argv = ["scontrol", "show", "node", "-o", nodelist]
        shown = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, env=dict(environ)).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    addresses = {node["NodeName"]: node["NodeAddr"] for node in scontrol_records(shown) if node.get("NodeName") and node.get("NodeAddr")}
    return {host: addresses.get(host, host) for host in hosts}


def finish(job_dir: SlurmJobDir, exit_code: int, environ: Mapping[str, str]) -> None:
    """After the job step: the archives from every node's tree, and result.json naming them."""
    node = read_json_object(job_dir.node_file) or {}
    artifacts = node.get("artifacts") or {}
    trees = [OptMl(path) for path in job_dir.node_trees()]
    result = {"exit_code": exit_code, "restart_count": int(environ.get("SLURM_RESTART_COUNT") or 0), "ended": time.time()}
    for key, roots in (("model_data", [t.model_dir for t in trees]), ("output_data", [t.output_data_dir for t in trees])):
        if artifacts.get(key):
            archive = Path(artifacts[key])
            archive.parent.mkdir(parents=True, exist_ok=True)
            skipped = write_archive(archive, roots)
            result[key] = str(archive)
            if skipped:
                result.setdefault("skipped", []).extend(skipped)
    write_json_atomic(job_dir.result_file, result)


if __name__ == "__main__":
    if sys.argv[1:2] == ["finish"] and len(sys.argv) == 3:
        finish(SlurmJobDir(Path(os.environ[JOB_DIR_ENV])), int(sys.argv[2]), os.environ)
        sys.exit(0)
    sys.exit(main())
