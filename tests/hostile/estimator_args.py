"""Bad estimator arguments: each keyword set and every issue ``PyTorch(...)`` must raise, exactly."""

from __future__ import annotations

import datetime
import decimal
from typing import Any


def recursive_list() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def recursive_dict() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def python_laughs(levels: int = 9) -> list[Any]:
    """The billion laughs in Python: each level ten references to the one below (10**9 leaves)."""
    value: list[Any] = ["lol"]
    for _ in range(levels):
        value = [value] * 10
    return value


BASE: dict[str, Any] = {"entry_point": "train.py", "instance_type": "local"}

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("instance_count bool", {"instance_count": True}, ["instance_count: must be an integer, got True"]),
    ("instance_count 1e23", {"instance_count": 10**23}, ["instance_count: must be at most 1000, got 100000000000000000000000 (split the work into several jobs)"]),
    ("instance_count 1001", {"instance_count": 1001}, ["instance_count: must be at most 1000, got 1001 (split the work into several jobs)"]),
    ("instance_count 5000 digits", {"instance_count": 10**5000}, ["instance_count: must be at most 1000, got a number of more than 4300 digits (split the work into several jobs)"]),
    ("instance_count float", {"instance_count": 2.0}, ["instance_count: must be an integer, got 2.0"]),
    ("instance_count text", {"instance_count": "2"}, ["instance_count: must be an integer, got '2'"]),
    ("instance_count zero", {"instance_count": 0}, ["instance_count: must be at least 1, got 0"]),
    ("max_run a year", {"max_run": 365 * 86400}, ["max_run: must be at most 2419200, got 31536000 (28 days is SageMaker's maximum)"]),
    ("volume_size huge", {"volume_size": 10**6}, ["volume_size: must be at most 16384, got 1000000 (SageMaker volumes hold at most 16384 GB)"]),
    (
        "processes_per_host huge",
        {"scheduler_options": {"processes_per_host": 100_000}},
        ["scheduler_options.processes_per_host: must be at most 512, got 100000 (use more hosts (instance_count) instead)"],
    ),
    ("processes_per_host zero", {"scheduler_options": {"processes_per_host": 0}}, ["scheduler_options.processes_per_host: must be a positive integer, got 0"]),
    ("processes_per_host float", {"scheduler_options": {"processes_per_host": 2.5}}, ["scheduler_options.processes_per_host: must be a positive integer, got 2.5"]),
    ("scheduler_options text", {"scheduler_options": "processes_per_host=2"}, ["scheduler_options: must be a mapping of option names to values, got str"]),
    (
        "mpi processes_per_host huge",
        {"distribution": {"mpi": {"enabled": True, "processes_per_host": 10**6}}},
        ["distribution.mpi.processes_per_host: must be at most 512, got 1000000 (use more hosts (instance_count) instead)"],
    ),
    ("base_job_name traversal", {"base_job_name": "../../../x"}, ["base_job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got '../../../x'"]),
    ("base_job_name absolute", {"base_job_name": "/tmp/x"}, ["base_job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got '/tmp/x'"]),
    ("base_job_name not text", {"base_job_name": 7}, ["base_job_name: must be a string or null, got 7 (put it in quotes so YAML reads it as text)"]),
    ("job_name traversal", {"job_name": "../x"}, ["job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got '../x'"]),
    ("job_name NUL", {"job_name": "a\0b"}, ["job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got 'a\\x00b'"]),
    ("hp object", {"hyperparameters": {"model": object()}}, ["hyperparameters.model: a value of type object is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"]),
    ("hp set", {"hyperparameters": {"tags": {"a", "b"}}}, ["hyperparameters.tags: a value of type set is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"]),
    ("hp bytes", {"hyperparameters": {"blob": b"\x00\x01"}}, ["hyperparameters.blob: a value of type bytes is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"]),
    ("hp decimal", {"hyperparameters": {"lr": decimal.Decimal("0.1")}}, ["hyperparameters.lr: a value of type Decimal is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"]),
    (
        "hp datetime",
        {"hyperparameters": {"at": datetime.datetime(2024, 1, 1)}},
        ["hyperparameters.at: a value of type datetime is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp function",
        {"hyperparameters": {"fn": len}},
        ["hyperparameters.fn: a value of type builtin_function_or_method is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp NaN",
        {"hyperparameters": {"lr": float("nan")}},
        ["hyperparameters.lr: NaN and infinity are not JSON; pass them as strings (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp infinity nested",
        {"hyperparameters": {"lrs": [1.0, float("inf")]}},
        ["hyperparameters.lrs: NaN and infinity are not JSON; pass them as strings (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp recursive list",
        {"hyperparameters": {"loop": recursive_list()}},
        ["hyperparameters.loop: nests deeper than 32 levels (or contains itself) (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp recursive dict",
        {"hyperparameters": {"loop": recursive_dict()}},
        ["hyperparameters.loop: nests deeper than 32 levels (or contains itself) (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    (
        "hp billion laughs",
        {"hyperparameters": {"lol": python_laughs()}},
        ["hyperparameters.lol: holds more than 131072 values; hyperparameters are limited to 131072 bytes in all (pass large data as an input channel or a file in source_dir)"],
    ),
    (
        "hp 5000-digit integer",
        {"hyperparameters": {"seed": 10**5000}},
        ["hyperparameters.seed: contains an integer too long to write (over 4300 digits); pass it as a string (use strings, numbers, booleans, null, lists and mappings of them)"],
    ),
    ("hp NUL in value", {"hyperparameters": {"lr": "0.1\0"}}, ["hyperparameters.lr: contains a NUL character, which cannot be passed to a process (remove it)"]),
    ("hp NUL in key", {"hyperparameters": {"l\0r": 1}}, ["hyperparameters.l\x00r: name 'l\\x00r' holds a NUL character (use letters, digits, '_', '-' and '.')"]),
    ("hp empty key", {"hyperparameters": {"": 1}}, ["hyperparameters.: name '' is empty (use letters, digits, '_', '-' and '.')"]),
    ("hp integer key", {"hyperparameters": {1: 2}}, ["hyperparameters.1: keys must be strings"]),
    ("hp tuple key", {"hyperparameters": {("a",): 1}}, ["hyperparameters.('a',): keys must be strings"]),
    ("hp object key inside", {"hyperparameters": {"m": {object(): 1}}}, ["hyperparameters.m: a value of type object is not JSON (use strings, numbers, booleans, null, lists and mappings of them)"]),
    ("hp over 128 KiB", {"hyperparameters": {"blob": "x" * 200_000}}, ["hyperparameters: encode to 200010 bytes; the limit is 131072 (pass large data as an input channel or a file in source_dir)"]),
    ("hp as list", {"hyperparameters": [("lr", 0.1)]}, ["hyperparameters: must be a mapping, got list"]),
    ("env equals in key", {"environment": {"A=B": "x"}}, ["environment.A=B: 'A=B' is not a valid variable name (use letters, digits and '_', not starting with a digit; no '=', spaces or NUL)"]),
    ("env NUL in value", {"environment": {"A": "x\0"}}, ["environment.A: contains a NUL character, which cannot be passed to a process (remove it)"]),
    ("env NUL in key", {"environment": {"A\0": "x"}}, ["environment.A\x00: 'A\\x00' is not a valid variable name (use letters, digits and '_', not starting with a digit; no '=', spaces or NUL)"]),
    ("env number value", {"environment": {"A": 1}}, ["environment.A: must be a string, got 1 (quote the value)"]),
    ("env integer key", {"environment": {1: "x"}}, ["environment.1: keys must be strings"]),
    (
        "env reserved base dir",
        {"environment": {"SAGEMAKER_BASE_DIR": "/tmp"}},
        ["environment.SAGEMAKER_BASE_DIR: is set by smddp-sdk and cannot be overridden (it is where each host's /opt/ml tree lives; read it in the script instead)"],
    ),
    ("env reserved token", {"environment": {"SMDDP_JOB_TOKEN": "guess"}}, ["environment.SMDDP_JOB_TOKEN: is set by smddp-sdk and cannot be overridden (each job gets its own secret)"]),
    ("env over 128 KiB", {"environment": {f"K{i}": "x" * 1000 for i in range(140)}}, ["environment: takes 140730 bytes; the limit is 131072 (pass large values in a file in source_dir)"]),
    ("env as text", {"environment": "A=1"}, ["environment: must be a mapping, got str"]),
    ("NUL in output_path", {"output_path": "out\0"}, ["output_path: contains a NUL character (remove it)"]),
    ("NUL in a local input", {"inputs": {"train": "data\0"}}, ["inputs.train.s3_data: local data 'data\\x00' does not exist", "inputs.train.s3_data: contains a NUL character (remove it)"]),
    ("NUL in role", {"role": "arn\0"}, ["role: contains a NUL character (remove it)"]),
    ("NUL in image_uri", {"image_uri": "img\0"}, ["image_uri: contains a NUL character (remove it)"]),
    ("NUL in a tag", {"tags": [{"Key": "team\0", "Value": "ml"}]}, ["tags[0].Key: contains a NUL character (remove it)"]),
    ("NUL in mpi options", {"distribution": {"mpi": {"enabled": True, "custom_mpi_options": "-x A\0"}}}, ["distribution.mpi.custom_mpi_options: contains a NUL character (remove it)"]),
    (
        "source_dir name too long",
        {"source_dir": "x" * 5000},
        [
            "source_dir: directory 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' does not exist"
        ],
    ),
    (
        "input path too long",
        {"inputs": {"train": "y" * 5000}},
        [
            "inputs.train.s3_data: local data 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy' does not exist"
        ],
    ),
    ("unknown argument", {"instance_cout": 2}, ["instance_cout: unknown argument (did you mean 'instance_count'?)"]),
    (
        "unsupported v2 argument",
        {"git_config": {"repo": "x"}},
        ["git_config: is a SageMaker SDK v2 argument smddp-sdk does not support (clone the repository yourself and pass its directory as source_dir)"],
    ),
    (
        "everything at once",
        {"instance_count": 5000, "base_job_name": "../x", "hyperparameters": {"a": float("nan")}, "environment": {"A=B": "x"}},
        [
            "instance_count: must be at most 1000, got 5000 (split the work into several jobs)",
            "base_job_name: must be 1-63 letters, digits and hyphens, starting and ending with a letter or digit, got '../x'",
            "hyperparameters.a: NaN and infinity are not JSON; pass them as strings (use strings, numbers, booleans, null, lists and mappings of them)",
            "environment.A=B: 'A=B' is not a valid variable name (use letters, digits and '_', not starting with a digit; no '=', spaces or NUL)",
        ],
    ),
]
