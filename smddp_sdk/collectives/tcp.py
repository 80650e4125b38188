"""TCP transport between hosts: one connection per pair of node leaders, authenticated and protected.

Handshake. The dialer (node i, dialing node j < i) and the listener each prove the mesh secret (the one
the runtime hands every rank: topology.py's _mesh_secret) over everything that identifies the connection:
the job (an id derived from the secret), both nonces, both node indices and the protection. The listener
sends a 16-byte nonce Ns; the dialer answers with its nonce Nc, i, j, its protection and
HMAC(auth, "client" | transcript); the listener replies with its protection and
HMAC(auth, "server" | transcript | its protection). Each connection then gets its own keys, one per
direction: HKDF-SHA256 of the secret with salt Ns | Nc over the transcript. A relay that forwards the
handshake gains nothing (it has no keys), one that answers itself cannot prove the secret, and a replayed
answer fails the fresh nonce. Strangers on the listener prove themselves or go (HANDSHAKE_S), all at once,
and never hold up or push out a real peer (connect's _Acceptor).

Frames. Each direction of a connection carries messages: per exchange, the call header (below), then the
data. With protection ("integrity", the default, or "encrypt": SMDDP_LINK_ENCRYPT=1, which the runtime
sets from the job's encrypt_inter_container_traffic) a message goes as records: the header alone, then the
data in RECORD_BYTES pieces, each followed by a 16-byte AES-256-GCM tag under the record's nonce, the
direction's nonce base XOR its record count (so reordered, replayed or cut records fail). "integrity"
authenticates the bytes in the clear (GCM's GMAC: the payload as associated data); "encrypt" encrypts
them. A record counts only once its tag is checked: a flipped byte fails the exchange on both ends
(LinkIntegrityError names the link; the detecting end tells the other with an alert header) instead of
the data being used. "plain" (SMDDP_LINK_INTEGRITY=0, for measuring what protection costs) sends the
bytes alone. Every host must use the same protection; the handshake refuses a difference by name.

Every exchange carries a call header ahead of each peer's bytes: the collective's call record (calls.py:
sequence number, op, reduce op, dtype, element count, root) and the exchange's step within the call. A
receiver compares the header it gets with its own before it uses the data, so hosts that run different
collectives fail at once naming both calls, instead of reducing garbage. The native core (native/core/)
writes the same header, byte for byte.

An exchange moves its bytes in the native progress loop (smddp_native.c: one thread polls every socket,
without the GIL; OpenSSL's libcrypto for the records) where the native kernels are loaded; otherwise
sender threads and a receive loop in Python do it, with the ``cryptography`` package. Both write the same
records and fail with the same errors, so hosts may mix them.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import secrets
import selectors
import socket
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from smddp_sdk.collectives import call_file, native
from smddp_sdk.collectives.calls import Call, describe
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.hangs import HangWatch, this_rank
from smddp_sdk.specs.call_record import HEADER_AT
from smddp_sdk.specs.contract import LINK_ENCRYPT_ENV

NONCE_BYTES = 16
HEADER_MAGIC = 0x48444D53  # b"SMDH" on the wire
ALERT_MAGIC = 0x58444D53  # b"SMDX": a header saying "your data failed my integrity check"
HEADER_WORDS = 8  # magic, the six words of the call record, the exchange's step within the call
HEADER_BYTES = HEADER_WORDS * 4
# "0" turns the call header off on this rank (magic 0: no header is sent or expected), for measuring what
# the check costs (benchmarks/call_check_cost.py); every rank of the job must agree. Never for training:
# collectives that differ between hosts then return garbage.
CHECK_CALLS_ENV = "SMDDP_CHECK_CALLS"
# "0": plain frames between hosts, for measuring what integrity costs (benchmarks/link_bench.py); every
# host must agree. Never for training: a tampered byte between hosts then goes unnoticed.
LINK_INTEGRITY_ENV = "SMDDP_LINK_INTEGRITY"
PROTECTIONS = ("plain", "integrity", "encrypt")  # a link's protection byte on the wire is the index
PLAIN, INTEGRITY, ENCRYPT = range(3)
RECORD_BYTES = 64 << 10  # smddp_native.c's RECORD_BYTES
TAG_BYTES = 16
INTEGRITY_FAILED = -2  # smddp_native.c's error of a transfer whose record failed its check
HANDSHAKE_S = 2.0  # how long a connection to the listener may take to prove itself
MAX_PENDING = 64  # connections proving themselves at once; beyond, the oldest is dropped
_HELLO = struct.Struct("!16sIIB32s")  # dialer's nonce, its node, the node it dials, its protection, its proof
_REPLY = struct.Struct("!B32s")  # listener's protection, its proof
_SOCKET_BUFFER = 4 << 20
_SLICE_S = 0.05  # the native loop returns this often: the deadline is checked and signal handlers run
_SETTLE_S = 1.0  # after a mismatch, how long the sender threads may take to deliver this rank's header
_HEADER_WAIT_S = 0.1  # after a failed transfer, how long to wait for the headers peers may have sent
_WAIT_SLICE_S = 0.25  # the Python path's receive wakes this often to warn of a hang (SMDDP_HANG_WARN_S)


def new_token() -> str:
    return secrets.token_hex(32)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "auto"):
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise CollectiveError(f"smddp: {name}={value!r} is not understood: use 1 or 0")


def link_protection() -> str:
    """This host's protection of its links to other hosts, from the environment (every host must agree)."""
    if _flag(LINK_ENCRYPT_ENV, False):
        return "encrypt"
    return "integrity" if _flag(LINK_INTEGRITY_ENV, True) else "plain"


def _hkdf(secret: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF with SHA-256."""
    key = hmac.digest(salt or bytes(32), secret, "sha256")
    out, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(key, block + info + bytes([counter]), "sha256")
        out += block
    return out[:length]


class _Secret:
    """What the handshake proves and derives, from the mesh secret."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self.job = hashlib.sha256(b"smddp job " + self._secret).digest()[:16]
        self._auth = _hkdf(self._secret, b"", b"smddp link auth " + self.job, 32)

    def transcript(self, listener_nonce: bytes, dialer_nonce: bytes, dialer: int, listener: int, protection: int) -> bytes:
        return self.job + listener_nonce + dialer_nonce + struct.pack("!IIB", dialer, listener, protection)

    def dialer_proof(self, transcript: bytes) -> bytes:
        return hmac.digest(self._auth, b"client" + transcript, "sha256")

    def listener_proof(self, transcript: bytes, protection: int) -> bytes:
        return hmac.digest(self._auth, b"server" + transcript + bytes([protection]), "sha256")

    def link_keys(self, transcript: bytes, dialer: bool) -> bytes:
        """This end's send key and nonce base, then its receive key and nonce base (32 + 12 each)."""
        nonces = transcript[16:16 + 2 * NONCE_BYTES]
        keys = _hkdf(self._secret, nonces, b"smddp link keys " + transcript, 88)
        return keys if dialer else keys[44:] + keys[:44]


class LinkIntegrityError(CollectiveError):
    """A record from a peer failed its check: the bytes were altered, replayed, reordered or cut."""


class _Records:
    """One connection's records in the Python path (the native loop keeps the same in smddp_native.c)."""

    def __init__(self, protection: int, keys: bytes) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._invalid, self._cipher, self._gcm = InvalidTag, Cipher, modes.GCM
        self.encrypt = protection == ENCRYPT
        self._send = (algorithms.AES(keys[:32]), int.from_bytes(keys[32:44], "big"))
        self._receive = (algorithms.AES(keys[44:76]), int.from_bytes(keys[76:88], "big"))
        self.sent = self.received = 0

    def _context(self, key: object, base: int, count: int) -> object:
        return self._cipher(key, self._gcm((base ^ count).to_bytes(12, "big")))

    def seal(self, record: Sequence[memoryview]) -> list[bytes | memoryview]:
        """What goes on the wire for a record: its bytes (or their ciphertext), then the tag."""
        sealer = self._context(*self._send, self.sent).encryptor()
        self.sent += 1
        if self.encrypt:
            return [b"".join(sealer.update(part) for part in record) + sealer.finalize(), sealer.tag]
        for part in record:
            sealer.authenticate_additional_data(part)
        sealer.finalize()
        return [*record, sealer.tag]

    def open(self, record: Sequence[memoryview], tag: bytes) -> bool:
        """Check a received record against its tag (decrypting it in place); False when it fails."""
        opener = self._context(*self._receive, self.received).decryptor()
        self.received += 1
        for part in record:
            if self.encrypt:
                part[:] = opener.update(part)
            else:
                opener.authenticate_additional_data(part)
        try:
            opener.finalize_with_tag(bytes(tag))
        except self._invalid:
            return False
        return True


def _records(views: Sequence[memoryview], size: int) -> Iterator[list[memoryview]]:
    """The views' bytes as records of size bytes (the last one shorter), each a list of pieces."""
    record: list[memoryview] = []
    room = size
    for view in views:
        at = 0
        while at < len(view):
            take = min(room, len(view) - at)
            record.append(view[at:at + take])
            at, room = at + take, room - take
            if room == 0:
                yield record
                record, room = [], size
    if record:
        yield record


def recv_exact(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        part = sock.recv(count - len(data))
        if not part:
            raise ConnectionError("connection closed during the handshake")
        data += part
    return bytes(data)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)


def _listen(address: str) -> socket.socket:
    """A listener on the host's own address (the one peers dial), not on every interface; on every
    interface only where that address is not this machine's (a name that resolves elsewhere)."""
    if address:
        try:
            return socket.create_server((address, 0), backlog=socket.SOMAXCONN)
        except OSError as exc:
            warnings.warn(f"smddp: cannot listen on this host's address {address} ({exc.strerror}); listening on "
                          "every interface (peers still prove the mesh secret)", RuntimeWarning, stacklevel=3)
    return socket.create_server(("", 0), backlog=socket.SOMAXCONN)


@dataclass
class _Pending:
    """A connection to the listener that has not proven itself yet."""

    nonce: bytes
    source: str
    since: float
    received: bytearray = field(default_factory=bytearray)


class _Acceptor:
    """Takes the higher nodes' connections on the listener (in a thread, while connect dials the lower
    ones). Every connection gets HANDSHAKE_S to prove itself, all of them at once, so a silent stranger
    holds up nobody; at most MAX_PENDING wait at a time and the oldest goes first, so a flood cannot keep
    out a real peer, which proves itself within a round trip. Strangers are counted for the error that
    names them if the peers do not come."""

    def __init__(self, mesh: TcpMesh, expected: set[int], deadline: float) -> None:
        self._mesh, self._expected, self._deadline = mesh, expected, deadline
        self.accepted: dict[int, tuple[socket.socket, bytes]] = {}
        self.error: BaseException | None = None
        self.stopped = threading.Event()
        self._strangers: list[str] = []
        self._stranger_count = 0

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - handed to connect(), which raises it
            self.error = exc

    def _serve(self) -> None:
        listener = self._mesh._listener
        listener.setblocking(False)
        pending: dict[socket.socket, _Pending] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            try:
                while self._expected - set(self.accepted) and not self.stopped.is_set():
                    now = time.monotonic()
                    if now >= self._deadline:
                        raise self._timed_out()
                    for key, _ in selector.select(timeout=min(0.1, self._deadline - now)):
                        if key.fileobj is listener:
                            self._accept(selector, pending)
                        else:
                            self._read(selector, pending, key.fileobj)  # type: ignore[arg-type]
                    for sock, waiting in list(pending.items()):
                        if time.monotonic() - waiting.since > HANDSHAKE_S:
                            self._drop(selector, pending, sock, f"did not prove itself within {HANDSHAKE_S:.0f} s")
            finally:
                for sock in pending:
                    sock.close()

    def _accept(self, selector: selectors.BaseSelector, pending: dict[socket.socket, _Pending]) -> None:
        while True:
            try:
                sock, source = self._mesh._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors under a flood: make room, take the rest next time
                if pending:
                    self._drop(selector, pending, next(iter(pending)), f"dropped to make room ({exc.strerror})")
                return
            sock.setblocking(False)
            nonce = os.urandom(NONCE_BYTES)
            try:
                sock.send(nonce)  # 16 bytes into an empty buffer
            except OSError:
                sock.close()
                continue
            pending[sock] = _Pending(nonce, f"{source[0]}:{source[1]}", time.monotonic())
            selector.register(sock, selectors.EVENT_READ)
            if len(pending) > MAX_PENDING:
                self._drop(selector, pending, next(iter(pending)), f"pushed out: more than {MAX_PENDING} connections were proving themselves at once")

    def _read(self, selector: selectors.BaseSelector, pending: dict[socket.socket, _Pending], sock: socket.socket) -> None:
        waiting = pending[sock]
        try:
            part = sock.recv(_HELLO.size - len(waiting.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._drop(selector, pending, sock, f"broke ({exc.strerror})")
        if not part:
            return self._drop(selector, pending, sock, "closed before it proved itself")
        waiting.received += part
        if len(waiting.received) < _HELLO.size:
            return None
        mesh = self._mesh
        nonce, dialer, listener, protection, proof = _HELLO.unpack(waiting.received)
        transcript = mesh._secret.transcript(waiting.nonce, nonce, dialer, listener, protection)
        if listener != mesh.node or dialer not in self._expected or not hmac.compare_digest(proof, mesh._secret.dialer_proof(transcript)):
            return self._drop(selector, pending, sock, "failed the handshake")
        try:
            sock.send(_REPLY.pack(mesh.protection, mesh._secret.listener_proof(transcript, mesh.protection)))
        except OSError as exc:
            return self._drop(selector, pending, sock, f"broke ({exc.strerror})")
        selector.unregister(sock)
        del pending[sock]
        if protection != mesh.protection:
            sock.close()
            raise mesh.protection_mismatch(dialer, protection)
        if dialer in self.accepted:  # the peer dialed again (its first answer was lost): the newest proof wins
            self.accepted[dialer][0].close()
        self.accepted[dialer] = (sock, mesh._secret.link_keys(transcript, dialer=False))
        return None

    def _drop(self, selector: selectors.BaseSelector, pending: dict[socket.socket, _Pending], sock: socket.socket, why: str) -> None:
        self._stranger_count += 1
        if len(self._strangers) < 3:
            self._strangers.append(f"{pending[sock].source}: {why}")
        selector.unregister(sock)
        del pending[sock]
        sock.close()

    def _timed_out(self) -> CollectiveError:
        mesh = self._mesh
        missing = [mesh._describe[n] for n in sorted(self._expected - set(self.accepted))]
        message = f"smddp: {', '.join(map(str, missing))} did not connect within the process-group timeout"
        if self._stranger_count:
            message += (f"; meanwhile {self._stranger_count} connection(s) to this host's mesh listener (port {mesh.port}) did not "
                        f"prove the job's secret ({'; '.join(self._strangers)}): something else is connecting to it")
        return CollectiveError(message, awaited=missing)


class TcpMesh:
    """Full mesh between node leaders; node i dials every j < i and accepts every j > i."""

    def __init__(self, node: int, token: str, describe: Mapping[int, PeerRank], address: str = "",
                 native_progress: bool = True, protection: str | None = None, reads_alerts: bool = True) -> None:
        self.node = node
        # whether a send that broke reads its connection for the peer's alert (_alerted); not where another
        # thread reads every connection's other direction (point-to-point's verdict readers): it would race
        self._reads_alerts = reads_alerts
        self._secret = _Secret(token)
        self._describe = dict(describe)  # node index -> its leader: "rank R (host H)" in messages, data in errors
        self.hangs = HangWatch()  # the group's, once the rendezvous knows every rank (topology.build)
        self.protection = PROTECTIONS.index(protection or link_protection())
        self._native = native.library() if native_progress else None  # None: Python threads move the bytes
        self._check_protection_available()
        self._listener = _listen(address)
        self.port = self._listener.getsockname()[1]
        self._socks: dict[int, socket.socket] = {}
        self._records: dict[int, _Records] = {}  # the Python path's protected links by peer
        self._connected = False
        self._pool: ThreadPoolExecutor | None = None  # the Python path's sender threads
        # the header of the call now running, shared with the native core; [7] counts its exchanges
        self.header = call_file.call_words(HEADER_AT, HEADER_WORDS)  # where `smddp-launch stacks` reads the current call
        self.header[0] = 0 if os.environ.get(CHECK_CALLS_ENV) == "0" else HEADER_MAGIC
        self._header_bytes = HEADER_BYTES if self.header[0] else 0

    def _check_protection_available(self) -> None:
        """A protected link needs its cipher where the bytes move: never fall back to clear text."""
        if self.protection == PLAIN:
            return
        wanted = f"the links between hosts are to be protected ({PROTECTIONS[self.protection]})"
        if self._native is not None:
            why = native.crypto_unavailable()
            if why:
                raise CollectiveError(f"smddp: {wanted} but the native kernels cannot: {why}; or set SMDDP_NATIVE=0 to move "
                                      "the bytes in Python with the cryptography package")
            return
        try:
            import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
        except ImportError as exc:
            raise CollectiveError(f"smddp: {wanted} but the Python path needs the cryptography package, which is missing "
                                  f"({exc}): pip install cryptography (or install smddp-sdk[torch])") from exc

    def protection_mismatch(self, peer: int, theirs: int) -> CollectiveError:
        return CollectiveError(
            f"smddp: {self._describe[peer]} protects the links between hosts with {PROTECTIONS[theirs]} frames but "
            f"{self._describe[self.node]} with {PROTECTIONS[self.protection]}: every host must agree (the job's "
            f"encrypt_inter_container_traffic sets {LINK_ENCRYPT_ENV}; set {LINK_INTEGRITY_ENV} alike everywhere or nowhere)")

    def begin(self, call: Call) -> None:
        """Number the collective about to run (as the native core's tag does) and reset its step."""
        seq = (self.header[1] + 1) & 0xFFFFFFFF
        self.header[1:7] = call.words(seq)
        self.header[7] = 0

    def _next_header(self) -> bytes:
        """This exchange's header; every exchange of a call, with transfers or not, counts a step."""
        mine = bytes(self.header)
        self.header[7] = (self.header[7] + 1) & 0xFFFFFFFF
        return mine

    def skip(self, steps: int) -> None:
        """Count exchanges of the call that this host sits out (one folded into a partner), so that its
        later headers agree with the others'."""
        self.header[7] = (self.header[7] + steps) & 0xFFFFFFFF

    def mismatch(self, what: str, peer: int, theirs: bytes, mine: bytes) -> CollectiveError:
        """The error for a peer whose header differs from ours: both calls, both ranks."""
        words, own = struct.unpack("=8I", theirs), struct.unpack("=8I", mine)
        me, other = self._describe[self.node], self._describe[peer]
        if words[0] == ALERT_MAGIC:
            return self._alerted_error(what, peer)
        if words[0] != HEADER_MAGIC:
            return CollectiveError(
                f"smddp {what}: {other} sent bytes where a call header belongs: the hosts' collectives are out of "
                f"step (this rank is in {describe(own[1:7])}; do the hosts run the same code and the same "
                "SMDDP_ALLREDUCE_ALGO and SMDDP_PIPELINE_CHUNK_BYTES?)")
        if words[1:7] != own[1:7]:
            return CollectiveError(
                f"smddp {what}: collective mismatch between hosts: {me} called {describe(own[1:7])} but {other} "
                f"called {describe(words[1:7])} (every rank must call the same collectives in the same order, "
                "with the same dtype, size, reduce op and root)")
        return CollectiveError(
            f"smddp {what}: {me} and {other} split {describe(own[1:7])} differently between hosts (step {own[7]} "
            f"against {words[7]}): set SMDDP_ALLREDUCE_ALGO and SMDDP_PIPELINE_CHUNK_BYTES alike on every host")

    def connect(self, addresses: Mapping[int, tuple[str, int]], deadline: float) -> None:
        """Dial lower nodes while accepting higher ones, each end proving the secret over the connection."""
        acceptor = _Acceptor(self, {n for n in addresses if n > self.node}, deadline)
        accepting = threading.Thread(target=acceptor.run, name="smddp-accept", daemon=True)
        accepting.start()
        dialed: dict[int, tuple[socket.socket, bytes]] = {}
        try:
            for peer in sorted(n for n in addresses if n < self.node):
                dialed[peer] = self._dial(peer, addresses[peer], deadline)
        except BaseException:
            acceptor.stopped.set()
            for sock, _ in dialed.values():
                sock.close()
            raise
        finally:
            accepting.join()
            self._listener.close()
        if acceptor.error is not None:
            for sock, _ in [*dialed.values(), *acceptor.accepted.values()]:
                sock.close()
            raise acceptor.error
        for peer, (sock, keys) in sorted({**dialed, **acceptor.accepted}.items()):
            self._add(peer, sock, keys)
        self._connected = bool(self._socks)
        if self._socks and self._native is None:
            self._pool = ThreadPoolExecutor(max_workers=len(self._socks), thread_name_prefix="smddp-send")

    def _add(self, peer: int, sock: socket.socket, keys: bytes) -> None:
        """A proven connection joins the mesh with its keys: in the native loop's links, or the Python path's."""
        _tune(sock)
        sock.settimeout(None)
        self._socks[peer] = sock
        if self._native is not None:
            if self._native.smddp_link_open(sock.fileno(), self.protection, self._header_bytes, keys):
                raise CollectiveError(f"smddp: the native kernels cannot protect the link to {self._describe[peer]}: "
                                      f"{native.crypto_unavailable() or 'out of memory or link slots'}")
        elif self.protection != PLAIN:
            self._records[peer] = _Records(self.protection, keys)

    def _dial(self, peer: int, address: tuple[str, int], deadline: float) -> tuple[socket.socket, bytes]:
        """Connect to peer and prove the secret both ways; a dropped attempt (the peer not listening yet,
        its listener flooded) is tried again until the deadline. Returns the socket and its keys."""
        why = "no attempt"
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
            except OSError as exc:
                why = str(exc)
                time.sleep(0.05)
                continue
            nonce = os.urandom(NONCE_BYTES)
            try:
                transcript = self._secret.transcript(recv_exact(sock, NONCE_BYTES), nonce, self.node, peer, self.protection)
                sock.sendall(_HELLO.pack(nonce, self.node, peer, self.protection, self._secret.dialer_proof(transcript)))
                theirs, proof = _REPLY.unpack(recv_exact(sock, _REPLY.size))
            except OSError as exc:  # ConnectionError and timeouts included
                sock.close()
                why = f"it closed the handshake ({exc}): does it hold this job's mesh secret? is its listener flooded?"
                time.sleep(0.05)
                continue
            if not hmac.compare_digest(proof, self._secret.listener_proof(transcript, theirs)):
                sock.close()
                raise CollectiveError(f"smddp: {self._describe[peer]} at {address} failed authentication: what answers there "
                                      "does not hold this job's mesh secret")
            if theirs != self.protection:
                sock.close()
                raise self.protection_mismatch(peer, theirs)
            return sock, self._secret.link_keys(transcript, dialer=True)
        raise CollectiveError(f"smddp: cannot connect to {self._describe[peer]} at {address}: {why}", lost=[self._describe[peer]])

    def exchange(
        self,
        sends: Mapping[int, Sequence[memoryview]],
        recvs: Mapping[int, Sequence[memoryview]],
        what: str,
        deadline: float,
    ) -> None:
        """Send each peer its buffers while receiving each peer's into the given views, each behind the
        call header (only to and from peers with bytes to move)."""
        if not self._connected:
            raise CollectiveError(f"smddp {what} failed: the connections to the other hosts are closed")
        mine = self._next_header() if self.header[0] else b""  # magic 0: unchecked (CHECK_CALLS_ENV)
        sends = {peer: [memoryview(bytearray(mine)), *views] for peer, views in sends.items() if any(len(v) for v in views)}
        recvs = {peer: views for peer, views in recvs.items() if any(len(v) for v in views)}
        headers = {peer: bytearray(len(mine)) for peer in recvs}
        try:
            if self._native is not None:
                self._exchange_native(sends, recvs, headers, mine, what, deadline)
            else:
                self._exchange_threads(sends, recvs, headers, mine, what, deadline)
        except BaseException:
            self.close()  # peers blocked on us see the connection drop instead of waiting for the timeout
            raise

    def _check_headers(self, headers: Mapping[int, bytearray], arrived: Sequence[int], mine: bytes, what: str) -> None:
        """Raise the mismatch error for the first peer in arrived whose header differs from ours."""
        for peer in arrived:
            if headers[peer] != mine:
                raise self.mismatch(what, peer, bytes(headers[peer]), mine)

    def _exchange_native(self, sends: Mapping[int, Sequence[memoryview]], recvs: Mapping[int, Sequence[memoryview]],
                         headers: Mapping[int, bytearray], mine: bytes, what: str, deadline: float) -> None:
        recvs = {peer: [memoryview(headers[peer]), *views] for peer, views in recvs.items()}
        moves = [(peer, receive, view if not view.readonly else memoryview(bytearray(view)))
                 for receive, table in ((0, sends), (1, recvs)) for peer, views in table.items() for view in views if len(view)]
        transfers = (native.Transfer * len(moves))()
        for transfer, (peer, receive, view) in zip(transfers, moves):
            transfer.fd, transfer.receive, transfer.length = self._socks[peer].fileno(), receive, len(view)
            transfer.data = ctypes.addressof(ctypes.c_char.from_buffer(view))
        header_at = {peer: next(i for i, (p, receive, _) in enumerate(moves) if p == peer and receive) for peer in recvs}
        started = time.monotonic()
        while True:
            slice_ns = int(max(0.0, min(_SLICE_S, deadline - time.monotonic())) * 1e9)
            status = self._native.smddp_exchange(transfers, len(moves), slice_ns)
            if status >= 0:  # a peer that left may have said why first (a header, such as its farewell)
                for i in header_at.values():
                    self._native.smddp_exchange(ctypes.byref(transfers[i]), 1, int(_HEADER_WAIT_S * 1e9))
            self._check_headers(headers, [peer for peer, i in header_at.items() if transfers[i].done == HEADER_BYTES], mine, what)
            if status == -1:
                return
            if status >= 0:
                raise self.failure(what, moves[status][0], transfers[status].error)
            unfinished = [(peer, receive) for (peer, receive, _), t in zip(moves, transfers) if t.done < t.length]
            late = next((move for move in unfinished if move[1]), unfinished[0])  # a missing receive names the late peer best
            self.stalled(what, *late, deadline, time.monotonic() - started)

    def stalled(self, what: str, peer: int, receiving: bool, deadline: float, waited_s: float) -> None:
        """A native exchange still waits on peer after a slice: warn once it has waited SMDDP_HANG_WARN_S,
        fail once the deadline has passed."""
        if time.monotonic() >= deadline:
            raise self._timed_out(what, peer, receiving)
        on = "for" if receiving else "to send to"
        self.hangs.waiting(self.header[1:7], waited_s, what,
                           lambda: f"smddp: {this_rank()} has waited {waited_s:.0f} s in {what} {on} {self._describe[peer]}, which has not arrived")

    def failure(self, what: str, peer: int, error: int) -> CollectiveError:
        """The error of a native transfer with peer that failed (error: an errno, -1 when the peer closed,
        INTEGRITY_FAILED when a record failed its check)."""
        if error == INTEGRITY_FAILED:
            return self._integrity(what, peer)
        return self._lost(what, peer, None if error == -1 else OSError(error, os.strerror(error)))

    def _integrity(self, what: str, peer: int) -> LinkIntegrityError:
        """A record from peer failed its check: tell the peer (an alert header), then fail."""
        self._alert(peer)
        return LinkIntegrityError(
            f"smddp {what}: data from {self._describe[peer]} failed its integrity check at {self._describe[self.node]}: a "
            "frame was altered, replayed, reordered or cut between the hosts (the link is tampered with, or the network "
            "corrupts data); nothing of it was used")

    def _timed_out(self, what: str, peer: int, receiving: bool) -> CollectiveError:
        if receiving:
            return CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]} within the process-group timeout (hung peer or different code path)",
                                   awaited=[self._describe[peer]])
        return CollectiveError(f"smddp {what} timed out sending to {self._describe[peer]} within the process-group timeout (the peer does not read: hung)", awaited=[self._describe[peer]])

    def _alerted_error(self, what: str, peer: int) -> LinkIntegrityError:
        return LinkIntegrityError(
            f"smddp {what}: data from {self._describe[self.node]} failed its integrity check at {self._describe[peer]}: "
            "something between the hosts altered, replayed or cut the link's frames (the link is tampered with, or the "
            "network corrupts data)")

    def _alerted(self, peer: int) -> bool:
        """Whether peer, whose connection broke while this end sent, said first that our data failed its
        check: an alert header, read for _HEADER_WAIT_S (our receiving side is between messages)."""
        if not self.header[0] or peer not in self._socks:
            return False
        header = memoryview(bytearray(HEADER_BYTES))
        sock, records = self._socks[peer], self._records.get(peer)
        try:
            if self._native is not None:
                transfer = native.Transfer(sock.fileno(), 1, ctypes.addressof(ctypes.c_char.from_buffer(header)), HEADER_BYTES, 0, 0)
                if self._native.smddp_exchange(ctypes.byref(transfer), 1, int(_HEADER_WAIT_S * 1e9)) != -1:
                    return False
            else:  # straight from the socket: its errors must not come back here
                sock.settimeout(_HEADER_WAIT_S)
                wire = recv_exact(sock, HEADER_BYTES + (TAG_BYTES if records else 0))
                header[:] = wire[:HEADER_BYTES]
                if records is not None and not records.open([header], wire[HEADER_BYTES:]):
                    return False
        except OSError:
            return False
        return struct.unpack_from("=I", header)[0] == ALERT_MAGIC

    def _lost(self, what: str, peer: int, error: OSError | None) -> CollectiveError:
        """The connection to peer closed by the peer (error None) or broken (then the peer may have
        alerted us first)."""
        if error is not None and self._reads_alerts and self._alerted(peer):
            return self._alerted_error(what, peer)
        if error is None:
            return CollectiveError(f"smddp {what} failed: {self._describe[peer]} closed the connection (the peer exited or failed)", lost=[self._describe[peer]])
        return CollectiveError(f"smddp {what} failed: connection to {self._describe[peer]} broke ({error})", lost=[self._describe[peer]])

    def fds(self) -> list[int]:
        """The connections' file descriptors by node (-1 for this node), for the native core."""
        return [self._socks[n].fileno() if n in self._socks else -1 for n in range(len(self._describe))]

    def _exchange_threads(self, sends: Mapping[int, Sequence[memoryview]], recvs: Mapping[int, Sequence[memoryview]],
                          headers: Mapping[int, bytearray], mine: bytes, what: str, deadline: float) -> None:
        assert self._pool is not None  # made in connect() for the Python path
        sent = [self._pool.submit(self._send_all, peer, views, what, deadline) for peer, views in sends.items()]
        for peer, views in recvs.items():
            if headers[peer]:
                self._recv_records(peer, [memoryview(headers[peer])], what, deadline)
            try:
                self._check_headers(headers, [peer], mine, what)
            except CollectiveError:
                wait(sent, timeout=_SETTLE_S)  # our header reaches the peers first, so they name the mismatch too
                raise
            self._recv_records(peer, views, what, deadline)
        for future in sent:
            future.result()

    def _wire(self, peer: int, views: Sequence[memoryview]) -> Iterator[bytes | memoryview]:
        """A message's bytes as they go on the wire: plain, or records (the call header one of its own)."""
        records = self._records.get(peer)
        if records is None:
            yield from views
            return
        first = 1 if self._header_bytes else 0
        for record in [*([views[:1]] if first else []), *_records(views[first:], RECORD_BYTES)]:
            yield from records.seal(record)

    def _recv_records(self, peer: int, views: Sequence[memoryview], what: str, deadline: float) -> None:
        """Receive into views, record by record where the link is protected, each checked before the next."""
        records = self._records.get(peer)
        if records is None:
            return self._recv_all(peer, views, what, deadline)
        for record in _records(views, RECORD_BYTES):
            tag = bytearray(TAG_BYTES)
            self._recv_all(peer, [*record, memoryview(tag)], what, deadline)
            if not records.open(record, tag):
                raise self._integrity(what, peer)
        return None

    def _send_all(self, peer: int, views: Sequence[memoryview], what: str, deadline: float) -> None:
        sock = self._socks[peer]
        try:
            for view in self._wire(peer, views):
                sock.settimeout(self._remaining(peer, what, deadline))
                sock.sendall(view)
        except socket.timeout as exc:
            raise self._timed_out(what, peer, receiving=False) from exc
        except OSError as exc:
            raise self._lost(what, peer, exc) from exc

    def _recv_all(self, peer: int, views: Sequence[memoryview], what: str, deadline: float) -> None:
        sock = self._socks[peer]
        started = time.monotonic()
        try:
            for view in views:
                got = 0
                while got < len(view):
                    sock.settimeout(min(self._remaining(peer, what, deadline), _WAIT_SLICE_S))
                    try:
                        count = sock.recv_into(view[got:])
                    except socket.timeout:  # a slice without data: warn as the native loop does, or time out
                        self.stalled(what, peer, True, deadline, time.monotonic() - started)
                        continue
                    if count == 0:
                        raise self._lost(what, peer, None)
                    got += count
        except socket.timeout as exc:
            raise self._timed_out(what, peer, receiving=True) from exc
        except OSError as exc:
            raise self._lost(what, peer, exc) from exc

    def _remaining(self, peer: int, what: str, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]} within the process-group timeout (hung peer or different code path)",
                                  awaited=[self._describe[peer]])
        return left

    def _alert(self, peer: int) -> None:
        """Tell peer that its data failed this end's integrity check (a header it names in its error)."""
        if self._connected and self.header[0] and peer in self._socks:
            self._say(peer, struct.pack("=8I", ALERT_MAGIC, *(0,) * (HEADER_WORDS - 1)))

    def _say(self, peer: int, header: bytes) -> None:
        """Send peer a message of a header alone, without waiting (a farewell or an alert): whatever the
        socket takes now; the peer is gone, or will see a cut record, if it takes less."""
        view = memoryview(bytearray(header))
        try:
            if self._native is not None:
                transfer = native.Transfer(self._socks[peer].fileno(), 0, ctypes.addressof(ctypes.c_char.from_buffer(view)), len(view), 0, 0)
                self._native.smddp_exchange(ctypes.byref(transfer), 1, 0)
            else:
                self._socks[peer].send(b"".join(self._wire(peer, [view])), socket.MSG_DONTWAIT)
        except OSError:
            pass  # the peer is gone already: nothing to tell

    def close(self, farewell: bool = False) -> None:
        """Close the connections; with farewell, first tell each peer that this rank left the group (a
        header for destroy_process_group), so a peer that still calls a collective names this end."""
        if farewell and self._connected and self.header[0]:
            self.begin(Call("destroy_process_group"))
            goodbye = self._next_header()
            for peer in self._socks:
                self._say(peer, goodbye)
        self._connected = False
        for sock in self._socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            if self._native is not None:
                self._native.smddp_link_close(sock.fileno())
            sock.close()
        self._socks.clear()
        call_file.release(self.header)
        if self._pool:
            self._pool.shutdown(wait=False)
            self._pool = None
        try:
            self._listener.close()
        except OSError:
            pass
