"""A Slurm job's output: one file per node (``logs/<node>.log``) and the batch script's (``batch.log``).

The node runtime prefixes its lines (``[n1/rank0]:``) as on every other scheduler; a line without a prefix
(srun's own messages, the batch script's) belongs to the file's node (``batch`` for the batch script).

A cancel (``scancel``, ``smddp-launch cancel``) is a stop, not a failure, as on every scheduler: from Slurm's
mark of it (``*** JOB 12 ON n1 CANCELLED AT <time> ***``) on, a file's lines from Slurm itself (a task's
``Exited with exit code 143``, ``Terminated``) are its consequences and are left out, and the mark reads as
``cancelled at <time>``. Slurm's lines before it (a real failure's) and after any other ending (``CANCELLED
AT ... DUE TO TIME LIMIT``, a requeue) stay.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from smddp_sdk.specs import contract
from smddp_sdk.specs.status import LogLine

# Slurm's mark of a cancel by a user, in the batch log and the nodes' files (slurmstepd); "DUE TO ..." is another ending.
_CANCELLED = re.compile(r"^slurmstepd(?:-\S+)?: error: \*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+) \*\*\*$")
_FROM_SLURM = re.compile(r"^(?:srun|slurmstepd(?:-\S+)?|sbatch|salloc): ")
POLL = 0.2
STATUS_EVERY = 1.0  # the finished() check asks Slurm: not on every poll


def job_lines(logs_dir: Path, finished: Callable[[], bool]) -> Iterator[LogLine]:
    """Every file's lines, each file in order; new files and lines are picked up until ``finished()``."""
    files: dict[Path, tuple[IO[str], list[str], CancelFilter]] = {}
    last_check = 0.0
    with ExitStack() as opened:
        while True:
            now = time.monotonic()
            done = now - last_check >= STATUS_EVERY and finished()  # checked before draining: no last line lost
            last_check = now if now - last_check >= STATUS_EVERY else last_check
            for path in sorted(logs_dir.glob("*.log")) if logs_dir.is_dir() else ():
                if path not in files:
                    files[path] = (opened.enter_context(open(path, encoding="utf-8", errors="replace")), [""], CancelFilter())
                handle, pending, cancel = files[path]
                while chunk := handle.readline():
                    pending[0] += chunk
                    if pending[0].endswith("\n"):
                        yield from cancel.shown(contract.parse_console_line(pending[0], path.stem))
                        pending[0] = ""
            if done:
                for path, (_, pending, cancel) in files.items():
                    if pending[0]:
                        yield from cancel.shown(contract.parse_console_line(pending[0], path.stem))
                return
            time.sleep(POLL)


class CancelFilter:
    """One file's lines as a cancel reads (see the module's docstring): Slurm's lines after its cancel mark go."""

    def __init__(self) -> None:
        self.cancelled = False

    def shown(self, line: LogLine) -> list[LogLine]:
        if line.rank is not None or not _FROM_SLURM.match(line.text):
            return [line]  # the job's own lines, the runtime's included, always
        mark = _CANCELLED.match(line.text)
        if mark:
            first, self.cancelled = not self.cancelled, True
            return [LogLine(line.host, f"cancelled at {mark[1]}")] if first else []
        return [] if self.cancelled else [line]
