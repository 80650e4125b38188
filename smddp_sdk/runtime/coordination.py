"""How the runtimes of one job learn of each other's failure (stdlib TCP, newline-delimited JSON).

The runtime on the job's first host runs a ``Coordinator`` on SMDDP_AGENT_PORT (default 7778); every
runtime, that one included, connects to it as a ``CoordinatorClient``:

    coordinator -> {"type": "challenge", "nonce": hex}
    client      -> {"type": "hello", "host": "algo-2", "proof": HMAC-SHA256(token, nonce + host)}
    coordinator -> {"type": "welcome"} | {"type": "rejected", "reason": "..."}
    client      -> {"type": "failure", "failure": {...}}          each local failure, at once
    coordinator -> {"type": "stop", "failure": {...}}             to every host: at once on a culprit's
                                                                  failure, after SETTLE_SECONDS on a victim's
    client      -> {"type": "final", "status": "ok"|"failed"|"stopped", "failures": [...]}
    coordinator -> {"type": "verdict", "root_cause": {...}, "failures": [...]}   once every host is final

The token is SMDDP_JOB_TOKEN when set, else derived from the job's hyperparameters file, host list and
TRAINING_JOB_NAME, so runtimes of another job on a reused port are turned away. Nothing waits forever:
clients give up connecting after ``connect_timeout`` (and carry on alone), a host that has not joined
by then counts as failed, the coordinator decides the verdict at the latest ``verdict_timeout`` after
the first failure, and a host whose connection drops before it reported counts as failed.

With ``survivors`` (a job with ``survive_host_loss``) a host other than the first may be lost and replaced
alone: its failures and its disconnection stop nobody (the supervisor restarts it, the others' ranks
re-form their group), and its replacement joins in its place. A failure of the first host, which serves
the coordinator and the rendezvous store, stops every host as always.

The coordinator listens on the master host's own address when the scheduler maps hosts to addresses
(loopback in local mode), else on every interface (a container network, SageMaker's VPC). Whoever can
reach it cannot stall or kill it: lines are bounded (``MAX_HELLO_BYTES`` before the handshake,
``MAX_LINE_BYTES`` after), so is JSON nesting, a peer must finish the handshake within ``HANDSHAKE_TIMEOUT`` in
all (not per byte), and a malformed message from a joined host is logged and dropped, never raised in the
serving thread. Nobody can starve the real hosts of handshakes (runtime/peers.py says who holds a connection):
a peer of this job's own uid on this machine (every host, in local mode) is always heard; other local users
share ``STRANGER_HANDSHAKES`` at once, and are turned away beyond them; a peer this machine does not list
(another container or machine) gets ``HANDSHAKES_PER_ADDRESS`` at once from its address, so a flood from one
address leaves every other host's slots free.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from smddp_sdk.runtime import peers
from smddp_sdk.runtime.failures import root_cause
from smddp_sdk.specs.failure import SETTLE_SECONDS, FailureRecord, is_early_exit, must_stop

HANDSHAKE_TIMEOUT = 10.0
MAX_LINE_BYTES = 64 * 1024 * 1024  # from a joined host: a final report of 512 ranks with long tracebacks
MAX_HELLO_BYTES = 4096  # from anyone, before the handshake
MAX_JSON_DEPTH = 16
STRANGER_HANDSHAKES = 4  # other local users together: none of them can join
HANDSHAKES_PER_ADDRESS = 8  # a peer of unknown owner: one address is one host (or an attacker)
Log = Callable[[str], None]


def proof(token: str, nonce: str, host: str) -> str:
    return hmac.new(token.encode(), (nonce + host).encode(), hashlib.sha256).hexdigest()


class _Channel:
    """One socket, whole JSON lines in both directions; sends are thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()
        _keepalive(sock)

    def send(self, message: dict[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError:
                return False
        return True

    def receive(self, limit: int = MAX_LINE_BYTES) -> dict[str, Any] | None:
        """The next message; None when the peer closed, broke the protocol or sent more than ``limit``."""
        try:
            line = self._reader.readline(limit + 1)
        except (OSError, ValueError):  # ValueError: the reader was closed under us
            return None
        if not line or len(line) > limit or not line.endswith(b"\n"):
            return None  # closed, or a line longer than any message: the connection is dropped
        return decode_message(line)

    def close(self) -> None:
        _shut(self.sock)  # wakes a thread blocked in receive(), which holds the reader's lock


def decode_message(line: bytes) -> dict[str, Any] | None:
    """A JSON object of bounded nesting, or None. Short lines (every handshake) have their nesting counted
    before parsing; in long ones, from joined hosts, the parser's own recursion limit is the bound."""
    if len(line) <= MAX_HELLO_BYTES and _nesting(line) > MAX_JSON_DEPTH:
        return None
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _nesting(line: bytes) -> int:
    """How deep brackets nest outside strings; stops counting past the limit."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _keepalive(sock: socket.socket) -> None:
    """Notice a peer machine that vanished without closing its socket within about half a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _shut(sock: socket.socket) -> None:
    """Shut down, then close: shutdown wakes a thread blocked in accept() or a read; close alone does not."""
    for closer in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
        with suppress(OSError):
            closer()


def _daemon_timer(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.daemon = True  # never keeps a finished runtime alive
    timer.start()
    return timer


def _wait_for(event: threading.Event, gave_up: threading.Event, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not event.is_set() and not gave_up.is_set() and time.monotonic() < deadline:
        event.wait(0.05)


class Coordinator:
    """The job-wide failure service, run by the runtime on the job's first host."""

    def __init__(self, hosts: Sequence[str], token: str, port: int, *, log: Log, address: str = "", connect_timeout: float = 600.0, verdict_timeout: float = 15.0, survivors: bool = False) -> None:
        self.hosts = tuple(hosts)
        self.survivors = survivors
        self._token = token
        self._log = log
        self._connect_timeout = connect_timeout
        self._verdict_timeout = verdict_timeout
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}
        self._finals: dict[str, str] = {}
        self._gone: set[str] = set()
        self._failures: dict[tuple[str, int | None], FailureRecord] = {}
        self._stop_sent = False
        self._first_failure_at: float | None = None  # monotonic
        self._verdict: dict[str, Any] | None = None
        self.done = threading.Event()  # every host is final or gone, and the verdict (if any) was sent
        self._server = socket.create_server((address, port), backlog=1024)  # a flood queues without crowding out hosts
        self._closed = False
        self._strangers = threading.BoundedSemaphore(STRANGER_HANDSHAKES)
        self._by_address: dict[str, threading.BoundedSemaphore] = {}
        self._turned_away: set[str] = set()  # who was told of in the log

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="coordinator", daemon=True).start()
        _daemon_timer(self._connect_timeout, self._connect_deadline)

    def close(self) -> None:
        self._closed = True
        _shut(self._server)
        with self._lock:
            channels = list(self._channels.values())
        for channel in channels:
            channel.close()

    # --- connections ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                arrived = [self._server.accept()[0], *self._also_waiting()]
            except OSError:
                return
            owners = peers.socket_owners()  # one look for the lot: reading it is slow, a flood is many
            for sock in arrived:
                slots, who = self._slots_for(sock, owners)
                if slots is not None and not slots.acquire(blocking=False):  # a flood: its senders wait, hosts do not
                    self._turn_away(sock, who, slots)
                    continue
                threading.Thread(target=self._serve, args=(sock, slots), name="coordinator peer", daemon=True).start()

    def _also_waiting(self) -> list[socket.socket]:
        """The connections queued behind the one just accepted."""
        self._server.setblocking(False)
        waiting = []
        try:
            while len(waiting) < 1024:
                waiting.append(self._server.accept()[0])
        except (BlockingIOError, InterruptedError):
            pass
        finally:
            self._server.setblocking(True)
        for sock in waiting:
            sock.setblocking(True)
        return waiting

    def _slots_for(self, sock: socket.socket, owners: dict) -> tuple[threading.BoundedSemaphore | None, str]:
        """The handshake slots this peer draws on (None: the job's own uid, never bounded), and who it is."""
        uid = peers.peer_uid(sock, owners)
        if uid == os.getuid():
            return None, "this job's user"
        if uid is not None:
            return self._strangers, f"uid {uid}"
        address = peers.peer_address(sock)
        return self._by_address.setdefault(address, threading.BoundedSemaphore(HANDSHAKES_PER_ADDRESS)), f"address {address}"

    def _turn_away(self, sock: socket.socket, who: str, slots: threading.BoundedSemaphore) -> None:
        with suppress(OSError):
            sock.close()
        if who not in self._turned_away:  # once per peer: a flood must not flood the log
            self._turned_away.add(who)
            bound = STRANGER_HANDSHAKES if slots is self._strangers else HANDSHAKES_PER_ADDRESS
            self._log(f"turning away connections from {who} beyond {bound} handshakes at once")

    def _serve(self, sock: socket.socket, slots: threading.BoundedSemaphore | None) -> None:
        try:
            channel = _Channel(sock)
            host = self._timed_handshake(channel)
        finally:
            if slots is not None:
                slots.release()
        if host is None:
            channel.close()
            return
        while (message := channel.receive()) is not None:
            try:
                self._handle(host, message)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._log(f"ignored a malformed {str(message.get('type'))[:40]!r} message from {host}: {type(exc).__name__}")
        self._on_gone(host, channel)

    def _timed_handshake(self, channel: _Channel) -> str | None:
        """The handshake, cut off after HANDSHAKE_TIMEOUT in all (a peer trickling bytes cannot hold it)."""
        timer = _daemon_timer(HANDSHAKE_TIMEOUT, channel.close)
        try:
            return self._handshake(channel)
        finally:
            timer.cancel()

    def _handshake(self, channel: _Channel) -> str | None:
        nonce = secrets.token_hex(16)
        channel.sock.settimeout(HANDSHAKE_TIMEOUT)
        channel.send({"type": "challenge", "nonce": nonce})
        hello = channel.receive(MAX_HELLO_BYTES)
        if hello is None:
            return None  # silent, too long, not JSON, or cut off: nothing to answer
        channel.sock.settimeout(None)
        host = str(hello.get("host", ""))[:255]
        reason = self._rejection(hello, host, nonce)
        if reason:
            channel.send({"type": "rejected", "reason": reason})
            self._log(f"turned away a coordination peer claiming {host!r}: {reason}")
            return None
        with self._lock:
            if self._replaceable(host):
                self._finals.pop(host, None)  # a replacement: what its predecessor reported is over
                self._gone.discard(host)
            self._channels[host] = channel
            cause = root_cause(self._failures.values()) if self._stop_sent else None
            pending = [{"type": "stop", "failure": cause.to_json() if cause else None}] if self._stop_sent else []
            if self._verdict:
                pending.append(self._verdict)
        channel.send({"type": "welcome"})
        for message in pending:
            channel.send(message)
        return host

    def _rejection(self, hello: dict[str, Any] | None, host: str, nonce: str) -> str | None:
        if not hello or hello.get("type") != "hello":
            return "no hello message"
        if not hmac.compare_digest(str(hello.get("proof", "")), proof(self._token, nonce, host)):
            return "wrong job token (SMDDP_JOB_TOKEN or the hyperparameters file differ)"
        if host not in self.hosts:
            return f"host {host!r} is not one of this job's hosts {list(self.hosts)}"
        with self._lock:
            if host in self._channels or (host in self._finals and not self._replaceable(host)):
                return f"host {host!r} is already connected"
        return None

    def _replaceable(self, host: str) -> bool:
        """A host lost and replaced alone (``survivors``): any but the first, before a stop was sent."""
        return self.survivors and host != self.hosts[0] and not self._stop_sent and self._finals.get(host) != "ok"

    # --- job state --------------------------------------------------------------------------------

    def _handle(self, host: str, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "failure":
            self._on_failure(FailureRecord.from_json(message["failure"]))
        elif kind == "final":
            failures = [FailureRecord.from_json(f) for f in message.get("failures", [])]
            for failure in failures:
                self._on_failure(failure)
            with self._lock:
                self._finals[host] = str(message.get("status", "failed"))
            self._check_complete()

    def _on_failure(self, failure: FailureRecord) -> None:
        """Stop every host at once on a culprit's failure; on a victim's, after the settle time. A
        replaceable host's failure stops nobody: it ends alone and the supervisor replaces it."""
        with self._lock:
            if failure.host is not None and self._replaceable(failure.host):
                return
            self._failures.setdefault((failure.host, failure.rank), failure)
            if self._stop_sent or is_early_exit(failure):  # an exit with 0: evidence for the verdict, no failure
                return
            first = self._first_failure_at is None
            if first:
                self._first_failure_at = time.monotonic()
            stop_now = must_stop(list(self._failures.values()), self._first_failure_at, time.monotonic())
        if stop_now:
            self._send_stop()
        elif first:
            _daemon_timer(SETTLE_SECONDS, self._send_stop)

    def _send_stop(self) -> None:
        with self._lock:
            if self._stop_sent:
                return
            self._stop_sent = True
            channels = list(self._channels.values())
            cause = root_cause(self._failures.values())
        assert cause is not None
        self._log(f"{cause.who} {'was stopped' if cause.error_type == 'Signal' else 'failed'}; telling every host to stop")
        for channel in channels:
            channel.send({"type": "stop", "failure": cause.to_json()})
        _daemon_timer(self._verdict_timeout, self._decide)

    def _on_gone(self, host: str, channel: _Channel) -> None:
        with self._lock:
            if self._channels.get(host) is channel:  # not its replacement's
                del self._channels[host]
            if self._replaceable(host):
                self._log(f"the runtime on {host} is gone; the other hosts train on while it is replaced")
                return
            reported = host in self._finals
            if not reported:
                self._gone.add(host)
        if not reported:
            self._host_failed(host, "LostPeer", f"the runtime on {host} disconnected before reporting its result")
        self._check_complete()

    def _connect_deadline(self) -> None:
        with self._lock:
            silent = [h for h in self.hosts if h not in self._channels and h not in self._finals and h not in self._gone]
            self._gone.update(silent)
        if silent:  # a host that never joins would leave the others waiting in rendezvous: fail loudly
            self._host_failed(silent[0], "HostNeverJoined", f"the runtimes on {silent} never reached the coordinator within {self._connect_timeout:.0f} s")
        self._check_complete()

    def _host_failed(self, host: str, error_type: str, message: str) -> None:
        self._on_failure(FailureRecord(host=host, rank=None, exit_code=1, error_type=error_type, message=message, timestamp=time.time()))

    def _check_complete(self) -> None:
        with self._lock:
            accounted = set(self._finals) | self._gone
            complete = all(host in accounted for host in self.hosts)
        if complete:
            self._decide()

    def _decide(self) -> None:
        with self._lock:
            if self.done.is_set():
                return
            failures = list(self._failures.values())
            cause = root_cause(failures)
            if cause is not None:
                self._verdict = {
                    "type": "verdict",
                    "root_cause": cause.to_json(),
                    # records without a time last
                    "failures": [f.to_json() for f in sorted(failures, key=lambda f: f.timestamp or float("inf"))],
                }
            channels = list(self._channels.values())
            verdict = self._verdict
            self.done.set()
        if verdict:
            for channel in channels:
                channel.send(verdict)


class CoordinatorClient:
    """One runtime's line to the coordinator: report failures, learn when to stop and who is to blame."""

    def __init__(
        self, host: str, address: str, port: int, token: str, *, log: Log, on_stop: Callable[[FailureRecord], None], connect_timeout: float = 600.0, on_lost: Callable[[], None] | None = None
    ) -> None:
        self.host = host
        self._on_lost = on_lost
        self._final_sent = False
        self._target = (address, port)
        self._token = token
        self._log = log
        self._on_stop = on_stop
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._channel: _Channel | None = None
        self._outbox: list[dict[str, Any]] = []
        self._closing = False
        self.gave_up = threading.Event()  # could not connect, was rejected, or lost the coordinator
        self.connected = threading.Event()
        self.verdict_event = threading.Event()
        self.verdict: tuple[FailureRecord, list[FailureRecord]] | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="coordination client", daemon=True).start()

    def report_failure(self, failure: FailureRecord) -> None:
        self._send({"type": "failure", "failure": failure.to_json()})

    def report_final(self, status: str, failures: Sequence[FailureRecord]) -> None:
        self._final_sent = True  # from now on the coordinator may close first: that is no loss
        self._send({"type": "final", "status": status, "failures": [f.to_json() for f in failures]})

    def wait_verdict(self, timeout: float) -> tuple[FailureRecord, list[FailureRecord]] | None:
        _wait_for(self.verdict_event, self.gave_up, timeout)
        return self.verdict

    def flush(self, timeout: float) -> bool:
        """Wait until queued messages have gone out (connected) or the coordinator is out of reach."""
        _wait_for(self.connected, self.gave_up, timeout)
        return self.connected.is_set()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            channel = self._channel
        if channel:
            channel.close()

    def _send(self, message: dict[str, Any]) -> None:
        with self._lock:
            channel = self._channel
            if channel is None:
                self._outbox.append(message)  # flushed once connected
                return
        channel.send(message)

    def _run(self) -> None:
        channel = self._connect()
        if channel is None:
            self.gave_up.set()
            return
        while (message := channel.receive()) is not None:
            try:
                self._handle(message)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._log(f"ignored a malformed message from the coordinator: {type(exc).__name__}")
        with self._lock:
            closing = self._closing
        if not closing and not self.verdict_event.is_set():
            self._log(f"lost contact with the coordinator at {self._target[0]}:{self._target[1]}")
            self.gave_up.set()
            if self._on_lost is not None and not self._final_sent:
                self._on_lost()  # the coordinating host's runtime is gone: this host must not train headless

    def _connect(self) -> _Channel | None:
        deadline = time.monotonic() + self._connect_timeout
        delay = 0.1
        problem = "timed out"
        while not self._closing and time.monotonic() < deadline:
            try:
                channel = _Channel(socket.create_connection(self._target, timeout=HANDSHAKE_TIMEOUT))
            except OSError as exc:  # not listening yet, or the name does not resolve yet
                problem = str(exc)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            try:
                return self._handshake(channel)
            except OSError as exc:  # the coordinator went away mid-handshake; try again
                problem = str(exc)
                channel.close()
                time.sleep(delay)
        if not self._closing:
            self._log(f"cannot reach the coordinator at {self._target[0]}:{self._target[1]} ({problem}); continuing without cross-host failure propagation")
        return None

    def _handshake(self, channel: _Channel) -> _Channel | None:
        challenge = channel.receive()
        if not challenge or challenge.get("type") != "challenge":
            raise OSError("the coordinator sent no challenge")
        channel.send({"type": "hello", "host": self.host, "proof": proof(self._token, str(challenge["nonce"]), self.host)})
        answer = channel.receive()
        if not answer or answer.get("type") != "welcome":
            reason = (answer or {}).get("reason", "connection closed during the handshake")
            self._log(f"the coordinator turned this runtime away: {reason}")
            channel.close()
            return None
        channel.sock.settimeout(None)
        with self._lock:
            self._channel = channel
            outbox, self._outbox = self._outbox, []
        for message in outbox:
            channel.send(message)
        self.connected.set()
        return channel

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "stop" and message.get("failure"):
            self._on_stop(FailureRecord.from_json(message["failure"]))
        elif kind == "verdict":
            cause = FailureRecord.from_json(message["root_cause"])
            self.verdict = (cause, [FailureRecord.from_json(f) for f in message.get("failures", [])])
            self.verdict_event.set()
