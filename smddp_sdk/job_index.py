"""The jobs submitted from this machine, so that a job can be named by the name ``run`` printed.

Every ``launcher.schedule`` appends one JSON line to ``<job root>/index.jsonl`` (``$SMDDP_JOB_ROOT`` or
``~/.smddp/jobs``): the job name, its handle, where its scheduler keeps it (``job_root`` for local,
docker and slurm jobs; the region is in a SageMaker handle) and its ``metric_definitions``. ``resolve`` turns a name
back into a handle: the index first (newest match wins), then the job root (``job_files.JOB_FOLDERS``), then a did-you-mean
hint. One line written with one ``write`` call under ``O_APPEND``, so concurrent submits never interleave.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.schedulers.job_files import JOB_FOLDERS, default_job_root
from smddp_sdk.specs.status import JobHandle

INDEX_FILE = "index.jsonl"


@dataclass(frozen=True)
class IndexEntry:
    """One submitted job."""

    name: str
    handle: str
    scheduler: str
    submitted: float
    options: Mapping[str, Any] = field(default_factory=dict)
    metric_definitions: tuple[Mapping[str, str], ...] = ()
    entry_point: str = ""

    @property
    def job_handle(self) -> JobHandle:
        return JobHandle.parse(self.handle)


def index_path(root: Path | None = None) -> Path:
    """The index lives in the job root (the local scheduler's)."""
    return (root or default_job_root()) / INDEX_FILE


def record(handle: JobHandle, *, name: str, options: Mapping[str, Any] | None = None,
           metric_definitions: Sequence[Mapping[str, str]] = (), entry_point: str = "", root: Path | None = None) -> IndexEntry:
    """Append a submitted job to the index; returns the entry written."""
    entry = IndexEntry(name, str(handle), handle.scheduler, time.time(), dict(options or {}), tuple(dict(item) for item in metric_definitions), entry_point)
    path = index_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(asdict(entry), default=str, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # the caller's jobs, as the job directories are
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return entry


def entries(root: Path | None = None) -> list[IndexEntry]:
    """Every entry, oldest first; unreadable lines (a crash mid-write) are skipped."""
    path = index_path(root)
    if not path.is_file():
        return []
    found = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            data = json.loads(raw)
            found.append(IndexEntry(data["name"], data["handle"], data["scheduler"], float(data["submitted"]), data.get("options") or {},
                                    tuple(data.get("metric_definitions") or ()), data.get("entry_point") or ""))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def find(name_or_handle: str, *, scheduler: str | None = None, root: Path | None = None) -> IndexEntry | None:
    """The newest entry whose name or handle is ``name_or_handle`` (on ``scheduler`` when given)."""
    for entry in reversed(entries(root)):
        if name_or_handle in (entry.name, entry.handle) and (scheduler is None or entry.scheduler == scheduler):
            return entry
    return None


def resolve(name_or_handle: str, *, scheduler: str | None = None, root: Path | None = None) -> tuple[JobHandle, IndexEntry | None]:
    """A handle for a job name or handle, and its index entry when there is one.

    A handle is used as given. A bare name is looked up in the index, then among local job directories;
    a name found nowhere is an error with the closest known names.
    """
    entry = find(name_or_handle, scheduler=scheduler, root=root)
    if "://" in name_or_handle:
        handle = JobHandle.parse(name_or_handle)
        if scheduler is not None and handle.scheduler != scheduler:
            raise SpecError(SpecIssue("job", f"{name_or_handle!r} is a {handle.scheduler} job, not a {scheduler} one"))
        return handle, entry
    if entry is not None:
        return entry.job_handle, entry
    base = root or default_job_root()
    for kind, folder in JOB_FOLDERS.items():
        if scheduler in (None, kind) and (base / folder / name_or_handle / "job.json").is_file():
            return JobHandle(kind, name_or_handle), None
    known = known_names(root)
    hint = did_you_mean(name_or_handle, known) or ("pass the handle run printed (local://<job>, docker://<job>, slurm://<job>, sagemaker://<region>/<job>); `smddp-launch list` shows known jobs")
    raise SpecError(SpecIssue("job", f"no job named {name_or_handle!r} was submitted from this machine", hint))


def known_names(root: Path | None = None) -> list[str]:
    names = {entry.name for entry in entries(root)}
    base = root or default_job_root()
    for folder in (base / sub for sub in JOB_FOLDERS.values()):
        if folder.is_dir():
            names.update(path.name for path in folder.iterdir() if (path / "job.json").is_file())
    return sorted(names)


def forget(handles: Iterable[str], root: Path | None = None) -> int:
    """Drop these handles' entries (after ``clean`` removed their jobs); returns how many were dropped."""
    dropped, known = set(handles), entries(root)
    kept = [entry for entry in known if entry.handle not in dropped]
    if len(known) == len(kept):
        return 0
    path = index_path(root)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text("".join(json.dumps(asdict(e), default=str, sort_keys=True) + "\n" for e in kept), encoding="utf-8")
    os.replace(partial, path)
    return len(known) - len(kept)


def plain_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options worth keeping to find the job again (JSON-friendly values; never clients or sessions)."""
    wanted = ("job_root", "region", "profile")
    return {key: str(value) for key, value in options.items() if key in wanted and value is not None}


__all__ = ["IndexEntry", "INDEX_FILE", "index_path", "record", "entries", "find", "resolve", "known_names", "forget", "plain_options"]
