"""The slurm scheduler: a job as one sbatch allocation of ``instance_count`` nodes on a Slurm cluster
(SageMaker HyperPod's included), run from a machine where ``sbatch`` works.

The plan (``--dryrun``) is the exact batch script (``script.render``) and what gets staged; running it stages the
job directory on the shared file system (``specs.slurm_job``: code, one /opt/ml tree per node with its
hyperparameters and channels), asks Slurm whether the job can ever run (``sbatch --test-only``) and
submits it. Each node's task runs the node runtime, which finishes the node's contract from Slurm's
environment (``runtime.slurm_node``). ``status`` comes from scontrol (sacct when Slurm has forgotten
the job) and the job directory (result, failure records of every node), ``logs`` from the per-node
files, ``cancel`` is scancel. Everything but the Slurm job id lives in the job directory, so any
machine that sees it can watch or stop the job.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers import channels
from smddp_sdk.schedulers.base import Capabilities, DryRun, JobRootScheduler
from smddp_sdk.schedulers.job_files import Artifacts, ConfigFiles, code_notes, default_job_root, package_parent, stage_code
from smddp_sdk.schedulers.options import RETRY_SCRIPT_ERRORS, Option, SchedulerOptions, job_root
from smddp_sdk.schedulers.slurm.attempts import goodput_record
from smddp_sdk.schedulers.slurm.client import JobInfo, SlurmClient
from smddp_sdk.schedulers.slurm.logs import job_lines
from smddp_sdk.schedulers.slurm.script import BatchPlan, render
from smddp_sdk.schedulers.slurm.states import ENDINGS, job_state
from smddp_sdk.schedulers.stacks import RankStack, answers, sizes, stack_files_of
from smddp_sdk.specs import contract, goodput, limits
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.failure import FailureRecord, decide
from smddp_sdk.specs.job import JobSpec, RetryPolicy, make_job_name
from smddp_sdk.specs.json_files import read_json_object, write_json_atomic
from smddp_sdk.specs.slurm_job import AUTO_RANKS, SlurmJobDir
from smddp_sdk.specs.status import HostStatus, JobHandle, JobState, JobStatus, LogLine

NODE_FAILURE = "NodeFailure"


def _named(value: Any, path: str) -> list[SpecIssue]:
    return [] if isinstance(value, str) and value.strip() else [SpecIssue(path, f"must be a non-empty string, got {value!r}")]


def _sbatch_options(value: Any, path: str) -> list[SpecIssue]:
    lines = (value,) if isinstance(value, str) else value
    if isinstance(lines, (list, tuple)) and all(isinstance(line, str) and line.startswith("-") for line in lines):
        return []
    return [SpecIssue(path, f"must be a list of sbatch options starting with '-', got {value!r}", "e.g. ['--exclusive', '--gres=gpu:8']")]


def _ranks_per_node(value: Any, path: str) -> list[SpecIssue]:
    return [] if value == AUTO_RANKS else limits.processes_per_host_issues(value, path)


def _auto_resume_setting(value: Any, path: str) -> list[SpecIssue]:
    return [] if value == "auto" or isinstance(value, bool) else [SpecIssue(path, f"must be auto, true or false, got {value!r}")]


@dataclass(frozen=True)
class SlurmDryRun(DryRun[BatchPlan]):
    def render(self) -> str:
        """The plan as JSON, then the batch script exactly as sbatch will get it."""
        return json.dumps(self.request.shown(), indent=2, default=str) + f"\n--- {self.request.script_file} ---\n{render(self.request)}"


class SlurmScheduler(JobRootScheduler):
    """Runs a job on a Slurm cluster; its options are declared below (``smddp-launch options slurm``)."""

    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[Capabilities] = Capabilities(lists_locally=True, stacks=True, instead={
        "interrupt": "Slurm has no spot capacity; to rehearse a restart, requeue the job: scontrol requeue <its slurm_job_id>",
        "remove": "the cluster keeps its jobs: `smddp-launch clean JOB` forgets it here; its directory stays under job_root",
    })
    options: ClassVar[SchedulerOptions] = SchedulerOptions.of(
        "slurm",
        job_root("folder for job directories on a file system every node shares (FSx on HyperPod); default $SMDDP_JOB_ROOT/slurm", lambda: default_job_root("slurm")),
        Option("partition", "str", None, "sbatch --partition (default: the cluster's default partition)", check=_named),
        Option("account", "str", None, "sbatch --account", check=_named),
        Option(
            "extra_sbatch",
            "list[str]",
            (),
            "more #SBATCH lines, as sbatch options: ['--exclusive', '--gres=gpu:8', '--constraint=p4d']",
            check=_sbatch_options,
            convert=lambda lines: (lines,) if isinstance(lines, str) else tuple(lines),
        ),
        Option("container_image", "str", None, "an enroot image for every node: srun --container-image (clusters with pyxis); the image needs smddp-sdk", check=_named),
        RETRY_SCRIPT_ERRORS,
        Option(
            "auto_resume",
            "bool or 'auto'",
            "auto",
            "srun --auto-resume=1 (HyperPod replaces faulty nodes and restarts the step); 'auto': when the node is a HyperPod node (/opt/sagemaker_cluster), as AWS's samples decide",
            check=_auto_resume_setting,
        ),
        Option("processes_per_host", "int or 'auto'", None,
               "ranks per node: N, or 'auto' (the default) as torchrun's --nproc-per-node auto on each node: its GPUs, else one per CPU "
               "Slurm allots the job there",
               check=_ranks_per_node),
        Option("python", "str", None, "the Python on the nodes that has smddp-sdk (default: this one, the usual case with a shared file system; python3 with container_image)", check=_named),
        Option("client", "object", None, "the SlurmClient that runs sbatch, scontrol, sacct and scancel (tests give a fake)", code_only=True,
               convert=lambda client: client or SlurmClient()),
        not_taken={"max_retries": "set max_retry_attempts (the job's retry policy, 1 to 30: a failed node requeues the job), "
                                "and retry_script_errors: true to requeue a failed step too (--max-restarts sets both)"},
    )
    job_root: Path
    partition: str | None
    account: str | None
    extra_sbatch: tuple[str, ...]
    container_image: str | None
    retry_script_errors: bool
    auto_resume: str | bool
    processes_per_host: int | str | None
    python: str | None
    client: SlurmClient

    # --- planning (pure) ------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        issues = [*channels.issues(spec), *self._local_issues(spec)]
        if spec.use_spot_instances:
            issues.append(SpecIssue("use_spot_instances", "spot training is a SageMaker feature", "drop it; on Slurm use max_retry_attempts (requeue) or auto_resume on HyperPod"))
        if spec.distribution.modelparallel is not None:
            issues.append(SpecIssue("distribution.smdistributed.modelparallel", "the bundled runtime cannot run SageMaker model parallelism", "use scheduler='sagemaker' with an AWS image"))
        return issues

    def plan(self, spec: JobSpec) -> SlurmDryRun:
        """The batch plan and script, and everything ``run`` stages; touches no file and no Slurm command."""
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        job_dir = SlurmJobDir(self.job_root / job_name)
        image = self.container_image
        plan = BatchPlan(
            job_name=job_name,
            job_dir=job_dir.path,
            nodes=spec.instance_count,
            max_run=spec.max_run,
            python=self.python or ("python3" if image else sys.executable),  # in a container: the image's own
            python_path=os.pathsep.join(filter(None, [package_parent(), spec.environment.get("PYTHONPATH")])),
            partition=self.partition,
            account=self.account,
            extra_sbatch=self.extra_sbatch,
            retry=RetryPolicy.of(spec, script_errors=self.retry_script_errors),
            auto_resume=self._auto_resume(),
            container_image=image,
            environment={contract.ENV_CACHE_ENV: str(self.job_root / ".envs"), **spec.environment},
            handle=str(JobHandle(self.name, job_name)),
            code={"source": spec.source_dir or spec.entry_point, "dependencies": list(spec.dependencies), "snapshot": str(job_dir.code_dir)},
            config_files=ConfigFiles.of(spec, job_name=job_name, hosts=_placeholders(spec.instance_count), submit_directory=f"file://{job_dir.code_dir}"),
            processes_per_host=self.processes_per_host,  # None or auto: each node's GPUs, else its CPUs (runtime/slurm_node.py)
            inputs={name: {"source": str(ch.local_path) if ch.local_path is not None else ch.s3_data, "distribution": ch.distribution} for name, ch in spec.inputs.items()},
            artifacts=Artifacts.of(spec, self.job_root, job_name),
            checkpoint_s3_uri=spec.checkpoint_s3_uri,
        )
        return SlurmDryRun(self.name, spec, job_name, plan, tuple(self._notes(spec)))

    def _auto_resume(self) -> bool | None:
        return None if self.auto_resume == "auto" else bool(self.auto_resume)  # auto: the batch script looks on the node

    def _notes(self, spec: JobSpec) -> list[str]:
        notes = [*channels.notes(spec, spec.instance_count), *code_notes(spec)]
        if spec.checkpoint_s3_uri:
            notes.append(f"checkpoints: {spec.checkpoint_s3_uri} is restored into the job's checkpoints/ folder (every node's /opt/ml/checkpoints, "
                         "on the shared file system) before the step, and synced back every 5 s and after it, by the first node")
        if spec.image_uri and not self.container_image:
            notes.append("image_uri is not used on Slurm: set scheduler_options container_image to run the nodes in an enroot image (pyxis)")
        notes += ranks_notes(self.processes_per_host, self.extra_sbatch)
        if self._auto_resume() is not False:
            where = "on HyperPod's nodes (auto_resume: auto)" if self._auto_resume() is None else "(auto_resume: true)"
            notes.append(f"srun --auto-resume=1 {where}: HyperPod replaces a faulty node and restarts the step; the script must load its checkpoint")
        return notes

    # --- submitting -----------------------------------------------------------------------------

    def run(self, dryrun: DryRun[BatchPlan], *, owner_pid: int | None) -> JobHandle:
        """Stage the job directory, check the job can run at all, submit it; returns at once (the job
        outlives its caller: Slurm owns it)."""
        job_dir = SlurmJobDir(dryrun.request.job_dir)
        job_dir.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # the caller's alone (environment, token); outside the cleanup: one that exists is another job's
            job_dir.path.mkdir(mode=0o700)
        except FileExistsError:  # made since the plan was validated
            raise SpecError(self._name_taken(dryrun.job_name)) from None
        try:
            self._stage(dryrun, job_dir)
            self.client.check(job_dir.script_file)
            slurm_id = self.client.submit(job_dir.script_file)
        except BaseException:
            shutil.rmtree(job_dir.path, ignore_errors=True)  # nothing was submitted: leave no half job
            raise
        handle = JobHandle(self.name, dryrun.job_name)
        write_json_atomic(job_dir.record_file, {"handle": str(handle), "spec": dryrun.spec.as_dict(), "plan": dryrun.request.to_json(), "slurm_job_id": slurm_id, "submitted": time.time()})
        return handle

    def _stage(self, dryrun: DryRun[BatchPlan], job_dir: SlurmJobDir) -> None:
        spec, plan = dryrun.spec, dryrun.request
        stage_code(spec, job_dir.code_dir)
        trees = [OptMl(job_dir.node_tree(index)) for index in range(plan.nodes)]
        for tree, host in zip(trees, plan.config_files.hosts):
            plan.config_files.write(tree, host)
            tree.output_data_dir.mkdir(parents=True, exist_ok=True)
            (tree.base / "checkpoints").symlink_to(job_dir.checkpoint_dir, target_is_directory=True)
        channels.deliver(spec.inputs, trees, job_dir.path / "inputs", style="copy")
        job_dir.checkpoint_dir.mkdir()
        job_dir.logs_dir.mkdir()
        write_json_atomic(
            job_dir.node_file,
            {
                "job_name": dryrun.job_name,
                "instance_type": spec.instance_type,
                "job_token": secrets.token_hex(16),
                "encrypt_links": spec.encrypt_inter_container_traffic,
                "processes_per_host": plan.processes_per_host,
                "artifacts": plan.artifacts.to_json(),
            },
        )
        job_dir.script_file.write_text(render(plan), encoding="utf-8")

    # --- watching -------------------------------------------------------------------------------

    def status(self, handle: JobHandle) -> JobStatus:
        job_dir, record = self._job(handle)
        plan = BatchPlan.from_json(record["plan"])  # job.json, read once
        info = self.client.job_info(record["slurm_job_id"])
        result = read_json_object(job_dir.result_file)
        state, message = job_state(info, result, cancel_requested=job_dir.cancel_file.exists(), retry=plan.retry)
        failure, others = self._root_cause(job_dir, info) if state is JobState.FAILED else (None, [])
        if failure is not None and (info is None or info.state not in ENDINGS):
            message = failure.headline  # the script's failure; Slurm's own endings (node, time) say more
        elif failure is not None and failure.error_type == NODE_FAILURE:
            message = f"node {failure.host} failed: {message}"
        elif state is JobState.FAILED:
            message = f"{message}; no node left a failure record: see {job_dir.batch_log} and {job_dir.logs_dir}"
        artifacts = plan.artifacts.to_json()
        restarts = info.restarts if info else (result or {}).get("restart_count")
        # Where the archive is (after the step) or will be (before it); nowhere when the job ended without one.
        model_data = (result or {}).get("model_data") if state.is_terminal else artifacts["model_data"]
        return JobStatus(
            handle, state, message, failure, self._hosts(job_dir, state), model_data,
            output_data=artifacts["output_data"],
            other_failures=tuple(others),
            submitted=record.get("submitted"),
            started=record.get("submitted"),
            ended=(result or {}).get("ended"),
            attempt=1 + int(restarts or 0),
            goodput=goodput.from_record(goodput_record(job_dir, (result or {}).get("ended") if state.is_terminal else None)),
            scheduler_job_id=str(record["slurm_job_id"]),
            job_dir=str(job_dir.path),
            logs=str(job_dir.logs_dir),
            details={"slurm_state": info.state if info else None, "nodes": info.nodes if info else None, "restarts": int(restarts or 0),
                     "checkpoints": str(job_dir.checkpoint_dir)},
        )

    def _root_cause(self, job_dir: SlurmJobDir, info: JobInfo | None) -> tuple[FailureRecord | None, list[FailureRecord]]:
        """The first failure by host and rank, from every node's records (the runtime wrote them)."""
        records: dict[tuple[Any, ...], FailureRecord] = {}  # every node wrote the job's root cause: keep one
        for path in job_dir.node_trees():
            for item in contract.read_failure_records(OptMl(path)) or []:
                record = FailureRecord.from_json(item)
                records.setdefault((record.host, record.rank, record.error_type, record.message, record.source), record)
        if info is not None and info.state == "NODE_FAIL":
            lost = [FailureRecord(node, None, 1, "the node failed (Slurm NODE_FAIL): its ranks were lost", error_type=NODE_FAILURE, timestamp=0.0) for node in _failed_nodes(job_dir)]
            if lost:  # the node is the cause; what the other nodes saw afterwards is its consequence
                return lost[0], list(records.values())
        verdict = decide(records.values())
        return (verdict.root, list(verdict.others)) if verdict else (None, [])

    def _hosts(self, job_dir: SlurmJobDir, job_state_now: JobState) -> tuple[HostStatus, ...]:
        hosts = []
        for path in job_dir.node_trees():
            opt_ml = OptMl(path)
            name = (contract.read_json_file(opt_ml.resource_config_file, default={}) or {}).get("current_host", path.name)
            if opt_ml.success_file.exists():
                state = JobState.SUCCEEDED
            elif opt_ml.failure_file.exists() and job_state_now is not JobState.CANCELLED:
                state = JobState.FAILED
            else:
                state = job_state_now
            hosts.append(HostStatus(name, state))
        return tuple(hosts)

    def logs(self, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, follow: bool = False) -> Iterator[LogLine]:
        """Every node's lines (each node's file in order); with ``follow`` until the job ends."""
        job_dir, _ = self._job(handle)
        finished = (lambda: self.status(handle).state.is_terminal) if follow else (lambda: True)
        for line in job_lines(job_dir.logs_dir, finished):
            if line.matches(hosts, ranks):
                yield line

    def stacks(self, handle: JobHandle, *, timeout: float) -> list[RankStack]:
        """Every rank's stacks: a request file in the shared job directory, which each node's runtime passes on
        to its ranks (``runtime.stacks.RequestFile``); they write into their node's tree, read here."""
        job_dir, _ = self._job(handle)
        state = self.status(handle).state
        if state is not JobState.RUNNING:
            raise SpecError(SpecIssue("job", f"{handle} is {state.value.lower()}: only a running job has stacks to show", f"see its logs: smddp-launch logs {handle}"))
        files = {}
        for tree in map(OptMl, job_dir.node_trees()):
            host = (contract.read_json_file(tree.resource_config_file, default={}) or {}).get("current_host", tree.base.name)
            files.update(stack_files_of(tree, host))
        before = sizes(files)
        write_json_atomic(job_dir.stacks_request, {"asked": time.time()})  # a new file: every node sees a new request
        return answers(files, before, timeout, settle=0.3)

    def cancel(self, handle: JobHandle) -> None:
        """scancel; a finished job is left alone (Slurm ignores it)."""
        job_dir, record = self._job(handle)
        if read_json_object(job_dir.result_file) is None:
            job_dir.cancel_file.touch()
        self.client.cancel(record["slurm_job_id"])

    # --- lookups --------------------------------------------------------------------------------

    def _job(self, handle: JobHandle) -> tuple[SlurmJobDir, dict[str, Any]]:
        self._check_handle(handle)
        job_dir = SlurmJobDir(self.job_root / handle.job_id)
        record = read_json_object(job_dir.record_file)
        if record is None:
            raise SpecError(SpecIssue("handle", f"no slurm job {handle.job_id!r} in {self.job_root}", "set scheduler_options job_root (or SMDDP_JOB_ROOT) to where its job directory lives"))
        return job_dir, record

    def job_record(self, handle: JobHandle) -> dict[str, Any]:
        """What ``schedule`` wrote to ``job.json``: handle, spec, request, Slurm job id."""
        return self._job(handle)[1]


def ranks_notes(processes_per_host: int | str | None, extra_sbatch: Sequence[str]) -> list[str]:
    """What the dry run says of the ranks per node, which only the nodes can count (runtime/slurm_node.py)."""
    if processes_per_host not in (None, AUTO_RANKS):
        return []
    whole = any(line.split("=")[0] == "--exclusive" for line in extra_sbatch)
    allotted = ("every core of the node (--exclusive): as many ranks as it has cores, each with its own threads" if whole
                else "the CPUs Slurm allots the job there (SLURM_CPUS_ON_NODE: --cpus-per-task, or every core with --exclusive)")
    return [f"ranks per node (processes_per_host auto, torchrun's --nproc-per-node auto): the GPUs each node finds, else one per CPU: "
            f"{allotted}; at most {limits.MAX_PROCESSES_PER_HOST}; processes_per_host N chooses (1 as on a SageMaker CPU instance)"]


def _placeholders(nodes: int) -> list[str]:
    """The nodes' names until each node writes its own (``runtime.slurm_node``)."""
    return [f"node-{index}" for index in range(nodes)]


_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")


def _failed_nodes(job_dir: SlurmJobDir) -> list[str]:
    """The nodes srun saw fail (the batch log keeps its word after the node is back)."""
    try:
        text = job_dir.batch_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return list(dict.fromkeys(_NODE_FAILURE.findall(text)))
