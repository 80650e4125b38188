"""Rank processes: one process group per rank tree, stopped group-wide.

Ranks get their own process group but stay in the runtime's session, so a scheduler can still sweep
everything a host ran by its session id even if the runtime itself is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from smddp_sdk.runtime.logs import Console, LogPump, rank_prefix
from smddp_sdk.runtime.plan import RankSlot
from smddp_sdk.specs.contract import torchelastic_error_file


@dataclass
class RankProcess:
    slot: RankSlot
    popen: subprocess.Popen[bytes]
    pump: LogPump
    error_file: Path
    returncode: int | None = None
    exited_at: float | None = None
    stopped: bool = field(default=False)  # the runtime signalled it; its exit is not a root cause

    @property
    def running(self) -> bool:
        return self.returncode is None

    def poll(self) -> bool:
        """Reap the process if it exited; True on the first observation of its exit."""
        if self.returncode is not None:
            return False
        if self.popen.returncode is None:
            if os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return False
            # While the leader is an unreaped zombie its pid cannot be reused, so this reaches only its
            # own leftover children: no rank tree outlives its rank.
            signal_groups([self], signal.SIGKILL)
        self.returncode, self.exited_at = self.popen.wait(), time.time()
        return True


def spawn_rank(slot: RankSlot, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: BinaryIO, error_file: Path, console: Console) -> RankProcess:
    error_file.unlink(missing_ok=True)  # a stale record from an earlier run must not be mistaken for this one
    torchelastic_error_file(error_file).unlink(missing_ok=True)
    error_file.parent.mkdir(parents=True, exist_ok=True)  # torch's @record writes without creating it
    popen = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group to stop it by, and its own scheduler autogroup, as torchrun's workers
    )
    assert popen.stdout is not None
    pump = LogPump(popen.stdout, log, rank_prefix(slot.host, slot.rank), console)
    return RankProcess(slot, popen, pump, error_file)


def signal_groups(procs: Iterable[RankProcess], sig: signal.Signals) -> None:
    for proc in procs:
        with suppress(ProcessLookupError, PermissionError):  # the whole group is gone already
            os.killpg(proc.popen.pid, sig)


def stop_ranks(procs: Sequence[RankProcess], grace: float, sig: signal.Signals = signal.SIGTERM) -> None:
    """``sig`` to every rank's group, SIGKILL to what is left after ``grace`` seconds."""
    alive = [p for p in procs if p.running]
    for proc in alive:
        proc.stopped = True
    signal_groups(alive, sig)
    signal_groups(alive, signal.SIGCONT)  # a frozen rank (SIGSTOP, a debugger) must get it now, not at SIGKILL
    deadline = time.monotonic() + grace
    while any(p.running for p in alive) and time.monotonic() < deadline:
        for proc in alive:
            proc.poll()
        time.sleep(0.05)
    reap_groups(procs)


def reap_groups(procs: Sequence[RankProcess], pump_timeout: float = 5.0) -> None:
    """SIGKILL every rank still running (and its group), reap it, and wait for the log pumps."""
    running = [p for p in procs if p.running]
    signal_groups(running, signal.SIGKILL)
    for proc in running:
        proc.poll()  # SIGKILLed above, so this returns at once
        if proc.running:
            proc.returncode, proc.exited_at = proc.popen.wait(), time.time()
    for proc in procs:
        proc.pump.join(pump_timeout)
    if os.getpid() == 1:
        reap_orphans()


def reap_orphans() -> None:
    """As a container's PID 1 we inherit every orphan; collect the ones that died so none stays a zombie.

    Only called once every rank has been reaped, so it cannot take an exit status a Popen still waits for.
    """
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, expected_parent: str | None) -> bool:
    """Ask Linux to send us ``sig`` when our parent dies (PR_SET_PDEATHSIG), if our parent is the
    process ``expected_parent`` names -- so that nothing outlives the process that started it.

    The parent may have died before the call; the pid check afterwards closes that gap. Elsewhere
    (macOS, no libc) this does nothing and the lifeline and session sweeps still apply.
    """
    if not expected_parent or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if str(os.getppid()) != expected_parent:  # it died before the request took effect
        os.kill(os.getpid(), sig)
    return True
