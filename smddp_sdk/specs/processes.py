"""Processes as /proc shows them: the one place that reads it (stdlib only, as the runtime needs).

Used by the runtime (stale scratch of dead runtimes), the host-tree schedulers (supervisors, a host's
session of processes) and the collectives (peers of a shared-memory group, how busy the machine is). Where /proc is missing
(macOS) the answers fall back to what signals can tell.
"""

from __future__ import annotations

import os
import select
from contextlib import suppress
from pathlib import Path

from smddp_sdk.specs import contract

PROC = Path("/proc")


class Wakeup:
    """Wakes a polling loop early; safe to call from a signal handler. ``threading.Event.set`` takes a lock
    that the interrupted thread may hold (a handler run inside ``Event.wait`` or ``clear`` deadlocks on it
    for good); a write to a pipe takes none."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # not inherited by children (PEP 446)
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)

    def set(self) -> None:
        with suppress(OSError):  # full: a wake-up is pending anyway
            os.write(self._write, b"\0")

    def wait(self, timeout: float) -> None:
        """Until set (since the last wait) or ``timeout`` seconds have passed; then clears it."""
        select.select([self._read], [], [], timeout)
        with suppress(OSError):  # drained
            while os.read(self._read, 4096):
                pass


def runnable_tasks(loadavg: str | None = None) -> float:
    """Tasks runnable on the machine now, the caller included (/proc/loadavg's fourth field, "4/512":
    no lag, unlike the load averages); the 1-minute load average where /proc has none."""
    with suppress(OSError, IndexError, ValueError):
        text = (PROC / "loadavg").read_text() if loadavg is None else loadavg
        return float(text.split()[3].split("/")[0])
    return os.getloadavg()[0]


def state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``Z`` zombie, ``T``/``t`` stopped), None when unknown."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def pid_alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (killed, not yet reaped by its parent)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return state(pid) != "Z"


def is_stopped(pid: int) -> bool:
    """Stopped by SIGSTOP or a debugger: it will not answer whatever we wait."""
    return state(pid) in ("T", "t")


def command_line(pid: int) -> list[str] | None:
    """The process's argv, None where it cannot be read (no /proc, gone)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return [arg for arg in raw.split("\0") if arg]


def session_members(session_id: int) -> list[int]:
    """Every live process of a session: a leader, its children and theirs, even those that moved to a
    process group of their own, and the ranks that lead sessions of their own (one scheduler autogroup
    per rank, as torchrun's workers) but carry the host's session id in SMDDP_HOST_SESSION."""
    marker = f"{contract.HOST_SESSION_ENV}={session_id}\0".encode()
    members = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            if fields[0] != "Z" and (int(fields[3]) == session_id or marker in (entry / "environ").read_bytes()):
                members.append(int(entry.name))
        except OSError:
            continue
    return members


def session_alive(session_id: int) -> bool:
    return bool(session_members(session_id)) if PROC.is_dir() else pid_alive(session_id)


def signal_session(session_id: int, sig: int) -> None:
    """Signal a whole session; where /proc is missing (or shows none of it), its process group."""
    targets = session_members(session_id) if PROC.is_dir() else []
    for pid in targets:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    if not targets:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(session_id, sig)
