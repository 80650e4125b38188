"""smddp's own DistributedDataParallel trains like one process, on every rank alike, over every path."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives.algorithms import ALGORITHMS  # noqa: E402
from smddp_sdk.collectives.ddp import DistributedDataParallel, _plan_buckets  # noqa: E402
from tests.collectives.cluster import PROJECT_ROOT, rank_env  # noqa: E402

pytestmark = pytest.mark.integration
TOLERANCE = 1e-5  # the same fp32 sums as one process, in another order

LAYOUTS = {
    "one host, 3 ranks": (["algo-1"] * 3, "smddp", True),  # zero-copy shared buffers, uneven shards
    "2 hosts x 2 ranks": (["algo-1", "algo-1", "algo-2", "algo-2"], "smddp", True),  # plus TCP between leaders
    "3 hosts x 1 rank": (["algo-1", "algo-2", "algo-3"], "smddp", False),  # nothing to share: all_reduce
    "gloo": (["algo-1", "algo-1"], "gloo", False),  # any other backend: all_reduce
}


def _run(hosts: list[str], backend: str, env: dict[str, str] | None = None) -> list[dict]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.collectives.wrapper_worker", backend], cwd=PROJECT_ROOT, env=rank_env(r, hosts, store.port, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for r in range(len(hosts))
    ]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    return [json.loads(store.get(f"report/wrapper/{r}")) for r in range(len(hosts))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_trains_like_one_process_with_identical_parameters(layout: str) -> None:
    hosts, backend, shared = LAYOUTS[layout]
    reports = _run(hosts, backend)
    assert len({r["digest"] for r in reports}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in reports) < TOLERANCE, reports
    assert all(all(flag == shared for flag in r["shared"]) for r in reports), reports
    assert max(r["no_sync_diff"] for r in reports) < TOLERANCE, "no_sync did not accumulate locally"
    assert max(r["unused_diff"] for r in reports) < TOLERANCE, "an unused parameter's gradient is wrong"
    assert max(r["large_diff"] for r in reports) < TOLERANCE, "a bucket of several reduction blocks is wrong"
    assert max(r["kept_grads_diff"] for r in reports) < 1e-4, "accumulating into kept gradients went wrong"


@pytest.mark.parametrize("algorithm", ALGORITHMS[1:])
def test_every_inter_host_algorithm_behind_the_shared_buffers(algorithm: str) -> None:
    reports = _run(["algo-1", "algo-1", "algo-2", "algo-2", "algo-3", "algo-3"], "smddp", {"SMDDP_ALLREDUCE_ALGO": algorithm})
    assert len({r["digest"] for r in reports}) == 1
    assert max(r["max_diff"] for r in reports) < TOLERANCE, reports


def test_buckets_follow_backward_order_dtype_and_cap() -> None:
    params = [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in [(300_000, torch.float32), (10, torch.bfloat16), (300_000, torch.float32), (600_000, torch.float32)]]
    buckets = _plan_buckets(params, cap_bytes=2_000_000, first_cap_bytes=1_000_000)
    assert [[p.numel() for p in b.params] for b in buckets] == [[600_000], [300_000, 300_000], [10]]
    assert buckets[1].offsets == [0, 300_000]
    same_caps = _plan_buckets(params, cap_bytes=4_000_000, first_cap_bytes=4_000_000)  # a cap the script names
    assert [[p.numel() for p in b.params] for b in same_caps] == [[600_000, 300_000, 300_000], [10]]


def test_bad_arguments_say_what_to_use_instead() -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb=0 must be positive"):
        DistributedDataParallel(torch.nn.Linear(2, 2), bucket_cap_mb=0)
    with pytest.raises(ValueError, match=r"tensors on meta.*torch.nn.parallel.DistributedDataParallel"):
        DistributedDataParallel(torch.nn.Linear(2, 2, device="meta"))


def test_the_wrapper_and_its_group_go_when_the_script_drops_them() -> None:
    """No cycle through the parameters' hooks: else the wrapper and its gloo group would go only as Python
    shuts down, where the group's threads abort the process (seen as exit code -6 at the end of training)."""
    script = (
        "import weakref, torch, torch.distributed as dist\n"
        "from smddp_sdk.collectives.ddp import DistributedDataParallel\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "model = DistributedDataParallel(torch.nn.Linear(4, 2))\n"
        "model(torch.randn(3, 4)).sum().backward()\n"
        "gone = weakref.ref(model)\n"
        "del model\n"
        "print('dropped' if gone() is None else 'kept')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, env=rank_env(0, ["algo-1"], 0), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "dropped", result
