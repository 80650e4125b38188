"""Point-to-point for the smddp group: send, recv (from a rank or any source), isend, irecv, with tags.

Links. One connection per ordered pair of ranks, dialed by the sender on its first message to that
receiver: its forward direction carries the sender's messages, its reverse direction the receiver's
verdicts (acknowledgements, errors). Ranks that share a host's arena talk over a Unix socket (an abstract
name derived from the job's secret; each end checks the other's credentials against the pid of the
verified rendezvous greeting). The sender also creates a shared-memory ring for the pair (ring.py; the
arena's rules for the file) and offers it when it dials; once the receiver has opened it, the link's
messages go through the ring (polled, then a futex: no system call while both ends run) and the socket
carries only the receiver's verdicts and tells either end when the other is gone. Messages from
SINGLE_COPY_FROM bytes are read by the receiver straight from the sender's memory (process_vm_readv, one
copy, as Open MPI's shared-memory transport does; only their envelope goes through the ring) unless the
kernel refuses. Every other pair talks TCP through tcp.py's TcpMesh: the same handshake (each end
proves a secret of this rendezvous) and the same link protection (integrity or encryption records) as the
collectives' links, never bypassed. A rank opens its listeners on its first point-to-point call.

Messages. An envelope (32 bytes, a message of its own on the link: kind, sequence, tag, dtype, element
count, single-copy address) then, unless read from the sender's memory, the payload as a second message.
Each receiving link has a reader thread that drains it: a message meets the first posted receive
that matches it (source or any source, and tag), else it waits in an unexpected queue for one, so order
per (source, destination, tag) is kept and outstanding sends and receives never deadlock. A receive from
one rank over a ring is waited for by polling that ring on the caller's own thread (the reader steps
aside meanwhile, and stays parked afterwards: asleep without counting as a sleeper, so that the sender's
next messages wake nobody), so a small message costs no hand-off between threads. With the native core a
send or receive of one contiguous CPU tensor over a ring (isend and irecv too) skips this module's
calls: the core writes the whole message into the ring, or polls the ring briefly without the GIL and
takes the message, when fast_send or fast_recv here says that is what the Python path would do (the
message fits the ring now, no other send is writing; no receive posted earlier may match, nothing from
that rank waits unmatched); anything else (no message within the short polling budget, another tag, a
mismatch) is left in the ring for the Python path. A send's Work completes once its bytes are written, as MPI's eager sends do (one read
from the sender's memory: once the receiver acknowledges it; whether the kernel allows such reads is
probed when the link is made). A message whose dtype or size differs from the receive it meets fails the
receive, and the receiver tells the sender over the link's reverse direction: both groups fail, as on a
collective mismatch, with one error naming both calls (the sender's pending and next calls raise it). A
peer lost while a receive (or a single-copy send) waits for it fails that call with ``lost``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import os
import select
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from smddp_sdk.collectives import native
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.memory import allow_peer_reads, as_bytes, memview, read_process
from smddp_sdk.collectives.ring import Ring, RingCorrupt, SpinBudget, ring_bytes, valid_capacity
from smddp_sdk.collectives.shm import CHECK_EVERY_S, ShmUnavailable, shm_dir, unlink_own
from smddp_sdk.collectives.store_values import StoreValues
from smddp_sdk.collectives.tcp import _HELLO, _REPLY, HANDSHAKE_S, MAX_PENDING, NONCE_BYTES, TcpMesh, recv_exact
from smddp_sdk.collectives.topology import Topology, advertised_address
from smddp_sdk.specs.processes import pid_alive

ANY_SOURCE = -1
_PROBE_WORD = 0x534D444450325021
SINGLE_COPY_FROM = 256 << 10  # local messages from this size are read from the sender's memory (smddp_core.cpp's kSingleCopyFrom)
# the core's receive polls its ring this long at most, whatever the load (a blocking receive that misses
# polls again in the Python path, up to 1 ms), but no longer: torch's irecv comes there too
FAST_RECV_POLL_S = 30e-6
ENVELOPE = struct.Struct("=8I")  # magic, kind << 8 | dtype, sequence, tag, count low/high, address low/high
MAGIC = 0x50444D53  # b"SMDP"
DATA, ACK, ERROR = 1, 2, 3
PROBE = struct.Struct("=iQI")  # a local dialer's rank, the address of a word the listener reads back, its ring's bytes (0: none)
READABLE, RING_OPEN = 1, 2  # the listener's answer to the probe: bits
_POLL_S = 0.1  # how often an idle reader looks whether its link is being closed
_SLICE_S = 0.05
VERDICT_WAIT_S = 1.0  # a send that found its link broken waits this long for the receiver's verdict
# every dtype this torch knows, in a fixed order: its index travels in the envelope
DTYPES = tuple(dict.fromkeys(d for d in vars(torch).values() if isinstance(d, torch.dtype)))
_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}


def _describe(op: str, peer: int, tag: int, dtype: torch.dtype | None, count: int) -> str:
    """'recv from rank 0 (tag 3, float32, 1024 elements)': a call as a person reads it."""
    where = "from any rank" if peer == ANY_SOURCE else f"{'to' if op == 'send' else 'from'} rank {peer}"
    kind = str(dtype).removeprefix("torch.") if dtype is not None else "?"
    return f"{op} {where} (tag {tag}, {kind}, {count} elements)"


class P2PWork(dist.Work):
    """A point-to-point call's Work: wait() returns once it is done or raises its error; a receive from
    any source tells its source (torch's recv reads it)."""

    def __init__(self, peer: PeerRank | None, timeout_s: float, what: str) -> None:
        super().__init__()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._future: torch.futures.Future = torch.futures.Future()
        self._peer, self._timeout_s, self._what = peer, timeout_s, what
        self.source = -1
        self.attend: Callable[[float], None] | None = None  # works towards completion until a deadline (a ring receive)
        self.poll: Callable[[], None] | None = None  # takes what is there now, without waiting (a ring receive)

    def finish(self, error: BaseException | None = None, value: object = None) -> None:
        if self._done.is_set():
            return
        self._error = error
        self._done.set()
        if error is None:
            self._future.set_result(value)
        else:
            self._future.set_exception(error)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:  # noqa: ARG002 - the group timeout applies
        deadline = time.monotonic() + self._timeout_s
        if self.attend is not None and not self._done.is_set():
            self.attend(deadline)
        if not self._done.wait(max(0.0, deadline - time.monotonic())):
            awaited = [self._peer] if self._peer else []
            raise CollectiveError(f"smddp {self._what} timed out after {self._timeout_s:.0f} s waiting for "
                                  f"{self._peer or 'any rank'} (hung peer or different code path)", awaited=awaited)
        if self._error is not None:
            raise self._error
        return True

    def finished(self) -> bool:
        return self._done.is_set()

    def is_completed(self) -> bool:
        if self.poll is not None and not self._done.is_set():
            self.poll()
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._future

    def _source_rank(self) -> int:
        return self.source


@dataclass(eq=False)
class _Recv:
    """A posted receive: where its bytes go and what it expects."""

    tensor: torch.Tensor
    buffer: torch.Tensor  # contiguous uint8 view of the tensor, or a staging copy
    source: int
    tag: int
    work: P2PWork

    def matches(self, source: int, tag: int) -> bool:
        return self.source in (source, ANY_SOURCE) and self.tag == tag

    def expects(self) -> str:
        return _describe("recv", self.source, self.tag, self.tensor.dtype, self.tensor.numel())

    def complete(self, source: int) -> None:
        if self.buffer.data_ptr() != self.tensor.data_ptr() or not self.tensor.is_contiguous():
            self.tensor.copy_(self.buffer.view(self.tensor.dtype).view(self.tensor.shape))
        self.work.source = source
        self.work.finish(value=[self.tensor])


@dataclass(eq=False)
class _Arrived:
    """A message that came before any receive matched it."""

    source: int
    seq: int
    tag: int
    dtype: torch.dtype
    count: int
    data: torch.Tensor


@dataclass(eq=False)
class _Pending:
    """A send waiting for the receiver's verdict; holds its bytes until then."""

    work: P2PWork
    data: torch.Tensor
    what: str


# wires: one message at a time each way ---------------------------------------------------------------
class _UnixWire:
    """A local link: plain bytes over a Unix socket whose other end's credentials were checked."""

    def __init__(self, sock: socket.socket, peer: PeerRank, pid: int) -> None:
        self.sock, self.peer, self.pid = sock, peer, pid
        self.sending = threading.Lock()  # a message's bytes leave together (a sender and the reader share the link)
        self.single_copy = False  # the receiver can read this end's memory (probed when the sender dials)
        sock.settimeout(None)

    def send(self, data: torch.Tensor, what: str, deadline: float) -> None:  # noqa: ARG002 - blocks until taken
        try:
            with self.sending:
                self.sock.sendall(memview(data))
        except OSError as exc:
            raise _lost(what, self.peer, exc) from exc

    def recv(self, data: torch.Tensor, what: str, deadline: float) -> None:  # noqa: ARG002 - the envelope has come
        view, got = memview(data), 0
        try:
            while got < len(view):
                count = self.sock.recv_into(view[got:])
                if count == 0:
                    raise _lost(what, self.peer, None)
                got += count
        except OSError as exc:
            raise _lost(what, self.peer, exc) from exc

    def readable(self, timeout: float) -> bool:
        return bool(select.select([self.sock], [], [], timeout)[0])

    def close(self) -> None:
        _shut(self.sock)

    def release(self) -> None:
        self.sock.close()


class _TcpWire:
    """A link to another host: TcpMesh's protected records (native loop, or Python with cryptography)."""

    def __init__(self, mesh: TcpMesh, peer: int, describe: PeerRank) -> None:
        self.mesh, self.peer_index, self.peer = mesh, peer, describe
        self.sock = mesh._socks[peer]
        self.pid = 0
        self.sending = threading.Lock()
        self._native = mesh._native

    def _parts(self, data: torch.Tensor) -> list[memoryview]:
        """A message as the Python path frames it: the first header-sized record on its own."""
        view, first = memview(data), self.mesh._header_bytes
        return [view[:first], view[first:]] if first else [view]

    def send(self, data: torch.Tensor, what: str, deadline: float) -> None:
        with self.sending:
            if self._native is None:
                return self.mesh._send_all(self.peer_index, self._parts(data), what, deadline)
            return self._move(data, 0, what, deadline)

    def recv(self, data: torch.Tensor, what: str, deadline: float) -> None:
        if self._native is None:
            for part in self._parts(data):
                if len(part):
                    self.mesh._recv_records(self.peer_index, [part], what, deadline)
            return None
        return self._move(data, 1, what, deadline)

    def _move(self, data: torch.Tensor, receive: int, what: str, deadline: float) -> None:
        """One message through the native loop, which seals or checks its records."""
        transfer = native.Transfer(self.sock.fileno(), receive, data.data_ptr(), data.numel(), 0, 0)
        started = time.monotonic()
        while data.numel():
            slice_ns = int(max(0.0, min(_SLICE_S, deadline - time.monotonic())) * 1e9)
            status = self._native.smddp_exchange(ctypes.byref(transfer), 1, slice_ns)
            if status == -1:
                return
            if status >= 0:
                raise self.mesh.failure(what, self.peer_index, transfer.error)
            self.mesh.stalled(what, self.peer_index, bool(receive), deadline, time.monotonic() - started)

    def readable(self, timeout: float) -> bool:
        return bool(select.select([self.sock], [], [], timeout)[0])

    def close(self) -> None:
        _shut(self.sock)

    def release(self) -> None:
        pass  # the mesh closes its sockets and native links


class _RingOut:
    """A local link's sending end over a ring: messages into the ring, the receiver's verdicts from the socket."""

    def __init__(self, ring: Ring, link: _UnixWire, spin: SpinBudget) -> None:
        self.ring, self.link, self.spin = ring, link, spin
        self.peer, self.pid, self.single_copy = link.peer, link.pid, link.single_copy

    def send(self, data: torch.Tensor, what: str, deadline: float) -> None:
        done, total = 0, data.numel()
        while done < total:
            done += self.ring.put(data, done)
            if done < total:
                self.ring.nudge()  # a reader thread parked by a polling receive drains it now
                _await(self.ring, True, min(total - done, self.ring.capacity // 4), self, what, deadline)

    def recv(self, data: torch.Tensor, what: str, deadline: float) -> None:
        self.link.recv(data, what, deadline)

    def readable(self, timeout: float) -> bool:
        return self.link.readable(timeout)

    def close(self) -> None:
        self.link.close()

    def release(self) -> None:
        self.link.release()  # the mapping stays until nothing uses it: a thread may still be in a ring call


class _RingIn:
    """A local link's receiving end over a ring; the socket carries verdicts back and tells when the sender
    is gone. Whoever drains the ring holds ``draining``: the reader thread, or a receive waiting on it.
    Once a receive has polled the ring itself, the reader thread is ``parked``: asleep without counting as
    a sleeper, so the sender's messages wake nobody, until a receive that does not poll is posted, a
    message is left over, or the sender waits for room (see PointToPoint._hand_back)."""

    def __init__(self, ring: Ring, link: _UnixWire, spin: SpinBudget) -> None:
        self.ring, self.link, self.spin = ring, link, spin
        self.peer, self.pid = link.peer, link.pid
        self.draining = threading.Lock()
        self.parked = False

    def unpark(self) -> None:
        self.parked = False
        self.ring.nudge()

    def readable(self, timeout: float) -> bool:
        """An envelope is in the ring (the reader thread's wait: asleep at once, no polling)."""
        return self.ring.wait(False, ENVELOPE.size, 0.0, timeout) > 0

    def recv(self, data: torch.Tensor, what: str, deadline: float) -> None:
        done, total = 0, data.numel()
        while done < total:
            done += self.ring.take(data, done)
            if done < total:
                _await(self.ring, False, 1, self, what, deadline)

    def send(self, data: torch.Tensor, what: str, deadline: float) -> None:
        self.link.send(data, what, deadline)

    def close(self) -> None:
        self.link.close()

    def release(self) -> None:
        self.link.release()


def _await(ring: Ring, space: bool, want: int, end: _RingOut | _RingIn, what: str, deadline: float) -> None:
    """Until the ring has want bytes free (space) or to read: polls, then sleeps; fails when the other end
    exits or the deadline passes."""
    while not ring.wait(space, want, end.spin.seconds(), CHECK_EVERY_S):
        if not pid_alive(end.pid):
            raise _lost(what, end.peer, None)
        if time.monotonic() >= deadline:
            raise CollectiveError(f"smddp {what} timed out: {end.peer} did not {'take' if space else 'finish'} the message "
                                  "within the process-group timeout", awaited=[end.peer])


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _lost(what: str, peer: PeerRank, error: OSError | None) -> CollectiveError:
    if error is None:
        return CollectiveError(f"smddp {what} failed: {peer} closed the connection (the peer exited or failed)", lost=[peer])
    return CollectiveError(f"smddp {what} failed: connection to {peer} broke ({error})", lost=[peer])


def _envelope_bytes(kind: int, dtype_code: int, seq: int, tag: int, count: int, address: int = 0) -> bytes:
    return ENVELOPE.pack(MAGIC, kind << 8 | dtype_code, seq & 0xFFFFFFFF, tag & 0xFFFFFFFF, count & 0xFFFFFFFF,
                         count >> 32, address & 0xFFFFFFFF, address >> 32)


def _envelope(kind: int, dtype_code: int, seq: int, tag: int, count: int, address: int = 0) -> torch.Tensor:
    return torch.frombuffer(bytearray(_envelope_bytes(kind, dtype_code, seq, tag, count, address)), dtype=torch.uint8)


@dataclass
class _Envelope:
    kind: int
    dtype_code: int
    seq: int
    tag: int
    count: int
    address: int

    @classmethod
    def read(cls, raw: torch.Tensor, what: str, peer: PeerRank) -> _Envelope:
        magic, kind_dtype, seq, tag, low, high, address_low, address_high = ENVELOPE.unpack(bytes(raw.numpy()))
        if magic != MAGIC:
            raise CollectiveError(f"smddp {what}: {peer} sent bytes where a point-to-point envelope belongs (out of step)")
        tag = tag - (1 << 32) if tag >= 1 << 31 else tag
        return cls(kind_dtype >> 8, kind_dtype & 0xFF, seq, tag, high << 32 | low, address_high << 32 | address_low)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_code] if self.dtype_code < len(DTYPES) else torch.uint8

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


# links ------------------------------------------------------------------------------------------------
@dataclass
class _OutLink:
    """This rank's link to a receiver: sends in call order, a reader for the receiver's verdicts."""

    wire: _UnixWire | _TcpWire | _RingOut
    rank: int
    single_copy: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, _Pending] = field(default_factory=dict)
    sent: int = 0
    verdicts_ended: threading.Event = field(default_factory=threading.Event)  # its verdict reader has stopped


class PointToPoint:
    """One group's point-to-point engine (see the module's docstring)."""

    def __init__(self, topo: Topology, values: StoreValues, pids: list[int], timeout_s: float,
                 fail_group: Callable[[str], None]) -> None:
        self.topo, self.values, self.pids, self.timeout_s = topo, values, pids, timeout_s
        self._fail_group = fail_group
        self._lock = threading.Lock()  # guards the queues and the links
        self._dialing: dict[int, threading.Lock] = {}  # one dial per receiver, however many threads send to it
        self._posted: list[_Recv] = []
        self._unexpected: list[_Arrived] = []
        self._out: dict[int, _OutLink] = {}
        self._in: dict[int, _UnixWire | _TcpWire | _RingIn] = {}
        self._lost: dict[int, CollectiveError] = {}  # receiving links that ended, by source
        self._failure: CollectiveError | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._describe = {r: PeerRank(r, topo.hosts[r]) for r in range(topo.size)}
        self._started = False
        self._unix: socket.socket | None = None
        self._tcp_in: TcpMesh | None = None
        self._tcp_out: TcpMesh | None = None
        self._spin = SpinBudget(len(topo.local_ranks))
        self._ring_bytes = 0
        self.core_moved = 0  # messages the core's fast path sent or received (diagnostics, tests)

    # set-up ------------------------------------------------------------------------------------------
    def _local(self, peer: int) -> bool:
        return self.topo.node_of[peer] == self.topo.node

    def start(self) -> None:
        """Open this rank's listeners (once) so that senders can reach it."""
        with self._lock:
            if self._started:
                return
            self._started = True
        me = self.topo.rank
        if len(self.topo.local_ranks) > 1:
            try:
                self._ring_bytes = ring_bytes()
            except ValueError as exc:
                raise CollectiveError(f"smddp point-to-point: {exc}") from exc
            allow_peer_reads()
            self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._unix.bind(self._unix_name(me))
            self._unix.listen(64)
            self._spawn(self._accept_unix, "smddp-p2p-accept-local")
        if len(self.topo.nodes) > 1:
            token = self.values.derive_name("p2p links")
            address = advertised_address(self.topo.hosts[me])
            self._tcp_in = TcpMesh(me, token, self._describe, address)
            self._tcp_out = TcpMesh(me, token, self._describe, address, reads_alerts=False)  # verdict readers read
            self._tcp_out._listener.close()  # dials only
            self.values.set(f"p2p/tcp/{me}", [address, self._tcp_in.port])
            self._spawn(self._accept_tcp, "smddp-p2p-accept")

    def _unix_name(self, rank: int) -> bytes:
        return b"\0smddp-p2p-" + self.values.derive_name("p2p local", str(rank)).encode()

    def ring_path(self, src: int, dst: int) -> str:
        """Where the ring from src to dst is made: a name only the job's ranks can derive."""
        return os.path.join(shm_dir(), "smddp-p2p-" + self.values.derive_name("p2p ring", str(src), str(dst)))

    def _make_ring(self, dst: int) -> tuple[Ring, str, int] | None:
        """The ring this rank offers dst, or None (rings off, or the file could not be made: said once)."""
        if not self._ring_bytes:
            return None
        path = self.ring_path(self.topo.rank, dst)
        try:
            return Ring.create(os.path.dirname(path), os.path.basename(path), self._ring_bytes)
        except ShmUnavailable as exc:
            warnings.warn(f"smddp: point-to-point to {self._describe[dst]} goes through a socket, not shared memory: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def _open_ring(self, src: int, capacity: int) -> Ring | None:
        """The ring src offers (checked as the arena is), or None: its messages then come over the socket."""
        if not capacity or not self._ring_bytes:
            return None
        try:
            if not valid_capacity(capacity):
                raise CollectiveError(f"smddp: refusing the point-to-point ring of {self._describe[src]}: {capacity} bytes")
            return Ring.open(self.ring_path(src, self.topo.rank), capacity)
        except (CollectiveError, OSError) as exc:
            warnings.warn(f"smddp: point-to-point from {self._describe[src]} goes through a socket, not shared memory: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_unix(self) -> None:
        assert self._unix is not None
        while not self._stop.is_set():
            if not select.select([self._unix], [], [], _POLL_S)[0]:
                continue
            try:
                sock, _ = self._unix.accept()
            except OSError:
                continue
            try:
                if _peer_pid(sock) not in {self.pids[r] for r in self.topo.local_ranks}:
                    raise OSError("not a process of this group on this host")  # another user's: refused unread
                sock.settimeout(HANDSHAKE_S)
                claimed, address, capacity = PROBE.unpack(recv_exact(sock, PROBE.size))
                if not 0 <= claimed < self.topo.size or not self._local(claimed) or _peer_pid(sock) != self.pids[claimed]:
                    raise OSError("not a rank of this group on this host")
                word = torch.zeros(1, dtype=torch.int64)
                readable = read_process(self.pids[claimed], word, address) == 0 and int(word) == _PROBE_WORD
                ring = self._open_ring(claimed, capacity)
                sock.sendall(bytes([readable * READABLE | (ring is not None) * RING_OPEN]))
            except OSError:
                sock.close()  # a stranger (or a rank that died while connecting): nothing is kept
                continue
            wire = _UnixWire(sock, self._describe[claimed], self.pids[claimed])
            self._add_in(claimed, _RingIn(ring, wire, self._spin) if ring is not None else wire)

    def _accept_tcp(self) -> None:
        """Take connections on the TCP listener; each proves itself on a thread of its own within
        HANDSHAKE_S, and past MAX_PENDING at once the oldest is dropped (as tcp.py's acceptor does), so
        silent strangers hold up no sender, which proves itself within a round trip."""
        mesh = self._tcp_in
        assert mesh is not None
        proving: dict[socket.socket, None] = {}  # in arrival order
        while not self._stop.is_set():
            if not select.select([mesh._listener], [], [], _POLL_S)[0]:
                continue
            try:
                sock, _ = mesh._listener.accept()
            except OSError:
                continue
            with self._lock:
                proving[sock] = None
                if len(proving) > MAX_PENDING:
                    _shut(next(iter(proving)))  # its handshake fails and ends
            threading.Thread(target=self._handshake, args=(mesh, sock, proving), name="smddp-p2p-handshake", daemon=True).start()

    def _handshake(self, mesh: TcpMesh, sock: socket.socket, proving: dict[socket.socket, None]) -> None:
        """tcp.py's listener side: the dialer (a rank on another node) proves the secret of this
        rendezvous, then this end does; the link gets its keys and protection (TcpMesh._add)."""
        try:
            sock.settimeout(HANDSHAKE_S)
            nonce = os.urandom(NONCE_BYTES)
            sock.sendall(nonce)
            theirs, dialer, target, protection, proof = _HELLO.unpack(recv_exact(sock, _HELLO.size))
            transcript = mesh._secret.transcript(nonce, theirs, dialer, target, protection)
            if target != mesh.node or not 0 <= dialer < self.topo.size or self._local(dialer) \
                    or not hmac.compare_digest(proof, mesh._secret.dialer_proof(transcript)):
                raise OSError("failed the handshake")
            sock.sendall(_REPLY.pack(mesh.protection, mesh._secret.listener_proof(transcript, mesh.protection)))
            if protection != mesh.protection:
                raise mesh.protection_mismatch(dialer, protection)
            with self._lock:
                mesh._add(dialer, sock, mesh._secret.link_keys(transcript, dialer=False))
        except OSError:
            sock.close()  # a stranger, or pushed out: nothing is kept
            return
        except CollectiveError as exc:
            sock.close()
            self.fail(exc)
            return
        finally:
            with self._lock:
                proving.pop(sock, None)
        self._add_in(dialer, _TcpWire(mesh, dialer, self._describe[dialer]))

    def _add_in(self, source: int, wire: _UnixWire | _TcpWire | _RingIn) -> None:
        with self._lock:
            self._in[source] = wire
            self._lost.pop(source, None)
        if isinstance(wire, _RingIn):
            self._spawn(self._read_ring, f"smddp-p2p-ring-from-{source}", source, wire)
            self._spawn(self._watch, f"smddp-p2p-watch-{source}", source, wire)
        else:
            self._spawn(self._read_messages, f"smddp-p2p-from-{source}", source, wire)

    def _out_link(self, dst: int) -> _OutLink:
        with self._lock:
            link = self._out.get(dst)
            dialing = self._dialing.setdefault(dst, threading.Lock())
        if link is not None:
            return link
        with dialing:  # threads sending to dst at once share one link (and its ring: one per pair of ranks)
            with self._lock:
                link = self._out.get(dst)
            return link if link is not None else self._dial(dst)

    def _dial(self, dst: int) -> _OutLink:
        deadline = time.monotonic() + self.timeout_s
        if self._local(dst):
            wire: _UnixWire | _TcpWire | _RingOut = self._dial_unix(dst, deadline)
        else:
            assert self._tcp_out is not None
            address = tuple(self.values.get(f"p2p/tcp/{dst}"))
            sock, keys = self._tcp_out._dial(dst, address, deadline)
            self._tcp_out._add(dst, sock, keys)
            wire = _TcpWire(self._tcp_out, dst, self._describe[dst])
        link = _OutLink(wire, dst, single_copy=getattr(wire, "single_copy", False))
        with self._lock:
            self._out[dst] = link
        self._spawn(self._read_verdicts, f"smddp-p2p-to-{dst}", link)
        return link

    def _dial_unix(self, dst: int, deadline: float) -> _UnixWire | _RingOut:
        """Connect to the local receiver's listener (it opens on the receiver's first point-to-point call),
        check that the listening process is that rank, and offer it a ring (removed from its directory
        once the receiver has answered, whatever it answered)."""
        why = "no attempt"
        while time.monotonic() < deadline:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._unix_name(dst))
            except OSError as exc:
                sock.close()
                why = str(exc)
                time.sleep(0.002)
                continue
            if _peer_pid(sock) != self.pids[dst]:
                sock.close()
                raise CollectiveError(f"smddp send: the local listener of {self._describe[dst]} is another process "
                                      f"(pid {_peer_pid(sock)}, not {self.pids[dst]}): something else took its name")
            word = torch.tensor([_PROBE_WORD], dtype=torch.int64)
            made = self._make_ring(dst)
            try:  # the receiver reads a word of ours: whether the kernel lets it read our messages so
                sock.sendall(PROBE.pack(self.topo.rank, word.data_ptr(), made[0].capacity if made else 0))
                sock.settimeout(HANDSHAKE_S)
                answer = recv_exact(sock, 1)[0]
            except OSError as exc:
                sock.close()
                raise _lost("send", self._describe[dst], exc) from exc
            finally:
                if made is not None:
                    unlink_own(made[1], made[2])
                    os.close(made[2])
            wire = _UnixWire(sock, self._describe[dst], self.pids[dst])
            wire.single_copy = bool(answer & READABLE)
            return _RingOut(made[0], wire, self._spin) if made is not None and answer & RING_OPEN else wire
        raise CollectiveError(f"smddp send: {self._describe[dst]} did not start receiving within the process-group timeout "
                              f"({why})", awaited=[self._describe[dst]])

    # calls -------------------------------------------------------------------------------------------
    def _check(self, what: str) -> None:
        if self._failure is not None:
            raise CollectiveError(f"smddp {what}: point-to-point is unusable after an earlier failure: {self._failure}")

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> P2PWork:
        self._check("send")
        self.start()
        link = self._out_link(dst)
        data = as_bytes(tensor if tensor.is_contiguous() else tensor.contiguous())
        code = _CODES[tensor.dtype]
        broken = None
        with link.lock:
            link.sent += 1
            seq = link.sent
            what = f"send #{seq} " + _describe("send", dst, tag, tensor.dtype, tensor.numel()).removeprefix("send ")
            work = P2PWork(self._describe[dst], self.timeout_s, what)
            single = link.single_copy and data.numel() >= SINGLE_COPY_FROM
            if single:  # the receiver reads our memory: the bytes must stay until it says it has them
                link.pending[seq] = _Pending(work, data, what)
            deadline = time.monotonic() + self.timeout_s
            try:
                link.wire.send(_envelope(DATA, code, seq, tag, tensor.numel(), data.data_ptr() if single else 0), what, deadline)
                if not single and data.numel():
                    link.wire.send(data, what, deadline)
                if single and isinstance(link.wire, _RingOut):
                    link.wire.ring.nudge()  # the sender waits for this one: a parked reader takes it now
            except CollectiveError as exc:
                broken = exc
        if broken is not None:  # outside the lock: the verdict reader takes it to fail the link's sends
            reason = self._verdict_or(link, broken)
            self.fail(reason)
            raise reason from (None if reason is broken else broken)
        if not single:
            work.finish(value=[tensor])  # written: the tensor may be reused (the receiver's verdict on it comes later)
        return work

    def _verdict_or(self, link: _OutLink, error: CollectiveError) -> CollectiveError:
        """Why a send failed: a receiver that refused the message (a mismatch) says so, then closes, and
        the rest of the message can meet the closed link first; its verdict, read by the link's verdict
        reader, is the reason then, not the broken link."""
        if error.lost:
            link.verdicts_ended.wait(VERDICT_WAIT_S)
        return self._failure or error

    # the core's fast path (smddp_core.cpp): a send or receive of one contiguous CPU tensor over
    # a ring, moved by the core without the GIL, with the matching state kept here ------------------------
    def fast_send(self, tensor: torch.Tensor, dst: int, tag: int) -> tuple[int, int, bytes] | None:
        """(ring address, capacity, envelope) when the whole message fits in dst's ring now and no other
        send is writing to it; the core writes envelope and bytes while it still holds the GIL (so no
        Python send starts meanwhile). None: the Python path."""
        link = self._out.get(dst)
        if self._failure is not None or self._stop.is_set() or link is None or not isinstance(link.wire, _RingOut) or link.lock.locked():
            return None
        nbytes = tensor.numel() * tensor.element_size()
        try:
            fits = link.wire.ring.free() >= ENVELOPE.size + nbytes
        except RingCorrupt:
            return None  # the Python path reports it and fails the group
        if not fits or (link.single_copy and nbytes >= SINGLE_COPY_FROM):
            return None
        link.sent += 1
        self.core_moved += 1
        return link.wire.ring.address, link.wire.ring.capacity, _envelope_bytes(DATA, _CODES[tensor.dtype], link.sent, tag, tensor.numel())

    def fast_recv(self, tensor: torch.Tensor, src: int, tag: int) -> tuple[int, int, bytes, float, Callable[[bool], None]] | None:
        """(ring address, capacity, the envelope expected but for its sequence, seconds to poll
        (FAST_RECV_POLL_S at most), give_back)
        when the next message from src is this receive's to take: src's link is a ring, no receive posted
        before may match it, nothing from src waits unmatched. The caller then holds the ring (draining)
        and calls give_back(taken) once it has taken the message or left it for the Python path. None:
        the Python path."""
        wire = self._in.get(src)
        nbytes = tensor.numel() * tensor.element_size()
        if self._failure is not None or self._stop.is_set() or not isinstance(wire, _RingIn) or ENVELOPE.size + nbytes > wire.ring.capacity:
            return None
        expected = _envelope_bytes(DATA, _CODES[tensor.dtype], 0, tag, tensor.numel())
        spin_s = min(self._spin.seconds(blocking=True), FAST_RECV_POLL_S)
        if not wire.draining.acquire(blocking=False):
            return None
        with self._lock:  # holding the ring: no message from src joins the unexpected queue meanwhile
            busy = any(p.source in (src, ANY_SOURCE) for p in self._posted) or any(a.source == src for a in self._unexpected)
        if busy:
            self._hand_back(src, wire)
            return None
        wire.parked = True
        return wire.ring.address, wire.ring.capacity, expected, spin_s, lambda taken: self._fast_received(src, wire, taken)

    def _fast_received(self, src: int, wire: _RingIn, taken: bool) -> None:
        self.core_moved += int(taken)
        self._hand_back(src, wire)

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> P2PWork:
        self._check("recv")
        self.start()
        buffer = as_bytes(tensor) if tensor.is_contiguous() else torch.empty(tensor.numel() * tensor.element_size(), dtype=torch.uint8)
        peer = self._describe.get(src)
        work = P2PWork(peer, self.timeout_s, _describe("recv", src, tag, tensor.dtype, tensor.numel()))
        posted = _Recv(tensor, buffer, src, tag, work)
        with self._lock:
            arrived = next((a for a in self._unexpected if posted.matches(a.source, a.tag)), None)
            if arrived is not None:
                self._unexpected.remove(arrived)
            elif src in self._lost:
                work.finish(self._lost[src])
                return work
            else:
                self._posted.append(posted)
        if arrived is not None:
            self._deliver(posted, arrived)
            return work
        if src == ANY_SOURCE:  # waited for without polling a ring: the reader threads bring its message
            with self._lock:
                rings = [wire for wire in self._in.values() if isinstance(wire, _RingIn)]
            for wire in rings:
                wire.unpark()
        else:  # wait() and is_completed() poll src's ring (a reader thread the fast path parked stays so)
            work.attend = lambda deadline: self._attend(src, work, deadline)
            work.poll = lambda: self._poll_ring(src)
        return work

    @contextlib.contextmanager
    def _holding(self, source: int, wire: _RingIn, what: str) -> Iterator[None]:
        """The body runs with the ring held (draining acquired by the caller); then the ring is handed back,
        and a failure of the body fails the link only after that."""
        failure: Exception | None = None
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - handled once the ring is let go
            failure = exc
        finally:
            self._hand_back(source, wire)
        if failure is not None:
            self._reader_failed(source, failure, what)

    def _hand_back(self, source: int, wire: _RingIn) -> None:
        """A receive that polled the ring lets it go: the reader thread stays parked unless a message is
        left in the ring or a receive that may not poll waits for this source."""
        wire.draining.release()
        with self._lock:
            waiting = any(p.source in (source, ANY_SOURCE) for p in self._posted)
        if waiting or wire.ring.available():
            wire.unpark()

    def _deliver(self, posted: _Recv, arrived: _Arrived) -> None:
        """A message that waited meets its receive: same dtype and size, or both ends fail."""
        if arrived.dtype != posted.tensor.dtype or arrived.count != posted.tensor.numel():
            self._mismatch(posted, arrived.source, self._sent(arrived.seq, arrived.tag, arrived.dtype, arrived.count))
            return
        if arrived.data.numel():
            posted.buffer.copy_(arrived.data)
        posted.complete(arrived.source)

    def _sent(self, seq: int, tag: int, dtype: torch.dtype, count: int) -> str:
        """The sender's call, as its own messages name it: 'send #3 to rank 1 (tag 0, float32, 8 elements)'."""
        return f"send #{seq} " + _describe("send", self.topo.rank, tag, dtype, count).removeprefix("send ")

    def _mismatch(self, posted: _Recv, source: int, sent: str) -> None:
        me, them = self._describe[self.topo.rank], self._describe[source]
        error = CollectiveError(f"smddp point-to-point mismatch: {me} called {posted.expects()} but {them} called {sent}: "
                                "the receiving tensor must have the sent tensor's dtype and number of elements")
        with self._lock:
            link = self._in.get(source)
        if link is not None:  # tell the sender, which fails with the same words
            text = torch.frombuffer(bytearray(str(error).encode()), dtype=torch.uint8)
            try:
                link.send(_envelope(ERROR, 0, 0, 0, text.numel()), "recv", time.monotonic() + 1)
                link.send(text, "recv", time.monotonic() + 1)
            except CollectiveError:
                pass  # the sender is gone: it has nothing to be told
        posted.work.finish(error)
        self.fail(error)

    # the readers -------------------------------------------------------------------------------------
    def _read_messages(self, source: int, wire: _UnixWire | _TcpWire) -> None:
        """Drain a receiving link: each message into the receive it meets, or into the unexpected queue."""
        what = f"recv from {self._describe[source]}"
        try:
            while not self._stop.is_set():
                if wire.readable(_POLL_S) and not self._next_message(source, wire, what):
                    return
        except Exception as exc:  # noqa: BLE001 - a reader that stops must fail what waits on it
            self._reader_failed(source, exc, what)

    def _reader_failed(self, source: int, exc: Exception, what: str) -> None:
        if isinstance(exc, CollectiveError):
            if not self._stop.is_set():
                self._link_ended(source, exc)
        else:
            self.fail(CollectiveError(f"smddp {what} failed on rank {self.topo.rank}: {type(exc).__name__}: {exc}"))

    def _next_message(self, source: int, wire: _UnixWire | _TcpWire | _RingIn, what: str) -> bool:
        """Read one envelope and its message; False once the link is done with (a mismatch failed it)."""
        raw = torch.empty(ENVELOPE.size, dtype=torch.uint8)
        wire.recv(raw, what, time.monotonic() + self.timeout_s)
        return self._receive(source, wire, _Envelope.read(raw, what, self._describe[source]), what)

    def _drain(self, source: int, wire: _RingIn, what: str) -> bool:
        """Every message whose envelope is in the ring now (the caller holds wire.draining)."""
        while not self._stop.is_set() and wire.ring.available() >= ENVELOPE.size:
            if not self._next_message(source, wire, what):
                return False
        return True

    def _read_ring(self, source: int, wire: _RingIn) -> None:
        """The ring's reader thread: asleep until a message comes, then drains the ring, unless a receive
        is waiting on it, which drains it itself (see _attend)."""
        what = f"recv from {self._describe[source]}"
        try:
            while not self._stop.is_set():
                if wire.parked:
                    wire.ring.sleep(_POLL_S)
                elif not wire.readable(_POLL_S):
                    continue
                if wire.ring.available() < ENVELOPE.size or not wire.draining.acquire(timeout=_POLL_S):
                    continue
                try:
                    if not self._drain(source, wire, what):
                        return
                finally:
                    wire.draining.release()
        except Exception as exc:  # noqa: BLE001 - a reader that stops must fail what waits on it
            self._reader_failed(source, exc, what)

    def _poll_ring(self, source: int) -> None:
        """Take the messages src's ring holds now, unless another thread is draining it."""
        wire = self._in.get(source)
        if not isinstance(wire, _RingIn) or not wire.draining.acquire(blocking=False):
            return
        what = f"recv from {self._describe[source]}"
        with self._holding(source, wire, what):
            self._drain(source, wire, what)

    def _attend(self, source: int, work: P2PWork, deadline: float) -> None:
        """A receive from a rank whose link is a ring waits by polling that ring on its own thread (for the
        spin budget, then asleep on it) and takes the messages itself: its own without a hand-off, the
        others' into their receives or the unexpected queue. Returns when done, at the deadline, or when
        the link fails (the failure finishes the receive)."""
        wire = self._in.get(source)
        if not isinstance(wire, _RingIn):
            return
        what = f"recv from {self._describe[source]}"
        wire.draining.acquire()
        wire.parked = True
        with self._holding(source, wire, what):
            while not work.finished() and not self._stop.is_set() and time.monotonic() < deadline:
                if wire.ring.wait(False, ENVELOPE.size, self._spin.seconds(blocking=True), CHECK_EVERY_S):
                    if not self._drain(source, wire, what):
                        break
                elif not pid_alive(wire.pid):
                    break  # the watcher takes what is left and ends the link, which fails this receive

    def _watch(self, source: int, wire: _RingIn) -> None:
        """A ring link's socket carries nothing forward: it only ends, when the sender exits. What the
        sender wrote before is still received, then the link ends as a socket link would."""
        what = f"recv from {self._describe[source]}"
        try:
            while not self._stop.is_set():
                if wire.link.readable(_POLL_S):
                    wire.link.recv(torch.empty(1, dtype=torch.uint8), what, time.monotonic() + self.timeout_s)
                    raise CollectiveError(f"smddp {what}: {wire.peer} sent bytes on a ring link's socket (out of step)")
        except CollectiveError as exc:
            if self._stop.is_set():
                return
            with wire.draining:
                try:
                    self._drain(source, wire, what)
                except CollectiveError:
                    pass  # a message cut short by the exit: the link's end below says what happened
            self._link_ended(source, exc)

    def _receive(self, source: int, wire: _UnixWire | _TcpWire | _RingIn, envelope: _Envelope, what: str) -> bool:
        with self._lock:
            posted = next((p for p in self._posted if p.matches(source, envelope.tag)), None)
            if posted is not None:
                self._posted.remove(posted)
        fits = posted is not None and envelope.dtype == posted.tensor.dtype and envelope.count == posted.tensor.numel()
        if posted is not None and not fits:
            self._mismatch(posted, source, self._sent(envelope.seq, envelope.tag, envelope.dtype, envelope.count))
            return False
        target = posted.buffer if posted is not None else torch.empty(envelope.nbytes, dtype=torch.uint8)
        deadline = time.monotonic() + self.timeout_s
        if envelope.address:
            error = read_process(wire.pid, target, envelope.address)
            if error:
                raise CollectiveError(f"smddp {what}: reading the message from the sender's memory failed: {os.strerror(error)}")
            wire.send(_envelope(ACK, 0, envelope.seq, 0, 0), what, deadline)  # the sender may reuse its tensor now
        elif envelope.nbytes:
            wire.recv(target, what, deadline)
        if posted is not None:
            posted.complete(source)
        else:
            arrived = _Arrived(source, envelope.seq, envelope.tag, envelope.dtype, envelope.count, target)
            with self._lock:  # a receive posted meanwhile may match it now
                posted = next((p for p in self._posted if p.matches(source, envelope.tag)), None)
                if posted is not None:
                    self._posted.remove(posted)
                else:
                    self._unexpected.append(arrived)
            if posted is not None:
                self._deliver(posted, arrived)
        return True

    def _read_verdicts(self, link: _OutLink) -> None:
        """The receiver's answers to this rank's sends: done, send the bytes, or an error."""
        raw = torch.empty(ENVELOPE.size, dtype=torch.uint8)
        what = f"send to {self._describe[link.rank]}"
        try:
            while not self._stop.is_set():
                if not link.wire.readable(_POLL_S):
                    continue
                link.wire.recv(raw, what, time.monotonic() + self.timeout_s)
                verdict = _Envelope.read(raw, what, link.wire.peer)
                if verdict.kind == ERROR:
                    text = torch.empty(verdict.count, dtype=torch.uint8)
                    link.wire.recv(text, what, time.monotonic() + self.timeout_s)
                    raise CollectiveError(bytes(text.numpy()).decode("utf-8", "replace"))
                with link.lock:
                    pending = link.pending.pop(verdict.seq, None)
                if pending is not None:
                    pending.work.finish(value=[pending.data])
        except Exception as exc:  # noqa: BLE001 - every failure ends the link's pending sends
            if not isinstance(exc, CollectiveError):
                exc = CollectiveError(f"smddp {what} failed on rank {self.topo.rank}: {type(exc).__name__}: {exc}")
            if not self._stop.is_set():
                with link.lock:
                    waiting = list(link.pending.values())
                    link.pending.clear()
                for pending in waiting:
                    pending.work.finish(exc)
                if waiting or not exc.lost:
                    self.fail(exc)
        finally:
            link.verdicts_ended.set()

    def _link_ended(self, source: int, error: CollectiveError) -> None:
        """A receiving link ended: receives from its rank (and from any rank) fail with its error, and the
        group with them; with none waiting it is only remembered (the peer may simply have finished)."""
        with self._lock:
            self._lost[source] = error
            waiting = [p for p in self._posted if p.source in (source, ANY_SOURCE)]
            self._posted = [p for p in self._posted if p not in waiting]
        for posted in waiting:
            posted.work.finish(error)
        if waiting or not error.lost:
            self.fail(error)

    # failure and shutdown ----------------------------------------------------------------------------
    def fail(self, error: CollectiveError) -> None:
        """Fail everything pending and the group (which tells the peers), once."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
            posted, self._posted = self._posted, []
            links = list(self._out.values())
        for waiting in posted:
            waiting.work.finish(error)
        for link in links:
            for pending in list(link.pending.values()):
                pending.work.finish(error)
        self._fail_group(str(error))
        self.close()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            wires = [*self._in.values(), *(link.wire for link in self._out.values())]
        for wire in wires:
            wire.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=1)
        for wire in wires:
            wire.release()
        for closing in (self._unix, self._tcp_in, self._tcp_out):
            if closing is not None:
                closing.close()



def _peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket, from the kernel (SO_PEERCRED), or -1
    when it is another user's."""
    pid, uid, _ = struct.unpack("=3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid if uid == os.getuid() else -1
