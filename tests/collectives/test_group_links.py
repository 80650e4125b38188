"""The links of one process group prove a secret of that group's rendezvous (topology._connect_mesh), so a
connection made for one group of a job cannot be spliced by a relay into another group of the same job."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives.store_values import StoreValues  # noqa: E402
from smddp_sdk.collectives.tcp import TcpMesh, new_token  # noqa: E402
from tests.collectives.test_link_security import DESCRIBE, _connect  # noqa: E402


def _link_secret(job_secret: str, rendezvous: str) -> str:
    values = StoreValues(dist.HashStore(), job_secret)
    values.bind(rendezvous)
    return values.derive_name("mesh links")


def test_each_rendezvous_of_a_job_gets_its_own_link_secret():
    job = new_token()
    assert _link_secret(job, "group A") == _link_secret(job, "group A")
    assert _link_secret(job, "group A") != _link_secret(job, "group B")
    assert _link_secret(job, "group A") != _link_secret(new_token(), "group A")


@pytest.mark.parametrize("native_progress", [True, False], ids=["native", "python"])
def test_a_connection_of_one_group_is_refused_by_another_group_of_the_same_job(native_progress):
    job = new_token()
    a = TcpMesh(0, _link_secret(job, "group A"), DESCRIBE, "127.0.0.1", native_progress)
    b = TcpMesh(1, _link_secret(job, "group B"), DESCRIBE, "127.0.0.1", native_progress)
    errors = _connect(a, b, a.port, deadline_s=3.0)
    a.close(), b.close()
    assert errors, "node 1 of group B joined node 0 of group A"
    # the listener never admits the other group's node; the dialer is told its proof was refused
    assert any("rank 1 (host b) did not connect" in str(e) for e in errors), errors
    assert all("did not connect" in str(e) or "mesh secret" in str(e) for e in errors), errors
