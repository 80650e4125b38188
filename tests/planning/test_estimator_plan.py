"""estimator.plan(...): the same plan as the CLI, from the estimator's own instance type and batch size."""

import pytest

from smddp_sdk import PyTorch
from smddp_sdk.errors import SpecError

SMDDP = {"smdistributed": {"dataparallel": {"enabled": True}}}


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return PyTorch(entry_point="train.py", source_dir="src", instance_count=2, instance_type="ml.p4d.24xlarge", distribution=SMDDP, hyperparameters={"batch-size": 32})


def test_estimator_plan_uses_the_jobs_instance_type_and_batch_size(job):
    plan = job.plan("2,4", compute_ms=200, gradient_mb=400, price_per_hour=25.0, samples_per_epoch=10**6)
    assert plan.instance_type == "ml.p4d.24xlarge"
    row = plan.row(4, "smddp")
    assert row.ranks == 32 and row.samples_per_s == pytest.approx(32 * 32 / row.step_s)
    assert row.cost_per_hour == pytest.approx(100.0)


def test_estimator_plan_for_another_type_and_errors(job):
    assert job.plan([2], instance_type="ml.p5.48xlarge", compute_ms=100, gradient_mb=100).topology.network_gbit_s == 3200
    with pytest.raises(SpecError, match="SMDDP_PROFILE"):
        job.plan([2])
