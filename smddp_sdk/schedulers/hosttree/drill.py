"""A fault drill on a user's own job (``smddp-launch drill``): interruptions of chosen kinds at chosen or
seeded random times, N rounds, then a report of each recovery, the goodput, the planner's prediction for the
same figures, and whether the final parameters equal a straight run's.

The faults (local and docker jobs, whose supervisor restarts them):

- ``host``: a host's runtime is SIGKILLed (its container, in docker mode): a lost host, retried under
  ``max_retry_attempts``;
- ``rank``: one rank's process is SIGKILLed (local jobs): retried only with ``retry_script_errors``, which
  the drill sets, as a rank's death is the script's failure on SageMaker;
- ``spot``: the host's instance is reclaimed (``smddp-launch interrupt``): the drill runs the job as a spot job.

Round i waits until attempt i trains (its first collective, ``specs.goodput``), lets it train the round's
delay, injects the fault and waits for attempt i+1. The delays are given (``at``) or drawn from a range with
a seed (``between``), so a drill can be repeated exactly.

Each run checkpoints under a location of its own, ``<checkpoint_s3_uri>/<its job name>``, so that no run
resumes from an earlier one's checkpoints. Equal parameters: the straight run (the same job without faults,
``compare``) and the drilled one leave model archives whose files are compared by SHA-256, member by member.

The prediction: the planner's ``FailureModel`` (``planning.failures``) with the drill's own figures: its
failure rate (rounds per instance-hour of the span from the first collective to the end), its median
recovery, the checkpoint interval measured from the times of the checkpoint files (the median gap between
them; they keep their times, ``stores``) and ``checkpoint_s``; compared with the goodput measured over the
same span (the first start, which the model leaves out, not counted).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import statistics
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SmddpError, SpecError, SpecIssue
from smddp_sdk.planning.failures import FailureModel
from smddp_sdk.schedulers import stores
from smddp_sdk.schedulers.hosttree import docker_cli
from smddp_sdk.schedulers.hosttree.attempts import Interruption
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.specs.events import FIRST_COLLECTIVE
from smddp_sdk.specs.goodput import Goodput, Recovery, seconds
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus

KINDS = ("host", "rank", "spot")
POLL = 0.2


@dataclass(frozen=True)
class Fault:
    round: int
    kind: str
    after: float  # seconds the attempt trains before the fault
    host: str
    rank: int | None = None  # the rank killed (``rank`` faults)


def plan_faults(kinds: Sequence[str], rounds: int, hosts: Sequence[str], *, at: Sequence[float] = (), between: tuple[float, float] | None = None,
                seed: int = 0, host: str | None = None, rank: int | None = None) -> list[Fault]:
    """The drill's faults: kinds in turn, each after ``at[i]`` (the last one repeats) or a delay drawn from
    ``between`` with ``seed``; on ``host`` (default the last host). Pure."""
    problems = [SpecIssue("kind", f"{kind!r} is not a fault kind", f"one of {', '.join(KINDS)}") for kind in kinds if kind not in KINDS]
    if not kinds:
        problems.append(SpecIssue("kind", "no fault kind given", f"one of {', '.join(KINDS)}"))
    if rounds < 1:
        problems.append(SpecIssue("rounds", f"must be at least 1, got {rounds}"))
    if host is not None and host not in hosts:
        problems.append(SpecIssue("host", f"the job has no host {host!r}", f"one of {', '.join(hosts)}"))
    if any(delay < 0 for delay in at) or (between is not None and not 0 <= between[0] <= between[1]):
        problems.append(SpecIssue("at", "delays are seconds >= 0, a range LOW-HIGH with LOW <= HIGH"))
    if problems:
        raise SpecError(problems)
    draw = random.Random(seed)
    delays = [at[min(index, len(at) - 1)] if at else draw.uniform(*(between or (5.0, 20.0))) for index in range(rounds)]
    victim = host or hosts[-1]
    return [Fault(index + 1, kinds[index % len(kinds)], round(delays[index], 3), victim, rank if kinds[index % len(kinds)] == "rank" else None)
            for index in range(rounds)]


def drilled_spec(spec: JobSpec, faults: Sequence[Fault], job_name: str) -> JobSpec:
    """``spec`` as the drill runs it: its own name and checkpoint location, retries for the hosts and ranks
    killed, spot capacity for the interruptions."""
    kills = sum(1 for fault in faults if fault.kind in ("host", "rank"))
    changes: dict[str, Any] = {"job_name": job_name, "checkpoint_s3_uri": own_location(spec.checkpoint_s3_uri, job_name)}
    if kills:
        changes["max_retry_attempts"] = max(spec.max_retry_attempts or 0, kills)
    if any(fault.kind == "spot" for fault in faults):
        changes.update(use_spot_instances=True, max_wait=max(spec.max_wait or 0, spec.max_run))
    return spec.replace(**changes)


def straight_spec(spec: JobSpec, job_name: str) -> JobSpec:
    return spec.replace(job_name=job_name, checkpoint_s3_uri=own_location(spec.checkpoint_s3_uri, job_name))


def own_location(uri: str | None, job_name: str) -> str | None:
    return f"{uri.rstrip('/')}/{job_name}" if uri else None


@dataclass(frozen=True)
class Injected:
    fault: Fault
    at: float  # when it was injected
    attempt: int


@dataclass
class DrillReport:
    handle: JobHandle
    status: JobStatus | None = None
    injected: list[Injected] = field(default_factory=list)
    checkpoint_interval: float | None = None
    measured_goodput: float | None = None  # from the first collective to the end
    predicted_goodput: float | None = None
    model: FailureModel | None = None
    straight: JobStatus | None = None
    differences: list[str] | None = None  # None: not compared
    problems: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool | None:
        return None if self.differences is None else not self.differences

    @property
    def ok(self) -> bool:
        succeeded = self.status is not None and self.status.state is JobState.SUCCEEDED
        return succeeded and not self.problems and self.equal is not False

    def to_json(self, status: dict[str, Any] | None) -> dict[str, Any]:
        """The report as JSON, with the drilled job's ``status`` in the form ``status --json`` prints."""
        return {
            "handle": str(self.handle), "ok": self.ok, "problems": self.problems,
            "faults": [{**asdict(item.fault), "injected": item.at, "attempt": item.attempt} for item in self.injected],
            "status": status,
            "checkpoint_interval": self.checkpoint_interval, "measured_goodput": self.measured_goodput,
            "predicted_goodput": self.predicted_goodput, "model": asdict(self.model) if self.model else None,
            "straight": str(self.straight.handle) if self.straight else None, "equal": self.equal, "differences": self.differences,
        }


class Drill:
    """Runs the drill of one job on a host-tree scheduler (``capabilities.interrupt``)."""

    def __init__(self, scheduler: Any, submit: Callable[[JobSpec], JobHandle], say: Callable[[str], None], *, timeout: float) -> None:
        self.scheduler = scheduler
        self.submit = submit  # starts a job and remembers its name (the CLI's: `status NAME` finds it)
        self.say = say
        self.timeout = timeout

    def run(self, spec: JobSpec, faults: Sequence[Fault], *, checkpoint_s: float = 0.0, checkpoint_interval: float | None = None) -> DrillReport:
        handle = self.submit(spec)
        report = DrillReport(handle)
        self.say(f"drilling {handle}: {len(faults)} round(s): " + ", ".join(f"{f.kind} after {f.after:g} s" for f in faults))
        job_dir = JobDir(self.scheduler.job_path(handle))
        try:
            for fault in faults:
                problem = self.round(handle, job_dir, fault, report)
                if problem:
                    report.problems.append(problem)
                    break
            report.status = self.wait_end(handle)
        except BaseException:
            self.scheduler.cancel(handle)  # a drill stopped half-way leaves no job running
            raise
        report.checkpoint_interval = checkpoint_interval or measured_interval(spec.checkpoint_s3_uri)
        predict(report, spec.instance_count, checkpoint_s)
        return report

    def round(self, handle: JobHandle, job_dir: JobDir, fault: Fault, report: DrillReport) -> str:
        """Inject ``fault`` once its attempt trained its delay; "" or why the round could not run."""
        first = self.wait(handle, lambda: self.training(job_dir, fault.round),
                          f"attempt {fault.round} to train (its first collective: a script whose process group is not smddp's notes none)")
        if first is None:
            return f"round {fault.round}: the job ended before attempt {fault.round} trained: {self.scheduler.status(handle).message}"
        time.sleep(max(0.0, first + fault.after - time.time()))
        state = job_dir.read_state()
        if state.get("attempt") != fault.round or state.get("state") != JobState.RUNNING.value:
            return f"round {fault.round}: the job was no longer in attempt {fault.round} after {fault.after:g} s of training (it ended first: use shorter delays)"
        self.inject(handle, job_dir, fault, state)
        report.injected.append(Injected(fault, time.time(), fault.round))
        self.say(f"round {fault.round}: {fault.kind} fault on {fault.host}" + (f" rank {fault.rank}" if fault.rank is not None else "") + f" after {fault.after:g} s of training")
        moved = self.wait(handle, lambda: (job_dir.read_state().get("attempt", 1) > fault.round) or None, f"attempt {fault.round + 1} to start")
        return "" if moved else f"round {fault.round}: the job ended instead of restarting: {self.scheduler.status(handle).message}"

    def training(self, job_dir: JobDir, attempt: int) -> float | None:
        state = job_dir.read_state()
        if state.get("attempt") == attempt:
            first = (state.get("marks") or {}).get(FIRST_COLLECTIVE)
            if isinstance(first, (int, float)):
                return float(first)
        return None

    def inject(self, handle: JobHandle, job_dir: JobDir, fault: Fault, state: dict[str, Any]) -> None:
        host = (state.get("hosts") or {}).get(fault.host) or {}
        if fault.kind == "spot":
            self.scheduler.interrupt(handle, Interruption(fault.host))
        elif fault.kind == "host" and "container" in host:
            docker_cli.run(job_dir.plan.docker_cli, "kill", "-s", "KILL", host["container"], check=False, timeout=60)
        elif fault.kind == "host":
            os.kill(int(host["pid"]), signal.SIGKILL)
        else:
            os.kill(rank_pid(int(host["pid"]), fault.host, fault.rank), signal.SIGKILL)

    def wait(self, handle: JobHandle, condition: Callable[[], Any], what: str) -> Any:
        """``condition()``'s first true value; None once ``handle``'s job ended without it."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            if self.scheduler.status(handle).state.is_terminal:
                return condition() or None  # it may have turned true as the job ended
            time.sleep(POLL)
        raise SmddpError(f"the drill waited {self.timeout:g} s (--timeout) for {what}; the job is cancelled")

    def wait_end(self, handle: JobHandle) -> JobStatus:
        deadline = time.monotonic() + self.timeout
        while not (status := self.scheduler.status(handle)).state.is_terminal:
            if time.monotonic() > deadline:
                raise SmddpError(f"the drill waited {self.timeout:g} s (--timeout) for {handle} to end; the job is cancelled")
            time.sleep(POLL)
        return status


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: each process's parent)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) if entry.name.isdigit() else None
        except (OSError, IndexError, ValueError):
            continue
        if parent is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def rank_pid(runtime: int, host: str, rank: int | None) -> int:
    """The process of ``rank`` (the host's last rank when None) below a local host's runtime, by its RANK."""
    found: dict[int, int] = {}
    for pid in sorted(descendants(runtime)):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        values = dict(item.split(b"=", 1) for item in environ.split(b"\0") if b"=" in item)
        if values.get(b"RANK", b"").isdigit():
            found.setdefault(int(values[b"RANK"]), pid)  # the lowest pid: the rank, not a child it started
    if not found or (rank is not None and rank not in found):
        raise SpecError(SpecIssue("rank", f"no running rank {rank if rank is not None else ''} found on {host}",
                                  f"its ranks: {sorted(found) or 'none (rank faults are drilled on local jobs)'}"))
    return found[rank if rank is not None else max(found)]


def checkpoint_times(uri: str) -> list[float]:
    """The modification times of the files at a checkpoint location (S3 objects: from their metadata)."""
    store = stores.open_store(uri)
    times = []
    for entry in store.entries():
        if isinstance(store, stores.FileStore):
            times.append(store.path_of(entry.key).stat().st_mtime)
        else:
            head = store.client.head_object(Bucket=store.bucket, Key=store.folder + entry.key)  # type: ignore[attr-defined]
            mtime = (head.get("Metadata") or {}).get("mtime")
            if mtime:
                times.append(float(mtime))
    return sorted(times)


def measured_interval(uri: str | None) -> float | None:
    """The median gap between the checkpoint files' times (None: fewer than two checkpoints)."""
    times = checkpoint_times(uri) if uri else []
    gaps = [later - earlier for earlier, later in zip(times, times[1:]) if later > earlier]
    return statistics.median(gaps) if gaps else None


def predict(report: DrillReport, instances: int, checkpoint_s: float) -> None:
    """The measured goodput from the first collective to the end, and the planner's for the drill's figures."""
    goodput: Goodput | None = report.status.goodput if report.status else None
    if goodput is None or report.status is None or report.status.ended is None or not goodput.recoveries:
        return
    first = first_training(report)
    if first is None or goodput.productive is None:
        return
    span = report.status.ended - first
    recoveries = [item.total for item in goodput.recoveries if item.total is not None]
    if span <= 0 or not recoveries or report.checkpoint_interval is None:
        return
    report.measured_goodput = goodput.productive / span
    rate = len(goodput.recoveries) / (span / 3600 * instances)
    report.model = FailureModel(rate, report.checkpoint_interval, checkpoint_s, statistics.median(recoveries))
    report.predicted_goodput = report.model.goodput(instances)


def first_training(report: DrillReport) -> float | None:
    """The first attempt's first collective, from the job's state."""
    if report.status is None or report.status.job_dir is None:
        return None
    attempts = JobDir(Path(report.status.job_dir)).read_state().get("attempts") or []
    first = attempts[0].get(FIRST_COLLECTIVE) if attempts else None
    return float(first) if isinstance(first, (int, float)) else None


def model_files(archive: str | None) -> dict[str, str]:
    """SHA-256 of every regular file in a model archive, by name."""
    if not archive or not Path(archive).is_file():
        return {}
    digests = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                digests[member.name] = hashlib.sha256(handle.read() if handle else b"").hexdigest()
    return digests


def differences(drilled: str | None, straight: str | None) -> list[str]:
    """What differs between two model archives: files that only one has, or whose bytes differ."""
    mine, theirs = model_files(drilled), model_files(straight)
    if not mine and not theirs:
        return ["neither run left a model archive with files in it"]
    return [f"{name}: {'only in the drilled run' if name not in theirs else 'only in the straight run' if name not in mine else 'differs'}"
            for name in sorted(mine.keys() | theirs.keys()) if mine.get(name) != theirs.get(name)]


def render(report: DrillReport) -> list[str]:
    """The drill's report, one line each."""
    status = report.status
    lines = [f"drill of {report.handle}: {status.state.value if status else 'did not end'}" + (f" ({status.message})" if status and status.message else "")]
    for item in report.injected:
        lines.append(f"  round {item.fault.round}: {item.fault.kind} fault on {item.fault.host}" + (f" rank {item.fault.rank}" if item.fault.rank is not None else "")
                     + f" after {item.fault.after:g} s of training")
    recoveries: tuple[Recovery, ...] = status.goodput.recoveries if status and status.goodput else ()
    for recovery in recoveries:
        phases = ", ".join(f"{name.replace('_', ' ')} {seconds(value)}" for name, value in recovery.phases().items())
        lines.append(f"  recovery {recovery.attempt}: {seconds(recovery.total)} to training again ({phases}); work redone {seconds(recovery.redone)}")
    if status and status.goodput and status.goodput.ratio is not None:
        lines.append(f"  goodput {status.goodput.ratio:.1%} of the whole job ({seconds(status.goodput.productive)} productive of {seconds(status.goodput.wall)})")
    if report.measured_goodput is not None and report.predicted_goodput is not None and report.model is not None:
        model = report.model
        lines.append(f"  from the first collective on: goodput {report.measured_goodput:.1%} measured, {report.predicted_goodput:.1%} predicted by the planner "
                     f"(failure rate {model.failure_rate:.3g}/instance-hour, recovery {model.recovery_s:.1f} s, checkpoint every {model.checkpoint_interval_s:.1f} s, "
                     f"each {model.checkpoint_s:g} s)")
    if report.equal is not None:
        against = f" ({report.straight.handle})" if report.straight else ""
        lines.append(f"  final parameters equal a straight run's{against}: {'yes' if report.equal else 'NO'}")
        lines += [f"    {line}" for line in report.differences or ()]
    lines += [f"  problem: {problem}" for problem in report.problems]
    return lines
