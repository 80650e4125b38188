"""A real local job whose script plants links in its model and output directories: the archives hold the
job's own files only, and the job's failure file cannot be pointed at a file of the machine."""

from __future__ import annotations

import os
import stat
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk import PyTorch

pytestmark = pytest.mark.integration

HOSTILE_SCRIPT = """
import os
model, data = os.environ["SM_MODEL_DIR"], os.environ["SM_OUTPUT_DATA_DIR"]
os.makedirs(data, exist_ok=True)
with open(os.path.join(model, "weights.bin"), "wb") as handle:
    handle.write(b"w" * 64)
os.symlink("weights.bin", os.path.join(model, "alias.bin"))
os.symlink({secret!r}, os.path.join(model, "leak.txt"))
os.symlink("/", os.path.join(model, "root"))
os.mkfifo(os.path.join(model, "pipe"))
os.symlink({secret!r}, os.path.join(data, "leak.txt"))
"""


def test_model_archive_keeps_links_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    secret = tmp_path / "secret.txt"
    secret.write_text("a file of the machine\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(HOSTILE_SCRIPT.format(secret=str(secret))))
    estimator = PyTorch(entry_point="train.py", instance_type="local", instance_count=2)
    estimator.fit(logs=False)
    with tarfile.open(estimator.model_data) as archive:
        names = sorted(archive.getnames())
        content = b"".join(archive.extractfile(m).read() for m in archive.getmembers() if m.isfile())
    assert names == ["alias.bin", "weights.bin"]
    assert b"a file of the machine" not in content
    with tarfile.open(Path(estimator.model_data).with_name("output.tar.gz")) as archive:
        assert archive.getnames() == []
    assert os.path.exists(secret)


FAILURE_LINK_SCRIPT = """
import os, sys
os.makedirs(os.environ["SM_OUTPUT_DIR"], exist_ok=True)
os.symlink({secret!r}, os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"))
sys.exit(3)
"""


def test_a_failure_file_linked_to_a_secret_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from smddp_sdk.errors import JobFailedError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    secret = tmp_path / "secret.txt"
    secret.write_text("a file of the machine\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(FAILURE_LINK_SCRIPT.format(secret=str(secret))))
    estimator = PyTorch(entry_point="train.py", instance_type="local")
    with pytest.raises(JobFailedError) as caught:
        estimator.fit(logs=False)
    assert "a file of the machine" not in str(caught.value)
    status = estimator.latest_training_job.describe()
    assert "a file of the machine" not in str(status)


def test_job_files_are_the_callers_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/local-mode.md: the job directory is 0700 and what the supervisor and the runtimes write is 0600,
    code and host trees included; the ranks write as on SageMaker (umask 0022), inside that directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    (tmp_path / "train.py").write_text(textwrap.dedent(HOSTILE_SCRIPT.format(secret=str(tmp_path / "none"))))
    (tmp_path / "train.py").chmod(0o755)
    PyTorch(entry_point="train.py", instance_type="local", instance_count=2).fit(logs=False)
    (job_dir,) = (tmp_path / "jobs").glob("pytorch-training-*")
    assert job_dir.stat().st_mode & 0o777 == 0o700
    by_ranks = {job_dir / host / "model" / "weights.bin" for host in ("algo-1", "algo-2")}
    assert {path.stat().st_mode & 0o777 for path in by_ranks} == {0o644}, by_ranks  # umask 0022, as on SageMaker
    shared = [f"{oct(p.lstat().st_mode & 0o777)} {p}" for p in (tmp_path / "jobs").rglob("*")
              if p not in by_ranks and not p.is_symlink() and not stat.S_ISFIFO(p.lstat().st_mode) and p.lstat().st_mode & 0o077]
    assert shared == [], shared
