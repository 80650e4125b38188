"""Joins smddp across hosts while another local user floods the job's listeners; holds the job open for
SMDDP_TEST_HOLD_S seconds (so that the store's helper reports what it closed), then checks the store and the
mesh still work and records the all_reduce's result. With SMDDP_TEST_LOSE_THE_STORE rank 0 fails as a rank
that lost the store does (torch's DistNetworkError) instead."""

import json
import os
import time
from pathlib import Path

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers "smddp"
import torch
import torch.distributed as dist

dist.init_process_group("smddp")
tensor = torch.ones(1)
dist.all_reduce(tensor)
time.sleep(float(os.environ.get("SMDDP_TEST_HOLD_S", "0")))
if os.environ.get("SMDDP_TEST_LOSE_THE_STORE") and dist.get_rank() == 0:
    raise dist.DistNetworkError("the store connection was lost (raised by the test)")
store = dist.distributed_c10d._world.pg_map[dist.group.WORLD][1]
store.set(f"after-the-flood/{dist.get_rank()}", "1")  # the rank's store connection outlived the flood
dist.barrier()
out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"flood-{dist.get_rank()}.json").write_text(json.dumps({"rank": dist.get_rank(), "sum": tensor.item()}))
dist.destroy_process_group()
