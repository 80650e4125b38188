"""Start-up and tear-down of a job that does nothing, against torchrun on the same machine.

    python -m benchmarks.startup                 # 4 ranks on one host, and 2 hosts x 2 ranks; 3 repeats
    python -m benchmarks.startup --repeat 5 --case 1x4

Each rank imports torch.distributed, joins a gloo process group, passes one barrier and prints
``rank N done``. Every run is checked before it counts (exit 0 and every rank's line). Reported per
case and launcher: the median (min-max) wall time of ``--repeat`` runs and the tail, the time from the
last rank's line to the launcher's exit; and the ratio smddp-launch / torchrun. The load average is
printed before and after: the machine may be shared, so compare only numbers from one run.
2 hosts with torchrun are two torchrun processes (--nnodes 2, one per node rank) on this machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

NOOP = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
print(f"rank {os.environ['RANK']} done", flush=True)
"""
DONE = re.compile(r"rank (\d+) done")
CASES = {"1x4": (1, 4), "2x2": (2, 2)}


@dataclass(frozen=True)
class Run:
    seconds: float
    tail: float  # from the last rank line to the launcher's exit


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(commands: list[list[str]], world: int, cwd: Path, env: dict[str, str]) -> Run:
    """Start the commands together; wait for all; check every rank said done."""
    started = time.perf_counter()
    last_line = [started]
    seen: set[int] = set()
    lock = threading.Lock()
    procs = [subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = DONE.search(line)
            if match:
                with lock:
                    seen.add(int(match.group(1)))
                    last_line[0] = time.perf_counter()

    readers = [threading.Thread(target=read, args=(p,)) for p in procs]
    for reader in readers:
        reader.start()
    codes = [p.wait() for p in procs]
    ended = time.perf_counter()
    for reader in readers:
        reader.join()
    if any(codes) or seen != set(range(world)):
        raise SystemExit(f"{commands[0][:3]}... exited {codes}, ranks done {sorted(seen)}; not timing a broken run")
    return Run(ended - started, ended - last_line[0])


def smddp_commands(hosts: int, per_host: int) -> list[list[str]]:
    return [[sys.executable, "-m", "smddp_sdk.cli.main", "--hosts", str(hosts), "--nproc-per-host", str(per_host), "noop.py"]]


def torchrun_commands(hosts: int, per_host: int) -> list[list[str]]:
    port = free_port()
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(hosts),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            str(per_host),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "noop.py",
        ]
        for node in range(hosts)
    ]


def summary(runs: list[Run]) -> tuple[float, str]:
    seconds = [r.seconds for r in runs]
    tails = [r.tail for r in runs]
    median = statistics.median(seconds)
    return median, f"{median:6.2f} s ({min(seconds):.2f}-{max(seconds):.2f})  tail {statistics.median(tails):5.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="hosts x ranks per host (default: both)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="smddp-startup-") as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text(NOOP)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])), "SMDDP_JOB_ROOT": str(work / "jobs"), "SMDDP_CONFIG": ""}
        for case in args.case or sorted(CASES):
            hosts, per_host = CASES[case]
            launchers = {"torchrun": torchrun_commands, "smddp-launch": smddp_commands}
            runs: dict[str, list[Run]] = {name: [] for name in launchers}
            for _ in range(args.repeat):  # interleaved, so a change in load hits both alike
                for name, commands in launchers.items():
                    runs[name].append(timed(commands(hosts, per_host), hosts * per_host, work, env))
            results = {name: summary(done) for name, done in runs.items()}
            ratio = results["smddp-launch"][0] / results["torchrun"][0]
            print(f"{hosts} host(s) x {per_host} ranks, median of {args.repeat}:")
            for name, (_, text) in results.items():
                print(f"  {name:<13} {text}")
            print(f"  ratio smddp-launch / torchrun: {ratio:.2f}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
