"""Simulated hosts as process trees on this machine: one runtime (``python -m smddp_sdk.runtime``) per host.

Each runtime leads a session of its own, so every process of a host -- the runtime, its ranks, their
children, even those that moved to another process group -- can be found and stopped by session id,
also by a ``cancel`` that runs after the supervisor died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from smddp_sdk.schedulers.hosttree.backend import TOKEN_PLACEHOLDER, HostBackend, HostExit, Output, Standby
from smddp_sdk.schedulers.hosttree.job_dir import JobDir, pick_free_ports, ports_of_live_jobs
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs import contract
from smddp_sdk.specs.failure import exit_code_of, signal_name
from smddp_sdk.specs.json_files import locked
from smddp_sdk.specs.processes import session_alive, signal_session

PORT_PLACEHOLDER = "<free port, picked at start>"
_PORT_ENVS = (contract.MASTER_PORT_ENV, contract.SERVER_PORT_ENV, contract.AGENT_PORT_ENV)

# Variables that say which job and rank a process belongs to. A job launched from inside another one
# (a notebook on SageMaker, a rank) must not inherit them; the runtime sets its own.
_IDENTITY_PREFIXES = ("SM_", "SMDATAPARALLEL_", "TORCHELASTIC_")
_IDENTITY_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "NODE_RANK", "ROLE_RANK", "TRAINING_JOB_NAME", contract.ERROR_FILE_ENV, contract.BASE_DIR_ENV,
    contract.LIFELINE_ENV, contract.PARENT_PID_ENV,
})


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without another job's identity (the spec's ``environment`` is added after)."""
    return {key: value for key, value in environ.items() if key not in _IDENTITY_NAMES and not key.startswith(_IDENTITY_PREFIXES)}


class ProcessBackend(HostBackend):
    def __init__(self, job_dir: JobDir, plan: HostTreePlan) -> None:
        super().__init__(job_dir, plan)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    def prepare(self, attempt_env: Mapping[str, str]) -> dict[str, Any]:
        job_root = self.job_dir.path.parent
        with locked(job_root / ".ports.lock"):  # two jobs starting together cannot pick the same ports
            picked = pick_free_ports(len(_PORT_ENVS), exclude=ports_of_live_jobs(job_root, skip=self.job_dir.path))
            self.ports = dict(zip(_PORT_ENVS, picked))
            # Recorded before the lock is released, so the next job's pick skips them.
            state = self.job_dir.read_state()
            self.job_dir.write_state({**state, "ports": self.ports})
        return {"ports": self.ports}

    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        assert self.plan.process is not None, "a process job's plan says how its hosts start"
        env = self._environment(host)
        env.update({key: str(self.ports[key]) for key, value in self.plan.environment(host).items() if value == PORT_PLACEHOLDER})
        env[contract.JOB_TOKEN_ENV] = self.token
        env.update(extra_env)
        standby = self.standbys.pop(host, None)
        warm = standby is not None and standby.wake(env, lambda raw: output(host, raw))
        if standby is not None and warm:
            process = standby.process
            self.readers.append(standby.reader)
        else:
            process = subprocess.Popen(list(self.plan.process.command), env=env, cwd=self.plan.host(host).opt_ml, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self._copy_output(host, process, output)
        self.processes[host] = process
        return {"pid": process.pid, "warm": warm}

    def _environment(self, host: str) -> dict[str, str]:
        """A host runtime's environment as planned, without the attempt's ports, token and extras."""
        planned = self.plan.environment(host)
        env = inherited_env(os.environ)
        env.update({key: value for key, value in planned.items() if value not in (PORT_PLACEHOLDER, TOKEN_PLACEHOLDER)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [planned.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))
        env[contract.PARENT_PID_ENV] = str(os.getpid())  # the runtime dies with us (PR_SET_PDEATHSIG)
        return env

    def start_standbys(self) -> None:
        """A standby runtime per host for the next attempt, its spare ranks importing torch while this one runs."""
        assert self.plan.process is not None
        if self.plan.process.environment.get(contract.WARM_RESTART_ENV) != "1":
            return
        spares = str(self.plan.ranks.processes_per_host or 1)
        for host in self.plan.hosts:
            if host.host not in self.standbys:
                env = {**self._environment(host.host), contract.STANDBY_ENV: spares}
                self.standbys[host.host] = Standby(subprocess.Popen(
                    list(self.plan.process.command), env=env, cwd=host.opt_ml, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
                ))

    def poll(self, host: str) -> HostExit | None:
        if host in self.exits:
            return self.exits[host]
        code = self.processes[host].poll()
        if code is None:
            return None
        # Whatever the runtime left in its session (a rank's stray child) goes with it.
        signal_session(self.processes[host].pid, signal.SIGKILL)
        self.exits[host] = HostExit(exit_code_of(code), signal_name(-code) if code < 0 else None, time.time())
        return self.exits[host]

    def signal(self, host: str, sig: int) -> None:
        """SIGTERM (and SIGINT) go to the runtime alone: it forwards them to its ranks and marks them
        stopped, so a stopped rank never reads as a failure. SIGKILL, or any signal once the runtime is
        gone, reaches every process of the host's session."""
        process = self.processes.get(host)
        if process is None:
            return
        if sig != signal.SIGKILL and process.poll() is None:
            try:
                os.kill(process.pid, sig)
                return
            except ProcessLookupError:
                pass
        signal_session(process.pid, sig)

    def release(self, *, keep: bool = False) -> None:
        for process in self.processes.values():
            signal_session(process.pid, signal.SIGKILL)

    @classmethod
    def stop_orphans(cls, job_dir: JobDir, state: Mapping[str, Any]) -> None:
        grace = job_dir.plan.grace
        sessions = [int(host["pid"]) for host in (state.get("hosts") or {}).values() if host.get("pid")]
        # A session id outlives its leader while members remain, so the sweep also finds the ranks of
        # a runtime that was itself killed. SIGTERM first: runtimes stop their ranks and write why.
        for session in sessions:
            signal_session(session, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(session_alive(session) for session in sessions):
            time.sleep(0.05)
        for session in sessions:
            signal_session(session, signal.SIGKILL)
