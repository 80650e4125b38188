"""Literal /opt/ml paths in local mode: every simulated host sees its own tree there, and nothing else does."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.specs.contract import read_failure
from tests.integration.runtime_job import make_job, wait_all

pytestmark = pytest.mark.integration

# An AWS-example-style script: nothing but literal paths, no SM_* lookups for where things are.
LITERAL_PATHS_SCRIPT = """
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
host = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
numbers = open("/opt/ml/input/data/train/numbers.txt").read().split()
assert os.getcwd() == "/opt/ml/code", os.getcwd()
assert os.environ["SM_MODEL_DIR"] == "/opt/ml/model" and os.environ["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
assert dist.is_torchelastic_launched()
total = torch.tensor([float(len(numbers))])
dist.all_reduce(total)
os.makedirs("/opt/ml/checkpoints", exist_ok=True)
open(f"/opt/ml/checkpoints/rank{rank}.ckpt", "w").write(host)
open(f"/opt/ml/output/data/rank{rank}.txt", "w").write(host)
if rank == 0:
    torch.save({"sum": total.item(), "host": host}, "/opt/ml/model/model.pth")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def source(directory: Path, text: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(textwrap.dedent(text))
    return str(directory)


def test_two_hosts_two_ranks_use_literal_opt_ml_paths(workdir):
    data = workdir / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1 2 3")
    estimator = PyTorch(
        entry_point="train.py", source_dir=source(workdir / "src", LITERAL_PATHS_SCRIPT), instance_count=2,
        instance_type="local", distribution={"torch_distributed": {"enabled": True}},
        scheduler_options={"processes_per_host": 2, "stop_grace_period": 2},
    )
    estimator.fit({"train": f"file://{data}"})
    import torch

    with tarfile.open(estimator.model_data) as archive:
        assert archive.getnames() == ["model.pth"]
        archive.extractall(workdir / "model", filter="data")
    assert torch.load(workdir / "model" / "model.pth") == {"sum": 12.0, "host": "algo-1"}
    with tarfile.open(Path(estimator.model_data).with_name("output.tar.gz")) as archive:
        assert sorted(archive.getnames()) == [f"rank{rank}.txt" for rank in range(4)]
        assert archive.extractfile("rank3.txt").read() == b"algo-2"
    job_dir = Path(estimator.latest_training_job.status().job_dir)
    for host, ranks in (("algo-1", (0, 1)), ("algo-2", (2, 3))):  # each host wrote into its own tree only
        checkpoints = job_dir / host / "checkpoints"
        assert sorted(p.name for p in checkpoints.iterdir()) == [f"rank{rank}.ckpt" for rank in ranks]
    assert not Path("/opt/ml/model/model.pth").exists()


@pytest.fixture()
def machine_opt_ml():
    """A real /opt/ml on this machine, as a SageMaker-built AMI or an earlier container run may leave one."""
    opt_ml = Path("/opt/ml")
    if opt_ml.exists():
        pytest.skip("this machine already has an /opt/ml; the test only creates (and removes) its own")
    try:
        (opt_ml / "model").mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot create /opt/ml here ({exc.strerror})")
    (opt_ml / "model" / "machine.txt").write_text("the machine's own file")
    try:
        yield opt_ml
    finally:
        shutil.rmtree(opt_ml)


MACHINE_OPT_ML_SCRIPT = """
import os
seen = sorted(os.listdir("/opt/ml/model"))
open("/opt/ml/model/seen.txt", "w").write(",".join(seen) or "empty")
"""


def test_a_real_opt_ml_on_the_machine_is_hidden_and_untouched(workdir, machine_opt_ml):
    estimator = PyTorch(entry_point="train.py", source_dir=source(workdir / "src", MACHINE_OPT_ML_SCRIPT), instance_type="local")
    estimator.fit()
    with tarfile.open(estimator.model_data) as archive:
        assert archive.extractfile("seen.txt").read() == b"empty"
    assert sorted(p.name for p in (machine_opt_ml / "model").iterdir()) == ["machine.txt"]
    assert (machine_opt_ml / "model" / "machine.txt").read_text() == "the machine's own file"


def test_without_root_an_unprivileged_user_namespace_binds_the_tree(tmp_path):
    """A non-root user (uid 1000 in a user namespace of its own) still gets /opt/ml, through a nested one."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os\nopen('/opt/ml/model/who.txt', 'w').write(str(os.getuid()))\n")
    job = make_job(tmp_path / "job", code, ["algo-1"], {"sagemaker_container_log_level": 10})  # DEBUG: the binding's set-up line
    command = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available here: {probe.stderr.strip()}")
    rc, output = _run_runtime(job, command)
    assert rc == 0, output
    assert "private mount namespace, user namespace" in output
    assert (job.opt_ml("algo-1").model_dir / "who.txt").read_text() == "0"


def test_when_no_namespace_can_be_made_the_host_fails_before_starting_with_exit_3(tmp_path):
    """An unmapped user in a user namespace may create neither kind: the runtime says why and what to do."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("open('/opt/ml/model/ran.txt', 'w').write('ran')\n")
    job = make_job(tmp_path / "job", code, ["algo-1"], {})
    subprocess.run(["chmod", "-R", "a+rwX", str(tmp_path)], check=True)  # the unmapped user writes the failure file
    rc, output = _run_runtime(job, ["unshare", "--user"])
    assert rc == 3, output
    reason = read_failure(job.opt_ml("algo-1")) or ""
    for text in ("cannot give this host its own /opt/ml", "run as root", "scheduler='docker'", "SMDDP_BIND_OPT_ML=0"):
        assert text in reason and text in output
    assert not (job.opt_ml("algo-1").model_dir / "ran.txt").exists()


def _run_runtime(job, wrapper: list[str]) -> tuple[int, str]:
    return wait_all(job.start({"SMDDP_BIND_OPT_ML": "1"}, wrapper=wrapper), 60)["algo-1"]


WHO_SCRIPT = """
import os, time
time.sleep(1)  # both jobs' ranks are alive at the same time
open("/opt/ml/model/who.txt", "w").write(os.environ["TRAINING_JOB_NAME"])
"""


def test_concurrent_jobs_each_see_their_own_opt_ml(workdir):
    estimators = []
    for name in ("opt-ml-job-a", "opt-ml-job-b"):
        estimator = PyTorch(entry_point="train.py", source_dir=source(workdir / name, WHO_SCRIPT), instance_type="local")
        estimator.fit(wait=False, job_name=name)
        estimators.append((name, estimator))
    for name, estimator in estimators:
        estimator.latest_training_job.wait(logs=False)
        with tarfile.open(estimator.model_data) as archive:
            assert archive.extractfile("who.txt").read() == name.encode()
