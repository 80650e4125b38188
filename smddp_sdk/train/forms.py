"""One job written both ways: the v2 estimator's launcher for a ``JobSpec``, or v3's ``ModelTrainer``'s.

``smddp-launch run job.yaml --dryrun --as v3`` prints the ``ModelTrainer`` code (and the v3-shaped request)
of a job written for v2, ``--as v2`` the ``PyTorch`` estimator code of one written for v3. The rule: every
field with a counterpart in the other API is written with it; every other field is a comment saying what
becomes of it (docs/migration-v3.md). Pure: text from a spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from smddp_sdk.specs.job import JobSpec

_V2_ONLY = {
    "dependencies": "v3 has no dependencies (sagemaker-python-sdk#5668): copy them into source_dir",
    "framework_version": "v3 takes training_image instead of framework_version/py_version",
    "py_version": "v3 takes training_image instead of framework_version/py_version",
    "code_location": "v3 stages code under <bucket>/<base_job_name>/<job>/input",
    "container_log_level": "v3 has no container_log_level",
    "debugger_hook_config": "v3 sends no debugger hook",
    "disable_profiler": "v3 sends no profiler config",
    "enable_sagemaker_metrics": "v3 has no enable_sagemaker_metrics",
    "job_name": "v3 always names the job <base_job_name>-<timestamp>",
}


def written_as(spec: JobSpec, plan: Any, *, processes_per_host: int | None = None) -> str:
    """The launcher of ``spec`` in its own API (``spec.api``); the plan's image stands in for one v2 resolved,
    and the scheduler's ranks per host become v3's ``process_count_per_node``."""
    if spec.api == "v2":
        return estimator_source(spec)
    request = getattr(plan, "request", None)
    image = request.get("AlgorithmSpecification", {}).get("TrainingImage") if isinstance(request, dict) else None
    return model_trainer_source(spec, image=image, processes_per_host=processes_per_host)


def model_trainer_source(spec: JobSpec, *, image: str | None = None, processes_per_host: int | None = None) -> str:
    """v3 launcher code for ``spec``; ``image`` stands in for a training_image v2 resolved itself."""
    configs: list[str] = ["SourceCode", "Compute"]
    arguments = [f"training_image={spec.image_uri or image or '<training image>'!r}"]
    if spec.role:
        arguments.append(f"role={spec.role!r}")
    if spec.base_job_name:
        arguments.append(f"base_job_name={spec.base_job_name!r}")
    source = {"source_dir": spec.source_dir, "entry_script": spec.entry_point}
    arguments.append(f"source_code=SourceCode({_keywords(source)})")
    compute = {
        "instance_type": spec.instance_type,
        "instance_count": spec.instance_count,
        "volume_size_in_gb": spec.volume_size,
        "keep_alive_period_in_seconds": spec.keep_alive_period_in_seconds,
        "enable_managed_spot_training": spec.use_spot_instances or None,
    }
    arguments.append(f"compute=Compute({_keywords(compute)})")
    arguments.append(f"stopping_condition=StoppingCondition({_keywords({'max_runtime_in_seconds': spec.max_run, 'max_wait_time_in_seconds': spec.max_wait})})")
    configs.append("StoppingCondition")
    runner, runner_class = _runner(spec, processes_per_host)
    if runner:
        arguments.append(f"distributed={runner}")
    network = {
        "subnets": list(spec.subnets) or None,
        "security_group_ids": list(spec.security_group_ids) or None,
        "enable_network_isolation": spec.enable_network_isolation or None,
        "enable_inter_container_traffic_encryption": spec.encrypt_inter_container_traffic or None,
    }
    if any(value is not None for value in network.values()):
        arguments.append(f"networking=Networking({_keywords(network)})")
        configs.append("Networking")
    if spec.output_path:
        arguments.append(f"output_data_config=OutputDataConfig(s3_output_path={spec.output_path!r})")
        configs.append("OutputDataConfig")
    if spec.checkpoint_s3_uri or spec.checkpoint_local_path:
        arguments.append(f"checkpoint_config=CheckpointConfig({_keywords({'s3_uri': spec.checkpoint_s3_uri, 'local_path': spec.checkpoint_local_path})})")
        configs.append("CheckpointConfig")
    if spec.input_mode != "File":
        arguments.append(f"training_input_mode={spec.input_mode!r}")
    for name in ("environment", "hyperparameters"):
        if getattr(spec, name):
            arguments.append(f"{name}={dict(getattr(spec, name))!r}")
    if spec.tags:
        arguments.append(f"tags={[{'key': tag['Key'], 'value': tag['Value']} for tag in spec.tags]!r}")
    builders = []
    if spec.max_retry_attempts is not None:
        builders.append(f".with_retry_strategy(RetryStrategy(maximum_retry_attempts={spec.max_retry_attempts}))")
        configs.append("RetryStrategy")
    if spec.metric_definitions:
        metrics = ", ".join(f"MetricDefinition(name={m['Name']!r}, regex={m['Regex']!r})" for m in spec.metric_definitions)
        builders.append(f".with_metric_definitions([{metrics}])")
        configs.append("MetricDefinition")
    channels = [f"InputData({_keywords({'channel_name': name, 'data_source': channel.s3_data, 'content_type': channel.content_type})})" for name, channel in spec.inputs.items()]
    if channels:
        configs.append("InputData")
    lines = ["from smddp_sdk.train import ModelTrainer  # sagemaker.train in SageMaker SDK v3", f"from smddp_sdk.train.configs import {', '.join(sorted(configs))}"]
    if runner_class:
        lines.append(f"from smddp_sdk.train.distributed import {runner_class}")
    lines += ["", *_dropped(spec), "trainer = ModelTrainer(", *[f"    {argument}," for argument in arguments], ")" + "".join(builders)]
    lines.append(f"trainer.train(input_data_config=[{', '.join(channels)}])" if channels else "trainer.train()")
    return "\n".join(lines)


def estimator_source(spec: JobSpec) -> str:
    """v2 launcher code for ``spec`` (every v3 field has a v2 counterpart)."""
    defaults = JobSpec(entry_point="", instance_type="")
    shown = {}
    for item in dataclasses.fields(JobSpec):
        value = getattr(spec, item.name)
        if item.name in ("api", "inputs") or value == getattr(defaults, item.name):
            continue
        shown[item.name] = _plain(value)
    shown["distribution"] = dict(spec.distribution.given) or None
    inputs = {name: channel.s3_data for name, channel in spec.inputs.items()}
    lines = ["from smddp_sdk import PyTorch  # sagemaker.pytorch in SageMaker SDK v2", "", "estimator = PyTorch("]
    lines += [f"    {name}={value!r}," for name, value in shown.items() if value is not None]
    lines += [")", f"estimator.fit({inputs!r})" if inputs else "estimator.fit()"]
    return "\n".join(lines)


def _runner(spec: JobSpec, processes_per_host: int | None) -> tuple[str, str]:
    distribution = spec.distribution
    ranks = _keywords({"process_count_per_node": processes_per_host})
    if distribution.mpi:
        options = {"process_count_per_node": distribution.mpi_processes_per_host or processes_per_host, "mpi_additional_options": distribution.mpi_custom_mpi_options.split() or None}
        return f"MPI({_keywords(options)})", "MPI"
    if distribution.modelparallel is not None:
        parameters = dict(distribution.modelparallel.get("parameters") or {})
        return f"Torchrun(smp=SMP({_keywords(parameters)}))", "SMP, Torchrun"
    if distribution.smddp or distribution.torch_distributed:  # SMDDP runs through Torchrun in v3 (AWS's docs)
        return f"Torchrun({ranks})", "Torchrun"
    return "", ""


def _dropped(spec: JobSpec) -> list[str]:
    defaults = JobSpec(entry_point="", instance_type="")
    return [f"# {name}={_plain(getattr(spec, name))!r}: {why}" for name, why in _V2_ONLY.items() if getattr(spec, name) != getattr(defaults, name)]


def _keywords(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items() if value is not None)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "items"):
        return {key: _plain(item) for key, item in value.items()}
    return value
