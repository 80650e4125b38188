"""Links between hosts (tcp.py): the handshake's keys, records with their tags on both progress paths and
between them, what a changed, reordered, replayed or cut record does, protection settings and where the
job's encrypt_inter_container_traffic reaches the ranks. The attacks by another local user are in
tests/hostile/test_attack_links.py."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
from smddp_sdk.collectives import native  # noqa: E402
from smddp_sdk.collectives.calls import Call  # noqa: E402
from smddp_sdk.collectives.errors import CollectiveError  # noqa: E402
from smddp_sdk.collectives.tcp import (  # noqa: E402
    _HELLO,
    ENCRYPT,
    INTEGRITY,
    RECORD_BYTES,
    TAG_BYTES,
    LinkIntegrityError,
    TcpMesh,
    _Records,
    _records,
    _Secret,
    link_protection,
    new_token,
)
from smddp_sdk.specs import contract  # noqa: E402

DESCRIBE = {0: "rank 0 (host a)", 1: "rank 1 (host b)"}
# (a's path, b's path): True is the native loop, False the Python threads
PAIRS = {"native": (True, True), "python": (False, False), "native-python": (True, False), "python-native": (False, True)}
HEADER_RECORD = 32 + TAG_BYTES
DATA_RECORD = RECORD_BYTES + TAG_BYTES


def _pair(pair: str, protection: str = "integrity", token: str | None = None, relay: Relay | None = None) -> tuple[TcpMesh, TcpMesh]:
    """Connected meshes a (node 0, listening) and b (node 1, dialing a, or the relay in front of a)."""
    if True in PAIRS[pair] and native.library() is None:
        pytest.skip("the native kernels are not available here")
    token = token or new_token()
    a, b = (TcpMesh(node, token, DESCRIBE, "127.0.0.1", progress, protection) for node, progress in enumerate(PAIRS[pair]))
    errors = _connect(a, b, relay.start(a.port) if relay else a.port)
    assert not errors, errors
    return a, b


def _connect(a: TcpMesh, b: TcpMesh, port: int, deadline_s: float = 10.0) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(mesh: TcpMesh, addresses: dict) -> None:
        try:
            mesh.connect(addresses, time.monotonic() + deadline_s)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=run, args=(a, {1: ("127.0.0.1", 0)}))
    thread.start()
    run(b, {0: ("127.0.0.1", port)})
    thread.join(deadline_s + 5)
    return errors


def _exchange(a: TcpMesh, b: TcpMesh, a_sends: list[bytes], b_sends: list[bytes], deadline_s: float = 10.0) -> tuple[object, object]:
    """Both ends send their buffers and receive the other's (into buffers of the same sizes); per end,
    the bytes received or the error."""
    results: dict[str, object] = {}

    def run(name: str, mesh: TcpMesh, peer: int, mine: list[bytes], theirs: list[bytes]) -> None:
        into = [bytearray(len(t)) for t in theirs]
        mesh.begin(Call("all_gather"))
        try:
            mesh.exchange({peer: [memoryview(m) for m in mine]} if mine else {}, {peer: [memoryview(i) for i in into]} if into else {},
                          "all_gather", time.monotonic() + deadline_s)
            results[name] = [bytes(i) for i in into]
        except CollectiveError as exc:
            results[name] = exc

    thread = threading.Thread(target=run, args=("b", b, 0, b_sends, a_sends))
    thread.start()
    run("a", a, 1, a_sends, b_sends)
    thread.join(deadline_s + 5)
    return results["a"], results["b"]


class Relay:
    """Forwards one connection from b to a in this process; rewrite(bytes) -> bytes replaces the length
    bytes of b's stream from offset start (buffered whole), or with then_close ends the connection there."""

    def __init__(self, start: int, length: int, rewrite=lambda region: region, then_close: bool = False) -> None:
        self._start, self._length, self._rewrite, self._then_close = start, length, rewrite, then_close
        self._server = socket.create_server(("127.0.0.1", 0))

    def start(self, upstream: int) -> int:
        threading.Thread(target=self._serve, args=(upstream,), daemon=True).start()
        return self._server.getsockname()[1]

    def _serve(self, upstream: int) -> None:
        dialer, _ = self._server.accept()
        listener = socket.create_connection(("127.0.0.1", upstream))
        threading.Thread(target=self._pump, args=(listener, dialer, False), daemon=True).start()
        self._pump(dialer, listener, True)

    def _pump(self, source: socket.socket, sink: socket.socket, rewriting: bool) -> None:
        at, held = 0, b""
        try:
            while data := source.recv(1 << 16):
                if not rewriting:
                    sink.sendall(data)
                    continue
                held += data
                if at < self._start:  # before the region: on at once
                    passing = held[:self._start - at]
                    sink.sendall(passing)
                    at, held = at + len(passing), held[len(passing):]
                if at < self._start or len(held) < self._length:
                    continue
                sink.sendall(self._rewrite(held[:self._length]))
                if self._then_close:
                    break
                sink.sendall(held[self._length:])
                rewriting = False
        except OSError:
            time.sleep(0.2)  # one end left: what the other direction still carries (an alert) gets through first
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# --- the handshake's keys -------------------------------------------------------------------------------
def test_each_connection_and_direction_gets_its_own_keys_and_both_ends_agree():
    secret = _Secret(new_token())
    first = secret.transcript(os.urandom(16), os.urandom(16), 1, 0, INTEGRITY)
    second = secret.transcript(os.urandom(16), os.urandom(16), 1, 0, INTEGRITY)
    dialer, listener = secret.link_keys(first, dialer=True), secret.link_keys(first, dialer=False)
    assert dialer[:44] == listener[44:] and dialer[44:] == listener[:44]  # one end's send is the other's receive
    assert dialer[:44] != dialer[44:]  # the two directions differ
    assert secret.link_keys(second, dialer=True) != dialer  # another connection, other nonces: other keys
    assert _Secret(new_token()).link_keys(first, dialer=True) != dialer  # another job's secret: other keys
    assert secret.dialer_proof(first) != secret.listener_proof(first, INTEGRITY)  # a proof cannot be reflected
    assert secret.dialer_proof(first) != secret.dialer_proof(secret.transcript(first[16:32], first[32:48], 1, 0, ENCRYPT))


def test_records_split_views_at_the_record_size_and_a_changed_bit_fails_its_check():
    views = [memoryview(bytes(range(256)) * 300), memoryview(b"x" * 5), memoryview(bytes(RECORD_BYTES))]
    records = list(_records(views, RECORD_BYTES))
    assert [sum(map(len, r)) for r in records] == [RECORD_BYTES, RECORD_BYTES, 76805 - RECORD_BYTES]
    assert b"".join(b"".join(r) for r in records) == b"".join(views)
    keys = os.urandom(88)
    for protection in (INTEGRITY, ENCRYPT):
        sender, receiver = _Records(protection, keys), _Records(protection, keys[44:] + keys[:44])
        payload = bytearray(os.urandom(1000))
        wire = b"".join(sender.seal([memoryview(payload[:300]), memoryview(payload[300:])]))
        assert len(wire) == 1000 + TAG_BYTES and (wire[:1000] == payload) == (protection == INTEGRITY)
        into = bytearray(wire[:1000])
        assert receiver.open([memoryview(into)], wire[1000:]) and into == payload
        again = bytearray(wire[:1000])
        again[7] ^= 1
        assert not _Records(protection, keys[44:] + keys[:44]).open([memoryview(again)], wire[1000:])
        assert not receiver.open([memoryview(bytearray(wire[:1000]))], wire[1000:])  # the same record replayed: the count moved on


# --- records on the wire, on every pair of paths -----------------------------------------------------------
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("protection", ["plain", "integrity", "encrypt"])
def test_every_protection_moves_the_data_between_either_path(pair, protection):
    a, b = _pair(pair, protection)
    try:
        sizes = [3, RECORD_BYTES - 1, 1, 3 * RECORD_BYTES + 17, 5 << 20]  # records across view boundaries, more than the socket buffers
        data_a, data_b = [os.urandom(n) for n in sizes], [os.urandom(n) for n in reversed(sizes)]
        for _ in range(2):
            assert _exchange(a, b, data_a, data_b) == (data_b, data_a)
        assert _exchange(a, b, [b"one way"], []) == ([], [b"one way"])
    finally:
        a.close(farewell=True), b.close(farewell=True)


FIRST_DATA = _HELLO.size + HEADER_RECORD  # b's stream: its handshake, its first call header, then data records


def _swap_records(region: bytes) -> bytes:
    return region[DATA_RECORD:] + region[:DATA_RECORD]


def _replay_record(region: bytes) -> bytes:
    return region[:DATA_RECORD] * 2


@pytest.mark.parametrize("pair", ["native", "python", "python-native"])
@pytest.mark.parametrize("rewrite", [_swap_records, _replay_record], ids=["reordered", "replayed"])
def test_a_reordered_or_replayed_record_fails_the_receiver_and_the_sender_learns_why(pair, rewrite):
    relay = Relay(FIRST_DATA, 2 * DATA_RECORD, rewrite)
    a, b = _pair(pair, "integrity", relay=relay)
    try:
        at_a, at_b = _exchange(a, b, [], [os.urandom(3 * RECORD_BYTES)])
        assert isinstance(at_a, LinkIntegrityError), at_a
        assert "data from rank 1 (host b) failed its integrity check at rank 0 (host a)" in str(at_a)
        if not isinstance(at_b, CollectiveError):  # b's bytes were all out before a checked them
            at_b = _exchange(a, b, [b"x"], [])[1]  # b's next call waits for a, which alerted it before leaving
        assert isinstance(at_b, LinkIntegrityError) and "failed its integrity check at rank 0 (host a)" in str(at_b), at_b
    finally:
        a.close(), b.close()


@pytest.mark.parametrize("pair", ["native", "python"])
def test_a_record_cut_short_is_never_used(pair):
    """The relay passes b's stream only up to the middle of its second data record, then closes: the
    first record arrives whole and checked, the second never counts."""
    relay = Relay(FIRST_DATA + DATA_RECORD + 1000, 0, then_close=True)
    a, b = _pair(pair, "integrity", relay=relay)
    try:
        data = os.urandom(2 * RECORD_BYTES)
        at_a, _ = _exchange(a, b, [], [data], deadline_s=3.0)
        assert isinstance(at_a, CollectiveError) and "rank 1 (host b)" in str(at_a), at_a
    finally:
        a.close(), b.close()


@pytest.mark.parametrize("pair", ["native", "python-native"])
def test_hosts_that_protect_their_links_differently_both_fail_naming_both_settings(pair):
    if native.library() is None:
        pytest.skip("the native kernels are not available here")
    token = new_token()
    a = TcpMesh(0, token, DESCRIBE, "127.0.0.1", PAIRS[pair][0], "encrypt")
    b = TcpMesh(1, token, DESCRIBE, "127.0.0.1", PAIRS[pair][1], "integrity")
    errors = _connect(a, b, a.port, deadline_s=4.0)
    a.close(), b.close()
    assert len(errors) == 2, errors
    for error in errors:
        assert "rank 1 (host b) protects the links between hosts with integrity frames but rank 0 (host a) with encrypt" in str(error) \
            or "rank 0 (host a) protects the links between hosts with encrypt frames but rank 1 (host b) with integrity" in str(error)
        assert contract.LINK_ENCRYPT_ENV in str(error)


# --- settings ----------------------------------------------------------------------------------------------
def test_protection_comes_from_the_environment_and_a_typo_is_an_error(monkeypatch):
    monkeypatch.delenv(contract.LINK_ENCRYPT_ENV, raising=False)
    monkeypatch.delenv("SMDDP_LINK_INTEGRITY", raising=False)
    assert link_protection() == "integrity"
    monkeypatch.setenv("SMDDP_LINK_INTEGRITY", "0")
    assert link_protection() == "plain"
    monkeypatch.setenv(contract.LINK_ENCRYPT_ENV, "1")
    assert link_protection() == "encrypt"  # encryption wins: it carries integrity too
    monkeypatch.setenv(contract.LINK_ENCRYPT_ENV, "maybe")
    with pytest.raises(CollectiveError, match="SMDDP_LINK_ENCRYPT='maybe' is not understood: use 1 or 0"):
        link_protection()


def test_without_a_cipher_a_protected_link_is_refused_never_sent_in_the_clear(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)  # as if not installed
    with pytest.raises(CollectiveError, match="needs the cryptography package, which is missing .* pip install cryptography"):
        TcpMesh(0, new_token(), DESCRIBE, "127.0.0.1", False, "encrypt")
    TcpMesh(0, new_token(), DESCRIBE, "127.0.0.1", False, "plain").close()  # plain frames need no cipher
    if native.library() is not None:
        monkeypatch.setattr(native, "_crypto_why_not", "no OpenSSL libcrypto with AES-GCM could be opened (tried libcrypto.so.3)")
        with pytest.raises(CollectiveError, match="native kernels cannot: no OpenSSL libcrypto .* SMDDP_NATIVE=0"):
            TcpMesh(0, new_token(), DESCRIBE, "127.0.0.1", True, "integrity")


def test_the_native_kernels_refuse_a_connection_that_was_never_registered():
    if native.library() is None:
        pytest.skip("the native kernels are not available here")
    left, right = socket.socketpair()
    data = bytearray(b"secret")
    transfer = native.Transfer(left.fileno(), 0, ctypes.addressof(ctypes.c_char.from_buffer(data)), len(data), 0, 0)
    assert native.library().smddp_exchange(ctypes.byref(transfer), 1, 0) == 0 and transfer.error == errno.ENOTCONN
    right.setblocking(False)
    with pytest.raises(BlockingIOError):
        right.recv(10)  # nothing left unprotected
    left.close(), right.close()


# --- the job's encrypt_inter_container_traffic reaches the ranks ---------------------------------------------
@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hello')\n")
    return code


@pytest.mark.parametrize("encrypt", [True, False])
def test_local_and_docker_hosts_get_the_encryption_setting_over_the_jobs_environment(code_dir, tmp_path, encrypt):
    from smddp_sdk.schedulers import get_scheduler
    from tests.schedulers.test_docker_scheduler import argv_of, make_spec, option_values

    spec = make_spec(code_dir, encrypt_inter_container_traffic=encrypt, environment={contract.LINK_ENCRYPT_ENV: "0"})
    local = get_scheduler("local", job_root=str(tmp_path / "local")).dryrun(spec)
    environments = [local.request.environment(host.host) for host in local.request.hosts]
    assert [env[contract.LINK_ENCRYPT_ENV] for env in environments] == ["1" if encrypt else "0"] * 2
    docker = get_scheduler("docker", job_root=str(tmp_path / "docker")).dryrun(spec)
    assert f"{contract.LINK_ENCRYPT_ENV}={'1' if encrypt else '0'}" in option_values(argv_of(docker, 1), "-e")
    assert not any("encrypt_inter_container_traffic" in note for note in [*local.notes, *docker.notes])  # emulated now


def test_slurm_nodes_get_the_encryption_setting(tmp_path, code_dir):
    from smddp_sdk.runtime import slurm_node
    from smddp_sdk.schedulers import get_scheduler
    from smddp_sdk.specs.slurm_job import JOB_DIR_ENV
    from tests.slurm.test_slurm_plan import FakeSlurm, spec_for

    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm())
    scheduler.submit(spec_for(code_dir, encrypt_inter_container_traffic=True))
    environ = {JOB_DIR_ENV: str(tmp_path / "jobs" / "job-1"), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7",
               contract.LINK_ENCRYPT_ENV: "0"}
    assert slurm_node.node_environ(environ)[contract.LINK_ENCRYPT_ENV] == "1"
