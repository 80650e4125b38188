"""``checkpoint_s3_uri`` on Slurm, as local and docker jobs sync it (``hosttree.checkpoints``): the batch script
runs ``python -m smddp_sdk.schedulers.slurm.checkpoint_sync restore <job dir>`` before the job step and
``... follow <job dir>`` beside it, on the first node.

- ``restore`` copies the location's files, byte-, time- and mode-identical, into the job's ``checkpoints/``
  folder, which every node sees as ``/opt/ml/checkpoints`` (a link on the shared file system), and notes
  what it brought back in ``checkpoint-sync.json`` so that ``follow`` does not copy it out again;
- ``follow`` copies new or changed files out every 5 s while the step runs, and makes a last pass when the
  batch script stops it (SIGTERM) after the step: so a requeue, or a rerun of the job, restores them.

A restore that fails (no credentials, no bucket) fails the job before its step: a job that would silently
start from scratch is the failure this module exists to prevent.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

STOPPED = threading.Event()  # SIGTERM: the batch script's word that the step ended
signal.signal(signal.SIGTERM, lambda *_: STOPPED.set())  # first, so that no stop is lost while importing

from smddp_sdk.errors import SmddpError  # noqa: E402
from smddp_sdk.schedulers.hosttree.checkpoints import CheckpointSync  # noqa: E402
from smddp_sdk.specs.json_files import read_json_object, write_json_atomic  # noqa: E402
from smddp_sdk.specs.slurm_job import SlurmJobDir  # noqa: E402

MARKS = "checkpoint-sync.json"


def sync_of(job_dir: SlurmJobDir) -> CheckpointSync:
    record = read_json_object(job_dir.record_file) or {}
    uri = (record.get("plan") or {}).get("checkpoint_s3_uri")
    if not uri:
        raise SystemExit(f"smddp: {job_dir.record_file} names no checkpoint_s3_uri to sync")
    return CheckpointSync(uri, [job_dir.checkpoint_dir], stream=sys.stdout)


def restore(job_dir: SlurmJobDir) -> int:
    sync = sync_of(job_dir)
    sync.restore()
    write_json_atomic(job_dir.path / MARKS, {key: list(mark) for key, mark in sync.synced.items()})
    return 0


def follow(job_dir: SlurmJobDir) -> int:
    sync = sync_of(job_dir)
    sync.remember({key: tuple(mark) for key, mark in (read_json_object(job_dir.path / MARKS) or {}).items()})
    sync.start()
    print(f"smddp: syncing {job_dir.checkpoint_dir} to {sync.uri} while the step runs", flush=True)
    STOPPED.wait()
    sync.stop()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("restore", "follow"):
        print("usage: python -m smddp_sdk.schedulers.slurm.checkpoint_sync restore|follow <job dir>", file=sys.stderr)
        return 2
    try:
        return (restore if argv[0] == "restore" else follow)(SlurmJobDir(Path(argv[1])))
    except SmddpError as exc:
        print(f"smddp: error: checkpoint_s3_uri: {exc}", flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
