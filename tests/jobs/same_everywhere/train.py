# In the manner of AWS's SMDDP examples: the smddp backend, DDP, SM_* defaults, literal /opt/ml paths.
import argparse
import json
import os

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - as AWS writes it

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--model-dir", type=str, default=os.environ["SM_MODEL_DIR"])
args = parser.parse_args()
dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.epochs):
    optimizer.zero_grad()
    model(torch.randn(8, 4) * (rank + 1)).sum().backward()
    optimizer.step()
hosts = json.load(open("/opt/ml/input/config/resourceconfig.json"))["hosts"]
print(f"rank {rank}/{world} on {os.environ['SM_CURRENT_HOST']} of {hosts} epochs {args.epochs}", flush=True)
if rank == 0:
    assert args.model_dir == "/opt/ml/model"
    torch.save(model.module.state_dict(), "/opt/ml/model/model.pth")
    open("/opt/ml/output/data/hosts.json", "w").write(json.dumps(hosts))
dist.barrier()
dist.destroy_process_group()
