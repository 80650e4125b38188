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

On the next attempt ``restore()`` on every rank: each tells the step of its own snapshot; the lowest
rank that kept one (``choose_source``: its buffers are the ones DDP goes on with) sends its state to all
the others through the process group, every rank loads it and the snapshots are deleted. A rank takes the
random generators' states of its own snapshot when its host kept one of that step, else the sender's
(the same when ranks seed alike; seed data by step and rank otherwise, as the example does).

Survivors stay up (a local job with ``survive_host_loss``): the loop is driven by ``steps`` and each
step runs in ``step``, whose exit absorbs a lost peer instead of raising it:

    state = Recoverable(model, optimizer, extra={"scheduler": scheduler})
    for step in state.steps(total):   # restore(), then each step; after a lost peer, the interrupted one again
        with state.step(step):        # its end is step_done(step); a lost peer ends it early, without an error
            ...

The supervisor replaces the lost host alone; here the smddp group re-forms in place (``reform``: the same
torch ProcessGroup object, a new rendezvous generation that the replaced ranks join), smddp's DDP runs
the collectives of its construction again (``rejoin``), and every rank takes the lowest rank's whole state, the
survivors' in memory, as ``restore()`` takes it from snapshots: the same collectives the replaced ranks'
``restore()`` runs. Then the interrupted step runs again, from the state of the one before it.

Snapshots live in the host's scratch directory (``SMDDP_SCRATCH_DIR``), under ``snapshots/<host>/``, mode
0600. The local scheduler gives its hosts one in the job directory; the docker scheduler mounts a folder of
the job directory per host into its container, so the snapshots outlive a container's restart; both remove
it when the job ends. The Slurm scheduler gives each node ``scratch/<node index>`` in the shared job
directory (0700), since a requeue runs the job again in a new allocation, maybe on other nodes: it survives
the requeue and the batch script removes it when the job ends. Without one (SageMaker, where a restart gets
fresh machines) nothing is kept and ``restore()`` returns 0: load your checkpoint then.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.specs import events
from smddp_sdk.specs.contract import SCRATCH_ENV, SNAPSHOTS, SURVIVORS_ENV

__all__ = ["Recoverable", "choose_source", "is_peer_loss", "snapshot_dir"]

SUFFIX = ".snapshot"


@dataclass(frozen=True)
class _Tensor:
    """Where a tensor was in a state sent to the peers: its bytes follow in one flat buffer."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def choose_source(steps: Sequence[int | None]) -> int | None:
    """The rank whose state every rank restores: the lowest that kept one (a state of step 0 is no
    progress); None when none did. Not the newest: a rank may have finished one step more than rank 0
    before the stop, but its buffers (BatchNorm's running statistics) are its own, and DDP broadcasts rank
    0's before every forward; only the lowest rank's own state goes on as an uninterrupted run would. The
    others redo at most the one step they had finished alone."""
    return next((rank for rank, step in enumerate(steps) if step), None)


def is_peer_loss(error: BaseException | None) -> bool:
    """Whether an error (or one it was raised from) is a collective's failure: a peer lost, or the group
    broken by it. Re-forming the group is the cure for these and no other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, CollectiveError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def survivors_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The job runs with ``survive_host_loss``: a lost host is replaced alone (SURVIVORS_ENV)."""
    return (os.environ if environ is None else environ).get(SURVIVORS_ENV) == "1"


def snapshot_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """This host's snapshot folder in its scratch directory; None where the scheduler gives none (SageMaker)."""
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
        self._lost: BaseException | None = None  # the peer loss that ended the current step (``step``)
        self._reformed_at: int | None = None  # the steps done at the last re-formation: one per step at most
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

    # --- survivors stay up (a loop of ``steps`` and ``step``) ---------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """The steps to run, from ``restore()`` up to ``total``; after a step ended by a lost peer, the
        group re-forms, every rank takes the lowest rank's whole state, and that step comes again."""
        step = self.restore()
        while step < total:
            yield step
            if self._lost is None:
                step += 1
                continue
            try:
                step = self._recover()
            except BaseException:
                self.save("after the group could not re-form")  # the whole restart that follows takes it
                raise

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """One step: ``step_done(step)`` at its end. A lost peer (``is_peer_loss``) in a job that survives
        one ends it quietly for ``steps`` to recover; another error keeps the state (as ``with state:``) and
        is raised."""
        try:
            yield
        except Exception as error:
            if survivors_enabled() and is_peer_loss(error) and self._reformed_at != self.done:
                self._lost = error
                print(f"rank {dist.get_rank()}: step {step} ended by a lost peer ({error}); re-forming the group", file=sys.stderr, flush=True)
                return
            self.save(f"after {type(error).__name__}")
            raise
        self.step_done(step)

    def _recover(self) -> int:
        """Re-form the group with the replaced ranks, then take the lowest rank's whole state: the first step to run."""
        from smddp_sdk.collectives.ddp import DistributedDataParallel
        from smddp_sdk.collectives.process_group import smddp_backend

        error, self._lost = self._lost, None
        lost = sorted({str(peer) for peer in getattr(error, "lost", ())})
        events.record_from_rank(events.PEER_LOST, lost=lost, done=self.done or 0)
        backend = smddp_backend(None)
        if backend is None:
            raise RuntimeError("a lost peer can be survived on the smddp backend only (dist.init_process_group('smddp'))") from error
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            raise RuntimeError("torch's DistributedDataParallel cannot go on after a lost peer: its reducer keeps the failed "
                               "backward's state and its construction's collectives cannot be matched; use smddp_sdk.collectives.ddp."
                               "DistributedDataParallel") from error
        started = time.monotonic()
        generation = backend.reform()
        if isinstance(self.model, DistributedDataParallel):
            self.model.rejoin()
        events.record_from_rank(events.GROUP_REFORMED, generation=generation, pid=os.getpid(), seconds=round(time.monotonic() - started, 3))
        self._reformed_at = self.done
        whole = self._whole_state()
        done = self._take_state(whole["step"] if whole else 0, lambda: whole, self._own_rng)
        if done == 0 and self.done:
            raise RuntimeError(f"no rank kept a whole state after the lost peer (this rank had {self.done} steps done)") from error
        print(f"rank {dist.get_rank()}: the group re-formed (generation {generation}); going on from step {done}", flush=True)
        return done

    def _own_rng(self, step: int) -> Mapping[str, Any] | None:
        return self._boundary.get("rng") if self.done == step else None

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
        if path is None:
            return None
        self._saving = True
        try:
            state = self._whole_state()
            if state is None:
                return None
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # one file per rank, replaced by each save
            partial = path.with_name(path.name + ".partial")
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as out:
                torch.save(state, out)
            partial.rename(path)
            print(f"rank {dist.get_rank()}: kept the state of step {self.done} for the restart {why}".rstrip(), file=sys.stderr, flush=True)
            return path
        finally:
            self._saving = False

    def _whole_state(self) -> dict[str, Any] | None:
        """The state as of the last completed step, or None when there is none (no step done, or the
        parameters have moved on since: inside ``optimizer.step()`` or after it, before ``step_done``)."""
        if self.done is None or self._in_step or self._stepped:
            return None
        model = {**self.model.state_dict(), **self._boundary["buffers"]}
        return {"step": self.done, "model": model, "optimizer": self.optimizer.state_dict(), "extra": self._boundary["extra"], "rng": self._boundary["rng"]}

    # --- on the next attempt -----------------------------------------------------------------------

    def restore(self) -> int:
        """Load the lowest rank's snapshot (sent by that rank); the steps done, 0 when none."""
        own = self._own_snapshot_step()
        return self._take_state(own[0] if own else 0, lambda: torch.load(own[1], weights_only=False), self._own_snapshot_rng)

    def _own_snapshot_rng(self, step: int) -> Mapping[str, Any] | None:
        mine = self._own_snapshot(step)
        return mine["rng"] if mine else None

    def _take_state(self, own_step: int, own_state: Any, own_rng: Any) -> int:
        """Every rank tells its step (one small all-reduce); the lowest rank that kept a state sends it
        (``own_state()``) to all; each loads it, with its own random generators (``own_rng(step)``) where it
        has them for that step, else the sender's. Returns the steps done, 0 when no rank has any."""
        rank = dist.get_rank()
        steps = torch.zeros(dist.get_world_size(), dtype=torch.int64)  # every rank's step, by a sum: one small collective
        steps[rank] = own_step
        dist.all_reduce(steps)
        source = choose_source(steps.tolist())
        if source is None:
            return 0
        received = _broadcast_state(own_state() if rank == source else None, source)
        rng = (own_rng(received["step"]) if rank != source else None) or received["rng"]
        self.model.load_state_dict(received["model"])
        self.optimizer.load_state_dict(received["optimizer"])
        for name, item in self.extra.items():
            item.load_state_dict(received["extra"][name])
        _set_rng_states(rng)
        self._boundary, self._stepped, self._in_step = self._capture(), False, False
        self.done = received["step"]  # from here a stop keeps the restored state: the old snapshot can go
        self._delete_own()
        events.record_from_rank(events.STATE_RESTORED, source="peer", step=self.done)
        print(f"rank {rank}: restored step {self.done} from rank {source}", flush=True)
        return self.done

    def _own_snapshot_step(self) -> tuple[int, Path] | None:
        """This rank's own snapshot and its steps done (another rank's buffers are not this rank's)."""
        path = self._own_path()
        if path is None or not _ours(path):
            return None
        return torch.load(path, weights_only=False, mmap=True)["step"], path

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
