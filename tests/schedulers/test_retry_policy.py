"""Retries, one job-level policy (issue 36): ``max_retry_attempts`` (SageMaker's 1 to 30, checked once with the
spec) and what is retried (``retry_script_errors``), carried by every plan and obeyed by local, docker and Slurm;
the supervisor counts the retries left down; ``--max-restarts`` means the same on every scheduler."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from smddp_sdk.cli.main import cli, script_mode
from smddp_sdk.cli.torchrun import apply_torchrun_flags
from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.hosttree import attempts
from smddp_sdk.schedulers.hosttree.backend import HostBackend, HostExit, Output
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.supervisor import Supervisor
from smddp_sdk.schedulers.slurm.script import render
from smddp_sdk.specs import contract
from smddp_sdk.specs.job import JobSpec, RetryPolicy


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


def spec_of(script: Path, **fields: Any) -> JobSpec:
    return JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local", "instance_count": 2, "job_name": "retry", **fields})


@pytest.mark.parametrize("value", [0, 31, -1])
def test_the_spec_refuses_retries_outside_sagemaker_s_bounds(script: Path, value: int) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(script, max_retry_attempts=value)
    assert [issue.path for issue in caught.value.issues] == ["max_retry_attempts"]
    assert ("at least 1" if value < 1 else "at most 30") in str(caught.value)


@pytest.mark.parametrize(("value", "policy"), [(None, RetryPolicy()), (1, RetryPolicy(1)), (30, RetryPolicy(30))])
def test_the_policy_comes_from_the_spec(script: Path, value: int | None, policy: RetryPolicy) -> None:
    assert RetryPolicy.of(spec_of(script, max_retry_attempts=value) if value else spec_of(script)) == policy


@pytest.mark.parametrize("scheduler", ["local", "docker", "slurm"])
def test_every_scheduler_plans_the_same_policy(tmp_path: Path, script: Path, scheduler: str) -> None:
    options: dict[str, Any] = {"job_root": tmp_path / "jobs", "retry_script_errors": True, **({"client": object()} if scheduler == "slurm" else {})}
    plan = get_scheduler(scheduler, **options).dryrun(spec_of(script, max_retry_attempts=4)).request
    assert plan.retry == RetryPolicy(4, script_errors=True)


def test_slurm_requeues_by_the_policy(tmp_path: Path, script: Path) -> None:
    def script_for(**options: Any) -> str:
        return render(get_scheduler("slurm", job_root=tmp_path / "jobs", client=object(), **options).dryrun(spec_of(script, max_retry_attempts=2)).request)

    platform_only, any_failure = script_for(), script_for(retry_script_errors=True)
    for text in (platform_only, any_failure):  # a failed node: Slurm requeues, at most max_retry_attempts times
        assert "#SBATCH --requeue" in text and '[ "${SLURM_RESTART_COUNT:-0}" -gt 2 ]' in text
    assert "scontrol requeue" not in platform_only  # a failed step is the script's failure: not retried
    assert '[ "$code" -ne 0 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt 2 ]' in any_failure and "scontrol requeue" in any_failure
    none = render(get_scheduler("slurm", job_root=tmp_path / "jobs", client=object()).dryrun(spec_of(script)).request)
    assert "#SBATCH --no-requeue" in none and '"${SLURM_RESTART_COUNT:-0}" -' not in none  # no bound, no requeue (the count only numbers the attempt)
    for text in (platform_only, any_failure, none):
        assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


def test_slurm_s_own_retry_option_is_gone_and_says_what_replaced_it() -> None:
    with pytest.raises(SpecError, match="is not an option of the slurm scheduler.*max_retry_attempts"):
        get_scheduler("slurm", max_retries=2, client=object())


def test_sagemaker_refuses_to_retry_script_errors_and_says_why() -> None:
    with pytest.raises(SpecError, match="SageMaker retries only its own failures"):
        get_scheduler("sagemaker", retry_script_errors=True)


@pytest.mark.parametrize("flag", ["--max-restarts", "--max_restarts"])
def test_max_restarts_is_the_policy_with_script_errors_and_zero_is_none(flag: str) -> None:
    commands = dict(cli.commands)
    assert script_mode([flag, "3", "train.py"], commands) == ["run", flag, "3", "train.py", "--"]
    params: dict[str, Any] = {"max_restarts": 3}
    apply_torchrun_flags(params)
    assert params == {"settings": [("max_retry_attempts", "3")], "scheduler_option": [("retry_script_errors", "true")]}
    params = {"max_restarts": 0}
    apply_torchrun_flags(params)
    assert params == {}  # torchrun's default: no restarts, no retry policy at all


class KilledEveryAttempt(HostBackend):
    """Every host's runtime is killed as soon as it starts: the platform's failure, every attempt."""

    def __init__(self, job_dir: JobDir) -> None:
        super().__init__(job_dir, job_dir.plan)
        self.starts = 0

    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        self.starts += 1
        self.exits[host] = HostExit(137, "SIGKILL", time.time())
        return {}

    def poll(self, host: str) -> HostExit | None:
        return self.exits.get(host)

    def signal(self, host: str, sig: int) -> None:
        pass


def test_the_supervisor_counts_the_retries_left_down_from_the_plan(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    hosts = ("algo-1", "algo-2")
    for host in hosts:
        contract.OptMl(job_dir.host_dir(host)).make_dirs()
    output = tmp_path / "out"
    job_dir.write_record({"handle": "local://job", "plan": {
        "hosts": [{"host": host, "opt_ml": str(job_dir.host_dir(host))} for host in hosts], "stop_grace_period": 1,
        "artifacts": {"model_data": str(output / "model.tar.gz"), "output_data": str(output / "output.tar.gz")},
        "retry": {"max_retry_attempts": 2, "retry_script_errors": False},
    }})
    backend = KilledEveryAttempt(job_dir)
    supervisor = Supervisor(job_dir, backend)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    try:
        assert supervisor.run() == 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    state = job_dir.read_state()
    assert state["state"] == "FAILED" and state["attempt"] == 3 and state["retries_left"] == 0, state
    assert [item["outcome"] for item in state["attempts"]] == [attempts.RESTARTING, attempts.RESTARTING, attempts.FAILED]
    assert backend.starts == 3 * len(hosts)
