"""Who is where: ranks grouped into nodes (one shared-memory arena each) through the group's store.

Nothing read from the store is trusted: every value is verified with the job's secret (store_values.py)
and the arena's name is derived from it, never read.

Host identity comes from the runtime's environment (SM_CURRENT_HOST), so two simulated hosts on one machine
still talk TCP between them; without it the machine's hostname is used. A host whose shared memory cannot
hold an arena (or SMDDP_TRANSPORT=tcp) turns each of its ranks into a node of its own, reached over TCP.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.hangs import HangWatch
from smddp_sdk.collectives.local import LocalComm
from smddp_sdk.collectives.shm import (
    DEFAULT_SLOT_BYTES,
    ONE_HOST_SLOT_BYTES,
    Peer,
    ShmArena,
    ShmUnavailable,
    arena_bytes,
    create_arena,
    open_segment,
    shm_dir,
    unlink_own,
)
from smddp_sdk.collectives.store_values import KEY_PREFIX as _KEY
from smddp_sdk.collectives.store_values import StoreValues
from smddp_sdk.collectives.tcp import TcpMesh, new_token
from smddp_sdk.specs.contract import HOST_ADDRESSES_ENV, MESH_SECRET_ENV
from smddp_sdk.specs.processes import pid_alive

HOST_ENV = "SM_CURRENT_HOST"
TRANSPORT_ENV = "SMDDP_TRANSPORT"  # "auto" (default) or "tcp" (no shared memory)
MAPPED_POLL_S = 0.002  # how often a host's first rank looks whether its peers have mapped the arena


def current_host() -> str:
    return os.environ.get(HOST_ENV) or socket.gethostname()


def advertised_address(host: str) -> str:
    """The address other hosts reach this one at: the runtime's host map, then DNS, then loopback."""
    mapping = os.environ.get(HOST_ADDRESSES_ENV)
    if mapping:
        try:
            address = json.loads(mapping).get(host)
        except (ValueError, AttributeError):
            address = None
        if address:
            return str(address)
    for name in (host, socket.gethostname()):
        try:
            return socket.gethostbyname(name)
        except OSError:
            continue
    return "127.0.0.1"


@dataclass
class Topology:
    """Group-rank layout: nodes in order of their first rank, each a list of group ranks."""

    rank: int
    size: int
    hosts: list[str]
    nodes: list[list[int]]
    node_of: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # every rank's, from the verified greetings
    values: StoreValues | None = field(default=None, repr=False, compare=False)  # the store, signed for this rendezvous (point-to-point links use it too)

    def __post_init__(self) -> None:
        self.node_of = [0] * self.size
        for index, ranks in enumerate(self.nodes):
            for rank in ranks:
                self.node_of[rank] = index

    @property
    def node(self) -> int:
        return self.node_of[self.rank]

    @property
    def local_ranks(self) -> list[int]:
        return self.nodes[self.node]

    @property
    def is_leader(self) -> bool:
        return self.local_ranks[0] == self.rank

    def describe_node(self, node: int) -> PeerRank:
        leader = self.nodes[node][0]
        return PeerRank(leader, self.hosts[leader])  # "rank R (host H)" in messages, data in errors


def _decide_transport(values: StoreValues, host: str, host_ranks: list[int], one_host: bool) -> tuple[dict[str, object], tuple[str, int] | None]:
    """Run by a host's first rank: create the arena (returned as path and fd), or say why this host falls
    back to TCP. The decision goes to the peers; the arena's name never does: they derive it."""
    if os.environ.get(TRANSPORT_ENV, "auto").lower() == "tcp":
        return {"kind": "tcp", "why": f"{TRANSPORT_ENV}=tcp"}, None
    if len(host_ranks) == 1:
        return {"kind": "single"}, None
    try:
        path, fd, slot = create_arena(shm_dir(), arena_name(values, host), len(host_ranks), ONE_HOST_SLOT_BYTES if one_host else DEFAULT_SLOT_BYTES)
    except ShmUnavailable as exc:
        warnings.warn(f"smddp: shared memory unavailable, ranks on this host talk TCP instead: {exc}", RuntimeWarning, stacklevel=2)
        return {"kind": "tcp", "why": str(exc)}, None
    return {"kind": "shm", "slot": slot}, (path, fd)


def arena_name(values: StoreValues, host: str) -> str:
    """The host's arena for this rendezvous: only the job's ranks can compute it (keyed with the secret)."""
    return "smddp-" + values.derive_name("arena", host)


def build(store: dist.Store, rank: int, size: int, timeout: timedelta) -> tuple[Topology, LocalComm, TcpMesh | None]:
    """Rendezvous through the store: exchange host identities, set up shared memory and the TCP mesh.

    Every value read back is verified (StoreValues) before it is used: each rank's greeting carries a
    fresh nonce, and everything after is bound to the digest of all greetings. A host's ranks map their
    arena before they read the other hosts' decisions, so its name is in /dev/shm for as short a time
    as the local ranks take to map it."""
    deadline = time.monotonic() + timeout.total_seconds()
    host = current_host()
    secret = _mesh_secret(store, rank)
    values = StoreValues(store, secret)
    mine = {"host": host, "pid": os.getpid(), "nonce": secrets.token_hex(16)}
    values.set(f"peer/{rank}", mine)
    peers = [mine if r == rank else values.get(f"peer/{r}") for r in range(size)]
    values.bind(hashlib.sha256(json.dumps(peers, sort_keys=True).encode()).hexdigest())
    hosts = [str(p["host"]) for p in peers]
    host_order = list(dict.fromkeys(hosts))
    by_host = {h: [r for r in range(size) if hosts[r] == h] for h in host_order}
    here = HostRanks(values, rank, host, host_order.index(host), by_host[host], [int(p["pid"]) for p in peers])
    own, arena = here.lead(len(host_order) == 1, deadline) if here.leads else here.join()
    decisions = [own if i == here.index else values.get(f"transport/{i}") for i in range(len(host_order))]
    nodes: list[list[int]] = []
    for h, decision in zip(host_order, decisions):
        nodes += [by_host[h]] if decision["kind"] != "tcp" else [[r] for r in by_host[h]]
    nodes.sort(key=lambda ranks: ranks[0])
    topo = Topology(rank=rank, size=size, hosts=hosts, nodes=nodes, pids=here.pids, values=values)
    if len(nodes) > 1 and rank == 0 and not os.environ.get(MESH_SECRET_ENV):
        _warn_store_token()
    mesh = _connect_mesh(values, topo, deadline) if len(nodes) > 1 and topo.is_leader else None
    hangs = HangWatch(values, rank, hosts, arena.latest_calls if arena else None)
    for transport in (arena, mesh):
        if transport is not None:
            transport.hangs = hangs
    return topo, LocalComm(arena), mesh


@dataclass
class HostRanks:
    """This rank among the ranks of its host, setting up their transport (the host's arena or TCP)."""

    values: StoreValues
    rank: int
    host: str
    index: int  # of the host, in order of first rank
    ranks: list[int]
    pids: list[int]  # every group rank's, from the verified greetings

    @property
    def leads(self) -> bool:
        return self.ranks[0] == self.rank

    def lead(self, one_host: bool, deadline: float) -> tuple[dict, ShmArena | None]:
        """Decide and publish the host's transport; with an arena, map it and remove its name once every
        local rank has it mapped, or as soon as anything fails (SIGTERM included): only the file created
        here, never one put in its place."""
        with _raising_on_sigterm():
            decision, created = _decide_transport(self.values, self.host, self.ranks, one_host)
            if created is None:
                self.values.set(f"transport/{self.index}", decision)
                return decision, None
            path, fd = created
            try:
                self.values.set(f"transport/{self.index}", decision)
                arena = self._map(fd, int(decision["slot"]))
                self._wait_mapped(deadline)
            finally:
                unlink_own(path, fd)
                os.close(fd)
        return decision, arena

    def join(self) -> tuple[dict, ShmArena | None]:
        """Read the host's decision and map its arena, found under the name derived here (never read)."""
        decision = self.values.get(f"transport/{self.index}")
        if decision["kind"] != "shm":
            return decision, None
        slot = int(decision["slot"])
        path = os.path.join(shm_dir(), arena_name(self.values, self.host))
        try:
            fd = open_segment(path, arena_bytes(len(self.ranks), slot))
        except FileNotFoundError as exc:
            raise CollectiveError(
                f"smddp: rank {self.rank} cannot open the shared-memory arena {path} created by rank {self.ranks[0]}, "
                f"although both report host {self.host!r}; give each host (container) a distinct {HOST_ENV}"
            ) from exc
        try:
            return decision, self._map(fd, slot)
        finally:
            os.close(fd)

    def _map(self, fd: int, slot: int) -> ShmArena:
        arena = ShmArena(fd, len(self.ranks), slot, self.ranks.index(self.rank), [Peer(r, self.pids[r]) for r in self.ranks])
        self.values.set(f"mapped/{self.rank}", True)
        return arena

    def _wait_mapped(self, deadline: float) -> None:
        """Until every local rank says (verified) it has the arena mapped; fails as soon as one has exited."""
        keys = [f"mapped/{r}" for r in self.ranks[1:]]
        while not self.values.check(keys):
            gone = [r for r in self.ranks[1:] if not pid_alive(self.pids[r])]
            if gone:
                raise CollectiveError(f"smddp: rank {gone[0]} (pid {self.pids[gone[0]]}, this host) exited before mapping the shared-memory arena")
            if time.monotonic() >= deadline:
                raise CollectiveError(f"smddp: ranks {', '.join(map(str, self.ranks[1:]))} did not map the shared-memory arena within the process-group timeout")
            time.sleep(MAPPED_POLL_S)
        for key in keys:
            self.values.get(key)


@contextlib.contextmanager
def _raising_on_sigterm() -> Iterator[None]:
    """SIGTERM (how the runtime and torchrun stop ranks) raises here instead of ending the process at
    once, so the arena's name is removed; then it is delivered again as it would have been. Only the
    main thread can set handlers, and only a handler Python knows can be put back: otherwise as before."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    caught: list[int] = []

    def stop(signum: int, frame: object) -> None:
        caught.append(signum)
        raise CollectiveError("smddp: stopped by SIGTERM while this host's ranks were mapping their shared-memory arena")

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if caught:
            os.kill(os.getpid(), signal.SIGTERM)


def _mesh_secret(store: dist.Store, rank: int) -> str:
    """What the job's ranks prove to each other and key their store values with: the runtime's secret
    (MESH_SECRET_ENV), which no other user can read. Ranks started without the runtime (torchrun, tests)
    share a token through the store instead, which only keeps out strangers that cannot read the store
    (_warn_store_token, docs/security.md)."""
    secret = os.environ.get(MESH_SECRET_ENV)
    if secret:
        return secret
    if rank == 0:
        store.set(_KEY + "token", new_token())
    return store.get(_KEY + "token").decode()


def _warn_store_token() -> None:
    warnings.warn(
        f"smddp: {MESH_SECRET_ENV} is not set (these ranks were not started by smddp's runtime), so the hosts' "
        "connections and the rendezvous values authenticate with a token kept in the rendezvous store: whoever can "
        f"reach the store can join them; set the same random {MESH_SECRET_ENV} for every rank to close that",
        RuntimeWarning, stacklevel=3)


def _connect_mesh(values: StoreValues, topo: Topology, deadline: float) -> TcpMesh:
    describe = {n: topo.describe_node(n) for n in range(len(topo.nodes))}
    address = advertised_address(topo.hosts[topo.rank])
    # The links prove a secret of this rendezvous (keyed with the job's secret), not the job's own, so a relay
    # cannot splice a connection of one process group into another group of the same job.
    mesh = TcpMesh(topo.node, values.derive_name("mesh links"), describe, address)
    values.set(f"tcp/{topo.node}", [address, mesh.port])
    addresses = {n: tuple(values.get(f"tcp/{n}")) for n in range(len(topo.nodes)) if n != topo.node}
    mesh.connect(addresses, deadline)
    return mesh
