"""The job's rendezvous store (torch's TCPStore), served by the master host's runtime on its own address.

With ``env://`` rendezvous, torch makes rank 0 start the TCPStore server, and that server listens on
every interface whatever MASTER_ADDR says. In local mode every simulated host is on this machine, so the
store must be reachable on loopback only. Here the master host's runtime binds the listening socket
itself (MASTER_ADDR:MASTER_PORT, the scheduler's address for the master host) and hands it to a small
helper process that serves the store on it (TCPStore's ``master_listen_fd``). Every rank then gets
``TORCHELASTIC_USE_AGENT_STORE=True``, torch's own switch for "an agent serves the store": all ranks,
rank 0 included, connect as clients.

The runtime stays stdlib only: the helper is ``python -c`` in the interpreter the ranks use, where
torch lives. It exits when the runtime closes its stdin (or kills it), so it never outlives the runtime,
even when the runtime is SIGKILLed. Where torch is missing or the helper cannot start, the runtime says so
and leaves the store to rank 0 as before; ranks on other hosts connect as clients either way, so hosts
need not agree on who serves it.

torch's store has no authentication and keeps every connection for as long as the peer likes, so the
helper bounds them from outside the server: once a second it looks at its own sockets on the store's
port (the server's, in its own process), finds who holds the other end (runtime/peers.py: the owner's uid
where the peer is on this machine, else its address) and shuts down connections the server then drops as
it does for a peer that left:

* the job's own (the helper's uid, which the ranks share) never: no outsider can evict a rank;
* another local user's (a stranger) once silent ``HANDSHAKE_SECONDS`` (no torch validation message), and
  the newest beyond ``STRANGER_CONNECTIONS``, all strangers together;
* a peer this machine does not list (another network namespace or machine) once silent, and the newest
  beyond ``max_per_address`` from its address (four per rank of the job and a margin, so that one
  address cannot crowd out the others).

It raises its own file limit to the hard limit, so a flood between two passes does not exhaust it. What
it closed it reports on its standard output at most every ``REPORT_SECONDS`` ("closed 52 connections from
uid 65534: ..."); the runtime says each report in the host's log and adds them, with the helper's exit if
it stopped early, to the failure of a rank that lost the store (torch's Dist* errors).
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from smddp_sdk.runtime import peers

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# "0" leaves the store to rank 0 (listening on every interface, as torch does). Why one might: with the
# runtime's store the ranks find it at once, so a process-group timeout of a few seconds starts counting
# before a slow rank 0 is up; with rank 0 serving, connecting waits for rank 0 first.
RUNTIME_STORE_ENV = "SMDDP_RUNTIME_STORE"
READY = b"ready\n"
START_TIMEOUT = 120.0  # importing torch on a busy machine
HANDSHAKE_SECONDS = 10.0  # a connection must send torch's validation message by then (as the coordinator's handshake)
CONNECTIONS_PER_RANK = 4
SPARE_CONNECTIONS = 32
STRANGER_CONNECTIONS = 8  # other local users together: they have no business with the store
REPORT_SECONDS = 10.0

# Runs in the helper, after runtime/peers.py's source: serve the store on the inherited socket, bound its
# connections (``guard``) once a second, report what it closed, and end when the runtime goes away
# (end-of-file on stdin).
_SERVER = """
import datetime, os, resource, select, socket, struct, sys, time
from torch.distributed import TCPStore
fd, host, port, handshake_s, per_address, per_strangers, report_s = (
    int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
except (ValueError, OSError):
    pass  # an unlimited hard limit some kernels refuse as a soft one: keep the soft limit
store = TCPStore(host, port, None, True, datetime.timedelta(days=30), wait_for_workers=False, master_listen_fd=fd, use_libuv=True)
sys.stdout.buffer.write(b"ready\\n")
sys.stdout.flush()
VALIDATION_BYTES, BYTES_RECEIVED = 5, struct.Struct("=Q")  # query type + magic; tcp_info's tcpi_bytes_received
GUARDED = os.path.isdir("/proc/self/fd") and hasattr(socket, "TCP_INFO")  # Linux
OWN_UID = os.getuid()
first_seen, closed, reported_at = {}, {}, [float("-inf")]

def connections():
    \"\"\"The server's connections (inode -> a copy of the socket, bytes it received so far).\"\"\"
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            copy = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)  # not a socket
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockname()[1] == port:
                sock.getpeername()  # the listener has no peer
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                received = BYTES_RECEIVED.unpack_from(info, 128)[0] if len(info) >= 136 else VALIDATION_BYTES
                found[os.fstat(copy).st_ino] = (sock, received)
                continue
        except OSError:
            pass
        sock.close()
    return found

def holder(sock, owners):
    \"\"\"Who holds the other end: None for the job's own uid, "uid U" for another local user, else the address.\"\"\"
    uid = peer_uid(sock, owners)
    if uid is None:
        return f"address {peer_address(sock)}"
    return None if uid == OWN_UID else f"uid {uid}"

def guard():
    now, found, owners = time.monotonic(), connections(), socket_owners()
    for inode in list(first_seen):
        if inode not in found:
            del first_seen[inode]
    for inode in found:
        first_seen.setdefault(inode, now)
    shut, bounded = {}, {}  # inode -> (holder, why); bound -> its holders' inodes
    for inode, (sock, received) in found.items():
        who = holder(sock, owners)
        if who is None:
            continue  # the job's own: never evicted
        if received < VALIDATION_BYTES and now - first_seen[inode] >= handshake_s:
            shut[inode] = (who, f"silent for {handshake_s:.0f} s (no store validation message)")
        else:
            bounded.setdefault("strangers" if who.startswith("uid") else who, []).append((inode, who))
    for group, members in bounded.items():
        bound = per_strangers if group == "strangers" else per_address
        why = (f"beyond the {bound} connections other local users may hold" if group == "strangers"
               else f"beyond the {bound} connections one address may hold")
        for inode, who in sorted(members, key=lambda m: (first_seen[m[0]], m[0]), reverse=True)[: max(0, len(members) - bound)]:
            shut[inode] = (who, why)
    for inode, (sock, _) in found.items():
        if inode in shut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            closed[shut[inode]] = closed.get(shut[inode], 0) + 1
        sock.close()
    report(now)

def report(now):
    \"\"\"What was closed since the last report, at most every report_s.\"\"\"
    if not closed or now - reported_at[0] < report_s:
        return
    for (who, why), count in sorted(closed.items()):
        sys.stdout.write(f"closed {count} connection{'s' if count > 1 else ''} from {who}: {why}\\n")
    sys.stdout.flush()
    closed.clear()
    reported_at[0] = now

while not select.select([sys.stdin], [], [], 1.0)[0] or sys.stdin.buffer.read1(64):
    if GUARDED:
        guard()
os._exit(0)  # nothing to flush: skip torch's slow teardown, which the runtime would wait for
"""


# A helper started ahead (a standby runtime's, for a warm restart) imports torch first, then waits for its
# arguments and the listening socket on a Unix socket (argv[1]); nothing (the runtime dropped it) ends it.
_AHEAD = """
import os, socket, sys
from torch.distributed import TCPStore
_channel = socket.socket(fileno=int(sys.argv[1]))
_channel.sendall(b"1")  # warm
_given, _fds, _, _ = socket.recv_fds(_channel, 4096, 1)
if not _fds:
    os._exit(0)
sys.argv = [sys.argv[0], str(_fds[0]), *_given.decode().split("\\0")]
_channel.close()
"""


def _helper_source(ahead: bool = False) -> str:
    """The helper's program: runtime/peers.py (stdlib), then _SERVER (after _AHEAD for one started ahead)."""
    return Path(peers.__file__).read_text() + (_AHEAD if ahead else "") + _SERVER


class HelperAhead:
    """A store helper started before the job's address and port are known, torch imported (warm restart)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [python, "-c", _helper_source(ahead=True), str(theirs.fileno())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(theirs.fileno(),), start_new_session=True,
            )
        finally:
            theirs.close()

    def wait_ready(self) -> bool:
        """Block until it has imported torch; False when it ended instead."""
        try:
            return self.channel.recv(1) == b"1"
        except OSError:
            return False

    def hand(self, listener: socket.socket, arguments: tuple[object, ...]) -> subprocess.Popen[bytes] | None:
        """Give it the socket and the arguments; None when it is gone (a cold helper is started instead)."""
        try:
            socket.send_fds(self.channel, ["\0".join(map(str, arguments)).encode()], [listener.fileno()])
        except OSError:
            self.drop()
            return None
        finally:
            self.channel.close()
        return self.process

    def drop(self) -> None:
        """End it unused (also what ``hand`` does when it cannot hand over)."""
        self.channel.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class RendezvousStore:
    """The helper process serving the store; ``stop`` (or the runtime's exit) ends it. ``notices``: what the
    helper reported closing, once ``relay`` runs."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self._log_path = log_path
        self.notices: list[str] = []
        self._stopped = False

    @classmethod
    def start(cls, address: str, port: int, scratch: Path, python: str = sys.executable, *, max_per_address: int = 1024,
              handshake_s: float = HANDSHAKE_SECONDS, report_s: float = REPORT_SECONDS, ahead: HelperAhead | None = None) -> RendezvousStore:
        """Bind ``address:port`` and start the helper (in ``python``, the ranks' interpreter) on it, keeping none
        that stays silent ``handshake_s`` but the job's own, at most STRANGER_CONNECTIONS from other local users
        and ``max_per_address`` from each address whose owner this machine cannot see; OSError when the port is
        taken."""
        listener = socket.create_server((address, port), backlog=1024)
        log_path = scratch / "rendezvous-store.log"
        settings = (address, port, handshake_s, max_per_address, STRANGER_CONNECTIONS, report_s)
        warm = None
        if ahead is not None:  # not when the ranks run another interpreter (a virtualenv): the store runs in theirs
            warm = ahead.hand(listener, settings) if ahead.python == python else ahead.drop()
        if warm is not None:
            listener.close()  # the helper holds its own copy
            log_path.write_text("the helper was started ahead: its errors are in the host's log\n")
            return cls(warm, log_path)
        arguments = (listener.fileno(), *settings)
        try:
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    [python, "-c", _helper_source(), *map(str, arguments)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    pass_fds=(listener.fileno(),),
                    start_new_session=True,
                )
        finally:
            listener.close()  # the helper holds its own copy
        return cls(process, log_path)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        """ "" once the store serves, else why not (the helper is stopped then)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        received = b""
        while time.monotonic() < deadline and not received.endswith(b"\n"):
            readable, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            chunk = os.read(self.process.stdout.fileno(), 64)
            if not chunk:
                break
            received += chunk
        if received == READY:
            return ""
        self.stop()
        tail = self._log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return "; ".join(tail) or f"no answer within {timeout:.0f} s"

    def relay(self, say: Callable[[str], None]) -> None:
        """Say each report of the helper (connections it closed) as it comes, and keep it in ``notices``."""
        threading.Thread(target=self._relay, args=(say,), name="rendezvous store reports", daemon=True).start()

    def _relay(self, say: Callable[[str], None]) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                text = line.decode(errors="replace").strip()[:300]
                self.notices.append(text)
                say(f"rendezvous store: {text}")
        except (OSError, ValueError):  # ValueError: stop() closed the pipe under us
            pass

    def note_for_failure(self) -> str:
        """Why a rank may have lost the store ("" when nothing happened to it): the helper's reports, or its end."""
        notes = self.notices[-3:]
        code = None if self._stopped else self.process.poll()
        if code is not None:
            notes.append(f"stopped during the job (its helper exited with code {code}; see {self._log_path.name})")
        return "the rendezvous store " + "; ".join(notes) if notes else ""

    def stop(self) -> None:
        """End the helper at once: it holds nothing worth a graceful exit (the job's tail waits for it)."""
        self._stopped = True
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None and not stream.closed:
                stream.close()


def store_address(bind_address: str, environ: Mapping[str, str]) -> str:
    """Where this job's runtime serves the store: the host's mapped address in local mode, unless
    SMDDP_RUNTIME_STORE=0; "" where rank 0 serves it."""
    return "" if environ.get(RUNTIME_STORE_ENV, "1") == "0" else bind_address


def serve(address: str, port: int, python: str, say: Callable[[str], None], scratch: Path, world_size: int = 1, ahead: HelperAhead | None = None) -> RendezvousStore | None:
    """On the master host in local mode (``address`` set), start the store for ``world_size`` ranks and wait
    for it; None (and a note) where rank 0 keeps serving it: not local mode, or no torch in the ranks' interpreter."""
    if not address:
        return None
    try:
        store = RendezvousStore.start(address, port, scratch, python, max_per_address=CONNECTIONS_PER_RANK * world_size + SPARE_CONNECTIONS, ahead=ahead)
    except OSError as exc:
        say(f"cannot serve the rendezvous store on {address}:{port} ({exc.strerror}); rank 0 will serve it")
        return None
    problem = store.wait_ready()
    if problem:
        say(f"the rendezvous store did not start ({problem}); rank 0 will serve it")
        return None
    store.relay(say)
    return store


def rank_environment(address: str, *, is_master: bool, served: bool) -> dict[str, str]:
    """What every rank of a host gets in local mode: connect to the store as a client. On the master host
    only when its runtime serves the store; elsewhere always (those ranks are clients anyway). Set after
    the rank's inherited variables are cleaned, so it is ours, never a stale launcher's."""
    if not address or (is_master and not served):
        return {}
    return {AGENT_STORE_ENV: str(True)}
