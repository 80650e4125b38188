"""checkpoint_s3_uri / checkpoint_local_path: restore before the start, sync while running and at the end."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smddp_sdk.schedulers.hosttree import checkpoints
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs.job import JobSpec

# A "rank" that resumes from the newest checkpoint it finds and writes one per step, slowly enough
# for the periodic sync to see the first ones while it runs.
WRITER = """
import pathlib, sys, time
d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
start = max([int(p.stem.split('-')[1]) for p in d.glob('step-*.pt')], default=-1) + 1
(d / 'resumed-from.txt').write_text(str(start))
for step in range(start, start + 3):
    (d / f'step-{step}.pt').write_bytes(bytes([step]) * 1000)
    time.sleep(0.4)
"""


def _run_job(roots: list[Path], uri: str, s3=None, interval: float = 0.2) -> tuple[checkpoints.CheckpointSync, list[str]]:
    """One rehearsal: restore, start the sync, run a writer per host, stop; returns what was seen mid-run."""
    sync = checkpoints.for_job(uri, None, roots, interval=interval, s3=s3, stream=io.StringIO())
    assert sync is not None
    sync.restore()
    sync.start()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(checkpoints.host_dir(r, None))]) for r in roots[:1]]
    time.sleep(0.9)
    mid_run = [e.key for e in sync.store.entries()]
    assert all(p.wait(timeout=30) == 0 for p in procs)
    sync.stop()
    return sync, mid_run


def test_file_uri_rerun_resumes(tmp_path: Path) -> None:
    location = tmp_path / "ckpt-store"
    first = [tmp_path / "run1" / f"algo-{i}" for i in (1, 2)]
    _, mid_run = _run_job(first, f"file://{location}")
    assert "step-0.pt" in mid_run, "files are synced while the job runs"
    assert sorted(p.name for p in location.iterdir()) == ["resumed-from.txt", "step-0.pt", "step-1.pt", "step-2.pt"]
    second = [tmp_path / "run2" / f"algo-{i}" for i in (1, 2)]
    _run_job(second, f"file://{location}")
    for root in second:  # every host got the previous run's files before the script started
        assert (checkpoints.host_dir(root, None) / "step-2.pt").read_bytes() == bytes([2]) * 1000
    assert (checkpoints.host_dir(second[0], None) / "resumed-from.txt").read_text() == "3"
    assert (location / "step-5.pt").exists()


def test_s3_uri_rerun_resumes(tmp_path: Path, s3) -> None:
    uri = "s3://data-bucket/jobs/ckpt"
    _, mid_run = _run_job([tmp_path / "run1" / "algo-1"], uri, s3)
    assert "step-0.pt" in mid_run
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="data-bucket")["Contents"])
    assert keys == [f"jobs/ckpt/{n}" for n in ("resumed-from.txt", "step-0.pt", "step-1.pt", "step-2.pt")]
    root = tmp_path / "run2" / "algo-1"
    _run_job([root], uri, s3)
    assert (checkpoints.host_dir(root, None) / "resumed-from.txt").read_text() == "3"


def test_every_host_restores_identical_files_times_and_modes(tmp_path: Path) -> None:
    """A script that resumes from the newest file by modification time picks the same one on every host."""
    location = tmp_path / "store"
    location.mkdir()
    for epoch in range(12):
        checkpoint = location / f"epoch-{epoch}.pt"
        checkpoint.write_bytes(bytes([epoch]) * 100)
        checkpoint.chmod(0o600 if epoch % 2 else 0o644)
        os.utime(checkpoint, ns=(1_700_000_000_000_000_000 + epoch, 1_700_000_000_000_000_000 + epoch * 10**9))
    roots = [tmp_path / f"algo-{i}" for i in (1, 2, 3)]
    sync = checkpoints.for_job(f"file://{location}", None, roots, stream=io.StringIO())
    assert sync is not None and sync.restore() == 12

    def seen(root: Path) -> dict[str, tuple[bytes, int, int]]:
        directory = checkpoints.host_dir(root, None)
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode) for p in directory.iterdir()}

    first = seen(roots[0])
    assert len(first) == 12 and all(seen(root) == first for root in roots[1:])
    assert max(first, key=lambda name: first[name][1]) == "epoch-11.pt"


def test_unchanged_files_are_not_copied_again(tmp_path: Path) -> None:
    root = tmp_path / "algo-1"
    sync = checkpoints.for_job(str(tmp_path / "store"), "/opt/ml/checkpoints/sub", [root], stream=io.StringIO())
    assert sync is not None and sync.host_dirs == [root / "checkpoints" / "sub"]
    sync.restore()
    (sync.host_dirs[0] / "a").write_text("1")
    assert sync.sync_once() == 1
    assert sync.sync_once() == 0
    (sync.host_dirs[0] / "a").write_text("22")
    assert sync.sync_once() == 1


def test_links_in_the_checkpoint_directory_are_not_followed_and_are_named(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("a file of the machine")
    (tmp_path / "machine").mkdir()
    (tmp_path / "machine" / "inner.txt").write_text("another")
    stream = io.StringIO()
    sync = checkpoints.for_job(str(tmp_path / "store"), "/opt/ml/checkpoints", [tmp_path / "algo-1"], stream=stream)
    sync.restore()
    directory = sync.host_dirs[0]
    (directory / "real.pt").write_text("1")
    (directory / "leak.pt").symlink_to(secret)
    (directory / "dir").symlink_to(tmp_path / "machine")
    assert sync.sync_once() == 1
    assert sorted(p.name for p in (tmp_path / "store").rglob("*")) == ["real.pt"]
    assert "leak.pt is a link, not copied" in stream.getvalue() and "dir is a link" in stream.getvalue()


def test_restore_from_an_empty_location_makes_the_directories(tmp_path: Path, s3) -> None:
    roots = [tmp_path / "algo-1", tmp_path / "algo-2"]
    sync = checkpoints.for_job("s3://data-bucket/none", None, roots, s3=s3, stream=io.StringIO())
    assert sync is not None and sync.restore() == 0
    assert all((root / "checkpoints").is_dir() for root in roots)


def test_no_uri_means_no_sync(tmp_path: Path) -> None:
    assert checkpoints.for_job(None, "/opt/ml/checkpoints", [tmp_path]) is None


@pytest.mark.parametrize("path", ["/tmp/ckpt", "relative/ckpt", "/opt/ml", "/opt/ml/../etc"])
def test_checkpoint_path_outside_opt_ml_is_refused(tmp_path: Path, path: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    spec = JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "checkpoint_local_path": path})
    [issue] = checkpoints.issues(spec)
    assert issue.path == "checkpoint_local_path"


def test_default_checkpoint_path_is_accepted_and_noted(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    spec = JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "checkpoint_s3_uri": "s3://b/c"})
    assert checkpoints.issues(spec) == []
    assert "restored into each host's /opt/ml/checkpoints" in checkpoints.notes(spec)[0]


def test_for_plan_finds_the_host_trees_of_local_and_docker_jobs(tmp_path: Path) -> None:
    saved = {"s3_uri": f"file://{tmp_path / 'store'}", "local_path": None}
    local = {"hosts": [{"host": "algo-1", "opt_ml": str(tmp_path / "algo-1")}], "process": {"command": ["python3"]}}
    docker = {"hosts": [{"host": "algo-1", "opt_ml": str(tmp_path / "algo-1"), "container": {"name": "c", "argv": []}}], "backend": "container"}
    for plan in (local, docker):
        sync = checkpoints.for_plan(HostTreePlan.from_json({**plan, "checkpoints": saved}))
        assert sync is not None and sync.host_dirs == [tmp_path / "algo-1" / "checkpoints"]
    assert checkpoints.for_plan(HostTreePlan.from_json(local)) is None
