"""DDP and FSDP2 over smddp match single-process training of the same global batch."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
from tests.collectives.cluster import Cluster  # noqa: E402

pytestmark = pytest.mark.integration


def _reports(cluster: Cluster, name: str) -> list[dict]:
    reports = [json.loads(cluster.store.get(f"report/{name}/{r}")) for r in range(len(cluster.hosts))]
    exits = cluster.finish()
    assert all(code == 0 for code, _ in exits), exits
    return reports


@pytest.mark.parametrize("hosts", [["algo-1", "algo-1"], ["algo-1", "algo-1", "algo-2", "algo-2"]], ids=["1x2", "2x2"])
def test_ddp_matches_single_process_training(hosts):
    reports = _reports(Cluster(hosts, scenario="ddp"), "ddp")
    assert len({r["digest"] for r in reports}) == 1, "parameters differ between ranks"
    assert max(r["max_diff"] for r in reports) < 1e-5, reports


def test_fsdp2_fully_shard_trains_like_single_process():
    reports = _reports(Cluster(["algo-1", "algo-2"], scenario="fsdp2"), "fsdp2")
    assert max(r["max_diff"] for r in reports) < 1e-5, reports
    assert reports[0]["losses"][-1] < reports[0]["losses"][0]
