"""A torchrun user's habits, as the docs write them: the working directory is the code, torchrun's flags
mean what they mean to torchrun (or are refused with what to use), options before the script are
options, and `list`/`clean` keep to the caller's own jobs. Dry runs start nothing; the tests marked
``jobs`` run real local jobs."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.cli.main import insert_default_command
from smddp_sdk.cli.torchrun import CODE_LIMIT_BYTES, CODE_LIMIT_FILES
from smddp_sdk.specs.status import billing_lines

NOBODY = 65534
COMMANDS = {"run": None, "logs": None, "list": None}


def plan_of(result) -> dict:
    """The typed plan a local dry run prints under === REQUEST (local) ===."""
    assert result.exit_code == 0, result.output
    request = result.stdout.split("=== REQUEST (local) ===\n", 1)[1].split("\n=== NOTES ===", 1)[0]
    return json.loads(request)


def notes_of(result) -> str:
    return result.stdout.split("=== NOTES ===", 1)[1]


@pytest.fixture
def project(isolated: Path) -> Path:
    """The issue's directory: a script that imports a helper module and opens a data file by a relative path."""
    (isolated / "train2.py").write_text("import myutils, sys, os\nprint(myutils.X, open(sys.argv[1]).read().strip(), os.environ['TORCHELASTIC_RESTART_COUNT'])\n")
    (isolated / "myutils.py").write_text("X = 42\n")
    (isolated / "data.csv").write_text("a,b\n")
    return isolated


def test_the_working_directory_ships_and_the_dry_run_says_what_and_how_big(invoke, project: Path) -> None:
    for junk in (".git/objects", "__pycache__", ".venv/lib", "env/lib"):
        (project / junk).mkdir(parents=True)
        (project / junk / "big.bin").write_bytes(b"x" * 300_000)
    (project / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a virtualenv by another name
    result = invoke("--hosts", "1", "--nproc-per-host", "2", "--dryrun", "train2.py", "data.csv")
    plan = plan_of(result)
    assert plan["code"]["source"] == str(project) and "\nentry_point: train2.py " in result.stdout
    assert f"code: the current directory {project} (3 files, " in notes_of(result)
    assert "kB; .git, __pycache__ and virtual environments left out) ships as the job's code" in notes_of(result)


def test_a_script_outside_the_current_directory_ships_its_own_directory(invoke, project: Path) -> None:
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text("print('hi')\n")
    result = invoke("--dryrun", str(elsewhere / "train.py"))
    assert plan_of(result)["code"]["source"] == str(elsewhere)
    assert f"code: the script's directory {elsewhere} (1 file" in notes_of(result)


def test_a_big_working_directory_is_refused_with_its_biggest_files_and_the_override(invoke, project: Path) -> None:
    with open(project / "huge.bin", "wb") as sparse:
        sparse.truncate(CODE_LIMIT_BYTES + 1)  # sparse: its size without the disk
    refused = invoke("--dryrun", "train2.py")
    assert refused.exit_code == 2
    assert "holds 100.0 MB in 4 files, over the 100.0 MB or 10000 files a torchrun-style run ships" in refused.stderr
    assert "the biggest: huge.bin (100.0 MB)" in refused.stderr and "--source-dir ." in refused.stderr
    assert invoke("--source-dir", ".", "--dryrun", "train2.py").exit_code == 0  # named: shipped as asked
    (project / "huge.bin").unlink()
    (project / "cache").mkdir()
    for index in range(CODE_LIMIT_FILES):
        (project / "cache" / str(index)).touch()
    many = invoke("--dryrun", "train2.py")
    assert many.exit_code == 2 and f"holds more than {CODE_LIMIT_FILES} files" in many.stderr


def test_options_before_the_script_are_options_with_their_values(invoke, project: Path) -> None:
    (project / "conf.py").write_text("")
    result = invoke("-e", "CFG=conf.py", "--dryrun", "train2.py", "data.csv")
    assert "\nentry_point: train2.py " in result.stdout and "CFG: conf.py" in result.stdout
    assert '"SMDDP_SCRIPT_ARGS": "[\\"data.csv\\"]"' in result.stdout


def test_run_takes_torchruns_flags_too(invoke, project: Path) -> None:
    result = invoke("run", "--hosts", "2", "--nproc_per_node=2", "--dryrun", "train2.py")
    assert "2 hosts × local, 2 ranks each" in result.stderr, result.output
    assert len(plan_of(result)["hosts"]) == 2


def test_nnodes_and_standalone(invoke, project: Path) -> None:
    assert "2 hosts × local" in invoke("--nnodes", "2:2", "--dryrun", "train2.py").stderr
    elastic = invoke("--nnodes", "1:2", "--dryrun", "train2.py")
    assert elastic.exit_code == 2 and "is an elastic range" in elastic.stderr and "give --nnodes 2" in elastic.stderr
    assert "1 host × local" in invoke("--standalone", "--dryrun", "train2.py").stderr
    both = invoke("--standalone", "--nnodes", "2", "--dryrun", "train2.py")
    assert both.exit_code == 2 and "--standalone is one host" in both.stderr
    clash = invoke("--nnodes", "2", "--instance-count", "3", "--dryrun", "train2.py")
    assert clash.exit_code == 2 and "disagree" in clash.stderr


def test_nproc_per_node_auto_is_torchruns_rule_on_this_machine(invoke, project: Path) -> None:
    auto = plan_of(invoke("--nproc-per-node", "auto", "--dryrun", "train2.py"))
    expected = None if shutil.which("nvidia-smi") else os.cpu_count()
    assert auto["ranks"]["processes_per_host"] == expected
    assert plan_of(invoke("--nproc-per-node", "cpu", "--dryrun", "train2.py"))["ranks"]["processes_per_host"] == os.cpu_count()
    bad = invoke("--nproc-per-node", "many", "--dryrun", "train2.py")
    assert bad.exit_code == 2 and "auto, gpu or cpu" in bad.stderr


def test_rendezvous_flags_mean_what_they_can_here_or_say_what_to_use(invoke, project: Path) -> None:
    ok = invoke("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400", "--rdzv-id", "42", "--dryrun", "train2.py")
    assert ok.exit_code == 0 and "note: --rdzv-endpoint localhost:29400: the ranks meet at the first host's store" in ok.stderr
    for flags, said in ((("--rdzv-backend", "etcd"), "leave the flag out or give c10d"),
                        (("--rdzv-endpoint", "node7.example.com:29400"), "the first host (algo-1) serves the rendezvous"),
                        (("--rdzv_conf", "join_timeout=900"), "-e SMDDP_AGENT_TIMEOUT=SECONDS")):
        refused = invoke(*flags, "--dryrun", "train2.py")
        assert refused.exit_code == 2 and said in refused.stderr, refused.output
    every = invoke("--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-conf", "x=1", "--dryrun", "train2.py")
    assert every.exit_code == 2 and all(flag in every.stderr for flag in ("--nnodes 1:2", "--rdzv-backend etcd", "--rdzv-conf x=1"))  # all at once


def test_a_module_runs_from_the_working_directory(invoke, project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "train.py").write_text("")
    result = invoke("--dryrun", "-m", "pkg.train", "--lr", "0.1")
    assert "\nentry_point: pkg/train.py " in result.stdout and "SMDDP_ENTRY_MODULE: pkg.train" in result.stdout
    missing = invoke("--dryrun", "-m", "pkg.nope")
    assert missing.exit_code == 2 and "neither pkg/nope.py nor pkg/nope/__main__.py" in missing.stderr


def test_launcher_flags_after_the_script_reach_it_and_a_warning_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert insert_default_command(["train.py", "data.csv", "--dryrun"], COMMANDS) == ["run", "train.py", "--", "data.csv", "--dryrun"]
    warning = capsys.readouterr().err
    assert "--dryrun after the script goes to the script" in warning and "put launcher flags before the script" in warning
    assert insert_default_command(["train.py", "--lr", "0.1"], COMMANDS) == ["run", "train.py", "--", "--lr", "0.1"]
    assert capsys.readouterr().err == ""
    # run's options before a job file too (after it they were always run's)
    assert insert_default_command(["--nnodes", "2", "-e", "A=b.yaml", "job.yaml", "--dryrun"], COMMANDS) == ["run", "--nnodes", "2", "-e", "A=b.yaml", "job.yaml", "--dryrun"]
    assert insert_default_command(["job.yaml", "--nnodes", "2"], COMMANDS) == ["run", "job.yaml", "--nnodes", "2"]


def test_every_torchrun_flag_is_in_the_help(invoke) -> None:
    shown = invoke("run", "--help").stdout
    for flag in ("--nnodes", "--hosts", "--nproc-per-node", "--nproc-per-host", "--max-restarts", "--standalone", "-m, --module",
                 "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf"):
        assert flag in shown, flag
    assert "--max-restarts" in invoke("--help").stdout


# --- real jobs -------------------------------------------------------------------------------------


@pytest.fixture
def job_root(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = isolated.parent / "jobs"
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
    return root


@pytest.mark.jobs
def test_the_issues_torchrun_command_runs_as_torchrun_would(invoke, project: Path, job_root: Path) -> None:
    result = invoke("--hosts", "1", "--nproc-per-host", "2", "train2.py", "data.csv")
    assert result.exit_code == 0, result.output
    assert "[algo-1/rank1]: 42 a,b 0" in result.stdout.splitlines()
    assert f"Code: the current directory {project} (3 files" in result.stderr
    assert "Billable seconds" not in result.output and "Training seconds" not in result.output  # nothing is billed here


def test_spot_savings_are_never_negative() -> None:
    # per-instance seconds are rounded: billable can come out a second above training
    assert billing_lines(100, 101, instances=2, spot=True) == ["Training seconds: 200", "Billable seconds: 202", "Managed Spot Training savings: 0.0%"]
    assert billing_lines(100, 40, instances=1, spot=True)[-1] == "Managed Spot Training savings: 60.0%"


@pytest.mark.jobs
def test_max_restarts_reruns_a_module_and_counts_the_restarts(invoke, isolated: Path, job_root: Path) -> None:
    (isolated / "pkg").mkdir()
    (isolated / "pkg" / "__init__.py").write_text("")
    (isolated / "pkg" / "helper.py").write_text("Y = 7\n")
    (isolated / "pkg" / "train.py").write_text(
        "import os, sys\nfrom . import helper\ncount = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print(__name__, helper.Y, 'restart', count, sys.argv[1:], flush=True)\n"
        "if count == '0' and os.environ['RANK'] == '0':\n    sys.exit(3)\n"
    )
    result = invoke("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m", "pkg.train", "--lr", "0.1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "[algo-1/rank0]: __main__ 7 restart 0 ['--lr', '0.1']" in lines
    assert "[algo-1/rank0]: __main__ 7 restart 1 ['--lr', '0.1']" in lines


@pytest.mark.jobs
def test_list_and_clean_keep_to_the_callers_jobs_and_ask_before_removing_many(invoke, isolated: Path, job_root: Path) -> None:
    (isolated / "train.py").write_text("print('ok')\n")
    for name in ("mine-1", "mine-2", "theirs-1"):
        assert invoke("--job-name", name, "train.py").exit_code == 0
    for path in [job_root / "theirs-1", *(job_root / "theirs-1").rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)  # another user's job in a shared job root

    def listed(*args: str) -> list[str]:
        return [line.split()[0] for line in invoke("list", *args).stdout.splitlines()[1:]]

    assert sorted(listed()) == ["local://mine-1", "local://mine-2"]
    assert sorted(listed("--all-users")) == ["local://mine-1", "local://mine-2", "local://theirs-1"]
    assert listed("mine-1") == ["local://mine-1"] and sorted(listed("mine-*")) == ["local://mine-1", "local://mine-2"]
    assert invoke("list", "nothing-*").stderr.startswith("No jobs named nothing-*")

    no_tty = invoke("clean")  # two of mine would go; nobody can be asked
    assert no_tty.exit_code == 2 and "pass --yes" in no_tty.stderr and (job_root / "mine-1").is_dir()
    declined = clean_at_a_terminal(isolated, "mine-*", answer=b"n\n")
    assert "Remove these 2 jobs? [y/N]" in declined and (job_root / "mine-1").is_dir() and (job_root / "mine-2").is_dir()
    theirs = invoke("clean", "theirs-1")
    assert theirs.exit_code == 2 and "belongs to another user" in theirs.stderr and "--all-users" in theirs.stderr
    one = invoke("clean", "mine-1")  # named exactly: no question
    assert one.exit_code == 0 and not (job_root / "mine-1").exists()
    cleaned = invoke("clean", "--yes")
    assert cleaned.exit_code == 0 and cleaned.stderr.strip().endswith("Removed 1 job.")
    assert not (job_root / "mine-2").exists() and (job_root / "theirs-1").is_dir()


def clean_at_a_terminal(cwd: Path, *args: str, answer: bytes) -> str:
    """`smddp-launch clean ARGS` with a terminal on stdin that answers ``answer``; returns what it wrote."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen([sys.executable, "-m", "smddp_sdk.cli", "clean", *args], cwd=cwd, stdin=follower,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        os.write(leader, answer)
        output, _ = process.communicate(timeout=120)
    finally:
        os.close(leader)
        os.close(follower)
    return output.decode()


def test_docker_containers_of_a_retry_get_the_restart_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake docker CLI (tests/schedulers/fake_docker.py) records each container's environment; algo-2's is
    # killed once, so the job is retried: containers of attempt 2 carry SMDDP_RESTART_COUNT=1 (TORCHELASTIC_RESTART_COUNT).
    from smddp_sdk.schedulers.docker import DockerScheduler
    from tests.schedulers.test_job_tokens import FAKE, run_job

    monkeypatch.setenv("FAKE_DOCKER_STATE", str(tmp_path / "engine"))
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    cli.chmod(0o755)
    scheduler = DockerScheduler(job_root=tmp_path / "jobs", docker=str(cli), image="fake:1", processes_per_host=1, stop_grace_period=2)
    run_job(scheduler, tmp_path, "restarts", max_retry_attempts=1, FAKE_RUN="exit:0:0.5", FAKE_RUN_ALGO_2="die-once:0.1")
    created = [json.loads(line) for line in (tmp_path / "engine" / "created.log").read_text().splitlines()]
    assert [(item["Name"], item["Env"].get("SMDDP_RESTART_COUNT")) for item in created] == [
        ("restarts-algo-1", "0"), ("restarts-algo-2", "0"), ("restarts-algo-1", "1"), ("restarts-algo-2", "1")]
