"""One docker container per host (``algo-1..N``) on the job's bridge network, through the docker CLI.

The scheduler planned every ``docker create`` argv (see ``DockerScheduler.dryrun``); this backend runs
them, attaches to each container's output (``docker start -a``), reads exit codes with ``docker
inspect``, signals with ``docker kill -s`` and removes containers and network afterwards. Containers
carry the ``ai.smddp.job`` label, so a ``cancel`` without a supervisor still finds them.

With ``warm_restart``, restart N of a job (``TORCHELASTIC_RESTART_COUNT``) runs on a network and in
containers of its own (``<network>-rN``, ``<container>-rN``; restart 0 has the planned names), so the next
attempt's standby containers can be made while this one trains without meeting it: a standby is a
``docker run -i`` of the host's planned argv with ``SMDDP_STANDBY_SPARES``, its runtime's spare ranks
import torch and it waits on its stdin for the attempt's token and restart count (runtime/main.py).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from smddp_sdk.errors import UnavailableError
from smddp_sdk.schedulers.hosttree import docker_cli
from smddp_sdk.schedulers.hosttree.backend import HostBackend, HostExit, Output, Standby
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
        self.restart = 0  # this attempt's restart count: which network and container names it uses
        self.attempt_env: dict[str, str] = {}
        self.ahead: set[str] = set()  # the next attempt's network and standby containers, made by this backend
        self.warm = f"{contract.WARM_RESTART_ENV}=1" in (plan.hosts[0].create if plan.hosts else ())

    # --- names of a restart ------------------------------------------------------------------------

    def network(self, restart: int) -> str:
        return self.plan.network[-1] + _suffix(restart, self.warm)

    def container(self, host: str, restart: int | None = None) -> str:
        restart = self.restart if restart is None else restart
        return self.plan.host(host).container + _suffix(restart, self.warm)

    def argv(self, host: str, restart: int, command: str = "create", *extra: str) -> list[str]:
        """The host's planned ``docker create`` argv with ``restart``'s names, as ``command``, ``extra`` before the image."""
        planned = self.plan.host(host).create
        renamed = {"--name": self.container(host, restart), "--network": self.network(restart)}
        body = [renamed.get(planned[index - 1], word) for index, word in enumerate(planned[1:-2], start=1)]
        return [command, *body, *extra, *planned[-2:]]

    # --- the attempt ---------------------------------------------------------------------------------

    def prepare(self, attempt_env: Mapping[str, str]) -> dict[str, Any]:
        self.attempt_env = dict(attempt_env)
        self.restart = int(attempt_env.get(contract.RESTART_COUNT_ENV, "0") or 0)
        if not self.standbys:  # standbys came with their network
            docker_cli.run(self.docker, *self.plan.network[:-1], self.network(self.restart))
        for item in self.plan.hosts:
            if item.host not in self.standbys:
                self.create(item.host)
        return {"containers": [self.container(item.host) for item in self.plan.hosts]}

    def create(self, host: str) -> None:
        # The plan's ``-e SMDDP_JOB_TOKEN`` (and the attempt's variables) take their values from the client's environment.
        docker_cli.run(self.docker, *self.argv(host, self.restart), env={**self.attempt_env, contract.JOB_TOKEN_ENV: self.token})

    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        name = self.container(host)
        standby = self.standbys.pop(host, None)
        woken = standby is not None and standby.process.poll() is None and standby.wake({**extra_env, contract.JOB_TOKEN_ENV: self.token}, lambda raw: output(host, raw))
        if standby is not None and woken:
            self.attached[host] = standby.process
            self.readers.append(standby.reader)
            return {"container": name, "warm": True}
        if standby is not None:  # it failed: removed, and the host starts cold in a container of the same name
            standby.drop()
            output(host, f"smddp: the standby container of {host} had ended; {host} starts cold".encode())
            self.create(host)
        # The attach client is ours (it dies with us); the container lives on its own, which is why the
        # runtime inside also watches the lifeline FIFO mounted into it.
        process = subprocess.Popen([self.docker, "start", "-a", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.attached[host] = process
        self._copy_output(host, process, output)
        return {"container": name, "warm": False}

    def start_standbys(self) -> None:
        """The next attempt's network and a standby container per host on it, its spare ranks importing
        torch while this attempt trains (only the network is made here; each ``docker run`` goes on by itself)."""
        if not self.warm or self.standbys:
            return
        restart = self.restart + 1
        try:
            docker_cli.run(self.docker, *self.plan.network[:-1], self.network(restart))
        except UnavailableError:  # no standbys this time: the next attempt starts cold, as without warm_restart
            return
        self.ahead.add(self.network(restart))
        spares = str(self.plan.ranks.processes_per_host or 1) if self.plan.ranks else "1"
        for item in self.plan.hosts:
            name = self.container(item.host, restart)
            self.ahead.add(name)
            argv = self.argv(item.host, restart, "run", "-i", "-e", f"{contract.STANDBY_ENV}={spares}")
            process = subprocess.Popen([self.docker, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self.standbys[item.host] = ContainerStandby(process, self.docker, name)

    def drop_standbys(self) -> None:
        super().drop_standbys()
        network = self.network(self.restart + 1)
        if network in self.ahead:
            docker_cli.run(self.docker, "network", "rm", network, check=False)
        self.ahead.clear()

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
        docker_cli.run(self.docker, "kill", "-s", str(int(sig)), self.container(host), check=False, timeout=30)

    def drain(self, timeout: float) -> None:
        super().drain(timeout)
        for process in self.attached.values():
            if process.poll() is None:
                process.kill()
            process.wait()

    def release(self, *, keep: bool = False) -> None:
        """Every container and network of the job, but the next attempt's standbys and their network (handed on)."""
        if not keep and not self.plan.keep_containers:
            docker_cli.remove_job(self.docker, self.plan.job_name, sparing=self.ahead)

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
        text = docker_cli.run(self.docker, "inspect", "--format", "{{json .State}}", self.container(host), check=False)
        try:
            state = json.loads(text)
        except ValueError:
            return None
        return state if isinstance(state, dict) else None


class ContainerStandby(Standby):
    """A standby container: its ``docker run -i`` client is the process; dropping it removes the container."""

    def __init__(self, process: subprocess.Popen[bytes], docker: str, container: str) -> None:
        super().__init__(process)
        self.docker, self.container = docker, container

    def drop(self) -> None:
        docker_cli.run(self.docker, "rm", "-f", self.container, check=False)
        super().drop()


def _suffix(restart: int, warm: bool) -> str:
    """A restart's names: its own with warm_restart (its standbys are made beside the attempt before), the plan's otherwise."""
    return f"-r{restart}" if restart and warm else ""


def _epoch(stamp: str) -> float | None:
    # Docker prints nanoseconds ("2026-11-22T03:15:06.123456789Z"); datetime takes microseconds.
    if not stamp or stamp.startswith("0001-"):
        return None
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{fraction or 0}")
