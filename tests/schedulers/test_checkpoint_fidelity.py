"""Checkpoints restore byte-, time- and mode-identical from every store: a file:// folder and s3:// (moto),
so a script that resumes from the newest file by modification time resumes where it stopped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smddp_sdk.schedulers import stores
from smddp_sdk.schedulers.hosttree.checkpoints import CheckpointSync

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

EPOCHS = {"epoch-1.pt": (b"one" * 100, 0o600, 1_700_000_001_123_456_789),
          "epoch-2.pt": (b"two" * 200, 0o644, 1_700_000_002_987_654_321),
          "sub/run.sh": (b"#!/bin/sh\n", 0o755, 1_700_000_003_000_000_001)}


@pytest.fixture
def s3():
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield client


def write_checkpoints(directory: Path) -> None:
    for key, (data, mode, mtime_ns) in EPOCHS.items():
        path = directory / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        os.utime(path, ns=(mtime_ns, mtime_ns))


def seen(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    return {path.relative_to(directory).as_posix(): (path.read_bytes(), path.stat().st_mode & 0o7777, path.stat().st_mtime_ns)
            for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("where", ["file", "s3"])
def test_synced_checkpoints_restore_identical_on_every_host(tmp_path: Path, s3, where: str) -> None:
    uri = "s3://ckpt/jobs/a/checkpoints" if where == "s3" else f"file://{tmp_path / 'store'}"
    first = [tmp_path / "run1" / host for host in ("algo-1", "algo-2")]
    write_checkpoints(first[0])
    sync = CheckpointSync(uri, first, s3=s3, stream=open(os.devnull, "w"))
    assert sync.sync_once() == len(EPOCHS)
    assert sync.newest_written == pytest.approx(1_700_000_003.000_000_001)
    again = [tmp_path / "run2" / host for host in ("algo-1", "algo-2")]
    restored = CheckpointSync(uri, again, s3=s3, stream=open(os.devnull, "w"))
    assert restored.restore() == len(EPOCHS)
    for host in again:
        assert seen(host) == {key: (data, mode, mtime_ns) for key, (data, mode, mtime_ns) in EPOCHS.items()}
    newest = max(again[1].glob("epoch-*.pt"), key=lambda path: path.stat().st_mtime_ns)
    assert newest.name == "epoch-2.pt"  # the newest by time is the newest by epoch, as before the restore
    assert restored.sync_once() == 0  # what came from the location does not go back


def test_an_object_without_metadata_downloads_as_before_and_a_bucket_grants_no_write_to_others(tmp_path: Path, s3) -> None:
    s3.put_object(Bucket="ckpt", Key="plain/a.bin", Body=b"x")
    s3.put_object(Bucket="ckpt", Key="plain/b.bin", Body=b"y", Metadata={"mtime": "12.5", "mode": "4777"})
    s3.put_object(Bucket="ckpt", Key="plain/c.bin", Body=b"z", Metadata={"mtime": "soon", "mode": "rwx"})
    store = stores.open_store("s3://ckpt/plain", s3)
    for entry in store.entries():
        store.download(entry.key, tmp_path / entry.key)
    assert (tmp_path / "a.bin").read_bytes() == b"x"
    assert (tmp_path / "b.bin").stat().st_mtime_ns == 12_500_000_000
    assert (tmp_path / "b.bin").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "c.bin").stat().st_mtime > 1_000_000_000  # malformed: the download's own time
