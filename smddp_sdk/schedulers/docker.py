"""Docker mode: one container per host (``algo-1..N``) on a per-job bridge network, as SageMaker runs them.

Every host gets its own ``/opt/ml`` tree in the job directory, bind-mounted into its container, and the
image's ``train`` command (the node runtime) does the rest, exactly as on SageMaker. Containers and the
network carry labels (``ai.smddp.job=<job>``), so status, logs, cancel and cleanup find them from any
process. The docker CLI is driven through subprocess: no compose, no Docker SDK.

This module is the plan (every ``docker create`` argv) and the engine checks. The run belongs to the one
host-tree lifecycle (``hosts``): ``schedule`` writes the job directory (the same code snapshot and
per-host trees local mode writes) and starts the detached supervisor, which creates the network and the
containers through the container backend, watches them, stops them on cancel, owner gone, ``max_run``
or a peer's failure, names the root cause, collects ``model.tar.gz``/``output.tar.gz``, writes the job's
state and removes containers and network (``keep_containers=True`` keeps them). ``status``, ``logs``
and ``cancel`` come from ``hosts.jobs`` and work after the containers are gone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import smddp_sdk
from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError, did_you_mean
from smddp_sdk.schedulers import channels, fidelity
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.host_trees import host_names, prepare_host_trees, stage_code
from smddp_sdk.schedulers.hosts.container_backend import LABEL_HOST, LABEL_JOB, LABEL_JOB_DIR, remove_job
from smddp_sdk.schedulers.hosts.jobs import HostTreeScheduler
from smddp_sdk.schedulers.hosts.supervisor import LIFELINE
from smddp_sdk.schedulers.local_job import JobDir, default_job_root
from smddp_sdk.specs import contract, instance_types, limits
from smddp_sdk.specs.job import JobSpec, make_job_name
from smddp_sdk.specs.status import JobHandle

__all__ = ["DockerScheduler", "DEFAULT_IMAGE", "LABEL_HOST", "LABEL_JOB", "LABEL_JOB_DIR"]

DEFAULT_IMAGE = f"smddp-sdk:{smddp_sdk.__version__}"
BUILD_COMMAND = "scripts/build-image.sh (in a smddp-sdk checkout)"
ENGINE_HINT = (
    "start Docker (sudo systemctl start docker), or as root in a smddp-sdk checkout: "
    'eval "$(scripts/docker-engine.sh start)"; point DOCKER_HOST at a running engine otherwise'
)
GPU_CHOICES = ("auto", "all", "none")
CODE_MOUNT = "/opt/smddp/code"  # the job's code snapshot, read-only; the runtime copies it to /opt/ml/code
LIFELINE_MOUNT = "/opt/smddp/lifeline"  # the supervisor's FIFO: the runtime stops its ranks when it closes
WHEELHOUSE_MOUNT = "/opt/smddp/wheelhouse"  # the `wheelhouse` option's folder, read-only: pip's only source
_OPTIONS = ("image", "keep_containers", "shm_size", "gpus", "job_root", "processes_per_host", "user", "stop_grace_period", "docker", "wheelhouse")


@dataclass(frozen=True)
class ContainerPlan:
    """One host's container: its name, labels and the exact ``docker create`` argv."""

    host: str
    name: str
    opt_ml: str
    argv: tuple[str, ...]


class DockerScheduler(HostTreeScheduler):
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
    - ``docker``: the docker CLI to run (default ``docker`` on PATH);
    - ``wheelhouse``: a folder of wheels, mounted read-only at /opt/smddp/wheelhouse; pip in the containers
      (requirements.txt at container start) then installs from it alone (``PIP_NO_INDEX``,
      ``PIP_FIND_LINKS``), for machines and networks without a package index.
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
        wheelhouse: str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> None:
        _check_options(unknown, gpus, processes_per_host, keep_containers, stop_grace_period, user)
        self.wheelhouse = _wheelhouse(wheelhouse)
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
        """What Docker mode cannot run: S3 code or output, Pipe mode, an existing job of the same name."""
        issues = fidelity.issues(spec)
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
            "backend": "container",
            "docker_cli": self.docker,
            "keep_containers": self.keep_containers,
            "max_run": spec.max_run,
            "stop_grace_period": self.stop_grace_period,
        }
        return DryRun(self.name, spec, job_name, request, (*notes, *fidelity.notes(spec, self.name, len(hosts))))

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
            "-v", f"{job_dir.path / LIFELINE}:{LIFELINE_MOUNT}",
        ]
        for channel_name, channel in sorted(spec.inputs.items()):
            if (source := channels.bind_mount_source(channel)) is not None:  # others are files in the tree
                argv += ["-v", f"{source}:/opt/ml/input/data/{channel_name}:ro"]
        if self.wheelhouse is not None:
            argv += ["-v", f"{self.wheelhouse}:{WHEELHOUSE_MOUNT}:ro"]
        if gpu_flag:
            argv += ["--gpus", gpu_flag]
        for key, value in self._environment(spec, job_name, gpu_flag).items():
            argv += ["-e", f"{key}={value}"]
        argv += [image, "train"]
        return ContainerPlan(host, name, str(opt_ml), tuple(argv))

    def _environment(self, spec: JobSpec, job_name: str, gpu_flag: str | None) -> dict[str, str]:
        env = {"TRAINING_JOB_NAME": job_name, contract.LIFELINE_ENV: LIFELINE_MOUNT}
        if not self.user.startswith("0:"):
            env["HOME"] = "/tmp"  # the calling user has no home in the image
        num_gpus = self._simulated_gpus(spec, gpu_flag)
        if num_gpus is not None:
            env[contract.NUM_GPUS_ENV] = str(num_gpus)
        if self.wheelhouse is not None:  # pip's own variables: requirements.txt installs offline
            env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=WHEELHOUSE_MOUNT)
        env.update(spec.environment)  # the user's settings win
        return env

    # --- running --------------------------------------------------------------------------------

    def schedule(self, dryrun: DryRun, *, owner_pid: int | None = None) -> JobHandle:
        """Check the engine and image, write the job directory and start its supervisor (which creates
        and starts the containers). Returns at once.

        With ``owner_pid`` (the estimator's ``fit(wait=True)`` and ``smddp-launch`` without ``--detach``
        pass their own pid) the job is cancelled if that process dies before the job ends.
        """
        if dryrun.scheduler != self.name:
            raise SpecError(SpecIssue("scheduler", f"this dryrun was made for the {dryrun.scheduler!r} scheduler, not 'docker'"))
        issues = self.validate(dryrun.spec)
        if issues:
            raise SpecError(issues)
        request = dryrun.request
        fidelity.warn(dryrun.notes)
        self._check_engine()
        self._check_image(request["image"])
        if any("--gpus" in c["argv"] for c in request["containers"]):
            self._check_gpu_support(dryrun.spec)
        remove_job(self.docker, dryrun.job_name)  # leftovers of an earlier job of the same name (keep_containers)
        return self._start_job(dryrun, owner_pid)

    def _write_job_dir(self, dryrun: DryRun, job_dir: JobDir) -> None:
        spec, request = dryrun.spec, dryrun.request
        stage_code(spec, job_dir.code_dir)
        hosts = [c["host"] for c in request["containers"]]
        trees = prepare_host_trees(spec, job_dir.path, dryrun.job_name, hosts, submit_directory=f"file://{CODE_MOUNT}", link_inputs=False)
        for tree in trees:
            # Mount points made now, by the caller: the engine would otherwise create them as root.
            for channel in spec.inputs:
                tree.opt_ml.channel_dir(channel).mkdir(parents=True, exist_ok=True)
            tree.opt_ml.output_dir.mkdir(parents=True, exist_ok=True)
        # Made here so that the bind mount finds a FIFO, not a directory the engine would create.
        os.mkfifo(job_dir.path / LIFELINE, 0o600)

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


# --- helpers ----------------------------------------------------------------------------------------


def _check_options(unknown: dict[str, Any], gpus: Any, processes_per_host: Any, keep_containers: Any, grace: Any, user: Any) -> None:
    """Every wrong option at once, as the job file's other problems are reported."""
    issues = [
        SpecIssue(f"scheduler_options.{key}", "unknown option of the docker scheduler", did_you_mean(key, _OPTIONS) or f"expected one of {', '.join(_OPTIONS)}")
        for key in unknown
    ]
    if gpus not in GPU_CHOICES:
        issues.append(SpecIssue("scheduler_options.gpus", f"must be one of {', '.join(GPU_CHOICES)}, got {gpus!r}", did_you_mean(str(gpus), GPU_CHOICES)))
    issues += limits.processes_per_host_issues(processes_per_host, "scheduler_options.processes_per_host")
    if not isinstance(keep_containers, bool):
        issues.append(SpecIssue("scheduler_options.keep_containers", f"must be true or false, got {keep_containers!r}"))
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        issues.append(SpecIssue("scheduler_options.stop_grace_period", f"must be a number of seconds >= 0, got {grace!r}"))
    if user is not None and not re.fullmatch(r"\d+(:\d+)?", str(user)):
        issues.append(SpecIssue("scheduler_options.user", f"must be uid or uid:gid (numbers), got {user!r}"))
    if issues:
        raise SpecError(issues)


def _wheelhouse(folder: str | os.PathLike[str] | None) -> Path | None:
    if folder is None:
        return None
    path = Path(folder).expanduser().absolute()
    if not path.is_dir():
        raise SpecError(SpecIssue("scheduler_options.wheelhouse", f"{str(path)!r} is not a directory", "give a folder of .whl files (pip download -r requirements.txt -d <folder>)"))
    return path


def _catalog_gpus(spec: JobSpec) -> int:
    entry = instance_types.lookup(spec.instance_type)
    return entry.gpus if entry is not None else 0
