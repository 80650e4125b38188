"""planning.failures: goodput and cost under failures, the Llama 3 default rate and Young's interval, and how
``smddp-launch plan`` shows them (pure; the drill that checks the prediction is tests/faults/test_drill.py)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from smddp_sdk.errors import SpecError
from smddp_sdk.planning.failures import FAILURES_PER_GPU_HOUR, FailureModel, default_failure_rate, failure_rows, model_for


def test_the_default_rate_is_llama3s_per_instance_hour_at_the_stated_gpus_per_instance() -> None:
    assert pytest.approx(419 / (16384 * 54 * 24)) == FAILURES_PER_GPU_HOUR
    assert default_failure_rate(8) == pytest.approx(1.5786e-4, rel=1e-3)
    model, source = model_for(8)
    assert "419" in source and "8 GPU(s) per instance" in source
    assert model.mtbf_s(2048) / 3600 == pytest.approx(3.09, rel=0.01)  # the whole Llama 3 fleet: about one every 3 hours
    assert default_failure_rate(0) == FAILURES_PER_GPU_HOUR  # a CPU instance or simulated host counts as one GPU


def test_goodput_follows_the_rule_and_youngs_interval_wastes_least() -> None:
    model = FailureModel(failure_rate=1.0, checkpoint_interval_s=60, checkpoint_s=5, recovery_s=20)  # 2 hosts: M = 1800 s
    assert model.mtbf_s(2) == 1800
    assert model.goodput(2) == pytest.approx((1 - (20 + 65 / 2) / 1800) * 60 / 65)
    best = model.optimal_interval_s(2)
    assert best == pytest.approx(math.sqrt(2 * 5 * 1800))
    around = [model.goodput(2, best * factor) for factor in (0.5, 0.8, 1.25, 2.0)]
    assert all(model.goodput(2, best) >= value for value in around)
    assert FailureModel(0, 60, 5, 20).goodput(4) == pytest.approx(60 / 65)  # nothing fails: only the checkpoints cost
    assert FailureModel(100, 60, 5, 20).goodput(4) == 0.0  # interrupted before it could train


def test_rows_cost_a_productive_hour_and_spot_adds_its_rate() -> None:
    model = FailureModel(failure_rate=0.01, checkpoint_interval_s=600, checkpoint_s=10, recovery_s=60, spot_rate=0.05)
    (row,) = failure_rows(model, [4], price_per_hour=2.0)
    assert row.mtbf_hours == pytest.approx(1 / (4 * 0.06))
    assert row.cost_per_productive_hour == pytest.approx(4 * 2.0 / row.goodput)
    assert row.goodput_at_optimal is not None and row.goodput_at_optimal >= row.goodput
    (free,) = failure_rows(FailureModel(0, 600, 10, 60), [4], None)
    assert (free.mtbf_hours, free.optimal_interval_s, free.cost_per_productive_hour) == (None, None, None)


@pytest.mark.parametrize("option, value", [("failure_rate", -1.0), ("checkpoint_interval_s", 0.0), ("recovery_s", math.nan)])
def test_bad_figures_are_errors_that_name_them(option: str, value: float) -> None:
    with pytest.raises(SpecError, match=option.removesuffix("_s")):
        model_for(8, **{option: value})


def test_plan_shows_goodput_under_failures_in_the_table_and_json() -> None:
    args = ["plan", "--instance-type", "ml.p4d.24xlarge", "--compute-ms", "120", "--gradient-mb", "90", "--instances", "16,2048",
            "--price-per-hour", "40", "--recovery-seconds", "120", "--checkpoint-interval", "900"]
    table = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert "under failures: 0.000158 failures per instance-hour (Llama 3" in table.output
    assert "checkpoint every 15.0 min, each 30 s; recovery 120.0 s" in table.output
    result = CliRunner().invoke(cli, [*args, "--json", "--failure-rate", "0.001", "--spot-price-per-hour", "12"], catch_exceptions=False)
    failures = json.loads(result.output)["failures"]
    assert failures["source"] == "given" and failures["model"]["failure_rate"] == 0.001
    rows = {row["instances"]: row for row in failures["rows"]}
    assert rows[2048]["goodput"] < rows[16]["goodput"]
    assert rows[16]["cost_per_productive_hour"] == pytest.approx(16 * 12 / rows[16]["goodput"])


def test_the_recovery_time_can_come_from_a_drilled_jobs_recoveries(tmp_path, monkeypatch) -> None:
    """A finished job's record as the local scheduler writes it (its plan from a dry run), with recoveries."""
    from smddp_sdk.schedulers.local import LocalScheduler
    from smddp_sdk.specs.job import JobSpec

    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = JobSpec.from_mapping({"entry_point": str(tmp_path / "train.py"), "instance_type": "local", "instance_count": 2, "job_name": "drilled"})
    dryrun = LocalScheduler(job_root=str(tmp_path / "jobs")).dryrun(spec)
    job = tmp_path / "jobs" / "drilled"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"handle": dryrun.request.handle, "job_name": "drilled", "spec": spec.as_dict(), "plan": dryrun.request.to_json()}))
    attempt = {"hosts_started": 1, "first_collective": 5, "detected": 20, "ended": 21}
    (job / "state.json").write_text(json.dumps({"state": "SUCCEEDED", "started": 0, "ended": 200, "attempts": [
        {**attempt, "attempt": 1, "started": 0, "fault": 20, "outcome": "Restarting"},
        {"attempt": 2, "started": 30, "hosts_started": 31, "first_collective": 50, "fault": 60, "detected": 60, "ended": 61, "outcome": "Interrupted"},
        {"attempt": 3, "started": 70, "hosts_started": 71, "first_collective": 100, "ended": 199, "outcome": "Completed"}]}))
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(tmp_path / "jobs"))
    args = ["plan", "--instance-type", "sim:1000mbit", "--compute-ms", "50", "--gradient-mb", "10", "--instances", "2", "--json"]
    result = CliRunner().invoke(cli, [*args, "--recovery-from", "local://drilled"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["failures"]["model"]["recovery_s"] == 35  # the median of 30 s and 40 s
    (job / "state.json").write_text(json.dumps({"state": "SUCCEEDED", "started": 0, "ended": 9, "attempts": []}))
    refused = CliRunner().invoke(cli, [*args, "--recovery-from", "local://drilled"])
    assert refused.exit_code == 2 and "recorded no recovery" in refused.output
