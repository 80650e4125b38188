"""A rank process for the tests of smddp's own DistributedDataParallel: trains, checks, reports.

argv[1] is the backend ("smddp" or "gloo"). The report goes to the test's TCPStore, never through the
backend under test: parameter digest, distance to single-process training, whether the fusion buffers
are shared, and the no_sync and unused-parameter checks.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from smddp_sdk.collectives.ddp import DistributedDataParallel
from tests.collectives.scenarios import GLOBAL_BATCH, _batches, _digest, _model, _train
from tests.collectives.worker import connect

STEPS_PER_CHECK = 2


class WithSpareLayer(nn.Module):
    """The test model plus a layer that only rank 0 uses: the others produce no gradient for it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _model()
        self.spare = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_spare: bool) -> torch.Tensor:
        return self.body(x) + (self.spare(x) if use_spare else 0)


@torch.no_grad()
def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def check_no_sync(rank: int, size: int, group: dist.ProcessGroup | None) -> float:
    """Two micro-batches under no_sync plus one synchronised: the gradient of the whole batch."""
    model = DistributedDataParallel(_model(), group, bucket_cap_mb=0.001)
    x, y = _batches()[0]
    micro = torch.tensor_split(x[rank::size], 3), torch.tensor_split(y[rank::size], 3)  # some may be empty
    with model.no_sync():
        for xs, ys in zip(micro[0][:2], micro[1][:2]):
            (nn.functional.mse_loss(model(xs), ys, reduction="sum") / len(x)).backward()
    (nn.functional.mse_loss(model(micro[0][2]), micro[1][2], reduction="sum") / len(x)).backward()
    reference = _model()
    (nn.functional.mse_loss(reference(x), y, reduction="sum") / len(x)).backward()
    return max(float((p.grad * size - q.grad).abs().max()) for p, q in zip(model.module.parameters(), reference.parameters()))


def check_unused(rank: int, size: int, group: dist.ProcessGroup | None) -> float:
    """A parameter only rank 0 uses gets rank 0's gradient divided by the group size, on every rank."""
    model = DistributedDataParallel(WithSpareLayer(), group, bucket_cap_mb=0.001)
    x, y = _batches()[0]
    nn.functional.mse_loss(model(x, use_spare=rank == 0), y).backward()
    reference = WithSpareLayer()
    nn.functional.mse_loss(reference(x, use_spare=True), y).backward()
    return max(float((p.grad * size - q.grad).abs().max())
               for p, q in zip(model.module.spare.parameters(), reference.spare.parameters()))


def check_grads_kept_between_steps(rank: int, size: int, group: dist.ProcessGroup | None) -> float:
    """zero_grad(set_to_none=False): later backward passes accumulate into the fusion buffer in place."""
    model, reference = DistributedDataParallel(_model(), group, bucket_cap_mb=0.001), _model()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for x, y in _batches()[:3]:
        for opt in opts:
            opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(model(x[rank::size]), y[rank::size], reduction="sum").backward()
        nn.functional.mse_loss(reference(x), y, reduction="sum").backward()
        for param in model.parameters():
            param.grad.mul_(size)  # the sum over ranks, as the reference computes it
        for opt in opts:
            opt.step()
    return max_diff(model.module, reference)


def check_large_bucket(rank: int, size: int, group: dist.ProcessGroup | None) -> float:
    """A 2.4 MB bucket: each rank's shard spans several reduction blocks and ends in a partial one."""
    torch.manual_seed(7)
    layer = nn.Linear(600, 999)
    reference = nn.Linear(600, 999)
    reference.load_state_dict(layer.state_dict())
    model = DistributedDataParallel(layer, group)
    x = torch.randn(size * 2, 600, generator=torch.Generator().manual_seed(8))
    model(x[rank::size]).square().sum().backward()
    reference(x).square().sum().backward()
    return max(float((p.grad * size - q.grad).abs().max() / q.grad.abs().max())
               for p, q in zip(model.module.parameters(), reference.parameters()))


def main() -> None:
    torch.set_num_threads(1)
    backend = sys.argv[1]
    store = connect()
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=30))
    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    model = DistributedDataParallel(_model(seed=rank), bucket_cap_mb=0.001)  # rank 0's start is broadcast
    _train(model, _batches(), slice(rank * per_rank, (rank + 1) * per_rank))
    reference = _model()
    _train(reference, _batches(), slice(0, per_rank * size))  # the samples the ranks saw (3 ranks: 15 of 16)
    report = {
        "digest": _digest(model.module), "max_diff": max_diff(model.module, reference),
        "shared": [b.shared is not None for b in model._buckets],
        "no_sync_diff": check_no_sync(rank, size, None), "unused_diff": check_unused(rank, size, None),
        "large_diff": check_large_bucket(rank, size, None),
        "kept_grads_diff": check_grads_kept_between_steps(rank, size, None),
    }
    store.set(f"report/wrapper/{rank}", json.dumps(report))
    del model, reference
    gc.collect()  # every model and work of the checks goes while Python runs: a gloo group's threads, joined
    dist.destroy_process_group()  # in Python's shutdown instead, can abort the process there


if __name__ == "__main__":
    main()
