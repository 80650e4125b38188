"""Joins smddp across hosts and records what a local user who reads the rendezvous store would find
there for the inter-host mesh (its secret must not be), and whether the runtime handed the rank the secret."""

import json
import os
from pathlib import Path

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp"
import torch
import torch.distributed as dist

dist.init_process_group("smddp")
tensor = torch.ones(1)
dist.all_reduce(tensor)  # across hosts: the mesh is up and authenticated
store = dist.distributed_c10d._world.pg_map[dist.group.WORLD][1]  # the store the group rendezvoused through
report = {
    "rank": dist.get_rank(),
    "sum": tensor.item(),
    "secret_from_runtime": bool(os.environ.get("SMDDP_MESH_SECRET")),
    "token_in_store": store.check(["smddp/token"]),
}
out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"mesh-{report['rank']}.json").write_text(json.dumps(report))
dist.destroy_process_group()
