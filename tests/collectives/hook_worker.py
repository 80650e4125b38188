"""A rank process for the DDP comm-hook tests: trains with smddp_sdk.collectives.ddp's hook, reports.

argv[1] is the hook ("smddp", "bf16" or "fp16"); the report (parameter digest and distance to a
single-process reference) goes to the test's TCPStore, never through the backend under test.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn

from smddp_sdk.collectives import ddp
from tests.collectives.scenarios import GLOBAL_BATCH, _batches, _digest, _model, _train
from tests.collectives.worker import connect, init


def main() -> None:
    torch.set_num_threads(1)
    store = connect()
    init(store)
    hook = sys.argv[1]
    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.001)  # several buckets in flight
    ddp.register(model, compress=None if hook == "smddp" else hook)
    _train(model, _batches(), slice(rank * per_rank, (rank + 1) * per_rank))
    reference = _model()
    _train(reference, _batches(), None)
    diff = max(float((a - b).abs().max()) for a, b in zip(model.module.parameters(), reference.parameters()))
    store.set(f"report/{hook}/{rank}", json.dumps({"digest": _digest(model.module), "max_diff": diff}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
