"""The recovery phases file (``specs.events``): what is written is read back typed, and nothing else is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smddp_sdk.specs import events


def test_events_are_read_back_in_the_order_written_with_their_fields(tmp_path: Path) -> None:
    path = tmp_path / "output" / events.FILE_NAME
    events.record(path, events.FAULT, attempt=1, kind="host_failed", detail="algo-2 exited with code 137")
    events.record(path, events.RANKS_STARTED, attempt=2, host="algo-2", warm=True, ranks=[2, 3])
    read = events.read(path)
    assert [(e["event"], e["attempt"], e["host"], e["rank"]) for e in read] == [("fault", 1, None, None), ("ranks_started", 2, "algo-2", None)]
    assert read[0]["kind"] == "host_failed" and read[1]["warm"] is True and read[1]["ranks"] == [2, 3]
    assert read[0]["time"] <= read[1]["time"]
    assert path.stat().st_mode & 0o077 == 0  # the job's alone


def test_an_unknown_event_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown recovery event 'restarted'.*hosts_started"):
        events.record(Path("unused"), "restarted", attempt=1)


def test_lines_that_are_not_events_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / events.FILE_NAME
    good = {"event": "first_step", "time": 1.5, "attempt": 1, "host": "algo-1", "rank": 0, "step": 41}
    path.write_text("\n".join(["not json", json.dumps([1]), json.dumps({"event": "lunch", "time": 1}), json.dumps({"event": "fault"}), json.dumps(good)]) + "\n")
    assert events.read(path) == [good]
    assert events.read(tmp_path / "missing.jsonl") == []


def test_a_rank_writes_into_its_hosts_output_dir_and_outside_a_job_nowhere(tmp_path: Path) -> None:
    environ = {"SM_OUTPUT_DIR": str(tmp_path), "RANK": "3", "SM_CURRENT_HOST": "algo-2", events.ATTEMPT_ENV: "4"}
    events.record_from_rank(events.STATE_RESTORED, environ, source="peer", step=120)
    (written,) = events.read(tmp_path / events.FILE_NAME)
    assert (written["event"], written["attempt"], written["host"], written["rank"], written["source"], written["step"]) == ("state_restored", 4, "algo-2", 3, "peer", 120)
    events.record_from_rank(events.FIRST_STEP, {}, step=1)  # no SM_OUTPUT_DIR: not in a job, nothing written
    assert events.attempt_of({events.ATTEMPT_ENV: "x"}) == 1 and events.attempt_of({}) == 1


def test_a_link_in_place_of_the_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    path = tmp_path / events.FILE_NAME
    path.symlink_to(target)
    events.record(path, events.FAULT, attempt=1)  # lost, never written through the link
    assert target.read_text() == ""
