"""Docker mode: one container per host (``algo-1..N``) on a per-job bridge network, as SageMaker runs them.

Every host gets its own ``/opt/ml`` tree in the job directory, bind-mounted into its container, and the
image's ``train`` command (the node runtime) does the rest, exactly as on SageMaker. Containers and the
network carry labels (``ai.smddp.job=<job>``), so status, logs, cancel and cleanup find them from any
process. The docker CLI is driven through subprocess: no compose, no Docker SDK.

Lifecycle: ``schedule`` writes the job directory (the same code snapshot and per-host trees local mode
writes, through ``host_trees``), creates the network and the containers and starts them; ``wait`` follows
the job to its end (stopping the other hosts when one container died, and the whole job after
``max_run``), then saves each container's log, the merged ``model.tar.gz``/``output.tar.gz`` and the final
status into the job directory and removes the containers and the network (``keep_containers=True``
keeps them). ``cancel`` does the same after stopping the containers.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import smddp_sdk
from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError, did_you_mean
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.schedulers.host_trees import collect_artifacts, host_names, prepare_host_trees, stage_code
from smddp_sdk.schedulers.local_job import JobDir, default_job_root
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
CODE_MOUNT = "/opt/smddp/code"  # the job's code snapshot, read-only; the runtime copies it to /opt/ml/code
_OPTIONS = ("image", "keep_containers", "shm_size", "gpus", "job_root", "processes_per_host", "user", "stop_grace_period", "docker")
TAIL_LINES = 20  # a dead container's last lines shown in the failure summary
RESULT_FILE = "result.json"  # what `wait` saves once the containers are gone
_PREFIX = re.compile(r"^\[(?P<host>[^\]/]+)/rank(?P<rank>\d+)\]:\s?(?P<text>.*)$")


@dataclass(frozen=True)
class ContainerPlan:
    """One host's container: its name, labels and the exact ``docker create`` argv."""

    host: str
    name: str
    opt_ml: str
    argv: tuple[str, ...]


class DockerScheduler(Scheduler):
    """Runs a job as N containers of the smddp-sdk image (or ``image_uri``) on this machine's engine.

    Options (``scheduler_options`` / ``get_scheduler("docker", **options)``):

    - ``image``: image when the job has no ``image_uri`` (default ``smddp-sdk:<version>``);
    - ``keep_containers``: leave containers and network after the job, for debugging (default False);
    - ``shm_size``: ``--shm-size`` of every container; the shared-memory transport lives in /dev/shm (2g);
    - ``gpus``: "auto" passes ``--gpus all`` for GPU instance types, "all" for any type, "none" never
      (GPU types are then rehearsed on CPU with their GPU count of ranks per host);
    - ``processes_per_host``: ranks per host, as in local mode (default: the instance type's GPU count,
      or the GPUs the runtime finds when they are passed);
    - ``job_root``: where job directories go (default ``$SMDDP_JOB_ROOT/docker`` or ``~/.smddp/jobs/docker``);
    - ``user``: ``uid:gid`` the containers run as (default the caller's, so outputs are the caller's);
    - ``stop_grace_period``: seconds between SIGTERM and SIGKILL on cancel, and the time the other hosts
      get after one host's container died (default 30);
    - ``docker``: the docker CLI to run (default ``docker`` on PATH).
    """

    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        keep_containers: bool = False,
        shm_size: str = "2g",
        gpus: str = "auto",
        job_root: str | os.PathLike[str] | None = None,
        processes_per_host: int | None = None,
        user: str | None = None,
        stop_grace_period: float = 30.0,
        docker: str = "docker",
        **unknown: Any,
    ) -> None:
        _check_options(unknown, gpus, processes_per_host, keep_containers, stop_grace_period, user)
        self.image = image
        self.keep_containers = keep_containers
        self.shm_size = shm_size
        self.gpus = gpus
        self.job_root = Path(job_root).expanduser().absolute() if job_root else (default_job_root() / "docker").absolute()
        self.processes_per_host = processes_per_host
        self.user = user or f"{os.getuid()}:{os.getgid()}"
        self.stop_grace_period = float(stop_grace_period)
        self.docker = docker

    # --- planning (pure) ------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        """What Docker mode cannot run: S3 locations, an existing job of the same name."""
        issues = [
            SpecIssue(f"inputs.{name}", f"{channel.s3_data!r} is in S3; docker mode reads local data only", "download it and pass a local path or file:// URI, or use scheduler='sagemaker'")
            for name, channel in spec.inputs.items()
            if channel.is_s3
        ]
        if spec.source_dir and spec.source_dir.startswith("s3://"):
            issues.append(SpecIssue("source_dir", "docker mode runs code from this machine, not from S3", "give a local directory"))
        if spec.output_path and spec.output_path.startswith("s3://"):
            issues.append(SpecIssue("output_path", "docker mode writes artifacts to this machine", "use a local path or file:// URI, or leave it unset"))
        if spec.job_name and JobDir(self.job_root / spec.job_name).path.exists():
            issues.append(SpecIssue("job_name", f"a docker job named {spec.job_name!r} already exists in {self.job_root}", "choose another job_name, or remove that job's directory"))
        return issues

    def dryrun(self, spec: JobSpec) -> DryRun:
        """The network, every container's exact ``docker create`` argv and the config files; touches nothing."""
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        job_dir = JobDir(self.job_root / job_name)
        hosts = host_names(spec.instance_count)
        image = spec.image_uri or self.image or DEFAULT_IMAGE
        gpu_flag, notes = self._gpu_plan(spec)
        network = f"smddp-{job_name}"
        containers = [self._container_plan(spec, job_name, job_dir, host, image, network, gpu_flag) for host in hosts]
        output_dir = Path(spec.output_path.removeprefix("file://")).expanduser().absolute() if spec.output_path else self.job_root
        artifacts = output_dir / job_name / "output"
        request = {
            "job_name": job_name,
            "handle": str(JobHandle(self.name, job_name)),
            "job_dir": str(job_dir.path),
            "image": image,
            "code": {"source": spec.source_dir or spec.entry_point, "dependencies": list(spec.dependencies), "snapshot": str(job_dir.code_dir), "mounted_at": CODE_MOUNT},
            "network": ["network", "create", "--driver", "bridge", "--label", f"{LABEL_JOB}={job_name}", network],
            "containers": [{"host": c.host, "name": c.name, "opt_ml": c.opt_ml, "argv": list(c.argv)} for c in containers],
            "hyperparameters": contract.encode_hyperparameters(
                spec.training_hyperparameters(job_name=job_name, submit_directory=f"file://{CODE_MOUNT}", region=None)
            ),
            "artifacts": {"model_data": str(artifacts / "model.tar.gz"), "output_data": str(artifacts / "output.tar.gz")},
        }
        return DryRun(self.name, spec, job_name, request, tuple(notes))

    def _gpu_plan(self, spec: JobSpec) -> tuple[str | None, list[str]]:
        """``--gpus`` value (or None) and notes; whether the engine can is checked at schedule time."""
        wants = spec.instance_type == "local_gpu" or _catalog_gpus(spec) > 0
        if self.gpus == "none" or (self.gpus == "auto" and not wants):
            notes = [f"{spec.instance_type} rehearsed on CPU: {self._simulated_gpus(spec, None)} ranks per host"] if wants else []
            return None, notes
        return "all", ["GPUs passed with --gpus all: the engine needs the NVIDIA Container Toolkit (gpus: none rehearses on CPU)"]

    def _simulated_gpus(self, spec: JobSpec, gpu_flag: str | None) -> int | None:
        """SMDDP_NUM_GPUS for every host; None lets the runtime count the GPUs passed to the container."""
        if self.processes_per_host is not None:
            return self.processes_per_host
        if gpu_flag is not None:
            return None
        return _catalog_gpus(spec)

    def _container_plan(
        self, spec: JobSpec, job_name: str, job_dir: JobDir, host: str, image: str, network: str, gpu_flag: str | None
    ) -> ContainerPlan:
        opt_ml = job_dir.host_dir(host)
        name = f"{job_name}-{host}"
        argv: list[str] = [
            "create", "--name", name, "--hostname", host,
            "--network", network, "--network-alias", host,
            "--label", f"{LABEL_JOB}={job_name}", "--label", f"{LABEL_HOST}={host}",
            "--label", f"{LABEL_JOB_DIR}={job_dir.path}",
            "--shm-size", self.shm_size,
            "--user", self.user,
            # SageMaker stops a container with SIGTERM and kills it later; the runtime forwards SIGTERM.
            "--stop-timeout", str(int(self.stop_grace_period)),
            "-v", f"{opt_ml}:/opt/ml",
            "-v", f"{job_dir.code_dir}:{CODE_MOUNT}:ro",
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
        num_gpus = self._simulated_gpus(spec, gpu_flag)
        if num_gpus is not None:
            env[contract.NUM_GPUS_ENV] = str(num_gpus)
        env.update(spec.environment)  # the user's settings win
        return env

    # --- running --------------------------------------------------------------------------------

    def schedule(self, dryrun: DryRun, *, owner_pid: int | None = None) -> JobHandle:
        """Check the engine and image, write the job directory, create and start the containers.

        With ``owner_pid`` (the estimator's ``fit(wait=True)`` and ``smddp-launch`` without ``--detach``
        pass their own pid) a small watcher cancels the job if that process dies before the job ends.
        """
        if dryrun.scheduler != self.name:
            raise SpecError(SpecIssue("scheduler", f"this dryrun was made for the {dryrun.scheduler!r} scheduler, not 'docker'"))
        issues = self.validate(dryrun.spec)
        if issues:
            raise SpecError(issues)
        request = dryrun.request
        self._check_engine()
        self._check_image(request["image"])
        if any("--gpus" in c["argv"] for c in request["containers"]):
            self._check_gpu_support(dryrun.spec)
        job_dir = JobDir(Path(request["job_dir"]))
        try:
            self._write_job_dir(dryrun, job_dir)
            self._docker(*request["network"])
            for container in request["containers"]:
                self._docker(*container["argv"])
            self._docker("start", *(c["name"] for c in request["containers"]))
            if owner_pid is not None:
                self._start_watcher(job_dir, dryrun.job_name, owner_pid)
        except BaseException:
            self._remove(dryrun.job_name)
            shutil.rmtree(job_dir.path, ignore_errors=True)  # no half-made job is left behind
            raise
        return JobHandle.parse(request["handle"])

    def _start_watcher(self, job_dir: JobDir, job_name: str, owner_pid: int) -> None:
        env = dict(os.environ)
        package_parent = str(Path(smddp_sdk.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        with open(job_dir.path / "watcher.log", "ab") as log:
            # A session of its own: the caller's Ctrl-C or death must not take the watcher with it.
            watcher = subprocess.Popen(
                [sys.executable, "-m", "smddp_sdk.schedulers.docker_watch", str(self.job_root), job_name, str(owner_pid), self.docker],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        _WATCHERS.append(watcher)

    def _write_job_dir(self, dryrun: DryRun, job_dir: JobDir) -> None:
        try:
            job_dir.path.mkdir(parents=True)
        except FileExistsError:
            raise SpecError(SpecIssue("job_name", f"a docker job named {dryrun.job_name!r} already exists in {self.job_root}", "choose another job_name")) from None
        spec, request = dryrun.spec, dryrun.request
        stage_code(spec, job_dir.code_dir)
        hosts = [c["host"] for c in request["containers"]]
        trees = prepare_host_trees(spec, job_dir.path, dryrun.job_name, hosts, submit_directory=f"file://{CODE_MOUNT}", link_inputs=False)
        for tree in trees:
            # Mount points made now, by the caller: the engine would otherwise create them as root.
            for channel in spec.inputs:
                tree.opt_ml.channel_dir(channel).mkdir(parents=True, exist_ok=True)
            tree.opt_ml.output_dir.mkdir(parents=True, exist_ok=True)
        job_dir.write_record({"handle": request["handle"], "job_name": dryrun.job_name, "created": time.time(), "spec": spec.as_dict(), "request": request})

    def status(self, handle: JobHandle) -> JobStatus:
        """From the containers while they exist; afterwards from the result ``wait``/``cancel`` saved."""
        containers = self._inspect(handle.job_id)
        if not containers:
            return self._saved_status(handle)
        hosts = tuple(_host_status(c) for c in containers)
        state = _job_state(hosts)
        failure = self._failure(containers) if state is JobState.FAILED else None
        job_dir = JobDir(Path(_job_dir_of(containers)))
        details = {
            "containers": [c["Name"].lstrip("/") for c in containers],
            "started": _started(containers),
            "job_dir": str(job_dir.path),
            "logs_dir": str(job_dir.path / "logs"),
            "other_failures": [],
        }
        return JobStatus(handle, state, _message(state, hosts), failure, hosts, None, details)

    def logs(
        self,
        handle: JobHandle,
        *,
        hosts: Sequence[str] | None = None,
        ranks: Sequence[int] | None = None,
        follow: bool = False,
    ) -> Iterator[LogLine]:
        """Every host's output, merged as it arrives; from the saved logs once the containers are gone."""
        containers = self._inspect(handle.job_id)
        if containers:
            names = {_label(c, LABEL_HOST): c["Name"].lstrip("/") for c in containers}
            lines = self._container_lines(names, follow)
        else:
            lines = self._saved_lines(handle)
        for line in lines:
            if line.matches(hosts, ranks):
                yield line

    def cancel(self, handle: JobHandle) -> None:
        """Stop every container (SIGTERM, SIGKILL after the grace period), save the job, remove it all."""
        containers = self._inspect(handle.job_id)
        if not containers:
            return  # finished and cleaned up, or cancelled before: nothing to do
        active = not self.status(handle).state.is_terminal
        running = [c["Name"].lstrip("/") for c in containers if c["State"]["Running"]]
        if running:
            grace = int(self.stop_grace_period)
            self._docker("stop", "-t", str(grace), *running, check=False, timeout=grace + 60)
        self._finish(handle, cancelled=active)

    def wait(self, handle: JobHandle, *, poll: float = 1.0, timeout: float | None = None) -> JobStatus:
        """Follow the job to its end; then save its logs, results and artifacts and remove its containers.

        A host whose container died fails the job, as on SageMaker: the others get the grace period
        to notice, then are stopped. Ctrl-C cancels the job.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at: float | None = None
        max_run = self._max_run(handle)
        try:
            while True:
                status = self.status(handle)
                if status.state.is_terminal or (deadline is not None and time.monotonic() >= deadline):
                    break
                if max_run is not None and _running_for(status) > max_run:
                    return self._time_out(handle, max_run)
                if failed_at is None and any(h.state is JobState.FAILED for h in status.hosts):
                    failed_at = time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > self.stop_grace_period:
                    self._stop_running(handle)
                time.sleep(poll)
        except KeyboardInterrupt:
            self.cancel(handle)
            raise
        if status.state.is_terminal and status.details.get("containers"):
            return self._finish(handle)
        return status

    def _max_run(self, handle: JobHandle) -> float | None:
        try:
            return float(self._job_dir(handle).read_record()["spec"]["max_run"])
        except (SpecError, OSError, ValueError, KeyError, TypeError):
            return None

    def _time_out(self, handle: JobHandle, max_run: float) -> JobStatus:
        """max_run passed: stop the job as SageMaker does (MaxRuntimeExceeded) and record why."""
        self._stop_running(handle)
        status = self._finish(handle)
        message = f"MaxRuntimeExceeded: the job ran longer than max_run ({max_run:.0f} s) and was stopped"
        status = JobStatus(handle, JobState.FAILED, message, status.failure, status.hosts, None, status.details)
        _save_status(Path(status.details["job_dir"]) / RESULT_FILE, status)
        return status

    # --- finishing ------------------------------------------------------------------------------

    def _finish(self, handle: JobHandle, *, cancelled: bool = False) -> JobStatus:
        """Save logs, artifacts and the final status into the job directory, then remove containers and network."""
        containers = self._inspect(handle.job_id)
        status = self.status(handle)
        job_dir = JobDir(Path(status.details["job_dir"]))
        logs_dir = Path(status.details["logs_dir"])
        logs_dir.mkdir(parents=True, exist_ok=True)
        for container in containers:
            text = self._docker("logs", container["Name"].lstrip("/"), check=False, merge=True)
            (logs_dir / f"{_label(container, LABEL_HOST)}.log").write_text(text, encoding="utf-8")
        artifacts = self._collect(job_dir, [_label(c, LABEL_HOST) for c in containers])
        details = {**status.details, **artifacts, "ended": time.time()}
        if cancelled:
            status = JobStatus(handle, JobState.CANCELLED, "cancelled", None, status.hosts, None, details)
        else:
            model = artifacts.get("model_data") if status.state is JobState.SUCCEEDED else None
            status = JobStatus(handle, status.state, status.message, status.failure, status.hosts, model, details)
        _save_status(job_dir.path / RESULT_FILE, status)
        if not self.keep_containers:
            self._remove(handle.job_id)
        _reap_watchers()
        return status

    @staticmethod
    def _collect(job_dir: JobDir, hosts: list[str]) -> dict[str, str]:
        """model.tar.gz and output.tar.gz merged over the hosts, where the dryrun said they go."""
        try:
            planned = job_dir.read_record()["request"]["artifacts"]
        except (OSError, ValueError, KeyError):
            return {}
        trees = [contract.OptMl(job_dir.host_dir(host)) for host in hosts]
        model, output = collect_artifacts(trees, Path(planned["model_data"]).parent)
        return {"model_data": str(model), "output_data": str(output)}

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
        job_dir = self._job_dir(handle)
        path = job_dir.path / RESULT_FILE
        if not path.is_file():
            return JobStatus(handle, JobState.FAILED, f"the containers of {handle.job_id!r} are gone and left no result (removed outside smddp-sdk?)", details={"job_dir": str(job_dir.path)})
        return _load_status(handle, path)

    def _job_dir(self, handle: JobHandle) -> JobDir:
        if handle.scheduler != self.name:
            raise SpecError(SpecIssue("handle", f"{handle} is not a docker job", f"use get_scheduler({handle.scheduler!r})"))
        job_dir = JobDir(self.job_root / handle.job_id)
        if not job_dir.exists():
            raise SpecError(SpecIssue("handle", f"no docker job {handle.job_id!r}: no containers and nothing in {self.job_root}", "set job_root or SMDDP_JOB_ROOT if the job lives elsewhere"))
        return job_dir

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
        by_host = {_label(c, LABEL_HOST): c for c in containers}
        texts = [self._failure_text(job_dir, c) for c in containers]
        agreed = next(((cause, text) for text in texts if (cause := contract.parse_root_cause(text)) and cause.host in by_host), None)
        if agreed:
            cause, reason = agreed
            host, rank, code = cause.host, cause.rank, cause.exit_code
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
        return contract.read_failure(contract.OptMl(JobDir(Path(job_dir)).host_dir(_label(container, LABEL_HOST)))) or ""

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

    def _saved_lines(self, handle: JobHandle) -> Iterator[LogLine]:
        logs_dir = self._job_dir(handle).path / "logs"
        for path in sorted(logs_dir.glob("*.log"), key=lambda p: _host_index(p.stem)) if logs_dir.is_dir() else []:
            with path.open(encoding="utf-8", errors="replace") as lines:
                for raw in lines:
                    yield _parse_line(path.stem, raw)

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
            from smddp_sdk import progress  # click, only when a pull is needed

            progress.docker_pull(self.docker, image, timeout=1800)  # a bar on a terminal: a pull can take minutes
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
        return sorted(containers, key=lambda c: _host_index(_label(c, LABEL_HOST)))


# Watchers this process started: reaped once they end, so a long-lived notebook keeps no zombies.
_WATCHERS: list[subprocess.Popen[bytes]] = []


def _reap_watchers() -> None:
    _WATCHERS[:] = [watcher for watcher in _WATCHERS if watcher.poll() is None]


# --- helpers ----------------------------------------------------------------------------------------


def _started(containers: list[dict[str, Any]]) -> float | None:
    """When the first container started (epoch seconds), from the engine's RFC 3339 timestamps."""
    stamps = [c["State"].get("StartedAt", "") for c in containers]
    parsed = [_epoch(stamp) for stamp in stamps if stamp and not stamp.startswith("0001-")]
    return min(parsed) if parsed else None


def _epoch(stamp: str) -> float:
    # Docker prints nanoseconds ("2026-11-22T03:15:06.123456789Z"); datetime takes microseconds.
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{fraction or 0}")


def _running_for(status: JobStatus) -> float:
    started = status.details.get("started")
    return time.time() - started if started else 0.0


def _check_options(unknown: dict[str, Any], gpus: Any, processes_per_host: Any, keep_containers: Any, grace: Any, user: Any) -> None:
    """Every wrong option at once, as the job file's other problems are reported."""
    issues = [
        SpecIssue(f"scheduler_options.{key}", "unknown option of the docker scheduler", did_you_mean(key, _OPTIONS) or f"expected one of {', '.join(_OPTIONS)}")
        for key in unknown
    ]
    if gpus not in GPU_CHOICES:
        issues.append(SpecIssue("scheduler_options.gpus", f"must be one of {', '.join(GPU_CHOICES)}, got {gpus!r}", did_you_mean(str(gpus), GPU_CHOICES)))
    if processes_per_host is not None and (isinstance(processes_per_host, bool) or not isinstance(processes_per_host, int) or processes_per_host < 1):
        issues.append(SpecIssue("scheduler_options.processes_per_host", f"must be a positive integer, got {processes_per_host!r}"))
    if not isinstance(keep_containers, bool):
        issues.append(SpecIssue("scheduler_options.keep_containers", f"must be true or false, got {keep_containers!r}"))
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        issues.append(SpecIssue("scheduler_options.stop_grace_period", f"must be a number of seconds >= 0, got {grace!r}"))
    if user is not None and not re.fullmatch(r"\d+(:\d+)?", str(user)):
        issues.append(SpecIssue("scheduler_options.user", f"must be uid or uid:gid (numbers), got {user!r}"))
    if issues:
        raise SpecError(issues)


def _catalog_gpus(spec: JobSpec) -> int:
    entry = instance_types.lookup(spec.instance_type)
    return entry.gpus if entry is not None else 0


def _host_index(host: str) -> int:
    """Sort key that puts algo-10 after algo-9."""
    suffix = host.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


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
