"""The plan of a Slurm job, typed (``BatchPlan``), and its batch script: what ``--dryrun`` prints, what
``job.json`` keeps, what ``sbatch`` runs. Pure.

One allocation of ``instance_count`` nodes; one job step with one task per node, each running the node
runtime (``python -m smddp_sdk.runtime``), which builds that node's ``/opt/ml`` from Slurm's environment
and starts the ranks; then, on the first node, the archives and the result (``slurm_node finish``).

Retries follow the job's ``RetryPolicy``: with ``max_retry_attempts`` the job is ``--requeue``-able, so Slurm
requeues it when a node fails (the platform's failure), and the script requeues a failed step only with
``retry_script_errors``; a run past the policy's bound (``SLURM_RESTART_COUNT``) stops before its step.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from smddp_sdk.schedulers.job_files import Artifacts, ConfigFiles
from smddp_sdk.specs.job import RetryPolicy
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
    retry: RetryPolicy = RetryPolicy()
    auto_resume: bool | None = None  # None: on HyperPod's nodes (/opt/sagemaker_cluster), decided on the node
    container_image: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    # What ``run`` stages: the code, the nodes' config files (node-0..N-1 until each node writes its name),
    # ranks per node, the channels, and where the archives go.
    handle: str = ""
    code: Mapping[str, Any] = field(default_factory=dict)
    config_files: ConfigFiles = field(default_factory=lambda: ConfigFiles((), ""))
    processes_per_host: int | str | None = None  # None or AUTO_RANKS: the GPUs each node finds, else its allotted CPUs
    inputs: Mapping[str, Any] = field(default_factory=dict)
    artifacts: Artifacts = field(default_factory=lambda: Artifacts(Path(), Path()))
    experiment_config: Mapping[str, str] = field(default_factory=dict)
    checkpoint_s3_uri: str | None = None  # restored into checkpoints/ before the step, synced out beside it

    @property
    def script_file(self) -> Path:
        return SlurmJobDir(self.job_dir).script_file

    def to_json(self) -> dict[str, Any]:
        """The plan as ``job.json`` keeps it and the dry run prints it (the script follows it there)."""
        typed = {"job_dir": str(self.job_dir), "retry": self.retry.to_json(), "config_files": self.config_files.to_json(),
                 "artifacts": self.artifacts.to_json(), "extra_sbatch": list(self.extra_sbatch)}
        return {item.name: typed.get(item.name, getattr(self, item.name)) for item in fields(self)} | {"script_file": str(self.script_file)}

    def shown(self) -> dict[str, Any]:
        """What the dry run prints before the script: the plan, its node list cut beyond a few nodes."""
        whole = self.to_json()
        hosts = whole["config_files"]["hosts"]
        if len(hosts) > 8:
            whole["config_files"]["hosts"] = [*hosts[:2], f"... {len(hosts) - 3} more nodes ...", hosts[-1]]
        return whole

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchPlan:
        parsers = {"job_dir": Path, "retry": RetryPolicy.from_json, "config_files": ConfigFiles.from_json, "artifacts": Artifacts.from_json, "extra_sbatch": tuple}
        return cls(**{item.name: parsers.get(item.name, lambda value: value)(data[item.name]) for item in fields(cls) if item.name in data})


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
        "--requeue" if plan.retry.max_retry_attempts else "--no-requeue",
        *([f"--partition={plan.partition}"] if plan.partition else []),
        *([f"--account={plan.account}"] if plan.account else []),
        *plan.extra_sbatch,
    ]
    exports = {JOB_DIR_ENV: str(plan.job_dir), "PYTHONPATH": plan.python_path, **plan.environment}
    # --quiet: srun's own progress lines on a cancel ("Job step aborted", "got SIGCONT", "forcing job termination")
    # go; its errors (a task's exit code, a node failure) stay.
    step = shlex.join(["srun", "--quiet", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--open-mode=append", f"--output={job_dir.logs_dir}/%N.log"])
    if plan.auto_resume:
        step += " --auto-resume=1"
    elif plan.auto_resume is None:
        step += ' "${auto_resume[@]}"'
    container = [f"--container-image={plan.container_image}", f"--container-mounts={plan.job_dir}:{plan.job_dir}"] if plan.container_image else []
    finish = ["srun", "--nodes=1", "--ntasks=1", *container] if plan.container_image else []
    attempts = shlex.quote(str(job_dir.attempts_file))
    scratch = shlex.quote(str(job_dir.scratch_dir))
    lines = [
        "#!/bin/bash",
        f"# smddp-sdk job {plan.job_name}: one task per node runs the node runtime (docs/slurm.md)",
        *(f"#SBATCH {directive}" for directive in directives),  # sbatch reads these itself, not a shell
        "",
        *_retry_bound(plan.retry, scratch),
        *(f"export {key}={shlex.quote(value)}" for key, value in exports.items()),
        "",
        "# When each attempt (a requeue is one) ran, for the goodput `status` shows (specs.goodput).",
        'attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))',
        f"printf '{{\"attempt\": %s, \"started\": %s}}\\n' \"$attempt\" \"$(date +%s.%N)\" >> {attempts}",
        *_checkpoint_sync(plan, finish),
        *(AUTO_RESUME_ON_HYPERPOD if plan.auto_resume is None else []),
        "# The ranks of every node; each node's runtime coordinates the failure handling itself.",
        f"{step} {shlex.join([*container, plan.python, '-m', 'smddp_sdk.runtime'])}",
        "code=$?",
        f"printf '{{\"attempt\": %s, \"ended\": %s, \"code\": %s}}\\n' \"$attempt\" \"$(date +%s.%N)\" \"$code\" >> {attempts}",
        *(['kill -TERM "$checkpoint_sync"; wait "$checkpoint_sync"  # its last pass, after every rank ended'] if plan.checkpoint_s3_uri else []),
        "# The nodes' model/ and output/data/ merged into the archives, and the result for `status`.",
        shlex.join([*finish, plan.python, "-m", "smddp_sdk.runtime.slurm_node", "finish"]) + ' "$code"',
    ]
    bound = plan.retry.max_retry_attempts
    if bound and plan.retry.script_errors:
        lines += [
            f'if [ "$code" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {bound} ]; then',
            '  echo "smddp: the job step failed with code $code; requeueing (restart ${SLURM_RESTART_COUNT:-0} of ' + str(bound) + ')"',
            '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "fi",
        ]
    lines += [f"rm -rf {scratch}  # the nodes' scratch: kept for a requeue (above), gone once the job ends", 'exit "$code"']
    return "\n".join(lines) + "\n"


def _checkpoint_sync(plan: BatchPlan, finish: list[str]) -> list[str]:
    """checkpoint_s3_uri as local and docker jobs sync it (``slurm.checkpoint_sync``): restored before the step,
    copied out beside it; a restore that fails fails the job rather than let it start from scratch."""
    if not plan.checkpoint_s3_uri:
        return []
    sync = [*finish, *(["--overlap"] if finish else []), plan.python, "-m", "smddp_sdk.schedulers.slurm.checkpoint_sync"]
    return [
        f"# checkpoint_s3_uri {plan.checkpoint_s3_uri}: into checkpoints/ (every node's /opt/ml/checkpoints) and back",
        f"{shlex.join([*sync, 'restore', str(plan.job_dir)])} || exit 1",
        f"{shlex.join([*sync, 'follow', str(plan.job_dir)])} &",
        "checkpoint_sync=$!",
        "",
    ]


def _retry_bound(retry: RetryPolicy, scratch: str) -> list[str]:
    """Slurm requeues a job whose node failed however often it fails: the policy's bound stops it here."""
    if not retry.max_retry_attempts:
        return []
    bound = retry.max_retry_attempts
    return [
        f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt {bound} ]; then',
        f'  echo "smddp: requeued ${{SLURM_RESTART_COUNT}} times, more than max_retry_attempts ({bound}): not running again"',
        f"  rm -rf {scratch}",
        "  exit 1",
        "fi",
        "",
    ]
