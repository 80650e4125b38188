"""Where job data lives outside this machine's job directory: an S3 prefix or a ``file://`` directory.

One small interface (list, download, upload) for both, so channels and checkpoints handle ``s3://``
and ``file://`` URIs the same way. A file uploaded and downloaded again is byte-, time- and mode-identical:
a folder keeps both itself (``shutil.copy2``), an S3 object carries them in its user metadata, as rclone
writes them (``mtime``: seconds since the epoch with nanoseconds, ``mode``: octal permission bits), and a
download sets them back (objects without them keep the download's time and the umask's mode; a mode
from a bucket never gives others write access nor sets special bits). boto3 is imported only when an ``s3://`` location is used, so the
local and docker schedulers keep working without it for local data.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError


@dataclass(frozen=True)
class Entry:
    """One object under a location: its key relative to the location, size and modification stamp."""

    key: str
    size: int
    stamp: str


class Store(Protocol):
    uri: str

    def entries(self) -> list[Entry]: ...

    def download(self, key: str, dest: Path) -> None: ...

    def upload(self, source: Path, key: str) -> None: ...


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not uri.startswith("s3://"):
        raise SpecError(SpecIssue("", f"{uri!r} is not an s3:// URI"))
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise SpecError(SpecIssue("", f"{uri!r} names no bucket", "write s3://<bucket>/<prefix>"))
    return bucket, prefix


def s3_client(region: str | None = None) -> Any:
    """A boto3 S3 client from the usual credential chain (``AWS_PROFILE``, env, instance role...)."""
    try:
        import boto3  # only S3 locations need it
    except ImportError:
        raise UnavailableError("s3:// data needs boto3: pip install 'smddp-sdk[aws]'") from None
    return boto3.session.Session(region_name=region).client("s3")


def file_metadata(stat: os.stat_result) -> dict[str, str]:
    """What an S3 object keeps of its file: modification time (exact to the nanosecond) and mode."""
    seconds, nanos = divmod(stat.st_mtime_ns, 1_000_000_000)
    return {"mtime": f"{seconds}.{nanos:09d}", "mode": f"{stat.st_mode & 0o7777:o}"}


def apply_metadata(path: Path, metadata: dict[str, str]) -> None:
    """Give a downloaded file the time and mode its object's metadata recorded (what is missing or
    malformed is left as the download made it)."""
    seconds, _, fraction = (metadata.get("mtime") or "").partition(".")
    if seconds.isdigit() and (fraction.isdigit() or not fraction):
        mtime_ns = int(seconds) * 1_000_000_000 + int((fraction or "0")[:9].ljust(9, "0"))
        os.utime(path, ns=(mtime_ns, mtime_ns))
    mode = metadata.get("mode") or ""
    if mode and all(char in "01234567" for char in mode) and int(mode, 8) <= 0o7777:
        os.chmod(path, int(mode, 8) & 0o755)  # never special bits, nor a write bit for others, from a bucket


class S3Store:
    """The objects under an S3 location. As SageMaker SDK v2's local mode downloads a channel, a URI
    that names one object gives that object (under its file name); otherwise the URI is a folder and
    keys are relative to it: ``s3://b/data/train`` holding ``data/train/x/a.csv`` gives ``x/a.csv``."""

    def __init__(self, uri: str, client: Any | None = None) -> None:
        self.uri = uri
        self.bucket, self.prefix = split_s3_uri(uri)
        self.folder = self.prefix.rstrip("/") + "/" if self.prefix.strip("/") else ""
        self._single = False  # set by entries() when the URI names one object
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def _objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            yield from page.get("Contents", ())

    def entries(self) -> list[Entry]:
        try:
            objects = list(self._objects(self.prefix)) if self.prefix else []
            single = [obj for obj in objects if obj["Key"] == self.prefix and not self.prefix.endswith("/")]
            if single:
                self._single = True
                return [Entry(self.prefix.rsplit("/", 1)[-1], single[0]["Size"], single[0].get("ETag", ""))]
            found = [obj for obj in self._objects(self.folder) if not obj["Key"].endswith("/")]
        except Exception as exc:  # botocore's errors: no bucket, no credentials, access denied
            raise UnavailableError(f"cannot list {self.uri}: {exc}") from exc
        return sorted((Entry(obj["Key"][len(self.folder):], obj["Size"], obj.get("ETag", "")) for obj in found), key=lambda e: e.key)

    def download(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        full = self.prefix if self._single else self.folder + key
        try:
            self.client.download_file(self.bucket, full, str(dest))
            metadata = self.client.head_object(Bucket=self.bucket, Key=full).get("Metadata") or {}
        except Exception as exc:
            raise UnavailableError(f"cannot download s3://{self.bucket}/{full}: {exc}") from exc
        apply_metadata(dest, metadata)

    def upload(self, source: Path, key: str) -> None:
        full = self.folder + key
        try:
            self.client.upload_file(str(source), self.bucket, full, ExtraArgs={"Metadata": file_metadata(source.stat())})
        except Exception as exc:
            raise UnavailableError(f"cannot upload {source} to s3://{self.bucket}/{full}: {exc}") from exc


class FileStore:
    """A local directory (or single file) named by a ``file://`` URI or a plain path."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = Path(uri.removeprefix("file://")).expanduser()

    def entries(self) -> list[Entry]:
        if self.root.is_file():
            stat = self.root.stat()
            return [Entry(self.root.name, stat.st_size, str(stat.st_mtime_ns))]
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.rglob("*"):
            if path.is_file():
                stat = path.stat()
                found.append(Entry(path.relative_to(self.root).as_posix(), stat.st_size, str(stat.st_mtime_ns)))
        return sorted(found, key=lambda entry: entry.key)

    def path_of(self, key: str) -> Path:
        return self.root if self.root.is_file() else self.root / key

    def download(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.path_of(key), dest)

    def upload(self, source: Path, key: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        shutil.copy2(source, partial)
        os.replace(partial, target)  # a reader (a rerun's restore) never sees half a file


def open_store(uri: str, s3: Any | None = None) -> Store:
    """The store behind ``uri``: ``s3://`` through boto3 (or the given client), anything else on disk."""
    return S3Store(uri, s3) if uri.startswith("s3://") else FileStore(uri)


class Progress:
    """``downloading s3://...: 3/10 files, 12.0/40.0 MB`` rewritten in place on a terminal; one line
    at the end otherwise, so logs are not flooded."""

    def __init__(self, what: str, total_files: int, total_bytes: int, stream: Any = None) -> None:
        self.what = what
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.files = 0
        self.bytes = 0
        self._last = 0.0

    def advance(self, size: int) -> None:
        self.files += 1
        self.bytes += size
        now = time.monotonic()
        if self.tty and (now - self._last > 0.1 or self.files == self.total_files):
            self._last = now
            self.stream.write(f"\r{self._line()}")
            self.stream.flush()

    def done(self) -> None:
        self.stream.write(("\r" if self.tty else "") + self._line() + "\n")
        self.stream.flush()

    def _line(self) -> str:
        return f"smddp: {self.what}: {self.files}/{self.total_files} files, {self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB"


def copy_all(store: Store, entries: list[Entry], dest: Path, progress: Callable[[int], None] | None = None) -> None:
    for entry in entries:
        store.download(entry.key, dest / entry.key)
        if progress is not None:
            progress(entry.size)
