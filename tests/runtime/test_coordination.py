"""Cross-host coordination over real loopback sockets: stop on the first failure, one verdict, bad peers turned away."""

from __future__ import annotations

import threading
import time

import pytest

from smddp_sdk.runtime.coordination import Coordinator, CoordinatorClient
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports
from smddp_sdk.specs.failure import SETTLE_SECONDS, FailureRecord, PeerRank

HOSTS = ("algo-1", "algo-2", "algo-3")


def failure(host: str, rank: int, at: float, message: str = "boom") -> FailureRecord:
    return FailureRecord(host=host, rank=rank, exit_code=1, error_type="ValueError", message=message, timestamp=at)


class Peer:
    def __init__(self, host: str, port: int, token: str = "secret", connect_timeout: float = 5.0) -> None:
        self.stops: list[FailureRecord] = []
        self.stopped = threading.Event()
        self.logs: list[str] = []
        self.client = CoordinatorClient(
            host, "127.0.0.1", port, token, log=self.logs.append, on_stop=self._on_stop, connect_timeout=connect_timeout
        )
        self.client.start()

    def _on_stop(self, f: FailureRecord) -> None:
        self.stops.append(f)
        self.stopped.set()


@pytest.fixture
def coordinator():
    port = pick_free_ports(1)[0]
    logs: list[str] = []
    coord = Coordinator(HOSTS, "secret", port, log=logs.append, connect_timeout=5.0, verdict_timeout=3.0)
    coord.start()
    coord.logs = logs  # type: ignore[attr-defined]
    coord.port = port  # type: ignore[attr-defined]
    yield coord
    coord.close()


def test_first_failure_stops_every_host_and_the_earliest_is_the_verdict(coordinator):
    peers = {host: Peer(host, coordinator.port) for host in HOSTS}
    now = time.time()
    root, secondary = failure("algo-2", 3, now - 1.0), failure("algo-1", 0, now, "connection reset")
    peers["algo-1"].client.report_failure(secondary)  # observed first, but happened later
    assert all(p.stopped.wait(5) for p in peers.values())
    peers["algo-2"].client.report_failure(root)
    peers["algo-1"].client.report_final("failed", [secondary])
    peers["algo-2"].client.report_final("failed", [root])
    peers["algo-3"].client.report_final("stopped", [])
    for peer in peers.values():
        verdict = peer.client.wait_verdict(5)
        assert verdict is not None
        assert (verdict[0].host, verdict[0].rank) == ("algo-2", 3)
        assert {(f.host, f.rank) for f in verdict[1]} == {("algo-2", 3), ("algo-1", 0)}
    assert coordinator.done.is_set()


def test_a_victims_failure_stops_the_job_only_after_the_settle_time(coordinator):
    """The other host timed out waiting for algo-1's first rank, which is itself still waiting for the hung
    rank beside it: stopping at once would kill it before its own timeout names the culprit."""
    peers = {host: Peer(host, coordinator.port) for host in HOSTS}
    now = time.time()
    peers["algo-2"].client.report_failure(failure("algo-2", 2, now, "smddp all_reduce timed out waiting for rank 0 (host algo-1)").replace(awaited=(PeerRank(0, "algo-1"),)))
    assert not peers["algo-1"].stopped.wait(SETTLE_SECONDS / 2)
    peers["algo-1"].client.report_failure(failure("algo-1", 0, now + 0.1, "smddp all_reduce timed out: rank(s) 1 on this host did not arrive").replace(awaited=(PeerRank(1),)))
    assert peers["algo-1"].stopped.wait(SETTLE_SECONDS + 3)
    assert (peers["algo-1"].stops[0].host, peers["algo-1"].stops[0].rank, peers["algo-1"].stops[0].error_type) == ("algo-1", 1, "Hang")


def test_a_culprits_failure_ends_the_settle_time_at_once(coordinator):
    peers = {host: Peer(host, coordinator.port) for host in HOSTS}
    peers["algo-2"].client.report_failure(failure("algo-2", 2, time.time(), "peer rank 0 (host algo-1) closed the connection"))
    time.sleep(0.2)
    started = time.monotonic()
    peers["algo-1"].client.report_failure(failure("algo-1", 1, time.time(), "CUDA out of memory"))
    assert peers["algo-3"].stopped.wait(SETTLE_SECONDS + 3)
    assert time.monotonic() - started < SETTLE_SECONDS - 0.5
    assert (peers["algo-3"].stops[0].host, peers["algo-3"].stops[0].rank) == ("algo-1", 1)


def test_all_hosts_ok_completes_without_a_verdict(coordinator):
    peers = [Peer(host, coordinator.port) for host in HOSTS]
    for peer in peers:
        peer.client.report_final("ok", [])
    assert coordinator.done.wait(5)
    assert all(not p.stops and p.client.verdict is None for p in peers)


def test_a_host_that_disconnects_without_reporting_stops_the_job(coordinator):
    peers = {host: Peer(host, coordinator.port) for host in HOSTS}
    time.sleep(0.3)
    peers["algo-3"].client.close()  # its runtime died
    assert peers["algo-1"].stopped.wait(5)
    assert peers["algo-1"].stops[0].error_type == "LostPeer" and peers["algo-1"].stops[0].host == "algo-3"


def test_a_peer_with_the_wrong_token_is_turned_away(coordinator):
    intruder = Peer("algo-2", coordinator.port, token="another-job")
    assert intruder.client.gave_up.wait(5)
    assert any("turned this runtime away" in line and "token" in line for line in intruder.logs)


def test_an_unreachable_coordinator_does_not_hang_the_client():
    port = pick_free_ports(1)[0]  # nothing listens here
    lonely = Peer("algo-2", port, connect_timeout=0.5)
    assert lonely.client.gave_up.wait(5)
    assert lonely.client.wait_verdict(0.2) is None
    assert any("cannot reach the coordinator" in line for line in lonely.logs)


def test_a_host_connecting_after_the_stop_is_told_at_once(coordinator):
    first = Peer("algo-1", coordinator.port)
    first.client.report_failure(failure("algo-1", 0, time.time()))
    assert first.stopped.wait(5)
    late = Peer("algo-3", coordinator.port)
    assert late.stopped.wait(5) and late.stops[0].rank == 0


def test_messages_sent_before_connecting_are_delivered():
    port = pick_free_ports(1)[0]
    early = Peer("algo-1", port)
    early.client.report_failure(failure("algo-1", 1, time.time()))  # queued: nobody listens yet
    time.sleep(0.3)
    coord = Coordinator(HOSTS, "secret", port, log=lambda _: None, connect_timeout=5.0, verdict_timeout=3.0)
    coord.start()
    try:
        assert early.stopped.wait(5) and early.stops[0].rank == 1
    finally:
        coord.close()


def test_a_host_that_never_joins_fails_the_job_after_the_connect_timeout():
    port = pick_free_ports(1)[0]
    coord = Coordinator(HOSTS, "secret", port, log=lambda _: None, connect_timeout=0.5, verdict_timeout=3.0)
    coord.start()
    try:
        present = [Peer("algo-1", port), Peer("algo-2", port)]
        assert all(p.stopped.wait(5) for p in present)
        assert present[0].stops[0].error_type == "HostNeverJoined" and "algo-3" in present[0].stops[0].message
    finally:
        coord.close()


def test_a_result_reported_before_the_coordinator_listens_still_arrives():
    port = pick_free_ports(1)[0]
    early = Peer("algo-2", port)
    early.client.report_final("ok", [])  # finished before the first host's runtime was up
    time.sleep(0.3)
    coord = Coordinator(("algo-1", "algo-2"), "secret", port, log=lambda _: None, connect_timeout=5.0)
    coord.start()
    try:
        assert early.client.flush(5)
        early.client.close()
        leader = Peer("algo-1", port)
        leader.client.report_final("ok", [])
        assert coord.done.wait(5) and not early.stops
    finally:
        coord.close()
