"""Attacks on the links between hosts by another local user (nobody): a relay put between two hosts'
leaders, a relay that answers the handshake itself, a relay that flips one byte, and a connection flood
on the mesh listener. The two leaders are real meshes (TcpMesh) in this process, handed the relay's
address where the attack needs it in the path; every path pair runs: native, Python and the two mixed."""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.hostile.unprivileged import requires_nobody, start_as_nobody

pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.calls import Call  # noqa: E402
from smddp_sdk.collectives.errors import CollectiveError  # noqa: E402
from smddp_sdk.collectives.tcp import TcpMesh, new_token  # noqa: E402

pytestmark = requires_nobody
DESCRIBE = {0: "rank 0 (host a)", 1: "rank 1 (host b)"}
PATHS = {"native": (True, True), "python": (False, False), "mixed": (True, False)}

# The relay (run as nobody): listens, prints its port, forwards one connection to the listener at
# argv[1] both ways, saves what it saw to argv[2] when either side closes. argv[3] >= 0 flips that byte
# of the dialer's stream (counted from the connection's start).
RELAY = r'''
import socket, threading, time
upstream_port, capture_path, flip_at = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
dialer, _ = server.accept()
listener = socket.create_connection(("127.0.0.1", upstream_port))
seen = []

def pump(source, sink, flip):
    at = 0
    while True:
        try:
            data = bytearray(source.recv(1 << 16))
        except OSError:
            data = b""
        if not data:
            break
        if flip and at <= flip_at < at + len(data):
            data[flip_at - at] ^= 0x01
        at += len(data)
        seen.append(bytes(data))
        try:
            sink.sendall(data)
        except OSError:
            time.sleep(0.2)  # what the other direction still carries gets through first
            break
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

threads = [threading.Thread(target=pump, args=(dialer, listener, flip_at >= 0)), threading.Thread(target=pump, args=(listener, dialer, False))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with open(capture_path, "wb") as out:
    out.write(b"".join(seen))
'''

# Answers the handshake itself (nobody): plays host a's listener to host b, then replays b's answer to a.
IMPOSTOR = r'''
import os, socket
a_port = int(sys.argv[1])
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
b, _ = server.accept()
b.sendall(os.urandom(16))
hello = b.recv(57)
b.sendall(bytes([1]) + os.urandom(32))  # a reply without the secret
refused = []
for attempt in ("replayed", "forged"):
    a = socket.create_connection(("127.0.0.1", a_port), timeout=10)
    a.recv(16)
    a.sendall(hello if attempt == "replayed" else hello[:25] + os.urandom(32))
    refused.append(a.recv(64) == b"")
print("refused" if all(refused) else "ANSWERED", flush=True)
'''

# Opens argv[2] connections to the listener at argv[1] and holds them (some say garbage), then waits.
FLOOD = r'''
import os, socket, time
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for k in range(count):
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        continue
    if k % 3 == 0:
        sock.sendall(os.urandom(57))
    held.append(sock)
print(len(held), flush=True)
time.sleep(20)
'''


def _mesh(node: int, progress: bool, protection: str, token: str) -> TcpMesh:
    return TcpMesh(node, token, DESCRIBE, "127.0.0.1", progress, protection)


def _connect(a: TcpMesh, b: TcpMesh, b_dials: int, deadline_s: float = 15.0) -> list[BaseException]:
    """a accepts b, which dials port b_dials (a's own, or a relay's); returns the errors of both ends."""
    errors: list[BaseException] = []

    def run(mesh: TcpMesh, addresses: dict) -> None:
        try:
            mesh.connect(addresses, time.monotonic() + deadline_s)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    accepting = threading.Thread(target=run, args=(a, {1: ("127.0.0.1", 0)}))
    accepting.start()
    run(b, {0: ("127.0.0.1", b_dials)})
    accepting.join(deadline_s + 10)
    return errors


def _exchange(a: TcpMesh, b: TcpMesh, a_sends: bytes | None, b_sends: bytes | None, deadline_s: float = 15.0) -> tuple[dict, dict]:
    """One exchange: each end sends its bytes (None: nothing) and receives the other's. Returns per end
    what arrived or the error."""
    results: dict[str, object] = {}

    def run(name: str, mesh: TcpMesh, peer: int, mine: bytes | None, theirs: bytes | None) -> None:
        into = bytearray(len(theirs)) if theirs is not None else None
        mesh.begin(Call("all_reduce"))
        try:
            mesh.exchange({peer: [memoryview(mine)]} if mine else {}, {peer: [memoryview(into)]} if into is not None else {}, "all_reduce", time.monotonic() + deadline_s)
            results[name] = bytes(into) if into is not None else b""
        except CollectiveError as exc:
            results[name] = exc

    other = threading.Thread(target=run, args=("b", b, 0, b_sends, a_sends))
    other.start()
    run("a", a, 1, a_sends, b_sends)
    other.join(deadline_s + 10)
    return results["a"], results["b"]


def _skip_without_native(paths: str) -> None:
    if PATHS[paths][0] and native.library() is None:
        pytest.skip("the native kernels are not available here")


@pytest.fixture
def drop_dir():
    """A directory nobody may write its capture into."""
    path = Path(tempfile.mkdtemp(prefix="smddp-relay-"))
    path.chmod(0o777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _start(code: str, *args: str):
    attacker = start_as_nobody(code, *args)
    line = attacker.stdout.readline()
    assert line.strip(), attacker.communicate(timeout=10)
    return attacker, line.strip()


def _pieces_seen(data: bytes, capture: bytes, samples: int = 256) -> int:
    """How many of samples 16-byte pieces of data (at random offsets) appear in the capture."""
    chooser = random.Random(7)
    return sum(data[at:at + 16] in capture for at in (chooser.randrange(len(data) - 16) for _ in range(samples)))


@pytest.mark.parametrize("paths", PATHS)
@pytest.mark.parametrize("protection", ["encrypt", "integrity"])
def test_a_relay_between_the_hosts_forwards_a_working_job_and_reads_nothing_when_encrypted(paths, protection, drop_dir):
    _skip_without_native(paths)
    token = new_token()
    a, b = _mesh(0, PATHS[paths][0], protection, token), _mesh(1, PATHS[paths][1], protection, token)
    relay, port = _start(RELAY, str(a.port), str(drop_dir / "capture"), "-1")
    try:
        assert not _connect(a, b, int(port))
        data_a, data_b = os.urandom(1 << 20), os.urandom(300_000)
        for _ in range(3):
            assert _exchange(a, b, data_a, data_b) == (data_b, data_a)  # the job works through the relay
    finally:
        a.close(farewell=True), b.close(farewell=True)
    relay.communicate(timeout=30)
    capture = (drop_dir / "capture").read_bytes()
    assert len(capture) > 3 * (len(data_a) + len(data_b))  # every byte went through it
    seen = _pieces_seen(data_a, capture) + _pieces_seen(data_b, capture)
    if protection == "encrypt":
        assert seen == 0
    else:
        assert seen == 512  # integrity alone keeps the bytes readable: the check above can fail


@pytest.mark.parametrize("paths", PATHS)
def test_an_impostor_cannot_complete_a_handshake_with_either_host(paths):
    _skip_without_native(paths)
    token = new_token()
    a, b = _mesh(0, PATHS[paths][0], "integrity", token), _mesh(1, PATHS[paths][1], "integrity", token)
    impostor, port = _start(IMPOSTOR, str(a.port))
    try:
        errors = _connect(a, b, int(port), deadline_s=4.0)
    finally:
        a.close(), b.close()
    out, err = impostor.communicate(timeout=30)
    assert out.strip() == "refused", err  # host a closed both the replayed and the forged answer
    messages = sorted(str(e) for e in errors)
    assert len(messages) == 2, messages
    assert "rank 0 (host a) at ('127.0.0.1', " in messages[0] and "failed authentication" in messages[0]  # b, to the impostor
    assert "rank 1 (host b) did not connect" in messages[1] and "2 connection(s) to this host's mesh listener" in messages[1]
    assert "failed the handshake" in messages[1]


@pytest.mark.parametrize("paths", [*PATHS, "mixed-reversed"])
def test_a_relay_flipping_one_byte_fails_both_hosts_naming_the_link(paths, drop_dir):
    progress = (False, True) if paths == "mixed-reversed" else PATHS[paths]
    _skip_without_native("native" if any(progress) else "python")
    token = new_token()
    a, b = _mesh(0, progress[0], "integrity", token), _mesh(1, progress[1], "integrity", token)
    flip_at = 57 + 48 + 1000  # past b's handshake and its first call header: a byte of b's data
    relay, port = _start(RELAY, str(a.port), str(drop_dir / "capture"), str(flip_at))
    try:
        assert not _connect(a, b, int(port))
        data = os.urandom(200_000)
        at_a, at_b = _exchange(a, b, None, data)  # b's data to a, through the flip
        assert isinstance(at_a, CollectiveError), at_a
        assert "data from rank 1 (host b) failed its integrity check at rank 0 (host a)" in str(at_a)
        if at_b == b"":  # b's send left before a checked it: b learns it in its next call
            at_b = _exchange_b_receives(b)
        assert isinstance(at_b, CollectiveError), at_b
        assert "data from rank 1 (host b) failed its integrity check at rank 0 (host a)" in str(at_b)  # a's alert
    finally:
        a.close(), b.close()
    relay.communicate(timeout=30)


def _exchange_b_receives(b: TcpMesh) -> object:
    """b's next collective, which waits for a: a has failed, so b must learn why."""
    b.begin(Call("all_reduce"))
    try:
        b.exchange({}, {0: [memoryview(bytearray(10))]}, "all_reduce", time.monotonic() + 10)
    except CollectiveError as exc:
        return exc
    return "no error"


@pytest.mark.parametrize("paths", ["native", "python"])
def test_a_connection_flood_before_the_peer_connects_neither_evicts_nor_starves_it(paths):
    _skip_without_native(paths)
    token = new_token()
    a, b = _mesh(0, PATHS[paths][0], "integrity", token), _mesh(1, PATHS[paths][1], "integrity", token)
    flood, held = _start(FLOOD, str(a.port), "300")
    try:
        assert int(held) > 250  # the flood is in: more connections than MAX_PENDING, most of them silent
        started = time.monotonic()
        assert not _connect(a, b, a.port, deadline_s=20.0)
        assert time.monotonic() - started < 8.0  # the strangers never held up the real peer for long
        assert _exchange(a, b, b"from a", b"from b!") == (b"from b!", b"from a")
    finally:
        a.close(), b.close()
        flood.kill()
        flood.communicate()


def test_a_flood_with_no_peer_fails_naming_the_strangers():
    token = new_token()
    a = _mesh(0, False, "integrity", token)
    flood, held = _start(FLOOD, str(a.port), "100")
    try:
        assert int(held) > 50
        with pytest.raises(CollectiveError, match=r"rank 1 \(host b\) did not connect .* connection\(s\) to this host's mesh listener .* something else is connecting to it"):
            a.connect({1: ("127.0.0.1", 0)}, time.monotonic() + 4.0)
    finally:
        a.close()
        flood.kill()
        flood.communicate()
