"""Alpha-beta cost of one collective on ``hosts`` hosts of a topology, for what "smddp" and "stock" run there.

What runs depends on the target (``implementation``):

* GPU instance types: SageMaker runs **AWS's SMDDP** for smddp (this project's backend hands CUDA tensors
  to NCCL, and on SageMaker the AWS library is what ``backend="smddp"`` loads) on the instance types it
  supports, and NCCL elsewhere; stock is **NCCL**.
* CPU instance types and simulated hosts: smddp is **this project's bundled backend** with its algorithms chosen
  by size and host count (``selection.py``, the same rules as the runtime); stock is **gloo**.

Notation: H hosts of G ranks (N = H·G), S bytes, B a host's network bytes/s times the library's link
efficiency, α the cost of one network message (on simulated hosts it includes the link's one-way delay);
B_i, α_i the same within a host. Every cost is latency (the α terms) + transfer (the rest).

Bundled backend, between hosts (one leader per host; within a host, G > 1: 2·(α_i + (G-1)/G·S/B_i) for
all_reduce, once for the others):

    oneshot             all_reduce (H-1)·α + (H-1)·S/B          all_gather (H-1)·α + (H-1)/H·S/B
    sharded             (H-1)·α·(⌈S/chunk⌉+1) + 2(H-1)/H·S/B
    ring                2(H-1)·α + 2(H-1)/H·S/B                   (H-1)·α + (H-1)/H·S/B
    recursive_doubling  ⌈log2 H⌉·(α + S/B), +2(α + S/B) unless H is a power of two
    halving_doubling    2·log2 p·α + 2(p-1)/p·S/B, p = 2^⌊log2 H⌋, +2(α + S/B) unless H = p
    bruck                                                        ⌈log2 H⌉·α + (H-1)/H·S/B

    broadcast: binomial ⌈log2 H⌉·(α + S/B); scatter_allgather ⌈log2 H⌉·α + (H-1)/H·S/B then the all_gather
    of S/H blocks (by its own choice). reduce_scatter: the all_gather's forms.

AWS SMDDP all_reduce (its documented design: within the node, reduce-scatter over NVLink; between nodes
a parameter-server pattern with balanced fusion buffers, every node's CPU reducing 1/H of each buffer; then
all-gather back): 2(α_i + (G-1)/G·S/B_i) + 2α + 2(H-1)/H·S/B, two network steps whatever H is, with the
CPU's reduction pipelined under the transfer (max of the two). AllGather: one step, α + (H-1)/H·S/B after
the within-node gather. Other collectives SMDDP hands to NCCL.

NCCL (ring or tree, whichever is faster, as its tuner picks): ring over all N ranks, 2(N-1)/N·S/B with
2(H-1)·α + 2(N-H)·α_i; tree (double binary between nodes, a chain within), 2·S/B per link with
2(⌈log2 H⌉·α + (G-1)·α_i). all_gather / reduce_scatter / broadcast: ring, (N-1)/N·S/B + (H-1)·α + (N-H)·α_i.

gloo: one flat ring over N ranks, 2(N-1)/N·S/B + 2(N-1)·α (all_gather: half of each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smddp_sdk.planning.hardware import Topology
from smddp_sdk.planning.selection import (
    PIPELINE_CHUNK_BYTES,
    ROUNDS_FROM_BYTES,
    allgather_algorithm,
    ceil_log2,
    inter_host_algorithm,
    is_power_of_two,
    log2_floor,
)
from smddp_sdk.specs.smddp_support import SUPPORTED_INSTANCE_TYPES

LIBRARIES = ("smddp", "stock")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
BUNDLED, GLOO, AWS_SMDDP, NCCL = "smddp (this project)", "gloo", "AWS SMDDP", "NCCL"

# Share of the network link each library's large transfers reach on EFA hosts. AWS's SMDDP documentation
# ("Optimal bandwidth use with EFA", docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-intro.html)
# shows AllGather on 32 p4d.24xlarge near 90% of the link for SMDDP and near 80% for NCCL. On this
# project's simulated hosts the topology's bandwidth already is the TCP payload rate, so both reach 1.
# The same shares are assumed on ENA (TCP) hosts, for which no comparable figure is published; the bundled
# backend and gloo on CPU instance types are given the whole link (their TCP headers, ~1% at MTU 9001, left out).
LINK_EFFICIENCY = {AWS_SMDDP: 0.90, NCCL: 0.80}
# SMDDP's servers reduce on the host's CPUs: assumed memory-bound at ~40 GB/s of input on a 96-vCPU host,
# pipelined under the transfer; it bounds the step only where the network is faster (p5's 3200 Gbit/s).
CPU_REDUCE_BYTES_S = 40e9


@dataclass(frozen=True)
class Cost:
    """One collective's predicted time, split into latency (α terms) and transfer, and what ran."""

    implementation: str
    algorithm: str  # one word, for the plan's column
    latency_s: float
    transfer_s: float
    note: str = ""  # what bounds it, when that is not the network

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s

    def plus(self, latency_s: float, transfer_s: float) -> Cost:
        return Cost(self.implementation, self.algorithm, self.latency_s + latency_s, self.transfer_s + transfer_s, self.note)


def implementation(topo: Topology, library: str) -> str:
    """The library that really runs for ``library`` ("smddp" or "stock") on ``topo``."""
    if library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r}: choose from {', '.join(LIBRARIES)}")
    if not topo.gpu:
        return BUNDLED if library == "smddp" else GLOO
    return AWS_SMDDP if library == "smddp" and topo.name in SUPPORTED_INSTANCE_TYPES else NCCL


def _bandwidth(topo: Topology, impl: str) -> float:
    return topo.network_bytes_s * LINK_EFFICIENCY.get(impl, 1.0)


def bundled_inter_host(op: str, nbytes: float, hosts: int, topo: Topology, algorithm: str) -> tuple[float, float]:
    """(latency, transfer) of the bundled backend's named algorithm between ``hosts`` host leaders."""
    alpha, bw, h, s = topo.alpha_s, _bandwidth(topo, BUNDLED), hosts, nbytes
    fold = 0 if is_power_of_two(h) else 1  # non-powers of two: the extra hosts fold in, then out
    if op == "all_reduce":
        forms = {
            "oneshot": ((h - 1) * alpha, (h - 1) * s / bw),
            "sharded": (_sharded_rounds(s, h) * alpha, 2 * (h - 1) / h * s / bw),
            "ring": (2 * (h - 1) * alpha, 2 * (h - 1) / h * s / bw),
            "recursive_doubling": ((ceil_log2(h) + 2 * fold) * alpha, (ceil_log2(h) + 2 * fold) * s / bw),
        }
        p = 1 << log2_floor(h)
        forms["halving_doubling"] = ((2 * ceil_log2(p) + 2 * fold) * alpha, (2 * (p - 1) / p + 2 * fold) * s / bw)
    elif op == "broadcast":  # a tree of the whole message, or of each subtree's shards then their all_gather
        gather_latency, gather_transfer = bundled_inter_host("all_gather", s, h, topo, allgather_algorithm(math.ceil(s / h), h))
        forms = {
            "binomial": (ceil_log2(h) * alpha, ceil_log2(h) * s / bw),
            "scatter_allgather": (ceil_log2(h) * alpha + gather_latency, (h - 1) / h * s / bw + gather_transfer),
        }
    else:  # all_gather; reduce_scatter moves the same bytes with the all_gather algorithms
        forms = {
            "oneshot": ((h - 1) * alpha, (h - 1) / h * s / bw),
            "ring": ((h - 1) * alpha, (h - 1) / h * s / bw),
            "bruck": (ceil_log2(h) * alpha, (h - 1) / h * s / bw),
        }
    if algorithm not in forms:
        raise ValueError(f"unknown {op} algorithm {algorithm!r}: choose from {', '.join(forms)}")
    return forms[algorithm]


def _sharded_rounds(nbytes: float, hosts: int) -> int:
    """The sharded all_reduce's rounds: one exchange with every peer each way while a peer's part is small,
    else permutation rounds (H-1 per step) for each pipelined chunk and one more to drain."""
    if math.ceil(nbytes / hosts) < ROUNDS_FROM_BYTES:
        return 2
    return (hosts - 1) * (math.ceil(nbytes / PIPELINE_CHUNK_BYTES) + 1)


def _within_host(nbytes: float, topo: Topology, phases: int) -> tuple[float, float]:
    g = topo.gpus
    if g <= 1:
        return 0.0, 0.0
    return phases * topo.intra_alpha_s, phases * (g - 1) / g * nbytes / topo.intra_bytes_s


def _bundled(op: str, nbytes: float, hosts: int, topo: Topology, forced: str) -> Cost:
    phases = 2 if op == "all_reduce" else 1
    if hosts == 1:
        return Cost(BUNDLED, "within-host", *_within_host(nbytes, topo, phases))
    rules = op if op in ("all_reduce", "broadcast") else "all_gather"
    algorithm = inter_host_algorithm(rules, int(nbytes), hosts, forced)
    return Cost(BUNDLED, algorithm, *bundled_inter_host(rules, nbytes, hosts, topo, algorithm)).plus(*_within_host(nbytes, topo, phases))


def _gloo(op: str, nbytes: float, hosts: int, topo: Topology) -> Cost:
    n, steps = hosts * topo.gpus, (2 if op == "all_reduce" else 1)
    if hosts == 1:
        return Cost(GLOO, "ring", *_within_host(nbytes, topo, steps))
    return Cost(GLOO, "ring", steps * (n - 1) * topo.alpha_s, steps * (n - 1) / n * nbytes / _bandwidth(topo, GLOO))


def _nccl(op: str, nbytes: float, hosts: int, topo: Topology) -> Cost:
    h, g = hosts, topo.gpus
    n, bw = h * g, _bandwidth(topo, NCCL)
    if h == 1:
        return Cost(NCCL, "ring", *_within_host(nbytes, topo, 2 if op == "all_reduce" else 1))
    steps = 2 if op == "all_reduce" else 1
    ring = Cost(NCCL, "ring", steps * ((h - 1) * topo.alpha_s + (n - h) * topo.intra_alpha_s), steps * (n - 1) / n * nbytes / bw)
    if op != "all_reduce":
        return ring
    tree = Cost(NCCL, "tree", 2 * (ceil_log2(h) * topo.alpha_s + (g - 1) * topo.intra_alpha_s), 2 * nbytes / bw)
    return min(ring, tree, key=lambda c: c.seconds)


def _aws_smddp(op: str, nbytes: float, hosts: int, topo: Topology) -> Cost:
    if op not in ("all_reduce", "all_gather"):  # SMDDP's own collectives; the rest go to NCCL
        nccl = _nccl(op, nbytes, hosts, topo)
        return Cost(AWS_SMDDP, f"nccl-{nccl.algorithm}", nccl.latency_s, nccl.transfer_s, f"SMDDP hands {op} to NCCL")
    phases = 2 if op == "all_reduce" else 1
    inside = _within_host(nbytes, topo, phases)
    if hosts == 1:
        return Cost(AWS_SMDDP, "within-node", *inside)
    h, bw = hosts, _bandwidth(topo, AWS_SMDDP)
    if op == "all_reduce":
        network, reduction = 2 * (h - 1) / h * nbytes / bw, nbytes / CPU_REDUCE_BYTES_S
        bound = "bound by the reduction on the hosts' CPUs" if reduction > network else ""
        return Cost(AWS_SMDDP, "param-servers", 2 * topo.alpha_s, max(network, reduction), bound).plus(*inside)
    return Cost(AWS_SMDDP, "all-gather", topo.alpha_s, (h - 1) / h * nbytes / bw).plus(*inside)


def collective_cost(op: str, nbytes: float, hosts: int, topo: Topology, library: str = "smddp", forced: str = "auto") -> Cost:
    """The predicted cost of one collective of ``nbytes`` (all_gather: the gathered size; reduce_scatter:
    the input size) across ``hosts`` hosts of ``topo``; ``forced`` as selection.py's."""
    if hosts < 1:
        raise ValueError(f"hosts must be at least 1, got {hosts}")
    if nbytes < 0:
        raise ValueError(f"a collective moves a non-negative number of bytes, got {nbytes}")
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}: choose from {', '.join(OPS)}")
    impl = implementation(topo, library)
    if hosts * topo.gpus == 1 or nbytes == 0:
        return Cost(impl, "none", 0.0, 0.0)
    if impl == BUNDLED:
        return _bundled(op, nbytes, hosts, topo, forced)
    if impl == GLOO:
        return _gloo(op, nbytes, hosts, topo)
    return _aws_smddp(op, nbytes, hosts, topo) if impl == AWS_SMDDP else _nccl(op, nbytes, hosts, topo)


def collective_seconds(op: str, nbytes: float, hosts: int, topo: Topology, library: str = "smddp", forced: str = "auto") -> float:
    return collective_cost(op, nbytes, hosts, topo, library, forced).seconds


def per_link_bytes(op: str, nbytes: float, hosts: int) -> float:
    """What each host must put on its link for the optimal algorithm (nccl-tests' bus bandwidth convention)."""
    factor = 2 * (hosts - 1) / hosts if op == "all_reduce" else (hosts - 1) / hosts
    return factor * nbytes
