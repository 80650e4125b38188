"""TCP transport between hosts: one connection per pair of node leaders, authenticated with a secret.

The secret is the one the runtime hands every rank (topology.py's _mesh_secret); a peer proves it holds it
by answering a fresh nonce with an HMAC (both directions), so a stray or hostile connection to the
listening port (bound to the host's own address) is closed without ever touching the data path.

Every exchange carries a call header ahead of each peer's bytes: the collective's call record (calls.py:
sequence number, op, reduce op, dtype, element count, root) and the exchange's step within the call. A
receiver compares the header it gets with its own before it uses the data, so hosts that run different
collectives fail at once naming both calls, instead of reducing garbage. The native core (smddp_core.cpp)
writes the same header, byte for byte.

An exchange moves its bytes in the native progress loop (smddp_native.c: one thread polls every socket,
without the GIL) where the native kernels are loaded; otherwise sender threads and a receive loop in
Python do it. Both fail with the same errors.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import secrets
import socket
import struct
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from smddp_sdk.collectives import native
from smddp_sdk.collectives.calls import Call, describe
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.hangs import hang_warn_s, this_rank, warn_hang

NONCE_BYTES = 16
HEADER_MAGIC = 0x48444D53  # b"SMDH" on the wire
HEADER_WORDS = 8  # magic, the six words of the call record, the exchange's step within the call
HEADER_BYTES = HEADER_WORDS * 4
# "0" turns the call header off on this rank (magic 0: no header is sent or expected), for measuring what
# the check costs (benchmarks/call_check_cost.py); every rank of the job must agree. Never for training:
# collectives that differ between hosts then return garbage.
CHECK_CALLS_ENV = "SMDDP_CHECK_CALLS"
_HELLO = struct.Struct("!16sI")  # client nonce, client node index
_SOCKET_BUFFER = 4 << 20
_SLICE_S = 0.05  # the native loop returns this often: the deadline is checked and signal handlers run
_SETTLE_S = 1.0  # after a mismatch, how long the sender threads may take to deliver this rank's header
_HEADER_WAIT_S = 0.1  # after a failed transfer, how long to wait for the headers peers may have sent
_WAIT_SLICE_S = 0.25  # the Python path's receive wakes this often to warn of a hang (SMDDP_HANG_WARN_S)


def new_token() -> str:
    return secrets.token_hex(32)


def _proof(token: str, nonce: bytes, node: int) -> bytes:
    return hmac.new(token.encode(), nonce + struct.pack("!I", node), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, count: int) -> bytes:
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
            return socket.create_server((address, 0), backlog=64)
        except OSError as exc:
            warnings.warn(f"smddp: cannot listen on this host's address {address} ({exc.strerror}); listening on "
                          "every interface (peers still prove the mesh secret)", RuntimeWarning, stacklevel=3)
    return socket.create_server(("", 0), backlog=64)


class TcpMesh:
    """Full mesh between node leaders; node i dials every j < i and accepts every j > i."""

    def __init__(self, node: int, token: str, describe: Mapping[int, PeerRank], address: str = "",
                 native_progress: bool = True) -> None:
        self.node = node
        self._token = token
        self._describe = dict(describe)  # node index -> its leader: "rank R (host H)" in messages, data in errors
        self._hang_warn_s, self._hang_warned = hang_warn_s(), False
        self._listener = _listen(address)
        self.port = self._listener.getsockname()[1]
        self._socks: dict[int, socket.socket] = {}
        self._connected = False
        self._native = native.library() if native_progress else None  # None: Python threads move the bytes
        self._pool: ThreadPoolExecutor | None = None  # the Python path's sender threads
        # the header of the call now running, shared with the native core; [7] counts its exchanges
        self.header = (ctypes.c_uint32 * HEADER_WORDS)(0 if os.environ.get(CHECK_CALLS_ENV) == "0" else HEADER_MAGIC)

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
        """Dial lower nodes and accept higher ones, verifying every peer's proof of the token."""
        for peer in sorted(n for n in addresses if n < self.node):
            self._socks[peer] = self._dial(peer, addresses[peer], deadline)
        expected = {n for n in addresses if n > self.node}
        while expected - set(self._socks):
            self._accept_one(expected, deadline)
        self._listener.close()
        self._connected = bool(self._socks)
        if self._socks and self._native is None:
            self._pool = ThreadPoolExecutor(max_workers=len(self._socks), thread_name_prefix="smddp-send")

    def _dial(self, peer: int, address: tuple[str, int], deadline: float) -> socket.socket:
        last_error: OSError | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            except OSError as exc:
                last_error = exc
                time.sleep(0.05)
                continue
            nonce = os.urandom(NONCE_BYTES)
            sock.sendall(_HELLO.pack(nonce, self.node) + _proof(self._token, _recv_exact(sock, NONCE_BYTES), self.node))
            if not hmac.compare_digest(_recv_exact(sock, 32), _proof(self._token, nonce, peer)):
                sock.close()
                raise CollectiveError(f"smddp: {self._describe[peer]} at {address} failed authentication")
            _tune(sock)
            sock.settimeout(None)
            return sock
        raise CollectiveError(f"smddp: cannot connect to {self._describe[peer]} at {address}: {last_error}", lost=[self._describe[peer]])

    def _accept_one(self, expected: set[int], deadline: float) -> None:
        self._listener.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock, _ = self._listener.accept()
        except socket.timeout as exc:
            missing = [self._describe[n] for n in sorted(expected - set(self._socks))]
            raise CollectiveError(f"smddp: {', '.join(map(str, missing))} did not connect within the process-group timeout", awaited=missing) from exc
        try:
            sock.settimeout(5.0)
            nonce = os.urandom(NONCE_BYTES)
            sock.sendall(nonce)
            their_nonce, peer = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
            proof = _recv_exact(sock, 32)
            if peer not in expected or peer in self._socks or not hmac.compare_digest(proof, _proof(self._token, nonce, peer)):
                sock.close()  # not one of ours: drop it and keep waiting for the real peers
                return
            sock.sendall(_proof(self._token, their_nonce, self.node))
        except (OSError, struct.error):
            sock.close()
            return
        _tune(sock)
        sock.settimeout(None)
        self._socks[peer] = sock

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
        if waited_s < self._hang_warn_s:
            self._hang_warned = False  # a new call
        elif not self._hang_warned:
            self._hang_warned = True
            on = "for" if receiving else "to send to"
            warn_hang(f"smddp: {this_rank()} has waited {waited_s:.0f} s in {what} {on} {self._describe[peer]}, which has not arrived")

    def failure(self, what: str, peer: int, error: int) -> CollectiveError:
        """The error of a native transfer with peer that failed (error: an errno, or -1 when the peer closed)."""
        return self._lost(what, peer, None if error == -1 else OSError(error, os.strerror(error)))

    def _timed_out(self, what: str, peer: int, receiving: bool) -> CollectiveError:
        if receiving:
            return CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]} (hung peer or different code path)", awaited=[self._describe[peer]])
        return CollectiveError(f"smddp {what} timed out sending to {self._describe[peer]}", awaited=[self._describe[peer]])

    def _lost(self, what: str, peer: int, error: OSError | None) -> CollectiveError:
        """The connection to peer closed by the peer (error None) or broken."""
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
            self._recv_all(peer, [memoryview(headers[peer])], what, deadline)
            try:
                self._check_headers(headers, [peer], mine, what)
            except CollectiveError:
                wait(sent, timeout=_SETTLE_S)  # our header reaches the peers first, so they name the mismatch too
                raise
            self._recv_all(peer, views, what, deadline)
        for future in sent:
            future.result()

    def _send_all(self, peer: int, views: Sequence[memoryview], what: str, deadline: float) -> None:
        sock = self._socks[peer]
        try:
            for view in views:
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
            raise CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]}", awaited=[self._describe[peer]])
        return left

    def close(self, farewell: bool = False) -> None:
        """Close the connections; with farewell, first tell each peer that this rank left the group (a
        header for destroy_process_group), so a peer that still calls a collective names this end."""
        if farewell and self._connected and self.header[0]:
            self.begin(Call("destroy_process_group"))
            goodbye = self._next_header()
            for sock in self._socks.values():
                try:
                    sock.send(goodbye, socket.MSG_DONTWAIT)
                except OSError:
                    pass  # the peer is gone already: nothing to tell
        self._connected = False
        for sock in self._socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._socks.clear()
        if self._pool:
            self._pool.shutdown(wait=False)
            self._pool = None
        try:
            self._listener.close()
        except OSError:
            pass
