"""The slurm scheduler's options, declared once: name, type, default, help (torchx's ``runopts`` shape).

``check`` turns what a caller gave into the values the scheduler keeps, reporting every problem at once.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.specs import limits

AUTO_RESUME_CHOICES = ("auto", True, False)


@dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: Any
    help: str


OPTIONS = (
    Option("job_root", "str", None, "folder for job directories on a file system every node shares (FSx on HyperPod); default $SMDDP_JOB_ROOT/slurm or ~/.smddp/jobs/slurm"),
    Option("partition", "str", None, "sbatch --partition (default: the cluster's default partition)"),
    Option("account", "str", None, "sbatch --account"),
    Option("extra_sbatch", "list[str]", (), "more #SBATCH lines, as sbatch options: ['--exclusive', '--gres=gpu:8', '--constraint=p4d']"),
    Option("container_image", "str", None, "an enroot image for every node: srun --container-image (clusters with pyxis); the image needs smddp-sdk"),
    Option("max_retries", "int", 0, "requeue the job up to this many times when a node fails or the step fails (sbatch --requeue; Slurm holds a requeued job ~2 min)"),
    Option(
        "auto_resume",
        "'auto'|bool",
        "auto",
        "srun --auto-resume=1 (HyperPod replaces faulty nodes and restarts the step); 'auto': when the node is a HyperPod node (/opt/sagemaker_cluster), as AWS's samples decide",
    ),
    Option("processes_per_host", "int", None, "ranks per node (default: the instance type's GPU count, or the GPUs each node finds)"),
    Option("python", "str", sys.executable, "the Python on the nodes that has smddp-sdk (default: this one, the usual case with a shared file system; 'python3' in a container)"),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}


def checked(given: Mapping[str, Any]) -> dict[str, Any]:
    """The options with defaults filled in; every wrong name or value raised at once."""
    names = tuple(DEFAULTS)
    issues = [SpecIssue(f"scheduler_options.{key}", "unknown option of the slurm scheduler", did_you_mean(key, names) or f"expected one of {', '.join(names)}") for key in given if key not in DEFAULTS]
    values = {**DEFAULTS, **{key: value for key, value in given.items() if key in DEFAULTS}}
    for name in ("job_root", "partition", "account", "container_image", "python"):
        if values[name] is not None and not (isinstance(values[name], str) and values[name].strip()):
            issues.append(SpecIssue(f"scheduler_options.{name}", f"must be a non-empty string, got {values[name]!r}"))
    extra = values["extra_sbatch"]
    if isinstance(extra, str):
        values["extra_sbatch"] = extra = (extra,)
    if not isinstance(extra, (list, tuple)) or not all(isinstance(line, str) and line.startswith("-") for line in extra):
        issues.append(SpecIssue("scheduler_options.extra_sbatch", f"must be a list of sbatch options starting with '-', got {extra!r}", "e.g. ['--exclusive', '--gres=gpu:8']"))
    retries = values["max_retries"]
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 30:
        issues.append(SpecIssue("scheduler_options.max_retries", f"must be a whole number from 0 to 30, got {retries!r}"))
    if values["auto_resume"] not in AUTO_RESUME_CHOICES:
        issues.append(SpecIssue("scheduler_options.auto_resume", f"must be auto, true or false, got {values['auto_resume']!r}"))
    issues += limits.processes_per_host_issues(values["processes_per_host"], "scheduler_options.processes_per_host")
    if issues:
        raise SpecError(issues)
    values["extra_sbatch"] = tuple(values["extra_sbatch"])
    return values
