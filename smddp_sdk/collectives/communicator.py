"""Group-wide primitives built from the intra-host (shared memory) and inter-host (TCP) transports.

Every torch collective maps onto four primitives: allreduce of a flat tensor, allgather of byte buffers,
broadcast of byte buffers and barrier. Across hosts they are hierarchical: the host's ranks combine over
shared memory, the node leaders exchange over TCP, and the leader hands the result back over shared
memory. Per-size algorithm choice lives in LocalComm (symmetric vs. sharded allreduce) so that new
algorithms and transports slot in here without touching the ProcessGroup.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence

import torch

from smddp_sdk.collectives.algorithms import (
    ALGORITHMS,
    ONESHOT_CHUNK_BYTES,
    InterHostAllreduce,
    allgather_between_hosts,
    broadcast_between_hosts,
    check_call,
    checks_calls,
    forced_algorithm,
)
from smddp_sdk.collectives.calls import Call
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.local import LocalComm, OwnSource
from smddp_sdk.collectives.memory import copy_bytes, memview
from smddp_sdk.collectives.reduce import HALF_TYPES, RedOpType, finish_average
from smddp_sdk.collectives.shm import ShmUnavailable, allocate_file, map_file, shm_dir
from smddp_sdk.collectives.tcp import TcpMesh
from smddp_sdk.collectives.topology import Topology
from smddp_sdk.planning.selection import ALPHA_BYTES, MESSAGE_BYTES, PIPELINE_CHUNK_BYTES, RING_ROUND_BYTES, ROUNDS_FROM_BYTES

PATH_BYTES = 4096  # a shared-region file name travels between local ranks in a buffer of this size


class Communicator:
    """One group's transports plus the failure state: after a failure every later call fails fast."""

    def __init__(self, topo: Topology, local: LocalComm, mesh: TcpMesh | None, timeout_s: float) -> None:
        self.topo = topo
        self.local = local
        self.mesh = mesh
        self.timeout_s = timeout_s
        self._failure: str | None = None
        self._forced = ""
        self._scratch: dict[int, torch.Tensor] = {}
        self._inter_host = InterHostAllreduce(mesh, topo.node, len(topo.nodes), self._scratch_for) if mesh else None

    # lifecycle ----------------------------------------------------------------------------------------
    def deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def check_usable(self, what: str) -> None:
        if self._failure:
            raise CollectiveError(f"smddp {what}: the process group is unusable after an earlier failure: {self._failure}")

    def fail(self, message: str) -> None:
        """Record the failure and tell local and remote peers, so they stop waiting for us."""
        if self._failure:
            return
        self._failure = message
        if self.local.arena:
            self.local.arena.post_abort(message)
        if self.mesh:
            self.mesh.close()

    def close(self) -> None:
        if self.mesh:
            self.mesh.close(farewell=self._failure is None)
        if self.local.arena:
            self.local.arena.close()

    def _forced_algorithm(self) -> str:
        """SMDDP_ALLREDUCE_ALGO, read once it is valid (an invalid value fails every call that needs it)."""
        self._forced = forced_algorithm()
        return self._forced

    def begin(self, call: Call) -> None:
        """Number and tag the collective about to run, so that ranks check they agree on it: in the host's
        barriers and, between hosts, in the header of every exchange."""
        if self.local.arena:
            self.local.arena.begin(call)
        if self.mesh:
            self.mesh.begin(call)

    @property
    def multi_node(self) -> bool:
        return len(self.topo.nodes) > 1

    def _scratch_for(self, key: int, nbytes: int) -> torch.Tensor:
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = torch.zeros(nbytes, dtype=torch.uint8)  # zeroed once: pre-faulted for reuse
            self._scratch[key] = buf
        return buf[:nbytes]

    def inter_host_rules(self, forced: str) -> tuple[int, ...]:
        """algorithms.py's rules (the model's alpha and message bytes, ring round, oneshot chunk, pipeline
        chunk, rounds from, the forced algorithm's index in ALGORITHMS) for the native core, which runs the
        same algorithms."""
        pipeline = self._inter_host.pipeline_chunk_bytes if self._inter_host else PIPELINE_CHUNK_BYTES
        return (ALPHA_BYTES, MESSAGE_BYTES, RING_ROUND_BYTES, ONESHOT_CHUNK_BYTES, pipeline, ROUNDS_FROM_BYTES, ALGORITHMS.index(forced))

    # primitives ---------------------------------------------------------------------------------------
    def allreduce(self, x: torch.Tensor, op: RedOpType, what: str) -> None:
        """In place over a flat contiguous tensor; bit-identical on every rank.

        Hierarchical: the host's ranks reduce over shared memory, the node leaders reduce between hosts
        (algorithms.py), the leader shares the result over shared memory. A host without an arena hands
        the whole buffer to the inter-host step, which pipelines its own chunks.
        """
        if self.multi_node and x.dtype in HALF_TYPES and op in (RedOpType.SUM, RedOpType.AVG, RedOpType.PRODUCT):
            # partial results cross hosts in fp32, so the result is rounded once, as on one host
            wide = x.float()
            self.allreduce(wide, op, what)
            x.copy_(wide)
            return
        deadline = self.deadline()
        forced = self._forced or self._forced_algorithm()
        combine_op = RedOpType.SUM if op == RedOpType.AVG else op
        chunk_bytes = self.local.chunk_bytes if self.local.arena else 1 << 62
        numel = x.numel()
        step = max(1, chunk_bytes // x.element_size())
        for start in range(0, numel, step):
            piece = x if numel <= step else x[start : start + step]  # no slice op for a one-chunk call
            self.local.allreduce_chunk(piece, combine_op, what, deadline, forced)
            if self.multi_node:
                if self.topo.is_leader:
                    self._inter_host.run(piece, combine_op, what, deadline, forced)
                self.local.broadcast(0, [piece.view(torch.uint8)], what, deadline)
        if op == RedOpType.AVG:
            finish_average(x, op, self.topo.size)

    def shared_region(self, nbytes: int, what: str) -> list[torch.Tensor] | None:
        """Collective over the group: a buffer of nbytes per rank that the host's ranks all map.

        Returns the host's buffers as uint8 tensors in local order (this rank's at local.index), or None
        when there is no arena on this host or any local rank could not allocate its file (every local
        rank then returns None, so they agree). The files are unlinked as soon as all are mapped.
        """
        if self.local.arena is None:
            return None
        path = ""
        try:
            path = allocate_file(nbytes, shm_dir())
        except ShmUnavailable as exc:
            warnings.warn(f"smddp: no shared fusion buffer on this host, reducing through the arena: {exc}", RuntimeWarning, stacklevel=3)
        encoded = path.encode()
        name = torch.zeros(PATH_BYTES, dtype=torch.uint8)
        name[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
        names = [torch.zeros(PATH_BYTES, dtype=torch.uint8) for _ in range(self.local.n)]
        deadline = self.deadline()
        try:
            self.local.allgather(name, names, what, deadline)
            paths = [bytes(n.numpy()).rstrip(b"\0").decode() for n in names]
            buffers = [map_file(p, nbytes) for p in paths] if all(paths) else None
            self.local.barrier(what, deadline)
        finally:
            if path:
                os.unlink(path)
        return buffers

    def allreduce_shared(
        self, buffers: Sequence[torch.Tensor], op: RedOpType, what: str, own: Sequence[OwnSource] = (), native_between_hosts: Callable[[torch.Tensor, int], bool] | None = None
    ) -> None:
        """In place over the host's copies of a tensor (from shared_region, same slice and dtype on each).

        The host reduces without copies (LocalComm.allreduce_views, which also explains ``own``); with
        several hosts the leader then runs the inter-host algorithm on its copy (in the native core where
        native_between_hosts(tensor, op) takes it) and the host's other ranks read the result from it.
        """
        deadline = self.deadline()
        combine_op = RedOpType.SUM if op == RedOpType.AVG else op
        average = op == RedOpType.AVG and not self.multi_node
        self.local.allreduce_views(buffers, combine_op, average, what, deadline, own)
        if not self.multi_node:
            return
        mine = buffers[self.local.index]
        if self.topo.is_leader:
            if not (native_between_hosts and native_between_hosts(mine, int(combine_op))):
                self._inter_host.run(mine, combine_op, what, deadline, forced_algorithm())
            finish_average(mine, op, self.topo.size)
        self.local.barrier(what, deadline)
        if not self.topo.is_leader:
            copy_bytes(mine, buffers[0])
        self.local.barrier(what, deadline)  # the leader's copy stays untouched until everyone has read it

    def reduce_scatter(self, x: torch.Tensor, out: torch.Tensor, op: RedOpType, what: str) -> None:
        """out = this rank's equal segment of the reduction of flat x; x may be clobbered."""
        combine_op = RedOpType.SUM if op == RedOpType.AVG else op
        overlaps = x.data_ptr() < out.data_ptr() + out.numel() * out.element_size() and out.data_ptr() < x.data_ptr() + x.numel() * x.element_size()
        if self.multi_node or overlaps:  # hierarchical path: reduce everything (AVG divided where it is rounded), keep own segment
            self.allreduce(x, op, what)
            k = out.numel()
            copy_bytes(out, x[self.topo.rank * k : (self.topo.rank + 1) * k])
            return
        self.local.reduce_scatter(x, out, combine_op, what, self.deadline())
        finish_average(out, op, self.topo.size)

    def allgather(self, mine: torch.Tensor, outs: Sequence[torch.Tensor], what: str) -> None:
        """outs[r] (uint8, by group rank) receives rank r's bytes; every rank knows every size."""
        deadline = self.deadline()
        local_ranks = self.topo.local_ranks
        self.local.allgather(mine, [outs[r] for r in local_ranks], what, deadline)
        if not self.multi_node:
            return
        remote = [r for r in range(self.topo.size) if self.topo.node_of[r] != self.topo.node]
        if self.topo.is_leader:
            blocks = {n: [memview(outs[r]) for r in ranks] for n, ranks in enumerate(self.topo.nodes)}
            allgather_between_hosts(self.mesh, self.topo.node, len(self.topo.nodes), blocks, what, deadline)
        self.local.broadcast(0, [outs[r] for r in remote], what, deadline)

    def all_to_all(self, table: list[list[int]], sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor], what: str) -> None:
        """recvs[r] (uint8, by group rank) receives what rank r sends this rank; sends[r] goes to rank r;
        table[s][d]: the bytes rank s sends rank d, the same on every rank.

        Within the host every rank's whole input reaches every local rank; between hosts the leaders
        exchange pairwise (round k: to host h+k, from host h-k) what this host's ranks send the other
        host's, in (source, target) rank order; the leader hands what it received to the host's ranks
        (from each host in order, the same order). The native core runs the same steps."""
        deadline = self.deadline()
        topo, me = self.topo, self.topo.rank
        mine = torch.cat(list(sends)) if sends else torch.empty(0, dtype=torch.uint8)
        blobs = {r: mine if r == me else torch.empty(sum(table[r]), dtype=torch.uint8) for r in topo.local_ranks}
        self.local.allgather(mine, [blobs[r] for r in topo.local_ranks], what, deadline)

        def part(source: int, target: int) -> torch.Tensor:
            start = sum(table[source][:target])
            return blobs[source][start : start + table[source][target]]

        for source in topo.local_ranks:
            copy_bytes(recvs[source], part(source, me))
        if not self.multi_node:
            return
        others = [h for h in range(len(topo.nodes)) if h != topo.node]
        incoming = {h: sum(table[s][d] for s in topo.nodes[h] for d in topo.local_ranks) for h in others}
        inbox = torch.empty(sum(incoming.values()), dtype=torch.uint8)
        boxes = dict(zip(others, inbox.split(list(incoming.values()))))
        if topo.is_leader:
            hosts = len(topo.nodes)
            for shift in range(1, hosts):
                to, source = (topo.node + shift) % hosts, (topo.node - shift) % hosts
                out = [memview(part(s, d)) for s in topo.local_ranks for d in topo.nodes[to]]
                self.mesh.exchange({to: out}, {source: [memview(boxes[source])]}, what, deadline)
        self.local.broadcast(0, [inbox], what, deadline)
        for h in others:
            pairs = [(s, d) for s in topo.nodes[h] for d in topo.local_ranks]
            for (s, d), piece in zip(pairs, boxes[h].split([table[s][d] for s, d in pairs])):
                if d == me:
                    copy_bytes(recvs[s], piece)

    def broadcast(self, root: int, buffers: Sequence[torch.Tensor], what: str) -> None:
        """Every rank's uint8 buffers receive the root's."""
        deadline = self.deadline()
        root_node = self.topo.node_of[root]
        in_root_node = self.topo.node == root_node
        if in_root_node:
            self.local.broadcast(self.topo.local_ranks.index(root), buffers, what, deadline)
        if not self.multi_node:
            return
        if self.topo.is_leader:
            broadcast_between_hosts(self.mesh, self.topo.node, len(self.topo.nodes), root_node, [memview(b) for b in buffers], what, deadline)
        if not in_root_node:
            self.local.broadcast(0, buffers, what, deadline)
        else:  # the root's host waits for its leader's check with the other hosts, so that a mismatch fails every rank
            self.local.barrier(what, deadline)

    def check_between_hosts(self, what: str) -> None:
        """The leaders check the call with each other before data moves (algorithms.check_call): for reduce and
        gather, whose all_reduce and all_gather may not reach every host both ways. The host's other ranks wait
        for their leader's result later in the call, so they fail with it."""
        if self.multi_node and self.topo.is_leader and checks_calls(self.mesh):
            check_call(self.mesh, self.topo.node, len(self.topo.nodes), what, self.deadline())

    def barrier(self, what: str) -> None:
        deadline = self.deadline()
        self.local.barrier(what, deadline)
        if self.multi_node:
            if self.topo.is_leader:
                check_call(self.mesh, self.topo.node, len(self.topo.nodes), what, deadline)
            self.local.barrier(what, deadline)
