"""DDP and FSDP2 over smddp match single-process training of the same global batch.

One group of 4 ranks on 2 simulated hosts (shared memory within, TCP between) runs both, one after the other.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
from tests.collectives.cluster import Cluster  # noqa: E402

pytestmark = pytest.mark.integration
HOSTS = ["algo-1", "algo-1", "algo-2", "algo-2"]


@pytest.fixture(scope="module")
def reports() -> dict[str, list[dict]]:
    cluster = Cluster(HOSTS, scenario="ddp_then_fsdp2")
    found = {name: [json.loads(cluster.store.get(f"report/{name}/{r}")) for r in range(len(HOSTS))] for name in ("ddp", "fsdp2")}
    exits = cluster.finish()
    assert all(code == 0 for code, _ in exits), exits
    return found


def test_ddp_matches_single_process_training(reports):
    ddp = reports["ddp"]
    assert len({r["digest"] for r in ddp}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in ddp) < 1e-5, ddp


def test_fsdp2_fully_shard_trains_like_single_process(reports):
    fsdp2 = reports["fsdp2"]
    assert max(r["max_diff"] for r in fsdp2) < 1e-5, fsdp2
    assert min(r["moved"] for r in fsdp2) > 1e-3, "the sharded parameters did not change"
