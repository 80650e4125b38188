"""The scheduler side of host-tree jobs, shared by the local and docker schedulers.

A subclass plans (``plan``: its hosts' commands or containers, given to ``_plan``) and adds what its
trees need; this base validates what a machine cannot run, writes the job directory and its record,
starts the one supervisor (``hosttree.supervisor``) and answers ``status``, ``logs``, ``cancel``,
``list_jobs`` and ``remove`` from the job directory, so they work from any process, later -- and
``cancel`` works even when the supervisor is gone or frozen, from what the job recorded.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers.base import Capabilities, DryRun, JobRootScheduler
from smddp_sdk.schedulers.hosttree import fidelity
from smddp_sdk.schedulers.hosttree import stacks as rank_stacks
from smddp_sdk.schedulers.hosttree.attempts import Interruption, request_interrupt
from smddp_sdk.schedulers.hosttree.console_log import follow_stamped
from smddp_sdk.schedulers.hosttree.host_trees import HostTree, host_names, prepare_host_trees
from smddp_sdk.schedulers.hosttree.job_dir import JobDir, is_supervisor_of
from smddp_sdk.schedulers.hosttree.plan import SHOWN_HOSTS, Checkpoints, HostPlan, HostTreePlan, Spot
from smddp_sdk.schedulers.hosttree.supervisor import HEARTBEAT, LIFELINE, SCRATCH, backend_for, collect_job_artifacts
from smddp_sdk.schedulers.job_files import Artifacts, ConfigFiles, output_root, package_parent, simulated_gpus, stage_code
from smddp_sdk.schedulers.stacks import RankStack
from smddp_sdk.specs import contract, goodput, processes
from smddp_sdk.specs.failure import FailureRecord
from smddp_sdk.specs.job import JobSpec, RetryPolicy
from smddp_sdk.specs.status import HostStatus, JobHandle, JobState, JobStatus, LogLine, attempts_of, settled, transitions_of

SUPERVISOR_MODULE = "smddp_sdk.schedulers.hosttree.supervisor"
# A supervisor that neither answers a SIGTERM nor touches its heartbeat for this long is taken to be
# frozen; ``cancel`` then stops the hosts itself.
FROZEN_AFTER = 3.0
# A job found without its supervisor this soon after its last heartbeat gets what is left of its hosts
# stopped before its archives are made; later, only the archives (its pids may have been reused).
ORPHAN_SWEEP_WITHIN = 300.0
_NAME_ATTEMPTS = 20


class HostTreeScheduler(JobRootScheduler):
    """Jobs of N host trees on this machine, whose state lives in ``<job_root>/<job>/`` (``hosttree.job_dir``)."""

    capabilities: ClassVar[Capabilities] = Capabilities(bound_to_owner=True, cancel_on_interrupt=True, lists_locally=True, interrupt=True, stacks=True, remove=True, runs_here=True)
    backend: ClassVar[str]  # the host backend the supervisor runs the hosts with: "process" or "container"
    link_inputs: ClassVar[bool] = True  # input channels linked into the trees (docker mounts them instead)
    job_root: Path
    processes_per_host: int | None
    stop_grace_period: float
    retry_script_errors: bool
    interrupt_after: tuple[float, ...]

    # --- planning ---------------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        """What this machine cannot run: S3 code or output, what the rehearsal cannot emulate, a name clash."""
        issues = self._local_issues(spec)
        if not (spec.output_path or "").startswith("s3://") and (problem := _unwritable(output_root(spec, self.job_root))):
            issues.append(SpecIssue("output_path" if spec.output_path else "scheduler_options.job_root", problem))
        if self.interrupt_after and not spec.use_spot_instances:
            issues.append(SpecIssue("scheduler_options.interrupt_after", "rehearses spot interruptions, and this job does not use spot instances", "set use_spot_instances: true and max_wait, or drop interrupt_after"))
        return [*issues, *self._feature_issues(spec), *fidelity.issues(spec)]

    def _feature_issues(self, spec: JobSpec) -> list[SpecIssue]:
        """What this scheduler cannot run of what SageMaker can (beyond the fidelity checks)."""
        return []

    def _plan(self, spec: JobSpec, job_name: str, **planned: Any) -> HostTreePlan:
        """The plan of every host-tree job around what this scheduler ``planned`` (its launch), built once:
        the dry run shows it, ``run`` writes it to job.json, the supervisor runs it."""
        job_dir = JobDir(self.job_root / job_name)
        hosts = host_names(spec.instance_count)
        return HostTreePlan(
            job_name=job_name,
            handle=str(JobHandle(self.name, job_name)),
            job_dir=job_dir.path,
            code={"source": spec.source_dir or spec.entry_point, "dependencies": list(spec.dependencies), "snapshot": str(job_dir.code_dir)},
            hosts=tuple(self._host(spec, job_dir, host) for host in hosts),
            config_files=ConfigFiles.of(spec, job_name=job_name, hosts=hosts, submit_directory=self._submit_directory(job_dir)),
            artifacts=Artifacts.of(spec, self.job_root, job_name),
            backend=self.backend,
            max_run=spec.max_run,
            grace=self.stop_grace_period,
            retry=RetryPolicy.of(spec, script_errors=self.retry_script_errors),
            spot=Spot(int(spec.max_wait or spec.max_run), self.interrupt_after) if spec.use_spot_instances else None,
            checkpoints=Checkpoints(spec.checkpoint_s3_uri, spec.checkpoint_local_path) if spec.checkpoint_s3_uri else None,
            **planned,
        )

    def _dryrun(self, spec: JobSpec, plan: HostTreePlan, notes: Sequence[str]) -> DryRun[HostTreePlan]:
        """The dry run of ``plan``: this scheduler's ``notes``, the fidelity notes, and how it is shown."""
        shown = [f"{len(plan.hosts)} hosts: the dry run shows the first and last ones; the job's record keeps every one"] if len(plan.hosts) > SHOWN_HOSTS else []
        return DryRun(self.name, spec, plan.job_name, plan, (*notes, *fidelity.notes(spec, self.name, len(plan.hosts)), *shown))

    def _host(self, spec: JobSpec, job_dir: JobDir, host: str) -> HostPlan:
        """One host of the plan: its tree (and how a container starts, for the docker scheduler)."""
        return HostPlan(host, job_dir.host_dir(host))

    def _submit_directory(self, job_dir: JobDir) -> str:
        """``sagemaker_submit_directory`` as the hosts see the code snapshot."""
        return f"file://{job_dir.code_dir}"

    def _simulated_gpus(self, spec: JobSpec, *, gpus_passed: bool) -> int | None:
        return simulated_gpus(spec, self.processes_per_host, gpus_passed=gpus_passed)

    # --- starting ---------------------------------------------------------------------------------

    def warn(self, dryrun: DryRun) -> None:
        fidelity.report(dryrun)  # warnings for what a rehearsal cannot emulate, a count of the rest

    def _write_job_dir(self, dryrun: DryRun[HostTreePlan], job_dir: JobDir) -> list[HostTree]:
        """Fill the (new, empty) job directory: the code snapshot and one /opt/ml tree per host, with the
        config files the plan holds."""
        stage_code(dryrun.spec, job_dir.code_dir)
        return prepare_host_trees(dryrun.spec, job_dir.path, dryrun.request.config_files, link_inputs=self.link_inputs)

    def run(self, dryrun: DryRun[HostTreePlan], *, owner_pid: int | None) -> JobHandle:
        """Create the job directory under a unique name, fill it, record the job, start its supervisor."""
        dryrun, job_dir = self._claim_job_dir(dryrun)
        try:
            self._write_job_dir(dryrun, job_dir)
            job_dir.write_record({
                "handle": dryrun.request.handle,
                "job_name": dryrun.job_name,
                "created": time.time(),
                "owner_pid": owner_pid,
                "job_root": str(self.job_root),
                "spec": dryrun.spec.as_dict(),
                "plan": dryrun.request.to_json(),
            })
            job_dir.write_state({"state": JobState.PENDING.value, "message": "starting the supervisor"})
        except BaseException:
            shutil.rmtree(job_dir.path, ignore_errors=True)  # no half-written job is left to confuse list/status
            raise
        _make_private(job_dir.path)
        self._start_supervisor(job_dir)
        return JobHandle.parse(dryrun.request.handle)

    def _claim_job_dir(self, dryrun: DryRun[HostTreePlan]) -> tuple[DryRun[HostTreePlan], JobDir]:
        """mkdir is the lock: two jobs started in the same millisecond get different generated names."""
        self.job_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(_NAME_ATTEMPTS):
            job_dir = JobDir(dryrun.request.job_dir)
            try:
                job_dir.path.mkdir(mode=0o700)
                return dryrun, job_dir
            except FileExistsError:
                if dryrun.spec.job_name:
                    raise SpecError(self._name_taken(dryrun.job_name)) from None
            time.sleep(0.002)  # the generated name carries milliseconds
            dryrun = self.plan(dryrun.spec)
        raise SpecError(SpecIssue("base_job_name", f"no free job name after {_NAME_ATTEMPTS} attempts in {self.job_root}"))

    def _start_supervisor(self, job_dir: JobDir) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent(), env.get("PYTHONPATH")]))
        with open(job_dir.supervisor_log, "ab", opener=lambda path, flags: os.open(path, flags, 0o600)) as log:
            # A session of its own: Ctrl-C in the caller's terminal reaches the caller, which decides
            # whether to cancel; the job survives the caller only when nobody owns it.
            process = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(job_dir.path)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=job_dir.path
            )
        _CHILDREN.append(process)

    # --- watching ---------------------------------------------------------------------------------

    def status(self, handle: JobHandle) -> JobStatus:
        job_dir = self._job_dir(handle)
        state = self._settled_state(job_dir)
        _reap_finished_children()
        failure = FailureRecord.from_json(state["failure"]) if state.get("failure") else None
        if failure is not None:  # where the supervisor found the root cause's error file and log (``Supervisor.note``)
            failure = failure.replace(error_file=failure.error_file or state.get("error_file") or "", log_file=failure.log_file or state.get("rank_log") or "")
        hosts = tuple(HostStatus(name, JobState(host.get("state", "UNKNOWN")), host.get("exit_code")) for name, host in (state.get("hosts") or {}).items())
        return settled(JobStatus(
            handle, JobState(state.get("state", "UNKNOWN")), state.get("message", ""), failure, hosts, state.get("model_data"),
            output_data=state.get("output_data"),
            archive_skipped=tuple(state.get("archive_skipped") or ()),
            other_failures=tuple(FailureRecord.from_json(item) for item in state.get("other_failures") or () if isinstance(item, dict)),
            started=state.get("started"),
            ended=state.get("ended"),
            attempt=int(state.get("attempt", 1)),
            attempts=attempts_of(state.get("attempts") or ()),
            retries_left=state.get("retries_left"),
            interruptions=int(state.get("interruptions", 0)),
            transitions=transitions_of(state.get("transitions") or ()),
            training_seconds=state.get("training_seconds"),
            billable_seconds=state.get("billable_seconds"),
            goodput=goodput.from_record(state),
            job_dir=str(job_dir.path),
            logs=str(job_dir.console_log),
        ))

    def _settled_state(self, job_dir: JobDir) -> dict[str, Any]:
        """state.json, with a job whose supervisor died marked FAILED for good (it never stays RUNNING)."""
        state = job_dir.read_state()
        job_state = JobState(state.get("state", JobState.UNKNOWN.value))
        if job_state.is_terminal:
            return state
        supervisor = state.get("supervisor_pid")
        if job_state is JobState.PENDING:
            if not _stale(job_dir):
                return state
            message = f"the job's supervisor never started; see {job_dir.supervisor_log}"
        elif is_supervisor_of(supervisor, job_dir.path):
            return state
        else:
            state = job_dir.read_state()  # it may have finished just now
            if JobState(state.get("state", "UNKNOWN")).is_terminal:
                return state
            message = (f"the job's supervisor (pid {supervisor}) died; its hosts stop themselves when it does "
                       f"(lifeline); see {job_dir.supervisor_log}")
        recent = time.monotonic() - _last_sign_of_life(job_dir) < ORPHAN_SWEEP_WITHIN  # before this write
        # "orphaned": its supervisor did not end it. Marked first, so that one caller sweeps.
        state = {**state, "state": JobState.FAILED.value, "message": message, "ended": time.time(), "orphaned": True}
        job_dir.write_state(state)
        if supervisor is None:
            return state
        if recent:
            self._sweep(job_dir, state)  # the hosts stop on the broken lifeline: wait for them, then archive
        else:  # long dead: its hosts stopped long ago, and its pids may be other processes' by now
            self._archive(job_dir)
        return job_dir.read_state()

    def logs(self, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, follow: bool = False) -> Iterator[LogLine]:
        """Every host's output in the order it arrived; ``ranks`` keeps only those ranks' lines."""
        job_dir = self._job_dir(handle)
        finished = (lambda: self.status(handle).state.is_terminal) if follow else (lambda: True)
        for raw, timestamp in follow_stamped(job_dir.console_log, finished):
            line = dataclasses.replace(contract.parse_console_line(raw), timestamp=timestamp)
            if line.matches(hosts, ranks):
                yield line

    # --- stopping ---------------------------------------------------------------------------------

    def cancel(self, handle: JobHandle) -> None:
        """Stop every host of the job (SIGTERM, then SIGKILL after the grace period) and wait for it.

        Through the supervisor when it answers; when it is gone or frozen, ``cancel`` stops the hosts
        itself from what the job recorded and marks the job CANCELLED. A finished job is left alone.
        """
        job_dir = self._job_dir(handle)
        state = self._settled_state(job_dir)
        if JobState(state.get("state", "UNKNOWN")).is_terminal:
            if state.get("orphaned") and not state.get("swept"):
                self._sweep(job_dir, state)  # its supervisor died: stop and remove what it left
            return
        job_dir.request_cancel()  # seen by a supervisor that is only starting, or that missed the signal
        if self._cancel_through_supervisor(job_dir):
            _reap_finished_children()
            return
        self._take_over(job_dir)

    def _cancel_through_supervisor(self, job_dir: JobDir) -> bool:
        grace = job_dir.plan.grace
        deadline = time.monotonic() + grace + 15
        signalled_at: float | None = None
        while time.monotonic() < deadline:
            state = job_dir.read_state()
            if JobState(state.get("state", "UNKNOWN")).is_terminal:
                return True
            supervisor = state.get("supervisor_pid")
            if supervisor is None:
                if _stale(job_dir, limit=5.0):
                    return False  # it never started
            elif not is_supervisor_of(supervisor, job_dir.path) or processes.is_stopped(supervisor):
                return False
            elif signalled_at is None:
                os.kill(supervisor, signal.SIGTERM)
                signalled_at = time.monotonic()
            elif time.monotonic() - max(signalled_at, _last_sign_of_life(job_dir)) > FROZEN_AFTER:
                return False  # no word since the signal: frozen or wedged
            time.sleep(0.05)
        return False

    def _take_over(self, job_dir: JobDir) -> None:
        """The supervisor is gone or frozen: kill it (its lifeline breaks, so every runtime stops its
        ranks), stop what is left of the hosts from the record, and record the cancellation."""
        state = job_dir.read_state()
        supervisor = state.get("supervisor_pid")
        was_alive = is_supervisor_of(supervisor, job_dir.path)
        if was_alive:
            os.kill(supervisor, signal.SIGKILL)
        self._sweep(job_dir, state)
        reason = "was not answering" if was_alive else "was gone"
        job_dir.write_state({**job_dir.read_state(), "state": JobState.CANCELLED.value, "ended": time.time(),
                             "message": f"cancelled: the job's supervisor (pid {supervisor}) {reason}, so cancel stopped its hosts itself"})
        _reap_finished_children()

    def _sweep(self, job_dir: JobDir, state: dict[str, Any]) -> None:
        """Stop and remove what a job without a supervisor left (processes, containers, its network), and
        make its archives once the hosts are gone, as its supervisor would have (SageMaker uploads what a
        stopped job wrote)."""
        backend_for(job_dir).stop_orphans(job_dir, state)
        for name in (LIFELINE, HEARTBEAT):
            (job_dir.path / name).unlink(missing_ok=True)
        shutil.rmtree(job_dir.path / SCRATCH, ignore_errors=True)
        self._archive(job_dir)

    def _archive(self, job_dir: JobDir) -> None:
        """The archives a job without a supervisor never got, from what its hosts wrote."""
        archives, problem = collect_job_artifacts(job_dir, job_dir.plan)
        state = job_dir.read_state()
        message = state.get("message", "") + (f"; also {problem}" if problem else "")
        job_dir.write_state({**state, **archives, "message": message, "swept": True})

    def interrupt(self, handle: JobHandle, interruption: Interruption) -> None:
        """Rehearse a managed spot interruption of a running spot job: its supervisor stops every host,
        syncs the checkpoints, and starts the job again with them (``hosttree.attempts``)."""
        job_dir = self._job_dir(handle)
        if job_dir.plan.spot is None:
            raise SpecError(SpecIssue("job", f"{handle} does not use spot instances: only spot capacity is interrupted",
                                      "run the job with use_spot_instances: true and max_wait; a lost on-demand host is rehearsed by "
                                      "killing a host's runtime (max_retry_attempts retries it)"))
        hosts = [item.host for item in job_dir.plan.hosts]
        if interruption.host is not None and interruption.host not in hosts:
            raise SpecError(SpecIssue("--host", f"{handle} has no host {interruption.host!r}", f"one of {', '.join(hosts)}"))
        state = self._settled_state(job_dir).get("state")
        if state != JobState.RUNNING.value:
            raise SpecError(SpecIssue("job", f"{handle} is not running (it is {state})", "interrupt a job while its hosts train"))
        request_interrupt(job_dir.path, interruption)

    def stacks(self, handle: JobHandle, *, timeout: float) -> list[RankStack]:
        """Every rank's stacks, through the supervisor (``hosttree.stacks``); an ended job has none."""
        job_dir = self._job_dir(handle)
        if self.status(handle).state.is_terminal:
            raise SpecError(SpecIssue("job", f"{handle} has ended: there are no stacks to show", f"see its logs: smddp-launch logs {handle}"))
        return rank_stacks.collect(job_dir.path, timeout=timeout)

    # --- lookups ----------------------------------------------------------------------------------

    def _job_dir(self, handle: JobHandle) -> JobDir:
        self._check_handle(handle)
        job_dir = JobDir(self.job_root / handle.job_id)
        if not job_dir.exists():
            raise SpecError(SpecIssue("handle", f"no {self.name} job {handle.job_id!r} in {self.job_root}", f"list jobs with `smddp-launch list --scheduler {self.name}`; set job_root or SMDDP_JOB_ROOT if they live elsewhere"))
        if job_dir.record is not None:  # one it cannot read is not refused here: status says why
            job_dir.plan  # noqa: B018 - read once for this call; a job an older version wrote says so
        return job_dir

    def remove(self, handle: JobHandle) -> None:
        """Delete a finished job's directory (``smddp-launch clean``); a running job is refused."""
        if not self.status(handle).state.is_terminal:
            raise SpecError(SpecIssue("job", f"{handle} is still running", f"cancel it first: smddp-launch cancel {handle.job_id}"))
        shutil.rmtree(self.job_path(handle), ignore_errors=True)

    def job_record(self, handle: JobHandle) -> dict[str, Any]:
        """What ``schedule`` wrote to ``job.json``: handle, spec (``JobSpec.as_dict()``), plan, owner."""
        return self._job_dir(handle).read_record()


# Supervisors this process started: reaped once they end, so a long-lived notebook keeps no zombies.
_CHILDREN: list[subprocess.Popen[bytes]] = []


def _reap_finished_children() -> None:
    _CHILDREN[:] = [child for child in _CHILDREN if child.poll() is None]


def _unwritable(path: Path) -> str:
    """Why ``path`` (existing or to be created) cannot receive files, or "" when it can."""
    probe = path.expanduser()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(probe)!r} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{str(probe)!r} is not writable"
    return ""


def _stale(job_dir: JobDir, limit: float = 60.0) -> bool:
    """A job still PENDING long after it was written: its supervisor failed before its first word."""
    try:
        return time.time() - job_dir.state_file.stat().st_mtime > limit
    except FileNotFoundError:
        return False


def _last_sign_of_life(job_dir: JobDir) -> float:
    """When the supervisor last wrote its state or heartbeat, on the monotonic clock."""
    newest = 0.0
    for path in (job_dir.state_file, job_dir.path / HEARTBEAT):
        with suppress(FileNotFoundError):
            newest = max(newest, path.stat().st_mtime)
    return time.monotonic() - (time.time() - newest)


def _make_private(job_path: Path) -> None:
    """Job files 0600 (0700 where executable) and directories 0700, as docs/local-mode.md says: the copied
    code and host trees keep their sources' modes otherwise. Links are left as they are."""
    for directory, _, filenames in os.walk(job_path):
        os.chmod(directory, 0o700)
        for name in filenames:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, stat.S_IMODE(mode) & 0o700)

