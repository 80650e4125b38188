"""``checkpoint_s3_uri`` and ``checkpoint_local_path`` emulated for simulated hosts.

What SageMaker documents ("Checkpoints in Amazon SageMaker AI", developer guide): before the script
starts, the contents of ``checkpoint_s3_uri`` are copied into ``checkpoint_local_path`` (default
``/opt/ml/checkpoints``) on every instance; while the job runs, files written there are copied to the
URI; so a rerun (or a spot restart) finds the previous run's checkpoints. Here:

- ``restore()`` copies the location's files into every host's checkpoint directory (one download,
  then local copies);
- ``start()`` runs a thread that copies new or changed files (size or modification time) out every
  ``interval`` seconds (5 by default), and ``stop()`` does one last pass after the hosts have ended;
- the location may be ``s3://`` (boto3) or ``file://``/a path (a folder on this machine); either way a
  restored file is byte-, time- and mode-identical to the one synced out (``stores``: S3 objects carry the
  file's modification time and mode in their metadata);
- when two hosts write the same relative name, the later pass (and, within a pass, the later host)
  wins, as concurrent uploads of one key do on S3. Files deleted locally are not deleted at the
  location: a rerun restores everything ever synced.

The checkpoint directory of a host is its tree's counterpart of ``checkpoint_local_path``, which must
therefore lie under ``/opt/ml`` (checked by ``issues``).

Call sites: ``host_trees.prepare_host_trees`` restores (``for_job(...).restore()``); the process that
watches the hosts calls ``for_record(job record)``, ``.start()`` once they run and ``.stop()`` after they end.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from smddp_sdk.errors import SmddpError, SpecIssue
from smddp_sdk.schedulers import stores
from smddp_sdk.specs.job import JobSpec

if TYPE_CHECKING:
    from smddp_sdk.schedulers.hosttree.plan import HostTreePlan

DEFAULT_LOCAL_PATH = "/opt/ml/checkpoints"
OPT_ML = PurePosixPath("/opt/ml")
SYNC_INTERVAL = 5.0


def local_path(spec_value: str | None) -> PurePosixPath:
    return PurePosixPath(spec_value or DEFAULT_LOCAL_PATH)


def host_dir(opt_ml_root: Path, checkpoint_local_path: str | None) -> Path:
    """The directory on this machine that a host sees as ``checkpoint_local_path``."""
    return opt_ml_root / local_path(checkpoint_local_path).relative_to(OPT_ML)


def issues(spec: JobSpec) -> list[SpecIssue]:
    """A checkpoint path the simulated hosts cannot each have a copy of."""
    path = local_path(spec.checkpoint_local_path)
    if not path.is_absolute() or not path.is_relative_to(OPT_ML) or path == OPT_ML or ".." in path.parts:
        return [SpecIssue("checkpoint_local_path", f"{str(path)!r} is not emulated per simulated host; local and docker modes keep checkpoints under /opt/ml", "use a folder under /opt/ml, such as the default /opt/ml/checkpoints")]
    return []


def notes(spec: JobSpec) -> list[str]:
    if not spec.checkpoint_s3_uri:
        return []
    where = local_path(spec.checkpoint_local_path)
    return [f"checkpoints: {spec.checkpoint_s3_uri} is restored into each host's {where} before the script starts and synced back every {SYNC_INTERVAL:g} s and at the end"]


class CheckpointSync:
    """Restore into, and sync out of, the checkpoint directories of the hosts of one job."""

    def __init__(self, uri: str, host_dirs: Sequence[Path], *, interval: float = SYNC_INTERVAL, s3: Any | None = None, stream: Any = None) -> None:
        self.uri = uri
        self.host_dirs = [Path(d) for d in host_dirs]
        self.interval = interval
        self.store = stores.open_store(uri, s3)
        self.stream = stream if stream is not None else sys.stderr
        self._synced: dict[str, tuple[int, int]] = {}  # key -> (size, mtime_ns) last copied out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self.newest_written: float | None = None  # the modification time of the newest file copied out (specs.goodput)

    def restore(self) -> int:
        """Copy the location's files into every host's directory; returns how many files."""
        for directory in self.host_dirs:
            directory.mkdir(parents=True, exist_ok=True)
        entries = self.store.entries()
        if not entries or not self.host_dirs:
            return 0
        first = self.host_dirs[0]
        stores.copy_all(self.store, entries, first)
        for other in self.host_dirs[1:]:  # copies of the first host's files, times and modes included,
            for entry in entries:  # so a script that picks the newest file picks the same one everywhere
                target = other / entry.key
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(first / entry.key, target)
        for directory in self.host_dirs:  # what came from the location need not go back
            for entry in entries:
                stat = (directory / entry.key).stat()
                self._synced[entry.key] = (stat.st_size, stat.st_mtime_ns)
        self._say(f"restored {len(entries)} checkpoint files from {self.uri} into {len(self.host_dirs)} hosts")
        return len(entries)

    @property
    def synced(self) -> dict[str, tuple[int, int]]:
        """What is at the location already: key -> (size, mtime_ns) of the file as last copied."""
        return dict(self._synced)

    def remember(self, synced: dict[str, tuple[int, int]]) -> None:
        """Count these files as synced (what another process restored): they are not copied out again."""
        self._synced.update(synced)

    def sync_once(self) -> int:
        """Copy out every file that is new or changed since it was last copied; returns how many."""
        with self._lock:
            copied = 0
            for directory in self.host_dirs:
                if directory.is_symlink():  # the job made its checkpoint directory a link: not followed
                    self._error(f"checkpoint sync: {directory} is a link, nothing under it is copied")
                    continue
                for path in sorted(directory.rglob("*")) if directory.is_dir() else ():  # rglob enters no linked directory
                    key = path.relative_to(directory).as_posix()
                    if path.is_symlink():  # its target may be any file of the machine
                        self._error(f"checkpoint sync: {key} is a link, not copied")
                        continue
                    if not path.is_file() or path.name.endswith(".partial"):
                        continue
                    try:
                        stat = path.stat()
                        mark = (stat.st_size, stat.st_mtime_ns)
                        if self._synced.get(key) == mark:
                            continue
                        self.store.upload(path, key)
                    except (OSError, SmddpError) as exc:  # a file removed mid-pass, a network error: next pass
                        self._error(f"checkpoint sync: {key}: {exc}")
                        continue
                    self._synced[key] = mark
                    self.newest_written = max(self.newest_written or stat.st_mtime, stat.st_mtime)
                    copied += 1
            return copied

    def start(self) -> CheckpointSync:
        self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """End the periodic sync and make the last pass; returns the files copied in that pass."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        copied = self.sync_once()
        self._say(f"synced checkpoints to {self.uri} ({len(self._synced)} files)")
        return copied

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sync_once()

    def _error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)
            self._say(f"warning: {message}")

    def _say(self, message: str) -> None:
        with suppress(OSError, ValueError):  # a closed log must not stop the sync
            self.stream.write(f"smddp: {message}\n")
            self.stream.flush()


def for_job(checkpoint_s3_uri: str | None, checkpoint_local_path: str | None, host_roots: Sequence[Path], **options: Any) -> CheckpointSync | None:
    """The sync of a job whose hosts' ``/opt/ml`` trees are ``host_roots``; None without a URI."""
    if not checkpoint_s3_uri:
        return None
    return CheckpointSync(checkpoint_s3_uri, [host_dir(Path(root), checkpoint_local_path) for root in host_roots], **options)


def for_plan(plan: HostTreePlan, **options: Any) -> CheckpointSync | None:
    """The sync of a local or docker job from its plan, for the process that watches the hosts:
    ``sync = checkpoints.for_plan(plan)``; ``sync.start()`` once the hosts run, ``sync.stop()`` after they
    end (restoring happened when the trees were written). None without ``checkpoint_s3_uri``."""
    if plan.checkpoints is None:
        return None
    return for_job(plan.checkpoints.s3_uri, plan.checkpoints.local_path, [host.opt_ml for host in plan.hosts], **options)
