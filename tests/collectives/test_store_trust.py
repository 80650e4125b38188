"""What the mesh reads from the rendezvous store and from /dev/shm is checked before it is used:
store values carry an HMAC keyed from the job's secret (store_values.py), shared-memory segments are
created exclusively and opened only after fstat says they are this job's (shm.py)."""

from __future__ import annotations

import os
import stat
import threading
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from smddp_sdk.collectives import topology  # noqa: E402
from smddp_sdk.collectives.errors import CollectiveError  # noqa: E402
from smddp_sdk.collectives.shm import ShmUnavailable, check_directory, create_segment, open_segment, unlink_own  # noqa: E402
from smddp_sdk.collectives.store_values import StoreValues  # noqa: E402
from smddp_sdk.specs.contract import MESH_SECRET_ENV  # noqa: E402

SECRET = "a" * 64
NOBODY = 65534
FORGED = r"value for smddp/{key} was not written by this job's ranks .* another local user wrote to the rendezvous store at {where}"


@pytest.fixture
def tcp_store():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield dist.PrefixStore("0//cpu/", store)  # as a group's backend sees it


def test_a_value_reads_back_as_written(tcp_store) -> None:
    values = StoreValues(tcp_store, SECRET)
    values.set("tcp/1", ["10.0.0.2", 4242])
    assert values.get("tcp/1") == ["10.0.0.2", 4242]


@pytest.mark.parametrize("raw", [
    b'["127.0.0.1", 9]',  # what the store held before values were sealed
    b"0" * 64 + b' ["127.0.0.1",9]',  # a MAC of the right shape that is not one
    b"",
    b"\xff\xfe not even text",
])
def test_a_stranger_s_value_fails_naming_the_key_and_the_store(tcp_store, raw: bytes) -> None:
    tcp_store.set("smddp/tcp/1", raw)
    where = f"127.0.0.1:{tcp_store.underlying_store.port}"
    with pytest.raises(CollectiveError, match=FORGED.format(key="tcp/1", where=where)):
        StoreValues(tcp_store, SECRET).get("tcp/1")


def test_a_sealed_value_verifies_only_where_and_for_whom_it_was_written(tcp_store) -> None:
    values = StoreValues(tcp_store, SECRET)
    values.bind("rendezvous A")
    sealed = values.seal("tcp/1", ["10.0.0.2", 4242])
    edited = sealed.replace("4242", "4243")
    elsewhere = StoreValues(tcp_store, SECRET)
    elsewhere.bind("rendezvous B")  # another group of the same job, or an earlier run
    other_job = StoreValues(tcp_store, "b" * 64)
    other_job.bind("rendezvous A")
    for reader, key, raw in [(values, "tcp/0", sealed), (values, "tcp/1", edited), (elsewhere, "tcp/1", sealed), (other_job, "tcp/1", sealed)]:
        with pytest.raises(CollectiveError, match=f"smddp/{key} was not written by this job's ranks"):
            reader.unseal(key, raw.encode())
    assert values.unseal("tcp/1", sealed.encode()) == ["10.0.0.2", 4242]
    with pytest.raises(CollectiveError, match=f"check that every rank has the same {MESH_SECRET_ENV}"):
        other_job.unseal("tcp/1", sealed.encode())  # ranks given different secrets hear how to tell
    with pytest.raises(CollectiveError, match="not written by this job's ranks"):
        values.unseal("tcp/1", sealed.encode() + b" " * (64 << 10))  # a stranger's megabytes are not read


def test_derived_names_need_the_secret_and_differ_per_rendezvous_and_host(tcp_store) -> None:
    def name(secret: str, rendezvous: str, host: str) -> str:
        values = StoreValues(tcp_store, secret)
        values.bind(rendezvous)
        return values.derive_name("arena", host)

    base = name(SECRET, "r", "algo-1")
    assert base == name(SECRET, "r", "algo-1")
    assert len({base, name("b" * 64, "r", "algo-1"), name(SECRET, "s", "algo-1"), name(SECRET, "r", "algo-2")}) == 4


# shared-memory segments ---------------------------------------------------------------------------------

NBYTES = 8192


def _segment(directory: Path, name: str = "seg") -> Path:
    path, fd = create_segment(str(directory), name, NBYTES)
    os.close(fd)
    return Path(path)


def test_a_new_segment_is_exactly_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)
    try:
        path = _segment(tmp_path)
    finally:
        os.umask(old)
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_size == NBYTES and info.st_uid == os.geteuid()
    os.close(open_segment(str(path), NBYTES))


def _refused(path: Path, reason: str, nbytes: int = NBYTES) -> None:
    with pytest.raises(CollectiveError, match=f"refusing shared-memory segment {path}: {reason}"):
        open_segment(str(path), nbytes)


def test_open_segment_refuses_what_this_job_did_not_make(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    target.chmod(0o600)
    (tmp_path / "link").symlink_to(target)
    _refused(tmp_path / "link", "it is a symbolic link")
    os.mkfifo(tmp_path / "fifo", 0o600)
    _refused(tmp_path / "fifo", "not a regular file")
    loose = _segment(tmp_path, "loose")
    loose.chmod(0o644)
    _refused(loose, "mode 644, not 600")
    _refused(_segment(tmp_path, "short"), f"{NBYTES} bytes, not {2 * NBYTES}", 2 * NBYTES)
    twice = _segment(tmp_path, "twice")
    os.link(twice, tmp_path / "second-name")
    _refused(twice, "2 names link to it")
    assert target.read_bytes() == b"keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_open_segment_refuses_another_user_s_file(tmp_path: Path) -> None:
    theirs = _segment(tmp_path, "theirs")
    os.chown(theirs, NOBODY, NOBODY)
    _refused(theirs, f"owned by uid {NOBODY}, not 0")


def test_a_taken_name_is_never_opened_and_says_whose_it_is(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "smddp-link").symlink_to(victim)
    taken = tmp_path / "smddp-taken"
    taken.write_bytes(b"theirs")
    for name, what in [("smddp-link", "a link of uid"), ("smddp-taken", "a file of uid")]:
        with pytest.raises(ShmUnavailable, match=f"{tmp_path / name} exists already \\({what} .*\\) .* it was not opened"):
            create_segment(str(tmp_path), name, NBYTES)
    assert victim.read_bytes() == b"keep" and taken.read_bytes() == b"theirs"
    assert (tmp_path / "smddp-link").is_symlink()


def test_unlink_own_removes_only_the_file_it_created(tmp_path: Path) -> None:
    path, fd = create_segment(str(tmp_path), "seg", NBYTES)
    try:
        os.rename(path, tmp_path / "moved")
        Path(path).write_bytes(b"someone else's")  # another file under the name
        unlink_own(path, fd)
        assert Path(path).read_bytes() == b"someone else's"
        os.unlink(path)
        unlink_own(path, fd)  # gone: nothing to do
        os.rename(tmp_path / "moved", path)
        unlink_own(path, fd)
        assert not os.path.exists(path)
    finally:
        os.close(fd)


def test_directories_others_could_swap_files_in_are_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ShmUnavailable, match="writable by other users without the sticky bit"):
        check_directory(str(open_dir))
    open_dir.chmod(0o1777)  # /dev/shm's mode
    check_directory(str(open_dir))
    if os.geteuid() == 0:
        os.chown(open_dir, NOBODY, NOBODY)
        with pytest.raises(ShmUnavailable, match=f"belongs to uid {NOBODY}"):
            check_directory(str(open_dir))


# the rendezvous as a whole --------------------------------------------------------------------------------

def _client(store: dist.Store) -> dist.Store:
    """A connection of its own to the TCPStore under store (a rank's), under the same prefix."""
    if not isinstance(store, dist.PrefixStore):
        return store
    server = store.underlying_store
    return dist.PrefixStore("0//cpu/", dist.TCPStore(server.host, server.port, is_master=False, timeout=timedelta(seconds=5)))


def _rendezvous(store: dist.Store, size: int, ranks: list[int]) -> dict[int, object]:
    """build() for ranks (threads of this process, each its own rank); rank -> topology or the error."""
    results: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            topo, local, _ = topology.build(_client(store), rank, size, timedelta(seconds=20))
            results[rank] = (topo, local)
        except BaseException as exc:  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.parametrize("secret", [SECRET, None], ids=["runtime-secret", "store-token"])
def test_two_ranks_of_a_host_share_an_arena_and_leave_nothing_behind(tmp_path: Path, monkeypatch, tcp_store, secret) -> None:
    monkeypatch.setenv("SMDDP_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    if secret:
        monkeypatch.setenv(MESH_SECRET_ENV, secret)
    else:
        monkeypatch.delenv(MESH_SECRET_ENV, raising=False)
    results = _rendezvous(tcp_store, 2, [0, 1])
    arenas = [results[r][1].arena for r in (0, 1)]
    assert all(a is not None for a in arenas), results
    arenas[0].slot(0, 0)[:4] = 7
    assert arenas[1].slot(0, 0)[:4].tolist() == [7] * 4  # the same memory
    assert list(tmp_path.iterdir()) == []


def test_a_forged_greeting_fails_the_rendezvous_naming_the_key(tmp_path: Path, monkeypatch, tcp_store) -> None:
    monkeypatch.setenv("SMDDP_SHM_DIR", str(tmp_path))
    monkeypatch.setenv(MESH_SECRET_ENV, SECRET)
    tcp_store.set("smddp/peer/1", '{"host": "algo-1", "pid": 1, "nonce": ""}')
    results = _rendezvous(tcp_store, 2, [0])
    assert isinstance(results[0], CollectiveError), results
    with pytest.raises(CollectiveError, match=FORGED.format(key="peer/1", where=f"127.0.0.1:{tcp_store.underlying_store.port}")):
        raise results[0]
    assert list(tmp_path.iterdir()) == []


def test_a_greeting_replayed_from_another_rendezvous_fails_before_the_arena_is_used(tmp_path: Path, monkeypatch, tcp_store) -> None:
    """Copying a rank's real greeting from another group of the job passes its own check, but the ranks
    then disagree on the rendezvous, so the next value (the arena's transport decision) does not verify."""
    monkeypatch.setenv("SMDDP_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    monkeypatch.setenv(MESH_SECRET_ENV, SECRET)
    earlier = dist.HashStore()
    assert all(not isinstance(r, BaseException) for r in _rendezvous(earlier, 2, [0, 1]).values())
    tcp_store.set("smddp/peer/0", earlier.get("smddp/peer/0"))  # a valid greeting, from the other rendezvous
    tcp_store.set("smddp/transport/0", earlier.get("smddp/transport/0"))  # ... and that rendezvous's decision
    results = _rendezvous(tcp_store, 2, [1])
    assert isinstance(results[1], CollectiveError) and "smddp/transport/0 was not written by this job's ranks" in str(results[1])
    assert list(tmp_path.iterdir()) == []


def test_single_copy_reads_the_pid_each_rank_wrote_in_the_arena(tmp_path: Path, monkeypatch, tcp_store) -> None:
    """The pid that process_vm_readv reads from comes from the peer's own line in the arena (which only
    this user can write), not from the store's greeting: here every greeting's pid is another process's."""
    import subprocess
    import sys
    import time

    import torch

    from smddp_sdk.collectives.shm import Peer

    monkeypatch.setenv("SMDDP_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    monkeypatch.setenv(MESH_SECRET_ENV, SECRET)
    arenas = [local.arena for _, local in _rendezvous(tcp_store, 2, [0, 1]).values()]
    arenas.sort(key=lambda arena: arena.index)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for arena in arenas:
            arena.peers = [Peer(p.group_rank, outsider.pid) for p in arena.peers]
        source = torch.arange(1 << 16, dtype=torch.float64)
        target = torch.zeros_like(source)
        verdicts: dict[int, bool] = {}
        calls = [(0, source, []), (1, torch.zeros(1), [(0, target.view(torch.uint8))])]
        threads = [threading.Thread(target=lambda i=i, s=s, r=r: verdicts.__setitem__(i, arenas[i].single_copy_read(s.view(torch.uint8), r, "test", time.monotonic() + 20))) for i, s, r in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert verdicts == {0: True, 1: True} and torch.equal(target, source)
    finally:
        outsider.kill()
        outsider.wait()


def _greet_as_rank_1(store: dist.Store, pid: int) -> None:
    """Rank 1's greeting, sealed as the job's rank would (this test knows the secret), from pid."""
    StoreValues(store, SECRET).set("peer/1", {"host": "algo-1", "pid": pid, "nonce": "1" * 32})


def test_a_peer_that_exits_before_mapping_fails_the_leader_at_once_and_the_name_goes(tmp_path: Path, monkeypatch, tcp_store) -> None:
    import subprocess
    import sys

    monkeypatch.setenv("SMDDP_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    monkeypatch.setenv(MESH_SECRET_ENV, SECRET)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _greet_as_rank_1(tcp_store, gone.pid)
    results = _rendezvous(tcp_store, 2, [0])
    with pytest.raises(CollectiveError, match=f"rank 1 \\(pid {gone.pid}, this host\\) exited before mapping the shared-memory arena"):
        raise results[0]
    assert list(tmp_path.iterdir()) == []


LEADER = """
import sys
from datetime import timedelta
import torch.distributed as dist
from smddp_sdk.collectives import topology
server = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=60))
topology.build(dist.PrefixStore("0//cpu/", server), 0, 2, timedelta(seconds=60))
"""


def test_a_leader_stopped_while_its_peers_map_the_arena_leaves_nothing_behind(tmp_path: Path, tcp_store) -> None:
    """SIGTERM (how the runtime stops ranks) while the host's first rank waits for its peers to map the
    arena: the name is removed, then the process ends by SIGTERM as it would have."""
    import signal
    import subprocess
    import sys
    import time

    from tests.collectives.cluster import PROJECT_ROOT

    _greet_as_rank_1(tcp_store, os.getpid())  # alive, and never maps
    env = {**os.environ, "SMDDP_SHM_DIR": str(tmp_path), "SM_CURRENT_HOST": "algo-1", MESH_SECRET_ENV: SECRET, "PYTHONPATH": str(PROJECT_ROOT)}
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(tcp_store.underlying_store.port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not list(tmp_path.iterdir()) and time.monotonic() < end and leader.poll() is None:
            time.sleep(0.05)
        assert list(tmp_path.iterdir()), "the leader made no arena"
        leader.send_signal(signal.SIGTERM)
        _, errors = leader.communicate(timeout=30)
    finally:
        leader.kill()
    assert leader.returncode == -signal.SIGTERM, errors
    assert list(tmp_path.iterdir()) == []
