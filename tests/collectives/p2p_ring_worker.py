"""One rank of a ring test (test_p2p_ring.py, tests/hostile/test_p2p_ring_trust.py): joins an smddp group
through the test's TCPStore, runs the scenario named on the command line, writes its report (JSON) under
report/<scenario>/<rank>."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers the backend
from smddp_sdk.collectives import p2p
from smddp_sdk.collectives.process_group import smddp_backend
from tests.collectives.cluster import join_test_group, report_and_exit
from tests.collectives.p2p_worker import check, values

STORE: dist.TCPStore


def engine() -> p2p.PointToPoint:
    return smddp_backend(None)._point_to_point("recv", [torch.empty(1)], 0)


def rings() -> bool:
    """Every link this rank has is a ring (None of them: False)."""
    links = [*(link.wire for link in engine()._out.values()), *engine()._in.values()]
    return bool(links) and all(isinstance(wire, p2p._RingOut | p2p._RingIn) for wire in links)


def traffic(rank: int, size: int) -> dict:
    """Around the ring of ranks, many messages in flight at once, most larger than a 4 KiB ring: 40 per
    tag on 3 tags (received tag by tag, in reverse), each its own size; then any source while a rank
    floods; then single-copy sized messages."""
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    sizes = [1 + (k * 397) % 3000 for k in range(40)]  # float32 elements: up to 12 KB, 3 times the ring
    sends = [dist.isend(values(rank, n, torch.float32, salt=tag * 100 + k), nxt, tag=tag) for tag in (1, 2, 3) for k, n in enumerate(sizes)]
    for tag in (3, 2, 1):
        for k, n in enumerate(sizes):
            got = torch.empty(n)
            dist.recv(got, prev, tag=tag)
            check(got, values(prev, n, torch.float32, salt=tag * 100 + k), f"tag {tag} message {k}")
    for work in sends:
        work.wait()
    any_source(rank, size)
    big = torch.empty(300_000)  # past the single-copy threshold: its envelope goes through the ring
    works = [dist.isend(values(rank, 300_000, torch.float32), nxt, tag=9), dist.irecv(big, prev, tag=9)]
    for work in works:
        work.wait()
    check(big, values(prev, 300_000, torch.float32), "single-copy message")
    dist.barrier()
    return {"ok": True, "rings": rings()}


def any_source(rank: int, size: int) -> None:
    """Rank 1 keeps sending until told to stop; rank 2's one message still reaches rank 0's any-source
    receives (no source starves another), and each source's messages arrive in their order."""
    if rank == 1:
        sent = 0
        while not STORE.check(["stop-flood"]):
            dist.send(torch.tensor([sent]), 0, tag=5)
            sent += 1
        dist.send(torch.tensor([-1]), 0, tag=5)
    elif rank == 2:
        STORE.wait(["flooding"])
        dist.send(torch.tensor([1000]), 0, tag=5)
    elif rank == 0:
        expected, seen_two, started = 0, False, time.monotonic()
        while True:
            got = torch.empty(1, dtype=torch.int64)
            source = dist.recv(got, tag=5)
            if source == 1 and int(got) == -1:
                break
            if source == 1:
                assert int(got) == expected, (int(got), expected)
                expected += 1
                if expected == 20:
                    STORE.set("flooding", "1")
            else:
                assert (source, int(got)) == (2, 1000), (source, int(got))
                seen_two = True
                STORE.set("stop-flood", "1")
            assert time.monotonic() - started < 60, "rank 2's message never came"
        assert seen_two


def traffic_pair(rank: int, size: int) -> dict:
    peer = 1 - rank
    for k in range(50):
        got = torch.empty(k * 10)
        works = [dist.isend(values(rank, k * 10, torch.float32, salt=k), peer), dist.irecv(got, peer)]
        for work in works:
            work.wait()
        check(got, values(peer, k * 10, torch.float32, salt=k), f"message {k}")
    return {"ok": True, "rings": rings()}


def sleeper(rank: int, size: int) -> dict:
    """Rank 1 waits in a receive long enough to fall asleep on its ring; rank 0 sends the time it sends."""
    if rank == 0:
        dist.send(torch.zeros(1, dtype=torch.float64), 1)  # the ring is up
        time.sleep(1.0)
        dist.send(torch.tensor([time.time()], dtype=torch.float64), 1)
        return {"ok": True}
    dist.recv(torch.empty(1, dtype=torch.float64), 0)
    got = torch.empty(1, dtype=torch.float64)
    dist.recv(got, 0)
    return {"ok": rings(), "late_s": time.time() - float(got)}


def planted(rank: int, size: int) -> dict:
    """The hostile test plants a file (another user's) where rank 0's ring to rank 1 would be made: rank
    1 says where (ring_path, then "ring-path"); rank 0 sends once the test says "planted". The message
    must arrive over the socket, and the planted file be left as it was."""
    if rank == 1:
        STORE.set("ring-path", engine_path())
        got = torch.empty(1000)
        dist.recv(got, 0)
        check(got, values(0, 1000, torch.float32), "message past the planted file")
        return {"ok": True, "rings": rings()}
    STORE.wait(["planted"])
    dist.send(values(0, 1000, torch.float32), 1)
    return {"ok": True, "rings": rings()}


def engine_path() -> str:
    return engine().ring_path(0, 1)


def main() -> None:
    global STORE
    scenario = sys.argv[1]
    STORE, rank, size = join_test_group()
    report_and_exit(STORE, scenario, rank, lambda: globals()[scenario](rank, size), lambda report: "crash" not in report)


if __name__ == "__main__":
    main()
