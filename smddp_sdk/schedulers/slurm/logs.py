"""A Slurm job's output: one file per node (``logs/<node>.log``) and the batch script's (``batch.log``).

The node runtime prefixes its lines (``[n1/rank0]:``) as on every other scheduler; a line without a prefix
(srun's own messages, the batch script's) belongs to the file's node (``batch`` for the batch script).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from smddp_sdk.specs import contract
from smddp_sdk.specs.status import LogLine

POLL = 0.2
STATUS_EVERY = 1.0  # the finished() check asks Slurm: not on every poll


def job_lines(logs_dir: Path, finished: Callable[[], bool]) -> Iterator[LogLine]:
    """Every file's lines, each file in order; new files and lines are picked up until ``finished()``."""
    files: dict[Path, tuple[IO[str], list[str]]] = {}
    last_check = 0.0
    with ExitStack() as opened:
        while True:
            now = time.monotonic()
            done = now - last_check >= STATUS_EVERY and finished()  # checked before draining: no last line lost
            last_check = now if now - last_check >= STATUS_EVERY else last_check
            for path in sorted(logs_dir.glob("*.log")) if logs_dir.is_dir() else ():
                if path not in files:
                    files[path] = (opened.enter_context(open(path, encoding="utf-8", errors="replace")), [""])
                handle, pending = files[path]
                while chunk := handle.readline():
                    pending[0] += chunk
                    if pending[0].endswith("\n"):
                        yield contract.parse_console_line(pending[0], path.stem)
                        pending[0] = ""
            if done:
                for path, (_, pending) in files.items():
                    if pending[0]:
                        yield contract.parse_console_line(pending[0], path.stem)
                return
            time.sleep(POLL)
