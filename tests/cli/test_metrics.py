"""Metrics are time series in seconds per rank, read from the job's stamped log lines."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TRAIN = """\
import os, time
for epoch in range(3):
    time.sleep(0.4)
    print(f"epoch {epoch}: loss {float(os.environ['RANK']) + 1 / (epoch + 1):.3f}", flush=True)
"""
JOB = """\
entry_point: train.py
instance_type: local
instance_count: 2
job_name: metered
metric_definitions:
  - {Name: loss, Regex: 'loss ([0-9.]+)'}
"""


@pytest.fixture
def metered(invoke, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(isolated.parent / "jobs"))
    (isolated / "train.py").write_text(TRAIN)
    (isolated / "job.yaml").write_text(JOB)
    result = invoke("job.yaml")
    assert result.exit_code == 0, result.output
    assert "not scraped" not in result.stderr  # said once, in the dry run's notes
    assert "not scraped" in invoke("job.yaml", "--dryrun", "--job-name", "other").stdout
    return "metered"


def test_metrics_are_rank_0s_by_default_and_every_ranks_on_request(invoke, metered: str) -> None:
    assert invoke("metrics", metered).stdout.splitlines()[1].split() == ["loss", "3", "0.333", "0.333", "1"]
    assert invoke("metrics", metered, "--rank", "1").stdout.splitlines()[1].split() == ["loss", "3", "1.333", "1.333", "2"]
    every = invoke("metrics", metered, "--all-ranks", "--all").stdout.splitlines()
    values = {0: ["1", "0.5", "0.333"], 1: ["2", "1.5", "1.333"]}
    assert sorted(every) == sorted(f"loss\t{step}\t{values[rank][step]}\talgo-{rank + 1}/rank{rank}" for rank in (0, 1) for step in range(3))


def test_metric_timestamps_are_seconds_since_the_job_started(invoke, metered: str, isolated: Path) -> None:
    assert invoke("metrics", metered, "--csv", "loss.csv").exit_code == 0
    times = [float(row["timestamp"]) for row in csv.DictReader(open(isolated / "loss.csv"))]
    assert len(times) == 3 and 0 < times[0] < times[1] < times[2] < 60
    assert times[2] - times[0] >= 0.7  # the script sleeps 0.4 s between epochs: real time, not the match number


def test_a_regex_without_a_group_and_one_that_matches_nothing_are_errors(invoke, metered: str) -> None:
    no_group = invoke("metrics", metered, "-m", "acc=accuracy [0-9.]+")
    assert no_group.exit_code == 2 and "has no capture group" in no_group.stderr and "acc=([0-9.eE+-]+)" in no_group.stderr
    no_match = invoke("metrics", metered, "-m", "acc=accuracy ([0-9.]+)", "--metric", "acc")
    assert no_match.exit_code == 2 and "no line of rank 0's logs" in no_match.stderr and "--all-ranks" in no_match.stderr
