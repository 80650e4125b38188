"""A 2-host x 2-rank smddp job for the attack tests: all_reduce, all_gather and a 2 MB broadcast (the
single-copy path within a host, TCP between hosts), each result checked; every rank records its verdict."""

import json
import os
from pathlib import Path

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp"
import torch
import torch.distributed as dist

dist.init_process_group("smddp")
rank, size = dist.get_rank(), dist.get_world_size()
summed = torch.arange(1000, dtype=torch.float64) + rank
dist.all_reduce(summed)
gathered = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.int64))
sent = torch.arange(1 << 18, dtype=torch.float64) * 3  # 2 MB
received = sent.clone() if rank == size - 1 else torch.zeros_like(sent)
dist.broadcast(received, src=size - 1)
ok = {
    "all_reduce": torch.equal(summed, torch.arange(1000, dtype=torch.float64) * size + sum(range(size))),
    "all_gather": all(torch.equal(g, torch.full((3,), r, dtype=torch.int64)) for r, g in enumerate(gathered)),
    "broadcast": torch.equal(received, sent),
}
out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"trusted-mesh-{rank}.json").write_text(json.dumps({"rank": rank, "size": size, "ok": ok}))
dist.destroy_process_group()
