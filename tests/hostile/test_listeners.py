"""Local-mode listeners bind loopback only: the rendezvous store (served by the master host's runtime,
not by rank 0 on every interface) and the runtime coordinator. A real 2-host x 2-rank job records every
socket listening on MASTER_PORT from inside a rank, after rendezvous."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from smddp_sdk.runtime import store as rendezvous_store
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports
from tests.integration.runtime_job import make_job, wait_all

LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
SCRIPTS = Path(__file__).parent / "scripts"

pytest.importorskip("torch")


def _run_two_hosts(tmp_path: Path, script: str, ranks_per_host: int) -> dict[str, tuple[int, str]]:
    """A real 2-host job of ``script`` (from scripts/) with smddp enabled; every host must succeed."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPTS / script, code / "train.py")
    job = make_job(tmp_path / "job", code, ["algo-1", "algo-2"], {"sagemaker_distributed_dataparallel_enabled": True, "sagemaker_container_log_level": 10}, num_gpus=ranks_per_host)
    results = wait_all(job.start(), timeout=180)
    for host, (code_, out) in results.items():
        assert code_ == 0, f"{host}:\n{out}"
    return results


def test_the_store_and_coordinator_listen_on_loopback_only(tmp_path: Path) -> None:
    results = _run_two_hosts(tmp_path, "listeners.py", 2)
    assert "rendezvous store serving on 127.0.0.1" in results["algo-1"][1]
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "job").rglob("listeners-*.json"))]
    assert len(reports) == 4 and all(r["sum"] == 4 for r in reports), reports
    assert all(r["agent_store"] == "True" for r in reports)
    for report in reports:
        assert report["listening"] == [LOOPBACK_HEX], report  # one listener, on loopback; none on 0.0.0.0 or ::


def test_store_helper_stops_with_its_runtime(tmp_path: Path) -> None:
    port = pick_free_ports(1)[0]
    store = rendezvous_store.RendezvousStore.start("127.0.0.1", port, tmp_path)
    assert store.wait_ready() == ""
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    store.stop()
    assert store.process.returncode is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


VALIDATION = bytes([0]) + (0x3C85F7CE).to_bytes(4, sys.byteorder)  # torch's VALIDATE query, as its clients send it


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_store_never_closes_the_jobs_own_connections(tmp_path: Path) -> None:
    """Connections from the job's own uid (this test's) stay, however many and however quiet: the bounds are for
    other users (tests/hostile/test_attack_flood.py) and for peers this machine cannot see."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    port = pick_free_ports(1)[0]
    store = rendezvous_store.RendezvousStore.start("127.0.0.1", port, tmp_path, max_per_address=6, handshake_s=1.0)
    assert store.wait_ready() == ""
    try:
        rank = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10), use_libuv=True)
        rank.set("key", "value")
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        talkers = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]  # beyond max_per_address
        for sock in talkers:
            sock.sendall(VALIDATION)
        time.sleep(3)  # three passes of the guard, past handshake_s
        assert not any(_closed_by_server(sock, within=0.2) for sock in silent + talkers)
        assert rank.get("key") == b"value"
        for sock in silent + talkers:
            sock.close()
    finally:
        store.stop()


def test_store_is_not_served_where_not_wanted(tmp_path: Path) -> None:
    notes: list[str] = []
    assert rendezvous_store.serve("", 1, sys.executable, notes.append, tmp_path) is None  # docker, SageMaker: rank 0 serves it
    port = pick_free_ports(1)[0]
    assert rendezvous_store.serve("127.0.0.1", port, "/bin/false", notes.append, tmp_path) is None  # no torch there
    assert "rank 0 will serve it" in notes[-1]
    assert rendezvous_store.rank_environment("127.0.0.1", is_master=True, served=False) == {}
    assert rendezvous_store.rank_environment("127.0.0.1", is_master=False, served=False) == {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert rendezvous_store.rank_environment("", is_master=False, served=False) == {}
    assert rendezvous_store.store_address("127.0.0.1", {"SMDDP_RUNTIME_STORE": "0"}) == ""
    assert rendezvous_store.store_address("127.0.0.1", {}) == "127.0.0.1"


def test_the_mesh_secret_reaches_ranks_from_the_runtime_not_through_the_store(tmp_path: Path) -> None:
    _run_two_hosts(tmp_path, "mesh_secret.py", 1)
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "job").rglob("mesh-*.json"))]
    assert len(reports) == 2 and all(r["sum"] == 2 for r in reports), reports
    assert all(r["secret_from_runtime"] and not r["token_in_store"] for r in reports), reports
