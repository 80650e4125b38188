"""Input channels delivered to simulated hosts as SageMaker delivers them to instances.

- ``FullyReplicated``: every host gets every file of the channel.
- ``ShardedByS3Key``: every host gets a share of the files. AWS documents only the size of the share
  ("each instance gets approximately 1/n of the number of S3 objects", ``S3DataSource`` in the
  SageMaker API reference), not which objects go where. Our rule: the channel's files, sorted by key,
  are dealt round-robin, so host ``i`` (0-based, ``algo-{i+1}``) gets keys ``i, i+n, i+2n, ...``. The
  shares are disjoint and together complete, as on SageMaker; a script must not rely on which host
  gets which file there.
- ``s3://`` channels are downloaded once per job through boto3 (progress on a terminal) and then
  handed to each host like local data; ``file://`` URIs and plain paths are used in place.
- ``FastFile`` runs as ``File`` (the files are all there before the script starts); ``Pipe`` is
  refused, since its FIFOs are made by SageMaker's platform, not by the container.

The tiny API: ``issues(spec)`` for validation, ``notes(spec)`` for the dry run, ``deliver(...)`` once
the host trees exist, and ``bind_mount_source(channel)`` for a docker scheduler that mounts data it
can use in place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from smddp_sdk.errors import SpecIssue, UnavailableError
from smddp_sdk.schedulers import stores
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.job import JobSpec, TrainingInput

SHARDED = "ShardedByS3Key"
Style = Literal["symlink", "copy"]


def shard(keys: Sequence[str], host_index: int, host_count: int) -> list[str]:
    """Host ``host_index``'s share of ``keys`` (0-based index): every ``host_count``-th key of the
    sorted list, starting at its own index."""
    if not 0 <= host_index < host_count:
        raise ValueError(f"host index {host_index} is outside 0..{host_count - 1}")
    return sorted(keys)[host_index::host_count]


def input_mode(spec: JobSpec, channel: TrainingInput) -> str:
    return channel.input_mode or spec.input_mode


def issues(spec: JobSpec) -> list[SpecIssue]:
    """What local and docker modes refuse about channels: Pipe mode and manifest files."""
    found = []
    for name, channel in spec.inputs.items():
        where = f"inputs.{name}" if channel.input_mode else "input_mode"
        if input_mode(spec, channel) == "Pipe":
            found.append(SpecIssue(where, f"Pipe mode (channel {name!r}) streams through FIFOs that SageMaker's platform makes; local and docker modes cannot", "use File or FastFile to rehearse, Pipe on SageMaker only"))
        if channel.s3_data_type != "S3Prefix":
            found.append(SpecIssue(f"inputs.{name}.s3_data_type", f"{channel.s3_data_type} channels are read by SageMaker's platform and are not emulated locally", "rehearse with an S3Prefix channel (a prefix or a local folder)"))
    return found


def notes(spec: JobSpec, host_count: int) -> list[str]:
    """One dry-run line per channel that is delivered differently from a plain local link."""
    lines = []
    for name, channel in sorted(spec.inputs.items()):
        if input_mode(spec, channel) == "FastFile":
            lines.append(f"channel {name!r}: FastFile runs as File here (every file is present before the script starts)")
        if channel.is_s3:
            lines.append(f"channel {name!r}: {channel.s3_data} is downloaded through boto3 once per job, then given to the hosts")
        if channel.distribution == SHARDED and host_count > 1:
            lines.append(f"channel {name!r}: ShardedByS3Key: sorted keys dealt round-robin, algo-i gets keys i-1, i-1+{host_count}, ... (SageMaker only promises ~1/{host_count} of the objects per host)")
    return lines


def bind_mount_source(channel: TrainingInput) -> Path | None:
    """A local folder every host sees whole (a container can mount it read-only); None when the channel
    is downloaded, sharded or a single file, and ``deliver`` fills each host's directory instead."""
    if channel.local_path is None or channel.distribution == SHARDED or not channel.local_path.is_dir():
        return None
    return channel.local_path


def deliver(inputs: Mapping[str, TrainingInput], trees: Sequence[OptMl], cache_dir: Path, *, style: Style = "symlink", skip_mountable: bool = False, s3: Any | None = None, stream: Any = None) -> None:
    """Fill ``input/data/<channel>`` of every host tree (in host order ``algo-1..N``).

    ``style="symlink"`` links to the data (local mode: the hosts are processes on this machine);
    ``"copy"`` hard-links or copies real files into the tree (docker mode: the tree is mounted into a
    container, where links to this machine's paths would dangle). S3 data is downloaded once into
    ``cache_dir/<channel>``. With ``skip_mountable`` channels that ``bind_mount_source`` names are
    left to the caller's mounts.
    """
    for name, channel in sorted(inputs.items()):
        if skip_mountable and bind_mount_source(channel) is not None:
            continue
        root, keys = _source(name, channel, cache_dir, s3, stream)
        whole_dir = channel.local_path is not None and channel.local_path.is_dir()
        for index, tree in enumerate(trees):
            target = tree.channel_dir(name)
            if target.is_symlink() or target.exists():
                _remove(target)
            if channel.distribution == SHARDED:
                _place(root, shard(keys, index, len(trees)), target, style)
            elif whole_dir and style == "symlink":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(root.resolve(), target_is_directory=True)  # the user's own folder, uncopied
            else:
                _place(root, keys, target, style)


def _source(name: str, channel: TrainingInput, cache_dir: Path, s3: Any | None, stream: Any) -> tuple[Path, list[str]]:
    """Where the channel's files are on this machine, and their keys (relative paths)."""
    if channel.is_s3:
        store = stores.open_store(channel.s3_data, s3)
        entries = store.entries()
        if not entries:
            # As SageMaker fails a job whose channel is empty; found at start, since S3 is not read while planning.
            raise UnavailableError(f"inputs.{name}: no objects under {channel.s3_data}; check the bucket and prefix")
        dest = cache_dir / name
        progress = stores.Progress(f"downloading {channel.s3_data}", len(entries), sum(e.size for e in entries), stream)
        stores.copy_all(store, entries, dest, progress.advance)
        progress.done()
        return dest, [entry.key for entry in entries]
    local = channel.local_path
    assert local is not None
    if local.is_file():  # a single file is the only file of its channel, as a one-object prefix would be
        return local.parent, [local.name]
    return local, [entry.key for entry in stores.FileStore(str(local)).entries()]


def _place(root: Path, keys: list[str], target: Path, style: Style) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for key in keys:
        source, dest = root / key, target / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        if style == "symlink":
            dest.symlink_to(source.resolve())
        else:
            _link_or_copy(source.resolve(), dest)


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)  # same file system: no data is copied
    except OSError:
        shutil.copy2(source, dest)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)
