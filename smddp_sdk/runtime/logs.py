"""Tee each rank's output: whole to its own log file, prefixed ``[algo-2/rank3]:`` to the console."""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import IO, BinaryIO

from smddp_sdk.specs import contract

TAIL_LINES = 40  # kept per rank for the failure summary when a rank leaves no error file
MAX_LINE = 64 * 1024  # longer lines (progress bars redrawn with \r) are passed on in pieces


class Console:
    """Whole lines to one stream from many threads, never interleaved mid-line."""

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._lock = threading.Lock()
        self._broken = False

    def write_line(self, prefix: bytes, line: bytes) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(prefix + line)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # Whoever read our stdout went away; ranks must not block on a full pipe because of it.
                self._broken = True

    def say(self, prefix: str, text: str) -> None:
        for line in text.splitlines() or [""]:
            self.write_line(prefix.encode(), line.encode("utf-8", "replace"))


def rank_prefix(host: str, rank: int | str) -> str:
    return contract.console_prefix(host, int(rank))


class LogPump:
    """Reads one rank's combined stdout/stderr until EOF on a daemon thread."""

    def __init__(self, source: BinaryIO, log: BinaryIO, prefix: str, console: Console) -> None:
        self._source = source
        self._prefix = prefix.encode()
        self._console = console
        self._tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self._log = log  # the rank's log file, opened by the runtime; closed by the pump thread at EOF
        self._thread = threading.Thread(target=self._pump, name=f"log {prefix.strip()}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for line in iter(lambda: self._source.readline(MAX_LINE), b""):
                self._log.write(line)
                self._log.flush()
                self._tail.append(line)
                self._console.write_line(self._prefix, line)
        finally:
            self._log.close()
            self._source.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self) -> str:
        return b"".join(self._tail).decode("utf-8", "replace")
