"""Instance topologies for the planner: GPUs per host, the bandwidth between them, and the network.

Data, not code. Every row names where its figures come from and when they were read. Prices are left
out (``None``) wherever no price source could be checked: SageMaker prices differ by region and change;
pass ``--price-per-hour`` (or ``price_per_hour=``) with the figure from your region's pricing page, and the
plan fills its cost columns. A price that nobody checked would make the cost columns look authoritative.

``sim:<rate>mbit[x<ranks>][+<delay>ms]`` names a simulated host of this project (a network namespace on a
token-bucket shaped link, with a one-way delay through a delaylink process when given,
benchmarks/simhosts.py): a CPU host, and what the planner's predictions are checked against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from smddp_sdk.errors import SpecError, SpecIssue

EC2_ACCELERATED = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/accelerated-computing-instances.html"
EC2_TYPES = "https://aws.amazon.com/ec2/instance-types/"
EFA_MULTI_CARD = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/p5-efa.html"
CHECKED = "2026-11-24"  # re-read in AWS's documentation on this date
NOT_RECHECKED = "published figure, not re-read"

# TCP over Ethernet (timestamps on): MTU - 52 payload bytes in an MTU + 14-byte frame, as the token bucket
# counts it; at MTU 1500 the ceiling this project's link benchmark reaches (docs/performance.md: 95-96%).
# Delayed simulated links carry 64000-byte frames (fewer frames through their user-space delay process).
VETH_MTU, DELAY_LINK_MTU = 1500, 64000


def tcp_payload_share(mtu: int) -> float:
    return (mtu - 52) / (mtu + 14)


TCP_PAYLOAD_SHARE = tcp_payload_share(VETH_MTU)


@dataclass(frozen=True)
class Topology:
    """One host type: ``gpus`` ranks joined by ``intra_gbytes_s`` (per rank, one direction), and a network
    link of ``network_gbit_s`` per host. ``alpha_s`` is the fixed cost of one network message. ``gpu``: a GPU
    instance type (smddp is AWS's library there), else a CPU host (this project's bundled backend)."""

    name: str
    gpus: int
    intra_gbytes_s: float
    network_gbit_s: float
    alpha_s: float
    intra_alpha_s: float
    efa: bool
    source: str
    checked: str = NOT_RECHECKED
    price_per_hour: float | None = None
    price_source: str = ""
    gpu: bool = True

    @property
    def network_bytes_s(self) -> float:
        return self.network_gbit_s * 1e9 / 8

    @property
    def intra_bytes_s(self) -> float:
        return self.intra_gbytes_s * 1e9


# NVLink figures are NVIDIA's per-GPU totals (both directions) halved to one direction; PCIe-only hosts get
# PCIe 4.0 x16's ~25 GB/s usable. Network alpha: EFA (SRD) ~15 us, ENA TCP ~30 us per message, the order of
# magnitude nccl-tests show at small sizes on these hosts; the bandwidth term dominates above ~1 MB.
_EFA_ALPHA, _ENA_ALPHA, _NVLINK_ALPHA, _CPU_ALPHA = 15e-6, 30e-6, 5e-6, 150e-6
CATALOG: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology("ml.p3.16xlarge", 8, 150, 25, _ENA_ALPHA, _NVLINK_ALPHA, False, EC2_TYPES),
        Topology("ml.p3dn.24xlarge", 8, 150, 100, _EFA_ALPHA, _NVLINK_ALPHA, True, EC2_TYPES),
        Topology("ml.p4d.24xlarge", 8, 300, 400, _EFA_ALPHA, _NVLINK_ALPHA, True, EC2_ACCELERATED),
        Topology("ml.p4de.24xlarge", 8, 300, 400, _EFA_ALPHA, _NVLINK_ALPHA, True, EC2_ACCELERATED),
        Topology("ml.p5.48xlarge", 8, 450, 3200, _EFA_ALPHA, _NVLINK_ALPHA, True, EFA_MULTI_CARD, CHECKED),
        Topology("ml.p5e.48xlarge", 8, 450, 3200, _EFA_ALPHA, _NVLINK_ALPHA, True, EFA_MULTI_CARD, CHECKED),
        Topology("ml.p5en.48xlarge", 8, 450, 3200, _EFA_ALPHA, _NVLINK_ALPHA, True, EC2_ACCELERATED),
        Topology("ml.g5.12xlarge", 4, 25, 40, _ENA_ALPHA, 10e-6, False, EC2_ACCELERATED),
        Topology("ml.g5.48xlarge", 8, 25, 100, _EFA_ALPHA, 10e-6, True, EC2_ACCELERATED),
        Topology("ml.g6e.48xlarge", 8, 25, 400, _EFA_ALPHA, 10e-6, True, EFA_MULTI_CARD, CHECKED),
        # CPU hosts: one rank each (the runtime's plan for CPU types), the bundled backend over TCP, whose
        # per-message cost in Python dominates ENA's (the same assumed 0.15 ms as on simulated hosts).
        Topology("ml.c5.18xlarge", 1, 0, 25, _CPU_ALPHA, 0, False, EC2_TYPES, gpu=False),
        Topology("ml.c6i.32xlarge", 1, 0, 50, _CPU_ALPHA, 0, False, EC2_TYPES, gpu=False),
        Topology("ml.m5.24xlarge", 1, 0, 25, _CPU_ALPHA, 0, False, EC2_TYPES, gpu=False),
        Topology("ml.m6i.32xlarge", 1, 0, 50, _CPU_ALPHA, 0, False, EC2_TYPES, gpu=False),
    )
}

_SIM = re.compile(r"^sim:(?P<rate>\d+(\.\d+)?)mbit(x(?P<ranks>\d+))?(\+(?P<delay>\d+(\.\d+)?)ms)?$")
# Assumed, not fitted: a TCP round trip between namespaces plus the backend's per-call cost in Python,
# ~0.15 ms; ~0.05 ms within a host. At the shaped rates they matter only below ~256 KiB.
SIM_ALPHA_S, SIM_INTRA_ALPHA_S, SIM_INTRA_GBYTES_S = _CPU_ALPHA, 50e-6, 2.0


def simulated(rate_mbit: float, ranks_per_host: int = 1, delay_ms: float = 0.0) -> Topology:
    """A simulated host of this project: a link shaped to ``rate_mbit`` each way, TCP on top; a message
    between hosts takes ``delay_ms`` more (one way)."""
    name = f"sim:{rate_mbit:g}mbit" + (f"x{ranks_per_host}" if ranks_per_host > 1 else "") + (f"+{delay_ms:g}ms" if delay_ms else "")
    share = tcp_payload_share(DELAY_LINK_MTU if delay_ms else VETH_MTU)
    return Topology(
        name,
        ranks_per_host,
        SIM_INTRA_GBYTES_S,
        rate_mbit / 1000 * share,
        SIM_ALPHA_S + delay_ms / 1e3,
        SIM_INTRA_ALPHA_S,
        False,
        "benchmarks/simhosts.py (tbf rate x TCP payload share)",
        CHECKED,
        gpu=False,
    )


def topology(name: str, price_per_hour: float | None = None) -> Topology:
    """The named instance type's topology (with the caller's price, when given); a clear error otherwise."""
    match = _SIM.match(name)
    if match:
        found = simulated(float(match["rate"]), int(match["ranks"] or 1), float(match["delay"] or 0))
    elif name in CATALOG:
        found = CATALOG[name]
    else:
        known = ", ".join(sorted(CATALOG))
        raise SpecError(SpecIssue("instance_type", f"the planner has no network figures for {name!r}; known: {known}, or sim:<rate>mbit[+<delay>ms] for a simulated host"))
    if price_per_hour is None:
        return found
    if price_per_hour <= 0:
        raise SpecError(SpecIssue("price_per_hour", f"must be a positive number of dollars per instance-hour, got {price_per_hour}"))
    return replace(found, price_per_hour=price_per_hour, price_source="given by the user")


def markdown_table() -> str:
    """The catalogue as the table in docs/planning.md."""
    rows = ["| instance type | ranks (GPUs) | intra-host GB/s per GPU (one way) | network Gbit/s | EFA | price/h | source (checked) |", "|---|---|---|---|---|---|---|"]
    for t in CATALOG.values():
        price = f"${t.price_per_hour:.2f}" if t.price_per_hour else "n/a"
        rows.append(f"| `{t.name}` | {t.gpus} | {t.intra_gbytes_s:g} | {t.network_gbit_s:g} | {'yes' if t.efa else 'no'} | {price} | {t.source} ({t.checked}) |")
    return "\n".join(rows) + "\n"
