"""What real scripts (AWS's SMDDP examples, an FSDP script from the HyperPod samples) met, now as on SageMaker
or said: relative paths land in each host's own copy of the code (the dry run and the job say so), a
requirements.txt is announced and its failure shows pip's error, files are 0644 (umask 0022), and
torch_distributed ranks get torchrun's variables, not mpirun's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from smddp_sdk.runtime import env as rank_env
from smddp_sdk.runtime import usercode
from smddp_sdk.runtime.plan import LaunchShape, plan_ranks
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.specs.job import JobSpec
from tests.runtime.test_env import read, write_tree

MPI_STYLE = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SMDATAPARALLEL_LOCAL_RANK"}


@pytest.mark.parametrize(("shape", "mpi_style"), [(LaunchShape.TORCH_DISTRIBUTED, False), (LaunchShape.SMDISTRIBUTED, True), (LaunchShape.PYTORCHDDP, True)])
def test_only_mpirun_style_launchers_give_the_mpi_variables(tmp_path: Path, shape: LaunchShape, mpi_style: bool) -> None:
    write_tree(tmp_path, current="algo-1")
    env = read(tmp_path)
    plan = plan_ranks(env.ordered_hosts, env.current_host, shape, 2)
    variables = rank_env.rank_env(env, plan, plan.local_slots[1])
    assert (set(variables) >= MPI_STYLE) is mpi_style and (MPI_STYLE & set(variables) == set()) is not mpi_style
    assert (variables["RANK"], variables["LOCAL_RANK"], variables["WORLD_SIZE"]) == ("1", "1", "4")


def test_a_failed_requirements_install_shows_pips_error_not_its_first_warning(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('never')\n")
    (tmp_path / "requirements.txt").write_text("./no-such-package-dir\n")
    said: list[str] = []
    with pytest.raises(usercode.InstallError) as failed:
        usercode.install(tmp_path, usercode.EntryPointKind.PYTHON_PROGRAM, said.append)  # real pip, no network needed
    headline = str(failed.value).splitlines()[0]
    assert headline.startswith(f"pip could not install requirements.txt in {tmp_path}: ") and "no-such-package-dir" in headline, headline
    assert said[0].startswith("installing requirements.txt of the code: ")  # announced in the host's log


def test_an_install_without_network_says_how_to_install_from_wheels() -> None:
    tail = ["WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by "
            "'NewConnectionError(...: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/numpy/",
            "ERROR: Could not find a version that satisfies the requirement numpy (from versions: none)",
            "ERROR: No matching distribution found for numpy"]
    message = usercode.pip_failure("requirements.txt", Path("/opt/ml/code"), 1, tail)
    assert message.startswith("pip could not install requirements.txt in /opt/ml/code: No matching distribution found for numpy; without network")
    assert "wheelhouse" in message and "pip download -r requirements.txt -d wheels" in message
    assert message.count("WARNING: Retrying") == 1  # pip's lines still follow, after its error


def test_the_dry_run_says_that_requirements_are_installed(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    spec = JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(tmp_path), "instance_type": "local", "instance_count": 2})
    for scheduler in ("local", "slurm"):
        notes = get_scheduler(scheduler, job_root=str(tmp_path / "jobs")).dryrun(spec).notes
        assert any(note.startswith("requirements.txt (") and "pip-installed on every host" in note for note in notes), notes


SCRIPT = """\
import json, os
os.makedirs("checkpoints", exist_ok=True)
open(f"checkpoints/shard-{os.environ['RANK']}.pt", "w").write("state")  # relative: this host's copy of the code
open(os.path.join(os.environ["SM_MODEL_DIR"], f"model-{os.environ['RANK']}.txt"), "w").write("weights")
umask = os.umask(0)
json.dump({"umask": umask, "names": sorted(os.environ)}, open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"env-{os.environ['RANK']}.json"), "w"))
"""


@pytest.mark.jobs
def test_a_torchrun_style_job_writes_0644_files_and_is_told_where_its_relative_files_went(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "SMDDP_JOB_ROOT": str(tmp_path / "jobs")}
    run = subprocess.run([sys.executable, "-m", "smddp_sdk.cli", "--hosts", "2", "--job-name", "real", "train.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    told = [line for line in run.stdout.splitlines() if "the ranks wrote checkpoints/ in /opt/ml/code, this host's own copy" in line]
    assert sorted(line.split("]")[0] for line in told) == ["[algo-1", "[algo-2"], run.stdout
    output = tmp_path / "jobs" / "real" / "output"
    with tarfile.open(output / "model.tar.gz") as model:
        modes = {member.name: member.mode for member in model.getmembers() if member.isfile()}
    assert modes == {"model-0.txt": 0o644, "model-1.txt": 0o644}, modes  # umask 0022, as in docker, Slurm and SageMaker
    with tarfile.open(output / "output.tar.gz") as archive:
        seen = [json.load(archive.extractfile(name)) for name in ("env-0.json", "env-1.json")]
    for ranks_view in seen:
        assert ranks_view["umask"] == 0o022
        assert not MPI_STYLE & set(ranks_view["names"]) and "TORCHELASTIC_RUN_ID" in ranks_view["names"]


@pytest.mark.jobs
def test_ranks_that_slurms_cancel_reaches_before_their_runtime_are_stopped_not_failed(tmp_path: Path) -> None:
    """scancel signals every process of the step at once, in no order: here the ranks get SIGTERM first."""
    from tests.integration.runtime_job import make_job, wait_all

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    job = make_job(tmp_path / "job", code, ["algo-1"], {"sagemaker_pytorch_ddp_enabled": True}, num_gpus=2)
    runtime = job.start()["algo-1"]
    children = Path(f"/proc/{runtime.pid}/task/{runtime.pid}/children")
    deadline = time.monotonic() + 60
    while len(children.read_text().split()) < 2 or not all(job.opt_ml("algo-1").rank_log_file(r).exists() and "up" in job.opt_ml("algo-1").rank_log_file(r).read_text() for r in (0, 1)):
        assert time.monotonic() < deadline and runtime.poll() is None, "the ranks did not start"
        time.sleep(0.2)
    for pid in children.read_text().split():
        os.kill(int(pid), signal.SIGTERM)
    time.sleep(0.2)
    runtime.send_signal(signal.SIGTERM)
    (code_, out), = wait_all({"algo-1": runtime}, timeout=60).values()
    assert code_ == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM" in out and "exit code 143" not in out.split("stopped by SIGTERM")[0] and "this host failed" not in out, out
