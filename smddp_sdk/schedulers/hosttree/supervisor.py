"""The one supervisor of a host-tree job: ``python -m smddp_sdk.schedulers.hosttree.supervisor <job_dir>``.

One detached process per job, for local processes and docker containers alike. It reads ``job.json``,
starts every host through its backend, copies their output into ``console.log`` and keeps
``state.json`` current. It stops the job when asked (SIGTERM/SIGINT or the ``cancel-requested`` file),
when the process that owns the job goes away, when ``max_run`` passes, or when one host failed and the
others are still running after a short grace (the runtimes normally stop each other first). At the end
it names the root cause with ``specs.failure.decide`` over every record of every host, collects the
artifacts (a failed collection fails the job) and writes the final state.

No orphans: the supervisor holds the write end of a FIFO (``lifeline``) that every runtime watches; if
the supervisor dies, however it dies, the runtimes read end-of-file and stop their ranks. Local runtimes
also carry PR_SET_PDEATHSIG. A ``heartbeat`` file, touched every second, lets ``cancel`` tell a frozen
supervisor from a busy one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from smddp_sdk.schedulers import stacks as rank_stacks
from smddp_sdk.schedulers.hosttree import attempts, checkpoints, hanging, stacks, survivors
from smddp_sdk.schedulers.hosttree.attempts import Interruption, Timeline
from smddp_sdk.schedulers.hosttree.backend import HostBackend, HostExit
from smddp_sdk.schedulers.hosttree.console_log import StampedLog
from smddp_sdk.schedulers.hosttree.host_trees import collect_artifacts
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs import contract, events, goodput, processes
from smddp_sdk.specs.archives import read_inside
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.failure import SOURCE_EARLY_EXIT, SOURCE_STOPPED, SOURCE_SUPERVISOR, FailureRecord, Verdict, decide, from_error_file
from smddp_sdk.specs.status import JobState, billing_lines

POLL_SECONDS = 0.1
HEARTBEAT_SECONDS = 1.0
# How long the other hosts may keep running after one host's runtime ended in failure. The runtimes
# stop each other through the coordinator within a second; this catches a host that cannot hear it.
PEER_FAILURE_GRACE = 5.0
# When max_run passes: how long the ranks still running have to write their stacks, and how long an
# answer may take once others came (ranks that ended never answer).
HANGING_STACKS_TIMEOUT = 2.0
HANGING_STACKS_SETTLE = 0.3
LIFELINE = "lifeline"
HEARTBEAT = "heartbeat"
SCRATCH = "scratch"  # the runtimes' scratch files, removed when the job ends
SUPERVISOR_HOST = "supervisor"  # the console prefix of the supervisor's own lines (attempts, interruptions)


def backend_for(job_dir: JobDir) -> HostBackend:
    """The backend a job's plan names (``process`` for local jobs, ``container`` for docker jobs)."""
    if job_dir.plan.backend == "container":
        from smddp_sdk.schedulers.hosttree.container_backend import ContainerBackend

        return ContainerBackend(job_dir, job_dir.plan)
    from smddp_sdk.schedulers.hosttree.process_backend import ProcessBackend

    return ProcessBackend(job_dir, job_dir.plan)


class Supervisor:
    # How long the other hosts may keep running after one host's runtime failed (see PEER_FAILURE_GRACE).
    peer_failure_grace = PEER_FAILURE_GRACE

    def __init__(self, job_dir: JobDir, backend: HostBackend | None = None) -> None:
        self.job_dir = job_dir
        self.owner_pid: int | None = (job_dir.record or {}).get("owner_pid")
        self.plan = job_dir.plan  # job.json, read once
        self.retries_left = self.plan.retry.max_retry_attempts  # as torch elastic's _remaining_restarts
        self.new_backend = (lambda: backend) if backend is not None else (lambda: backend_for(job_dir))
        self.backend = self.new_backend()
        self.hosts: list[str] = [item.host for item in self.plan.hosts]
        self.console_lock = threading.Lock()
        self.console: StampedLog | None = None
        self.signalled = threading.Event()
        self.wake = processes.Wakeup()  # set by signal handlers: the watch loop looks at once
        self.state: dict[str, Any] = {}
        self.exits: dict[str, HostExit] = {}
        self.stopped_by_us: set[str] = set()
        self.stop_reason: tuple[JobState, str] | None = None
        self.kill_at: float | None = None
        self.first_parent = os.getppid()
        self.lifeline_fd: int | None = None
        self.last_heartbeat = 0.0
        self.timeline = Timeline({})
        self.attempt_started = time.time()
        self.interruption: Interruption | None = None
        self.hanging: list[FailureRecord] = []  # the ranks still running when max_run passed
        self.sync: checkpoints.CheckpointSync | None = None  # the running attempt's checkpoint sync
        self.host_env: dict[str, str] = {}  # what every host of the attempt gets (start_hosts), a replaced one too
        self.generation = 0  # the smddp group's re-formations this attempt: one per host replaced alone
        self.restart_every_host = False  # a lost host could not be replaced alone: the others stop too

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: self.wake.set())  # a runtime ended: look now, not at the next poll
        self.state = {"state": JobState.STARTING.value, "message": "", "supervisor_pid": os.getpid(), "started": time.time(), "hosts": {}, "retries_left": self.retries_left}
        self.timeline = Timeline(self.state)
        self.timeline.enter(attempts.STARTING, "launching the hosts")
        self.save()
        if self.cancel_wanted():
            return self.finish(JobState.CANCELLED, "cancelled before it started")
        sync = checkpoints.for_plan(self.plan, stream=self)  # checkpoint_s3_uri: copied out while the hosts run
        while True:
            self.run_attempt(sync)
            retry = self.retry_reason()
            if not retry:
                break
            sync = self.restart(sync, retry)
        self.backend.drop_standbys()
        shutil.rmtree(self.job_dir.path / SCRATCH, ignore_errors=True)
        try:
            return self.conclude()
        finally:
            if self.console is not None:
                self.console.close()

    def on_stop_signal(self, _signum: int, _frame: object) -> None:
        self.signalled.set()
        self.wake.set()

    def run_attempt(self, sync: checkpoints.CheckpointSync | None) -> None:
        """Start every host, watch them until they all ended, and make the last checkpoint pass."""
        self.attempt_started = self.state["attempt_started"] = time.time()
        self.sync = sync
        try:
            self.start_hosts()
        except Exception as exc:  # noqa: BLE001 - a host that cannot start fails the job, with the reason
            self.stop(JobState.FAILED, f"could not start the hosts: {exc}")
        else:
            self.timeline.enter(attempts.TRAINING, f"attempt {self.timeline.attempt}: the hosts run the script")
            self.timeline.mark("hosts_started", time.time())
            self.update(state=JobState.RUNNING.value)
            self.event(events.HOSTS_STARTED, warm=all(info.get("warm", False) for info in self.state["hosts"].values()))
            if self.retries_left > 0 or self.plan.spot is not None:
                self.backend.start_standbys()  # the next attempt's, warming up while this one trains
        if sync is not None:
            sync.start()
        self.watch()
        if sync is not None:
            sync.stop()  # the last pass, after every host ended: what a retry restores
        self.backend.drain(timeout=5)

    # --- attempts (max_retry_attempts, spot interruptions) ---------------------------------------

    def retry_reason(self) -> str:
        """Why the attempt that just ended is followed by another, or "" (the plan's retry policy: ``attempts``)."""
        if self.interruption is not None:
            if not self.stop_reason or self.stop_reason[0] is not JobState.CANCELLED:
                return f"{self.interruption.what} was reclaimed"
            return ""
        failed = any(e.code != 0 for e in self.exits.values())
        if not failed or (self.stop_reason is not None and self.stop_reason[1]):  # success, cancel, max_run, max_wait
            return ""
        verdict = self.verdict()
        return attempts.retry_reason(verdict.root if verdict else None, self.plan.retry, retries_left=self.retries_left)

    def restart(self, sync: checkpoints.CheckpointSync | None, reason: str) -> checkpoints.CheckpointSync | None:
        """End the attempt (SageMaker's Interrupted or Restarting), give every host a fresh tree with the
        checkpoints synced so far, and reset what the supervisor knows of the hosts."""
        interrupted = self.interruption is not None
        outcome = attempts.INTERRUPTED if interrupted else attempts.RESTARTING
        if not interrupted:
            self.retries_left -= 1  # an interruption is not a retry (docs/resuming.md)
            self.state["retries_left"] = self.retries_left
        self.mark_fault()
        self.timeline.end_attempt(outcome, reason, self.attempt_started)
        self.timeline.enter(outcome, reason)
        self.event(events.RESTART, reason=reason)
        standbys, self.backend.standbys = self.backend.standbys, {}
        self.backend.release()
        self.say(f"attempt {self.timeline.attempt} {outcome.lower()}: {reason}")
        wait = self.interruption.wait if self.interruption is not None else 0.0
        if wait > 0:
            self.say(f"waiting {wait:g} s for capacity")
            self.signalled.wait(wait)
        attempt = self.timeline.next_attempt()
        self.timeline.enter(attempts.STARTING, f"attempt {attempt}: launching the hosts")
        self.archive_attempt(attempt - 1)
        self.exits, self.stopped_by_us, self.stop_reason, self.kill_at, self.interruption = {}, set(), None, None, None
        self.state["hosts"], self.state["standbys_ready"] = {}, None
        self.backend = self.new_backend()
        self.backend.standbys = standbys
        self.save()
        sync = checkpoints.for_plan(self.plan, stream=self)
        kept = self.kept_states()
        if sync is None:
            self.say(kept or f"warning: attempt {attempt} starts the script from scratch: the job has no checkpoint_s3_uri to restore from")
            return None
        self.timeline.enter(attempts.DOWNLOADING, f"attempt {attempt}: restoring checkpoints from {sync.uri}")
        if sync.restore() == 0:
            self.say(kept or f"warning: attempt {attempt} starts the script from scratch: no checkpoint was synced to {sync.uri} (the script wrote none to its checkpoint directory)")
        return sync

    def kept_states(self) -> str | None:
        """What the ranks kept for checkpointless recovery (collectives/recovery.py), said instead of a
        from-scratch warning; None when they kept nothing."""
        scratch = self.job_dir.path / SCRATCH  # local hosts share it; a container has its own folder in it (<host>/snapshots/<host>)
        kept = sorted(path.parent.name for pattern in ("", "*/") for path in scratch.glob(f"{pattern}{contract.SNAPSHOTS}/*/*.snapshot"))
        if not kept:
            return None
        return f"the ranks of {', '.join(dict.fromkeys(kept))} kept their last completed step: the script's restore() takes it from a peer (recovery without a checkpoint)"

    def archive_attempt(self, attempt: int) -> None:
        """Move what an ended attempt left in each host's tree (failure records, model, output) to
        ``attempt-N/<host>/``, and empty its checkpoint directory: the next attempt starts on fresh hosts."""
        local_path = self.plan.checkpoints.local_path if self.plan.checkpoints else None
        for item in self.plan.hosts:
            opt_ml = OptMl(item.opt_ml)
            kept = self.job_dir.path / f"attempt-{attempt}" / item.host
            kept.mkdir(parents=True, exist_ok=True)
            for path in (opt_ml.model_dir, opt_ml.output_dir):
                if path.exists():
                    shutil.move(str(path), str(kept / path.name))
                path.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(checkpoints.host_dir(item.opt_ml, local_path), ignore_errors=True)

    def check_interruption(self) -> None:
        """A spot interruption asked for (``smddp-launch interrupt``): every host is stopped (SIGTERM, then
        SIGKILL after the grace), as SageMaker stops every container of a job whose capacity was reclaimed."""
        interruption = attempts.take_interrupt(self.job_dir.path) or self.planned_interruption()
        if interruption is None or self.stop_reason is not None:
            return
        self.interruption = interruption
        now = time.time()  # the platform reclaims and says so at once: noticed as it happens
        self.timeline.mark("fault", now)
        self.timeline.mark("detected", now)
        self.event(events.FAULT, kind="interrupted", detail=f"{interruption.what} is reclaimed")
        self.say(f"spot interruption: {interruption.what} is reclaimed; stopping the containers")
        self.stop(JobState.FAILED, f"interrupted: {interruption.what} was reclaimed")

    def planned_interruption(self) -> Interruption | None:
        """``interrupt_after``: the next planned interruption, once its time since the job's start has come."""
        fired = int(self.state.get("planned_interruptions", 0))
        planned = self.plan.spot.interrupt_after if self.plan.spot else ()
        if fired >= len(planned) or time.time() - self.state["started"] < planned[fired]:
            return None
        self.state["planned_interruptions"] = fired + 1
        return Interruption()

    def event(self, name: str, **fields: Any) -> None:
        """A recovery phase in ``<job dir>/events.jsonl`` (docs/resuming.md, "Recovery phases")."""
        events.record(self.job_dir.path / events.FILE_NAME, name, attempt=self.timeline.attempt, **fields)

    def say(self, message: str) -> None:
        """A line of the supervisor's in the job's log (and its own log)."""
        self.copy_output(SUPERVISOR_HOST, f"smddp: {message}".encode())
        print(f"smddp: {message}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        """The checkpoint sync's stream (``stream=self``): its lines go to the job's log."""
        for line in text.splitlines():
            if line.strip():
                self.copy_output(SUPERVISOR_HOST, line.encode())

    def flush(self) -> None:
        pass

    def start_hosts(self) -> None:
        if self.lifeline_fd is None:  # one lifeline for every attempt
            self.lifeline_fd = open_lifeline(self.job_dir.path / LIFELINE)
        attempt_env = {contract.RESTART_COUNT_ENV: str(self.timeline.attempt - 1)}  # TORCHELASTIC_RESTART_COUNT in every rank
        self.update(**(self.backend.prepare(attempt_env) or {}))
        if self.console is None:
            self.console = StampedLog(self.job_dir.console_log)  # closed at the end of run()
        extra = dict(attempt_env)
        if self.plan.backend == "process":  # a container has its lifeline mount in its plan, and a /tmp of its own
            extra |= {contract.LIFELINE_ENV: str(self.job_dir.path / LIFELINE), contract.SCRATCH_ENV: str(self.job_dir.path / SCRATCH)}
        extra[events.ATTEMPT_ENV] = str(self.timeline.attempt)
        self.host_env, self.generation, self.restart_every_host = extra, 0, False
        for host in self.hosts:
            info = self.backend.start(host, extra, self.copy_output)
            self.state["hosts"][host] = {**info, "state": JobState.RUNNING.value, "exit_code": None}
        self.save()

    def copy_output(self, host: str, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        if not text.endswith("\n"):
            text += "\n"
        if not contract.has_console_prefix(text):
            text = contract.console_prefix(host) + text
        with self.console_lock:
            if self.console is not None and not self.console.closed:
                self.console.write(text.encode("utf-8"))

    # --- watching -------------------------------------------------------------------------------

    def watch(self) -> None:
        ran_before = sum(item["ended"] - item["started"] for item in self.state["attempts"])  # max_run: every attempt
        deadline = self.attempt_started + self.plan.max_run - ran_before
        while self.running_hosts():
            self.record_exits()
            if self.stop_reason is None:
                self.check_stop_conditions(deadline)
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                for host in self.running_hosts():
                    self.backend.signal(host, signal.SIGKILL)
            self.tick()
            self.wake.wait(POLL_SECONDS)
        self.record_exits()

    def tick(self) -> None:
        """Called every poll while the job runs; the place for periodic work (heartbeat, checkpoints...)."""
        now = time.monotonic()
        if now - self.last_heartbeat >= HEARTBEAT_SECONDS:
            self.last_heartbeat = now
            (self.job_dir.path / HEARTBEAT).touch()
            self.mark_script_progress()
            self.mark_replacements()
        if self.state.get("standbys_ready") is None and self.backend.standbys_ready():
            self.update(standbys_ready=time.time())  # the next attempt can start warm (docs/resuming.md)
        if stacks.take_request(self.job_dir.path):  # `smddp-launch stacks`: the runtimes pass it to their ranks
            for host in self.running_hosts():
                self.backend.signal(host, contract.STACKS_SIGNAL)
        self.check_interruption()

    def mark_script_progress(self) -> None:
        """When this attempt's process group formed and its first collective came (``specs.goodput``:
        training again), from the hosts' event files, until both are noted."""
        marks = self.state.get("marks", {})
        if events.FIRST_COLLECTIVE in marks:
            return
        texts = []
        for host in self.hosts:  # in docker mode a container wrote these: bounded, links not followed
            raw = read_inside(self.job_dir.host_dir(host), "output/events.jsonl", 1024 * 1024)
            texts.append(raw.decode("utf-8", errors="replace") if raw else "")
        for event in (events.PROCESS_GROUP_FORMED, events.FIRST_COLLECTIVE):
            when = goodput.first_between(goodput.event_times(texts, event), self.attempt_started, None)
            if when is not None and self.timeline.mark(event, when):
                self.save()

    def set_aside_failures(self, host: str) -> None:
        """What the lost host's runtime and ranks wrote of their failure moves to ``replaced-<generation>/<host>/``:
        kept as evidence, never read as the replacement's (the job's verdict reads the host's tree)."""
        opt_ml = OptMl(self.job_dir.host_dir(host))
        kept = self.job_dir.path / f"replaced-{self.generation}" / host
        for path in (opt_ml.output_dir / "failure", opt_ml.failures_file, opt_ml.errors_dir):
            if path.exists() and not path.is_symlink():
                kept.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(kept / path.name))

    def mark_replacements(self) -> None:
        """A host replaced alone: when its group re-formed (the last rank's ``group_reformed`` of that
        generation) and its new ranks trained again (their first ``first_step``), from the hosts' event files."""
        open_items = [item for item in self.state.get("replacements", []) if "training" not in item and item["attempt"] == self.timeline.attempt]
        if not open_items:
            return
        found = {host: self.host_events(host) for host in self.hosts}
        for item in open_items:
            reformed = [e["time"] for items in found.values() for e in items if e["event"] == events.GROUP_REFORMED and e.get("generation") == item["generation"]]
            training = [e["time"] for e in found[item["host"]] if e["event"] == events.FIRST_STEP and e["time"] >= item["detected"]]
            if reformed:
                item["reformed"] = max(reformed)
            if training:
                item["training"] = min(training)
        self.save()

    def host_events(self, host: str) -> list[dict[str, Any]]:
        """A host's events (in docker mode a container wrote them: bounded, links not followed)."""
        raw = read_inside(self.job_dir.host_dir(host), "output/events.jsonl", 1024 * 1024)
        found = []
        for line in (raw or b"").decode("utf-8", errors="replace").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and isinstance(item.get("time"), (int, float)):
                found.append(item)
        return found

    def mark_fault(self) -> None:
        """Before the attempt's entry is closed: its first collective (if not seen yet), the fault that ended it (the
        root cause's time; an interruption marked its own) and its newest checkpoint."""
        self.mark_script_progress()
        failed = any(e.code != 0 for e in self.exits.values()) and self.interruption is None
        verdict = self.verdict() if failed else None
        root = verdict.root if verdict is not None else None
        if root is not None and root.timestamp:
            self.timeline.mark("fault", root.timestamp)
            marks = self.state["marks"]
            marks["detected"] = max(marks.get("detected", root.timestamp), root.timestamp)
        newest = self.sync.newest_written if self.sync is not None else None
        if newest is not None:
            self.timeline.mark("last_checkpoint", newest)

    def check_stop_conditions(self, deadline: float) -> None:
        owner = self.owner_pid
        first_failure = min((e.ended for e in self.exits.values() if e.code != 0), default=None)
        if self.cancel_wanted():
            self.stop(JobState.CANCELLED, "cancelled")
        elif owner and self.owner_gone(owner):
            self.stop(JobState.CANCELLED, f"cancelled: the process that started it (pid {owner}) exited")
        elif self.plan.spot is not None and time.time() > self.state["started"] + self.plan.spot.max_wait:
            self.stop(JobState.FAILED, f"MaxWaitTimeExceeded: the attempts together took longer than max_wait={self.plan.spot.max_wait} seconds")
        elif time.time() > deadline:
            self.hanging = self.still_running()
            self.stop(JobState.FAILED, f"MaxRuntimeExceeded: the job ran longer than max_run={self.plan.max_run} seconds" + hanging.describe(self.hanging))
        elif first_failure is not None and time.time() - first_failure > self.peer_failure_grace:
            self.stop(JobState.FAILED, "")  # the root cause decides the message

    def still_running(self) -> list[FailureRecord]:
        """The ranks still running, with their innermost frames: every rank is asked for its stacks (as
        ``smddp-launch stacks`` does), and only the running ones answer (``hosttree.hanging``)."""
        running = set(self.running_hosts())
        files = {path: who for path, who in stacks.stack_files(self.job_dir.path).items() if who[0] in running}
        before = rank_stacks.sizes(files)
        for host in running:
            self.backend.signal(host, contract.STACKS_SIGNAL)
        answers = rank_stacks.answers(files, before, HANGING_STACKS_TIMEOUT, HANGING_STACKS_SETTLE, every=False)
        return hanging.records(answers, self.plan.max_run)

    def owner_gone(self, owner: int) -> bool:
        """The owner started us: it is gone once we are re-parented (no pid-reuse doubt); otherwise poll it."""
        if self.first_parent == owner:
            return os.getppid() != owner
        return not processes.pid_alive(owner)

    def cancel_wanted(self) -> bool:
        return self.signalled.is_set() or self.job_dir.cancel_requested

    def stop(self, state: JobState, message: str) -> None:
        self.timeline.mark("detected", time.time())  # the hosts are stopped for a reason: it was noticed
        self.stop_reason = (state, message)
        for host in self.running_hosts():
            self.stopped_by_us.add(host)
            self.backend.signal(host, signal.SIGTERM)
        self.kill_at = time.monotonic() + self.plan.grace

    def running_hosts(self) -> list[str]:
        return [host for host in self.state.get("hosts", {}) if host not in self.exits]

    def record_exits(self) -> None:
        changed = False
        for host in self.running_hosts():
            ended = self.backend.poll(host)
            if ended is None:
                continue
            if ended.code != 0 and self.replaced_alone(host, ended):
                changed = True
                continue
            self.exits[host] = ended
            cancelled = self.stop_reason is not None and self.stop_reason[0] is JobState.CANCELLED and host in self.stopped_by_us
            state = JobState.SUCCEEDED if ended.code == 0 else JobState.CANCELLED if cancelled else JobState.FAILED
            self.state["hosts"][host].update(exit_code=ended.code, signal=ended.signal, ended=ended.ended, state=state.value)
            if ended.code != 0 and host not in self.stopped_by_us:  # a host's runtime gave up: the job noticed
                self.timeline.mark("detected", ended.ended, earliest=True)
            if ended.code != 0 and self.stop_reason is None and not any(e.code != 0 for h, e in self.exits.items() if h != host):
                self.event(events.FAULT, kind="host_failed", detail=f"{host} exited with code {ended.code}" + (f" ({ended.signal})" if ended.signal else ""))
            changed = True
        if self.restart_every_host and self.stop_reason is None:
            self.stop(JobState.FAILED, "")  # the root cause decides the message, as after any fault
        if changed:
            self.save()

    def replaced_alone(self, host: str, ended: HostExit) -> bool:
        """A lost host of a job that survives one (``survive_host_loss``): started again alone, warm from its
        standby where there is one, its ranks joining the next generation of the group the others re-form.
        False when it is not to be (``survivors.why_not_replace``, said once): every host restarts then."""
        wanted = self.plan.process is not None and self.plan.process.environment.get(contract.SURVIVORS_ENV) == "1"
        if not wanted or self.stop_reason is not None or host in self.stopped_by_us:
            return False
        failed = [name for name, other in self.exits.items() if other.code != 0]
        self.mark_replacements()
        rejoining = [item["host"] for item in self.state.get("replacements", []) if item["attempt"] == self.timeline.attempt and "training" not in item]
        why = survivors.why_not_replace(host, self.hosts, failed=failed, retries_left=self.retries_left, rejoining=rejoining)
        how = f"exited with code {ended.code}" + (f" ({ended.signal})" if ended.signal else "")
        if why:
            self.say(f"{host} was lost ({how}); every host restarts: {why}")
            self.restart_every_host = True  # record_exits stops the others once this exit is recorded
            return False
        self.retries_left -= 1  # a replacement is a retry of one host
        self.generation += 1
        self.state["retries_left"] = self.retries_left
        self.event(events.PEER_LOST, host=host, detail=how, generation=self.generation)
        self.state.setdefault("replacements", []).append(
            {"attempt": self.timeline.attempt, "host": host, "generation": self.generation, "fault": ended.ended, "detected": time.time()})
        self.say(f"{host} was lost ({how}); replacing it alone while the other hosts train on (group generation {self.generation})")
        self.set_aside_failures(host)
        self.backend.forget(host)
        try:
            info = self.backend.start(host, {**self.host_env, contract.GROUP_GENERATION_ENV: str(self.generation)}, self.copy_output)
        except Exception as exc:  # noqa: BLE001 - the host cannot start again: the whole restart, with the reason
            self.say(f"{host} could not be started again ({exc}); every host restarts")
            self.restart_every_host = True
            return False
        self.state["hosts"][host] = {**info, "state": JobState.RUNNING.value, "exit_code": None, "replaced": self.generation}
        if self.retries_left > 0:
            self.backend.start_standbys()  # the next one's
        return True

    # --- the outcome ----------------------------------------------------------------------------

    def conclude(self) -> int:
        if self.stop_reason is not None and self.stop_reason[0] is JobState.CANCELLED:
            problem = self.collect()  # SageMaker uploads what a stopped job wrote, too
            self.backend.release()
            return self.finish(JobState.CANCELLED, self.stop_reason[1] + (f"; also {problem}" if problem else ""))
        verdict = self.verdict()
        failed = any(e.code != 0 for e in self.exits.values()) or (self.stop_reason is not None)
        self.before_collect(verdict)
        self.timeline.enter(attempts.UPLOADING, "collecting the artifacts")
        problem = self.collect()
        self.backend.release()
        if self.stop_reason is not None and self.stop_reason[1]:  # max_run (the ranks left running), a start failure
            named = Verdict(self.hanging[0], tuple(self.hanging[1:])) if self.hanging else None
            if named:
                self.note(named)
            return self.finish(self.stop_reason[0], self.stop_reason[1], named)
        if failed:
            message = verdict.root.summary() if verdict else "a host failed"
            return self.finish(JobState.FAILED, message + (f"; also {problem}" if problem else ""), verdict)
        if problem:
            return self.finish(JobState.FAILED, problem)
        if not self.plan.keep_job_dir:
            for path in [self.job_dir.code_dir, *map(self.job_dir.host_dir, self.hosts)]:  # what keep_job_dir=False drops
                shutil.rmtree(path, ignore_errors=True)
        return self.finish(JobState.SUCCEEDED, "")

    def before_collect(self, verdict: Verdict | None) -> None:
        """The last step before artifacts are collected (e.g. keep a checkpoint, add a record)."""

    def collect(self) -> str:
        """Artifacts are collected whether the job succeeded or failed, as SageMaker uploads both.
        Returns "" or what went wrong (which fails the job: a job without its model is no success)."""
        changes, problem = collect_job_artifacts(self.job_dir, self.plan)
        self.update(**changes)
        return problem

    def verdict(self) -> Verdict | None:
        records, early = self.records()
        verdict = decide(records, early_exits=early)
        if verdict is not None:
            self.note(verdict)
        return verdict

    def note(self, verdict: Verdict) -> None:
        """What ``status`` and the failure summary show beside the root cause."""
        self.state["other_failures"] = [other.to_json() for other in verdict.others]
        self.state["error_file"] = verdict.root.error_file or None
        if verdict.root.rank is not None:
            self.state["rank_log"] = str(OptMl(self.job_dir.host_dir(verdict.root.host)).rank_log_file(verdict.root.rank))

    def records(self) -> tuple[list[FailureRecord], list[FailureRecord]]:
        """Every failure record of the job: what each runtime wrote, rank error files no runtime
        reported (its runtime was killed), and what this supervisor saw of the hosts themselves."""
        records: dict[tuple[Any, ...], FailureRecord] = {}
        early: list[FailureRecord] = []
        for host in self.hosts:
            opt_ml = OptMl(self.job_dir.host_dir(host))
            written = contract.read_failure_records(opt_ml)
            for record in [FailureRecord.from_json(item) for item in written or []] + self.error_files(host, opt_ml):
                if record.source == SOURCE_EARLY_EXIT:
                    early.append(record)
                else:
                    records.setdefault((record.host, record.rank, record.error_type, record.message), record)
            own = self.host_record(host, wrote_records=written is not None, wrote_failure=contract.read_failure(opt_ml) is not None)
            if own is not None:
                records.setdefault((own.host, own.rank, own.error_type, own.message), own)
        return list(records.values()), early

    def error_files(self, host: str, opt_ml: OptMl) -> list[FailureRecord]:
        found = []
        for path in sorted(opt_ml.errors_dir.glob("*.json")):
            # Not following links, bounded: in docker mode a container wrote these.
            raw = read_inside(opt_ml.base, path.relative_to(opt_ml.base).as_posix(), 16 * 1024 * 1024)
            try:
                data = json.loads(raw) if raw is not None else None
            except (ValueError, RecursionError):
                continue
            if isinstance(data, dict):
                found.append(from_error_file(data, host=host, path=str(path)))
        return found

    def host_record(self, host: str, *, wrote_records: bool, wrote_failure: bool) -> FailureRecord | None:
        """What the supervisor itself knows of a host that ended badly."""
        ended = self.exits.get(host)
        if ended is None or ended.code == 0:
            return None
        if host in self.stopped_by_us:
            return FailureRecord(host, None, ended.code, "stopped by the supervisor", timestamp=ended.ended, source=SOURCE_STOPPED)
        if ended.signal is not None and not wrote_records:
            message = f"the runtime was killed by {ended.signal}" + (f"; {ended.detail}" if ended.detail else "")
            return FailureRecord(host, None, ended.code, message, timestamp=ended.ended, error_type="Signal", source=SOURCE_SUPERVISOR, signal=ended.signal)
        if not wrote_records and not wrote_failure:
            message = f"the runtime exited with code {ended.code} without a failure record" + (f"; {ended.detail}" if ended.detail else "")
            return FailureRecord(host, None, ended.code, message, timestamp=ended.ended, error_type="ExitCode", source=SOURCE_SUPERVISOR)
        return None

    def finish(self, state: JobState, message: str, verdict: Verdict | None = None) -> int:
        failure = verdict.root.to_json() if verdict is not None and state is JobState.FAILED else None
        for name in (LIFELINE, HEARTBEAT):  # they mean something only while the job runs
            (self.job_dir.path / name).unlink(missing_ok=True)
        self.end_timeline(state, message)
        self.update(state=state.value, message=message or self.state.get("message", ""), failure=failure, ended=time.time())
        return 0

    def end_timeline(self, state: JobState, message: str) -> None:
        """The last transition (SageMaker's final secondary status), the last attempt, and a spot job's billing lines."""
        if "transitions" not in self.state:
            return  # the supervisor failed before the job began
        final = {JobState.SUCCEEDED: attempts.COMPLETED, JobState.CANCELLED: attempts.STOPPED}.get(state, attempts.FAILED)
        final = next((limit for limit in attempts.LIMITS_EXCEEDED if message.startswith(limit)), final)
        try:
            self.mark_fault() if state is JobState.FAILED else self.mark_script_progress()
            self.mark_replacements()
        except Exception as exc:  # noqa: BLE001 - the marks never keep the job's end from being recorded
            self.say(f"warning: the last attempt's goodput marks were not recorded: {exc}")
        self.timeline.end_attempt(final, message, self.attempt_started)
        self.timeline.enter(final, message)
        self.timeline.close()
        if self.plan.spot is None:
            return  # nothing is billed here; a spot rehearsal shows what SageMaker would bill and save (status keeps the seconds)
        for line in billing_lines(self.state["training_seconds"], self.state["billable_seconds"], instances=len(self.hosts), spot=True):
            self.say(line)

    def update(self, **changes: Any) -> None:
        self.state.update(changes)
        self.save()

    def save(self) -> None:
        self.job_dir.write_state(self.state)


def collect_job_artifacts(job_dir: JobDir, plan: HostTreePlan) -> tuple[dict[str, Any], str]:
    """Every host's model and output into the job's archives; returns the state's new entries and ""
    or what went wrong. Run by the supervisor as the job ends, or by whoever finds the job without one
    (its supervisor was killed: ``HostTreeScheduler._sweep``), once the hosts are gone."""
    target = plan.artifacts.model_data.parent
    if not plan.artifacts.model_data.is_absolute():  # a damaged record (planners write absolute paths): not into the cwd
        return {}, f"ArtifactCollectionFailed: the job's record names no place for its archives (model_data {str(plan.artifacts.model_data)!r})"
    trees = [OptMl(job_dir.host_dir(item.host)) for item in plan.hosts]
    skipped: list[str] = []
    try:
        model, output = collect_artifacts(trees, target, on_skip=skipped.append)
    except (OSError, ValueError) as exc:
        return {}, f"ArtifactCollectionFailed: could not collect the artifacts into {target}: {exc}"
    if skipped:  # in the console log (closed by now: appended) and the job's status, never silent
        with open(job_dir.console_log, "a", encoding="utf-8") as console:
            console.writelines(f"smddp: warning: left out of {line}\n" for line in skipped)
    return {"model_data": str(model), "output_data": str(output), "archive_skipped": skipped}, ""


def open_lifeline(path: Path) -> int:
    """Make the FIFO and hold it open (read-write, so opening never blocks); runtimes read EOF once we die."""
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m smddp_sdk.schedulers.hosttree.supervisor <job_dir>", file=sys.stderr)
        return 2
    os.umask(0o077)  # job files, logs and host trees are the caller's alone
    supervisor = Supervisor(JobDir(Path(argv[0])))
    try:
        return supervisor.run()
    except BaseException as exc:  # noqa: BLE001 - whatever stops the supervisor must end up in state.json
        for host in supervisor.running_hosts():
            supervisor.backend.signal(host, signal.SIGKILL)
        supervisor.backend.drop_standbys()
        supervisor.backend.release()
        supervisor.finish(JobState.FAILED, f"the job's supervisor crashed: {type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
