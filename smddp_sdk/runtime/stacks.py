"""Every rank's Python stack on request, for finding where a job hangs (``smddp-launch stacks NAME``).

The runtime passes ``STACKS_SIGNAL`` on to its ranks; each rank's bootstrap has registered faulthandler
for it, which writes every thread's stack into the rank's stacks file (``rank_stacks_file`` of its
/opt/ml tree), from the signal handler itself: it works while the rank is stuck in native code.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import stat
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from typing import IO

from smddp_sdk.specs.contract import STACKS_FILE_ENV, STACKS_SIGNAL

_open_files: list[IO[str]] = []  # faulthandler writes to the descriptor; the file must stay open


def register_stack_dump(path: str | os.PathLike[str] | None = None) -> Path | None:
    """In a rank: append every thread's stack to ``path`` (default: ``$SMDDP_STACKS_FILE``) on each
    ``STACKS_SIGNAL``. Returns the file, or None when no path is known or it cannot be opened."""
    target = path or os.environ.get(STACKS_FILE_ENV)
    if not target:
        return None
    try:
        Path(target).parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the runtime's files, whatever the rank's umask
        # Not blocking and not through a link: a FIFO left in its place would stop the rank before it ran.
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    handle = os.fdopen(fd, "a", encoding="utf-8")
    _open_files.append(handle)
    faulthandler.register(STACKS_SIGNAL, file=handle, all_threads=True, chain=False)
    return Path(target)


def forward_stack_requests(pids: Callable[[], Iterable[int]]) -> None:
    """In a runtime (main thread): pass ``STACKS_SIGNAL`` on to the ranks instead of dying of it."""
    signal.signal(STACKS_SIGNAL, lambda _signum, _frame: ask_ranks(pids()))


def ask_ranks(pids: Iterable[int]) -> None:
    """Every rank writes its stacks (``STACKS_SIGNAL``)."""
    for pid in pids:
        with suppress(ProcessLookupError):  # the rank ended meanwhile
            os.kill(pid, STACKS_SIGNAL)


class RequestFile:
    """Stacks requests as a file in a job directory every node shares (Slurm's: no one can signal the nodes'
    runtimes from the login node): each new version of the file (written atomically: a new inode) is one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = self._version()

    def _version(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_ino, found.st_mtime_ns

    def asked(self) -> bool:
        """Whether a request came since the last look."""
        version = self._version()
        new = version is not None and version != self._seen
        self._seen = version
        return new
