"""AllReduce and AllGather between node leaders: the algorithms, and the choice by size and host count.

H = number of hosts, S = buffer bytes, p = the largest power of two <= H. AllReduce algorithms:

* ``oneshot``: every leader sends its whole buffer to every other and all reduce everything, in node order.
  One round; each host sends (H-1)*S, which equals the optimum for H=2.
* ``recursive_doubling``: log2(p) rounds; in round k host v swaps its whole buffer with host v XOR 2^k and
  both combine the two. Few rounds and one message each: for small buffers between many hosts.
* ``sharded``: SMDDP's balanced fusion buffer. Host h owns shard h of every chunk: the others send it
  their copy of shard h (reduce-scatter), h reduces it and sends the result back (all-gather). Per-link
  bytes 2(H-1)/H*S, the optimum, in 2 rounds of H-1 messages (H-1 rounds each from 64 KiB per peer, see
  below). Chunks are pipelined: each step sends chunk k's reduce-scatter parts together with chunk k-1's
  reduced shard, so both directions of every link stay busy.
* ``halving_doubling`` (Rabenseifner): the same optimal bytes in 2*log2(p) rounds of one message:
  reduce-scatter by recursive halving (round k: swap half of the current range with host v XOR p/2^(k+1)
  and combine the half kept), then all-gather by recursive doubling in reverse.
* ``ring``: the same optimal bytes passed around the ring of hosts (h sends only to h+1): 2(H-1) rounds,
  but every connection carries one continuous flow. Chosen for large buffers: in the other algorithms
  each connection idles while the others are used, and Linux restarts an idle connection's congestion
  window (net.ipv4.tcp_slow_start_after_idle=1, the default), which cost 25-35% of the link at 64 MB with
  H=3 (94% with the sysctl off, 65-74% with it on).

With H not a power of two, recursive_doubling and halving_doubling first fold the H-p extra hosts into
partners (host 2i+1 sends its buffer to host 2i, for i < H-p, which combines the two), run among p hosts,
and hand the result back to the extra hosts at the end.

The choice (``allreduce_algorithm``, in smddp_sdk/planning/selection.py, which the planner uses too): the ring once each of its rounds moves at least 512 KiB (H >= 3),
where its extra rounds cost little and continuous flows pay; otherwise the cheapest by an alpha-beta model
(``allreduce_cost``) counting rounds (one network latency each, ALPHA_BYTES), messages a host sends or
receives (MESSAGE_BYTES) and the bytes the busiest host sends. It gives oneshot for H=2 and for small
buffers, recursive_doubling above it between four or more hosts, sharded for medium buffers and
halving_doubling where sharded would need H-1 rounds; docs/collectives.md has the table.

AllGather (``allgather_algorithm``): ``oneshot`` (every block straight to every host; as permutation
rounds from 64 KiB per peer), ``bruck`` (ceil(log2 H) rounds; in round k host h sends the 2^k blocks it
has to h-2^k and receives h+2^k's, straight into their places, any H) and the ``ring``, by the same model.

Broadcast (``broadcast_algorithm``): ``binomial``, a tree rooted at the root's host, ceil(log2 H) rounds; in
the round of distance m (H's next power of two halved each round, down to 1) every host whose distance
v from the root (v = host - root mod H) is a multiple of 2m sends to v+m, which then holds the message. Or
``scatter_allgather`` (van de Geijn) for large messages: the same tree sends each receiver only the shards
of its subtree (v..v+m-1; shard v of H belongs to host v), then an all_gather of the shards as above. Every
host runs every round's exchange, empty when it sits the round out, so steps are numbered alike.

Rooted calls (broadcast, scatter, reduce, gather) are checked on both sides before data moves: their first
exchange between leaders reaches every peer both ways (``reaching_every_peer``: a byte where no data goes), so
every leader hears every other's call header. Otherwise two hosts that each think they hold the root would both
only send and return their own data, and a root host would not hear that a receiver expects another size or
dtype. Broadcast (and scatter, a broadcast) folds the check into its first tree round; reduce and gather, built
on all_reduce and all_gather, open with ``check_call``, an exchange of the check alone.

Exchanges with several peers run as H-1 permutation rounds (round r: host h sends to h+r and receives from
h-r) once a peer's part reaches 64 KiB, so each link carries one flow in each direction: when H-1 senders
converge on one receiver at once, their TCP flows overflow its link's queue and lose packets (measured: 66%
instead of 95% at 64 MB, H=3).

Bit-identical results on every rank: every shard is reduced along one fixed tree of hosts, the same
whichever host computes it, and reaches the others by copies. oneshot and sharded combine all H copies
in node order; the ring accumulates shard j from host j around to host j-1; recursive_doubling and
halving_doubling combine two partial results per step, always the one of the lower (virtual) host first,
so both partners of a step compute the same bits. ``SMDDP_ALLREDUCE_ALGO`` (auto or one of the names
above) forces one path: oneshot also forces the symmetric shared-memory step, the others the sharded one.
The native core (native/core/engine.cpp) runs the same algorithms with the same rules, byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.memory import copy_bytes, memview
from smddp_sdk.collectives.reduce import RedOpType, combine
from smddp_sdk.collectives.tcp import TcpMesh
from smddp_sdk.planning.selection import (
    ALL_REDUCE_ALGORITHMS,
    PIPELINE_CHUNK_BYTES,
    ROUNDS_FROM_BYTES,
    allgather_algorithm,
    allreduce_algorithm,
    broadcast_algorithm,
    ceil_log2,
    log2_floor,
)

ALGO_ENV = "SMDDP_ALLREDUCE_ALGO"
PIPELINE_CHUNK_ENV = "SMDDP_PIPELINE_CHUNK_BYTES"
ALGORITHMS = ("auto", *ALL_REDUCE_ALGORITHMS)
ONESHOT_CHUNK_BYTES = 16 << 20  # bounds the receive buffers of the other algorithms (per peer for oneshot)

Scratch = Callable[[int, int], torch.Tensor]  # (key, nbytes) -> reusable uint8 buffer
Views = dict[int, list[memoryview]]


def exchange_in_rounds(mesh: TcpMesh, node: int, hosts: int, sends: Views, recvs: Views, what: str, deadline: float) -> None:
    """mesh.exchange of every peer's buffers; large ones as permutation rounds (one flow per link direction)."""
    largest = max((sum(len(v) for v in views) for views in (*sends.values(), *recvs.values())), default=0)
    if hosts <= 2 or largest < ROUNDS_FROM_BYTES:
        mesh.exchange(sends, recvs, what, deadline)
        return
    for shift in range(1, hosts):
        to, source = (node + shift) % hosts, (node - shift) % hosts
        mesh.exchange({to: sends[to]} if to in sends else {}, {source: recvs[source]} if source in recvs else {}, what, deadline)


def _has_bytes(views: list[memoryview] | None) -> bool:
    return any(len(v) for v in views or ())


def reaching_every_peer(node: int, hosts: int, sends: Views, recvs: Views) -> tuple[Views, Views]:
    """sends and recvs plus a byte to and from every peer they leave out, so that the exchange carries a call
    header both ways between this leader and every other (tcp.py sends one only with bytes). The bytes from
    peers without data are received first: the Python path reads peers in order, and a check heard from every
    peer names a mismatch even when a peer that sends data has already failed and closed."""
    peers = [n for n in range(hosts) if n != node]
    checked_sends = {n: sends[n] if _has_bytes(sends.get(n)) else [memoryview(b"\1")] for n in peers}
    inboxes = {n: [memoryview(bytearray(1))] for n in peers if not _has_bytes(recvs.get(n))}
    return checked_sends, {**inboxes, **{n: views for n, views in recvs.items() if _has_bytes(views)}}


def checks_calls(mesh: TcpMesh) -> bool:
    """False where SMDDP_CHECK_CALLS=0 took the call header off (tcp.py: to measure what the check costs)."""
    return bool(mesh.header[0])


def check_call(mesh: TcpMesh, node: int, hosts: int, what: str, deadline: float) -> None:
    """An exchange of the call header alone between every two leaders: rooted calls whose data phase may not
    reach every peer both ways (reduce and gather, built on all_reduce and all_gather) open with it, so a root,
    size or dtype that differs between hosts fails on every host. A barrier between hosts is the same exchange."""
    mesh.exchange(*reaching_every_peer(node, hosts, {}, {}), what, deadline)


def folded_rank(node: int, hosts: int) -> int:
    """node's rank among the power of two of hosts left after the fold, or -1 for a host folded away
    (host 2i+1 for i < hosts - p folds into host 2i)."""
    extra = hosts - (1 << log2_floor(hosts))
    if node < 2 * extra:
        return -1 if node % 2 else node // 2
    return node - extra


def host_of_folded(rank: int, hosts: int) -> int:
    extra = hosts - (1 << log2_floor(hosts))
    return 2 * rank if rank < extra else rank + extra


def forced_algorithm() -> str:
    """The algorithm SMDDP_ALLREDUCE_ALGO forces, or "auto"; a clear error for anything else."""
    value = os.environ.get(ALGO_ENV, "auto").strip().lower() or "auto"
    if value not in ALGORITHMS:
        raise CollectiveError(f"{ALGO_ENV}={value!r} is not an allreduce algorithm; use one of {', '.join(ALGORITHMS)}")
    return value


def _positive_int_env(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) <= 0:
        raise CollectiveError(f"{name}={text!r} must be a positive number of bytes")
    return int(text)


def shard_bounds(numel: int, parts: int, index: int) -> tuple[int, int]:
    """Element range of shard ``index`` when numel is cut into ``parts`` near-equal shards."""
    base, extra = divmod(numel, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def allgather_between_hosts(mesh: TcpMesh, node: int, hosts: int, blocks: dict[int, list[memoryview]], what: str, deadline: float) -> None:
    """Every leader ends with every node's block (blocks[n]: views of node n's data, own filled in), by
    allgather_algorithm: all-to-all, bruck or the ring, every block received straight into its place."""
    peers = [n for n in range(hosts) if n != node]
    largest = max(sum(len(v) for v in views) for views in blocks.values())
    algorithm = allgather_algorithm(largest, hosts)
    if algorithm == "oneshot":
        exchange_in_rounds(mesh, node, hosts, {n: blocks[node] for n in peers}, {n: blocks[n] for n in peers}, what, deadline)
    elif algorithm == "bruck":
        distance = 1
        while distance < hosts:  # node holds blocks node .. node+distance-1; sends them back, gets the next
            count = min(distance, hosts - distance)
            sends = [view for i in range(count) for view in blocks[(node + i) % hosts]]
            recvs = [view for i in range(count) for view in blocks[(node + distance + i) % hosts]]
            mesh.exchange({(node - distance) % hosts: sends}, {(node + distance) % hosts: recvs}, what, deadline)
            distance *= 2
    else:
        to, source = (node + 1) % hosts, (node - 1) % hosts
        for s in range(hosts - 1):
            mesh.exchange({to: blocks[(node - s) % hosts]}, {source: blocks[(node - s - 1) % hosts]}, what, deadline)


def _stream_slice(views: list[memoryview], lo: int, hi: int) -> list[memoryview]:
    """Bytes lo..hi of the views' concatenation, as views."""
    parts, at = [], 0
    for view in views:
        start, stop = max(lo, at), min(hi, at + len(view))
        if start < stop:
            parts.append(view[start - at : stop - at])
        at += len(view)
    return parts


def broadcast_between_hosts(mesh: TcpMesh, node: int, hosts: int, root: int, data: list[memoryview], what: str, deadline: float) -> None:
    """Host root's data (uint8 views, filled on root) into every leader's, by broadcast_algorithm; the first
    round also checks the call with every peer (reaching_every_peer)."""
    nbytes = sum(len(v) for v in data)
    algorithm = broadcast_algorithm(nbytes, hosts)

    def part(first: int, stop: int) -> list[memoryview]:
        """What the subtree of hosts at distance first..stop-1 from the root receives."""
        if algorithm == "binomial":
            return data
        return _stream_slice(data, shard_bounds(nbytes, hosts, first)[0], shard_bounds(nbytes, hosts, stop - 1)[1])

    v = (node - root) % hosts
    m = 1 << ceil_log2(hosts)
    first = True
    while m > 1:
        m //= 2
        sends, recvs = {}, {}
        if v % (2 * m) == 0 and v + m < hosts:
            sends[(node + m) % hosts] = part(v + m, min(v + 2 * m, hosts))
        elif v % (2 * m) == m:
            recvs[(node - m) % hosts] = part(v, min(v + m, hosts))
        if first and checks_calls(mesh):  # the call's check rides on the first round: every leader hears every other's header
            sends, recvs = reaching_every_peer(node, hosts, sends, recvs)
        first = False
        mesh.exchange(sends, recvs, what, deadline)
    if algorithm == "scatter_allgather":
        blocks = {n: part((n - root) % hosts, (n - root) % hosts + 1) for n in range(hosts)}
        allgather_between_hosts(mesh, node, hosts, blocks, what, deadline)


class InterHostAllreduce:
    """AllReduce among node leaders over the TCP mesh (node index ``node`` of ``hosts``)."""

    def __init__(self, mesh: TcpMesh, node: int, hosts: int, scratch: Scratch) -> None:
        self.mesh = mesh
        self.node = node
        self.hosts = hosts
        self.peers = [n for n in range(hosts) if n != node]
        self._scratch = scratch
        self.pipeline_chunk_bytes = _positive_int_env(PIPELINE_CHUNK_ENV, PIPELINE_CHUNK_BYTES)

    def run(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float, forced: str = "auto") -> None:
        """In place over a flat contiguous tensor; op is already SUM for AVG (the caller divides)."""
        if x.numel() == 0:
            return
        nbytes = x.numel() * x.element_size()
        algorithm = allreduce_algorithm(nbytes, self.hosts, forced)
        if algorithm == "sharded":
            self.sharded(x, op, what, deadline)
            return
        run = getattr(self, algorithm)
        step = max(1, ONESHOT_CHUNK_BYTES // x.element_size())
        for start in range(0, x.numel(), step):
            run(x[start : start + step], op, what, deadline)

    def _buffer(self, key: int, like: torch.Tensor) -> torch.Tensor:
        return self._scratch(key, like.numel() * like.element_size()).view(like.dtype)

    def oneshot(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        received = {n: self._buffer(n, x) for n in self.peers}
        sends = {n: [memview(x)] for n in self.peers}
        exchange_in_rounds(self.mesh, self.node, self.hosts, sends, {n: [memview(received[n])] for n in self.peers}, what, deadline)
        sources = [x if n == self.node else received[n] for n in range(self.hosts)]
        if self.node == 0:
            combine(x, sources, op)  # x is sources[0]: in place
        else:
            result = self._buffer(-1, x)
            combine(result, sources, op)  # node order everywhere: bit-identical results
            copy_bytes(x, result)

    def sharded(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        """Pipelined reduce-scatter + all-gather: round k sends chunk k's shards and chunk k-1's result."""
        step = max(self.hosts, self.pipeline_chunk_bytes // x.element_size())
        chunks = [x[start : start + step] for start in range(0, x.numel(), step)]
        for k in range(len(chunks) + 1):
            sends: dict[int, list[memoryview]] = {n: [] for n in self.peers}
            recvs: dict[int, list[memoryview]] = {n: [] for n in self.peers}
            if k > 0:  # all-gather of the previous chunk: my reduced shard out, theirs in
                self._add_gather(chunks[k - 1], sends, recvs)
            staged: dict[int, torch.Tensor] = {}
            if k < len(chunks):  # reduce-scatter of this chunk: their parts of my shard in
                staged = self._add_scatter(chunks[k], k, sends, recvs)
            exchange_in_rounds(self.mesh, self.node, self.hosts, sends, recvs, what, deadline)
            if k < len(chunks):
                self._reduce_own_shard(chunks[k], staged, op)

    def _bounds(self, chunk: torch.Tensor, node: int) -> tuple[int, int]:
        return shard_bounds(chunk.numel(), self.hosts, node)

    def _add_gather(self, chunk: torch.Tensor, sends: dict, recvs: dict) -> None:
        lo, hi = self._bounds(chunk, self.node)
        for n in self.peers:
            sends[n].append(memview(chunk[lo:hi]))
            plo, phi = self._bounds(chunk, n)
            recvs[n].append(memview(chunk[plo:phi]))

    def _add_scatter(self, chunk: torch.Tensor, k: int, sends: dict, recvs: dict) -> dict[int, torch.Tensor]:
        lo, hi = self._bounds(chunk, self.node)
        staged = {}
        for n in self.peers:
            plo, phi = self._bounds(chunk, n)
            sends[n].append(memview(chunk[plo:phi]))
            # two scratch sets alternate between rounds: a round's buffers are free again two rounds later
            staged[n] = self._buffer(2 * self.hosts * (k & 1) + n + 1, chunk[lo:hi])
            recvs[n].append(memview(staged[n]))
        return staged

    def _reduce_own_shard(self, chunk: torch.Tensor, staged: dict[int, torch.Tensor], op: RedOpType) -> None:
        lo, hi = self._bounds(chunk, self.node)
        mine = chunk[lo:hi]
        sources = [mine if n == self.node else staged[n] for n in range(self.hosts)]
        if self.node == 0:
            combine(mine, sources, op)
        else:
            result = self._buffer(-1, mine)
            combine(result, sources, op)
            copy_bytes(mine, result)

    def ring(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        """Ring reduce-scatter then ring all-gather: host h sends to h+1 and receives from h-1 only.

        Shard j is accumulated along the ring from host j to host j-1 (its owner), always in the same order,
        then copied around: every host ends with bit-identical values. fp16/bf16 round once per hop."""
        if self.hosts == 1:
            return
        h, count = self.node, self.hosts
        to, source = (h + 1) % count, (h - 1) % count

        def shard(j: int) -> torch.Tensor:
            lo, hi = shard_bounds(x.numel(), count, j % count)
            return x[lo:hi]

        for s in range(count - 1):  # reduce-scatter: after step s, h holds shard h-s-1 summed over s+2 hosts
            outgoing, incoming = shard(h - s), shard(h - s - 1)
            staged = self._buffer(1, incoming)
            self.mesh.exchange({to: [memview(outgoing)]}, {source: [memview(staged)]}, what, deadline)
            combine(staged, [staged, incoming], op)  # the ring's order: earlier hosts first, then this one
            copy_bytes(incoming, staged)
        for s in range(count - 1):  # all-gather: pass the finished shards on (h finished shard h+1)
            self.mesh.exchange({to: [memview(shard(h + 1 - s))]}, {source: [memview(shard(h - s))]}, what, deadline)

    def _exchange_with(self, peer: int, send: torch.Tensor, receive: torch.Tensor, what: str, deadline: float) -> None:
        self.mesh.exchange({peer: [memview(send)]}, {peer: [memview(receive)]}, what, deadline)

    def _combine_pair(self, mine: torch.Tensor, theirs: torch.Tensor, op: RedOpType, mine_first: bool) -> None:
        """mine = the two partial results combined, the lower host's first (theirs is scratch)."""
        if mine_first:
            combine(mine, [mine, theirs], op)
        else:
            combine(theirs, [theirs, mine], op)
            copy_bytes(mine, theirs)

    def _folded(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float, among: Callable[[int, int], None], steps: int) -> None:
        """Fold the extra hosts into their partners, run among(rank, p) on the p hosts left (steps
        exchanges), hand the result back. Hosts count the exchanges they sit out, so that every host
        numbers the call's steps alike (tcp.py's header check)."""
        rank, p = folded_rank(self.node, self.hosts), 1 << log2_floor(self.hosts)
        if rank < 0:
            self.mesh.exchange({self.node - 1: [memview(x)]}, {}, what, deadline)
            self.mesh.skip(steps)
            self.mesh.exchange({}, {self.node - 1: [memview(x)]}, what, deadline)
            return
        partnered = self.node < 2 * (self.hosts - p)  # an extra host folds into this one
        if partnered:
            staged = self._buffer(1, x)
            self.mesh.exchange({}, {self.node + 1: [memview(staged)]}, what, deadline)
            combine(x, [x, staged], op)  # host order: the pair's lower host first
        elif self.hosts > p:
            self.mesh.skip(1)
        among(rank, p)
        if partnered:
            self.mesh.exchange({self.node + 1: [memview(x)]}, {}, what, deadline)
        elif self.hosts > p:
            self.mesh.skip(1)

    def recursive_doubling(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        """log2(p) rounds: swap the whole buffer with the host at distance 1, 2, 4, ... and combine."""

        def among(rank: int, p: int) -> None:
            staged = self._buffer(1, x)
            distance = 1
            while distance < p:
                partner = rank ^ distance
                self._exchange_with(host_of_folded(partner, self.hosts), x, staged, what, deadline)
                self._combine_pair(x, staged, op, rank < partner)
                distance *= 2

        self._folded(x, op, what, deadline, among, log2_floor(self.hosts))

    def halving_doubling(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        """Rabenseifner: reduce-scatter by recursive halving (host rank ends with shard rank of p, reduced),
        then all-gather by recursive doubling."""

        def span(first: int, stop: int) -> torch.Tensor:  # shards first..stop-1 of p
            p = 1 << log2_floor(self.hosts)
            return x[shard_bounds(x.numel(), p, first)[0] : shard_bounds(x.numel(), p, stop - 1)[1]]

        def among(rank: int, p: int) -> None:
            first, stop = 0, p
            half = p // 2
            while half:  # keep the half of first..stop that rank's bit selects, send the other
                partner, middle = rank ^ half, first + half
                keep, give = ((middle, stop), (first, middle)) if rank & half else ((first, middle), (middle, stop))
                kept = span(*keep)
                staged = self._buffer(1, kept)
                self._exchange_with(host_of_folded(partner, self.hosts), span(*give), staged, what, deadline)
                self._combine_pair(kept, staged, op, rank < partner)
                first, stop = keep
                half //= 2
            size = 1
            while size < p:  # all-gather: swap the finished ranges, doubling them
                partner = rank ^ size
                their_first = first ^ size
                self._exchange_with(host_of_folded(partner, self.hosts), span(first, stop), span(their_first, their_first + size), what, deadline)
                first = min(first, their_first)
                stop = first + 2 * size
                size *= 2

        self._folded(x, op, what, deadline, among, 2 * log2_floor(self.hosts))
