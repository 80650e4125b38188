"""TCP transport between hosts: one connection per pair of node leaders, authenticated with a job token.

The token is a random secret that rank 0 puts in the group's store; a peer proves it holds the token by
answering a fresh nonce with an HMAC (both directions), so a stray or hostile connection to the listening
port is closed without ever touching the data path.

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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from smddp_sdk.collectives import native
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.hangs import hang_warn_s, this_rank, warn_hang

NONCE_BYTES = 16
_HELLO = struct.Struct("!16sI")  # client nonce, client node index
_SOCKET_BUFFER = 4 << 20
_SLICE_S = 0.05  # the native loop returns this often: the deadline is checked and signal handlers run


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


class TcpMesh:
    """Full mesh between node leaders; node i dials every j < i and accepts every j > i."""

    def __init__(self, node: int, token: str, describe: Mapping[int, str], native_progress: bool = True) -> None:
        self.node = node
        self._token = token
        self._describe = dict(describe)  # node index -> "rank R (host H)" for error messages
        self._hang_warn_s, self._hang_warned = hang_warn_s(), False
        self._listener = socket.create_server(("", 0), backlog=64)
        self.port = self._listener.getsockname()[1]
        self._socks: dict[int, socket.socket] = {}
        self._connected = False
        self._native = native.library() if native_progress else None  # None: Python threads move the bytes
        self._pool: ThreadPoolExecutor | None = None  # the Python path's sender threads

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
        raise CollectiveError(f"smddp: cannot connect to {self._describe[peer]} at {address}: {last_error}")

    def _accept_one(self, expected: set[int], deadline: float) -> None:
        self._listener.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock, _ = self._listener.accept()
        except socket.timeout as exc:
            missing = ", ".join(self._describe[n] for n in sorted(expected - set(self._socks)))
            raise CollectiveError(f"smddp: {missing} did not connect within the process-group timeout") from exc
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
        """Send each peer its buffers while receiving each peer's into the given views."""
        if not self._connected:
            raise CollectiveError(f"smddp {what} failed: the connections to the other hosts are closed")
        try:
            if self._native is not None:
                self._exchange_native(sends, recvs, what, deadline)
            else:
                self._exchange_threads(sends, recvs, what, deadline)
        except BaseException:
            self.close()  # peers blocked on us see the connection drop instead of waiting for the timeout
            raise

    def _exchange_native(self, sends: Mapping[int, Sequence[memoryview]], recvs: Mapping[int, Sequence[memoryview]],
                         what: str, deadline: float) -> None:
        moves = [(peer, receive, view if not view.readonly else memoryview(bytearray(view)))
                 for receive, table in ((0, sends), (1, recvs)) for peer, views in table.items() for view in views if len(view)]
        transfers = (native.Transfer * len(moves))()
        for transfer, (peer, receive, view) in zip(transfers, moves):
            transfer.fd, transfer.receive, transfer.length = self._socks[peer].fileno(), receive, len(view)
            transfer.data = ctypes.addressof(ctypes.c_char.from_buffer(view))
        started = time.monotonic()
        while True:
            slice_ns = int(max(0.0, min(_SLICE_S, deadline - time.monotonic())) * 1e9)
            status = self._native.smddp_exchange(transfers, len(moves), slice_ns)
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
            return CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]} (hung peer or different code path)")
        return CollectiveError(f"smddp {what} timed out sending to {self._describe[peer]}")

    def _lost(self, what: str, peer: int, error: OSError | None) -> CollectiveError:
        """The connection to peer closed by the peer (error None) or broken."""
        if error is None:
            return CollectiveError(f"smddp {what} failed: {self._describe[peer]} closed the connection (the peer exited or failed)")
        return CollectiveError(f"smddp {what} failed: connection to {self._describe[peer]} broke ({error})")

    def fds(self) -> list[int]:
        """The connections' file descriptors by node (-1 for this node), for the native core."""
        return [self._socks[n].fileno() if n in self._socks else -1 for n in range(len(self._describe))]

    def _exchange_threads(self, sends: Mapping[int, Sequence[memoryview]], recvs: Mapping[int, Sequence[memoryview]],
                          what: str, deadline: float) -> None:
        assert self._pool is not None  # made in connect() for the Python path
        sent = [self._pool.submit(self._send_all, peer, views, what, deadline) for peer, views in sends.items()]
        for peer, views in recvs.items():
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
        try:
            for view in views:
                got = 0
                while got < len(view):
                    sock.settimeout(self._remaining(peer, what, deadline))
                    count = sock.recv_into(view[got:])
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
            raise CollectiveError(f"smddp {what} timed out waiting for {self._describe[peer]}")
        return left

    def close(self) -> None:
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
