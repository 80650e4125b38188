"""A rank process for the collectives tests: joins the smddp group, then runs cases the test sends.

Started by cluster.Cluster with RANK, WORLD_SIZE, SM_CURRENT_HOST and SMDDP_TEST_STORE (host:port of the
test's TCPStore). Cases arrive as JSON under case/<k>; the verdict goes to result/<k>/<rank>.
Scenarios other than "serve" are whole programs (DDP, FSDP2, failures) selected by argv[1].
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers the backend
from tests.collectives.cases import CaseRunner


def connect() -> dist.TCPStore:
    host, port = os.environ["SMDDP_TEST_STORE"].rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=120))


def init(store: dist.TCPStore) -> None:
    timeout = timedelta(seconds=float(os.environ.get("SMDDP_TEST_PG_TIMEOUT", "30")))
    dist.init_process_group("smddp", store=dist.PrefixStore("pg/", store), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)


def serve(store: dist.TCPStore) -> None:
    specs = json.loads(os.environ.get("SMDDP_TEST_GROUPS", "[]")) or [list(range(dist.get_world_size()))]
    groups = []
    for ranks in specs:
        group = dist.new_group(ranks) if ranks != list(range(dist.get_world_size())) else dist.group.WORLD
        groups.append((sorted(ranks), group if dist.get_rank() in ranks else None))  # torch orders group ranks
    runner = CaseRunner(groups)
    store.set(f"ready/{dist.get_rank()}", "1")
    k = 0
    while True:
        case = json.loads(store.get(f"case/{k}"))
        if case.get("op") == "stop":
            break
        store.set(f"result/{k}/{dist.get_rank()}", runner.run(case))
        k += 1
    dist.destroy_process_group()


def main() -> None:
    torch.set_num_threads(1)
    store = connect()
    init(store)
    scenario = sys.argv[1] if len(sys.argv) > 1 else "serve"
    if scenario == "serve":
        serve(store)
        return
    from tests.collectives import scenarios

    getattr(scenarios, scenario)(store)


if __name__ == "__main__":
    main()
