"""Failure behaviour: a killed or hung peer gives a RuntimeError naming the op and the peer, in time,
and no shared-memory segment is left behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

pytest.importorskip("torch")
from smddp_sdk.collectives.shm import shm_dir  # noqa: E402
from tests.collectives.cluster import NATIVE_IDS, NATIVE_PATHS, Cluster  # noqa: E402

pytestmark = pytest.mark.integration
TIMEOUT_S = 6


@pytest.fixture
def private_shm():
    """A private folder on the real shm file system, so other jobs' transient arenas cannot interfere."""
    folder = tempfile.mkdtemp(prefix="smddp-test-", dir=shm_dir())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _survivor_reports(cluster: Cluster, name: str, victim: int) -> list[dict]:
    survivors = [r for r in range(len(cluster.hosts)) if r != victim]
    reports = [json.loads(cluster.store.get(f"report/{name}/{r}")) for r in survivors]
    cluster.finish(timeout=30)
    return reports


ONE_HOST, TWO_HOSTS = ["algo-1"] * 3, ["algo-1", "algo-1", "algo-2", "algo-2"]


@pytest.mark.parametrize(("hosts", "victim", "call"), [
    (ONE_HOST, 1, "blocking"), (TWO_HOSTS, 3, "blocking"),
    (TWO_HOSTS, 2, "blocking"),  # the other host's leader: its connection drops under the core's exchange
    (ONE_HOST, 1, "async"),  # Work.wait() must raise, not return with half-reduced tensors
    (TWO_HOSTS, 3, "smddp_ddp"),  # backward of smddp's DDP over shared fusion buffers and TCP
], ids=["one-host", "other-host", "other-host-leader", "async-wait", "smddp-ddp-backward"])
def test_killed_rank_fails_the_others_quickly_and_leaves_no_segment(hosts, victim, call, private_shm):
    env = {"SMDDP_TEST_VICTIM": str(victim), "SMDDP_TEST_PG_TIMEOUT": str(TIMEOUT_S), "SMDDP_SHM_DIR": private_shm,
           "SMDDP_TEST_FAILING_CALL": call}
    cluster = Cluster(hosts, scenario="killed_rank", env=env)
    reports = _survivor_reports(cluster, "killed", victim)
    for report in reports:
        assert report["error"], report
        assert "all_reduce" in report["error"], report
        assert report["elapsed"] < TIMEOUT_S + 2, report
    # the ranks on the victim's host name it; ranks elsewhere name the peer that failed or dropped
    assert any(f"rank {victim}" in r["error"] for r in reports), reports
    assert os.listdir(private_shm) == [], "a shared-memory segment was left behind"


@pytest.fixture(params=NATIVE_PATHS, ids=NATIVE_IDS)
def native_path(request):
    """Both implementations of the shared-memory hot path (the native core and kernels, the pure-Python
    fallback) and the two mixed in one group."""
    return request.param


@pytest.mark.parametrize(("hosts", "call", "expected"), [
    (["algo-1", "algo-1"], "broadcast", "broadcast timed out"),  # + "rank(s) 1": the shared-memory wait
    (["algo-1", "algo-2"], "all_reduce", "all_reduce timed out waiting for rank 1 (host algo-2)"),
], ids=["one-host", "across-hosts"])
def test_hung_peer_times_out_naming_op_and_peer(hosts, call, expected, native_path):
    cluster = Cluster(hosts, scenario="hung_rank", native=native_path,
                      env={"SMDDP_TEST_VICTIM": "1", "SMDDP_TEST_PG_TIMEOUT": "3", "SMDDP_TEST_FAILING_CALL": call})
    try:
        reports = [json.loads(cluster.store.get("report/hung/0"))]
    finally:
        cluster.store.set("hung/release", "1")
        cluster.finish(timeout=30)
    error = reports[0]["error"]
    assert error and expected in error and (call != "broadcast" or "rank(s) 1" in error), error
    assert 2.5 < reports[0]["elapsed"] < 6, reports


@pytest.mark.parametrize("native", ["1", "0"], ids=["native", "python"])
def test_a_signal_interrupts_a_wait_between_hosts_and_the_group_refuses_later_calls(native):
    cluster = Cluster(["algo-1", "algo-2"], scenario="interrupted_between_hosts", native=native,
                      env={"SMDDP_TEST_PG_TIMEOUT": "20"})
    try:
        report = json.loads(cluster.store.get("report/interrupted/0"))
    finally:
        cluster.store.set("interrupted/release", "1")
        cluster.finish(timeout=30)
    assert report["interrupted_after"] is not None and report["interrupted_after"] < 2, report
    assert report["next_call"] and ("closed" in report["next_call"] or "broke" in report["next_call"]), report


def test_hang_warning_names_the_missing_rank_and_its_last_call(native_path):
    env = {"SMDDP_TEST_VICTIM": "1", "SMDDP_TEST_PG_TIMEOUT": "4", "SMDDP_HANG_WARN_S": "1"}
    cluster = Cluster(["algo-1", "algo-1"], scenario="hung_after_a_call", env=env, native=native_path)
    try:
        report = json.loads(cluster.store.get("report/hung/0"))
    finally:
        cluster.store.set("hung/release", "1")
        exits = cluster.finish(timeout=30)
    assert "timed out" in report["error"], report
    output = exits[0][1]
    assert "waited 1 s in broadcast" in output, output
    assert "for rank 1 (host algo-1, last seen in all_reduce #1 (SUM, float32, 7 elements)), which has not entered it" in output, output


@pytest.mark.parametrize("hosts", [["algo-1"] * 3], ids=["one-host"])
def test_mismatched_collectives_raise_on_every_rank_naming_both_calls(hosts, native_path):
    cluster = Cluster(hosts, scenario="mismatch", env={"SMDDP_TEST_PG_TIMEOUT": "20"}, native=native_path)
    reports = [json.loads(cluster.store.get(f"report/mismatch/{r}")) for r in range(len(hosts))]
    cluster.finish(timeout=30)
    for report in reports:
        error = report["error"]
        assert error and "collective mismatch" in error, report
        assert "all_reduce #2 (SUM, float64, 1000 elements)" in error, report
        assert "all_reduce #2 (SUM, float32, 1000 elements)" in error, report
        assert report["elapsed"] < 10, report


MISMATCHES_BETWEEN_HOSTS = {  # what the last host calls as call #2 where the others call all_reduce #2
    "reduce_op": "all_reduce #2 (MAX, float32, 16384 elements)",
    "dtype": "all_reduce #2 (SUM, int32, 16384 elements)",
    "size": "all_reduce #2 (SUM, float32, 32768 elements)",
    "op": "all_gather #2 (float32, 16384 elements)",
    "count": "destroy_process_group #2",  # it ran one collective fewer and left
}


@pytest.mark.parametrize("kind", list(MISMATCHES_BETWEEN_HOSTS))
@pytest.mark.parametrize("hosts", [["algo-1", "algo-2"], ["algo-1", "algo-1", "algo-2", "algo-2"]], ids=["2x1", "2x2"])
def test_collectives_that_differ_between_hosts_fail_every_rank_naming_both_calls(kind, hosts):
    """Mixed paths: the native core's leader on one host meets the Python path's on the other (2x1), or
    each host's native leader meets the other's (2x2); both ends of the mesh check the call header."""
    env = {"SMDDP_TEST_PG_TIMEOUT": "30", "SMDDP_TEST_MISMATCH": kind, "SMDDP_TEST_LAST_HOST": hosts[-1]}
    cluster = Cluster(hosts, scenario="mismatch_between_hosts", env=env, native="mixed")
    first_host = [r for r, h in enumerate(hosts) if h == hosts[0]]
    checked = first_host if kind == "count" else range(len(hosts))  # the host that left reports nothing
    reports = {r: json.loads(cluster.store.get(f"report/mismatch/{r}")) for r in checked}
    cluster.finish(timeout=30)
    for report in reports.values():
        assert report["error"] and report["elapsed"] < 10, report
    ours = "rank 0 (host algo-1) called all_reduce #2 (SUM, float32, 16384 elements)"
    theirs = f"rank {len(hosts) // 2} (host algo-2) called {MISMATCHES_BETWEEN_HOSTS[kind]}"
    assert f"collective mismatch between hosts: {ours} but {theirs}" in reports[0]["error"], reports
    if kind != "count":
        other_leader = reports[len(hosts) // 2]["error"]
        assert f"collective mismatch between hosts: {theirs} but {ours}" in other_leader, reports
