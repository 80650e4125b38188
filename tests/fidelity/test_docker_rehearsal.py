"""Channels (local, sharded, S3 through moto) and restored checkpoints in docker mode: each container's /opt/ml holds real files (links to
this machine's paths would dangle there). Uses the image the engine already has; delivery happens on
this side, so any image with the runtime will do."""

from __future__ import annotations

import json
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.schedulers.docker import DEFAULT_IMAGE
from tests.docker.conftest import docker_engine, leftovers  # noqa: F401 - the engine fixture

pytestmark = pytest.mark.docker

SCRIPT = """
import json, os
channel = os.environ["SM_CHANNEL_TRAINING"]
files = sorted(os.path.relpath(os.path.join(d, f), channel) for d, _, fs in os.walk(channel) for f in fs)
restored = sorted(os.listdir("/opt/ml/checkpoints"))
extra = os.environ["SM_CHANNEL_EXTRA"]
from_s3 = {name: open(os.path.join(extra, name)).read() for name in sorted(os.listdir(extra))}
with open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"] + ".json"), "w") as f:
    json.dump({"files": files, "bodies": [open(os.path.join(channel, p)).read() for p in files], "restored": restored, "from_s3": from_s3}, f)
"""


@pytest.fixture
def image(docker_engine: None) -> str:  # noqa: F811 - pytest fixture injection
    if subprocess.run(["docker", "image", "inspect", DEFAULT_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"{DEFAULT_IMAGE} is not in the engine: build it with scripts/build-image.sh")
    return DEFAULT_IMAGE


def test_sharded_channel_s3_channel_and_checkpoints_in_containers(image: str, tmp_path: Path, s3) -> None:
    s3.put_object(Bucket="data-bucket", Key="extra/a.txt", Body=b"from s3")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(textwrap.dedent(SCRIPT))
    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        (data / f"part-{i}.csv").write_text(f"row {i}")
    store = tmp_path / "ckpt"
    store.mkdir()
    (store / "epoch-3.pt").write_text("weights")
    estimator = PyTorch(entry_point="train.py", source_dir=str(tmp_path / "src"), instance_type="local", instance_count=2,
                        checkpoint_s3_uri=f"file://{store}", job_name="docker-fidelity", scheduler="docker",
                        scheduler_options={"job_root": str(tmp_path / "jobs"), "stop_grace_period": 5})
    try:
        estimator.fit({"training": {"s3_data": str(data), "distribution": "ShardedByS3Key"}, "extra": "s3://data-bucket/extra"}, logs=False)
    finally:
        estimator.latest_training_job.stop()
    with tarfile.open(estimator.model_data) as archive:
        seen = {name.removesuffix(".json"): json.load(archive.extractfile(name)) for name in archive.getnames()}
    assert seen["algo-1"]["files"] == ["part-0.csv", "part-2.csv", "part-4.csv"]
    assert seen["algo-2"]["files"] == ["part-1.csv", "part-3.csv"] and seen["algo-2"]["bodies"] == ["row 1", "row 3"]
    assert seen["algo-1"]["restored"] == seen["algo-2"]["restored"] == ["epoch-3.pt"]
    assert seen["algo-1"]["from_s3"] == seen["algo-2"]["from_s3"] == {"a.txt": "from s3"}
    assert leftovers("docker-fidelity") == ([], [])
