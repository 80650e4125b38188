"""The batch script of a Slurm job: what ``--dryrun`` prints and ``sbatch`` runs. Pure.

One allocation of ``instance_count`` nodes; one job step with one task per node, each running the node
runtime (``python -m smddp_sdk.runtime``), which builds that node's ``/opt/ml`` from Slurm's environment
and starts the ranks; then, on the first node, the archives and the result (``slurm_node finish``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from smddp_sdk.specs.slurm_job import JOB_DIR_ENV, SlurmJobDir


@dataclass(frozen=True)
class BatchPlan:
    job_name: str
    job_dir: Path
    nodes: int
    max_run: int  # seconds: sbatch --time
    python: str
    python_path: str  # where the nodes import smddp_sdk from
    partition: str | None = None
    account: str | None = None
    extra_sbatch: tuple[str, ...] = ()
    max_retries: int = 0
    auto_resume: bool | None = None  # None: on HyperPod's nodes (/opt/sagemaker_cluster), decided on the node
    container_image: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)


# As AWS's HyperPod samples decide it: HyperPod replaces a faulty node and restarts the step from there.
AUTO_RESUME_ON_HYPERPOD = [
    "# On HyperPod (/opt/sagemaker_cluster on its nodes) srun resumes the step on a replaced node.",
    "auto_resume=()",
    "if [ -d /opt/sagemaker_cluster ]; then auto_resume=(--auto-resume=1); fi",
]


def time_limit(seconds: int) -> str:
    """sbatch --time as days-hours:minutes:seconds (Slurm counts minutes: rounded up)."""
    minutes = -(-seconds // 60)
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def render(plan: BatchPlan) -> str:
    job_dir = SlurmJobDir(plan.job_dir)
    directives = [
        f"--job-name={plan.job_name}",
        f"--nodes={plan.nodes}",
        "--ntasks-per-node=1",
        f"--time={time_limit(plan.max_run)}",
        f"--chdir={plan.job_dir}",
        f"--output={job_dir.batch_log}",
        "--open-mode=append",  # a requeued job adds to its logs
        "--requeue" if plan.max_retries else "--no-requeue",
        *([f"--partition={plan.partition}"] if plan.partition else []),
        *([f"--account={plan.account}"] if plan.account else []),
        *plan.extra_sbatch,
    ]
    exports = {JOB_DIR_ENV: str(plan.job_dir), "PYTHONPATH": plan.python_path, **plan.environment}
    step = shlex.join(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--open-mode=append", f"--output={job_dir.logs_dir}/%N.log"])
    if plan.auto_resume:
        step += " --auto-resume=1"
    elif plan.auto_resume is None:
        step += ' "${auto_resume[@]}"'
    container = [f"--container-image={plan.container_image}", f"--container-mounts={plan.job_dir}:{plan.job_dir}"] if plan.container_image else []
    finish = ["srun", "--nodes=1", "--ntasks=1", *container] if plan.container_image else []
    lines = [
        "#!/bin/bash",
        f"# smddp-sdk job {plan.job_name}: one task per node runs the node runtime (docs/slurm.md)",
        *(f"#SBATCH {directive}" for directive in directives),  # sbatch reads these itself, not a shell
        "",
        *(f"export {key}={shlex.quote(value)}" for key, value in exports.items()),
        "",
        *(AUTO_RESUME_ON_HYPERPOD if plan.auto_resume is None else []),
        "# The ranks of every node; each node's runtime coordinates the failure handling itself.",
        f"{step} {shlex.join([*container, plan.python, '-m', 'smddp_sdk.runtime'])}",
        "code=$?",
        "# The nodes' model/ and output/data/ merged into the archives, and the result for `status`.",
        shlex.join([*finish, plan.python, "-m", "smddp_sdk.runtime.slurm_node", "finish"]) + ' "$code"',
    ]
    if plan.max_retries:
        lines += [
            f'if [ "$code" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {plan.max_retries} ]; then',
            '  echo "smddp: the job step failed with code $code; requeueing (restart ${SLURM_RESTART_COUNT:-0} of ' + str(plan.max_retries) + ')"',
            '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
        ]
    lines.append('exit "$code"')
    return "\n".join(lines) + "\n"
