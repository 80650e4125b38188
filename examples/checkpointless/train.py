"""Data-parallel training that recovers without a checkpoint (docs/resuming.md, "Recovery without a checkpoint").

It writes no checkpoint. When a host is lost, the surviving ranks keep the state of their last completed
step on their host; the retried job's ranks take it from them (``restore()``) and go on from the next step.
With the local option ``survive_host_loss`` the survivors do not even stop: the lost host is replaced alone,
the group re-forms and the interrupted step runs again (``steps()``/``step()``). Either way the run ends with the same parameters, bit for bit, as one that ran straight through. Each rank's batch
depends only on the step and the rank. Rank 0 prints every step it completes and saves the final
parameters as ``model/params.pt``.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers the "smddp" backend
from smddp_sdk.collectives.ddp import DistributedDataParallel
from smddp_sdk.collectives.recovery import Recoverable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.1)  # seconds per step: time to interrupt it
    parser.add_argument("--ddp", choices=("smddp", "torch"), default="smddp")
    args = parser.parse_args()
    dist.init_process_group("smddp")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    wrap = DistributedDataParallel if args.ddp == "smddp" else torch.nn.parallel.DistributedDataParallel
    model = wrap(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)

    state = Recoverable(model, optimizer, extra={"scheduler": scheduler})
    for step in state.steps(args.steps):  # from restore(): 0, or the step after the one a peer kept
        with state.step(step):  # its end is step_done; a lost peer ends it early, and steps() gives it again
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 1000 + rank))
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if rank == 0:
                print(f"rank 0: step {step} done, loss {loss.item():.6f}", flush=True)
        time.sleep(args.pause)

    if rank == 0:
        torch.save(net.state_dict(), Path(os.environ["SM_MODEL_DIR"]) / "params.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
