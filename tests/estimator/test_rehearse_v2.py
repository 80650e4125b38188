"""A SageMaker SDK v2 launcher with S3 inputs and an S3 output_path rehearses on this machine without AWS:
the launcher in docs/migration-v2.md runs as written there (two import lines changed from v2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.estimator import LOCAL_S3_ENV

ROOT = Path(__file__).resolve().parents[2]
TRAIN = """import os
print("train", sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"])), "test", sorted(os.listdir(os.environ["SM_CHANNEL_TEST"])), flush=True)
if os.environ["RANK"] == "0":
    open(os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"), "w").write("weights")
"""


def documented_launcher() -> str:
    """The rehearsal launcher of docs/migration-v2.md, as the page shows it."""
    page = (ROOT / "docs" / "migration-v2.md").read_text()
    section = page.split("## Rehearsing a v2 launcher locally, without AWS", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def no_aws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with no AWS credentials, region or config, S3's stand-in holding the launcher's data."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "SMDDP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "train.py").write_text(TRAIN)
    monkeypatch.chdir(work)
    return tmp_path / "home" / ".smddp" / "s3"


def put(stand_in: Path, key: str, text: str) -> None:
    path = stand_in / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_dry_run_says_where_each_s3_location_is_rehearsed(no_aws: Path) -> None:
    put(no_aws, "my-bucket/data/train/a.csv", "1\n")
    estimator = PyTorch(entry_point="train.py", source_dir="src", instance_type="local", instance_count=2, output_path="s3://my-bucket/runs",
                        checkpoint_s3_uri="s3://my-bucket/ckpt", distribution={"torch_distributed": {"enabled": True}})
    assert estimator.output_path == str(no_aws / "my-bucket" / "runs") and estimator.checkpoint_s3_uri == str(no_aws / "my-bucket" / "ckpt")
    notes = estimator.dryrun({"train": "s3://my-bucket/data/train", "test": "s3://other-bucket/test"}).notes
    assert notes[:4] == (
        f"output_path s3://my-bucket/runs is {no_aws}/my-bucket/runs in this rehearsal (S3 stands in as {no_aws}, {LOCAL_S3_ENV}); no AWS needed",
        f"checkpoint_s3_uri s3://my-bucket/ckpt is {no_aws}/my-bucket/ckpt in this rehearsal (S3 stands in as {no_aws}, {LOCAL_S3_ENV}); no AWS needed",
        f"channel 'train': s3://my-bucket/data/train is read from {no_aws}/my-bucket/data/train in this rehearsal; no AWS needed",
        f"channel 'test': s3://other-bucket/test: goes to S3 with boto3 (credentials needed): {no_aws}/other-bucket does not exist; "
        "make it, with the data under it, to rehearse without AWS",
    )
    assert estimator.dryrun({"train": "s3://other-bucket/train"}).spec.inputs["train"].s3_data == "s3://other-bucket/train"


def test_sagemaker_jobs_keep_their_s3_locations(no_aws: Path) -> None:
    estimator = PyTorch(entry_point="train.py", source_dir="src", instance_type="ml.p4d.24xlarge", instance_count=2, output_path="s3://my-bucket/runs",
                        role="arn:aws:iam::111122223333:role/SageMakerRole")
    assert estimator.scheduler == "sagemaker" and estimator.output_path == "s3://my-bucket/runs"


@pytest.mark.jobs
def test_the_documented_v2_launcher_runs_here_without_aws(no_aws: Path, tmp_path: Path) -> None:
    put(no_aws, "my-bucket/data/train/a.csv", "1\n")
    put(no_aws, "my-bucket/data/test/b.csv", "2\n")
    (tmp_path / "work" / "launch.py").write_text(documented_launcher())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "launch.py"], cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    shown = [line.replace(str(tmp_path / "home"), "~") for line in lines if line.startswith("note:")]
    page = (ROOT / "docs" / "migration-v2.md").read_text()
    for note in shown[:3]:
        assert note in page, note  # the page shows the notes the launcher prints
    assert "[algo-2/rank1]: train ['a.csv'] test ['b.csv']" in lines
    model = Path(lines[-1])
    assert re.fullmatch(rf"{re.escape(str(no_aws))}/my-bucket/runs/pytorch-training-[\d-]+/output/model.tar.gz", str(model)), model
    with tarfile.open(model) as archive:
        assert archive.getnames() == ["model.pt"]
