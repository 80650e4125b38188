"""Rank processes: one process group per rank tree, stopped group-wide.

Ranks get their own process group but stay in the runtime's session, so a scheduler can still sweep
everything a host ran by its session id even if the runtime itself is killed.

A rank is started cold (a new interpreter) or from a spare: a process started ahead with torch imported
(``smddp_sdk.collectives.spare``, never imported here) that becomes the rank when handed its request.
"""

from __future__ import annotations

import json
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
from smddp_sdk.runtime.usercode import BOOTSTRAP_MODULE
from smddp_sdk.specs.contract import PARENT_PID_ENV, RANK_UMASK, torchelastic_error_file

SPARE_MODULE = "smddp_sdk.collectives.spare"
SPARE_READY_FD_ENV = "SMDDP_SPARE_READY_FD"  # the spare's READY_FD_ENV


@dataclass
class RankProcess:
    slot: RankSlot
    popen: subprocess.Popen[bytes]
    pump: LogPump
    error_file: Path
    returncode: int | None = None
    exited_at: float | None = None
    stopped: bool = field(default=False)  # the runtime signalled it; its exit is not a root cause
    warm: bool = False  # it was a spare (torch imported before it was needed)

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


@dataclass(frozen=True)
class Spare:
    """A process started ahead by ``start_spare``: ``python`` with torch imported, waiting on its stdin."""

    popen: subprocess.Popen[bytes]
    python: str
    ready_fd: int  # the spare writes one byte here once warm

    def wait_ready(self) -> bool:
        """Block until it is warm; False when it ended instead (no torch in this interpreter, a crash)."""
        try:
            return os.read(self.ready_fd, 1) == b"1"
        except OSError:
            return False
        finally:
            os.close(self.ready_fd)

    def can_run(self, argv: Sequence[str]) -> bool:
        """Only what it is: the rank bootstrap on its own interpreter (not a script's virtualenv), still alive."""
        return list(argv[:3]) == [self.python, "-m", BOOTSTRAP_MODULE] and self.popen.poll() is None


def start_spare(python: str, env: Mapping[str, str]) -> Spare:
    ready, theirs = os.pipe()
    try:
        popen = subprocess.Popen(
            [python, "-m", SPARE_MODULE],
            env={**env, PARENT_PID_ENV: str(os.getpid()), SPARE_READY_FD_ENV: str(theirs)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(theirs,),
            start_new_session=True,  # as a cold rank's: its group is the rank's once it becomes one
        )
    finally:
        os.close(theirs)
    return Spare(popen, python, ready)


def drop_spares(spares: Iterable[Spare]) -> None:
    """Spares no rank needed: their stdin closes (they end quietly) and their group is killed."""
    for spare in spares:
        with suppress(OSError):
            assert spare.popen.stdin is not None
            spare.popen.stdin.close()
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(spare.popen.pid, signal.SIGKILL)
        spare.popen.wait()


def spawn_rank(slot: RankSlot, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: BinaryIO, error_file: Path, console: Console, spare: Spare | None = None) -> RankProcess:
    """Start one rank: in ``spare`` when it can run ``argv``, else as a new process."""
    error_file.unlink(missing_ok=True)  # a stale record from an earlier run must not be mistaken for this one
    torchelastic_error_file(error_file).unlink(missing_ok=True)
    error_file.parent.mkdir(parents=True, exist_ok=True)  # torch's @record writes without creating it
    if spare is not None and spare.can_run(argv):
        popen = spare.popen
        assert popen.stdin is not None
        with suppress(BrokenPipeError):  # it died just now: its exit shows as the rank's
            popen.stdin.write(json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd)}).encode())
            popen.stdin.close()
    else:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group to stop it by, and its own scheduler autogroup, as torchrun's workers
            umask=RANK_UMASK,
        )
    assert popen.stdout is not None
    pump = LogPump(popen.stdout, log, rank_prefix(slot.host, slot.rank), console)
    return RankProcess(slot, popen, pump, error_file, warm=popen is (spare.popen if spare else None))


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
