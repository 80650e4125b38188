"""Script mode, jobs by name, logs filters, list and clean against the real local scheduler."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smddp_sdk import PyTorch, job_index
from smddp_sdk.cli.main import insert_default_command
from tests.cli.test_run_local import TRAIN

pytestmark = pytest.mark.integration
COMMANDS = {"run": None, "logs": None}


@pytest.fixture
def job_root(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (isolated / "train.py").write_text(TRAIN)
    root = isolated.parent / "jobs"
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))  # also for the in-process job index lookups below
    return root


def test_script_arguments_are_split_torchrun_style() -> None:
    split = insert_default_command
    assert split(["train.py", "--epochs", "3"], COMMANDS) == ["run", "train.py", "--", "--epochs", "3"]
    assert split(["--debug", "--nnodes", "2", "--nproc-per-node=4", "--dryrun", "train.py", "--lr", "0.1"], COMMANDS) == [
        "--debug", "run", "--nnodes", "2", "--nproc-per-node=4", "--dryrun", "train.py", "--", "--lr", "0.1"]
    assert split(["logs", "train.py"], COMMANDS) == ["logs", "train.py"]  # a command word first: not a script
    assert split(["job.yaml", "--", "--script", "x.py"], COMMANDS) == ["run", "job.yaml", "--", "--script", "x.py"]
    # after the script everything is the script's, --dryrun included (a warning says so)
    assert split(["train.py", "data.csv", "--fp16", "--dryrun"], COMMANDS) == ["run", "train.py", "--", "data.csv", "--fp16", "--dryrun"]
    # torchrun's flags are run's own options, parsed with their values
    assert split(["--hosts", "2", "--max-restarts", "3", "train.py"], COMMANDS) == ["run", "--hosts", "2", "--max-restarts", "3", "train.py", "--"]


def test_arguments_after_a_script_reach_it_untouched(invoke, job_root: Path) -> None:
    args = ["data.csv", "--fp16", "--lr=0.1", "--epochs", "3", "--dryrun", "-v", "--"]
    result = invoke("--hosts", "2", "train.py", *args)
    assert result.exit_code == 0, result.output
    assert f"[algo-2/rank1]: rank 1 of 2 args {args}" in result.stdout.splitlines()


def test_arguments_after_a_job_files_double_dash_are_typed_hyperparameters(invoke, job_root: Path) -> None:
    Path("job.yaml").write_text("entry_point: train.py\ninstance_type: local\n")
    result = invoke("run", "job.yaml", "--dryrun", "-H", "seed=7", "--", "--epochs", "3", "--lr=0.1", "--name", "resnet")
    assert result.exit_code == 0, result.output
    request = result.stdout.split("=== REQUEST")[1]
    assert '"epochs": "3"' in request and '"lr": "0.1"' in request and '"seed": "7"' in request and '"name": "\\"resnet\\""' in request
    flag = invoke("run", "job.yaml", "--", "--fp16")
    assert flag.exit_code == 2 and "has no value" in flag.stderr and "train.py --fp16" in flag.stderr


def test_a_script_runs_on_simulated_hosts_and_is_found_by_name(invoke, job_root: Path) -> None:
    result = invoke("--hosts", "2", "--nproc-per-host", "2", "train.py", "--epochs", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "[algo-2/rank3]: rank 3 of 4 args ['--epochs', '2']" in lines
    name = result.stderr.splitlines()[-3].split()[-1]
    assert name.startswith("train-")

    status = invoke("status", name, "--json")
    assert status.exit_code == 0 and json.loads(status.stdout)["state"] == "SUCCEEDED"
    assert invoke("logs", name, "--rank", "3").stdout.splitlines() == ["[algo-2/rank3]: rank 3 of 4 args ['--epochs', '2']"]
    assert len(invoke("logs", name, "--tail", "2").stdout.splitlines()) == 2
    assert invoke("logs", name, "--grep", "rank [02] of").stdout.count("\n") == 2
    no_rank = invoke("logs", name, "--rank", "9")
    assert no_rank.exit_code == 2 and "has no lines from ranks 9" in no_rank.stderr and "ranks 0-3" in no_rank.stderr
    assert invoke("logs", name, "--since", "1h").stdout == invoke("logs", name).stdout  # every line stamped when captured
    assert invoke("logs", name, "--since", "2100-01-01T00:00").stdout == ""
    stamped = invoke("logs", name, "-t", "--rank", "3").stdout
    assert re.match(r"^20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[algo-2/rank3\]: rank 3", stamped), stamped
    bad_since = invoke("logs", name, "--since", "yesterday")
    assert bad_since.exit_code == 2 and "neither a duration" in bad_since.stderr

    typo = invoke("status", name[:-1] + "x")
    assert typo.exit_code == 2 and f"(did you mean '{name}'?)" in typo.stderr

    attached = PyTorch.attach(name)
    assert attached.entry_point.endswith("train.py") and attached.instance_count == 2
    assert attached.latest_training_job.describe()["TrainingJobStatus"] == "Completed"

    listed = invoke("list")
    assert listed.stdout.splitlines()[1].startswith(f"local://{name}  SUCCEEDED")


def test_a_missing_script_is_a_usage_error(invoke, job_root: Path) -> None:
    result = invoke("nope.py", "--epochs", "1")
    assert result.exit_code == 2 and "script 'nope.py' does not exist" in result.stderr


def test_clean_removes_finished_jobs_and_their_index_entries(invoke, job_root: Path) -> None:
    for name in ("old-1", "old-2"):
        assert invoke("--job-name", name, "train.py").exit_code == 0
    assert {entry.name for entry in job_index.entries()} == {"old-1", "old-2"}
    dry = invoke("clean", "--dry-run")
    assert dry.exit_code == 0 and "Would remove 2 jobs" in dry.stderr and (job_root / "old-1").is_dir()
    assert invoke("clean", "--older-than", "1d").stderr.strip().endswith("Removed 0 jobs.")
    only = invoke("clean", "old-1")
    assert only.exit_code == 0 and not (job_root / "old-1").exists() and (job_root / "old-2").is_dir()
    assert [entry.name for entry in job_index.entries()] == ["old-2"]
    assert invoke("clean").exit_code == 0 and not (job_root / "old-2").exists()
    assert invoke("list").stderr.startswith("No jobs yet")
    bad = invoke("clean", "--older-than", "soon")
    assert bad.exit_code == 2


def test_progress_bar_redraws_keep_their_rank_and_prefix(invoke, job_root: Path) -> None:
    Path("bar.py").write_text("import os, sys\nsys.stderr.write(f'\\r{os.environ[\"RANK\"]}: 50%\\r100%\\n')\nprint('after', flush=True)\n")
    result = invoke("--hosts", "2", "--job-name", "bar", "bar.py")
    assert result.exit_code == 0, result.output
    assert "[algo-2/rank1]: \r[algo-2/rank1]: 1: 50%\r[algo-2/rank1]: 100%" in result.stdout.split("\n")
    assert invoke("logs", "bar", "--rank", "1").stdout.split("\n")[:-1] == ["[algo-2/rank1]: \r[algo-2/rank1]: 1: 50%\r[algo-2/rank1]: 100%", "[algo-2/rank1]: after"]


def test_a_misspelt_script_gets_a_did_you_mean(invoke, job_root: Path) -> None:
    assert "did you mean 'train.py'?" in invoke("trian.py").stderr
    Path("job.yaml").write_text("entry_point: trains.py\ninstance_type: local\n")
    assert "file 'trains.py' does not exist (did you mean 'train.py'?)" in invoke("validate", "job.yaml").stderr


def test_the_header_counts_the_ranks_that_run_not_the_instance_types_gpus(invoke, job_root: Path) -> None:
    result = invoke("--dryrun", "--scheduler", "local", "--instance-type", "ml.p4d.24xlarge", "--nproc-per-host", "2", "train.py")
    assert result.exit_code == 0, result.output
    assert "1 host × ml.p4d.24xlarge, 2 ranks each" in result.stderr and "GPUs each" not in result.stderr
