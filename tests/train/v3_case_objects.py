"""A parity case's text turned into ModelTrainer's objects, with whichever ``configs`` and ``distributed``
modules are given: v3's own (v3_oracle.py, in the oracle's virtualenv) or smddp_sdk.train's
(test_v3_parity.py), so both sides build their trainer the same way. Standard library only."""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

CONFIG_CLASSES = {
    "source_code": "SourceCode",
    "compute": "Compute",
    "networking": "Networking",
    "stopping_condition": "StoppingCondition",
    "output_data_config": "OutputDataConfig",
    "checkpoint_config": "CheckpointConfig",
}


def trainer_arguments(trainer: dict[str, Any], configs: ModuleType, distributed: ModuleType) -> dict[str, Any]:
    """ModelTrainer's keyword arguments from the case's ``trainer`` mapping."""
    arguments = copy.deepcopy(trainer)
    for name, class_name in CONFIG_CLASSES.items():
        if name in arguments:
            arguments[name] = getattr(configs, class_name)(**arguments[name])
    if "distributed" in arguments:
        ((kind, options),) = arguments["distributed"].items()
        if "smp" in options:
            options["smp"] = distributed.SMP(**options["smp"])
        arguments["distributed"] = getattr(distributed, kind)(**options)
    if "input_data_config" in arguments:
        arguments["input_data_config"] = [input_data(channel, configs) for channel in arguments["input_data_config"]]
    if "tags" in arguments:
        arguments["tags"] = [configs.Tag(**tag) for tag in arguments["tags"]]
    return arguments


def input_data(channel: dict[str, Any], configs: ModuleType) -> Any:
    source = channel["data_source"]
    source = configs.S3DataSource(**source) if isinstance(source, dict) else source
    return configs.InputData(**{**channel, "data_source": source})


def with_builders(trainer: Any, builders: dict[str, Any] | None, configs: ModuleType) -> Any:
    """The case's ``with_*`` builders called on ``trainer``."""
    builders = builders or {}
    if "retry_strategy" in builders:
        trainer = trainer.with_retry_strategy(configs.RetryStrategy(**builders["retry_strategy"]))
    if "metric_definitions" in builders:
        trainer = trainer.with_metric_definitions([configs.MetricDefinition(**metric) for metric in builders["metric_definitions"]])
    if "checkpoint_config" in builders:
        trainer = trainer.with_checkpoint_config(configs.CheckpointConfig(**builders["checkpoint_config"]))
    return trainer


def train_inputs(case: dict[str, Any], configs: ModuleType) -> list[Any] | None:
    return [input_data(channel, configs) for channel in case["inputs"]] if case.get("inputs") else None
