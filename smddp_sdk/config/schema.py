"""The job file's JSON Schema, generated from ``JobSpec`` so the two cannot drift.

Editors use it for completion and checks (``# yaml-language-server: $schema=...``); the job-file
reference in docs/ is rendered from the same data. Validation itself stays in ``JobSpec.from_mapping``,
which reports every problem with a hint; the schema is the editor's view of the same rules.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from smddp_sdk.specs import distribution as distribution_module
from smddp_sdk.specs import instance_types, limits
from smddp_sdk.specs import job as job_module
from smddp_sdk.specs.job import JobSpec, TrainingInput
from smddp_sdk.specs.status import SCHEDULER_NAMES

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE_NAME = "smddp-job.schema.json"

# Keys a job file has beyond the JobSpec fields.
EXTRA_KEYS = ("scheduler", "scheduler_options")

# One line per field: what it means here. A test checks every JobSpec field has one.
FIELD_DOCS: dict[str, str] = {
    "entry_point": "The training script, relative to source_dir when that is set (else a path to the file).",
    "instance_type": "Where each host runs: `local`, `local_gpu` or an `ml.*` type; local schedulers simulate the type's GPUs as ranks.",
    "instance_count": "Number of hosts (`algo-1` ... `algo-N`).",
    "source_dir": "Directory packaged as the job's code; the entry point and its imports live here.",
    "dependencies": "Extra directories copied next to the code (as SageMaker SDK v2's `dependencies`).",
    "hyperparameters": "Passed to the script as `--name value` arguments and in `/opt/ml/input/config/hyperparameters.json`.",
    "distribution": "How ranks are launched: `smdistributed.dataparallel`, `torch_distributed`, `mpi`, `pytorchddp` or `smdistributed.modelparallel`.",
    "inputs": "Data channels: a channel name mapped to an `s3://` URI, `file://` URI, local path or a TrainingInput mapping.",
    "environment": "Environment variables for every rank (string values).",
    "role": "IAM role ARN the SageMaker job runs as (SageMaker only).",
    "image_uri": "Training image; defaults per scheduler (the smddp-sdk image for docker, a PyTorch DLC on SageMaker).",
    "framework_version": "PyTorch version used to pick a SageMaker image when image_uri is not set.",
    "py_version": "Python version tag used with framework_version (for example `py311`).",
    "output_path": "Where model and output archives go: `s3://...` on SageMaker, a local path or `file://` locally.",
    "code_location": "S3 prefix for the packaged source (default: under output_path's bucket).",
    "base_job_name": "Prefix of generated job names (default `pytorch-training`).",
    "job_name": "Exact job name; generated from base_job_name and a timestamp when not set.",
    "max_run": "Seconds the job may run before it is stopped.",
    "max_wait": "Seconds to wait for spot capacity plus run time (spot training only).",
    "volume_size": "GiB of storage attached to each SageMaker host.",
    "input_mode": "How SageMaker delivers data: `File`, `Pipe` or `FastFile`.",
    "use_spot_instances": "Train on SageMaker managed spot capacity (needs max_wait).",
    "checkpoint_s3_uri": "S3 URI kept in sync with checkpoint_local_path on SageMaker.",
    "checkpoint_local_path": "Directory in the container synced to checkpoint_s3_uri (default `/opt/ml/checkpoints`).",
    "max_retry_attempts": "How many times the job is retried after the platform's failure (SageMaker's RetryStrategy); every scheduler obeys it.",
    "keep_alive_period_in_seconds": "Seconds SageMaker keeps warm-pool instances after the job.",
    "container_log_level": "Python logging level of the in-container toolkit (`sagemaker_container_log_level`).",
    "tags": "Tags on the SageMaker job: a list of `{Key, Value}` or a mapping.",
    "subnets": "VPC subnet ids for the SageMaker job.",
    "security_group_ids": "VPC security group ids for the SageMaker job.",
    "encrypt_inter_container_traffic": "Encrypt traffic between SageMaker hosts.",
    "enable_network_isolation": "Run the SageMaker container without network access.",
    "disable_output_compression": "SageMaker uploads the model and output uncompressed (`CompressionType: NONE`); local schedulers still write `model.tar.gz`.",
    "debugger_hook_config": "SageMaker Debugger hook: false turns it off (as in SageMaker SDK v2).",
    "disable_profiler": "Turn off the SageMaker profiler.",
    "enable_sagemaker_metrics": "Publish metric_definitions to SageMaker's metrics.",
    "metric_definitions": "Metrics parsed from the logs: a list of `{Name, Regex}`.",
    "api": "The SageMaker Python SDK the job mirrors: `v2` (the estimator) or `v3` (`ModelTrainer`); only the SageMaker request's shape differs (docs/migration-v3.md).",
    "scheduler": "Where the job runs: `local`, `docker`, `sagemaker` or `slurm` (default: `local` for local* instance types, else `sagemaker`).",
    "scheduler_options": "Options by scheduler (`local:`, `docker:`, `sagemaker:`, `slurm:`), the chosen one's passed to it as keyword arguments (`smddp-launch options <scheduler>` lists them); see [scheduler_options](#scheduler_options).",
}

_NONE_TYPE = type(None)


def field_defaults() -> dict[str, Any]:
    """JobSpec's defaults in their job-file form (required fields are absent)."""
    out: dict[str, Any] = {}
    for spec_field in dataclasses.fields(JobSpec):
        if spec_field.default is not dataclasses.MISSING:
            out[spec_field.name] = _plain(spec_field.default)
        elif spec_field.default_factory is not dataclasses.MISSING:
            out[spec_field.name] = _plain(spec_field.default_factory())
    return out


def scalar_kind(name: str) -> str | None:
    """ "str", "int" or "bool" for fields written as one scalar (nullable ones included); None otherwise."""
    members = [m for m in job_module._SIMPLE_TYPES.get(name, ()) if m is not _NONE_TYPE]
    return members[0].__name__ if len(members) == 1 else None


def job_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a job file."""
    hints = typing.get_type_hints(JobSpec)
    defaults = field_defaults()
    properties: dict[str, Any] = {}
    for spec_field in dataclasses.fields(JobSpec):
        schema = _field_schema(spec_field.name, hints[spec_field.name])
        schema["description"] = FIELD_DOCS[spec_field.name]
        if spec_field.name in defaults:
            schema["default"] = defaults[spec_field.name]
        properties[spec_field.name] = schema
    properties["scheduler"] = {"enum": list(SCHEDULER_NAMES), "description": FIELD_DOCS["scheduler"]}
    properties["scheduler_options"] = {"type": "object", "description": FIELD_DOCS["scheduler_options"]}
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "smddp-sdk job file",
        "description": "A training job for smddp-launch: SageMaker SDK v2 estimator arguments plus scheduler and scheduler_options.",
        "type": "object",
        "additionalProperties": False,
        "required": [name for name in JobSpec.field_names() if name not in defaults],  # fields without a default
        "properties": properties,
        "$defs": {"distribution": _distribution_schema(), "trainingInput": _training_input_schema()},
    }


def _field_schema(name: str, hint: Any) -> dict[str, Any]:
    special = _SPECIAL_FIELDS.get(name)
    if special is not None:
        return special()
    schema = _type_schema(hint)
    schema.update(_CONSTRAINTS.get(name, {}))
    return schema


def _type_schema(hint: Any) -> dict[str, Any]:
    members = _union_members(hint)
    if len(members) > 1:
        inner = [_type_schema(m) for m in members if m is not _NONE_TYPE]
        nullable = _NONE_TYPE in members
        if len(inner) == 1 and "type" in inner[0] and len(inner[0]) == 1:
            return {"type": [inner[0]["type"], "null"] if nullable else inner[0]["type"]}
        return {"anyOf": inner + ([{"type": "null"}] if nullable else [])}
    origin = typing.get_origin(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is tuple:
        return {"type": "array", "items": _type_schema(typing.get_args(hint)[0])}
    if origin is not None and issubclass(origin, Mapping):
        value_hint = typing.get_args(hint)[1]
        return {"type": "object"} if value_hint is Any else {"type": "object", "additionalProperties": _type_schema(value_hint)}
    raise TypeError(f"no JSON Schema mapping for {hint!r}; add one to smddp_sdk/config/schema.py")


_SCALARS = {str: "string", int: "integer", bool: "boolean"}


def _union_members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _distribution_schema() -> dict[str, Any]:
    option_types = {"enabled": {"type": "boolean"}, "custom_mpi_options": {"type": "string"}, "processes_per_host": {"type": "integer", "minimum": 1}, "parameters": {"type": "object"}}

    def options(kind: str) -> dict[str, Any]:
        keys = distribution_module._OPTION_KEYS[kind]
        return {"type": "object", "additionalProperties": False, "properties": {k: option_types[k] for k in keys}}

    smdistributed = {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
        "properties": {"dataparallel": options("dataparallel"), "modelparallel": options("modelparallel")},
    }
    top = {key: smdistributed if key == "smdistributed" else options({"smdistributed_dataparallel": "dataparallel"}.get(key, key)) for key in distribution_module._TOP_KEYS}
    return {"type": "object", "additionalProperties": False, "properties": top}


def _training_input_schema() -> dict[str, Any]:
    enums = {"distribution": job_module._S3_DISTRIBUTIONS, "s3_data_type": job_module._S3_DATA_TYPES, "input_mode": job_module._INPUT_MODES}
    properties: dict[str, Any] = {}
    for spec_field in dataclasses.fields(TrainingInput):
        nullable = spec_field.default is None
        if spec_field.name in enums:
            choices: list[Any] = list(enums[spec_field.name]) + ([None] if nullable else [])
            properties[spec_field.name] = {"enum": choices}
        else:
            properties[spec_field.name] = {"type": ["string", "null"] if nullable else "string"}
    properties["s3_data"]["description"] = "An s3:// URI, a file:// URI or a local path."
    return {"type": "object", "additionalProperties": False, "required": ["s3_data"], "properties": properties}


def _inputs_schema() -> dict[str, Any]:
    channel = {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/trainingInput"}]}
    channels = {"type": "object", "propertyNames": {"pattern": job_module._CHANNEL_NAME.pattern}, "additionalProperties": channel}
    return {"anyOf": [{"type": "string", "description": "One location: the `training` channel."}, channels]}


def _key_value_list(first: str, second: str, allow_mapping: bool) -> dict[str, Any]:
    pair = {"type": "object", "additionalProperties": False, "required": [first, second], "properties": {first: {"type": "string"}, second: {"type": "string"}}}
    as_list = {"type": "array", "items": pair}
    if not allow_mapping:
        return as_list
    return {"anyOf": [as_list, {"type": "object", "additionalProperties": {"type": "string"}}]}


_SPECIAL_FIELDS = {
    "distribution": lambda: {"$ref": "#/$defs/distribution"},
    "inputs": _inputs_schema,
    "instance_type": lambda: {"enum": sorted(instance_types.CATALOG)},
    "tags": lambda: _key_value_list("Key", "Value", allow_mapping=True),
    "metric_definitions": lambda: _key_value_list("Name", "Regex", allow_mapping=False),
}
_CONSTRAINTS: dict[str, dict[str, Any]] = {
    **{name: {"minimum": least, **({"maximum": most} if most is not None else {})} for name, (least, most, _) in limits.BOUNDS.items()},
    "input_mode": {"enum": list(job_module._INPUT_MODES)},
    "api": {"enum": list(job_module.APIS)},
    "job_name": {"pattern": limits.JOB_NAME.pattern},
    "base_job_name": {"pattern": limits.JOB_NAME.pattern},
}


def _plain(value: Any) -> Any:
    """Defaults as JSON values: tuples become lists, dataclasses their user-facing form."""
    if isinstance(value, distribution_module.Distribution):
        return dict(value.given)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value
