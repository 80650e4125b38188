"""A stdlib-only rank for supervision tests: waits for every rank, then fails, lingers or ignores SIGTERM.

Hyperparameters: --ready DIR (shared by all hosts), --fail-rank R, --linger S, --ignore-term True.
Each rank records its pid and a child's pid in DIR/<rank>.json so tests can check nothing is left.
"""

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--linger", type=float, default=60.0)
    parser.add_argument("--ignore-term", default="False")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.ignore_term == "True":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", str(args.linger * 2)])
    ready = Path(args.ready)
    (ready / f"{rank}.json").write_text(json.dumps({"pids": [os.getpid(), child.pid]}))
    while len(list(ready.glob("*.json"))) < world:
        time.sleep(0.02)
    print(f"rank {rank}: every rank is up")
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    time.sleep(args.linger)


if __name__ == "__main__":
    main()
