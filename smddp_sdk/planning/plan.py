"""A plan: for each instance count, predicted step time, scaling efficiency, throughput and cost, for smddp
and for the stock library, rendered as a table, JSON or an SVG plot.

Scaling efficiency = compute per step / predicted step: the share of ideal linear scaling (every GPU busy
computing all the time) that remains once communication is counted. Throughput = samples per rank x
ranks / step. Cost per hour = instances x price; per epoch = cost per hour x epoch time. Columns whose
input is missing (no price, no batch size, no epoch size) say n/a rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from smddp_sdk.planning.costmodel import AWS_SMDDP, BUNDLED, LIBRARIES, NCCL, collective_cost, implementation
from smddp_sdk.planning.failures import FailureModel, FailureRow, failure_rows, render_failures
from smddp_sdk.planning.hardware import Topology
from smddp_sdk.planning.step import StepProfile, predict

# What each implementation is, for the plan's notes.
DESCRIPTIONS = {
    AWS_SMDDP: "AWS's SMDDP library, which SageMaker runs for backend='smddp' on GPUs: all_reduce reduce-scatters within "
    "the node over NVLink, reduces 1/H of every balanced fusion buffer on each node's CPUs (parameter servers) "
    "and gathers back: two network steps per bucket at any instance count",
    NCCL: "NCCL, ring or tree (whichever is faster for the size, as its tuner picks)",
    BUNDLED: "this project's bundled backend, its inter-host algorithm chosen by size and host count (smddp_sdk/planning/selection.py, the runtime's rules)",
    "gloo": "gloo, one flat ring over all ranks",
}


@dataclass(frozen=True)
class Row:
    instances: int
    library: str
    implementation: str
    algorithm: str  # for the step's largest collective
    ranks: int
    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    efficiency: float
    samples_per_s: float | None
    cost_per_hour: float | None
    epoch_hours: float | None
    cost_per_epoch: float | None


@dataclass(frozen=True)
class Plan:
    instance_type: str
    topology: Topology
    profile: StepProfile
    rows: tuple[Row, ...]
    samples_per_epoch: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    failure_model: FailureModel | None = None  # goodput and cost under failures (planning.failures)
    failure_source: str = ""
    failures: tuple[FailureRow, ...] = ()
    spot_price_per_hour: float | None = None

    def row(self, instances: int, library: str) -> Row:
        return next(r for r in self.rows if r.instances == instances and r.library == library)

    def as_dict(self) -> dict:
        return {
            "instance_type": self.instance_type,
            "topology": asdict(self.topology),
            "compute_s": self.profile.compute_s,
            "bytes_per_step": self.profile.bytes_per_step,
            "collectives_per_step": len(self.profile.events),
            "profile_source": self.profile.source,
            "samples_per_rank": self.profile.samples_per_rank,
            "samples_per_epoch": self.samples_per_epoch,
            "units": {**dict.fromkeys(("step_s", "compute_s", "comm_s", "exposed_s"), "s"), "efficiency": "fraction", "samples_per_s": "samples/s",
                      "cost_per_hour": "USD/h", "epoch_hours": "h", "cost_per_epoch": "USD"},
            "rows": [asdict(r) for r in self.rows],
            "notes": list(self.notes),
            "failures": None if self.failure_model is None else {
                "model": asdict(self.failure_model), "source": self.failure_source, "spot_price_per_hour": self.spot_price_per_hour,
                "units": {"failure_rate": "1/instance-hour", "spot_rate": "1/instance-hour", "mtbf_hours": "h", "goodput": "fraction",
                          "optimal_interval_s": "s", "cost_per_productive_hour": "USD/h"},
                "rows": [asdict(row) for row in self.failures]},
        }


def parse_counts(text: str) -> list[int]:
    """ "2,4,8" -> [2, 4, 8]; a clear error for anything else."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"instance counts are whole numbers separated by commas (like 1,2,4,8), got {text!r}") from None
    if not counts or any(c < 1 or c > 4096 for c in counts):
        raise ValueError(f"instance counts must be between 1 and 4096, got {text!r}")
    return sorted(set(counts))


def with_failures(plan: Plan, model: FailureModel, source: str, spot_price_per_hour: float | None = None) -> Plan:
    """``plan`` with goodput and cost under failures for each of its instance counts (``planning.failures``)."""
    price = spot_price_per_hour if spot_price_per_hour is not None else plan.topology.price_per_hour
    rows = failure_rows(model, sorted({row.instances for row in plan.rows}), price)
    return replace(plan, failure_model=model, failure_source=source, failures=tuple(rows), spot_price_per_hour=spot_price_per_hour)


def make_plan(profile: StepProfile, instance_type: str, topo: Topology, counts: Sequence[int], samples_per_epoch: int | None = None, libraries: Sequence[str] = LIBRARIES) -> Plan:
    rows = []
    largest = max(profile.events, key=lambda e: e.nbytes, default=None)
    for instances in counts:
        ranks = instances * topo.gpus
        for library in libraries:
            p = predict(profile, instances, topo, library)
            algorithm = collective_cost(largest.op, largest.nbytes, instances, topo, library).algorithm if largest else "none"
            per_s = profile.samples_per_rank * ranks / p.step_s if profile.samples_per_rank else None
            per_hour = topo.price_per_hour * instances if topo.price_per_hour else None
            epoch_h = samples_per_epoch / per_s / 3600 if (per_s and samples_per_epoch) else None
            rows.append(
                Row(
                    instances,
                    library,
                    implementation(topo, library),
                    algorithm,
                    ranks,
                    p.step_s,
                    p.compute_s,
                    p.comm_s,
                    p.exposed_s,
                    p.compute_s / p.step_s,
                    per_s,
                    per_hour,
                    epoch_h,
                    per_hour * epoch_h if (per_hour and epoch_h) else None,
                )
            )
    notes = list(profile.notes) + [f"{library} on {instance_type} is {DESCRIPTIONS[implementation(topo, library)]}" for library in libraries]
    notes += _why_smddp_is_slower(rows, profile, topo)
    if topo.price_per_hour is None:
        notes.append(f"no price for {instance_type}: pass --price-per-hour from your region's SageMaker pricing page")
    return Plan(instance_type, topo, profile, tuple(rows), samples_per_epoch, tuple(notes))


def _why_smddp_is_slower(rows: Sequence[Row], profile: StepProfile, topo: Topology) -> list[str]:
    """A reason for every instance count where smddp's predicted step is longer than stock's: the two
    libraries' cost of the step's largest collective, latency and transfer apart."""
    largest = max(profile.events, key=lambda e: e.nbytes, default=None)
    by_key = {(r.instances, r.library): r for r in rows}
    reasons = []
    for (instances, library), smddp in by_key.items():
        stock = by_key.get((instances, "stock"))
        if library != "smddp" or stock is None or largest is None or smddp.step_s <= stock.step_s * 1.001:
            continue
        mine, theirs = (collective_cost(largest.op, largest.nbytes, instances, topo, lib) for lib in ("smddp", "stock"))
        reasons.append(
            f"{instances} instances: smddp predicted {smddp.step_s / stock.step_s - 1:.0%} slower. Per "
            f"{largest.nbytes / 1e6:.3g} MB {largest.op}, {mine.implementation} runs {mine.algorithm}"
            f"{f' ({mine.note})' if mine.note else ''}: "
            f"{mine.latency_s * 1e3:.2f} ms of latency + {mine.transfer_s * 1e3:.2f} ms of transfer, against "
            f"{theirs.implementation} {theirs.algorithm}: {theirs.latency_s * 1e3:.2f} + {theirs.transfer_s * 1e3:.2f} ms"
        )
    return reasons


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def _hours(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.2f} h"
    return f"{value * 60:.1f} min" if value * 60 >= 1 else f"{value * 3600:.1f} s"


def render_table(plan: Plan) -> str:
    t = plan.topology
    moved = plan.profile.bytes_per_step
    head = [
        f"{plan.instance_type}: {t.gpus} {'GPU(s)' if t.gpu else 'rank(s)'}/host, network {t.network_gbit_s:.3g} Gbit/s, "
        f"compute {plan.profile.compute_s * 1e3:.1f} ms/step, {moved / 1e6:.3g} MB in "
        f"{len(plan.profile.events)} collective(s)/step ({plan.profile.source or 'figures'})",
        "",
    ]
    cols = f"{'hosts':>5} {'ranks':>5} {'library':<7} {'algorithm':<14} {'step':>10} {'exposed':>10} {'effic.':>7} {'samples/s':>10} {'$/hour':>8} {'epoch':>9} {'$/epoch':>8}"
    lines = [cols, "-" * len(cols)]
    for r in plan.rows:
        lines.append(
            f"{r.instances:>5} {r.ranks:>5} {r.library:<7} {r.algorithm:<14} {r.step_s * 1e3:>7.1f} ms {r.exposed_s * 1e3:>7.1f} ms "
            f"{r.efficiency:>6.0%} {_fmt(r.samples_per_s, '{:.0f}'):>10} {_fmt(r.cost_per_hour, '{:.2f}'):>8} "
            f"{_hours(r.epoch_hours):>9} {_fmt(r.cost_per_epoch, '{:.2f}'):>8}"
        )
    table = "\n".join(head + lines + [""] + [f"note: {n}" for n in plan.notes]) + "\n"
    if plan.failure_model is None:
        return table
    return table + "\n" + render_failures(plan.failure_model, list(plan.failures), plan.failure_source, plan.spot_price_per_hour)


def render_svg(plan: Plan, width: int = 560, height: int = 320) -> str:
    """Scaling efficiency against instance count, one line per library (hand-written SVG, no plotting lib)."""
    left, right, top, bottom = 60, 20, 30, 50
    counts = sorted({r.instances for r in plan.rows})
    xs = {c: left + (width - left - right) * (i / max(1, len(counts) - 1)) for i, c in enumerate(counts)}

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - max(0.0, min(1.0, value)))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="18">Predicted scaling efficiency, {plan.instance_type}</text>',
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/><text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.0%}</text>')
    for c, x in xs.items():
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 18}" text-anchor="middle">{c}</text>')
    parts.append(f'<text x="{(width + left) / 2:.0f}" y="{height - 10}" text-anchor="middle">instances</text>')
    colours = {"smddp": "#1f77b4", "stock": "#d62728"}
    for index, library in enumerate(dict.fromkeys(r.library for r in plan.rows)):
        points = " ".join(f"{xs[r.instances]:.1f},{y(r.efficiency):.1f}" for r in plan.rows if r.library == library)
        colour = colours.get(library, "#555")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{width - right - 90}" y="{top + 16 * (index + 1)}" fill="{colour}">{library}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
