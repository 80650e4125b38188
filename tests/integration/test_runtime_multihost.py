"""Two simulated hosts x two ranks on this machine, one runtime process per host, real torch.distributed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from smddp_sdk.specs.contract import read_failure
from tests.integration.runtime_job import alive, make_job, wait_all

pytestmark = pytest.mark.integration
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

SCRIPTS = Path(__file__).parent / "scripts"
BACKEND = os.environ.get("SMDDP_TEST_BACKEND", "smddp")  # "gloo" to take our backend out of the picture
HOSTS = ("algo-1", "algo-2")


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "src"
    code.mkdir()
    shutil.copy(SCRIPTS / "dist_train.py", code / "train.py")
    return code


def _records(job, host: str) -> dict[int, dict]:
    data = job.opt_ml(host).output_data_dir
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in data.glob("rank-*.json")}


def _all_pids(job) -> list[int]:
    return [pid for host in job.hosts for record in _records(job, host).values() for pid in record["pids"]]


@pytest.fixture
def reaper():
    """Kill whatever a failed test left behind, so one failure cannot leak processes into the machine."""
    jobs = []
    yield jobs.append
    for job in jobs:
        for pid in _all_pids(job):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@needs_torch
def test_two_hosts_two_ranks_each_train_together(tmp_path, code_dir, reaper):
    # the instance group lists algo-2 first: it, not algo-1, is node 0 and the master
    job = make_job(
        tmp_path, code_dir, HOSTS, {"backend": BACKEND, "sagemaker_distributed_dataparallel_enabled": True},
        num_gpus=2, group_hosts=("algo-2", "algo-1"),
    )
    reaper(job)
    results = wait_all(job.start(), timeout=120)

    for host, (code, out) in results.items():
        assert code == 0, f"{host} exited {code}:\n{out}"
        assert job.opt_ml(host).success_file.exists()
    order = ("algo-2", "algo-1")
    for node, host in enumerate(order):
        records = _records(job, host)
        assert sorted(records) == [2 * node, 2 * node + 1]
        for rank, record in records.items():
            env = record["env"]
            local = rank - 2 * node
            assert record["all_reduce"] == 1 + 2 + 3 + 4
            assert (record["dist_rank"], record["dist_world"]) == (rank, 4)
            assert env["SM_CURRENT_HOST"] == host
            assert (env["LOCAL_RANK"], env["SMDATAPARALLEL_LOCAL_RANK"], env["OMPI_COMM_WORLD_LOCAL_RANK"]) == (str(local),) * 3
            assert (env["GROUP_RANK"], env["NODE_RANK"]) == (str(node), str(node))
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["OMPI_COMM_WORLD_SIZE"]) == ("4", "2", "4")
            assert env["MASTER_ADDR"] == env["SMDATAPARALLEL_SERVER_ADDR"] == "127.0.0.1"
            assert env["MASTER_PORT"] == job.env["SMDDP_MASTER_PORT"]
            assert env["SMDATAPARALLEL_SERVER_PORT"] == job.env["SMDDP_SERVER_PORT"]
            assert env["SM_HP_BACKEND"] == BACKEND
            assert env["PYTHONPATH"].split(":")[0] == str(job.opt_ml(host).code_dir)
            assert record["cwd"] == str(job.opt_ml(host).code_dir)
            assert record["sagemaker_training_hosts"] == ["algo-1", "algo-2"]  # compat module on the path
            log = job.opt_ml(host).rank_log_file(rank).read_text()
            assert f"rank {rank}: all_reduce gave 10.0" in log
            assert f"[{host}/rank{rank}]: rank {rank}: all_reduce gave 10.0" in results[host][1]


@needs_torch
def test_failure_on_one_rank_of_host_2_stops_the_whole_job(tmp_path, code_dir, reaper):
    job = make_job(
        tmp_path, code_dir, HOSTS,
        {"backend": BACKEND, "fail-rank": 3, "linger": 60, "sagemaker_distributed_dataparallel_enabled": True},
        num_gpus=2,
    )
    reaper(job)
    results = wait_all(job.start(), timeout=120)
    finished = time.time()

    failed_at = json.loads(job.opt_ml("algo-2").rank_error_file(3).read_text())["timestamp"]
    assert finished - failed_at < 10, f"the job took {finished - failed_at:.1f}s to stop after the failure"
    for host, (code, out) in results.items():
        assert code == 1, f"{host} exited {code}:\n{out}"
        reason = read_failure(job.opt_ml(host))
        assert reason is not None, f"{host} wrote no failure file"
        head = reason.splitlines()[0]
        assert "rank 3" in head and "algo-2" in head and "exit code 1" in head, reason
        assert "ValueError: boom from rank 3" in reason
        assert not job.opt_ml(host).success_file.exists()
    assert "Root cause (first failure in time)" in results["algo-2"][1]  # no supervisor: the runtime prints it
    leftovers = [pid for pid in _all_pids(job) if alive(pid)]
    assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture
def sleeper_job(tmp_path: Path):
    """Two hosts x two stdlib-only ranks: supervision tests need no torch import (4 ranks on 2 cores)."""
    code = tmp_path / "src"
    code.mkdir()
    shutil.copy(SCRIPTS / "sleeper.py", code / "train.py")
    ready = tmp_path / "ready"
    ready.mkdir()

    def make(**hps):
        return make_job(tmp_path, code, HOSTS, {"ready": str(ready), "sagemaker_distributed_dataparallel_enabled": True, **hps}, num_gpus=2)

    yield make, ready
    for pid in _sleeper_pids(ready):  # whatever a failed test left behind
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _sleeper_pids(ready: Path) -> list[int]:
    return [pid for path in ready.glob("*.json") for pid in json.loads(path.read_text())["pids"]]


def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_period(sleeper_job):
    make, ready = sleeper_job
    job = make(**{"fail-rank": 0, "ignore-term": True})
    started = time.monotonic()
    results = wait_all(job.start({"SMDDP_STOP_GRACE": "1"}), timeout=60)
    assert time.monotonic() - started < 30
    assert {code for code, _ in results.values()} == {1}, results
    assert (read_failure(job.opt_ml("algo-2")) or "").startswith("Root cause: rank 0 on host algo-1")
    assert len(_sleeper_pids(ready)) == 8 and not [pid for pid in _sleeper_pids(ready) if alive(pid)]


def test_sigterm_to_a_runtime_is_forwarded_and_stops_the_job(sleeper_job):
    make, ready = sleeper_job
    job = make()
    runtimes = job.start()
    deadline = time.monotonic() + 30
    while len(list(ready.glob("*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert time.monotonic() < deadline, "the ranks never started"
    runtimes["algo-2"].send_signal(signal.SIGTERM)
    results = wait_all(runtimes, timeout=30)

    assert results["algo-2"][0] == 143
    assert "received SIGTERM" in (read_failure(job.opt_ml("algo-2")) or "")
    assert results["algo-1"][0] != 0
    assert "algo-2" in (read_failure(job.opt_ml("algo-1")) or "")
    assert not [pid for pid in _sleeper_pids(ready) if alive(pid)]


def test_without_a_distribution_flag_every_host_runs_one_process(tmp_path):
    code = tmp_path / "src"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, json\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'SM_CURRENT_HOST', 'MASTER_ADDR')\n"
        "open(os.environ['SM_OUTPUT_DATA_DIR'] + '/env.json', 'w').write(json.dumps({k: os.environ[k] for k in keys}))\n"
    )
    job = make_job(tmp_path, code, HOSTS, {}, num_gpus=4)  # GPUs do not matter without a launcher
    results = wait_all(job.start(), timeout=60)
    assert {host: code for host, (code, _) in results.items()} == {"algo-1": 0, "algo-2": 0}
    for node, host in enumerate(HOSTS):
        seen = json.loads((job.opt_ml(host).output_data_dir / "env.json").read_text())
        assert seen == {"RANK": str(node), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(node),
                        "SM_CURRENT_HOST": host, "MASTER_ADDR": "127.0.0.1"}
