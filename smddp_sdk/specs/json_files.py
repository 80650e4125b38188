"""Files that several processes (or nodes, on a shared file system) share: JSON files read while one
rewrites them, and lock files.

Stdlib only: the node runtime uses it as well as the schedulers.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, obj: Any) -> None:
    """Readers in other processes see the old file or the new one, never half of one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    # 0600: job files hold the spec, its environment, the job token and the job's paths; they are the caller's alone.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(partial, path)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or half written."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Held by one process at a time: an exclusive flock on ``lock_file`` (made, with its folder, if need be)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
