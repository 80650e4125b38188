"""One rank of a point-to-point test (test_p2p.py): joins an smddp group through the test's TCPStore, runs
the scenario named on the command line and writes its report (JSON) under report/<scenario>/<rank>."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import smddp_sdk.collectives  # noqa: F401 - registers the backend
from smddp_sdk.collectives.errors import CollectiveError
from tests.collectives.cluster import join_test_group, report_and_exit

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool)
SIZES = (0, 1, 7, 1000, 300_000)  # elements: empty, tiny, odd, small, past the single-copy threshold


STORE: dist.TCPStore  # the test's store (main sets it)


def values(source: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """What source sends: distinct per source, size and salt, exact in every dtype."""
    raw = (torch.arange(numel, dtype=torch.int64) * 7 + source * 3 + salt) % 13
    return (raw % 2).to(dtype) if dtype == torch.bool else raw.to(dtype)


def check(received: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(received, expected):
        raise AssertionError(f"{what}: received {received[:8].tolist()}... expected {expected[:8].tolist()}...")


def smoke(rank: int, size: int) -> dict:
    """Two ranks: a blocking exchange each way, then an isend/irecv pair."""
    peer = 1 - rank
    got = torch.empty(4)
    if rank == 0:
        dist.send(values(0, 4, torch.float32), peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(values(1, 4, torch.float32), peer)
    check(got, values(peer, 4, torch.float32), "blocking")
    later = torch.empty(3, dtype=torch.int64)
    works = [dist.irecv(later, peer, tag=5), dist.isend(values(rank, 3, torch.int64), peer, tag=5)]
    for work in works:
        work.wait()
    check(later, values(peer, 3, torch.int64), "isend/irecv")
    return {"ok": True}


def correctness(rank: int, size: int) -> dict:
    """Every dtype and size around the ring (isend/irecv), blocking pairs, tags out of order, ordering
    per tag, any source, batch_isend_irecv in both directions."""
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    for dtype in DTYPES:
        for numel in SIZES:
            out = torch.empty(numel, dtype=dtype)
            works = [dist.isend(values(rank, numel, dtype), nxt, tag=numel % 5), dist.irecv(out, prev, tag=numel % 5)]
            for work in works:
                work.wait()
            check(out, values(prev, numel, dtype), f"ring {dtype} x {numel}")
    # blocking send/recv between pairs (even ranks send first), a non-contiguous tensor both ways
    partner = rank ^ 1
    if partner < size:
        mine = values(rank, 64, torch.float32).view(8, 8).t()
        got = torch.empty(8, 8).t()
        if rank % 2 == 0:
            dist.send(mine, partner)
            dist.recv(got, partner)
        else:
            dist.recv(got, partner)
            dist.send(mine, partner)
        check(got, values(partner, 64, torch.float32).view(8, 8).t(), "blocking pair, non-contiguous")
    # tags: sent 1, 2, 3 and received 3, 2, 1; ordering: 20 messages on one tag arrive in order
    sends = [dist.isend(values(rank, 10, torch.int64, salt=t), nxt, tag=t) for t in (1, 2, 3)]
    sends += [dist.isend(torch.tensor([k]), nxt, tag=9) for k in range(20)]
    for t in (3, 2, 1):
        got = torch.empty(10, dtype=torch.int64)
        dist.recv(got, prev, tag=t)
        check(got, values(prev, 10, torch.int64, salt=t), f"tag {t}")
    order = []
    for _ in range(20):
        got = torch.empty(1, dtype=torch.int64)
        dist.recv(got, prev, tag=9)
        order.append(int(got))
    assert order == list(range(20)), order
    for work in sends:
        work.wait()
    # any source: rank 0 receives one message from every other rank, told who sent it
    if rank == 0:
        sources = []
        for _ in range(size - 1):
            got = torch.empty(5, dtype=torch.int64)
            source = dist.recv(got, tag=4)
            check(got, values(source, 5, torch.int64), f"any source from {source}")
            sources.append(source)
        assert sorted(sources) == list(range(1, size)), sources
    else:
        dist.send(values(rank, 5, torch.int64), 0, tag=4)
    # batch_isend_irecv with both neighbours, both directions, a large and a small tensor each
    big = [torch.empty(500_000) for _ in range(2)]
    small = [torch.empty(3, dtype=torch.int32) for _ in range(2)]
    ops = [dist.P2POp(dist.isend, values(rank, 500_000, torch.float32), nxt), dist.P2POp(dist.isend, values(rank, 500_000, torch.float32), prev),
           dist.P2POp(dist.irecv, big[0], prev), dist.P2POp(dist.irecv, big[1], nxt),
           dist.P2POp(dist.isend, values(rank, 3, torch.int32), nxt, tag=1), dist.P2POp(dist.irecv, small[0], prev, tag=1),
           dist.P2POp(dist.isend, values(rank, 3, torch.int32), prev, tag=1), dist.P2POp(dist.irecv, small[1], nxt, tag=1)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for got, source, numel, dtype in ((big[0], prev, 500_000, torch.float32), (big[1], nxt, 500_000, torch.float32),
                                      (small[0], prev, 3, torch.int32), (small[1], nxt, 3, torch.int32)):
        check(got, values(source, numel, dtype), f"batch from {source}")
    dist.barrier()  # collectives still run after point-to-point
    return {"ok": True}


def large(rank: int, size: int) -> dict:
    """One message over 64 MiB from rank 0 to the last rank (another host where there are two)."""
    numel = (64 << 20) // 4 + 12345
    last = size - 1
    if rank == 0:
        dist.send(values(0, numel, torch.float32), last, tag=7)
    elif rank == last:
        got = torch.empty(numel)
        dist.recv(got, 0, tag=7)
        check(got, values(0, numel, torch.float32), "64 MiB")
    dist.barrier()
    return {"ok": True}


def mismatch(rank: int, size: int) -> dict:
    """Rank 0 sends N float32 (SMDDP_TEST_SENT, 10), rank size-1 expects N + 2: both fail, each naming both
    calls (a large N: the receiver refuses and closes while the sender still writes)."""
    last = size - 1
    sent = int(os.environ.get("SMDDP_TEST_SENT", "10"))
    try:
        if rank == 0:
            dist.send(torch.ones(sent), last, tag=2)  # written: the receiver's verdict comes back over the link
            dist.recv(torch.empty(1), last, tag=3)  # fails with it
        elif rank == last:
            time.sleep(float(os.environ.get("SMDDP_TEST_RECV_AFTER_S", "0")))  # > 0: the message waits for the receive
            dist.recv(torch.empty(sent + 2), 0, tag=2)
        else:
            return {"error": ""}
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"error": ""}


def killed(rank: int, size: int) -> dict:
    """The victim (SMDDP_TEST_VICTIM) dies while rank 0 waits in a receive from it."""
    victim = int(os.environ["SMDDP_TEST_VICTIM"])
    if rank == victim:
        dist.send(torch.ones(4), 0)  # the link is up: the next receive is mid-stream
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank != 0:
        return {"error": "", "lost": []}
    dist.recv(torch.empty(4), victim)
    started = time.monotonic()
    try:
        dist.recv(torch.empty(1000), victim)
    except CollectiveError as exc:
        return {"error": str(exc), "lost": [[p.rank, p.host] for p in exc.lost], "elapsed": time.monotonic() - started}
    return {"error": "", "lost": []}


def protected(rank: int, size: int) -> dict:
    """Between hosts: the links carry the protection every host uses, and silent strangers on the
    receiver's listener (the test opens them, then sets "flooded") keep no sender out."""
    from smddp_sdk.collectives.tcp import PROTECTIONS, link_protection

    group = dist.distributed_c10d._get_default_group()
    last = size - 1
    sender = 1 if group.topology.node_of[1] != group.topology.node_of[last] else 0
    if rank == last:
        dist.recv(torch.empty(1), 0)  # the listener is up
        listener = group._p2p._tcp_in
        STORE.set("p2p-listener", json.dumps(list(listener._listener.getsockname()[:2])))
        got = torch.empty(100_000)
        dist.recv(got, sender, tag=1)
        return {"protection": PROTECTIONS[listener.protection], "expected": link_protection(), "ok": torch.equal(got, torch.ones(100_000))}
    if rank == 0:
        dist.send(torch.ones(1), last)
    if rank == sender:
        STORE.wait(["flooded"])
        dist.send(torch.ones(100_000), last, tag=1)  # dialed while the strangers sit on the listener
        return {"protection": PROTECTIONS[group._p2p._tcp_out.protection], "expected": link_protection(), "ok": True}
    return {"ok": True}


def local_attack(rank: int, size: int) -> dict:
    """One host, 3 ranks: the last rank's local listener is up (store key "p2p-up") while the test
    attacks it as another user; then rank 1 dials it afresh (after "flooded") and its message arrives."""
    last = size - 1
    if rank == 0:
        dist.send(torch.ones(1), last)
    elif rank == last:
        dist.recv(torch.empty(1), 0)
        STORE.set("p2p-up", "1")
        got = torch.empty(1000)
        dist.recv(got, 1, tag=1)
        return {"ok": torch.equal(got, torch.full((1000,), 7.0))}
    elif rank == 1:
        STORE.wait(["flooded"])
        dist.send(torch.full((1000,), 7.0), last, tag=1)
    return {"ok": True}


def main() -> None:
    global STORE
    scenario = sys.argv[1]
    STORE, rank, size = join_test_group(float(os.environ.get("SMDDP_TEST_PG_TIMEOUT", "60")))
    clean = scenario in ("smoke", "correctness", "large", "protected", "local_attack")  # others leave a failed group behind
    report_and_exit(STORE, scenario, rank, lambda: globals()[scenario](rank, size), lambda report: clean and "crash" not in report)


if __name__ == "__main__":
    main()
