"""Where the script is on its way to training: rank 0 of a process's first smddp group notes
``first_collective`` at its first collective (training again, ``specs.goodput``) in its host's
``output/events.jsonl`` (every rank notes ``process_group_formed`` as the group is made: see
``collectives/__init__.py``); only where ``SM_OUTPUT_DIR`` names the host's output folder, as every
scheduler's runtime sets it.

The group's collective methods are shadowed on the instance by a one-shot wrapper that notes the time,
removes every shadow (the class's methods, the native core's included, answer from then on: no cost per
call after the first) and calls through.
"""

from __future__ import annotations

import os
from typing import Any

from smddp_sdk.specs import events

FIRST_CALLS = ("allreduce", "allreduce_coalesced", "broadcast", "barrier", "allgather", "_allgather_base", "all_gather_single",
               "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "alltoall", "alltoall_base", "all_to_all_single",
               "reduce", "gather", "scatter")
_watched = False  # one note per process: its first group is the world


def watch(group: Any) -> None:
    """Note ``group``'s first collective when it comes (rank 0 of the process's first group)."""
    global _watched
    if _watched or not os.environ.get("SM_OUTPUT_DIR") or group.rank() != 0:
        return
    _watched = True
    shadowed = [name for name in FIRST_CALLS if hasattr(group, name)]

    def first(name: str) -> Any:
        method = getattr(group, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            for other in shadowed:
                group.__dict__.pop(other, None)
            events.record_from_rank(events.FIRST_COLLECTIVE)
            return method(*args, **kwargs)

        return call

    for name in shadowed:
        setattr(group, name, first(name))

