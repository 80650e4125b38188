"""What a local or docker rehearsal does differently from SageMaker, said once and never dropped.

Every SageMaker SDK v2 setting that local and docker modes cannot honour is either emulated
(``channels``, ``checkpoints``), refused with a reason (``issues``), or reported as one line in the
dry run's NOTES (``notes``). Those lines are of two kinds. A warning is a setting not emulated at all
whose absence the job can feel, so it could behave differently on SageMaker (no network isolation, no
VPC, the disk size, unencrypted traffic): it is printed as ``smddp: warning:`` when the job starts. The
rest are fidelity notes, settings emulated differently or SageMaker services outside the job (GPUs as
ranks, this machine's torch, restored checkpoints, tags): routine in a job file that also runs on
SageMaker, so a run says only how many there are, in one line. docs/local-mode.md ("What differs from
SageMaker") is the table of the same facts.

Call sites in a scheduler: ``issues(spec)`` in ``validate``, ``notes(spec, name, hosts)`` added to
the dry run's notes, ``report(dryrun)`` in ``schedule``.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from typing import Any

from smddp_sdk.errors import SpecIssue
from smddp_sdk.schedulers import channels
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.hosttree import checkpoints
from smddp_sdk.schedulers.job_files import code_notes
from smddp_sdk.specs.job import JobSpec

_SAID: set[str] = set()


def issues(spec: JobSpec) -> list[SpecIssue]:
    """Settings local and docker modes refuse, each with the reason and what to do."""
    return [*channels.issues(spec), *checkpoints.issues(spec)]


def notes(spec: JobSpec, scheduler: str, host_count: int | None = None) -> list[str]:
    """One line per setting that is not emulated, or emulated with a difference worth knowing."""
    hosts = host_count if host_count is not None else spec.instance_count
    lines = [*channels.notes(spec, hosts), *checkpoints.notes(spec), *code_notes(spec)]
    lines += _version_notes(spec, scheduler)
    lines += _platform_notes(spec)
    lines += warnings(spec)
    if scheduler == "docker":
        lines += _docker_notes(spec)
    return lines


def warnings(spec: JobSpec) -> list[str]:
    """The lines of ``notes`` about settings not emulated at all, under which the job could behave differently."""
    checks: list[tuple[bool, str]] = [
        (spec.enable_network_isolation, "enable_network_isolation is not emulated: the hosts can reach the network here"),
        (spec.volume_size != 30, f"volume_size={spec.volume_size} GB is not enforced: the hosts write to this machine's disk"),
        (bool(spec.subnets or spec.security_group_ids), "subnets/security_group_ids (VPC) are not emulated: the hosts use this machine's network"),
    ]
    return [line for applies, line in checks if applies]


def report(dryrun: DryRun, stream: Any = None) -> None:
    """As a rehearsal starts: each warning among the dry run's notes, and one line counting the fidelity
    notes; each once per process (a notebook re-running ``fit`` is not flooded)."""
    stream = stream if stream is not None else sys.stderr
    real = set(warnings(dryrun.spec))
    fidelity = [line for line in dryrun.notes if line not in real]
    lines = [f"smddp: warning: {line}" for line in dryrun.notes if line in real]
    if fidelity:
        count = f"{len(fidelity)} fidelity note{'s' if len(fidelity) != 1 else ''}"
        lines.append(f"smddp: {count} on how this {dryrun.scheduler} run differs from SageMaker; the dry run lists them (--dryrun, estimator.dryrun().notes)")
    for line in lines:
        if line not in _SAID:
            _SAID.add(line)
            print(line, file=stream)


def installed_torch() -> str | None:
    """The torch version this interpreter would import, read without importing torch."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _version_notes(spec: JobSpec, scheduler: str) -> list[str]:
    lines = []
    if scheduler == "docker":
        if spec.framework_version or spec.py_version:
            lines.append("framework_version/py_version pick nothing in docker mode: the image's own torch and Python run (SageMaker would pick an AWS PyTorch image)")
        return lines
    torch = installed_torch()
    if spec.framework_version and (torch is None or _major_minor(torch) != _major_minor(spec.framework_version)):
        lines.append(
            f"framework_version {spec.framework_version} asks for PyTorch {'.'.join(map(str, _major_minor(spec.framework_version)))}, but local mode runs this machine's torch ({torch or 'not installed'})"
        )
    running = f"py{sys.version_info.major}{sys.version_info.minor}"
    if spec.py_version and spec.py_version != running:
        lines.append(f"py_version {spec.py_version} asks for Python {spec.py_version[2]}.{spec.py_version[3:]}, but local mode runs this machine's Python ({running})")
    return lines


def _platform_notes(spec: JobSpec) -> list[str]:
    """Features of SageMaker's platform (not of the container) that a rehearsal has no part of, and the job does not feel."""
    checks: list[tuple[bool, str]] = [
        (spec.use_spot_instances, "use_spot_instances: no spot capacity here; rehearse an interruption with `smddp-launch interrupt <job>`; max_wait bounds every attempt together"),
        (spec.keep_alive_period_in_seconds is not None, "keep_alive_period_in_seconds (warm pools) is not emulated: every rehearsal starts fresh"),
        (bool(spec.tags), f"tags ({len(spec.tags)}) are not applied to anything here"),
        (bool(spec.debugger_hook_config) or spec.enable_sagemaker_metrics is not None, "debugger_hook_config/enable_sagemaker_metrics are SageMaker services and do nothing here"),
        (spec.disable_output_compression, "disable_output_compression: the model and output still arrive as model.tar.gz and output.tar.gz here (SageMaker uploads them uncompressed)"),
        (bool(spec.checkpoint_local_path) and not spec.checkpoint_s3_uri, "checkpoint_local_path without checkpoint_s3_uri: nothing is restored or synced (as on SageMaker)"),
    ]
    return [line for applies, line in checks if applies]


def _docker_notes(spec: JobSpec) -> list[str]:
    """What the local scheduler refuses or notes itself, and docker mode runs without."""
    checks: list[tuple[bool, str]] = [
        (bool(spec.role), "role is not needed in docker mode and is ignored"),
        (bool(spec.code_location), "code_location is not used in docker mode: the code is mounted from the job directory"),
    ]
    return [line for applies, line in checks if applies]
