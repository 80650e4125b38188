"""Intra-host algorithms over the shared-memory arena.

Each method moves at most ``slot_bytes`` per rank per phase; larger messages are cut into chunks by the
caller (allreduce) or here (allgather, broadcast). A host with one rank needs no arena: every method then
only copies what it must.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from smddp_sdk.collectives.memory import copy_bytes
from smddp_sdk.collectives.reduce import RedOpType, combine, native_codes, reduce_into_copies
from smddp_sdk.collectives.shm import ShmArena

# below this many bytes every rank reduces the whole message itself: one barrier instead of two
SYMMETRIC_LIMIT = 256 << 10
# ... and this many where the host's ranks outnumber its cores: there every rank reducing everything is
# n times the work on fewer cores, and a second barrier costs a yield, not a wake-up (4 ranks on 2 cores,
# 2-3 runs each: 64 KB 114 -> 90 us, 256 KB 367 -> 260 us; 8 and 16 KB even)
CROWDED_SYMMETRIC_LIMIT = 8 << 10


def symmetric_limit(arena: ShmArena) -> int:
    """Up to how many bytes an all_reduce chunk of this host is symmetric (the native core's rule too)."""
    return CROWDED_SYMMETRIC_LIMIT if arena.crowded else SYMMETRIC_LIMIT
# zero-copy reductions work through their shard in blocks this size, so that the combine, the scaling
# and the copies to the peers reread the block from L2 instead of memory (3.8 -> 2.8 ms for a 21 MB
# fp32 shard of two ranks here)
BLOCK_BYTES = 512 << 10
# from this many bytes (the largest rank's part) an all_gather or a one-buffer broadcast reads the peers'
# memory directly (ShmArena.single_copy_read): one copy instead of two through the slots
SINGLE_COPY_FROM = 1 << 20
# ... up to this many bytes of gathered result (all ranks' parts). From here an all_gather copies through
# the slots again, the native core with non-temporal stores (native/core/engine.cpp's stream_copy): the kernel pins
# the peer's 4 KB pages one by one, so a read costs about two memcpys (32 MB: 7.0 ms of CPU, memcpy 3.8),
# while the slots stay in cache and only the result goes to memory (64 MB here: 13.4 ms of CPU for both
# ranks against 17.6 single copy; at 16 MB the two were even).
STREAMED_FROM = 32 << 20

Segment = tuple[int, int, int]  # (buffer index, byte offset, byte length)
OwnSource = tuple[int, int, torch.Tensor]  # elements start:stop of this rank's shard, held by the tensor


def plan_chunks(lengths: Sequence[int], chunk_bytes: int) -> list[list[Segment]]:
    """Pack a stream of buffers into chunks of at most chunk_bytes, splitting buffers where needed."""
    chunks: list[list[Segment]] = []
    current: list[Segment] = []
    room = chunk_bytes
    for index, length in enumerate(lengths):
        offset = 0
        while offset < length:
            take = min(room, length - offset)
            current.append((index, offset, take))
            offset += take
            room -= take
            if room == 0:
                chunks.append(current)
                current, room = [], chunk_bytes
    if current:
        chunks.append(current)
    return chunks


def shard_bounds(numel: int, parts: int, index: int) -> tuple[int, int]:
    base, extra = divmod(numel, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _segments(start: int, stop: int, own: Sequence[OwnSource]) -> list[tuple[int, int, torch.Tensor | None]]:
    """start:stop cut where the own sources begin and end; None where the data is in place already."""
    segments: list[tuple[int, int, torch.Tensor | None]] = []
    at = start
    for first, last, source in sorted(own, key=lambda item: item[0]):
        if at < first:
            segments.append((at, first, None))
        segments.append((first, last, source.reshape(-1)))
        at = last
    if at < stop:
        segments.append((at, stop, None))
    return segments


class LocalComm:
    """The ranks of one host: n, this rank's index, and the arena when n > 1."""

    def __init__(self, arena: ShmArena | None) -> None:
        self.arena = arena
        self.n = arena.n if arena else 1
        self.index = arena.index if arena else 0

    @property
    def chunk_bytes(self) -> int:
        return self.arena.slot_bytes if self.arena else 1 << 62

    def barrier(self, what: str, deadline: float) -> None:
        if self.arena:
            self.arena.barrier(what, deadline)

    def allreduce_chunk(self, x: torch.Tensor, op: RedOpType, what: str, deadline: float, forced: str = "auto") -> None:
        """In place over a flat contiguous tensor of at most chunk_bytes; identical result on every rank.

        ``forced`` ("auto", "oneshot" or "sharded", see algorithms.py) overrides the choice by size."""
        arena = self.arena
        if arena is None or x.numel() == 0:
            return
        nbytes = x.numel() * x.element_size()
        half = arena.next_half()
        symmetric = nbytes <= symmetric_limit(arena) if forced == "auto" else forced == "oneshot"
        if symmetric and arena.native:
            codes = native_codes(x.dtype, op)
            if codes is not None and arena.allreduce_small(x, codes, half, what, deadline):
                return
            if codes is not None:  # barrier done, reduction left to us
                combine(x, [arena.slot(i, half)[:nbytes].view(x.dtype) for i in range(self.n)], op)
                return
        views = [arena.slot(i, half)[:nbytes].view(x.dtype) for i in range(self.n)]
        if symmetric or x.numel() < self.n:
            copy_bytes(views[self.index], x)
            arena.barrier(what, deadline)
            combine(x, views, op)  # every rank reduces everything: same sources, same order everywhere
            return
        mine = views[self.index]
        for i in range(self.n):
            if i != self.index:  # stage only the shards the peers reduce
                lo, hi = shard_bounds(x.numel(), self.n, i)
                copy_bytes(mine[lo:hi], x[lo:hi])
        arena.barrier(what, deadline)
        self._sharded_allreduce(x, views, op, what, deadline)

    def _sharded_allreduce(self, x: torch.Tensor, views: list[torch.Tensor], op: RedOpType, what: str, deadline: float) -> None:
        """Balanced fusion buffer: rank i reduces shard i for everyone, then all read every shard.

        Only the shards peers reduce are staged in shared memory; the own shard is read straight from x
        and its result written to the own slot (for peers) and back into x.
        """
        assert self.arena is not None
        bounds = [shard_bounds(x.numel(), self.n, i) for i in range(self.n)]
        start, stop = bounds[self.index]
        sources = [x[start:stop] if i == self.index else v[start:stop] for i, v in enumerate(views)]
        result = views[self.index][start:stop]  # not staged above, so free to hold the result
        combine(result, sources, op)  # rank order: same on every rank
        copy_bytes(x[start:stop], result)
        self.arena.barrier(what, deadline)
        for i, (lo, hi) in enumerate(bounds):
            if i != self.index:
                copy_bytes(x[lo:hi], views[i][lo:hi])

    def allreduce_views(self, views: Sequence[torch.Tensor], op: RedOpType, average: bool, what: str, deadline: float, own: Sequence[OwnSource] = ()) -> None:
        """In place over every local rank's own copy of a tensor, each mapped here (``views``, local order).

        Zero-copy: rank i reads shard i of every copy, reduces it once and writes the result into every
        copy, so no data passes through the arena's slots and each shard has exactly one writer (every
        rank ends with the same bits). ``average`` divides by the local rank count before the writes.
        The copies must be complete when the call starts (the first barrier publishes them), except that
        ``own`` may supply parts of this rank's shard from elsewhere: (start, stop, tensor) says that
        elements start:stop of this rank's data are in tensor, not yet in its copy. Peers never read
        this rank's shard, so it need not be staged; the result lands in the copy all the same.
        """
        self.barrier(what, deadline)
        mine = views[self.index]
        start, stop = shard_bounds(mine.numel(), self.n, self.index)
        op = RedOpType.AVG if average else op  # combine's AVG divides by its sources: the host's ranks
        block = max(1, BLOCK_BYTES // mine.element_size())
        for first, last, source in _segments(start, stop, own):
            own_part = mine[first:last] if source is None else source
            reduce_into_copies([view[first:last] for view in views], self.index, own_part, op, block)
        self.barrier(what, deadline)  # every shard written everywhere before anyone reads the result

    def reduce_scatter(self, x: torch.Tensor, out: torch.Tensor, op: RedOpType, what: str, deadline: float) -> None:
        """out (k elements) = this rank's segment of the reduction of x (n*k elements) over local ranks.

        Each rank stages only the segments its peers own, then reduces its own segment straight into
        out: one barrier per chunk and no copy-out phase.
        """
        k = out.numel()
        arena = self.arena
        if arena is None:
            copy_bytes(out, x[self.index * k : (self.index + 1) * k])
            return
        step = max(1, arena.slot_bytes // (self.n * x.element_size()))
        for c in range(0, k, step):
            length = min(step, k - c)
            half = arena.next_half()
            views = [arena.slot(i, half)[: self.n * length * x.element_size()].view(x.dtype) for i in range(self.n)]
            for j in range(self.n):
                if j != self.index:
                    copy_bytes(views[self.index][j * length : (j + 1) * length], x[j * k + c : j * k + c + length])
            arena.barrier(what, deadline)
            own = self.index * k + c
            sources = [x[own : own + length] if i == self.index else v[self.index * length : (self.index + 1) * length] for i, v in enumerate(views)]
            combine(out[c : c + length], sources, op)  # rank order: same result whichever rank computes it

    def allgather(self, mine: torch.Tensor, outs: Sequence[torch.Tensor], what: str, deadline: float) -> None:
        """outs[i] (uint8, this host's ranks in order) receives local rank i's bytes; sizes may differ."""
        if outs[self.index].data_ptr() != mine.data_ptr():
            copy_bytes(outs[self.index], mine)
        arena = self.arena
        if arena is None:
            return
        longest = max(o.numel() for o in outs)
        reads = [(i, out) for i, out in enumerate(outs) if i != self.index and out.numel()]
        single = longest >= SINGLE_COPY_FROM and sum(o.numel() for o in outs) < STREAMED_FROM
        if single and arena.single_copy and arena.single_copy_read(mine, reads, what, deadline):
            return
        step = arena.slot_bytes
        for start in range(0, longest, step):
            half = arena.next_half()
            piece = mine[start : start + step]
            copy_bytes(arena.slot(self.index, half), piece)
            arena.barrier(what, deadline)
            for i, out in enumerate(outs):
                if i != self.index and start < out.numel():
                    target = out[start : start + step]
                    copy_bytes(target, arena.slot(i, half)[: target.numel()])

    def broadcast(self, root: int, buffers: Sequence[torch.Tensor], what: str, deadline: float) -> None:
        """Every local rank's uint8 buffers receive local rank root's, packed into as few phases as fit."""
        arena = self.arena
        if arena is None:
            return
        if len(buffers) == 1 and buffers[0].numel() >= SINGLE_COPY_FROM and arena.single_copy:
            reads = [] if self.index == root else [(root, buffers[0])]
            if arena.single_copy_read(buffers[0], reads, what, deadline):
                return
        for chunk in plan_chunks([b.numel() for b in buffers], arena.slot_bytes):
            half = arena.next_half()
            slot = arena.slot(root, half)
            if self.index == root:
                self._pack(slot, chunk, buffers)
            arena.barrier(what, deadline)
            if self.index != root:
                self._unpack(slot, chunk, buffers)

    @staticmethod
    def _pack(slot: torch.Tensor, chunk: list[Segment], buffers: Sequence[torch.Tensor]) -> None:
        at = 0
        for index, offset, length in chunk:
            copy_bytes(slot[at : at + length], buffers[index][offset : offset + length])
            at += length

    @staticmethod
    def _unpack(slot: torch.Tensor, chunk: list[Segment], buffers: Sequence[torch.Tensor]) -> None:
        at = 0
        for index, offset, length in chunk:
            copy_bytes(buffers[index][offset : offset + length], slot[at : at + length])
            at += length
