"""Docker mode: one container per host (``algo-1..N``) on a per-job bridge network, as SageMaker runs them.

Every host gets its own ``/opt/ml`` tree in the job directory, bind-mounted into its container, and the
image's ``train`` command (the node runtime) does the rest, exactly as on SageMaker. Containers and the
network carry labels (``ai.smddp.job=<job>``), so status, logs, cancel and cleanup find them from any
process.

This module is the plan (every ``docker create`` argv) and the engine checks. Everything after it -- the
job directory, the supervisor that creates, watches and removes the containers through the container
backend (``keep_containers=True`` keeps them), ``status``, ``logs`` and ``cancel`` -- is ``hosttree``'s.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import smddp_sdk
from smddp_sdk.errors import SpecIssue, UnavailableError
from smddp_sdk.schedulers import channels
from smddp_sdk.schedulers.base import DryRun
from smddp_sdk.schedulers.hosttree import docker_cli
from smddp_sdk.schedulers.hosttree.backend import TOKEN_PLACEHOLDER
from smddp_sdk.schedulers.hosttree.docker_cli import ENGINE_HINT, LABEL_HOST, LABEL_JOB, LABEL_JOB_DIR, remove_job
from smddp_sdk.schedulers.hosttree.host_trees import HostTree
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.jobs import HostTreeScheduler
from smddp_sdk.schedulers.hosttree.plan import HostPlan, HostTreePlan, Ranks
from smddp_sdk.schedulers.hosttree.supervisor import LIFELINE, SCRATCH
from smddp_sdk.schedulers.job_files import default_job_root, ranks_per_host
from smddp_sdk.schedulers.options import (
    INTERRUPT_AFTER,
    PROCESSES_PER_HOST,
    RETRY_SCRIPT_ERRORS,
    STOP_GRACE_PERIOD,
    WARM_RESTART,
    Option,
    SchedulerOptions,
    boolean,
    is_text,
    job_root,
    matching,
    one_of,
    with_default,
)
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec, make_job_name
from smddp_sdk.specs.status import JobHandle

__all__ = ["DockerScheduler", "DEFAULT_IMAGE", "LABEL_HOST", "LABEL_JOB", "LABEL_JOB_DIR"]

DEFAULT_IMAGE = f"smddp-sdk:{smddp_sdk.__version__}"
BUILD_COMMAND = "scripts/build-image.sh (in a smddp-sdk checkout)"
CODE_MOUNT = "/opt/smddp/code"  # the job's code snapshot, read-only; the runtime copies it to /opt/ml/code
LIFELINE_MOUNT = "/opt/smddp/lifeline"  # the supervisor's FIFO: the runtime stops its ranks when it closes
WHEELHOUSE_MOUNT = "/opt/smddp/wheelhouse"  # the `wheelhouse` option's folder, read-only: pip's only source
SCRATCH_MOUNT = "/opt/smddp/scratch"  # the host's scratch folder in the job directory: outlives its container (recovery snapshots)


def _network(job_name: str) -> str:
    return f"smddp-{job_name}"


def _warm_restart_note(job_name: str, per_host: int | None) -> str:
    spares = f"{per_host} spare rank{'s' if per_host != 1 else ''}" if per_host else "one spare rank"
    return (
        f"warm_restart: while an attempt trains, a standby container per host (`docker run -i` of its argv above, named "
        f"<container>-r<N> on network {_network(job_name)}-r<N> for restart N, with -e {contract.STANDBY_ENV}) starts {spares} "
        "with torch imported; a retry or an interruption wakes it through its stdin (the new job token and restart count) "
        "instead of creating the containers again; the job's end removes what no attempt used"
    )


def _wheelhouse_issues(folder: Any, path: str) -> list[SpecIssue]:
    if not isinstance(folder, (str, os.PathLike)) or not Path(folder).expanduser().is_dir():
        shown = str(Path(folder).expanduser().absolute()) if isinstance(folder, (str, os.PathLike)) else folder
        return [SpecIssue(path, f"{shown!r} is not a directory", "give a folder of .whl files (pip download -r requirements.txt -d <folder>)")]
    return []


class DockerScheduler(HostTreeScheduler):
    """Runs a job as N containers of the smddp-sdk image (or ``image_uri``) on this machine's engine.

    Its options are declared below (``smddp-launch options docker``). ``gpus: none`` rehearses GPU
    instance types on CPU with their GPU count of ranks per host; ``wheelhouse`` is mounted read-only at
    /opt/smddp/wheelhouse and pip in the containers (requirements.txt at container start) installs from
    it alone (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``), for machines and networks without a package index.
    """

    name: ClassVar[str] = "docker"
    backend: ClassVar[str] = "container"
    link_inputs: ClassVar[bool] = False  # data is mounted, not linked
    options: ClassVar[SchedulerOptions] = SchedulerOptions.of(
        "docker",
        Option("image", "str", None, "image when the job has no image_uri (default smddp-sdk:<version>)", check=is_text),
        Option("keep_containers", "bool", False, "leave containers and network after the job, for debugging", check=boolean),
        Option("shm_size", "str", "2g", "--shm-size of every container (the shared-memory transport lives in /dev/shm)", check=is_text),
        Option("gpus", "str", "auto", "auto: --gpus all for GPU instance types; all: always; none: never", check=one_of("auto", "all", "none")),
        job_root("where job directories go (default $SMDDP_JOB_ROOT/docker)", lambda: default_job_root("docker")),
        with_default(PROCESSES_PER_HOST, None, "ranks per container (default: the instance type's GPU count)"),
        Option("user", "str", None, "uid:gid the containers run as (default the caller's)", check=matching(r"\d+(:\d+)?", "uid or uid:gid (numbers)"),
               convert=lambda user: str(user) if user else f"{os.getuid()}:{os.getgid()}"),
        with_default(STOP_GRACE_PERIOD, 30.0),
        RETRY_SCRIPT_ERRORS,
        INTERRUPT_AFTER,
        WARM_RESTART,
        Option("docker", "str", "docker", "the docker CLI to run", check=is_text),
        Option("wheelhouse", "path", None, "folder of wheels mounted read-only; requirements.txt installs from it offline",
               check=_wheelhouse_issues, convert=lambda folder: Path(folder).expanduser().absolute() if folder else None),
    )
    image: str | None
    keep_containers: bool
    shm_size: str
    gpus: str
    user: str
    docker: str
    wheelhouse: Path | None
    warm_restart: bool

    # --- planning (pure) ------------------------------------------------------------------------

    def plan(self, spec: JobSpec) -> DryRun[HostTreePlan]:
        """The network, every container's exact ``docker create`` argv and the config files; touches nothing."""
        job_name = spec.job_name or make_job_name(spec.base_job_name)
        notes = [*self._gpu_plan(spec)[1], f"{contract.JOB_TOKEN_ENV}: {TOKEN_PLACEHOLDER}, given to `docker create` through its environment (-e {contract.JOB_TOKEN_ENV}), never on its command line"]
        per_host = ranks_per_host(spec, self._simulated_gpus(spec, gpus_passed=self._gpu_plan(spec)[0] is not None))
        plan = self._plan(
            spec, job_name,
            image=self._image(spec),
            network=("network", "create", "--driver", "bridge", "--label", f"{LABEL_JOB}={job_name}", _network(job_name)),
            ranks=Ranks(spec.distribution.launcher, per_host, per_host and per_host * spec.instance_count),
            docker_cli=self.docker,
            keep_containers=self.keep_containers,
        )
        plan = replace(plan, code={**plan.code, "mounted_at": CODE_MOUNT})
        if self.warm_restart:
            notes.append(_warm_restart_note(job_name, per_host))
        return self._dryrun(spec, plan, notes)

    def _image(self, spec: JobSpec) -> str:
        return spec.image_uri or self.image or DEFAULT_IMAGE

    def _submit_directory(self, job_dir: JobDir) -> str:
        return f"file://{CODE_MOUNT}"

    def _host(self, spec: JobSpec, job_dir: JobDir, host: str) -> HostPlan:
        """How one host starts: its container's name and the exact ``docker create`` argv."""
        name, argv = self._container(spec, job_dir.path.name, job_dir, host, self._image(spec), _network(job_dir.path.name), self._gpu_plan(spec)[0])
        return HostPlan(host, job_dir.host_dir(host), name, tuple(argv))

    def _gpu_plan(self, spec: JobSpec) -> tuple[str | None, list[str]]:
        """``--gpus`` value (or None) and notes; whether the engine can is checked at schedule time."""
        wants = spec.instance_type == "local_gpu" or bool(spec.instance and spec.instance.gpus)
        if self.gpus == "none" or (self.gpus == "auto" and not wants):
            notes = [f"{spec.instance_type} rehearsed on CPU: {ranks_per_host(spec, self._simulated_gpus(spec, gpus_passed=False))} ranks per host"] if wants else []
            return None, notes
        return "all", ["GPUs passed with --gpus all: the engine needs the NVIDIA Container Toolkit (gpus: none rehearses on CPU)"]

    def _container(self, spec: JobSpec, job_name: str, job_dir: JobDir, host: str, image: str, network: str, gpu_flag: str | None) -> tuple[str, list[str]]:
        """One container's name and its exact ``docker create`` argv."""
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
            "-v", f"{job_dir.path / SCRATCH / host}:{SCRATCH_MOUNT}",
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
        # No value: docker takes it from the client's environment, where the backend puts the attempt's
        # random token (and its restart count); a value here would be in every local user's view (/proc/*/cmdline).
        argv += ["-e", contract.JOB_TOKEN_ENV, "-e", contract.RESTART_COUNT_ENV, image, "train"]
        return name, argv

    def _environment(self, spec: JobSpec, job_name: str, gpu_flag: str | None) -> dict[str, str]:
        env = {"TRAINING_JOB_NAME": job_name, contract.LIFELINE_ENV: LIFELINE_MOUNT, contract.SCRATCH_ENV: SCRATCH_MOUNT}
        if not self.user.startswith("0:"):
            env["HOME"] = "/tmp"  # the calling user has no home in the image
        num_gpus = self._simulated_gpus(spec, gpus_passed=gpu_flag is not None)
        if num_gpus is not None:
            env[contract.NUM_GPUS_ENV] = str(num_gpus)
        if self.wheelhouse is not None:  # pip's own variables: requirements.txt installs offline
            env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=WHEELHOUSE_MOUNT)
        env.update(spec.environment)  # the user's settings win
        if spec.encrypt_inter_container_traffic:  # except over this one: never clear text by mistake
            env[contract.LINK_ENCRYPT_ENV] = "1"
        if self.warm_restart:  # the backend keeps a standby container per host (container_backend.py)
            env[contract.WARM_RESTART_ENV] = "1"
        return env

    # --- running --------------------------------------------------------------------------------

    def run(self, dryrun: DryRun[HostTreePlan], *, owner_pid: int | None) -> JobHandle:
        """Check the engine and image, write the job directory and start its supervisor (which creates
        and starts the containers). Returns at once."""
        self._check_engine()
        self._check_image(dryrun.request.image)
        if any("--gpus" in host.create for host in dryrun.request.hosts):
            self._check_gpu_support(dryrun.spec)
        remove_job(self.docker, dryrun.job_name)  # leftovers of an earlier job of the same name (keep_containers)
        return super().run(dryrun, owner_pid=owner_pid)

    def _write_job_dir(self, dryrun: DryRun[HostTreePlan], job_dir: JobDir) -> list[HostTree]:
        trees = super()._write_job_dir(dryrun, job_dir)
        for tree in trees:
            # Mount points made now, by the caller: the engine would otherwise create them as root.
            for channel in dryrun.spec.inputs:
                tree.opt_ml.channel_dir(channel).mkdir(parents=True, exist_ok=True)
            tree.opt_ml.output_dir.mkdir(parents=True, exist_ok=True)
        # Made here so that the bind mount finds a FIFO, not a directory the engine would create.
        os.mkfifo(job_dir.path / LIFELINE, 0o600)
        for tree in trees:  # each host's scratch, the caller's alone; the supervisor removes it when the job ends
            (job_dir.path / SCRATCH / tree.host).mkdir(mode=0o700, parents=True, exist_ok=True)
        (job_dir.path / SCRATCH).chmod(0o700)
        return trees

    # --- the engine -----------------------------------------------------------------------------

    def _check_engine(self) -> None:
        try:
            docker_cli.run(self.docker, "version", "--format", "{{.Server.Version}}", timeout=30)
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

    # --- cleaning up --------------------------------------------------------------------------------

    def leftovers(self, removed: Collection[str]) -> dict[str, list[str]]:
        """Stopped containers and unused networks of this job root's jobs that are gone or in ``removed``."""
        return docker_cli.leftovers(self.docker, self.job_root, set(removed))

    def remove_leftovers(self, found: Mapping[str, list[str]]) -> None:
        docker_cli.remove_leftovers(self.docker, dict(found))

    def _has_image(self, image: str) -> bool:
        return bool(docker_cli.run(self.docker, "image", "ls", "-q", image, check=False).strip())

    def _check_gpu_support(self, spec: JobSpec) -> None:
        runtimes = docker_cli.run(self.docker, "info", "--format", "{{json .Runtimes}}", check=False)
        if "nvidia" in runtimes or shutil.which("nvidia-container-runtime-hook"):
            return
        raise UnavailableError(
            f"{spec.instance_type} needs GPUs but this Docker engine cannot pass them (no NVIDIA Container "
            "Toolkit); install nvidia-container-toolkit and restart the engine, or rehearse on CPU with "
            "DockerScheduler(gpus='none') / scheduler option gpus: none"
        )
