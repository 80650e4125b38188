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
port (the server's, in its own process) and shuts down a connection that has not sent torch's 5-byte
validation message within ``HANDSHAKE_SECONDS``, and the newest connections beyond ``max_connections``
(four per rank and a margin: torch opens one per rank). The server then sees end-of-file and drops
them, as it does for a peer that left.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

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

# Runs in the helper: serve the store on the inherited socket, bound its connections (``guard``) once a
# second, and end when the runtime goes away (end-of-file on stdin).
_SERVER = """
import datetime, os, select, socket, struct, sys, time
from torch.distributed import TCPStore
fd, host, port, handshake_s, limit = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
store = TCPStore(host, port, None, True, datetime.timedelta(days=30), wait_for_workers=False, master_listen_fd=fd, use_libuv=True)
sys.stdout.buffer.write(b"ready\\n")
sys.stdout.flush()
VALIDATION_BYTES, BYTES_RECEIVED = 5, struct.Struct("=Q")  # query type + magic; tcp_info's tcpi_bytes_received
GUARDED = os.path.isdir("/proc/self/fd") and hasattr(socket, "TCP_INFO")  # Linux
first_seen = {}

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

def guard():
    now, found = time.monotonic(), connections()
    for inode in list(first_seen):
        if inode not in found:
            del first_seen[inode]
    for inode in found:
        first_seen.setdefault(inode, now)
    newest_first = sorted(found, key=first_seen.get, reverse=True)
    excess = set(newest_first[:max(0, len(found) - limit)])
    for inode, (sock, received) in found.items():
        if inode in excess or (received < VALIDATION_BYTES and now - first_seen[inode] >= handshake_s):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        sock.close()

while not select.select([sys.stdin], [], [], 1.0)[0] or sys.stdin.buffer.read1(64):
    if GUARDED:
        guard()
os._exit(0)  # nothing to flush: skip torch's slow teardown, which the runtime would wait for
"""


class RendezvousStore:
    """The helper process serving the store; ``stop`` (or the runtime's exit) ends it."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self._log_path = log_path

    @classmethod
    def start(cls, address: str, port: int, scratch: Path, python: str = sys.executable, *, max_connections: int = 1024, handshake_s: float = HANDSHAKE_SECONDS) -> RendezvousStore:
        """Bind ``address:port`` and start the helper (in ``python``, the ranks' interpreter) on it, keeping at
        most ``max_connections`` and none that stays silent ``handshake_s``; OSError when the port is taken."""
        listener = socket.create_server((address, port), backlog=1024)
        log_path = scratch / "rendezvous-store.log"
        try:
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    [python, "-c", _SERVER, str(listener.fileno()), address, str(port), str(handshake_s), str(max_connections)],
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

    def stop(self) -> None:
        """End the helper at once: it holds nothing worth a graceful exit (the job's tail waits for it)."""
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


def serve(address: str, port: int, python: str, say: Callable[[str], None], scratch: Path, world_size: int = 1) -> RendezvousStore | None:
    """On the master host in local mode (``address`` set), start the store for ``world_size`` ranks and wait
    for it; None (and a note) where rank 0 keeps serving it: not local mode, or no torch in the ranks' interpreter."""
    if not address:
        return None
    try:
        store = RendezvousStore.start(address, port, scratch, python, max_connections=CONNECTIONS_PER_RANK * world_size + SPARE_CONNECTIONS)
    except OSError as exc:
        say(f"cannot serve the rendezvous store on {address}:{port} ({exc.strerror}); rank 0 will serve it")
        return None
    problem = store.wait_ready()
    if problem:
        say(f"the rendezvous store did not start ({problem}); rank 0 will serve it")
        return None
    say(f"rendezvous store serving on {address}:{port}")
    return store


def rank_environment(address: str, *, is_master: bool, served: bool) -> dict[str, str]:
    """What every rank of a host gets in local mode: connect to the store as a client. On the master host
    only when its runtime serves the store; elsewhere always (those ranks are clients anyway). Set after
    the rank's inherited variables are cleaned, so it is ours, never a stale launcher's."""
    if not address or (is_master and not served):
        return {}
    return {AGENT_STORE_ENV: str(True)}
