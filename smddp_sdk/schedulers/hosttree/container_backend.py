"""One docker container per host (``algo-1..N``) on the job's bridge network, through the docker CLI.

The scheduler planned every ``docker create`` argv (see ``DockerScheduler.dryrun``); this backend runs
them, attaches to each container's output (``docker start -a``), reads exit codes with ``docker
inspect``, signals with ``docker kill -s`` and removes containers and network afterwards. Containers
carry the ``ai.smddp.job`` label, so a ``cancel`` without a supervisor still finds them.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from smddp_sdk.schedulers.hosttree import docker_cli
from smddp_sdk.schedulers.hosttree.backend import HostBackend, HostExit, Output
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs import contract
from smddp_sdk.specs.failure import signal_name

_INSPECT_EVERY = 1.0  # seconds between inspections of a container whose attach ended early


class ContainerBackend(HostBackend):
    def __init__(self, job_dir: JobDir, plan: HostTreePlan) -> None:
        super().__init__(job_dir, plan)
        self.docker = self.plan.docker_cli
        self.attached: dict[str, subprocess.Popen[bytes]] = {}
        self.inspected_at: dict[str, float] = {}

    def prepare(self, attempt_env: Mapping[str, str]) -> dict[str, Any]:
        docker_cli.run(self.docker, *self.plan.network)
        for item in self.plan.hosts:  # the plan's ``-e SMDDP_JOB_TOKEN`` (and the attempt's variables) take their values from the client's environment
            docker_cli.run(self.docker, *item.create, env={**attempt_env, contract.JOB_TOKEN_ENV: self.token})
        return {"containers": [item.container for item in self.plan.hosts]}

    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        name = self.plan.host(host).container
        # The attach client is ours (it dies with us); the container lives on its own, which is why the
        # runtime inside also watches the lifeline FIFO mounted into it.
        process = subprocess.Popen([self.docker, "start", "-a", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.attached[host] = process
        self._copy_output(host, process, output)
        return {"container": name}

    def poll(self, host: str) -> HostExit | None:
        if host in self.exits:
            return self.exits[host]
        if self.attached[host].poll() is None:
            return None
        now = time.monotonic()
        if now - self.inspected_at.get(host, 0.0) < _INSPECT_EVERY and host in self.inspected_at:
            return None
        self.inspected_at[host] = now
        state = self._inspect(host)
        if state is None or state.get("Running") or state.get("Status") == "created":
            return None
        code = int(state.get("ExitCode", 1))
        detail = "the container was killed for running out of memory" if state.get("OOMKilled") else ""
        self.exits[host] = HostExit(code, signal_name(code - 128) if code > 128 else None, _epoch(state.get("FinishedAt", "")) or time.time(), detail)
        return self.exits[host]

    def signal(self, host: str, sig: int) -> None:
        docker_cli.run(self.docker, "kill", "-s", str(int(sig)), self.plan.host(host).container, check=False, timeout=30)

    def drain(self, timeout: float) -> None:
        super().drain(timeout)
        for process in self.attached.values():
            if process.poll() is None:
                process.kill()
            process.wait()

    def release(self, *, keep: bool = False) -> None:
        if not keep and not self.plan.keep_containers:
            docker_cli.remove_job(self.docker, self.plan.job_name)

    @classmethod
    def stop_orphans(cls, job_dir: JobDir, state: Mapping[str, Any]) -> None:
        plan = job_dir.plan
        docker, job, grace = plan.docker_cli, plan.job_name, plan.grace
        names = docker_cli.run(docker, "ps", "-q", "--filter", f"label={docker_cli.LABEL_JOB}={job}", check=False).split()
        if names:
            docker_cli.run(docker, "stop", "-t", str(int(grace)), *names, check=False, timeout=grace + 60)
        if not plan.keep_containers:
            docker_cli.remove_job(docker, job)

    def _inspect(self, host: str) -> dict[str, Any] | None:
        text = docker_cli.run(self.docker, "inspect", "--format", "{{json .State}}", self.plan.host(host).container, check=False)
        try:
            state = json.loads(text)
        except ValueError:
            return None
        return state if isinstance(state, dict) else None


def _epoch(stamp: str) -> float | None:
    # Docker prints nanoseconds ("2026-11-22T03:15:06.123456789Z"); datetime takes microseconds.
    if not stamp or stamp.startswith("0001-"):
        return None
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{fraction or 0}")
