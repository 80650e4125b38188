"""The root-cause rule on the cases that used to name a victim (issue: SIGKILL, master runtime, hangs, early exit)."""

from __future__ import annotations

from smddp_sdk.specs.failure import (
    SETTLE_SECONDS,
    SOURCE_EARLY_EXIT,
    SOURCE_ERROR_FILE,
    SOURCE_EXIT,
    SOURCE_STOPPED,
    SOURCE_SUPERVISOR,
    FailureRecord,
    PeerRank,
    blamed_by,
    decide,
    from_death,
    from_error_file,
    is_victim,
    must_stop,
    render_summary,
)


def victim(host: str, rank: int, t: float, message: str, *, lost: tuple[PeerRank, ...] = (), awaited: tuple[PeerRank, ...] = ()) -> FailureRecord:
    return FailureRecord(host, rank, 1, message, timestamp=t, error_type="CollectiveError", source=SOURCE_ERROR_FILE, lost=lost, awaited=awaited)


def test_no_records_no_verdict() -> None:
    assert decide([]) is None


def test_a_sigkilled_rank_beats_victims_whose_error_files_are_older() -> None:
    killed = from_death(host="algo-2", rank=3, returncode=-9, observed_at=100.30)
    records = [
        victim("algo-1", 0, 100.01, "smddp allreduce failed: rank 3 (host algo-2) closed the connection (the peer exited or failed)", lost=(PeerRank(3, "algo-2"),)),
        victim("algo-2", 2, 100.02, "smddp allreduce failed: peer rank 3 (pid 77, same host) exited before completing it", lost=(PeerRank(3),)),
        killed,
    ]
    verdict = decide(records)
    assert verdict is not None and verdict.root is killed
    assert verdict.root.signal == "SIGKILL" and verdict.root.exit_code == 137
    assert [r.rank for r in verdict.others] == [0, 2]


def test_the_first_real_error_wins_among_culprits() -> None:
    late = FailureRecord("algo-1", 0, 1, "bad input", timestamp=5.0, error_type="ValueError", source=SOURCE_ERROR_FILE)
    early = FailureRecord("algo-2", 3, 1, "out of range", timestamp=4.0, error_type="IndexError", source=SOURCE_ERROR_FILE)
    assert decide([late, early]).root is early


def test_a_dead_master_runtime_is_blamed_not_the_hosts_that_lost_it() -> None:
    master = FailureRecord("algo-1", None, 137, "the runtime was killed by SIGKILL", timestamp=10.2, error_type="Signal",
                           source=SOURCE_SUPERVISOR, signal="SIGKILL")
    records = [
        victim("algo-2", 2, 10.05, "smddp allreduce failed: rank 0 (host algo-1) closed the connection"),
        FailureRecord("algo-2", None, 1, "lost the coordinator on algo-1", timestamp=10.1, error_type="LostCoordinator", source="runtime"),
        master,
    ]
    assert decide(records).root is master


def test_a_hung_rank_is_named_although_it_left_no_record() -> None:
    records = [
        victim("algo-1", 0, 50.0, "smddp broadcast timed out: rank(s) 1 on this host did not arrive within the process-group timeout", awaited=(PeerRank(1),)),
        victim("algo-2", 2, 50.1, "smddp broadcast timed out waiting for rank 1 (host algo-1) (hung peer or different code path)", awaited=(PeerRank(1, "algo-1"),)),
        victim("algo-2", 3, 50.2, "smddp broadcast timed out waiting for rank 2 (host algo-2)", awaited=(PeerRank(2, "algo-2"),)),
        FailureRecord("algo-1", None, 143, "the runtime received SIGTERM", timestamp=51.0, source=SOURCE_STOPPED),
    ]
    root = decide(records).root
    assert (root.host, root.rank, root.source) == ("algo-1", 1, "hang")
    assert "timed out waiting" in root.message


def test_victims_alone_stop_the_job_only_after_the_settle_time_a_culprit_at_once() -> None:
    waiting = victim("algo-2", 2, 50.0, "smddp all_reduce timed out waiting for rank 0 (host algo-1)", awaited=(PeerRank(0, "algo-1"),))
    raised = FailureRecord("algo-1", 1, 1, "bad batch", timestamp=50.1, error_type="ValueError", source=SOURCE_ERROR_FILE)
    assert not must_stop([], 0.0, 100.0)
    assert not must_stop([waiting], 10.0, 10.0 + SETTLE_SECONDS - 0.1)
    assert must_stop([waiting], 10.0, 10.0 + SETTLE_SECONDS)
    assert must_stop([waiting, raised], 10.0, 10.0)


def test_a_leader_that_outlived_the_settle_time_points_past_itself_to_the_hung_rank() -> None:
    """The record the settle time preserves: algo-1's first rank waited for rank 1, so the other host's
    blame of rank 0 (which failed too) does not make rank 0 the culprit."""
    records = [
        victim("algo-2", 2, 50.0, "smddp all_reduce timed out waiting for rank 0 (host algo-1)", awaited=(PeerRank(0, "algo-1"),)),
        victim("algo-1", 0, 50.2, "smddp all_reduce timed out: rank(s) 1 on this host did not arrive within the process-group timeout", awaited=(PeerRank(1),)),
    ]
    root = decide(records).root
    assert (root.host, root.rank, root.error_type) == ("algo-1", 1, "Hang")
    assert decide(records[:1]).root.rank == 0  # without rank 0's own record the blame would stop at it
    # A host that decided before rank 0's record arrived wrote that conclusion down; combining every
    # host's records later (the supervisor) draws the blame again instead of trusting it.
    stale = decide(records[:1]).root
    assert stale.source == "hang"
    root = decide([stale, *records]).root
    assert (root.host, root.rank) == ("algo-1", 1)


def test_a_rank_that_exited_0_early_is_the_culprit_when_its_peers_blame_it() -> None:
    early = FailureRecord("algo-1", 1, 0, "", timestamp=20.0, source=SOURCE_EARLY_EXIT)
    records = [victim("algo-1", 0, 20.1, "smddp allreduce failed: peer rank 1 (pid 5, same host) exited before completing it", lost=(PeerRank(1),))]
    root = decide(records, early_exits=[early]).root
    assert (root.host, root.rank, root.exit_code) == ("algo-1", 1, 0)
    assert "exited with code 0" in root.message


def test_victims_alone_give_the_earliest() -> None:
    a = victim("algo-1", 0, 2.0, "Connection reset by peer")
    b = victim("algo-2", 2, 1.0, "broken pipe")
    assert decide([a, b]).root is b


def test_victims_and_the_peers_they_blame_as_data() -> None:
    assert is_victim(victim("a", 0, 0, "smddp x failed: the connections to the other hosts are closed"))
    assert not is_victim(FailureRecord("a", 0, 1, "bad", error_type="ValueError"))
    assert blamed_by(victim("algo-2", 0, 0, "", awaited=(PeerRank(1), PeerRank(3, "algo-1")), lost=(PeerRank(2),))) == [
        ("algo-2", 2, False), ("algo-2", 1, True), ("algo-1", 3, True)]
    assert blamed_by(victim("algo-2", 0, 0, "rank(s) 1, 3 on this host did not arrive")) == []  # prose is not parsed


def test_records_cross_processes_as_json_and_from_error_files() -> None:
    record = from_error_file({"rank": 3, "exit_code": 7, "error_type": "SystemExit", "message": "sys.exit(7)", "timestamp": 1.5}, host="algo-2", path="/e.json")
    assert FailureRecord.from_json(record.to_json()) == record
    assert record.summary() == "algo-2/rank3 exited with code 7: SystemExit: sys.exit(7)"
    assert FailureRecord.from_json({"host": "h", "unknown": 1}).exit_code == 1
    plain = from_death(host="algo-1", rank=0, returncode=3)
    assert plain.source == SOURCE_EXIT and plain.exit_code == 3


def test_summary_puts_the_root_cause_last() -> None:
    root = from_death(host="algo-2", rank=3, returncode=-9, observed_at=1.0)
    other = victim("algo-1", 0, 0.5, "closed the connection")
    text = render_summary(root, [other], hints=["Logs: x"])
    assert text.index("algo-1/rank0") < text.index("Root cause") < text.index("host      : algo-2")
    assert "SIGKILL" in text and text.endswith("Logs: x")
