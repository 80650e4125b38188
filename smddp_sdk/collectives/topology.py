"""Who is where: ranks grouped into nodes (one shared-memory arena each) through the group's store.

Host identity comes from the runtime's environment (SM_CURRENT_HOST), so two simulated hosts on one machine
still talk TCP between them; without it the machine's hostname is used. A host whose shared memory cannot
hold an arena (or SMDDP_TRANSPORT=tcp) turns each of its ranks into a node of its own, reached over TCP.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from smddp_sdk.collectives.errors import CollectiveError, PeerRank
from smddp_sdk.collectives.local import LocalComm
from smddp_sdk.collectives.shm import (
    DEFAULT_SLOT_BYTES,
    ONE_HOST_SLOT_BYTES,
    Peer,
    ShmArena,
    ShmUnavailable,
    create_arena_file,
    shm_dir,
)
from smddp_sdk.collectives.tcp import TcpMesh, new_token
from smddp_sdk.specs.contract import HOST_ADDRESSES_ENV, MESH_SECRET_ENV

HOST_ENV = "SM_CURRENT_HOST"
TRANSPORT_ENV = "SMDDP_TRANSPORT"  # "auto" (default) or "tcp" (no shared memory)
_KEY = "smddp/"


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


def _get_json(store: dist.Store, key: str) -> object:
    return json.loads(store.get(_KEY + key).decode())


def _set_json(store: dist.Store, key: str, value: object) -> None:
    store.set(_KEY + key, json.dumps(value))


def _decide_transport(host_ranks: list[int], one_host: bool) -> dict[str, object]:
    """Run by a host's first rank: create the arena, or say why this host falls back to TCP."""
    if os.environ.get(TRANSPORT_ENV, "auto").lower() == "tcp":
        return {"kind": "tcp", "why": f"{TRANSPORT_ENV}=tcp"}
    if len(host_ranks) == 1:
        return {"kind": "single"}
    try:
        path, slot = create_arena_file(len(host_ranks), shm_dir(), ONE_HOST_SLOT_BYTES if one_host else DEFAULT_SLOT_BYTES)
    except ShmUnavailable as exc:
        warnings.warn(f"smddp: shared memory unavailable, ranks on this host talk TCP instead: {exc}", RuntimeWarning, stacklevel=2)
        return {"kind": "tcp", "why": str(exc)}
    return {"kind": "shm", "path": path, "slot": slot}


def build(store: dist.Store, rank: int, size: int, timeout: timedelta) -> tuple[Topology, LocalComm, TcpMesh | None]:
    """Rendezvous through the store: exchange host identities, set up shared memory and the TCP mesh."""
    deadline = time.monotonic() + timeout.total_seconds()
    host = current_host()
    _set_json(store, f"peer/{rank}", {"host": host, "pid": os.getpid()})
    peers = [_get_json(store, f"peer/{r}") for r in range(size)]
    hosts = [str(p["host"]) for p in peers]
    host_order = list(dict.fromkeys(hosts))
    by_host = {h: [r for r in range(size) if hosts[r] == h] for h in host_order}
    my_host_ranks = by_host[host]
    if my_host_ranks[0] == rank:
        _set_json(store, f"transport/{host_order.index(host)}", _decide_transport(my_host_ranks, len(host_order) == 1))
    decisions = [_get_json(store, f"transport/{i}") for i in range(len(host_order))]
    nodes: list[list[int]] = []
    for h, decision in zip(host_order, decisions):
        nodes += [by_host[h]] if decision["kind"] != "tcp" else [[r] for r in by_host[h]]
    nodes.sort(key=lambda ranks: ranks[0])
    topo = Topology(rank=rank, size=size, hosts=hosts, nodes=nodes)
    local = LocalComm(_attach_arena(store, topo, decisions[host_order.index(host)], peers, deadline))
    mesh = _connect_mesh(store, topo, deadline) if len(nodes) > 1 and topo.is_leader else None
    return topo, local, mesh


def _attach_arena(store: dist.Store, topo: Topology, decision: dict, peers: list, deadline: float) -> ShmArena | None:
    if decision["kind"] != "shm":
        return None
    local = topo.local_ranks
    path = str(decision["path"])
    try:
        arena = ShmArena(path, len(local), int(decision["slot"]), local.index(topo.rank),
                         [Peer(r, int(peers[r]["pid"])) for r in local])
    except BaseException as exc:
        if topo.is_leader and os.path.exists(path):
            os.unlink(path)  # the creator cannot use it: nobody will
        if not isinstance(exc, FileNotFoundError):
            raise
        raise CollectiveError(
            f"smddp: rank {topo.rank} cannot open the shared-memory arena {path} created by rank {local[0]}, "
            f"although both report host {topo.hosts[topo.rank]!r}; give each host (container) a distinct {HOST_ENV}"
        ) from exc
    store.set(f"{_KEY}mapped/{topo.rank}", "1")
    if topo.is_leader:
        try:
            store.wait([f"{_KEY}mapped/{r}" for r in local], timedelta(seconds=max(1.0, deadline - time.monotonic())))
        finally:
            os.unlink(path)  # every rank has it mapped (or setup failed): nothing stays in /dev/shm
    return arena


def _mesh_secret(store: dist.Store, topo: Topology) -> str:
    """What the mesh's peers prove: the runtime's secret for the job's ranks (MESH_SECRET_ENV), which no
    other user can read. Ranks started without the runtime (torchrun, tests) share a token through the
    store instead, which only keeps out strangers that cannot read the store: rank 0 says so, once
    (docs/security.md)."""
    secret = os.environ.get(MESH_SECRET_ENV)
    if secret:
        return secret
    if topo.rank == 0:
        warnings.warn(
            f"smddp: {MESH_SECRET_ENV} is not set (these ranks were not started by smddp's runtime), so the hosts' "
            "connections authenticate with a token kept in the rendezvous store: whoever can reach the store can join "
            f"them; set the same random {MESH_SECRET_ENV} for every rank to close that", RuntimeWarning, stacklevel=2)
        store.set(_KEY + "token", new_token())
    return store.get(_KEY + "token").decode()


def _connect_mesh(store: dist.Store, topo: Topology, deadline: float) -> TcpMesh:
    describe = {n: topo.describe_node(n) for n in range(len(topo.nodes))}
    address = advertised_address(topo.hosts[topo.rank])
    mesh = TcpMesh(topo.node, _mesh_secret(store, topo), describe, address)
    _set_json(store, f"tcp/{topo.node}", [address, mesh.port])
    addresses = {n: tuple(_get_json(store, f"tcp/{n}")) for n in range(len(topo.nodes)) if n != topo.node}
    mesh.connect(addresses, deadline)
    return mesh
