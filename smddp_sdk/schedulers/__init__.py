"""Schedulers run a JobSpec somewhere. Each is imported only when asked for by name, so that importing
the estimator or the CLI never pulls in boto3 or docker."""

from __future__ import annotations

import importlib
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.schedulers.base import Scheduler
from smddp_sdk.specs.status import SCHEDULER_NAMES

_REGISTRY = {
    "local": "smddp_sdk.schedulers.local:LocalScheduler",
    "docker": "smddp_sdk.schedulers.docker:DockerScheduler",
    "sagemaker": "smddp_sdk.schedulers.sagemaker:SageMakerScheduler",
    "slurm": "smddp_sdk.schedulers.slurm:SlurmScheduler",
}
assert tuple(_REGISTRY) == SCHEDULER_NAMES


def get_scheduler(name: str, **options: Any) -> Scheduler:
    """The scheduler called ``name``, built with its options (each scheduler validates its own)."""
    return scheduler_class(name)(**options)


def scheduler_class(name: str) -> type[Scheduler]:
    """The class registered as ``name``, imported on first use (its declared ``options`` are what the
    job file, the CLI and the docs check and list)."""
    issue = unknown_scheduler(name)
    if issue is not None:
        raise SpecError(issue)
    module_name, _, class_name = _REGISTRY[name].partition(":")
    scheduler: type[Scheduler] = getattr(importlib.import_module(module_name), class_name)
    return scheduler


def unknown_scheduler(name: Any, path: str = "scheduler") -> SpecIssue | None:
    """The problem with a scheduler name nobody registered (None for a known one)."""
    if name in _REGISTRY:
        return None
    return SpecIssue(path, f"unknown scheduler {name!r}", did_you_mean(str(name), _REGISTRY) or f"expected one of {', '.join(_REGISTRY)}")


def infer_scheduler(instance_type: str) -> str:
    """``local*`` instance types run on this machine, ``ml.*`` types on SageMaker."""
    return "local" if instance_type.startswith("local") else "sagemaker"
