"""One rank of a fast-path test (test_p2p_fast.py): two ranks of one host join an smddp group through
the test's TCPStore, run the scenario named on the command line and write their report (JSON) under
report/<scenario>/<rank>, with how many messages the core's fast path moved (PointToPoint.core_moved)."""

from __future__ import annotations

import sys
import threading
import time

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers the backend
from smddp_sdk.collectives.process_group import smddp_backend
from tests.collectives.cluster import join_test_group, report_and_exit
from tests.collectives.p2p_worker import check, values

STORE: dist.TCPStore


def moved() -> int:
    engine = smddp_backend(None)._p2p
    return engine.core_moved if engine is not None else 0


def message(k: int) -> torch.Tensor:
    return torch.full((4,), float(k))


def received(tensor: torch.Tensor) -> int:
    return int(tensor[0])


def warm(rank: int) -> int:
    """20 ping-pongs (tag 0): the links are up, and rank 1's receives find their message in the ring (its
    reader thread parked by the first), which the fast path takes without polling, whatever the load.
    Messages moved by the core."""
    for k in range(20):
        got = torch.zeros(4)
        if rank == 0:
            dist.send(message(k), 1)
            dist.recv(got, 1)
        else:
            time.sleep(0.005)
            dist.recv(got, 0)
            dist.send(got, 0)
        assert received(got) == k, (received(got), k)
    return moved()


def order(rank: int) -> dict:
    """Rank 0 sends 1..6 with blocking sends; rank 1 takes them with blocking receives (the fast path
    where it may) and a receive posted before them: only matching by (source, tag) in post order, with
    messages that came before their receive first, gets each where it belongs."""
    warmed = warm(rank)
    if rank == 0:
        for k in (1, 2, 3, 4):
            dist.send(message(k), 1, tag=1)
        dist.send(message(5), 1, tag=2)
        STORE.wait(["got-5"])
        dist.send(message(6), 1, tag=1)
        STORE.set("sent-6", "1")
        dist.barrier()
        return {"ok": True, "warmed": warmed, "moved": moved()}
    got = {name: torch.zeros(4) for name in "abcdef"}
    dist.recv(got["a"], 0, tag=1)  # 1
    posted = dist.irecv(got["b"], 0, tag=1)  # 2: posted first, so the next tag-1 message is its
    dist.recv(got["c"], 0, tag=1)  # 3
    posted.wait()
    dist.recv(got["e"], 0, tag=2)  # 5: passes 4 over, which waits unexpected
    STORE.set("got-5", "1")
    STORE.wait(["sent-6"])  # 6 is in the ring (the parked reader leaves it there), 4 came first
    dist.recv(got["d"], 0, tag=1)  # 4
    dist.recv(got["f"], 0, tag=1)  # 6
    dist.barrier()
    seen = {name: received(tensor) for name, tensor in got.items()}
    return {"ok": seen == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}, "seen": seen, "warmed": warmed, "moved": moved()}


def any_source(rank: int) -> dict:
    """Fast-path messages reach receives from any source, in order, between receives from rank 0."""
    if rank == 0:
        for k in range(30):
            dist.send(message(k), 1)
        dist.barrier()
        return {"ok": True, "moved": moved()}
    seen = []
    for k in range(30):
        got = torch.zeros(4)
        source = dist.recv(got) if k % 3 else dist.recv(got, 0)
        seen.append((source, received(got)))
    dist.barrier()
    return {"ok": seen == [(0, k) for k in range(30)], "seen": seen, "moved": moved()}


def mismatch(rank: int) -> dict:
    """Once the ring is up (one message), rank 0 sends 10 float32 through the fast path, rank 1 expects
    12: both fail, each naming both calls."""
    try:
        if rank == 0:
            dist.send(torch.ones(4), 1, tag=2)
            dist.send(torch.ones(10), 1, tag=2)
            sent = moved()
            dist.recv(torch.empty(1), 1, tag=3)  # fails with the receiver's verdict
            return {"error": "", "moved": sent}
        dist.recv(torch.empty(4), 0, tag=2)
        dist.recv(torch.empty(12), 0, tag=2)
    except RuntimeError as exc:
        return {"error": str(exc), "moved": moved()}
    return {"error": "", "moved": moved()}


def threads(rank: int) -> dict:
    """Two threads of rank 0 send to rank 1 at once (tags 1 and 2): the ring has one writer at a time, and
    each tag's messages arrive whole and in order."""
    count = 300
    if rank == 0:
        senders = [threading.Thread(target=lambda tag=tag: [dist.send(values(tag, 64, torch.float32, salt=k), 1, tag=tag)
                                                            for k in range(count)]) for tag in (1, 2)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        dist.barrier()
        return {"ok": True, "moved": moved()}
    for k in range(count):
        for tag in (1, 2):
            got = torch.empty(64)
            dist.recv(got, 0, tag=tag)
            check(got, values(tag, 64, torch.float32, salt=k), f"tag {tag} message {k}")
    dist.barrier()
    return {"ok": True, "moved": moved()}


def parked(rank: int) -> dict:
    """After fast-path receives have parked rank 1's reader thread, rank 1 is busy: a single-copy send of
    rank 0 (its Work waits for the receiver) still completes while it is, and an any-source irecv that
    rank 1 only polls completes."""
    big = 300_000  # float32: past the single-copy threshold
    warmed = warm(rank)
    if rank == 0:
        started = time.monotonic()
        dist.isend(values(0, big, torch.float32), 1, tag=7).wait()
        waited = time.monotonic() - started
        STORE.set("big-sent", "1")
        dist.send(message(99), 1, tag=8)
        dist.barrier()
        return {"ok": True, "waited": waited}
    STORE.wait(["big-sent"])  # busy: no receive runs until rank 0's send has completed
    got = torch.empty(big)
    dist.recv(got, 0, tag=7)
    check(got, values(0, big, torch.float32), "single-copy message")
    polled = torch.zeros(4)
    work = dist.irecv(polled, tag=8)
    deadline = time.monotonic() + 30
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    dist.barrier()
    return {"ok": work.is_completed() and received(polled) == 99, "warmed": warmed}


def main() -> None:
    global STORE
    scenario = sys.argv[1]
    STORE, rank, _ = join_test_group()
    report_and_exit(STORE, scenario, rank, lambda: globals()[scenario](rank), lambda report: "crash" not in report and "error" not in report)


if __name__ == "__main__":
    main()
