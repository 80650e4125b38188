"""The small interface the host supervisor starts, watches and stops hosts through.

A backend knows how to run one host's runtime (a process tree here, a container there); everything
else -- when to stop, who is to blame, artifacts, the job's state -- is the supervisor's, once for all.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan

# Called with (host, one raw output line) from the backend's reader threads.
Output = Callable[[str, bytes], None]


@dataclass(frozen=True)
class HostExit:
    """How a host's runtime ended: its shell-style exit code, the signal that killed it, and when."""

    code: int
    signal: str | None
    ended: float
    detail: str = ""  # e.g. "the container was killed for running out of memory"


class HostBackend(abc.ABC):
    """Runs the hosts of one job. Built by the supervisor from the job record (``backend`` key)."""

    name: ClassVar[str]

    def __init__(self, job_dir: JobDir, request: Mapping[str, Any]) -> None:
        self.job_dir = job_dir
        self.plan = HostTreePlan.from_request(request)

    def prepare(self) -> None:
        """Whatever must exist before the first host starts (a network, the containers)."""

    @abc.abstractmethod
    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        """Start one host's runtime; returns what ``state.json`` records about it (a pid, a container)."""

    @abc.abstractmethod
    def poll(self, host: str) -> HostExit | None:
        """None while the host runs; how it ended once it has."""

    @abc.abstractmethod
    def signal(self, host: str, sig: int) -> None:
        """Send ``sig`` to every process of the host (its runtime, its ranks and their children)."""

    def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every host's output has been copied."""

    def release(self, *, keep: bool = False) -> None:
        """After the job: sweep what is left (stray processes, containers, the network)."""

    @classmethod
    def stop_orphans(cls, job_dir: JobDir, record: Mapping[str, Any], state: Mapping[str, Any], grace: float) -> None:
        """Stop a job whose supervisor is gone or frozen, from what the job directory recorded."""
