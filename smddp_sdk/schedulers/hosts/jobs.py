"""The scheduler side of host-tree jobs, shared by the local and docker schedulers.

A subclass plans (``dryrun``) and prepares the job directory (``_write_job_dir``); this base writes the
record, starts the one supervisor (``hosts.supervisor``) and answers ``status``, ``logs``, ``cancel``
and ``list`` from the job directory, so they work from any process, later -- and ``cancel`` works even
when the supervisor is gone or frozen, from what the job recorded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import smddp_sdk
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.schedulers.console_log import follow_stamped
from smddp_sdk.schedulers.hosts.supervisor import HEARTBEAT, LIFELINE, SCRATCH, backend_for
from smddp_sdk.schedulers.local_job import JobDir, is_supervisor_of
from smddp_sdk.specs import contract
from smddp_sdk.specs.failure import FailureRecord
from smddp_sdk.specs.status import HostStatus, JobHandle, JobState, JobStatus, LogLine

SUPERVISOR_MODULE = "smddp_sdk.schedulers.hosts.supervisor"
# A supervisor that neither answers a SIGTERM nor touches its heartbeat for this long is taken to be
# frozen; ``cancel`` then stops the hosts itself.
FROZEN_AFTER = 3.0
_NAME_ATTEMPTS = 20


class HostTreeScheduler(Scheduler):
    """Status, logs and cancel of jobs whose state lives in ``<job_root>/<job>/`` (see ``local_job``)."""

    name: ClassVar[str]
    job_root: Path
    stop_grace_period: float

    # --- starting ---------------------------------------------------------------------------------

    def _write_job_dir(self, dryrun: DryRun, job_dir: JobDir) -> None:
        """Fill the (new, empty) job directory: code snapshot, host trees. Subclasses implement it."""
        raise NotImplementedError

    def _start_job(self, dryrun: DryRun, owner_pid: int | None) -> JobHandle:
        """Create the job directory under a unique name, fill it, record the job, start its supervisor."""
        dryrun, job_dir = self._claim_job_dir(dryrun)
        try:
            self._write_job_dir(dryrun, job_dir)
            job_dir.write_record({
                "handle": dryrun.request["handle"],
                "job_name": dryrun.job_name,
                "created": time.time(),
                "owner_pid": owner_pid,
                "job_root": str(self.job_root),
                "spec": dryrun.spec.as_dict(),
                "request": dryrun.request,
            })
            job_dir.write_state({"state": JobState.PENDING.value, "message": "starting the supervisor"})
        except BaseException:
            shutil.rmtree(job_dir.path, ignore_errors=True)  # no half-written job is left to confuse list/status
            raise
        self._start_supervisor(job_dir)
        return JobHandle.parse(dryrun.request["handle"])

    def _claim_job_dir(self, dryrun: DryRun) -> tuple[DryRun, JobDir]:
        """mkdir is the lock: two jobs started in the same millisecond get different generated names."""
        self.job_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(_NAME_ATTEMPTS):
            job_dir = JobDir(Path(dryrun.request["job_dir"]))
            try:
                job_dir.path.mkdir(mode=0o700)
                return dryrun, job_dir
            except FileExistsError:
                if dryrun.spec.job_name:
                    raise SpecError(SpecIssue("job_name", f"a {self.name} job named {dryrun.job_name!r} already exists in {self.job_root}", "choose another job_name")) from None
            time.sleep(0.002)  # the generated name carries milliseconds
            dryrun = self.dryrun(dryrun.spec)
        raise SpecError(SpecIssue("base_job_name", f"no free job name after {_NAME_ATTEMPTS} attempts in {self.job_root}"))

    def _start_supervisor(self, job_dir: JobDir) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent(), env.get("PYTHONPATH")]))
        with open(job_dir.supervisor_log, "ab") as log:
            # A session of its own: Ctrl-C in the caller's terminal reaches the caller, which decides
            # whether to cancel; the job survives the caller only when nobody owns it.
            process = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(job_dir.path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=job_dir.path,
            )
        _CHILDREN.append(process)

    # --- watching ---------------------------------------------------------------------------------

    def status(self, handle: JobHandle) -> JobStatus:
        job_dir = self._job_dir(handle)
        state = self._settled_state(job_dir)
        _reap_finished_children()
        failure = FailureRecord.from_json(state["failure"]) if state.get("failure") else None
        hosts = tuple(HostStatus(name, JobState(host.get("state", "UNKNOWN")), host.get("exit_code")) for name, host in (state.get("hosts") or {}).items())
        details = {
            "job_dir": str(job_dir.path),
            "console_log": str(job_dir.console_log),
            "started": state.get("started"),
            "ended": state.get("ended"),
            "output_data": state.get("output_data"),
            "other_failures": state.get("other_failures", []),
            "rank_log": state.get("rank_log"),
            "error_file": state.get("error_file"),
        }
        return JobStatus(handle, JobState(state.get("state", "UNKNOWN")), state.get("message", ""), failure, hosts, state.get("model_data"), details)

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
        # "orphaned": nobody collected or cleaned up after it; cancel still sweeps what is left.
        state = {**state, "state": JobState.FAILED.value, "message": message, "ended": time.time(), "orphaned": True}
        job_dir.write_state(state)
        return state

    def logs(
        self,
        handle: JobHandle,
        *,
        hosts: Sequence[str] | None = None,
        ranks: Sequence[int] | None = None,
        follow: bool = False,
    ) -> Iterator[LogLine]:
        """Every host's output in the order it arrived; ``ranks`` keeps only those ranks' lines."""
        job_dir = self._job_dir(handle)
        finished = (lambda: self.status(handle).state.is_terminal) if follow else (lambda: True)
        for raw, timestamp in follow_stamped(job_dir.console_log, finished):
            parsed = contract.parse_console_line(raw)
            line = LogLine(parsed.host, parsed.text, parsed.rank, timestamp=timestamp)
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
        grace = float(job_dir.read_record()["request"].get("stop_grace_period", self.stop_grace_period))
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
            elif not is_supervisor_of(supervisor, job_dir.path) or _frozen(supervisor):
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
        """Stop and remove what a job without a supervisor left (processes, containers, its network)."""
        record = job_dir.read_record()
        grace = float(record["request"].get("stop_grace_period", self.stop_grace_period))
        backend_for(job_dir, record).stop_orphans(job_dir, record, state, grace)
        (job_dir.path / LIFELINE).unlink(missing_ok=True)
        shutil.rmtree(job_dir.path / SCRATCH, ignore_errors=True)
        job_dir.write_state({**job_dir.read_state(), "swept": True})

    # --- lookups ----------------------------------------------------------------------------------

    def _job_dir(self, handle: JobHandle) -> JobDir:
        if handle.scheduler != self.name:
            raise SpecError(SpecIssue("handle", f"{handle} is not a {self.name} job", f"use get_scheduler({handle.scheduler!r})"))
        job_dir = JobDir(self.job_root / handle.job_id)
        if not job_dir.exists():
            raise SpecError(SpecIssue("handle", f"no {self.name} job {handle.job_id!r} in {self.job_root}", f"list jobs with `smddp-launch list --scheduler {self.name}`; set job_root or SMDDP_JOB_ROOT if they live elsewhere"))
        return job_dir

    def has_job(self, job_name: str) -> bool:
        return JobDir(self.job_root / job_name).exists()

    def list_jobs(self) -> list[JobStatus]:
        """Every job under the job root, newest first."""
        if not self.job_root.is_dir():
            return []
        jobs = [JobDir(path) for path in self.job_root.iterdir() if JobDir(path).exists()]
        jobs.sort(key=lambda job: job.record_file.stat().st_mtime, reverse=True)
        return [self.status(JobHandle(self.name, job.path.name)) for job in jobs]

    def job_record(self, handle: JobHandle) -> dict[str, Any]:
        """What ``schedule`` wrote to ``job.json``: handle, spec (``JobSpec.as_dict()``), request, owner."""
        return self._job_dir(handle).read_record()


# Supervisors this process started: reaped once they end, so a long-lived notebook keeps no zombies.
_CHILDREN: list[subprocess.Popen[bytes]] = []


def _reap_finished_children() -> None:
    _CHILDREN[:] = [child for child in _CHILDREN if child.poll() is None]


def package_parent() -> str:
    """The directory holding the ``smddp_sdk`` package, for the supervisor's and runtimes' PYTHONPATH."""
    return str(Path(smddp_sdk.__file__).resolve().parent.parent)


def _stale(job_dir: JobDir, limit: float = 60.0) -> bool:
    """A job still PENDING long after it was written: its supervisor failed before its first word."""
    try:
        return time.time() - job_dir.state_file.stat().st_mtime > limit
    except FileNotFoundError:
        return False


def _frozen(pid: int) -> bool:
    """Stopped (SIGSTOP, a debugger): it will not answer whatever we wait."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


def _last_sign_of_life(job_dir: JobDir) -> float:
    """When the supervisor last wrote its state or heartbeat, on the monotonic clock."""
    newest = 0.0
    for path in (job_dir.state_file, job_dir.path / HEARTBEAT):
        try:
            newest = max(newest, path.stat().st_mtime)
        except FileNotFoundError:
            pass
    return time.monotonic() - (time.time() - newest)

