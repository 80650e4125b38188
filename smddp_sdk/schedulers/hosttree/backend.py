"""The small interface the host supervisor starts, watches and stops hosts through.

A backend knows how to run one host's runtime (a process tree here, a container there); everything
else -- when to stop, who is to blame, artifacts, the job's state -- is the supervisor's, once for all.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs import contract

# Called with (host, one raw output line) from the backend's reader threads.
Output = Callable[[str, bytes], None]

TOKEN_PLACEHOLDER = "<random, made at start>"


@dataclass(frozen=True)
class HostExit:
    """How a host's runtime ended: its shell-style exit code, the signal that killed it, and when."""

    code: int
    signal: str | None
    ended: float
    detail: str = ""  # e.g. "the container was killed for running out of memory"


class HostBackend(abc.ABC):
    """Runs the hosts of one job. Built by the supervisor from the job's plan (its ``backend``)."""

    def __init__(self, job_dir: JobDir, plan: HostTreePlan) -> None:
        self.job_dir = job_dir
        self.plan = plan
        self.readers: list[threading.Thread] = []
        self.exits: dict[str, HostExit] = {}  # the hosts seen to end, kept: each ends once
        # The job's secret (SMDDP_JOB_TOKEN), random and shared by every host of one attempt: each attempt
        # builds a new backend and starts every host afresh, so hosts of different attempts never meet.
        # Never on a command line (other users read /proc/*/cmdline) and never written down.
        self.token = secrets.token_hex(16)
        # Warm restart: a runtime per host started ahead for the next attempt (its spares import torch while
        # this attempt trains); handed from one attempt's backend to the next by the supervisor.
        self.standbys: dict[str, Standby] = {}

    def prepare(self, attempt_env: Mapping[str, str]) -> None:
        """Whatever must exist before the first host starts (a network, the containers); ``attempt_env`` is
        what every host of this attempt gets in its environment (``start``'s ``extra_env`` has it too)."""

    @abc.abstractmethod
    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        """Start one host's runtime; returns what ``state.json`` records about it (a pid, a container)."""

    @abc.abstractmethod
    def poll(self, host: str) -> HostExit | None:
        """None while the host runs; how it ended once it has."""

    @abc.abstractmethod
    def signal(self, host: str, sig: int) -> None:
        """Send ``sig`` to every process of the host (its runtime, its ranks and their children)."""

    def forget(self, host: str) -> None:
        """The host is started again (replaced alone, ``survive_host_loss``): its old end is no longer its end."""
        self.exits.pop(host, None)

    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every host's output has been copied."""
        deadline = time.monotonic() + timeout
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))

    def _copy_output(self, host: str, process: subprocess.Popen[bytes], output: Output) -> None:
        """Hand every line the process prints to ``output``, from a thread of its own."""
        assert process.stdout is not None
        reader = threading.Thread(target=_copy, args=(host, process.stdout, output), name=f"output {host}", daemon=True)
        reader.start()
        self.readers.append(reader)

    def release(self, *, keep: bool = False) -> None:
        """After the job: sweep what is left (stray processes, containers, the network)."""

    def start_standbys(self) -> None:
        """Start the next attempt's standbys (a process per host, or a container) when the plan asks for warm restarts."""

    def drop_standbys(self) -> None:
        """Standbys no attempt will use: their stdin closes (they end quietly), their sessions are killed."""
        for standby in self.standbys.values():
            standby.drop()
        self.standbys = {}

    def standbys_ready(self) -> bool:
        return bool(self.standbys) and all(standby.ready.is_set() for standby in self.standbys.values())

    @classmethod
    def stop_orphans(cls, job_dir: JobDir, state: Mapping[str, Any]) -> None:
        """Stop a job whose supervisor is gone or frozen, from what the job directory recorded (its plan, its state)."""


class Standby:
    """A host's runtime started ahead (warm restart). Its output is read from the start: ``ready`` is set at
    ``STANDBY_READY`` (a line not shown), and what it printed before it was woken is kept and shown then."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._kept: list[bytes] = []
        self._output: Callable[[bytes], None] | None = None
        self.reader = threading.Thread(target=self._read, name="standby", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            if not self.ready.is_set() and raw.decode(errors="replace").strip() == contract.STANDBY_READY:
                self.ready.set()
                continue
            with self._lock:  # in order with the kept lines ``wake`` hands on
                if self._output is None:
                    self._kept.append(raw)
                else:
                    self._output(raw)
        self.process.stdout.close()

    def wake(self, environment: Mapping[str, str], output: Callable[[bytes], None]) -> bool:
        """Give it its attempt's environment (through its stdin) and its output from now on; False when it is gone."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(dict(environment)).encode())
            self.process.stdin.close()
        except OSError:  # it died just now
            self.drop()
            return False
        with self._lock:
            for raw in self._kept:
                output(raw)
            self._kept, self._output = [], output
        return True

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _copy(host: str, stream: IO[bytes], output: Output) -> None:
    for raw in iter(stream.readline, b""):
        output(host, raw)
    stream.close()
