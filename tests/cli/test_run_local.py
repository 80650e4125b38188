"""run / status / logs / cancel / list against the real local scheduler: simulated hosts as processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import smddp_sdk
from tests.cli.conftest import assert_golden, normalise

pytest.importorskip("smddp_sdk.schedulers.local", reason="the local scheduler is not in this checkout")
pytestmark = pytest.mark.integration

PACKAGE_PARENT = str(Path(smddp_sdk.__file__).resolve().parent.parent)
TRAIN = """\
import os, sys, time
rank = os.environ["RANK"]
print(f"rank {rank} of {os.environ['WORLD_SIZE']} args {sys.argv[1:]}", flush=True)
if "--sleep" in sys.argv:
    time.sleep(float(sys.argv[sys.argv.index("--sleep") + 1]))
if rank == "1" and "--fail" in sys.argv:
    code = int(sys.argv[sys.argv.index("--fail") + 1])
    if code == 1:
        raise RuntimeError("rank 1 fails on purpose")
    raise SystemExit(code)
"""
JOB = """\
entry_point: train.py
instance_type: local
instance_count: 2
job_name: {name}
distribution:
  smdistributed:
    dataparallel:
      enabled: true
"""


@pytest.fixture
def job_root(isolated: Path) -> Path:
    (isolated / "train.py").write_text(TRAIN)
    return isolated.parent / "jobs"


def write_job(work: Path, name: str) -> str:
    (work / f"{name}.yaml").write_text(JOB.format(name=name))
    return f"{name}.yaml"


def env_for(job_root: Path) -> dict[str, str]:
    return {"SMDDP_JOB_ROOT": str(job_root)}


def test_dryrun_prints_job_and_request_and_starts_nothing(invoke, isolated, job_root):
    result = invoke("run", write_job(isolated, "dry-1"), "--dryrun", "-H", "epochs=2", "--", "--lr", "0.1", env=env_for(job_root))
    assert result.exit_code == 0, result.output
    assert not job_root.exists(), "a dryrun must not write anything"
    text = normalise(result.stdout, (str(job_root.parent), "<tmp>"), (PACKAGE_PARENT, "<package parent>"), (sys.executable, "<python>"))
    assert_golden("dryrun_local.txt", text)
    assert result.stderr.splitlines()[-1] == "Job dry-1 · 2 hosts × local · distribution smddp · scheduler local"


def test_run_follows_logs_with_rank_prefixes_and_exits_0(invoke, isolated, job_root):
    result = invoke(write_job(isolated, "ok-1"), "--", "--epochs", "2", env=env_for(job_root))
    assert result.exit_code == 0, result.output
    assert "[algo-1/rank0]: rank 0 of 2 args ['--epochs', '2']" in result.stdout.splitlines()
    assert "[algo-2/rank1]: rank 1 of 2 args ['--epochs', '2']" in result.stdout.splitlines()
    assert "\x1b[" not in result.stdout, "no colour when stdout is not a terminal"
    assert result.stderr.splitlines()[-5].startswith("local://ok-1 SUCCEEDED in ")
    assert result.stderr.splitlines()[-1] == "  metrics: smddp-launch metrics ok-1"


def test_rank_filter_limits_the_console(invoke, isolated, job_root):
    result = invoke(write_job(isolated, "filter-1"), "--rank", "1", env=env_for(job_root))
    assert result.exit_code == 0, result.output
    ranked = [line for line in result.stdout.splitlines() if "/rank" in line]
    assert ranked and all(line.startswith("[algo-2/rank1]:") for line in ranked)


def test_a_failing_rank_code_is_shown_but_the_launcher_exits_1(invoke, isolated, job_root):
    # A rank's 2 or 3 must not read as "bad job file" or "unavailable" (docs/exit-codes.md).
    result = invoke(write_job(isolated, "fail-2"), "--", "--fail", "2", env=env_for(job_root))
    assert result.exit_code == 1, result.output
    assert any(line.startswith("  exit code : 2") for line in result.stderr.splitlines())
    assert "algo-2/rank1 exited with code 2" in invoke("status", "local://fail-2", env=env_for(job_root)).output


def test_failure_summary_ends_with_the_root_cause_and_its_traceback(invoke, isolated, job_root):
    result = invoke(write_job(isolated, "fail-1"), "--", "--fail", "1", env=env_for(job_root))
    assert result.exit_code == 1, result.output
    summary = result.stderr[result.stderr.index("=" * 60):]
    assert_golden("failure_summary.txt", normalise(summary, (str(job_root.parent), "<tmp>")))


def test_detach_then_status_logs_list_and_cancel(invoke, isolated, job_root):
    env = env_for(job_root)
    submitted = invoke("run", write_job(isolated, "detach-1"), "--detach", "--", "--sleep", "0.5", env=env)
    assert submitted.exit_code == 0, submitted.output
    assert submitted.stdout == "local://detach-1\n", "the handle alone on stdout"
    assert "smddp-launch logs local://detach-1 --follow" in submitted.stderr
    followed = invoke("logs", "local://detach-1", "--follow", "--host", "1", env=env)
    assert followed.exit_code == 0
    assert "[algo-1/rank0]: rank 0 of 2 args ['--sleep', '0.5']" in followed.stdout.splitlines()
    assert all(line.startswith("[algo-1") for line in followed.stdout.splitlines())
    status = invoke("status", "local://detach-1", "--json", env=env)
    assert json.loads(status.stdout)["state"] == "SUCCEEDED"
    assert invoke("status", "local://detach-1", env=env).stdout.splitlines()[0] == "local://detach-1  SUCCEEDED"
    listed = invoke("list", env=env)
    assert listed.stdout.splitlines()[1].startswith("local://detach-1  SUCCEEDED")
    cancelled = invoke("cancel", "local://detach-1", env=env)
    assert cancelled.exit_code == 0 and "local://detach-1 already ended (SUCCEEDED); nothing to cancel" in cancelled.stderr


def test_a_cancelled_job_and_its_hosts_are_cancelled_not_failed(invoke, isolated, job_root):
    env = env_for(job_root)
    submitted = invoke("run", write_job(isolated, "cancel-1"), "--detach", "--", "--sleep", "60", env=env)
    assert submitted.exit_code == 0, submitted.output
    deadline = time.monotonic() + 60
    while invoke("logs", "cancel-1", "--grep", "rank 1 of", env=env).stdout == "":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    cancelled = invoke("cancel", "cancel-1", env=env)
    assert cancelled.exit_code == 0 and "Cancel requested: local://cancel-1" in cancelled.stderr
    status = json.loads(invoke("status", "cancel-1", "--json", env=env).stdout)
    assert status["state"] == "CANCELLED" and {host["state"] for host in status["hosts"]} == {"CANCELLED"}
    assert "exit" not in invoke("status", "cancel-1", env=env).stdout
    logs = invoke("logs", "cancel-1", env=env).stdout
    assert "stopped by SIGTERM" in logs and "failed" not in logs and "143" not in logs


def test_unknown_scheduler_option_is_located(invoke, isolated, job_root):
    job = write_job(isolated, "opt-1")
    (isolated / job).write_text((isolated / job).read_text() + "scheduler_options:\n  keep_job_dirs: false\n")
    result = invoke(job, env=env_for(job_root))
    assert result.exit_code == 2
    assert "opt-1.yaml:10:3: scheduler_options: unknown option of the local scheduler 'keep_job_dirs' (did you mean 'keep_job_dir'?)" in result.stderr


def test_status_of_a_missing_job_is_exit_2(invoke, job_root):
    result = invoke("status", "local://no-such-job", env=env_for(job_root))
    assert result.exit_code == 2 and "no local job 'no-such-job'" in result.stderr


def test_ctrl_c_cancels_a_local_job_and_exits_130(isolated, job_root):
    write_job(isolated, "int-1")
    env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT, **env_for(job_root)}
    process = subprocess.Popen([sys.executable, "-m", "smddp_sdk.cli", "int-1.yaml", "--", "--sleep", "60"], cwd=isolated, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        state_file = job_root / "int-1" / "state.json"
        while time.monotonic() < deadline and '"RUNNING"' not in (state_file.read_text() if state_file.exists() else ""):
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Interrupted: cancelling local://int-1: done" in err
    assert json.loads(state_file.read_text())["state"] == "CANCELLED"


def test_options_lists_what_the_local_scheduler_accepts(invoke):
    result = invoke("options", "local")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.stdout.splitlines()[1:] if line.strip()]
    assert {"job_root", "processes_per_host", "keep_job_dir"} <= set(names)


def test_status_of_a_failed_job_shows_the_root_cause(invoke, isolated, job_root):
    env = env_for(job_root)
    assert invoke(write_job(isolated, "fail-s"), "--", "--fail", "1", env=env).exit_code == 1
    result = invoke("status", "local://fail-s", env=env)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "local://fail-s  FAILED"
    assert "  algo-2   FAILED  exit 1" in result.stdout.splitlines()
    assert "Root cause (first failure in time):" in result.stderr
    assert "  error     : RuntimeError: rank 1 fails on purpose" in result.stderr.splitlines()


def test_logs_are_coloured_only_when_asked_and_never_with_no_color(invoke, isolated, job_root):
    env = env_for(job_root)
    assert invoke(write_job(isolated, "colour-1"), env=env).exit_code == 0
    plain = invoke("logs", "local://colour-1", "--rank", "0", env=env).stdout
    forced = invoke("--color", "always", "logs", "local://colour-1", "--rank", "0", env=env).stdout
    vetoed = invoke("--color", "always", "logs", "local://colour-1", "--rank", "0", env={**env, "NO_COLOR": "1"}).stdout
    assert "\x1b[" not in plain and "\x1b[" not in vetoed
    assert "\x1b[" in forced
    assert plain.splitlines() == ["[algo-1/rank0]: rank 0 of 2 args []"]


def test_handles_of_local_jobs_complete_in_the_shell(invoke, isolated, job_root, monkeypatch):
    from click.shell_completion import ShellComplete

    from smddp_sdk.cli.main import cli

    env = env_for(job_root)
    assert invoke(write_job(isolated, "complete-1"), env=env).exit_code == 0
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(job_root))
    complete = ShellComplete(cli, {}, "smddp-launch", "_SMDDP_LAUNCH_COMPLETE")
    assert [item.value for item in complete.get_completions(["logs"], "local://comp")] == ["local://complete-1"]
    assert [item.value for item in complete.get_completions(["status"], "local://zzz")] == []
    assert [item.value for item in complete.get_completions(["metrics"], "compl")] == ["complete-1"]
