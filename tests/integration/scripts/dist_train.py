"""A training script for runtime tests: joins torch.distributed, all-reduces, records what it saw.

Hyperparameters: --backend (smddp through the AWS import path, or gloo), --fail-rank R (that rank raises after
the all-reduce), --linger S (the other ranks then sleep S seconds with a child process, so only the
runtime can stop them), --ignore-term (ranks ignore SIGTERM, so only SIGKILL stops them).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

RANK_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "SMDATAPARALLEL_LOCAL_RANK", "SMDATAPARALLEL_SERVER_ADDR", "SMDATAPARALLEL_SERVER_PORT",
    "SAGEMAKER_INSTANCE_TYPE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
    "SM_CURRENT_HOST", "SM_HOSTS", "SM_HP_BACKEND", "SM_CHANNEL_TRAIN", "SM_MODEL_DIR", "PYTHONPATH",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--ignore-term", default="False")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    pids = [os.getpid()]

    if args.backend == "smddp":
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp", as AWS scripts do
    from sagemaker_training import environment  # the compat module (or a real install) must be importable

    record_hosts = environment.Environment().hosts
    dist.init_process_group(args.backend)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    record = {
        "env": {key: os.environ.get(key) for key in RANK_KEYS},
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
        "all_reduce": total.item(),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "sagemaker_training_hosts": record_hosts,
    }
    if args.ignore_term == "True":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.linger:
        pids.append(subprocess.Popen(["sleep", str(args.linger * 2)]).pid)
    record["pids"] = pids
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    print(f"rank {rank}: all_reduce gave {total.item()}")
    if rank == args.fail_rank:
        raise ValueError(f"boom from rank {rank}")
    time.sleep(args.linger)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
