"""Docker mode: one container per host (``algo-1..N``) on a per-job bridge network, as SageMaker runs them.

Every host gets its own ``/opt/ml`` tree in the job directory, bind-mounted into its container, and the
image's ``train`` command (the node runtime) does the rest, exactly as on SageMaker. Containers and the
network carry labels (``ai.smddp.job=<job>``), so status, logs, cancel and cleanup find them from any
process. The docker CLI is driven through subprocess: no compose, no Docker SDK.

Lifecycle: ``schedule`` creates the network and the containers and starts them; ``wait`` follows the job
to its end, stops the remaining hosts when one fails, saves each container's log and result into the job
directory, then removes the containers and the network (``keep_containers=True`` keeps them).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import smddp_sdk
from smddp_sdk.errors import SpecIssue, UnavailableError
from smddp_sdk.schedulers import jobdir
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs import contract, instance_types
from smddp_sdk.specs.job import JobSpec, make_job_name
from smddp_sdk.specs.status import Failure, HostStatus, JobHandle, JobState, JobStatus, LogLine

LABEL_JOB = "ai.smddp.job"
LABEL_HOST = "ai.smddp.host"
LABEL_JOB_DIR = "ai.smddp.job-dir"
DEFAULT_IMAGE = f"smddp-sdk:{smddp_sdk.__version__}"
BUILD_COMMAND = "scripts/build-image.sh (in a smddp-sdk checkout)"
ENGINE_HINT = (
    "start Docker (sudo systemctl start docker), or as root in a smddp-sdk checkout: "
    'eval "$(scripts/docker-engine.sh start)"; point DOCKER_HOST at a running engine otherwise'
)
GPU_CHOICES = ("auto", "all", "none")
TAIL_LINES = 20  # a dead container's last lines shown in the failure summary
RESULT_FILE = "result.json"  # what `wait` saves once the containers are gone
_ROOT_CAUSE = re.compile(
    r"^Root cause: (?:rank (?P<rank>\d+) on host|the runtime on host) (?P<host>\S+) failed with exit code (?P<code>-?\d+)", re.M
)
_PREFIX = re.compile(r"^\[(?P<host>[^\]/]+)/rank(?P<rank>\d+)\]:\s?(?P<text>.*)$")


@dataclass(frozen=True)
class ContainerPlan:
    """One host's container: its name, labels and the exact ``docker create`` argv."""

    host: str
    name: str
    opt_ml: str
    argv: tuple[str, ...]


class DockerScheduler(Scheduler):
    """Runs a job as N containers of the smddp-sdk image (or ``image_uri``) on this machine's engine."""

    name = "docker"

    def __init__(
        self,
        *,
        image: str | None = None,
        keep_containers: bool = False,
        shm_size: str = "2g",
        gpus: str = "auto",
        jobs_dir: str | os.PathLike[str] | None = None,
        user: str | None = None,
        stop_grace: int = 30,
        docker: str = "docker",
    ) -> None:
        """
        image: default image when the spec has no ``image_uri`` (``smddp-sdk:<version>``).
        keep_containers: leave containers and network after the job, for debugging.
        shm_size: ``--shm-size`` of every container; the shared-memory transport lives in /dev/shm.
        gpus: "auto" passes the GPUs when the instance type has them and the engine can; "all" requires
            them; "none" never passes them (GPU instance types are then rehearsed on CPU).
        user: ``uid:gid`` the containers run as; default the calling user, so outputs are theirs.
        stop_grace: seconds the other hosts get to stop after one fails, and on cancel.
        """
        if gpus not in GPU_CHOICES:
            raise UnavailableError(f"docker scheduler: gpus={gpus!r} is not one of {', '.join(GPU_CHOICES)}")
        self.image = image
        self.keep_containers = keep_containers
        self.shm_size = shm_size
        self.gpus = gpus
        self.jobs_dir = Path(jobs_dir) if jobs_dir else jobdir.default_jobs_dir()
        self.user = user or f"{os.getuid()}:{os.getgid()}"
        self.stop_grace = stop_grace
        self.docker = docker

    # --- planning (pure) ------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        issues = [
            SpecIssue(f"inputs.{name}", "the docker scheduler reads local data only", "download it and pass a local path or file:// URI, or run on SageMaker")
            for name, channel in spec.inputs.items()
            if channel.is_s3
        ]
        if spec.source_dir and spec.source_dir.startswith("s3://"):
            issues.append(SpecIssue("source_dir", "the docker scheduler needs local code", "pass a local directory"))
        return issues

    def dryrun(self, spec: JobSpec) -> DryRun:
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        job_dir = self.jobs_dir / job_name
        hosts = jobdir.host_names(spec.instance_count)
        image = spec.image_uri or self.image or DEFAULT_IMAGE
        gpu_flag, notes = self._gpu_plan(spec)
        network = f"smddp-{job_name}"
        containers = [
            self._container_plan(spec, job_name, job_dir, host, image, network, gpu_flag) for host in hosts
        ]
        request = {
            "job_dir": str(job_dir),
            "image": image,
            "network": ["network", "create", "--driver", "bridge", "--label", f"{LABEL_JOB}={job_name}", network],
            "containers": [{"host": c.host, "name": c.name, "opt_ml": c.opt_ml, "argv": list(c.argv)} for c in containers],
            "hyperparameters": jobdir.hyperparameters(spec, job_name),
        }
        return DryRun(self.name, spec, job_name, request, tuple(notes))

    def _gpu_plan(self, spec: JobSpec) -> tuple[str | None, list[str]]:
        """``--gpus`` value (or None) and notes; whether the engine can is checked at schedule time."""
        entry = spec.instance
        wants = spec.instance_type == "local_gpu" or (entry is not None and entry.gpus > 0)
        if self.gpus == "none" or (not wants and self.gpus == "auto"):
            notes = []
            if wants:
                notes.append(f"gpus=none: {spec.instance_type} rehearsed on CPU with {_rehearsal_gpus(spec)} ranks per host")
            return None, notes
        return "all", ["GPUs passed with --gpus all (the engine must have the NVIDIA Container Toolkit)"]

    def _container_plan(
        self, spec: JobSpec, job_name: str, job_dir: Path, host: str, image: str, network: str, gpu_flag: str | None
    ) -> ContainerPlan:
        opt_ml = jobdir.host_dir(job_dir, host)
        name = f"{job_name}-{host}"
        argv: list[str] = [
            "create", "--name", name, "--hostname", host,
            "--network", network, "--network-alias", host,
            "--label", f"{LABEL_JOB}={job_name}", "--label", f"{LABEL_HOST}={host}",
            "--label", f"{LABEL_JOB_DIR}={job_dir}",
            "--shm-size", self.shm_size,
            "--user", self.user,
            # SageMaker stops a container with SIGTERM and kills it 120 s later; the runtime forwards it.
            "--stop-timeout", str(self.stop_grace),
            "-v", f"{opt_ml}:/opt/ml",
        ]
        for channel_name, channel in sorted(spec.inputs.items()):
            if channel.local_path is not None:
                argv += ["-v", f"{channel.local_path}:/opt/ml/input/data/{channel_name}:ro"]
        if gpu_flag:
            argv += ["--gpus", gpu_flag]
        for key, value in self._environment(spec, job_name, gpu_flag).items():
            argv += ["-e", f"{key}={value}"]
        argv += [image, "train"]
        return ContainerPlan(host, name, str(opt_ml), tuple(argv))

    def _environment(self, spec: JobSpec, job_name: str, gpu_flag: str | None) -> dict[str, str]:
        env = {"TRAINING_JOB_NAME": job_name}
        if not self.user.startswith("0:"):
            env["HOME"] = "/tmp"  # the calling user has no home in the image
        if gpu_flag is None and _rehearsal_gpus(spec) > 1:
            # No GPUs in the container: plan the instance type's ranks anyway (CPU rehearsal).
            env[contract.NUM_GPUS_ENV] = str(_rehearsal_gpus(spec))
        env.update(spec.environment)  # the user's settings win
        return env

    # --- running --------------------------------------------------------------------------------

    def schedule(self, dryrun: DryRun) -> JobHandle:
        request = dryrun.request
        self._check_engine()
        self._check_image(request["image"])
        if any("--gpus" in c["argv"] for c in request["containers"]):
            self._check_gpu_support(dryrun.spec)
        job_dir = Path(request["job_dir"])
        jobdir.write_job_tree(dryrun.spec, dryrun.job_name, job_dir, request["hyperparameters"])
        self._docker(*request["network"])
        try:
            for container in request["containers"]:
                self._docker(*container["argv"])
            self._docker("start", *(c["name"] for c in request["containers"]))
        except BaseException:
            self._remove(dryrun.job_name)
            raise
        return JobHandle(self.name, dryrun.job_name)

    def status(self, handle: JobHandle) -> JobStatus:
        containers = self._inspect(handle.job_id)
        if not containers:
            return self._saved_status(handle)
        hosts = tuple(_host_status(c) for c in containers)
        state = _job_state(hosts)
        failure = self._failure(containers) if state is JobState.FAILED else None
        details = {"containers": [c["Name"].lstrip("/") for c in containers], "job_dir": _job_dir_of(containers)}
        return JobStatus(handle, state, _message(state, hosts), failure, hosts, self._model_data(handle, state), details)

    def logs(
        self,
        handle: JobHandle,
        *,
        hosts: Sequence[str] | None = None,
        ranks: Sequence[int] | None = None,
        follow: bool = False,
    ) -> Iterator[LogLine]:
        containers = self._inspect(handle.job_id)
        if containers:
            names = {_label(c, LABEL_HOST): c["Name"].lstrip("/") for c in containers}
            lines = self._container_lines(names, follow)
        else:
            lines = self._saved_lines(handle.job_id)
        for line in lines:
            if (hosts is None or line.host in hosts) and (ranks is None or line.rank in ranks):
                yield line

    def cancel(self, handle: JobHandle) -> None:
        containers = self._inspect(handle.job_id)
        if not containers:
            return  # finished and cleaned up, or cancelled before: nothing to do
        active = not self.status(handle).state.is_terminal
        running = [c["Name"].lstrip("/") for c in containers if c["State"]["Running"]]
        if running:
            self._docker("stop", "-t", str(self.stop_grace), *running, check=False, timeout=self.stop_grace + 60)
        self._finish(handle, cancelled=active)

    def wait(self, handle: JobHandle, *, poll: float = 1.0, timeout: float | None = None) -> JobStatus:
        """Follow the job to its end; then save its logs and results and remove its containers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at: float | None = None
        try:
            while True:
                status = self.status(handle)
                if status.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                    break
                if failed_at is None and any(h.state is JobState.FAILED for h in status.hosts):
                    failed_at = time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > self.stop_grace:
                    # A dead host fails the job, as on SageMaker; the others must not hang waiting for it.
                    self._stop_running(handle)
                time.sleep(poll)
        except KeyboardInterrupt:
            self.cancel(handle)
            raise
        if status.state.is_terminal and status.details.get("containers"):
            return self._finish(handle)
        return status

    # --- finishing ------------------------------------------------------------------------------

    def _finish(self, handle: JobHandle, *, cancelled: bool = False) -> JobStatus:
        """Save logs and the final status into the job directory, then remove containers and network."""
        status = self.status(handle)
        if cancelled:
            status = JobStatus(handle, JobState.CANCELLED, "cancelled", None, status.hosts, None, status.details)
        job_dir = Path(status.details["job_dir"])
        logs_dir = job_dir / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        for container in self._inspect(handle.job_id):
            host = _label(container, LABEL_HOST)
            text = self._docker("logs", container["Name"].lstrip("/"), check=False, merge=True)
            (logs_dir / f"{host}.log").write_text(text, encoding="utf-8")
        _save_status(job_dir / RESULT_FILE, status)
        if not self.keep_containers:
            self._remove(handle.job_id)
        return status

    def _stop_running(self, handle: JobHandle) -> None:
        running = [c["Name"].lstrip("/") for c in self._inspect(handle.job_id) if c["State"]["Running"]]
        if running:
            self._docker("stop", "-t", "5", *running, check=False)

    def _remove(self, job_name: str) -> None:
        ids = self._docker("ps", "-aq", "--filter", f"label={LABEL_JOB}={job_name}", check=False).split()
        if ids:
            self._docker("rm", "-f", *ids, check=False)
        networks = self._docker("network", "ls", "-q", "--filter", f"label={LABEL_JOB}={job_name}", check=False).split()
        if networks:
            self._docker("network", "rm", *networks, check=False)

    def _saved_status(self, handle: JobHandle) -> JobStatus:
        path = self.jobs_dir / handle.job_id / RESULT_FILE
        if not path.is_file():
            return JobStatus(handle, JobState.UNKNOWN, f"no containers and no saved result for job {handle.job_id!r} in {self.jobs_dir}")
        return _load_status(handle, path)

    def _model_data(self, handle: JobHandle, state: JobState) -> str | None:
        if state is not JobState.SUCCEEDED:
            return None
        return str(jobdir.host_dir(self.jobs_dir / handle.job_id, jobdir.host_names(1)[0]) / "model")

    def _failure(self, containers: list[dict[str, Any]]) -> Failure | None:
        """The root cause with the dead container's last lines.

        The runtimes agree on a job-wide root cause and write it first in every host's output/failure;
        when no runtime got that far (a container killed, out of memory), the container that failed
        first is the cause.
        """
        dead = [c for c in containers if not c["State"]["Running"] and c["State"]["ExitCode"] != 0]
        if not dead:
            return None
        job_dir = _job_dir_of(containers)
        verdicts = [(c, _root_cause(self._failure_text(job_dir, c))) for c in containers]
        by_host = {_label(c, LABEL_HOST): c for c in containers}
        agreed = next(((cause, text) for _, (cause, text) in verdicts if cause and cause[0] in by_host), None)
        if agreed:
            (host, rank, code), reason = agreed
            culprit = by_host[host]
        else:
            culprit = min(dead, key=lambda c: c["State"]["FinishedAt"])
            host, rank, code = _label(culprit, LABEL_HOST), None, int(culprit["State"]["ExitCode"])
            reason = self._failure_text(job_dir, culprit)
        name = culprit["Name"].lstrip("/")
        message = f"{'rank ' + str(rank) + ' on ' if rank is not None else ''}{host} failed with exit code {code} (container {name})"
        if culprit["State"].get("OOMKilled"):
            message += "; the container was killed for running out of memory"
        tail = self._docker("logs", "--tail", str(TAIL_LINES), name, check=False, merge=True).rstrip()
        detail = (f"{reason.strip()}\n\n" if reason and reason.strip() else "") + f"last {TAIL_LINES} lines of {host}:\n{tail}"
        return Failure(host, rank, code, message, detail)

    @staticmethod
    def _failure_text(job_dir: str, container: dict[str, Any]) -> str:
        if not job_dir:
            return ""
        return contract.read_failure(contract.OptMl(jobdir.host_dir(Path(job_dir), _label(container, LABEL_HOST)))) or ""

    # --- logs -----------------------------------------------------------------------------------

    def _container_lines(self, names: dict[str, str], follow: bool) -> Iterator[LogLine]:
        """Lines of every host's container, merged as they come (one reader thread per host)."""
        lines: queue.Queue[LogLine | None] = queue.Queue()
        procs = []
        for host, name in sorted(names.items()):
            args = [self.docker, "logs", *(["--follow"] if follow else []), name]
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            procs.append(proc)
            threading.Thread(target=_pump, args=(proc, host, lines), daemon=True).start()
        try:
            finished = 0
            while finished < len(procs):
                line = lines.get()
                if line is None:
                    finished += 1
                else:
                    yield line
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

    def _saved_lines(self, job_id: str) -> Iterator[LogLine]:
        logs_dir = self.jobs_dir / job_id / "logs"
        for path in sorted(logs_dir.glob("*.log")) if logs_dir.is_dir() else []:
            host = path.stem
            with path.open(encoding="utf-8", errors="replace") as handle:
                for raw in handle:
                    yield _parse_line(host, raw)

    # --- the engine -----------------------------------------------------------------------------

    def _docker(self, *args: str, check: bool = True, merge: bool = False, timeout: float = 120) -> str:
        """Run one docker CLI command; engine trouble becomes an UnavailableError saying how to fix it."""
        try:
            proc = subprocess.run(
                [self.docker, *args],
                capture_output=not merge,
                stdout=subprocess.PIPE if merge else None,
                stderr=subprocess.STDOUT if merge else None,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            raise UnavailableError(f"the docker CLI ({self.docker!r}) is not installed; install Docker, then {ENGINE_HINT}") from None
        except subprocess.TimeoutExpired:
            raise UnavailableError(f"docker {args[0]} did not answer within {timeout:.0f} s; is the engine healthy? ({ENGINE_HINT})") from None
        if check and proc.returncode != 0:
            error = (proc.stderr or proc.stdout or "").strip()
            if "Cannot connect to the Docker daemon" in error or "error during connect" in error:
                raise UnavailableError(f"no Docker engine answers ({error.splitlines()[-1]}); {ENGINE_HINT}")
            raise UnavailableError(f"docker {' '.join(args[:2])} failed: {error}")
        return proc.stdout or ""

    def _check_engine(self) -> None:
        try:
            self._docker("version", "--format", "{{.Server.Version}}", timeout=30)
        except UnavailableError as exc:
            if "not installed" in str(exc):
                raise
            raise UnavailableError(f"no Docker engine answers{' at ' + os.environ['DOCKER_HOST'] if os.environ.get('DOCKER_HOST') else ''}; {ENGINE_HINT}") from None

    def _check_image(self, image: str) -> None:
        if self._has_image(image):
            return
        if image != DEFAULT_IMAGE and "/" in image:
            self._docker("pull", "-q", image, check=False, timeout=1800)
            if self._has_image(image):
                return
        raise UnavailableError(
            f"image {image!r} is not in the Docker engine; build it with {BUILD_COMMAND}"
            + ("" if image == DEFAULT_IMAGE else f" --tag {image}")
            + ", or set image_uri to an image that has smddp-sdk installed"
        )

    def _has_image(self, image: str) -> bool:
        return bool(self._docker("image", "ls", "-q", image, check=False).strip())

    def _check_gpu_support(self, spec: JobSpec) -> None:
        runtimes = self._docker("info", "--format", "{{json .Runtimes}}", check=False)
        if "nvidia" in runtimes or shutil.which("nvidia-container-runtime-hook"):
            return
        raise UnavailableError(
            f"{spec.instance_type} needs GPUs but this Docker engine cannot pass them (no NVIDIA Container "
            "Toolkit); install nvidia-container-toolkit and restart the engine, or rehearse on CPU with "
            "DockerScheduler(gpus='none') / scheduler option gpus: none"
        )

    def _inspect(self, job_name: str) -> list[dict[str, Any]]:
        ids = self._docker("ps", "-aq", "--filter", f"label={LABEL_JOB}={job_name}").split()
        if not ids:
            return []
        containers: list[dict[str, Any]] = json.loads(self._docker("inspect", *ids))
        return sorted(containers, key=lambda c: jobdir.host_index(_label(c, LABEL_HOST)))


# --- helpers ----------------------------------------------------------------------------------------


def _rehearsal_gpus(spec: JobSpec) -> int:
    entry = instance_types.lookup(spec.instance_type)
    return entry.gpus if entry is not None else 0


def _label(container: dict[str, Any], key: str) -> str:
    return (container.get("Config", {}).get("Labels") or {}).get(key, "")


def _job_dir_of(containers: list[dict[str, Any]]) -> str:
    return _label(containers[0], LABEL_JOB_DIR) if containers else ""


def _host_status(container: dict[str, Any]) -> HostStatus:
    state = container["State"]
    host = _label(container, LABEL_HOST)
    if state["Running"]:
        return HostStatus(host, JobState.RUNNING)
    if state["Status"] == "created":
        return HostStatus(host, JobState.STARTING)
    code = int(state["ExitCode"])
    return HostStatus(host, JobState.SUCCEEDED if code == 0 else JobState.FAILED, code)


def _job_state(hosts: tuple[HostStatus, ...]) -> JobState:
    states = {h.state for h in hosts}
    if JobState.RUNNING in states or JobState.STARTING in states:
        return JobState.RUNNING if JobState.RUNNING in states else JobState.STARTING
    return JobState.FAILED if JobState.FAILED in states else JobState.SUCCEEDED


def _message(state: JobState, hosts: tuple[HostStatus, ...]) -> str:
    return f"{state.value.lower()}: " + ", ".join(f"{h.host} {h.state.value.lower()}" + (f" ({h.exit_code})" if h.exit_code else "") for h in hosts)


def _root_cause(reason: str) -> tuple[tuple[str, int | None, int] | None, str]:
    """(host, rank, exit code) named on the runtime's ``Root cause:`` line of output/failure, if any."""
    match = _ROOT_CAUSE.search(reason)
    if not match:
        return None, reason
    rank = match.group("rank")
    return (match.group("host"), int(rank) if rank else None, int(match.group("code"))), reason


def _parse_line(host: str, raw: str) -> LogLine:
    text = raw.rstrip("\n")
    match = _PREFIX.match(text)
    if match:
        return LogLine(match.group("host"), match.group("text"), int(match.group("rank")))
    return LogLine(host, text)


def _pump(proc: subprocess.Popen[str], host: str, lines: queue.Queue[LogLine | None]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        lines.put(_parse_line(host, raw))
    lines.put(None)


def _save_status(path: Path, status: JobStatus) -> None:
    record = {
        "state": status.state.value,
        "message": status.message,
        "failure": None if status.failure is None else vars(status.failure),
        "hosts": [vars(h) | {"state": h.state.value} for h in status.hosts],
        "model_data": status.model_data,
        "details": status.details,
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _load_status(handle: JobHandle, path: Path) -> JobStatus:
    record = json.loads(path.read_text(encoding="utf-8"))
    failure = Failure(**record["failure"]) if record.get("failure") else None
    hosts = tuple(HostStatus(h["host"], JobState(h["state"]), h.get("exit_code")) for h in record.get("hosts", ()))
    return JobStatus(handle, JobState(record["state"]), record.get("message", ""), failure, hosts, record.get("model_data"), record.get("details", {}))
