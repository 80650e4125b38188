"""Hostile connections to the runtime coordinator (127.0.0.1 only, bounded loops).

Each attack is one the issue measured against the old coordinator: a 1 GiB unterminated line, 100k-deep
JSON, idle and trickling connections that hold the handshake. After each, real hosts must still join
and get their verdict, and the attacker's connection must be gone.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from smddp_sdk.runtime import coordination
from smddp_sdk.runtime.coordination import Coordinator, CoordinatorClient, decode_message
from smddp_sdk.schedulers.hosttree.job_dir import pick_free_ports
from smddp_sdk.specs.failure import FailureRecord

HOSTS = ("algo-1", "algo-2")


class Peer:
    def __init__(self, host: str, port: int, token: str = "secret") -> None:
        self.logs: list[str] = []
        self.stopped = threading.Event()
        self.client = CoordinatorClient(host, "127.0.0.1", port, token, log=self.logs.append, on_stop=lambda f: self.stopped.set(), connect_timeout=10.0)
        self.client.start()


@pytest.fixture
def coordinator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    monkeypatch.setattr(coordination, "HANDSHAKE_TIMEOUT", 1.0)
    port = pick_free_ports(1)[0]
    logs: list[str] = []
    coord = Coordinator(HOSTS, "secret", port, log=logs.append, address="127.0.0.1", connect_timeout=20.0, verdict_timeout=3.0)
    coord.start()
    coord.logs = logs  # type: ignore[attr-defined]
    coord.port = port  # type: ignore[attr-defined]
    yield coord
    coord.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    challenge = sock.recv(4096)
    assert b"challenge" in challenge
    return sock


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the other side closed (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def job_still_works(coord: Coordinator) -> None:
    """Both real hosts join, one fails, both are told to stop and get the verdict."""
    peers = [Peer(host, coord.port) for host in HOSTS]  # type: ignore[attr-defined]
    assert all(p.client.connected.wait(10) for p in peers), [p.logs for p in peers]
    failure = FailureRecord(host="algo-2", rank=1, exit_code=3, error_type="ValueError", message="boom", timestamp=time.time())
    peers[1].client.report_failure(failure)
    assert all(p.stopped.wait(10) for p in peers)
    peers[0].client.report_final("stopped", [])
    peers[1].client.report_final("failed", [failure])
    verdict = peers[0].client.wait_verdict(10)
    assert verdict is not None and verdict[0].host == "algo-2"
    for p in peers:
        p.client.close()


def test_listens_only_on_the_address_it_was_given(coordinator: Coordinator) -> None:
    assert coordinator._server.getsockname()[0] == "127.0.0.1"


def test_unterminated_giant_line_is_cut_off(coordinator: Coordinator) -> None:
    sock = connect(coordinator.port)  # type: ignore[attr-defined]
    sent = 0
    chunk = b"x" * 65536
    try:
        while sent < 64 * 1024 * 1024:  # the old coordinator buffered all of it
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 64 * 1024 * 1024, "the coordinator kept reading an endless line"
    sock.close()
    job_still_works(coordinator)


def test_deep_json_does_not_kill_the_coordinator(coordinator: Coordinator) -> None:
    for payload in (b"[" * 100_000 + b"]" * 100_000 + b"\n", b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"\n"):
        sock = connect(coordinator.port)  # type: ignore[attr-defined]
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(sock, 5)
        sock.close()
    job_still_works(coordinator)


def test_idle_connections_neither_block_hosts_nor_stay(coordinator: Coordinator) -> None:
    idle = [socket.create_connection(("127.0.0.1", coordinator.port), timeout=5) for _ in range(64)]  # type: ignore[attr-defined]
    started = time.monotonic()
    job_still_works(coordinator)  # hosts retry through the flood and join
    assert time.monotonic() - started < 10
    assert all(closed_by_peer(sock, 5) for sock in idle)
    for sock in idle:
        sock.close()


def test_a_trickling_handshake_is_cut_off_in_total_time(coordinator: Coordinator) -> None:
    sock = connect(coordinator.port)  # type: ignore[attr-defined]
    started = time.monotonic()
    try:
        for _ in range(50):  # one byte every 0.1 s: each read is quick, the whole never ends
            sock.sendall(b" ")
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert time.monotonic() - started < 4.5
    assert closed_by_peer(sock, 2)
    sock.close()


def test_wrong_token_and_strangers_are_turned_away(coordinator: Coordinator) -> None:
    stranger = Peer("algo-1", coordinator.port, token="guess")  # type: ignore[attr-defined]
    assert stranger.client.gave_up.wait(10)
    assert any("turned this runtime away" in line for line in stranger.logs)
    job_still_works(coordinator)  # the real algo-1 is not locked out by the impostor


def test_malformed_messages_from_a_joined_host_are_dropped(coordinator: Coordinator) -> None:
    peers = [Peer(host, coordinator.port) for host in HOSTS]  # type: ignore[attr-defined]
    assert all(p.client.connected.wait(10) for p in peers)
    for bad in ({"type": "failure", "failure": "not a record"}, {"type": "failure"}, {"type": "final", "failures": [1, 2]}):
        peers[0].client._send(bad)
    time.sleep(0.5)
    assert any("ignored a malformed" in line for line in coordinator.logs)  # type: ignore[attr-defined]
    for p in peers:
        p.client.close()


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b'{"type": "hello"}\n', True),
        (b'{"text": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}\n', True),  # brackets inside a string
        (b"[" * 40 + b"]" * 40 + b"\n", False),
        (b'["not an object"]\n', False),
        (b"not json\n", False),
        (json.dumps({"a": '\\"['}).encode() + b"\n", True),
    ],
)
def test_decode_message_bounds(line: bytes, ok: bool) -> None:
    assert (decode_message(line) is not None) is ok
