"""Goodput and cost under failures: what interruptions cost a job of H instances, and the checkpoint interval
that costs least. Pure (stdlib only).

Inputs (``FailureModel``): failures per instance-hour λ, spot interruptions per instance-hour σ (spot jobs),
the checkpoint interval τ (seconds of training between checkpoints) and what one checkpoint blocks
training for δ, and the recovery time R (from the fault to training again: ``status`` shows it as a
recovery's total, ``smddp-launch drill`` measures it).

The rule (first order, as Young 1974 and Daly 2006 derive it; failures independent and at a constant rate):

- a job on H instances is interrupted every M = 3600 / (H·(λ + σ)) seconds on average (its MTBF);
- each interruption costs R and redoes the work since the last checkpoint, (τ + δ)/2 on average;
- of the rest, τ/(τ + δ) trains (the remainder writes checkpoints), so

      goodput G = (1 - (R + (τ + δ)/2) / M) · τ / (τ + δ)      (0 when interruptions leave no time to train)

- the interval that wastes least is Young's τ* = √(2·δ·M) (it minimises δ/τ + τ/(2M), the two leading terms);
- cost: an instance-hour at the on-demand price p (p_spot for spot jobs) buys G productive hours, so a
  productive hour of the whole job costs H·p / G, and W hours of work take W / G hours of wall time.

The default λ comes from the published large-run figure: Llama 3 405B's pre-training saw 419 unexpected
interruptions in 54 days on 16,384 GPUs ("The Llama 3 Herd of Models", Meta, 2024, section 3.3.4), that is
419 / (16,384 · 54 · 24) per GPU-hour; an instance of G GPUs fails G times as often (Meta's servers held 8
GPUs: 1.58e-4 per instance-hour, about one failure per 6,300 instance-hours); a CPU instance or a simulated
host counts as one GPU. Override it with what your fleet shows (``--failure-rate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smddp_sdk.errors import SpecError, SpecIssue

LLAMA3_INTERRUPTIONS, LLAMA3_GPUS, LLAMA3_HOURS = 419, 16_384, 54 * 24
FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_HOURS)
LLAMA3_SOURCE = "Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs (Meta, 2024)"
# What the planner assumes unless told (each shown in its output): a checkpoint every 30 minutes that blocks
# training for 30 s, and a recovery of 10 minutes (new instances and the image on SageMaker; measure yours
# with `smddp-launch drill`, whose recoveries on this machine take about 30 s: docs/resuming.md).
DEFAULT_CHECKPOINT_INTERVAL_S, DEFAULT_CHECKPOINT_S, DEFAULT_RECOVERY_S = 1800.0, 30.0, 600.0


def default_failure_rate(gpus_per_instance: int) -> float:
    """Failures per instance-hour from the Llama 3 figure, for an instance of ``gpus_per_instance`` GPUs."""
    return FAILURES_PER_GPU_HOUR * max(1, gpus_per_instance)


def model_for(gpus_per_instance: int, *, failure_rate: float | None = None, checkpoint_interval_s: float | None = None,
              checkpoint_s: float | None = None, recovery_s: float | None = None, spot_rate: float | None = None) -> tuple[FailureModel, str]:
    """The model with every figure not given at its default, and where its failure rate comes from."""
    for name, value in (("failure_rate", failure_rate), ("checkpoint_s", checkpoint_s), ("recovery_s", recovery_s), ("spot_rate", spot_rate)):
        if value is not None and (value < 0 or not math.isfinite(value)):
            raise SpecError(SpecIssue(name, f"must be a finite number >= 0, got {value}"))
    if checkpoint_interval_s is not None and not (0 < checkpoint_interval_s < math.inf):
        raise SpecError(SpecIssue("checkpoint_interval", f"must be a number of seconds > 0, got {checkpoint_interval_s}"))
    source = "given" if failure_rate is not None else f"{LLAMA3_SOURCE}, at {max(1, gpus_per_instance)} GPU(s) per instance"
    model = FailureModel(
        failure_rate if failure_rate is not None else default_failure_rate(gpus_per_instance),
        checkpoint_interval_s if checkpoint_interval_s is not None else DEFAULT_CHECKPOINT_INTERVAL_S,
        checkpoint_s if checkpoint_s is not None else DEFAULT_CHECKPOINT_S,
        recovery_s if recovery_s is not None else DEFAULT_RECOVERY_S,
        spot_rate or 0.0,
    )
    return model, source


@dataclass(frozen=True)
class FailureModel:
    failure_rate: float  # failures per instance-hour (λ)
    checkpoint_interval_s: float  # τ
    checkpoint_s: float  # δ: what one checkpoint blocks training for
    recovery_s: float  # R: fault -> training again
    spot_rate: float = 0.0  # spot interruptions per instance-hour (σ), for spot jobs

    def mtbf_s(self, instances: int) -> float:
        """Seconds between interruptions of the whole job (inf when nothing fails)."""
        rate = instances * (self.failure_rate + self.spot_rate)
        return math.inf if rate <= 0 else 3600.0 / rate

    def goodput(self, instances: int, interval_s: float | None = None) -> float:
        """G at ``interval_s`` (the model's interval by default), by the rule in this module's docstring."""
        tau = self.checkpoint_interval_s if interval_s is None else interval_s
        period = tau + self.checkpoint_s
        lost = (self.recovery_s + period / 2) / self.mtbf_s(instances)
        return max(0.0, 1.0 - lost) * tau / period

    def optimal_interval_s(self, instances: int) -> float:
        """Young's interval √(2·δ·M); inf when nothing fails, and δ itself when a checkpoint costs nothing."""
        return math.sqrt(2 * self.checkpoint_s * self.mtbf_s(instances))


@dataclass(frozen=True)
class FailureRow:
    instances: int
    mtbf_hours: float | None  # None: nothing fails
    interruptions_per_day: float
    goodput: float
    optimal_interval_s: float | None
    goodput_at_optimal: float | None
    cost_per_productive_hour: float | None  # the whole job's, at the on-demand (or spot) price


def failure_rows(model: FailureModel, counts: list[int], price_per_hour: float | None) -> list[FailureRow]:
    rows = []
    for instances in counts:
        mtbf = model.mtbf_s(instances)
        good = model.goodput(instances)
        optimal = model.optimal_interval_s(instances) if math.isfinite(mtbf) and model.checkpoint_s > 0 else None
        cost = instances * price_per_hour / good if price_per_hour and good > 0 else None
        rows.append(FailureRow(instances, mtbf / 3600 if math.isfinite(mtbf) else None, 0.0 if not math.isfinite(mtbf) else 86400 / mtbf,
                               good, optimal, model.goodput(instances, optimal) if optimal else None, cost))
    return rows


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def render_failures(model: FailureModel, rows: list[FailureRow], source: str, spot_price: float | None) -> str:
    head = (f"under failures: {model.failure_rate:.3g} failures per instance-hour ({source})"
            + (f" + {model.spot_rate:.3g} spot interruptions" if model.spot_rate else "")
            + f"; checkpoint every {_duration(model.checkpoint_interval_s)}, each {model.checkpoint_s:g} s; recovery {model.recovery_s:.1f} s")
    cols = f"{'hosts':>5} {'MTBF':>9} {'faults/day':>10} {'goodput':>8} {'best interval':>13} {'its goodput':>11} {'$/productive h':>14}"
    lines = [head, "", cols, "-" * len(cols)]
    for row in rows:
        mtbf = _duration(row.mtbf_hours * 3600 if row.mtbf_hours is not None else None)
        at_best = "n/a" if row.goodput_at_optimal is None else f"{row.goodput_at_optimal:.1%}"
        cost = "n/a" if row.cost_per_productive_hour is None else f"{row.cost_per_productive_hour:.2f}"
        lines.append(f"{row.instances:>5} {mtbf:>9} {row.interruptions_per_day:>10.2f} {row.goodput:>8.1%} "
                     f"{_duration(row.optimal_interval_s):>13} {at_best:>11} {cost:>14}")
    if spot_price is not None:
        lines.append(f"note: costs at the spot price {spot_price:g} USD per instance-hour")
    lines.append("note: goodput = (1 - (recovery + (interval + checkpoint)/2) / MTBF) x interval / (interval + checkpoint); "
                 "best interval: Young's sqrt(2 x checkpoint x MTBF) (docs/planning.md)")
    return "\n".join(lines) + "\n"
