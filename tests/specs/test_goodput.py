"""specs.goodput: productive training, work redone and each recovery's phases, from the marks a job directory
keeps (pure; the rule is the module's docstring)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.specs import events, goodput
from smddp_sdk.specs.goodput import AttemptMarks


def test_an_interrupted_job_counts_training_less_the_work_redone_and_splits_each_recovery_into_its_phases() -> None:
    first = AttemptMarks(1, started=100, hosts_started=101, process_group_formed=106, first_collective=110, last_checkpoint=150, fault=160, detected=161,
                         ended=163, outcome="Interrupted")
    second = AttemptMarks(2, started=165, hosts_started=170, process_group_formed=176, first_collective=180, ended=230, outcome="Completed")
    result = goodput.compute([first, second], started=100, ended=231)
    assert [(row.trained, row.redone, row.productive) for row in result.attempts] == [(50, 10, 40), (50, 0, 50)]
    assert result.productive == 90 and result.wall == 131
    assert result.ratio == pytest.approx(90 / 131)
    (recovery,) = result.recoveries
    assert recovery.phases() == {"detect": 1, "stop": 2, "restart": 7, "cold_start": 6, "restore": 4}
    assert (recovery.total, recovery.redone, recovery.attempt, recovery.outcome) == (20, 10, 1, "Interrupted")


def test_a_checkpoint_written_after_the_fault_loses_nothing_and_none_loses_the_whole_attempt() -> None:
    on_notice = AttemptMarks(1, started=0, first_collective=10, last_checkpoint=31, fault=30, detected=30, ended=32)
    none = AttemptMarks(1, started=0, first_collective=10, fault=30, detected=30, ended=32)
    assert on_notice.redone() == 0
    assert none.redone() == 20


def test_a_mark_not_recorded_is_unknown_never_guessed() -> None:
    first = AttemptMarks(1, started=0, hosts_started=1, fault=30, detected=31, ended=32, outcome="Restarting")
    second = AttemptMarks(2, started=33, hosts_started=34, process_group_formed=40)
    result = goodput.compute([first, second], started=0, ended=None, now=60)
    assert result.productive is None and result.ratio is None
    (recovery,) = result.recoveries
    assert (recovery.detect, recovery.stop, recovery.restart, recovery.cold_start, recovery.restore) == (1, 1, 2, 6, None)
    assert (recovery.total, recovery.redone) == (None, None)
    lines = goodput.render(result)
    assert lines[0] == "goodput unknown: productive training unknown of 60.0 s"
    assert "cold start 6.0 s, restore unknown" in lines[1] and "work redone unknown" in lines[1]


def test_a_running_attempt_counts_until_now_from_the_record_state_json_keeps() -> None:
    record = {"started": 100.0, "ended": None, "attempt": 2, "attempt_started": 150.0,
              "marks": {"hosts_started": 151, "process_group_formed": 155, "first_collective": 160},
              "attempts": [{"attempt": 1, "started": 100, "ended": 140, "outcome": "Restarting", "hosts_started": 101, "first_collective": 105,
                            "fault": 135, "detected": 136, "last_checkpoint": 125, "reason": "the platform failed it"}]}
    result = goodput.from_record(json.loads(json.dumps(record)), now=200)
    assert result is not None
    assert [row.productive for row in result.attempts] == [20, 40]
    assert result.ratio == pytest.approx(60 / 100)
    assert result.recoveries[0].phases() == {"detect": 1, "stop": 4, "restart": 11, "cold_start": 4, "restore": 5}
    assert goodput.from_record({"state": "PENDING"}) is None


def test_event_lines_keep_the_recovery_events_format_and_bad_lines_are_skipped() -> None:
    line = events.event_line("first_collective", 120.5, attempt=None, host="algo-1", rank=0)
    assert json.loads(line) == {"event": "first_collective", "time": 120.5, "attempt": None, "host": "algo-1", "rank": 0}
    text = line + "not json\n" + json.dumps({"event": "first_collective", "time": "soon"}) + "\n" + events.event_line("process_group_formed", 119, attempt=None, host=None, rank=0)
    times = goodput.event_times([text, events.event_line("first_collective", 90.0, attempt=None, host="algo-2", rank=0)], "first_collective")
    assert times == [90.0, 120.5]
    assert goodput.first_between(times, 100, None) == 120.5
    assert goodput.first_between(times, 80, 95) == 90.0
    assert goodput.first_between(times, 130, None) is None


RANK = '''
import os, sys
import torch, torch.distributed as dist
import smddp_sdk.collectives  # registers smddp
dist.init_process_group("smddp", rank=int(sys.argv[1]), world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[2])
group = dist.distributed_c10d._get_default_group()
shadowed = sorted(name for name in vars(group) if not name.startswith("_") and callable(vars(group)[name]))
tensor = torch.ones(3)
dist.all_reduce(tensor)
dist.all_reduce(tensor)
print(shadowed != [], sorted(name for name in vars(group) if callable(vars(group)[name])) == [], tensor.tolist(), flush=True)
dist.destroy_process_group()
'''


@pytest.mark.jobs
def test_ranks_note_their_group_formed_rank_0_its_first_collective_once_and_collectives_work_on(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    root = str(Path(__file__).resolve().parents[2])
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), port], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root, "SM_OUTPUT_DIR": str(tmp_path / f"host{rank}" / "output"), "SM_CURRENT_HOST": f"algo-{rank + 1}", "RANK": str(rank)})
             for rank in (0, 1)]
    outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), outputs
    assert outputs[0].split("\n")[0] == "True True [4.0, 4.0, 4.0]"  # shadowed until the first call, then none left
    events = [json.loads(line) for line in (tmp_path / "host0" / "output" / "events.jsonl").read_text().splitlines()]
    assert [(item["event"], item["host"], item["rank"]) for item in events] == [("process_group_formed", "algo-1", 0), ("first_collective", "algo-1", 0)]
    assert events[0]["time"] <= events[1]["time"]
    others = [json.loads(line)["event"] for line in (tmp_path / "host1" / "output" / "events.jsonl").read_text().splitlines()]
    assert others == ["process_group_formed"]  # every rank notes its group; rank 0 alone its first collective
