"""Planning before renting: predicted step time, scaling efficiency and cost on 1-4096 instances.

Stdlib only (the CLI and the estimator use it without torch). The pieces:

* ``hardware``   instance topologies (GPUs, intra-host and network bandwidth) with sources; simulated hosts
* ``selection``  the bundled backend's inter-host algorithm for a size and host count (shared with the runtime)
* ``costmodel``  alpha-beta cost of each collective for what runs on the target: AWS SMDDP and NCCL on GPU
                 instance types, the bundled backend's algorithms and gloo on CPU and simulated hosts
* ``step``       a step's compute and its collectives; overlap of communication with backward
* ``profile_io`` step profiles recorded with SMDDP_PROFILE (smddp_sdk/collectives/profile.py)
* ``failures``   goodput and cost under failures: failure rate, checkpoint interval (and its optimum), recovery time
* ``plan``       the table, JSON and SVG of ``smddp-launch plan``

``plan_job`` is the one entry point the CLI and ``Estimator.plan`` share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.planning.failures import model_for
from smddp_sdk.planning.hardware import CATALOG, topology
from smddp_sdk.planning.plan import Plan, make_plan, parse_counts, with_failures
from smddp_sdk.planning.profile_io import read_step_profile
from smddp_sdk.planning.step import StepProfile, from_figures

__all__ = ["Plan", "StepProfile", "plan_for_spec", "plan_job", "step_profile"]

BATCH_KEYS = ("batch-size", "batch_size", "per_device_train_batch_size", "train_batch_size")


def batch_size_of(hyperparameters: Mapping[str, Any]) -> int | None:
    """Samples per rank and step, when the job's hyperparameters say (batch-size and its usual spellings)."""
    for key in BATCH_KEYS:
        value = hyperparameters.get(key)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
    return None


def step_profile(profile: str | None = None, compute_ms: float | None = None, gradient_mb: float | None = None, bucket_mb: float = 25.0, samples_per_rank: int | None = None) -> StepProfile:
    """The step to plan for: a recorded profile (its compute replaced by ``compute_ms`` when given, for the
    target GPU), or the two figures compute_ms and gradient_mb."""
    if profile:
        step = read_step_profile(profile)
        if compute_ms is not None:
            step = step.with_compute(compute_ms / 1e3)
    elif compute_ms is not None and gradient_mb is not None:
        if compute_ms <= 0 or gradient_mb <= 0 or bucket_mb <= 0:
            raise SpecError(SpecIssue("compute_ms", "compute time, gradient size and bucket size must be positive"))
        step = from_figures(compute_ms / 1e3, int(gradient_mb * 1e6), int(bucket_mb * 1e6))
    else:
        raise SpecError(SpecIssue("profile", "the planner needs the job's step", "record one with SMDDP_PROFILE=<dir> and pass --profile <dir>, or give --compute-ms and --gradient-mb"))
    if samples_per_rank is not None:
        step = dataclasses.replace(step, samples_per_rank=samples_per_rank)
    return step


def plan_job(instance_type: str, instances: str | Sequence[int], step: StepProfile, price_per_hour: float | None = None, samples_per_epoch: int | None = None) -> Plan:
    if isinstance(instances, str):
        try:
            counts = parse_counts(instances)
        except ValueError as exc:
            raise SpecError(SpecIssue("instances", str(exc))) from exc
    else:
        counts = sorted(set(instances))
    if samples_per_epoch is not None and samples_per_epoch <= 0:
        raise SpecError(SpecIssue("samples_per_epoch", f"must be positive, got {samples_per_epoch}"))
    topo = topology(instance_type, price_per_hour)
    return make_plan(step, instance_type, topo, counts, samples_per_epoch)


def plan_for_spec(
    spec: Any,
    instances: str | Sequence[int] = "1,2,4,8,16,32",
    *,
    instance_type: str | None = None,
    profile: str | None = None,
    compute_ms: float | None = None,
    gradient_mb: float | None = None,
    bucket_mb: float = 25.0,
    batch_size: int | None = None,
    samples_per_epoch: int | None = None,
    price_per_hour: float | None = None,
    failure_rate: float | None = None,
    checkpoint_interval: float | None = None,
    checkpoint_seconds: float | None = None,
    recovery_seconds: float | None = None,
    spot_rate: float | None = None,
    spot_price_per_hour: float | None = None,
) -> Plan:
    """The plan for a job (a JobSpec, or None): its instance type and batch size unless given, with goodput and
    cost under failures (``planning.failures``; each figure not given at its stated default)."""
    if spec is not None:
        instance_type = instance_type or spec.instance_type
        batch_size = batch_size if batch_size is not None else batch_size_of(spec.hyperparameters)
    if not instance_type:
        raise SpecError(SpecIssue("instance_type", "no instance type to plan for", "pass --instance-type or a job file"))
    if instance_type not in CATALOG and not instance_type.startswith("sim:"):
        raise SpecError(
            SpecIssue(
                "instance_type",
                f"the planner has no network figures for {instance_type!r}",
                f"pass --instance-type (instance_type=), one of {', '.join(sorted(CATALOG))}, or sim:<rate>mbit[+<delay>ms]",
            )
        )
    step = step_profile(profile, compute_ms, gradient_mb, bucket_mb, batch_size)
    planned = plan_job(instance_type, instances, step, price_per_hour, samples_per_epoch)
    model, source = model_for(planned.topology.gpus if planned.topology.gpu else 1, failure_rate=failure_rate, checkpoint_interval_s=checkpoint_interval,
                              checkpoint_s=checkpoint_seconds, recovery_s=recovery_seconds, spot_rate=spot_rate)
    return with_failures(planned, model, source, spot_price_per_hour)
