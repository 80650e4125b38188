"""AllReduce algorithm choice, and the inter-host AllReduce algorithms between node leaders.

Two inter-host algorithms (H = number of hosts, S = buffer bytes):

* ``oneshot``: every leader sends its whole buffer to every other and all reduce everything, in node order.
  One round, so the best for small messages; per-link bytes (H-1)*S, which equals the optimum for H=2.
* ``sharded``: SMDDP's balanced fusion buffer. Host h owns shard h of every chunk: the others send it
  their copy of shard h (reduce-scatter), h reduces it and sends the result back (all-gather). Per-link
  bytes 2(H-1)/H*S, the optimum. Chunks are pipelined: each step sends chunk k's reduce-scatter parts
  together with chunk k-1's reduced shard, so both directions of every link stay busy.

* ``ring``: the same reduce-scatter + all-gather bytes, passed around the ring of hosts (h sends only to
  h+1): 2(H-1) steps instead of 2, but every connection carries one continuous flow. The default for large
  messages with 3+ hosts: in the all-to-all rounds each connection idles while the others are used, and
  Linux restarts an idle connection's congestion window (net.ipv4.tcp_slow_start_after_idle=1, the
  default), which cost 25-35% of the link at 64 MB with H=3 (94% with the sysctl off, 65-74% with it on).

Exchanges with several peers run as H-1 permutation rounds (round r: host h sends to h+r and receives from
h-r), so each link carries one flow in each direction: when H-1 senders converge on one receiver at once,
their TCP flows overflow its link's queue and lose packets (measured: 66% instead of 95% at 64 MB, H=3).

Every shard is reduced by exactly one host, in node order, so all ranks get bit-identical results.
``SMDDP_ALLREDUCE_ALGO`` (auto, oneshot, sharded, ring) forces one path: oneshot also forces the
symmetric shared-memory step, sharded and ring the sharded shared-memory step.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.memory import copy_bytes, memview
from smddp_sdk.collectives.reduce import RedOpType, combine
from smddp_sdk.collectives.tcp import TcpMesh

ALGO_ENV = "SMDDP_ALLREDUCE_ALGO"
PIPELINE_CHUNK_ENV = "SMDDP_PIPELINE_CHUNK_BYTES"
ALGORITHMS = ("auto", "oneshot", "sharded", "ring")
INTER_HOST_ONESHOT_LIMIT = 32 << 10  # above this, H >= 3 hosts shard (fewer bytes beat one round)
INTER_HOST_RING_FROM = 1 << 20  # from this size, H >= 3 hosts use the ring (continuous flows beat fewer steps)
PIPELINE_CHUNK_BYTES = 16 << 20  # per step of the sharded pipeline: fewer steps, fewer gaps on the link
ONESHOT_CHUNK_BYTES = 16 << 20  # bounds the per-peer receive buffers of oneshot
ROUNDS_FROM_BYTES = 64 << 10  # exchanges at least this large per peer run as permutation rounds

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


def inter_host_algorithm(nbytes: int, hosts: int, forced: str) -> str:
    if forced != "auto":
        return forced
    # with two hosts both move S per link direction; oneshot does it in one round
    if hosts == 2 or nbytes <= INTER_HOST_ONESHOT_LIMIT:
        return "oneshot"
    return "ring" if nbytes >= INTER_HOST_RING_FROM else "sharded"


def allgather_between_hosts(mesh: TcpMesh, node: int, hosts: int, blocks: dict[int, list[memoryview]], what: str,
                            deadline: float) -> None:
    """Every leader ends with every node's block (blocks[n]: views of node n's data, own filled in).

    All-to-all (in permutation rounds when large) for small data; for large data with 3+ hosts the ring,
    whose connections each carry one continuous flow (see the module docstring)."""
    peers = [n for n in range(hosts) if n != node]
    largest = max(sum(len(v) for v in views) for views in blocks.values())
    if hosts <= 2 or largest < INTER_HOST_RING_FROM:
        exchange_in_rounds(mesh, node, hosts, {n: blocks[node] for n in peers}, {n: blocks[n] for n in peers}, what, deadline)
        return
    to, source = (node + 1) % hosts, (node - 1) % hosts
    for s in range(hosts - 1):
        mesh.exchange({to: blocks[(node - s) % hosts]}, {source: blocks[(node - s - 1) % hosts]}, what, deadline)


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
        algorithm = inter_host_algorithm(nbytes, self.hosts, forced)
        if algorithm in ("oneshot", "ring"):
            run = self.oneshot if algorithm == "oneshot" else self.ring
            step = max(1, ONESHOT_CHUNK_BYTES // x.element_size())
            for start in range(0, x.numel(), step):
                run(x[start:start + step], op, what, deadline)
        else:
            self.sharded(x, op, what, deadline)

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
        chunks = [x[start:start + step] for start in range(0, x.numel(), step)]
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
