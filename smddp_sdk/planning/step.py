"""A training step as the planner sees it, and its predicted time on a cluster.

A step is ``compute_s`` of forward, backward and optimizer on one rank, during which collectives become
ready (``CommEvent.ready_s``, seconds from the step's start): DDP's gradient buckets one after another in
backward, FSDP's all_gathers and reduce_scatters. Collectives run one at a time, in order, on the
communication path (as both smddp's communication thread and NCCL's stream do), each as soon as it is
ready and the previous one is done. Whatever compute follows the last collective's ready moment (the
optimizer) waits for it to finish:

    end_0 = 0;  end_i = max(ready_i, end_{i-1}) + cost(op_i, bytes_i)
    step  = max(compute, end_last + (compute - ready_last))

so communication that fits under the remaining backward is hidden, and the rest is exposed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from smddp_sdk.planning.costmodel import collective_seconds
from smddp_sdk.planning.hardware import Topology


@dataclass(frozen=True)
class CommEvent:
    op: str
    nbytes: int
    ready_s: float


@dataclass(frozen=True)
class StepProfile:
    """What the planner needs of a job's step; built from a profile (profile_io) or from figures."""

    compute_s: float
    events: tuple[CommEvent, ...]
    samples_per_rank: int | None = None
    source: str = ""
    measured_step_s: float | None = None
    measured_comm_s: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def bytes_per_step(self) -> int:
        return sum(event.nbytes for event in self.events)

    def with_compute(self, compute_s: float) -> StepProfile:
        """The same step on faster or slower hardware: ready moments scale with the compute time."""
        if compute_s <= 0:
            raise ValueError(f"compute time per step must be positive, got {compute_s}")
        scale = compute_s / self.compute_s if self.compute_s > 0 else 0.0
        events = tuple(CommEvent(e.op, e.nbytes, e.ready_s * scale if scale else compute_s) for e in self.events)
        return StepProfile(compute_s, events, self.samples_per_rank, self.source, None, None, self.notes)


def from_figures(compute_s: float, gradient_bytes: int, bucket_bytes: int = 25 << 20, backward_share: float = 2 / 3, samples_per_rank: int | None = None) -> StepProfile:
    """A DDP step from two figures: gradient buckets of ``bucket_bytes`` becoming ready evenly through the
    backward pass (the last ``backward_share`` of the compute, before a negligible optimizer)."""
    if compute_s <= 0 or gradient_bytes <= 0 or bucket_bytes <= 0:
        raise ValueError("compute time, gradient bytes and bucket size must all be positive")
    if not 0 < backward_share <= 1:
        raise ValueError(f"backward_share is a fraction of the step, got {backward_share}")
    sizes = [bucket_bytes] * (gradient_bytes // bucket_bytes)
    if gradient_bytes % bucket_bytes:
        sizes.append(gradient_bytes % bucket_bytes)
    start, backward = compute_s * (1 - backward_share), compute_s * backward_share
    events = tuple(CommEvent("all_reduce", size, start + backward * (i + 1) / len(sizes)) for i, size in enumerate(sizes))
    return StepProfile(compute_s, events, samples_per_rank, source="figures")


@dataclass(frozen=True)
class StepPrediction:
    step_s: float
    compute_s: float
    comm_s: float

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.step_s - self.compute_s)

    @property
    def overlapped_share(self) -> float:
        return 1.0 if self.comm_s == 0 else max(0.0, 1 - self.exposed_s / self.comm_s)


def simulate(compute_s: float, events: Sequence[tuple[float, float]]) -> float:
    """Step time for (ready_s, cost_s) collectives run in order on one communication path."""
    free = 0.0
    last_ready = 0.0
    for ready, cost in sorted(events, key=lambda e: e[0]):
        free = max(ready, free) + cost
        last_ready = ready
    if not events:
        return compute_s
    return max(compute_s, free + max(0.0, compute_s - last_ready))


def predict(profile: StepProfile, hosts: int, topo: Topology, library: str = "smddp") -> StepPrediction:
    costs = [(e.ready_s, collective_seconds(e.op, e.nbytes, hosts, topo, library)) for e in profile.events]
    return StepPrediction(simulate(profile.compute_s, costs), profile.compute_s, sum(c for _, c in costs))
