"""A training loop for fault injection: all-reduces forever (or --steps times) and can fail on purpose.

--fault: none | sigkill_rank | exit0_early | hang_in_collective | hang_outside | raise, done by --victim
after step --at; quiet: every rank stops calling collectives at step --at and sleeps. Every rank writes <--ready>/rank-<N> once it has trained a few steps, so a test knows
when to inject a fault from outside (kill a supervisor or a runtime). --pg-timeout is the process group's
timeout in seconds: what turns a hang into an error that names the hung rank.
"""

import argparse
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp", as AWS scripts do


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="none")
    parser.add_argument("--victim", type=int, default=-1)
    parser.add_argument("--at", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ready", default="")
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    args = parser.parse_args()
    dist.init_process_group("smddp", timeout=timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    # Busy collectives (no pause, larger tensors) when a rank must freeze inside one.
    busy = args.fault == "hang_in_collective"
    tensor = torch.ones(1_000_000 if busy else 1000)
    pause = 0.0 if busy else 0.05
    for step in range(args.steps):
        if step == 3 and args.ready:
            Path(args.ready, f"rank-{rank}").write_text(str(time.time()))
        if rank == args.victim and step == args.at:
            inject(args.fault, tensor)
        if args.fault == "quiet" and step == args.at:
            time.sleep(10**6)  # every rank, outside any collective: nobody notices a lost peer by itself
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        time.sleep(pause)
    dist.destroy_process_group()


def inject(fault: str, tensor: torch.Tensor) -> None:
    print(f"injecting {fault} at {time.time():.3f}", flush=True)
    if fault == "sigkill_rank":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "exit0_early":
        os._exit(0)
    elif fault == "hang_outside":
        time.sleep(10**6)
    elif fault == "hang_in_collective":
        # The ranks spend nearly all their time inside all_reduce now: the stop lands in one.
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
    elif fault == "raise":
        raise ValueError("planned failure")
    else:
        sys.exit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    main()
