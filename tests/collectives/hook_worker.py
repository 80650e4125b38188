"""A rank process for the DDP comm-hook tests: trains torch's DDP with an smddp hook, reports.

argv[1] is the hook: "smddp", "bf16" or "fp16" (registered with ddp.register), "default" (none
registered: the backend's; gradients accumulated without set_to_none), "default-bf16" (the backend's,
for a bf16 model, gradients set to None every step), "default-no-sync" (the backend's, each step two
micro-batches, the first under no_sync), or "replaced" (torch's own allreduce hook registered in place
of the backend's). The report (parameter digest, distance to a
single-process reference, where the gradients live) goes to the test's TCPStore, never through the
backend under test.
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from smddp_sdk.collectives import ddp
from tests.collectives.scenarios import GLOBAL_BATCH, _batches, _digest, _model, _train
from tests.collectives.worker import connect, init


class InDtype(nn.Module):
    """The network in dtype, taking and returning fp32 (the tests' batches)."""

    def __init__(self, net: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.net, self.dtype = net.to(dtype), dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(self.dtype)).float()


def in_shared_memory(model: nn.parallel.DistributedDataParallel) -> bool:
    """Every gradient lies in the shared region of the backend's hook (ddp.SharedBuckets), in buckets
    that keep their layout."""
    state = model._smddp_hook.state
    if not isinstance(state, ddp.SharedBuckets) or state.region is None:
        return False
    region = state.region[state.backend.local_index]
    start, end = region.data_ptr(), region.data_ptr() + region.numel()
    settled = all(home.settled for home in state.homes.values())  # fresh gradients are staged (SharedBuckets)
    return settled and all(start <= p.grad.data_ptr() < end for p in model.module.parameters())


def train_accumulating(model: nn.Module, halves: list[list[int]]) -> None:
    """Each step: the gradients of two micro-batches (rows halves[0], then halves[1]) summed, the first
    backward under no_sync where the model has it; then one optimizer step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches():
        opt.zero_grad(set_to_none=True)
        for half, rows in enumerate(halves):
            with model.no_sync() if half == 0 and hasattr(model, "no_sync") else contextlib.nullcontext():
                nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()


def micro_batches(ranks: range, per_rank: int) -> list[list[int]]:
    """The rows of the two micro-batches of the given ranks."""
    half = per_rank // 2
    return [[r * per_rank + h * half + i for r in ranks for i in range(half)] for h in (0, 1)]


def main() -> None:
    torch.set_num_threads(1)
    store = connect()
    init(store)
    hook = sys.argv[1]
    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    make = (lambda: InDtype(_model(), torch.bfloat16)) if hook == "default-bf16" else _model
    model = nn.parallel.DistributedDataParallel(make(), bucket_cap_mb=0.001)  # several buckets in flight
    report = {"default_installed": getattr(model, "_smddp_hook", None) is not None}
    if hook == "replaced":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
        try:
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        except RuntimeError as exc:
            report["second_registration"] = str(exc)
    elif not hook.startswith("default"):
        ddp.register(model, compress=None if hook == "smddp" else hook)
    reference = make()
    if hook == "default-no-sync":
        train_accumulating(model, micro_batches(range(rank, rank + 1), per_rank))
        train_accumulating(reference, micro_batches(range(size), per_rank))
    else:
        _train(model, _batches(), slice(rank * per_rank, (rank + 1) * per_rank), set_to_none=hook != "default")
        _train(reference, _batches(), None)
    diff = max(float((a - b).abs().max()) for a, b in zip(model.module.parameters(), reference.parameters()))
    report.update(
        {"digest": _digest(model.module), "max_diff": diff, "gradients_in_buckets": all(p.grad._base is not None for p in model.module.parameters()), "gradients_shared": in_shared_memory(model)}
    )
    store.set(f"report/{hook}/{rank}", json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
