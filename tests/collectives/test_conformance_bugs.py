"""The bugs torch's own distributed tests found in smddp (issue 37), each checked on real ranks.

A DDP model over smddp saves, loads and deep-copies, and trains after; sparse tensors all_reduce (summed
as gloo sums them), also under DDP (nn.Embedding(sparse=True)), and an op sparse tensors cannot take is
refused before the group is touched; ``dist.monitored_barrier`` and the group's own ``monitored_barrier``
work and name a rank that does not come; timeouts read as torch's tests expect over shared memory and TCP.

Run as ``python -m tests.collectives.test_conformance_bugs SCENARIO`` this module is a rank: it reports
to the test's TCPStore, never through the backend under test.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.collectives.cluster import PROJECT_ROOT, rank_env  # noqa: E402

pytestmark = pytest.mark.jobs
ONE_HOST, TWO_HOSTS = ["algo-1"] * 2, ["algo-1", "algo-1", "algo-2", "algo-2"]
TORCH_TIMEOUT = re.compile(" (Timed out|closed|timeout) ")  # distributed_test.py's _test_barrier_timeout


def _ranks(scenario: str, hosts: list[str], env: dict[str, str] | None = None) -> list[dict]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.collectives.test_conformance_bugs", scenario], cwd=PROJECT_ROOT,
                              env=rank_env(r, hosts, store.port, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(len(hosts))]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    return [json.loads(store.get(f"report/{r}")) for r in range(len(hosts))]


@pytest.mark.parametrize("hosts", [ONE_HOST, TWO_HOSTS], ids=["one-host", "two-hosts"])
def test_a_ddp_model_saves_loads_and_deep_copies_and_trains_on(hosts: list[str]) -> None:
    for report in _ranks("ddp_copies", hosts):
        assert report["loaded_hooked"] and report["copied_hooked"], report
        assert report["copies_agree"], report  # the copies trained in step with each other on every rank


def test_sparse_tensors_sum_as_gloo_sums_them_and_other_ops_leave_the_group_usable() -> None:
    for report in _ranks("sparse", TWO_HOSTS):
        assert report["sum_matches_dense"] and report["avg_matches_dense"], report
        assert "SUM or AVG" in report["max_refused"] and report["usable_after"], report
        assert report["embedding_grads_agree"], report  # DDP with nn.Embedding(sparse=True)


@pytest.mark.parametrize("hosts", [ONE_HOST, TWO_HOSTS], ids=["one-host", "two-hosts"])
def test_monitored_barrier_passes_when_all_come_and_names_the_rank_that_does_not(hosts: list[str]) -> None:
    reports = _ranks("monitored", hosts)
    assert all(r["passed"] for r in reports), reports
    assert "Rank 1 failed to pass monitoredBarrier" in reports[0]["missing"], reports
    for report in reports[2:]:  # the ranks that came learn it from rank 0, at once
        assert "successfully reached monitoredBarrier" in report["missing"] and report["missing_s"] < 5, report
    assert all(r["usable_after"] for r in reports), reports


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_barrier_timeout_reads_as_torch_expects(transport: str) -> None:
    reports = _ranks("timeout", ONE_HOST, {"SMDDP_TRANSPORT": transport, "SMDDP_TEST_PG_TIMEOUT": "2"})
    assert TORCH_TIMEOUT.search(reports[0]["error"]), reports
    assert reports[0]["waited_s"] >= 1.9, reports  # not before the timeout


# the ranks ----------------------------------------------------------------------------------------------
def _ddp_copies(rank: int) -> dict:
    from torch import nn

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
    batch = torch.randn(4, 8) + rank
    model(batch).sum().backward()
    saved = io.BytesIO()
    torch.save(model, saved)
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    copied = copy.deepcopy(model)
    for replica in (loaded, copied):
        optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            replica(batch).sum().backward()
            optimizer.step()
    gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
    digest = torch.stack([sum(p.sum() for p in replica.parameters()) for replica in (loaded, copied)])
    dist.all_gather(gathered, digest)
    return {"loaded_hooked": hasattr(loaded, "_smddp_hook"), "copied_hooked": hasattr(copied, "_smddp_hook"),
            "copies_agree": all(torch.allclose(g, gathered[0]) for g in gathered) and torch.allclose(digest[0], digest[1])}


def _sparse(rank: int) -> dict:
    from torch import nn

    size = dist.get_world_size()
    dense = torch.zeros(6, 3)
    dense[rank % 6, :] = rank + 1.0  # ranks overlap at some rows (coalesced) and not at others
    dense[5, 1] = 2.0
    expected = sum(torch.zeros(6, 3).index_fill_(0, torch.tensor([r % 6]), r + 1.0) for r in range(size))
    expected[5, 1] += 2.0 * size
    summed, averaged = dense.to_sparse(), dense.to_sparse()
    dist.all_reduce(summed)
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    try:
        dist.all_reduce(dense.to_sparse(), op=dist.ReduceOp.MAX)
        refused = ""
    except RuntimeError as exc:
        refused = str(exc)
    check = torch.ones(1)
    dist.all_reduce(check)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Embedding(10, 4, sparse=True))
    model(torch.tensor([rank, 9])).sum().backward()
    grads = [torch.zeros(10, 4) for _ in range(size)]
    dist.all_gather(grads, model.module.weight.grad.to_dense())
    reference = sum(torch.zeros(10, 4).index_add_(0, torch.tensor([r, 9]), torch.ones(2, 4)) for r in range(size)) / size
    return {"sum_matches_dense": torch.equal(summed.to_dense(), expected), "avg_matches_dense": torch.allclose(averaged.to_dense(), expected / size),
            "max_refused": refused, "usable_after": check.item() == size,
            "embedding_grads_agree": all(torch.allclose(g, reference) for g in grads)}


def _monitored(rank: int) -> dict:
    dist.monitored_barrier(timeout=timedelta(seconds=10))
    dist.group.WORLD.monitored_barrier(timedelta(seconds=10), wait_all_ranks=True)  # the group's own, as gloo's
    started, missing = time.monotonic(), ""
    if rank != 1:  # rank 1 does not come
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=2))
        except RuntimeError as exc:
            missing = str(exc)
    missing_s = time.monotonic() - started
    check = torch.ones(1)
    dist.all_reduce(check)
    return {"passed": True, "missing": missing, "missing_s": missing_s, "usable_after": check.item() == dist.get_world_size()}


def _timeout(rank: int) -> dict:
    started, error = time.monotonic(), ""
    if rank == 0:  # the others never come
        try:
            dist.barrier()
        except RuntimeError as exc:
            error = str(exc)
    return {"error": error, "waited_s": time.monotonic() - started}


SCENARIOS = {"ddp_copies": _ddp_copies, "sparse": _sparse, "monitored": _monitored, "timeout": _timeout}


def _main(scenario: str) -> None:
    import smddp_sdk.collectives  # noqa: F401 - registers smddp
    from tests.collectives.worker import connect, init

    store = connect()
    init(store)
    rank = dist.get_rank()
    report = SCENARIOS[scenario](rank)
    store.set(f"report/{rank}", json.dumps(report))
    store.add("reported", 1)
    while int(store.add("reported", 0)) < dist.get_world_size():  # nobody leaves while a peer still needs it
        time.sleep(0.05)
    if scenario != "timeout":
        dist.destroy_process_group()
    os._exit(0)  # a group that timed out may hold threads waiting for peers that never come


if __name__ == "__main__":
    _main(sys.argv[1])
