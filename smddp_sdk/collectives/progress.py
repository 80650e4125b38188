"""Where the script is on its way to training: rank 0 of a process's first smddp group notes
``process_group_formed`` as the group is made and ``first_collective`` at its first collective (training
again, ``specs.goodput``) in its host's ``output/events.jsonl``; only where ``SM_OUTPUT_DIR`` names the host's
output folder, as every scheduler's runtime sets it.

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
from smddp_sdk.specs.goodput import FIRST_COLLECTIVE, PROCESS_GROUP_FORMED, event_line

FIRST_CALLS = ("allreduce", "allreduce_coalesced", "broadcast", "barrier", "allgather", "_allgather_base", "all_gather_single",
               "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single",
               "reduce", "gather", "scatter")
_watched = False  # one note per process: its first group is the world


def events_file() -> Path | None:
    output = os.environ.get("SM_OUTPUT_DIR")
    return OptMl(Path(output).parent).events_file if output else None


def watch(group: Any) -> None:
    """Note that ``group`` formed, and its first collective when it comes (rank 0 of the process's first group)."""
    global _watched
    path = events_file()
    if _watched or path is None or group.rank() != 0:
        return
    _watched = True
    note(path, PROCESS_GROUP_FORMED, group.rank())
    shadowed = [name for name in FIRST_CALLS if hasattr(group, name)]

    def first(name: str) -> Any:
        method = getattr(group, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            for other in shadowed:
                group.__dict__.pop(other, None)
            note(path, FIRST_COLLECTIVE, group.rank())
            return method(*args, **kwargs)

        return call

    for name in shadowed:
        setattr(group, name, first(name))


def note(path: Path, event: str, rank: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:  # one short line, appended whole
            handle.write(event_line(event, time.time(), host=os.environ.get("SM_CURRENT_HOST"), rank=rank))
    except OSError:
        pass  # a read-only output folder costs the mark, never the training
