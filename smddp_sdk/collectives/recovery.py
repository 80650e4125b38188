"""Recovery without a checkpoint: a restarted rank gets the training state from a peer that kept it.

In data-parallel training every rank holds the whole model and optimizer state. ``Recoverable`` keeps
that state usable across a restart of the job (docs/resuming.md, "Recovery without a checkpoint"):

    state = Recoverable(model, optimizer, extra={"scheduler": scheduler})
    with state:                                         # an exception leaving the loop keeps the state too
        for step in range(state.restore(), steps):     # after init_process_group; 0 when no peer kept a state
            ...                                         # forward, backward, optimizer.step(), scheduler.step()
            state.step_done(step)

``step_done`` copies nothing big: it records the step, the random generators' states and a clone of the
model's buffers (the next forward changes them; parameters change only inside ``optimizer.step()``).
When the loop is stopped (a collective raises because a peer was lost, or the runtime sends SIGTERM,
which on a local job comes first) the rank writes the state as of its last ``step_done`` to a snapshot
on its host, then goes on dying. A stop inside ``optimizer.step()`` or between it and ``step_done`` is put off until ``step_done``; an
exception there leaves no snapshot, since the state is no longer that of a completed step.

On the next attempt ``restore()`` on every rank: each tells the step of the newest snapshot its host
holds; the newest wins (``choose_source``), the lowest rank holding it sends its state to all the
others through the process group, every rank loads it and the snapshots are deleted. A rank takes the
random generators' states of its own snapshot when its host kept one of that step, else the sender's
(the same when ranks seed alike; seed data by step and rank otherwise, as the example does).

Snapshots live in the host's scratch directory (``SMDDP_SCRATCH_DIR``), under ``snapshots/<host>/``, mode
0600. The local scheduler gives its hosts one in the job directory; the docker scheduler mounts a folder of
the job directory per host into its container, so the snapshots outlive a container's restart; both remove
it when the job ends. Without it (Slurm, SageMaker, where a restart gets fresh machines) nothing is kept and
``restore()`` returns 0: load your checkpoint then.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from smddp_sdk.specs import events
from smddp_sdk.specs.contract import SCRATCH_ENV, SNAPSHOTS

__all__ = ["Recoverable", "choose_source", "snapshot_dir"]

SUFFIX = ".snapshot"


@dataclass(frozen=True)
class _Tensor:
    """Where a tensor was in a state sent to the peers: its bytes follow in one flat buffer."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def choose_source(steps: Sequence[int | None]) -> int | None:
    """The rank whose snapshot every rank restores: the lowest holding the newest step (a snapshot of
    step 0 is no progress); None when no rank holds one."""
    best = max((step for step in steps if step), default=None)
    return None if best is None else steps.index(best)


def snapshot_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """This host's snapshot folder in its scratch directory; None where the job gives none (Slurm, SageMaker)."""
    environ = os.environ if environ is None else environ
    scratch, host = environ.get(SCRATCH_ENV), environ.get("SM_CURRENT_HOST")
    return Path(scratch) / SNAPSHOTS / host if scratch and host else None


class Recoverable:
    """The training state of one rank, kept at step boundaries so that a restart can take it from a peer."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: Mapping[str, Any] | None = None) -> None:
        self.model, self.optimizer, self.extra = model, optimizer, dict(extra or {})
        self.folder = snapshot_dir()
        self.done: int | None = None  # steps completed as of the last boundary
        self._boundary: dict[str, Any] = {}
        self._buffer_keys = {name for name, _ in model.named_buffers()}
        self._in_step = self._stepped = self._saving = self._stop_wanted = self._stepped_once = False
        optimizer.register_step_pre_hook(self._step_starts)
        optimizer.register_step_post_hook(self._step_ends)
        if self.folder is not None:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm) or signal.SIG_DFL

    # --- at each step -------------------------------------------------------------------------------

    def step_done(self, step: int) -> None:
        """Mark the end of step ``step`` (0-based): its optimizer step has returned."""
        if not self._stepped_once:  # training is going again (docs/resuming.md's recovery phases)
            events.record_from_rank(events.FIRST_STEP, step=step + 1)
            self._stepped_once = True
        self.done = step + 1
        self._boundary = self._capture()
        self._stepped = False
        if self._stop_wanted:  # SIGTERM came inside the step: now the state is whole
            self._save_and_stop("on SIGTERM, at the end of the step")

    def _capture(self) -> dict[str, Any]:
        buffers = {key: value.clone() for key, value in self.model.state_dict().items() if key in self._buffer_keys}
        return {"buffers": buffers, "rng": _rng_states(), "extra": {name: _state_of(item) for name, item in self.extra.items()}}

    def _step_starts(self, *_: Any) -> None:
        self._in_step = True

    def _step_ends(self, *_: Any) -> None:
        self._in_step, self._stepped = False, True

    # --- when the loop is stopped ------------------------------------------------------------------

    def __enter__(self) -> Recoverable:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if isinstance(error, Exception):
            self.save(f"after {type(error).__name__}")

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._saving:
            self._stop_wanted = True  # the save under way ends with the stop
        elif self._in_step or self._stepped:
            self._stop_wanted = True  # step_done saves, then stops
        else:
            self._save_and_stop("on SIGTERM")

    def _save_and_stop(self, why: str) -> None:
        self.save(why)
        signal.signal(signal.SIGTERM, self._previous_handler)
        os.kill(os.getpid(), signal.SIGTERM)  # die as SIGTERM would have done without us
        raise SystemExit(128 + signal.SIGTERM)  # a handler that ignores it: end the loop anyway

    def save(self, why: str = "") -> Path | None:
        """Write the state as of the last completed step to this host's snapshot (None: nothing whole to write)."""
        path = self._own_path()
        if path is None or self.done is None or self._in_step or self._stepped:
            return None
        self._saving = True
        try:
            model = {**self.model.state_dict(), **self._boundary["buffers"]}
            state = {"step": self.done, "model": model, "optimizer": self.optimizer.state_dict(), "extra": self._boundary["extra"], "rng": self._boundary["rng"]}
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # one file per rank, replaced by each save
            partial = path.with_name(path.name + ".partial")
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as out:
                torch.save(state, out)
            partial.rename(path)
            print(f"rank {dist.get_rank()}: kept the state of step {self.done} for the restart {why}".rstrip(), file=sys.stderr, flush=True)
            return path
        finally:
            self._saving = False

    # --- on the next attempt -----------------------------------------------------------------------

    def restore(self) -> int:
        """Load the newest snapshot any rank's host kept (sent by a peer); the steps done, 0 when none."""
        own, rank = self._newest_own(), dist.get_rank()
        steps = torch.zeros(dist.get_world_size(), dtype=torch.int64)  # every rank's step, by a sum: one small collective
        steps[rank] = own[0] if own else 0
        dist.all_reduce(steps)
        source = choose_source(steps.tolist())
        if source is None:
            return 0
        state = torch.load(own[1], weights_only=False) if rank == source else None
        received = _broadcast_state(state, source)
        mine = self._own_snapshot(received["step"]) if rank != source else received
        self.model.load_state_dict(received["model"])
        self.optimizer.load_state_dict(received["optimizer"])
        for name, item in self.extra.items():
            item.load_state_dict(received["extra"][name])
        _set_rng_states((mine or received)["rng"])
        self._boundary, self._stepped = self._capture(), False
        self.done = received["step"]  # from here a stop keeps the restored state: the old snapshot can go
        self._delete_own()
        events.record_from_rank(events.STATE_RESTORED, source="peer", step=self.done)
        print(f"rank {rank}: restored step {self.done} from rank {source}'s snapshot", flush=True)
        return self.done

    def _newest_own(self) -> tuple[int, Path] | None:
        """The snapshot of this host with the most steps done (any rank's file there)."""
        if self.folder is None or not self.folder.is_dir():
            return None
        found = []
        for path in filter(_ours, self.folder.glob(f"rank-*{SUFFIX}")):
            step = torch.load(path, weights_only=False, mmap=True)["step"]
            found.append((step, path.name == f"rank-{dist.get_rank()}{SUFFIX}", path))
        best = max(found, default=None)  # own file first among equals
        return (best[0], best[2]) if best else None

    def _own_snapshot(self, step: int) -> dict[str, Any] | None:
        """This rank's own snapshot if it is of ``step`` (its random generators are this rank's)."""
        path = self._own_path()
        if path is None or not _ours(path):
            return None
        state = torch.load(path, weights_only=False)
        return state if state["step"] == step else None

    def _own_path(self) -> Path | None:
        return None if self.folder is None else self.folder / f"rank-{dist.get_rank()}{SUFFIX}"

    def _delete_own(self) -> None:
        path = self._own_path()
        if path is not None:
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".partial").unlink(missing_ok=True)


def _ours(path: Path) -> bool:
    """A snapshot this user wrote as ``save`` does (a regular file, mode 0600): only those are unpickled."""
    try:
        info = path.lstat()
    except OSError:
        return False
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o600:
        return True
    print(f"warning: {path} is not a snapshot this job wrote (a regular file of uid {os.getuid()}, mode 0600); left unread", file=sys.stderr, flush=True)
    return False


def _state_of(item: Any) -> Any:
    return copy.deepcopy(item.state_dict())  # small things (a scheduler, a scaler): copied at the step's end


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _set_rng_states(states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])


def _broadcast_state(state: dict[str, Any] | None, source: int) -> dict[str, Any]:
    """``source``'s state on every rank: its layout as an object, its tensors' bytes in one broadcast."""
    tensors: list[torch.Tensor] = []
    layout = [_strip(state, tensors) if state is not None else None]
    dist.broadcast_object_list(layout, src=source)
    if state is not None:
        flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)
    else:
        flat = torch.empty(sum(item.nbytes for item in _placeholders(layout[0])), dtype=torch.uint8)
    dist.broadcast(flat, src=source)
    return state if state is not None else _fill(layout[0], iter(_split(flat, _placeholders(layout[0]))))


def _strip(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Tensor(tuple(value.shape), value.dtype, value.numel() * value.element_size())
    if isinstance(value, dict):
        return {key: _strip(item, tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_strip(item, tensors) for item in value)
    return value


def _placeholders(value: Any) -> list[_Tensor]:
    if isinstance(value, _Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [found for item in items for found in _placeholders(item)]


def _split(flat: torch.Tensor, placeholders: list[_Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for item in placeholders:
        out.append(flat[offset : offset + item.nbytes].clone().view(item.dtype).reshape(item.shape))
        offset += item.nbytes
    return out


def _fill(value: Any, tensors: Any) -> Any:
    if isinstance(value, _Tensor):
        return next(tensors)
    if isinstance(value, dict):
        return {key: _fill(item, tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(item, tensors) for item in value)
    return value
