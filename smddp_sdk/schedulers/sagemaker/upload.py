"""Package the code as SageMaker SDK v2 does (``sourcedir.tar.gz``) and put it in S3.

The archive holds the contents of ``source_dir`` at its root (or only the entry point when there is
no source_dir), and every ``dependencies`` directory at the root under its own name; symlinks are
followed. Like v2 nothing is left out; unlike v2 a big archive gets a warning naming what makes it big.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smddp_sdk.schedulers.sagemaker.client import AwsClients, call, error_code, translate
from smddp_sdk.schedulers.sagemaker.errors import AwsError
from smddp_sdk.schedulers.sagemaker.request import S3Location
from smddp_sdk.specs.job import JobSpec

BIG_TARBALL_BYTES = 100 * 1024 * 1024
LARGEST_SHOWN = 5
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Tarball:
    path: Path
    size: int
    members: tuple[str, ...]
    largest: tuple[tuple[str, int], ...]  # (path in the archive, bytes), biggest first


def code_roots(spec: JobSpec) -> list[tuple[Path, str]]:
    """(local path, name at the archive root) for everything the archive holds, in v2's order."""
    if spec.source_dir:
        source = Path(spec.source_dir)
        roots = [(source / name, name) for name in sorted(os.listdir(source))]
    else:
        entry = Path(spec.entry_point)
        roots = [(entry, entry.name)]
    roots += [(Path(dep), Path(dep).name) for dep in spec.dependencies]
    return roots


def build_sourcedir(spec: JobSpec, directory: Path) -> Tarball:
    """Write ``sourcedir.tar.gz`` for ``spec`` into ``directory``."""
    path = directory / "sourcedir.tar.gz"
    sizes: dict[str, int] = {}

    def record(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if info.isfile():
            sizes[info.name] = info.size
        return info

    with tarfile.open(path, mode="w:gz", dereference=True) as archive:
        for local, name in code_roots(spec):
            archive.add(local, arcname=name, filter=record)
        members = tuple(archive.getnames())
    largest = tuple(sorted(sizes.items(), key=lambda item: -item[1])[:LARGEST_SHOWN])
    return Tarball(path, path.stat().st_size, members, largest)


def big_tarball_warning(tarball: Tarball, limit: int = BIG_TARBALL_BYTES) -> str | None:
    """A warning naming the largest files when the archive is over ``limit`` bytes, else None."""
    if tarball.size <= limit:
        return None
    lines = [f"warning: sourcedir.tar.gz is {_mb(tarball.size)} (every host downloads it before training starts). Largest files:"]
    lines += [f"  {_mb(size):>10}  {name}" for name, size in tarball.largest]
    lines.append("  keep data, checkpoints and virtualenvs out of source_dir: read data from an input channel instead")
    return "\n".join(lines)


def ensure_bucket(clients: AwsClients, bucket: str, *, account: str) -> bool:
    """Create the default bucket when it does not exist, as v2 does; True when it was created."""
    try:
        clients.s3.head_bucket(Bucket=bucket, ExpectedBucketOwner=account)
        return False
    except Exception as exc:  # noqa: BLE001 - the client raises ClientError; its code tells what happened
        code = error_code(exc)
        if code in ("403", "AccessDenied"):
            raise AwsError(
                f"the default bucket {bucket} exists but is not owned by account {account} (or this role may not read it)\n  what to do: pass bucket=... or set code_location and output_path to S3 locations you own",
                code=code,
                exit_code=3,
            ) from None
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise translate(exc, f"check the default bucket {bucket}") from None
    region = clients.region
    params: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        clients.s3.create_bucket(**params)
    except Exception as exc:  # noqa: BLE001
        if error_code(exc) not in ("BucketAlreadyOwnedByYou", "OperationAborted"):  # a concurrent job made it
            raise translate(exc, f"create the default bucket {bucket}") from None
    return True


def upload(clients: AwsClients, tarball: Tarball, location: S3Location, *, expected_owner: str | None, echo: Echo) -> None:
    """Upload with server-side encryption as v2 does, printing progress."""
    extra: dict[str, str] = {"ServerSideEncryption": "aws:kms"}
    if expected_owner:
        extra["ExpectedBucketOwner"] = expected_owner
    progress = Progress(tarball.size, f"uploading sourcedir.tar.gz ({_mb(tarball.size)}) to {location.uri}", echo)
    call(f"upload the code to {location.uri}", clients.s3.upload_file, Filename=str(tarball.path), Bucket=location.bucket, Key=location.key, ExtraArgs=extra, Callback=progress)
    progress.done()


def upload_tree(clients: AwsClients, tree: Path, prefix: S3Location, *, expected_owner: str | None, echo: Echo) -> None:
    """Every file under ``tree`` to ``prefix/<relative path>`` (a v3 channel), symlinks followed, encrypted as v2 does."""
    extra: dict[str, str] = {"ServerSideEncryption": "aws:kms"}
    if expected_owner:
        extra["ExpectedBucketOwner"] = expected_owner
    files = sorted(path for path in tree.rglob("*") if path.is_file())
    echo(f"uploading {len(files)} file{'s' if len(files) != 1 else ''} of {tree.name or tree} to {prefix.uri}")
    for path in files:
        key = f"{prefix.key}/{path.relative_to(tree).as_posix()}"
        call(f"upload {path} to s3://{prefix.bucket}/{key}", clients.s3.upload_file, Filename=str(path), Bucket=prefix.bucket, Key=key, ExtraArgs=extra)


class Progress:
    """Upload progress in 10% steps (the callback is called from the transfer threads)."""

    def __init__(self, total: int, title: str, echo: Echo) -> None:
        self.total = max(total, 1)
        self.sent = 0
        self.shown = -1
        self.echo = echo
        self.lock = threading.Lock()
        echo(title)

    def __call__(self, sent: int) -> None:
        with self.lock:
            self.sent += sent
            step = min(self.sent * 10 // self.total, 10)
            if step > self.shown and step < 10:
                self.shown = step
                self.echo(f"  {step * 10}% ({_mb(self.sent)} of {_mb(self.total)})")

    def done(self) -> None:
        self.echo(f"  100% ({_mb(self.total)})")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
