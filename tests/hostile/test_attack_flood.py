"""Connection floods by another local user (``nobody``) against a live 2-host x 2-rank job's listeners.

The rendezvous store's helper once closed the ranks' own connections as "newest beyond the bound" after 60
validated connections from an outsider, and the job failed with a bare DistNetworkError; the coordinator heard
at most 32 strangers at once, so an outsider who kept them busy could lock hosts out. Now the job's own uid
holds slots no outsider can take (runtime/peers.py reads the peer's owner on loopback), strangers get a small
bound of their own, and the helper reports what it closed in the master host's log.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from smddp_sdk.runtime import store as rendezvous_store
from smddp_sdk.runtime.coordination import Coordinator
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports
from smddp_sdk.specs import contract
from tests.hostile.unprivileged import NOBODY, requires_nobody, start_as_nobody
from tests.integration.runtime_job import SimulatedJob, make_job, wait_all

pytest.importorskip("torch")
pytestmark = requires_nobody

SCRIPTS = Path(__file__).parent / "scripts"
HOLD_S = 24  # the ranks hold the job open well past the store's 10 s handshake limit and its 10 s report interval (the helper is killed at the end, so a report not yet made is lost)

# As nobody: once the store listens, open ``silent`` connections that never speak, then (a second later)
# ``validated`` ones that send torch's validation message, and hold them all. The helper keeps a stranger's
# oldest, so the silent ones stay until they are closed for their silence.
STORE_FLOOD = r'''
host, port, validated, silent, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
deadline = time.monotonic() + 120
held = []
while not held and time.monotonic() < deadline:
    try:
        held.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        time.sleep(0.005)
held += [socket.create_connection((host, port), timeout=5) for _ in range(silent - 1)]
time.sleep(1.2)  # a pass of the helper's guard sees the silent ones first: they are the oldest
held += [Store(host, port).sock for _ in range(validated)]
print(f"holding {len(held)}", flush=True)
time.sleep(seconds)
'''

# As nobody: keep ``count`` silent connections open to the coordinator for ``seconds``, reopening each one the
# coordinator closes, so that its handshake slots stay taken.
COORDINATOR_FLOOD = r'''
import select
host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + seconds
held, opened, told = [], 0, False
while time.monotonic() < end:
    for sock in select.select(held, [], [], 0)[0]:
        try:
            gone = not sock.recv(4096)
        except OSError:
            gone = True
        if gone:
            held.remove(sock)
            sock.close()
    while len(held) < count:
        try:
            held.append(socket.create_connection((host, port), timeout=1))
            opened += 1
        except OSError:
            break
    if not told and opened > count:  # the coordinator has closed some: its slots are full
        print(f"flooding {opened}", flush=True)
        told = True
    time.sleep(0.001)
print(f"opened {opened}", flush=True)
'''


def _job(tmp_path: Path, **env: str) -> SimulatedJob:
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SCRIPTS / "under_flood.py", code / "train.py")
    job = make_job(tmp_path / "job", code, ["algo-1", "algo-2"], {"sagemaker_distributed_dataparallel_enabled": True}, num_gpus=2)
    job.env.update(env)
    return job


def _succeeded(tmp_path: Path, results: dict[str, tuple[int, str]]) -> None:
    for host, (code, out) in results.items():
        assert code == 0, f"{host}:\n{out}"
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "job").rglob("flood-*.json"))]
    assert len(reports) == 4 and all(r["sum"] == 4 for r in reports), reports


def test_a_flood_of_validated_and_silent_store_connections_before_the_ranks_connect_leaves_the_job_running(tmp_path: Path) -> None:
    job = _job(tmp_path, SMDDP_TEST_HOLD_S=str(HOLD_S))
    port = job.env[contract.MASTER_PORT_ENV]
    attacker = start_as_nobody(STORE_FLOOD, "127.0.0.1", port, "60", "20", "150")
    try:
        results = wait_all(job.start(), timeout=240)
    finally:
        attacker.kill()
        attacker_out = attacker.communicate()[0]
    assert attacker_out.startswith("holding 80"), attacker_out  # the whole flood was open before the ranks connected
    _succeeded(tmp_path, results)
    master_log = results["algo-1"][1]
    # 80 from nobody: the 8 oldest (silent) kept at first, the 72 newer closed, the 8 later for their silence
    assert _closed(master_log, "beyond the 8 connections other local users may hold") == 72, master_log
    assert _closed(master_log, "silent for 10 s (no store validation message)") == 8, master_log


def _closed(log: str, why: str) -> int:
    """How many connections from nobody the helper's reports in log say it closed for why."""
    pattern = rf"rendezvous store: closed (\d+) connections? from uid {NOBODY}: {re.escape(why)}"
    return sum(int(count) for count in re.findall(pattern, log))


def test_a_rank_that_loses_the_store_during_a_flood_names_what_the_store_closed(tmp_path: Path) -> None:
    job = _job(tmp_path, SMDDP_TEST_HOLD_S="3", SMDDP_TEST_LOSE_THE_STORE="1")
    attacker = start_as_nobody(STORE_FLOOD, "127.0.0.1", job.env[contract.MASTER_PORT_ENV], "60", "1", "150")
    try:
        results = wait_all(job.start(), timeout=240)
    finally:
        attacker.kill()
        attacker.communicate()
    assert results["algo-1"][0] != 0
    records = json.loads(job.opt_ml("algo-1").failures_file.read_text())
    rank_0 = [r for r in records if r.get("rank") == 0 and r.get("error_type") == "DistNetworkError"]
    assert rank_0 and "(the rendezvous store closed" in rank_0[0]["message"], records
    assert f"from uid {NOBODY}: beyond the 8 connections other local users may hold" in rank_0[0]["message"], records


def test_a_flood_on_the_coordinator_port_does_not_lock_hosts_out(tmp_path: Path) -> None:
    job = _job(tmp_path, SMDDP_AGENT_TIMEOUT="60")  # a starved host would fail the job after a minute, not hang it
    first, second = (dataclasses.replace(job, hosts=(host,)) for host in job.hosts)
    runtimes = first.start()  # algo-1 runs the coordinator; algo-2 joins only once the flood holds its slots
    attacker = start_as_nobody(COORDINATOR_FLOOD, "127.0.0.1", job.env[contract.AGENT_PORT_ENV], "100", "150")
    try:
        line = attacker.stdout.readline() if attacker.stdout else ""
        assert line.startswith("flooding"), line + (attacker.stderr.read() if attacker.stderr else "")
        runtimes |= second.start()
        results = wait_all(runtimes, timeout=240)
    finally:
        attacker.kill()
        attacker.communicate()
    _succeeded(tmp_path, results)
    assert f"turning away connections from uid {NOBODY} beyond 4 handshakes at once" in results["algo-1"][1]


def test_handshakes_held_by_a_stranger_do_not_delay_a_host(tmp_path: Path) -> None:
    """40 silent connections from nobody: 4 are heard, the rest closed at once; a host's connection (this test's
    uid) is still answered at once. The old coordinator heard 32 strangers and closed the host's connection."""
    port = pick_free_ports(1)[0]
    logs: list[str] = []
    coordinator = Coordinator(("algo-1", "algo-2"), "secret", port, log=logs.append, address="127.0.0.1", connect_timeout=60.0)
    coordinator.start()
    attacker = start_as_nobody(STORE_FLOOD, "127.0.0.1", str(port), "0", "40", "30")
    try:
        assert (attacker.stdout.readline() if attacker.stdout else "").startswith("holding 40")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as host:
            host.settimeout(5)
            assert b'"challenge"' in host.recv(4096)
        assert f"turning away connections from uid {NOBODY} beyond 4 handshakes at once" in logs, logs
    finally:
        attacker.kill()
        attacker.communicate()
        coordinator.close()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_stranger_holds_at_most_its_own_bound_of_store_connections_and_the_ranks_keep_theirs(tmp_path: Path) -> None:
    """The helper alone, faster: the job's own connections (this test's uid) stay whatever nobody does."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    port = pick_free_ports(1)[0]
    store = rendezvous_store.RendezvousStore.start("127.0.0.1", port, tmp_path, max_per_address=6, handshake_s=1.0, report_s=0.0)
    assert store.wait_ready() == ""
    store.relay(lambda text: None)
    attacker = start_as_nobody(STORE_FLOOD, "127.0.0.1", str(port), "30", "1", "60")
    try:
        assert (attacker.stdout.readline() if attacker.stdout else "").startswith("holding 31")
        rank = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10), use_libuv=True)  # newest of all
        rank.set("key", "value")
        own = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(10)]  # beyond max_per_address
        time.sleep(3)  # three guard passes, past handshake_s
        assert not any(_closed_by_server(sock, within=0.2) for sock in own)
        assert rank.get("key") == b"value"
        assert any(f"from uid {NOBODY}: beyond the 8 connections" in notice for notice in store.notices), store.notices
        for sock in own:
            sock.close()
    finally:
        attacker.kill()
        attacker.communicate()
        store.stop()
    assert "the rendezvous store closed" in store.note_for_failure()


def test_a_store_helper_that_dies_is_named_in_the_failure(tmp_path: Path) -> None:
    port = pick_free_ports(1)[0]
    store = rendezvous_store.RendezvousStore.start("127.0.0.1", port, tmp_path)
    assert store.wait_ready() == ""
    assert store.note_for_failure() == ""
    store.process.kill()  # as the kernel's OOM killer would
    store.process.wait()
    assert "rendezvous store stopped during the job (its helper exited with code -9" in store.note_for_failure()
    store.stop()
    assert store.note_for_failure() == ""  # stopped by the runtime: no cause of anything
