"""The script trains again: the first collective of a process's first smddp group, noted in its host's
``output/progress.jsonl`` (``specs.goodput``'s "training again" mark; only where ``SM_OUTPUT_DIR`` names the
host's output folder, as every scheduler's runtime sets it, and only by rank 0).

The group's collective methods are shadowed on the instance by a one-shot wrapper that notes the time,
removes every shadow (the class's methods, the native core's included, answer from then on: no cost per
call after the first) and calls through.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.goodput import progress_line

FIRST_CALLS = ("allreduce", "allreduce_coalesced", "broadcast", "barrier", "allgather", "_allgather_base", "all_gather_single",
               "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single",
               "reduce", "gather", "scatter")
_watched = False  # one note per process: its first group is the world


def progress_file() -> Path | None:
    output = os.environ.get("SM_OUTPUT_DIR")
    return OptMl(Path(output).parent).progress_file if output else None


def watch_first_collective(group: Any) -> None:
    """Note ``group``'s first collective in the progress file (rank 0 of the process's first group)."""
    global _watched
    path = progress_file()
    if _watched or path is None or group.rank() != 0:
        return
    _watched = True
    shadowed = [name for name in FIRST_CALLS if hasattr(group, name)]

    def first(name: str) -> Any:
        method = getattr(group, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            for other in shadowed:
                group.__dict__.pop(other, None)
            note(path, group.rank())
            return method(*args, **kwargs)

        return call

    for name in shadowed:
        setattr(group, name, first(name))


def note(path: Path, rank: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:  # one short line, appended whole
            handle.write(progress_line(time.time(), rank, os.getpid()))
    except OSError:
        pass  # a read-only output folder costs the mark, never the training
