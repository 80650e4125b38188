"""Joins torch.distributed (gloo) and records, after rendezvous, every TCP socket listening on this
machine on MASTER_PORT, plus whether it found the job's store through the runtime."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def listening(port: int) -> list[str]:
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
report = {
    "rank": dist.get_rank(),
    "sum": tensor.item(),
    "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
    "listening": listening(int(os.environ["MASTER_PORT"])),
}
dist.barrier()
out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"listeners-{report['rank']}.json").write_text(json.dumps(report))
dist.destroy_process_group()
