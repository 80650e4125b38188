"""Store key injection against a live 2-host x 2-rank job: ``nobody`` writes the mesh's keys in the
rendezvous store (any local user can) before the ranks do and keeps rewriting them. Before the values were
authenticated this made the ranks open, write and unlink a path of the attacker's choice, read another
process's memory and connect to the attacker. Now every rank that reads such a value fails at once naming
the key and the store, and nothing the value names is touched (docs/security.md#network-listeners)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.live_mesh import JOB_TIMEOUT_S, KEY_PREFIX, RANKS, Outcome, left_in_shm, run_attacked_job, shm_entries
from tests.hostile.unprivileged import requires_nobody

pytest.importorskip("torch")
pytestmark = requires_nobody

# Sets every (key, value) of argv[2] (JSON) in the store at 127.0.0.1:argv[1], from before the ranks
# write them until it is stopped, so the ranks read the attacker's values whenever they read.
HAMMER = r'''
import json
port, pairs = int(sys.argv[1]), json.loads(sys.argv[2])
print("ready", flush=True)
store = None
while True:
    try:
        store = store or Store("127.0.0.1", port, timeout=5)
        for key, value in pairs:
            store.set(key, value)
        time.sleep(0.001)
    except OSError:
        store = None
        time.sleep(0.01)
'''

# The same, with a listener of the attacker's whose address the injected values carry: it prints
# "connection" for every connection a rank makes to it.
HAMMER_AND_LISTEN = r'''
import json, socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
listener.setblocking(False)
port = int(sys.argv[1])
pairs = [(key, value.replace("ATTACKER_PORT", str(listener.getsockname()[1]))) for key, value in json.loads(sys.argv[2])]
print("ready", flush=True)
store = None
while True:
    try:
        listener.accept()
        print("connection", flush=True)
    except BlockingIOError:
        pass
    try:
        store = store or Store("127.0.0.1", port, timeout=5)
        for key, value in pairs:
            store.set(key, value)
        time.sleep(0.001)
    except OSError:
        store = None
        time.sleep(0.01)
'''


def _failed_naming(outcome: Outcome, key: str) -> None:
    """The job failed on every host, within the test's bound (not torch's 30-minute timeout), saying
    which key a stranger wrote and where the store is."""
    assert outcome.failed(), outcome.output
    assert outcome.seconds < JOB_TIMEOUT_S
    said = f"the rendezvous store's value for smddp/{key}"
    assert said in outcome.output, outcome.output
    assert f"another local user wrote to the rendezvous store at {outcome.store}" in outcome.output, outcome.output


def _snapshot(path: Path) -> tuple:
    info = path.stat()
    return path.read_bytes(), info.st_ino, info.st_mode, info.st_uid, info.st_mtime_ns


def test_an_injected_arena_path_is_neither_opened_nor_written_nor_unlinked(tmp_path: Path) -> None:
    victim = tmp_path / "victim.conf"  # root's file, as /etc/... would be
    victim.write_bytes(b"root's configuration\n" * 500)
    victim.chmod(0o644)
    before, shm_before = _snapshot(victim), shm_entries()
    forged = json.dumps({"kind": "shm", "path": str(victim), "slot": 65536})
    pairs = [(f"{KEY_PREFIX}transport/{host}", forged) for host in (0, 1)]
    outcome = run_attacked_job(tmp_path, HAMMER, json.dumps(pairs))
    _failed_naming(outcome, "transport/")
    assert victim.exists() and _snapshot(victim) == before
    assert left_in_shm(shm_before) == set()  # the leaders' own arenas went too


def test_an_injected_pid_is_not_used(tmp_path: Path) -> None:
    """A greeting naming a process outside the job (the ranks would read its memory with process_vm_readv)."""
    outsider = subprocess.Popen([sys.executable, "-c", "import time; secret = b'outsider' * 4096; time.sleep(600)"])
    try:
        forged = [(f"{KEY_PREFIX}peer/{rank}", json.dumps({"host": f"algo-{1 + rank // 2}", "pid": outsider.pid, "nonce": "0" * 32})) for rank in range(RANKS)]
        outcome = run_attacked_job(tmp_path, HAMMER, json.dumps(forged))
        _failed_naming(outcome, "peer/")
        assert outsider.poll() is None  # untouched, still running
    finally:
        outsider.kill()
        outsider.wait()


def test_an_injected_tcp_address_is_never_connected_to(tmp_path: Path) -> None:
    forged = json.dumps(["127.0.0.1", "ATTACKER_PORT"]).replace('"ATTACKER_PORT"', "ATTACKER_PORT")
    pairs = [(f"{KEY_PREFIX}tcp/{node}", forged) for node in (0, 1)]
    outcome = run_attacked_job(tmp_path, HAMMER_AND_LISTEN, json.dumps(pairs))
    _failed_naming(outcome, "tcp/")
    assert "connection" not in outcome.attacker

