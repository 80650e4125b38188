"""Deterministic data-parallel training with a checkpoint per epoch, resumed from the newest one.

Every rank draws its batch from a generator seeded by (epoch, rank), gradients are summed with
``all_reduce``, and rank 0 writes ``epoch-<N>.pt`` (parameters and optimizer state) after each epoch.
On start, every rank loads the newest checkpoint in its checkpoint folder, so a job interrupted and
retried any number of times ends with the same parameters, bit for bit, as one that ran straight
through. Rank 0 saves the final parameters as ``model/params.pt``.
"""

import argparse
import os
import re
import time
from pathlib import Path

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp", as AWS scripts do
import torch
import torch.distributed as dist

from smddp_sdk.specs import events  # the recovery phases (docs/resuming.md): optional for a script

MODEL_DIR = Path(os.environ["SM_MODEL_DIR"])
CHECKPOINTS = MODEL_DIR.parent / "checkpoints"  # /opt/ml/checkpoints, SageMaker's checkpoint_local_path


def newest_checkpoint() -> tuple[int, Path | None]:
    found = [(int(m.group(1)), path) for path in CHECKPOINTS.glob("epoch-*.pt") if (m := re.fullmatch(r"epoch-(\d+)\.pt", path.name))]
    return max(found, default=(0, None))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.5)  # seconds per epoch: time to interrupt it
    args = parser.parse_args()
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    done, path = newest_checkpoint()
    if path is not None:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    if path is not None:
        events.record_from_rank(events.STATE_RESTORED, source="checkpoint", step=done * args.steps)
    print(f"rank {rank}: starting at epoch {done + 1}" + (f" from {path.name}" if path else " from scratch"), flush=True)
    first = True
    for epoch in range(done + 1, args.epochs + 1):
        generator = torch.Generator().manual_seed(epoch * 1000 + rank)
        for _ in range(args.steps):
            x = torch.randn(8, 16, generator=generator)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad /= world
            optimizer.step()
            if first:
                events.record_from_rank(events.FIRST_STEP, step=done * args.steps + 1)
                first = False
        if rank == 0:
            CHECKPOINTS.mkdir(parents=True, exist_ok=True)
            partial = CHECKPOINTS / f"epoch-{epoch}.pt.partial"  # the sync skips *.partial files
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
            partial.rename(CHECKPOINTS / f"epoch-{epoch}.pt")
        print(f"rank {rank}: epoch {epoch} done, loss {loss.item():.6f}", flush=True)
        dist.barrier()
        time.sleep(args.pause)
    if rank == 0:
        torch.save(model.state_dict(), MODEL_DIR / "params.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
