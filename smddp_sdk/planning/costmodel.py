"""Alpha-beta cost of one collective on ``hosts`` hosts of a topology, for smddp and for the stock library.

Notation: H hosts of G ranks (N = H·G), S bytes, B a host's network bytes/s times the library's link
efficiency, α the cost of one network message; B_i, α_i the same within a host.

smddp (this project, ``smddp_sdk/collectives/algorithms.py``) is hierarchical: the host's ranks
reduce-scatter within the host, the hosts exchange, the host's ranks all-gather. Between hosts ``auto``
picks, as the backend does:

    oneshot   H = 2 or S ≤ 32 KiB   α·(H-1)  + (H-1)·S / B
    sharded   S < 1 MiB             α·(H-1)·steps + 2(H-1)/H·S / B      (steps: pipelined 16 MiB chunks + 1)
    ring      S ≥ 1 MiB             2α·(H-1) + 2(H-1)/H·S / B
    within a host (G > 1)           2·(α_i + (G-1)/G·S / B_i)

The stock library (NCCL on GPUs, gloo between simulated hosts) runs one flat ring over all N ranks, so the
network carries 2(N-1)/N·S per host (the within-host reduction does not shrink what crosses the link):

    ring      2(N-1)/N·S / B + latency,   latency = 2(N-1)α for gloo; NCCL's trees cut it to 2⌈log2 N⌉α

all_gather (S = gathered size; broadcast is costed the same): smddp all-to-all between hosts, (H-1)α + (H-1)/H·S/B (+ (G-1)/G·S/B_i within);
stock ring (N-1)/N·S/B + (N-1)α. reduce_scatter (S = input size): the first half of each all_reduce.
"""

from __future__ import annotations

import math

from smddp_sdk.planning.hardware import Topology

LIBRARIES = ("smddp", "stock")
ONESHOT_LIMIT = 32 << 10
RING_FROM = 1 << 20
PIPELINE_CHUNK = 16 << 20

# Share of the network link each library's large transfers reach on EFA hosts. AWS's SMDDP documentation
# ("Optimal bandwidth use with EFA", docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-intro.html)
# shows AllGather on 32 p4d.24xlarge near 90% of the link for SMDDP and near 80% for NCCL. On this
# project's simulated hosts the topology's bandwidth already is the TCP payload rate, so both reach 1.
# The same shares are assumed on ENA (TCP) hosts, for which no comparable figure is published.
LINK_EFFICIENCY = {"smddp": 0.90, "stock": 0.80}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def link_efficiency(topo: Topology, library: str) -> float:
    if topo.name.startswith("sim:"):
        return 1.0
    return LINK_EFFICIENCY[library]


def _check(nbytes: float, hosts: int, library: str) -> None:
    if hosts < 1:
        raise ValueError(f"hosts must be at least 1, got {hosts}")
    if nbytes < 0:
        raise ValueError(f"a collective moves a non-negative number of bytes, got {nbytes}")
    if library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r}: choose from {', '.join(LIBRARIES)}")


def smddp_inter_host_allreduce(nbytes: float, hosts: int, topo: Topology, algorithm: str = "auto") -> float:
    """Seconds for the leaders' exchange between hosts (one of this project's three algorithms)."""
    if hosts == 1 or nbytes == 0:
        return 0.0
    bw, alpha, h = topo.network_bytes_s * link_efficiency(topo, "smddp"), topo.alpha_s, hosts
    if algorithm == "auto":
        algorithm = "oneshot" if h == 2 or nbytes <= ONESHOT_LIMIT else ("sharded" if nbytes < RING_FROM else "ring")
    if algorithm == "oneshot":
        return alpha * (h - 1) + (h - 1) * nbytes / bw
    optimal = 2 * (h - 1) / h * nbytes / bw
    if algorithm == "sharded":
        steps = math.ceil(nbytes / PIPELINE_CHUNK) + 1
        return alpha * (h - 1) * steps + optimal
    if algorithm == "ring":
        return 2 * alpha * (h - 1) + optimal
    raise ValueError(f"unknown smddp algorithm {algorithm!r}: auto, oneshot, sharded or ring")


def _within_host(nbytes: float, topo: Topology, phases: int) -> float:
    g = topo.gpus
    if g <= 1 or nbytes == 0:
        return 0.0
    return phases * (topo.intra_alpha_s + (g - 1) / g * nbytes / topo.intra_bytes_s)


def _stock_latency(steps: int, topo: Topology) -> float:
    ranks_latency = steps if topo.name.startswith("sim:") else 2 * math.ceil(math.log2(max(2, steps)))
    return ranks_latency * topo.alpha_s


def collective_seconds(op: str, nbytes: float, hosts: int, topo: Topology, library: str = "smddp") -> float:
    """Predicted seconds for one collective of ``nbytes`` (all_gather: the gathered size; reduce_scatter:
    the input size) across ``hosts`` hosts of ``topo``."""
    _check(nbytes, hosts, library)
    n = hosts * topo.gpus
    if n == 1 or nbytes == 0:
        return 0.0
    bw = topo.network_bytes_s * link_efficiency(topo, library)
    if op == "all_reduce":
        if library == "smddp":
            return _within_host(nbytes, topo, 2) + smddp_inter_host_allreduce(nbytes, hosts, topo)
        if hosts == 1:
            return _within_host(nbytes, topo, 2)
        return _stock_latency(2 * (n - 1), topo) + 2 * (n - 1) / n * nbytes / bw
    if op in ("all_gather", "reduce_scatter", "broadcast"):
        if library == "smddp":
            inter = 0.0 if hosts == 1 else topo.alpha_s * (hosts - 1) + (hosts - 1) / hosts * nbytes / bw
            return _within_host(nbytes, topo, 1) + inter
        if hosts == 1:
            return _within_host(nbytes, topo, 1)
        return _stock_latency(n - 1, topo) + (n - 1) / n * nbytes / bw
    raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")


def per_link_bytes(op: str, nbytes: float, hosts: int) -> float:
    """What each host must put on its link for the optimal algorithm (nccl-tests' bus bandwidth convention)."""
    factor = 2 * (hosts - 1) / hosts if op == "all_reduce" else (hosts - 1) / hosts
    return factor * nbytes
