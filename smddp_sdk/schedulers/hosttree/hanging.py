"""The ranks left running when ``max_run`` ends a job, named with their innermost Python frames.

Before it stops the hosts, the supervisor asks every rank for its stacks (the mechanism of ``smddp-launch
stacks``: ``STACKS_SIGNAL`` to each runtime, passed on to its ranks, each writing every thread's stack from
a signal handler). Ranks that ended write nothing, so the ranks that answer are the ones still running: each
becomes a failure record (host, rank, the frame it is in and the main thread's innermost frames). A rank
waiting in a collective is named after one that is not: that one is what the others wait for.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from smddp_sdk.schedulers.stacks import RankStack
from smddp_sdk.specs.failure import SOURCE_TIMEOUT, FailureRecord

INNERMOST_FRAMES = 8  # of the main thread, innermost first (faulthandler's order)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.+)$')
# Frames of code that waits for other ranks: a rank stopped there waits, it is not the one waited for.
_COLLECTIVE_PARTS = ("/smddp_sdk/collectives/", "/torch/distributed/")


def main_thread_frames(dump: str) -> list[str]:
    """The frames of the dump's main thread (the one whose outermost frame is ``<module>``, else the
    thread that took the signal), innermost first; [] when the dump has none."""
    frames = [[line.strip() for line in block.splitlines() if _FRAME.match(line)] for block in _THREAD.split(dump)[1:]]
    frames = [block for block in frames if block]
    if not frames:
        return []
    return next((block for block in frames if block[-1].endswith(" in <module>")), frames[0])


def where(frame: str) -> str:
    """``linger (train.py:95)`` from faulthandler's ``File "/x/train.py", line 95 in linger``."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    return f"{match['name']} ({match['file'].rsplit('/', 1)[-1]}:{match['line']})"


def in_collective(frames: list[str]) -> bool:
    return any(part in frame for frame in frames[:INNERMOST_FRAMES] for part in _COLLECTIVE_PARTS)


def records(answers: Iterable[RankStack], max_run: int) -> list[FailureRecord]:
    """One record per rank that answered (every rank still running), the ranks outside a collective first."""
    found = []
    now = time.time()
    for stack in answers:
        if not stack.text:
            continue  # ended before it was asked: not left hanging
        frames = main_thread_frames(stack.text)
        inner = f" in {where(frames[0])}" if frames else ""
        message = f"still running{inner} when max_run={max_run} seconds passed; stopped"
        found.append(
            FailureRecord(stack.host, stack.rank, 143, message, traceback="\n".join(frames[:INNERMOST_FRAMES]), timestamp=now, error_type="MaxRuntimeExceeded", source=SOURCE_TIMEOUT, signal="SIGTERM")
        )
    return sorted(found, key=lambda record: (in_collective(record.traceback.splitlines()), record.rank or 0))


def describe(hanging: list[FailureRecord]) -> str:
    """``; still running: algo-1/rank1 in linger (train.py:95)`` for the job's message ("" for none)."""
    if not hanging:
        return ""
    named = [record.who + (f" in {where(record.traceback.splitlines()[0])}" if record.traceback else "") for record in hanging[:4]]
    more = f" and {len(hanging) - 4} more" if len(hanging) > 4 else ""
    return "; still running: " + ", ".join(named) + more
