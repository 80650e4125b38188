"""A local or docker job's ``console.log`` with the time each line was captured.

The supervisor writes every host's output line into ``console.log`` and, just before it, the capture
time (Unix seconds) as one line of ``console.times`` beside it: line N of one belongs to line N of the
other, and the log stays plain text for people. ``logs`` reads both (``-t``, ``--since``, metrics).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from smddp_sdk.schedulers.hosttree.job_dir import follow_lines


def times_path(log: Path) -> Path:
    return log.with_suffix(".times")


class StampedLog:
    """Appends lines to the log, each stamped in the times file (written first, so a reader that sees
    a line finds its time)."""

    def __init__(self, path: Path) -> None:
        self._times: IO[bytes] = open(times_path(path), "ab")  # noqa: SIM115 - closed by close()
        self._log: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed by close()

    @property
    def closed(self) -> bool:
        return self._log.closed

    def write(self, line: bytes) -> None:
        self._times.write(f"{time.time():.3f}\n".encode())
        self._times.flush()
        self._log.write(line)
        self._log.flush()

    def close(self) -> None:
        self._times.close()
        self._log.close()


def follow_stamped(path: Path, finished: Callable[[], bool]) -> Iterator[tuple[str, float | None]]:
    """``follow_lines`` of the log, each with its capture time (None for jobs from before times were kept)."""
    stamps: Iterator[float | None] | None = None
    for raw in follow_lines(path, finished):
        stamps = stamps or _stamps(times_path(path))  # opened at the first line: the times file exists by then
        yield raw, next(stamps)


def _stamps(path: Path) -> Iterator[float | None]:
    if path.exists():
        with open(path, encoding="ascii") as handle:
            while (line := handle.readline()).endswith("\n"):
                try:
                    yield float(line)
                except ValueError:
                    yield None
    while True:
        yield None
