"""Transport pieces on their own: chunk planning, shm arena files, the authenticated TCP mesh."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import threading
import time
import warnings

import pytest

pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.errors import CollectiveError, PeerRank  # noqa: E402
from smddp_sdk.collectives.local import plan_chunks  # noqa: E402
from smddp_sdk.collectives.shm import ShmUnavailable, arena_bytes, create_arena, shm_dir, unlink_own  # noqa: E402
from smddp_sdk.collectives.tcp import TcpMesh, new_token  # noqa: E402


def test_plan_chunks_packs_small_buffers_and_splits_large_ones():
    assert plan_chunks([3, 4, 10], 8) == [[(0, 0, 3), (1, 0, 4), (2, 0, 1)], [(2, 1, 8)], [(2, 9, 1)]]
    assert plan_chunks([0, 0], 8) == []
    assert plan_chunks([8], 8) == [[(0, 0, 8)]]


def test_arena_file_is_private_and_fully_allocated():
    path, fd, slot = create_arena(shm_dir(), f"smddp-test-{os.getpid()}", 2)
    try:
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_blocks * 512 >= arena_bytes(2, slot)  # allocated now: no SIGBUS on first touch later
    finally:
        unlink_own(path, fd)
        os.close(fd)
    assert not os.path.exists(path)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs, like a too-small Docker /dev/shm (needs root to mount; skipped otherwise)."""
    target = tmp_path / "shm"
    target.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    yield str(target)
    subprocess.run(["umount", str(target)], check=False)


def test_too_small_shm_gives_a_clear_error_before_anything_is_mapped(tiny_tmpfs):
    with pytest.raises(ShmUnavailable, match=r"--shm-size"):
        create_arena(tiny_tmpfs, "smddp-small", 4)
    assert os.listdir(tiny_tmpfs) == []


def _connect_pair(token_a: str, token_b: str, deadline_s: float = 5.0, native_progress: bool = True):
    describe = {0: PeerRank(0, "a"), 1: PeerRank(1, "b")}
    a, b = (TcpMesh(node, token, describe, "127.0.0.1", native_progress) for node, token in ((0, token_a), (1, token_b)))
    errors: list[BaseException] = []

    def accept() -> None:
        try:
            a.connect({1: ("127.0.0.1", b.port)}, time.monotonic() + deadline_s)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=accept)
    thread.start()
    return a, b, thread, errors


def test_mesh_rejects_a_stranger_and_accepts_the_real_peer():
    token = new_token()
    a, b, thread, errors = _connect_pair(token, token)
    stranger = socket.create_connection(("127.0.0.1", a.port))
    stranger.recv(16)
    stranger.sendall(os.urandom(16) + (1).to_bytes(4, "big") + os.urandom(32))  # claims to be node 1, wrong proof
    assert stranger.recv(1) == b""  # closed on it
    b.connect({0: ("127.0.0.1", a.port)}, time.monotonic() + 5)
    thread.join(10)
    assert not errors
    out_a, out_b = bytearray(3), bytearray(5)
    sender = threading.Thread(target=b.exchange, args=({0: [memoryview(b"abc")]}, {0: [memoryview(out_b)]}, "test", time.monotonic() + 5))
    sender.start()
    a.exchange({1: [memoryview(b"hello")]}, {1: [memoryview(out_a)]}, "test", time.monotonic() + 5)
    sender.join(10)
    assert bytes(out_a) == b"abc" and bytes(out_b) == b"hello"
    a.close(), b.close(), stranger.close()


def test_mesh_listens_on_the_hosts_own_address_only():
    mesh = TcpMesh(0, new_token(), {0: PeerRank(0, "a")}, "127.0.0.2")
    try:
        assert mesh._listener.getsockname()[0] == "127.0.0.2"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", mesh.port), timeout=2).close()  # another address of the machine
    finally:
        mesh.close()


def test_mesh_refuses_a_peer_with_the_wrong_token():
    a, b, thread, errors = _connect_pair(new_token(), new_token(), deadline_s=2.0)
    with pytest.raises(Exception, match="authentication|closed|connect"):
        b.connect({0: ("127.0.0.1", a.port)}, time.monotonic() + 2)
    thread.join(10)
    assert errors and "did not connect" in str(errors[0])
    a.close(), b.close()


@pytest.fixture(params=["native", "python"])
def mesh_pair(request):
    """Two connected mesh ends whose exchanges progress in the native loop or in Python threads."""
    if request.param == "native" and native.library() is None:
        pytest.skip("the native kernels are not available here")
    token = new_token()
    a, b, thread, errors = _connect_pair(token, token, native_progress=request.param == "native")
    b.connect({0: ("127.0.0.1", a.port)}, time.monotonic() + 5)
    thread.join(10)
    assert not errors
    yield a, b
    a.close(), b.close()


def _in_thread(target, *args) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_exchange_moves_several_large_buffers_both_ways_at_once(mesh_pair):
    a, b = mesh_pair
    sizes = [5 << 20, 1, 7 << 20]  # more than both socket buffers: each side must receive while it sends
    data_a = [os.urandom(n) for n in sizes]
    data_b = [os.urandom(n) for n in reversed(sizes)]
    into_a = [bytearray(n) for n in reversed(sizes)]
    into_b = [bytearray(n) for n in sizes]
    deadline = time.monotonic() + 20
    thread, errors = _in_thread(b.exchange, {0: [memoryview(d) for d in data_b]}, {0: [memoryview(d) for d in into_b]}, "test", deadline)
    a.exchange({1: [memoryview(d) for d in data_a]}, {1: [memoryview(d) for d in into_a]}, "test", deadline)
    thread.join(30)
    assert not errors
    assert [bytes(d) for d in into_a] == data_b and [bytes(d) for d in into_b] == data_a


def test_exchange_names_the_silent_peer_when_the_deadline_passes(mesh_pair):
    a, _ = mesh_pair
    started = time.monotonic()
    with pytest.raises(CollectiveError, match=r"smddp all_reduce timed out waiting for rank 1 \(host b\)"):
        a.exchange({1: [memoryview(b"x")]}, {1: [memoryview(bytearray(10))]}, "all_reduce", started + 0.3)
    assert 0.25 < time.monotonic() - started < 5
    with pytest.raises(CollectiveError, match="connections to the other hosts are closed"):
        a.exchange({}, {}, "barrier", time.monotonic() + 1)  # a failed exchange closes the mesh


@pytest.mark.parametrize("progress", ["native", "python"])
def test_exchange_warns_within_the_hang_time_naming_the_late_peer(progress, monkeypatch, caplog):
    if progress == "native" and native.library() is None:
        pytest.skip("the native kernels are not available here")
    monkeypatch.setenv("SMDDP_HANG_WARN_S", "0.5")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SM_CURRENT_HOST", "a")
    token = new_token()
    a, b, thread, errors = _connect_pair(token, token, native_progress=progress == "native")
    b.connect({0: ("127.0.0.1", a.port)}, time.monotonic() + 5)
    thread.join(10)
    started = time.time()
    with caplog.at_level(logging.WARNING, logger="smddp"), pytest.raises(CollectiveError, match=r"timed out waiting for rank 1 \(host b\)"):
        a.exchange({1: [memoryview(b"x")]}, {1: [memoryview(bytearray(10))]}, "all_reduce", time.monotonic() + 4.0)
    warnings = [(record.created, record.getMessage()) for record in caplog.records]
    a.close(), b.close()
    assert len(warnings) == 1, warnings
    created, message = warnings[0]
    assert "rank 0 (host a) has waited" in message and "in all_reduce for rank 1 (host b), which has not arrived" in message
    assert "smddp-launch stacks" in message
    assert 0.5 <= created - started < 2.5  # SMDDP_HANG_WARN_S and a 0.25 s slice, long before the 4 s timeout


@pytest.mark.parametrize("progress", ["native", "python"])
def test_with_the_call_check_off_exchanges_carry_only_the_data(progress, monkeypatch):
    """SMDDP_CHECK_CALLS=0 (benchmarks/call_check_cost.py): no header on the wire, so with plain frames
    (SMDDP_LINK_INTEGRITY=0) the peer's raw bytes are the data, and a different call on the other end goes
    unnoticed."""
    if progress == "native" and native.library() is None:
        pytest.skip("the native kernels are not available here")
    monkeypatch.setenv("SMDDP_CHECK_CALLS", "0")
    monkeypatch.setenv("SMDDP_LINK_INTEGRITY", "0")
    token = new_token()
    a, b, thread, errors = _connect_pair(token, token, native_progress=progress == "native")
    b.connect({0: ("127.0.0.1", a.port)}, time.monotonic() + 5)
    thread.join(10)
    raw = a._socks[1]
    into = bytearray(5)
    sender = threading.Thread(target=lambda: raw.sendall(b"hello"))
    sender.start()
    b.exchange({}, {0: [memoryview(into)]}, "broadcast", time.monotonic() + 5)
    sender.join(10)
    assert bytes(into) == b"hello" and not errors
    a.close(), b.close()


def test_exchange_reports_a_peer_that_closed_the_connection(mesh_pair):
    a, b = mesh_pair
    thread, errors = _in_thread(b.exchange, {0: [memoryview(b"part")]}, {}, "test", time.monotonic() + 5)
    thread.join(10)
    b.close()
    into = bytearray(10)  # four bytes arrive, then the connection ends
    with pytest.raises(CollectiveError, match=r"rank 1 \(host b\) closed the connection"):
        a.exchange({}, {1: [memoryview(into)]}, "broadcast", time.monotonic() + 5)
    assert not errors and bytes(into[:4]) == b"part"


def test_the_mesh_secret_comes_from_the_runtime_and_only_stray_launches_use_the_store(monkeypatch):
    import torch.distributed as dist

    from smddp_sdk.collectives.topology import _mesh_secret, _warn_store_token
    from smddp_sdk.specs.contract import MESH_SECRET_ENV, mesh_secret

    store = dist.HashStore()
    monkeypatch.setenv(MESH_SECRET_ENV, mesh_secret("job token"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the runtime's ranks hear nothing of it
        assert _mesh_secret(store, 0) == mesh_secret("job token") != "job token"
    assert not store.check(["smddp/token"])  # nothing for a reader of the store
    monkeypatch.delenv(MESH_SECRET_ENV)
    assert _mesh_secret(store, 0) == store.get("smddp/token").decode()  # torchrun-style launch: the store's token
    with pytest.warns(RuntimeWarning, match=f"{MESH_SECRET_ENV} is not set .* whoever can reach the store can join"):
        _warn_store_token()  # what rank 0 says when such a group spans hosts
