"""What every job kept in a directory has, whoever runs it: host-tree jobs (local, docker) on this machine and
Slurm jobs on a shared file system. Both schedulers import this module; neither imports the other's package.

- the job root: ``$SMDDP_JOB_ROOT`` (or ``~/.smddp/jobs``), one folder per scheduler below it (``JOB_FOLDERS``);
- the code snapshot (``stage_code``): ``source_dir`` and ``dependencies``, as v2's sourcedir.tar.gz lays them out;
- the three config files every host gets (``ConfigFiles``), computed once per job;
- ranks per host as the client can know them (``ranks_per_host``): the node runtime's own rule (runtime/plan.py);
- where the archives go (``artifacts``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import smddp_sdk
from smddp_sdk.errors import SpecError
from smddp_sdk.runtime import plan as rank_plan
from smddp_sdk.specs import contract
from smddp_sdk.specs.archives import code_ignore, code_tree_issues
from smddp_sdk.specs.job import JobSpec, TrainingInput

JOB_ROOT_ENV = "SMDDP_JOB_ROOT"
DEFAULT_JOB_ROOT = "~/.smddp/jobs"
JOB_FOLDERS = {"local": "", "docker": "docker", "slurm": "slurm"}  # each scheduler's folder under the job root


def default_job_root(scheduler: str = "local") -> Path:
    """Where ``scheduler`` keeps its job directories unless told otherwise (local's is the root itself)."""
    return Path(os.environ.get(JOB_ROOT_ENV) or DEFAULT_JOB_ROOT).expanduser() / JOB_FOLDERS[scheduler]


def package_parent() -> str:
    """The directory holding the ``smddp_sdk`` package, for the supervisor's and runtimes' PYTHONPATH."""
    return str(Path(smddp_sdk.__file__).resolve().parent.parent)


def output_root(spec: JobSpec, job_root: Path) -> Path:
    """Where jobs on this machine (or its shared file system) put ``<job>/output/``: ``output_path``, else the job root."""
    return Path(spec.output_path.removeprefix("file://")).expanduser().absolute() if spec.output_path else job_root


@dataclass(frozen=True)
class Artifacts:
    """The job's two archives (SageMaker's ModelArtifacts and output.tar.gz)."""

    model_data: Path
    output_data: Path

    @classmethod
    def of(cls, spec: JobSpec, job_root: Path, job_name: str) -> Artifacts:
        folder = output_root(spec, job_root) / job_name / "output"
        return cls(folder / "model.tar.gz", folder / "output.tar.gz")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Artifacts:
        return cls(Path(data.get("model_data", "")), Path(data.get("output_data", "")))

    def to_json(self) -> dict[str, str]:
        return {"model_data": str(self.model_data), "output_data": str(self.output_data)}


# --- the config files ---------------------------------------------------------------------------


def channel_config(channel: TrainingInput, default_mode: str) -> dict[str, Any]:
    """A channel's entry in inputdataconfig.json (the platform fills the remaining defaults)."""
    options: dict[str, Any] = {"TrainingInputMode": channel.input_mode or default_mode, "S3DistributionType": channel.distribution}
    if channel.content_type:
        options["ContentType"] = channel.content_type
    if channel.record_wrapping:
        options["RecordWrapperType"] = channel.record_wrapping
    if channel.compression:
        options["CompressionType"] = channel.compression
    return options


@dataclass(frozen=True)
class ConfigFiles:
    """The three config files of every host, computed once per job: hosts differ only in ``current_host``
    (resourceconfig.json), so the plan holds them once, not once per host (N hosts, not N x N names)."""

    hosts: tuple[str, ...]
    instance_type: str
    hyperparameters: Mapping[str, str] = field(default_factory=dict)  # encoded as v2 does
    input_data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: JobSpec, *, job_name: str, hosts: Sequence[str], submit_directory: str, region: str | None = None) -> ConfigFiles:
        hyperparameters = spec.training_hyperparameters(job_name=job_name, submit_directory=submit_directory, region=region)
        channels = {name: channel_config(channel, spec.input_mode) for name, channel in spec.inputs.items()}
        return cls(tuple(hosts), spec.instance_type, contract.encode_hyperparameters(hyperparameters), contract.input_data_config(channels))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConfigFiles:
        return cls(tuple(data.get("hosts", ())), str(data.get("instance_type", "")), dict(data.get("hyperparameters", {})), dict(data.get("input_data", {})))

    def to_json(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "instance_type": self.instance_type, "hyperparameters": dict(self.hyperparameters), "input_data": dict(self.input_data)}

    def for_host(self, host: str) -> dict[str, Any]:
        """One host's files, keyed as ``contract.write_config_files`` takes them."""
        return {"resource": contract.resource_config(host, self.hosts, self.instance_type), "hyperparameters": self.hyperparameters, "input_data": self.input_data}

    def write(self, opt_ml: contract.OptMl, host: str) -> None:
        contract.write_config_files(opt_ml, **self.for_host(host))


# --- ranks per host -----------------------------------------------------------------------------


def simulated_gpus(spec: JobSpec, processes_per_host: int | None, *, gpus_passed: bool) -> int | None:
    """``SMDDP_NUM_GPUS`` for every host: the ``processes_per_host`` option, else the instance type's GPU count
    (0 for a CPU type), or None when real GPUs are passed and the runtime counts what it finds."""
    if processes_per_host is not None:
        return processes_per_host
    if gpus_passed:
        return None
    instance = spec.instance
    return instance.gpus if instance is not None else 0


def ranks_per_host(spec: JobSpec, num_gpus: int | None) -> int | None:
    """The ranks each host will run, by the node runtime's own rule (runtime/plan.py) given the GPUs it will
    see; None when that is the GPUs a host finds."""
    framework = spec.distribution.hyperparameters(spec.instance_type)  # what the node reads in hyperparameters.json
    shape = rank_plan.launch_shape(framework, in_distribution_group=True)
    if num_gpus is None and shape is not rank_plan.LaunchShape.NONE and not spec.distribution.mpi_processes_per_host:
        return None
    return rank_plan.processes_per_host(shape, framework, num_gpus or 0)


# --- the code snapshot --------------------------------------------------------------------------


def code_notes(spec: JobSpec) -> list[str]:
    """The dry run's words on what happens to the code before the ranks start that a torchrun user would not
    expect: a requirements.txt installed on every host. (What the ranks write to relative paths, into their
    host's own copy of the code, each host names after the job: runtime/main.py.)"""
    source = Path(spec.source_dir) if spec.source_dir and "://" not in spec.source_dir else None
    lines = []
    if source is not None and (source / "requirements.txt").is_file():
        lines.append(f"requirements.txt ({source / 'requirements.txt'}) is pip-installed on every host before the ranks start, as on SageMaker: "
                     "local mode into one virtualenv over this Python's packages, containers into their Python "
                     "(without network: the docker scheduler's wheelhouse option)")
    return lines


def stage_code(spec: JobSpec, dest: Path) -> Path:
    """Copy the job's code into ``dest``: ``source_dir``'s contents (or the lone entry point) plus each
    ``dependencies`` directory under its own name, the layout of v2's sourcedir.tar.gz."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = code_ignore(dest)
    issues = code_tree_issues(spec.code_trees, ignore)  # checked at validation too; again here, just before the copy
    if issues:
        raise SpecError(issues)
    if spec.source_dir:
        shutil.copytree(spec.source_dir, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    else:
        shutil.copy2(spec.entry_point, dest / Path(spec.entry_point).name)
    for dependency in spec.dependencies:
        shutil.copytree(dependency, dest / Path(dependency).name, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    return dest
