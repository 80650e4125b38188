"""How fast the node runtimes of one job stop after a rank fails, and what a no-op job costs.

    python benchmarks/runtime_failure_propagation.py --repeats 5 --hosts 2 --ranks 2

Each repeat lays out N simulated hosts on this machine (their own base dirs, loopback addresses, fresh
ports) and starts one runtime process per host. Scenario "failure": once every rank is up, the last
rank of the last host raises while the others sleep for a minute, so only the runtimes can stop them.
Before any time is reported the run is checked: every host's output/failure must name that rank, every
runtime must exit 1, and no rank process may be left. Measured: from the failing rank's error-record
timestamp to each runtime's exit (the target is 10 s). Scenario "noop": a script that returns at once;
measured from starting the runtimes to the last one exiting. Ranks are stdlib-only scripts so the numbers
show the runtime, not torch's import time. Reported: median and max over repeats (the machine is shared,
so single runs are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports  # noqa: E402
from smddp_sdk.specs import contract  # noqa: E402
from smddp_sdk.specs.contract import OptMl  # noqa: E402

FAILING_SCRIPT = """
import os, sys, time
from pathlib import Path
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ready = Path(sys.argv[sys.argv.index("--ready") + 1])
(ready / f"{rank}.pid").write_text(str(os.getpid()))
while len(list(ready.glob("*.pid"))) < world:
    time.sleep(0.01)
if rank == world - 1:
    raise RuntimeError(f"rank {rank} fails on purpose")
time.sleep(60)
"""
NOOP_SCRIPT = "print('done')\n"


def lay_out(root: Path, hosts: list[str], script: str, ranks: int, ready: Path) -> dict[str, str]:
    code = root / "src"
    code.mkdir()
    (code / "train.py").write_text(script)
    hps = {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": str(code), "ready": str(ready),
        "sagemaker_distributed_dataparallel_enabled": True,
    }
    for host in hosts:
        contract.write_config_files(
            OptMl(root / host), resource=contract.resource_config(host, hosts, "ml.c5.xlarge"),
            hyperparameters=contract.encode_hyperparameters(hps), input_data={},
        )
    master, server, agent = pick_free_ports(3)
    return {
        **os.environ, "PYTHONPATH": str(ROOT),
        contract.HOST_ADDRESSES_ENV: json.dumps({h: "127.0.0.1" for h in hosts}),
        contract.MASTER_PORT_ENV: str(master), contract.SERVER_PORT_ENV: str(server),
        contract.AGENT_PORT_ENV: str(agent), contract.NUM_GPUS_ENV: str(ranks),
    }


def run_job(root: Path, hosts: list[str], env: dict[str, str], timeout: float = 120) -> tuple[dict[str, float], dict[str, int], float]:
    started = time.time()
    procs = {
        host: subprocess.Popen(
            [sys.executable, "-m", "smddp_sdk.runtime"], env={**env, contract.BASE_DIR_ENV: str(root / host)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        for host in hosts
    }
    exited: dict[str, float] = {}
    try:
        while len(exited) < len(procs) and time.time() - started < timeout:
            for host, proc in procs.items():
                if host not in exited and proc.poll() is not None:
                    exited[host] = time.time()
            time.sleep(0.005)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if len(exited) < len(procs):
        raise SystemExit(f"runtimes did not finish within {timeout}s")
    return exited, {h: p.returncode for h, p in procs.items()}, started


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def failure_once(hosts: list[str], ranks: int) -> list[float]:
    with tempfile.TemporaryDirectory() as scratch:
        root, ready = Path(scratch), Path(scratch) / "ready"
        ready.mkdir()
        env = lay_out(root, hosts, FAILING_SCRIPT, ranks, ready)
        exited, codes, _ = run_job(root, hosts, env)
        failing_rank, failing_host = len(hosts) * ranks - 1, hosts[-1]
        record = json.loads(OptMl(root / failing_host).rank_error_file(failing_rank).read_text())
        for host in hosts:  # check before timing anything
            reason = contract.read_failure(OptMl(root / host)) or ""
            expected = f"rank {failing_rank} on host {failing_host} failed with exit code 1"
            if codes[host] != 1 or expected not in reason.splitlines()[0]:
                raise SystemExit(f"{host}: exit {codes[host]}, failure file {reason[:200]!r}; expected {expected!r}")
        leftovers = [int(p.read_text()) for p in ready.glob("*.pid") if alive(int(p.read_text()))]
        if leftovers:
            raise SystemExit(f"rank processes left behind: {leftovers}")
        return [exited[h] - record["timestamp"] for h in hosts]


def noop_once(hosts: list[str], ranks: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        env = lay_out(root, hosts, NOOP_SCRIPT, ranks, root)
        exited, codes, started = run_job(root, hosts, env)
        if any(codes.values()) or not all(OptMl(root / h).success_file.exists() for h in hosts):
            raise SystemExit(f"the no-op job failed: {codes}")
        return max(exited.values()) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    args = parser.parse_args()
    hosts = [f"algo-{i + 1}" for i in range(args.hosts)]
    stops = [failure_once(hosts, args.ranks) for _ in range(args.repeats)]
    slowest = [max(run) for run in stops]
    noops = [noop_once(hosts, args.ranks) for _ in range(args.repeats)]
    print(f"{args.hosts} hosts x {args.ranks} ranks, {args.repeats} repeats (median / max)")
    print(f"failure -> every runtime exited : {statistics.median(slowest):.3f} s / {max(slowest):.3f} s  (target < 10 s)")
    for index, host in enumerate(hosts):
        per_host = [run[index] for run in stops]
        print(f"  {host:<8} exited after        : {statistics.median(per_host):.3f} s / {max(per_host):.3f} s")
    print(f"no-op job, start -> all exited   : {statistics.median(noops):.3f} s / {max(noops):.3f} s")


if __name__ == "__main__":
    main()
