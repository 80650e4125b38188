"""A training loop for fault injection: all-reduces forever (or --steps times) and can fail on purpose.

--fault: none | sigkill_rank | exit0_early | hang_in_collective | hang_outside | raise, done by --victim
after step --at; linger: --victim sleeps after the last step (--steps), outside any collective; quiet: every rank stops calling collectives at step --at and sleeps; mismatch_<how>
(reduce_op, dtype, size, op, count): at step --at every rank on --victim's host calls another collective
than the other hosts (count: leaves the group one call early). Every rank writes <--ready>/rank-<N> once it has trained a few steps, so a test knows
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

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp", as AWS scripts do
import torch
import torch.distributed as dist


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
        if rank == args.victim and step == args.at and args.fault != "linger" and not args.fault.startswith("mismatch_"):
            inject(args.fault, tensor)
        if args.fault.startswith("mismatch_") and step == args.at and on_host_of(args.victim):
            mismatch(args.fault.removeprefix("mismatch_"), tensor)
            continue
        if args.fault == "quiet" and step == args.at:
            time.sleep(10**6)  # every rank, outside any collective: nobody notices a lost peer by itself
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        time.sleep(pause)
    dist.destroy_process_group()
    if args.fault == "linger" and rank == args.victim:
        linger_after_training()


def linger_after_training() -> None:
    """What a test of max_run expects to see named: the others finished, this rank never ends."""
    print(f"injecting linger at {time.time():.3f}", flush=True)
    time.sleep(10**6)


def on_host_of(victim: int) -> bool:
    ranks_per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    return dist.get_rank() // ranks_per_host == victim // ranks_per_host


def mismatch(how: str, tensor: torch.Tensor) -> None:
    """Instead of this step's all_reduce(SUM, float32, len(tensor)), another call."""
    print(f"injecting mismatch_{how} at {time.time():.3f}", flush=True)
    if how == "reduce_op":
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    elif how == "dtype":
        dist.all_reduce(tensor.int())
    elif how == "size":
        dist.all_reduce(torch.ones(2 * tensor.numel()))
    elif how == "op":
        dist.all_gather([torch.empty_like(tensor) for _ in range(dist.get_world_size())], tensor)
    elif how == "count":
        dist.destroy_process_group()
        sys.exit(0)
    else:
        sys.exit(f"unknown mismatch {how!r}")


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
