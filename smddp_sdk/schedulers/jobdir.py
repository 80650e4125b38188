"""A job's directory on this machine: one ``/opt/ml`` tree per simulated host, as SageMaker lays them out.

Schedulers that run hosts on this machine (local processes, Docker containers) write the same tree:
``<jobs dir>/<job>/hosts/algo-N/`` holds that host's config files, code, input mount points and outputs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec

JOBS_DIR_ENV = "SMDDP_JOBS_DIR"
CODE_IN_CONTAINER = f"{contract.DEFAULT_BASE_DIR}/code"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", ".venv", ".mypy_cache", ".pytest_cache")


def default_jobs_dir() -> Path:
    """``$SMDDP_JOBS_DIR``, else ``~/.smddp/jobs``."""
    return Path(os.environ.get(JOBS_DIR_ENV) or Path.home() / ".smddp" / "jobs")


def host_names(count: int) -> list[str]:
    return [f"algo-{index}" for index in range(1, count + 1)]


def host_index(host: str) -> int:
    """Sort key that puts algo-10 after algo-9."""
    suffix = host.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


def host_dir(job_dir: Path, host: str) -> Path:
    return job_dir / "hosts" / host


def hyperparameters(spec: JobSpec, job_name: str, submit_directory: str = CODE_IN_CONTAINER) -> dict[str, str]:
    """hyperparameters.json as SageMaker would write it, with the code already in place on every host."""
    decoded = spec.training_hyperparameters(job_name=job_name, submit_directory=submit_directory, region=None)
    return contract.encode_hyperparameters(decoded)


def write_job_tree(spec: JobSpec, job_name: str, job_dir: Path, encoded_hyperparameters: dict[str, str]) -> dict[str, contract.OptMl]:
    """Create every host's ``/opt/ml`` tree: config files, a copy of the code, and input mount points."""
    hosts = host_names(spec.instance_count)
    trees = {}
    for host in hosts:
        opt_ml = contract.OptMl(host_dir(job_dir, host))
        contract.write_config_files(
            opt_ml,
            resource=contract.resource_config(host, hosts, spec.instance_type),
            hyperparameters=encoded_hyperparameters,
            input_data=contract.input_data_config(_channels(spec)),
        )
        stage_code(spec, opt_ml.code_dir)
        for channel in spec.inputs:
            # Mount points made now, by the caller: the engine would otherwise create them as root.
            opt_ml.channel_dir(channel).mkdir(parents=True, exist_ok=True)
        opt_ml.output_dir.mkdir(parents=True, exist_ok=True)
        trees[host] = opt_ml
    return trees


def stage_code(spec: JobSpec, code_dir: Path) -> None:
    """Put ``source_dir`` (or the lone entry point) and the ``dependencies`` into a host's code dir."""
    code_dir.mkdir(parents=True, exist_ok=True)
    if spec.source_dir:
        shutil.copytree(spec.source_dir, code_dir, dirs_exist_ok=True, ignore=_IGNORED)
    else:
        shutil.copy2(spec.entry_point, code_dir / Path(spec.entry_point).name)
    for dependency in spec.dependencies:
        source = Path(dependency)
        shutil.copytree(source, code_dir / source.name, dirs_exist_ok=True, ignore=_IGNORED)


def _channels(spec: JobSpec) -> dict[str, dict[str, Any]]:
    channels: dict[str, dict[str, Any]] = {}
    for name, channel in spec.inputs.items():
        options: dict[str, Any] = {"TrainingInputMode": channel.input_mode or spec.input_mode, "S3DistributionType": channel.distribution}
        if channel.content_type:
            options["ContentType"] = channel.content_type
        channels[name] = options
    return channels
