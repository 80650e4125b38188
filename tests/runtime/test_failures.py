"""Failure records, the root-cause rule and the failure file's first 1024 characters."""

from __future__ import annotations

import json
import signal

from smddp_sdk.runtime.failures import rank_failure, root_cause
from smddp_sdk.specs.contract import FAILURE_REASON_LIMIT
from smddp_sdk.specs.failure import FailureRecord, failure_reason, render_summary


def test_error_file_gives_the_traceback_and_the_time(tmp_path):
    error_file = tmp_path / "rank-3.json"
    error_file.write_text(json.dumps({"error_type": "ValueError", "message": "boom", "traceback": "Traceback...\nValueError: boom\n", "timestamp": 100.0}))
    f = rank_failure(host="algo-2", rank=3, local_rank=1, pid=42, returncode=1, error_file=error_file, log_tail="")
    assert (f.error_type, f.message, f.timestamp, f.exit_code) == ("ValueError", "boom", 100.0, 1)


def test_death_by_signal_is_described_without_an_error_file(tmp_path):
    f = rank_failure(host="algo-1", rank=0, local_rank=0, pid=7, returncode=-signal.SIGKILL,
                     error_file=tmp_path / "none.json", log_tail="last words\n", observed_at=5.0)
    assert f.exit_code == 137 and "SIGKILL" in f.message and "out-of-memory" in f.message
    assert f.timestamp == 5.0 and f.log_tail == "last words\n"


def test_root_cause_is_the_earliest_culprit_not_the_earliest_victim():
    late = FailureRecord(host="algo-1", rank=0, exit_code=1, error_type="RuntimeError", message="connection reset", timestamp=20.0)
    early = FailureRecord(host="algo-2", rank=3, exit_code=1, error_type="ValueError", message="boom", timestamp=10.0)
    assert root_cause([late, early]) == early and root_cause([]) is None


def test_failure_reason_names_host_rank_code_and_error_within_the_limit():
    huge = "x" * 5000
    root = FailureRecord(host="algo-2", rank=3, exit_code=1, error_type="ValueError", message="boom", timestamp=10.0, traceback="Traceback\n" + huge + "\nValueError: boom")
    other = FailureRecord(host="algo-1", rank=0, exit_code=1, error_type="RuntimeError", message="connection reset", timestamp=20.0)
    reason = failure_reason(root, [root, other])
    head = reason[:FAILURE_REASON_LIMIT]
    assert head.startswith("Root cause: rank 3 on host algo-2 failed with exit code 1: ValueError: boom")
    assert "ValueError: boom" in head.splitlines()[2]
    assert "Other failures (1):" in reason and "rank 0 on host algo-1" in reason


def test_console_summary_puts_the_root_cause_last():
    root = FailureRecord(host="algo-2", rank=3, exit_code=1, error_type="ValueError", message="boom", timestamp=10.0)
    other = FailureRecord(host="algo-1", rank=0, exit_code=1, error_type="RuntimeError", message="connection reset", timestamp=20.0)
    text = render_summary(root, [other, root])
    assert text.index("Other failure") < text.index("Root cause (first failure in time)")
    assert text.rindex("host      : algo-2") > text.index("Root cause")


def test_failure_records_survive_json():
    f = FailureRecord(host="algo-2", rank=None, exit_code=143, error_type="Signal", message="stopped", timestamp=1.5)
    assert FailureRecord.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_a_huge_error_message_cannot_push_the_headline_out():
    root = FailureRecord(host="algo-2", rank=3, exit_code=1, error_type="RuntimeError", message="y" * 10_000, timestamp=10.0)
    head = failure_reason(root)[:FAILURE_REASON_LIMIT]
    assert head.startswith("Root cause: rank 3 on host algo-2 failed with exit code 1: RuntimeError: yyy")
    assert "ExitCode 1" in head
