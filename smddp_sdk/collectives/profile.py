"""Step profile of a run over the smddp backend: every collective's size and timing, and step boundaries.

Off unless ``SMDDP_PROFILE`` names a directory; then every rank writes ``rank-<R>.json`` there when it
exits, and rank 0 prints a short communication summary. Put the directory under the job's output
(``SMDDP_PROFILE=/opt/ml/output/data/smddp-profile`` in the job's ``environment``) and it travels with the
job's output; ``smddp-launch plan --profile DIR`` reads it.

What is recorded, per collective: the op, the bytes it reduces or gathers (all_reduce: the tensor;
all_gather: the gathered output; reduce_scatter: the input), and three clock readings:
``submit`` (when the caller handed it over: for DDP, when the bucket became ready in backward), ``start``
and ``end`` of its execution. Step boundaries come from a global optimizer hook (any ``torch.optim``
optimizer) or from ``step()`` for scripts without one.

Cost when on: one ``perf_counter`` pair and a list append per collective (measured in
benchmarks/plan_profile_overhead.py); when off, ``wrap`` returns the job itself.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

PROFILE_ENV = "SMDDP_PROFILE"
FORMAT = "smddp-profile/1"
_GATHERED_BY_WORLD = ("reduce_scatter",)  # the recorded output is one rank's part of the input


class Recorder:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.events: list[tuple[str, int, float, float, float]] = []
        self.steps: list[float] = []
        self.origin = time.perf_counter()

    def wrap(self, what: str, value: object, job: Callable[[], None], world_size: int) -> Callable[[], None]:
        nbytes = _nbytes(value) * (world_size if what.startswith(_GATHERED_BY_WORLD) else 1)
        submit = time.perf_counter()

        def timed() -> None:
            start = time.perf_counter()
            job()
            end = time.perf_counter()
            # list.append is atomic under the GIL: no lock on the collective's path
            self.events.append((what, nbytes, submit - self.origin, start - self.origin, end - self.origin))

        return timed

    def step(self) -> None:
        self.steps.append(time.perf_counter() - self.origin)

    def document(self) -> dict:
        env = os.environ
        return {"format": FORMAT, "rank": int(env.get("RANK", "0")), "world_size": int(env.get("WORLD_SIZE", "1")),
                "local_world_size": int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))),
                "host": env.get("SM_CURRENT_HOST", ""), "fields": ["op", "bytes", "submit", "start", "end"],
                "events": [list(e) for e in self.events], "steps": self.steps}

    def save(self) -> Path | None:
        doc = self.document()
        if not doc["events"]:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"rank-{doc['rank']}.json"
        path.write_text(json.dumps(doc))
        if doc["rank"] == 0:
            _print_summary(doc, path)
        return path


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _print_summary(doc: dict, path: Path) -> None:
    # The reader is stdlib only (the CLI imports it); imported here so the summary and `plan` agree.
    from smddp_sdk.planning.profile_io import summary_lines, to_step_profile

    try:
        lines = summary_lines(doc, to_step_profile([doc]))
    except ValueError as exc:  # too few steps to summarise: say where the raw profile is
        lines = [f"smddp profile: {exc}"]
    print("\n".join([*lines, f"smddp profile written to {path.parent}"]), file=sys.stderr, flush=True)


_recorder: Recorder | None = None
_listeners: list[Callable[[], None]] = []


def recorder() -> Recorder | None:
    return _recorder


def wrap(what: str, value: object, job: Callable[[], None], world_size: int) -> Callable[[], None]:
    """The job, timed and recorded when profiling is on (the hook ProcessGroup._submit calls)."""
    return job if _recorder is None else _recorder.wrap(what, value, job, world_size)


def step() -> None:
    """Mark the end of a training step (automatic with torch.optim optimizers)."""
    if _recorder is not None:
        _recorder.step()


def on_start(listener: Callable[[], None]) -> None:
    """Call listener when profiling starts (the native core then leaves every call to Python)."""
    _listeners.append(listener)


def start(directory: str | os.PathLike[str]) -> Recorder:
    """Turn profiling on for this process (what SMDDP_PROFILE does at import)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(Path(directory))
        for listener in _listeners:
            listener()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda *_: step())
        atexit.register(_recorder.save)
    return _recorder


if os.environ.get(PROFILE_ENV):
    start(os.environ[PROFILE_ENV])
