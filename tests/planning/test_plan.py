"""The plan: rows per instance count and library, units, cost columns only with a price, SVG and JSON."""

import json
import xml.etree.ElementTree as ET

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.planning import plan_job, step_profile
from smddp_sdk.planning.plan import parse_counts, render_svg, render_table


def test_rows_units_and_cost_arithmetic():
    step = step_profile(compute_ms=200, gradient_mb=500, samples_per_rank=32)
    plan = plan_job("ml.p4d.24xlarge", "1,2,4", step, price_per_hour=20.0, samples_per_epoch=1_000_000)
    assert [(r.instances, r.library) for r in plan.rows] == [(n, lib) for n in (1, 2, 4) for lib in ("smddp", "stock")]
    for r in plan.rows:
        assert r.ranks == 8 * r.instances
        assert r.step_s >= r.compute_s == pytest.approx(0.2)
        assert 0 < r.efficiency <= 1
        assert r.samples_per_s == pytest.approx(32 * r.ranks / r.step_s)
        assert r.cost_per_hour == pytest.approx(20.0 * r.instances)
        assert r.epoch_hours == pytest.approx(1_000_000 / r.samples_per_s / 3600)
        assert r.cost_per_epoch == pytest.approx(r.cost_per_hour * r.epoch_hours)
    doc = json.loads(json.dumps(plan.as_dict()))
    assert doc["units"]["step_s"] == "s" and doc["units"]["cost_per_epoch"] == "USD"
    assert doc["rows"][0]["instances"] == 1


def test_without_a_price_the_cost_columns_are_not_available():
    plan = plan_job("ml.p4d.24xlarge", [2], step_profile(compute_ms=100, gradient_mb=100))
    assert all(r.cost_per_hour is None and r.cost_per_epoch is None and r.samples_per_s is None for r in plan.rows)
    text = render_table(plan)
    assert "n/a" in text and "no price for ml.p4d.24xlarge" in text


def test_efficiency_falls_as_a_slow_network_scales_out():
    plan = plan_job("sim:100mbit", "2,4,8", step_profile(compute_ms=50, gradient_mb=20))
    effs = [plan.row(n, "smddp").efficiency for n in (2, 4, 8)]
    assert effs == sorted(effs, reverse=True) and effs[-1] < 0.5


def test_svg_is_well_formed_with_a_line_per_library():
    plan = plan_job("ml.p3dn.24xlarge", "1,2,4,8", step_profile(compute_ms=300, gradient_mb=1360))
    root = ET.fromstring(render_svg(plan))
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 2


@pytest.mark.parametrize("text", ["", "0", "two", "1,-2"])
def test_bad_instance_counts(text):
    with pytest.raises(ValueError):
        parse_counts(text)
    with pytest.raises(SpecError):
        plan_job("ml.p4d.24xlarge", text, step_profile(compute_ms=100, gradient_mb=100))


def test_no_step_is_an_error_that_says_how_to_get_one():
    with pytest.raises(SpecError, match="SMDDP_PROFILE"):
        step_profile()


def test_docs_topology_table_matches_the_catalogue():
    from smddp_sdk.planning.hardware import markdown_table
    from tests.collectives.cluster import PROJECT_ROOT

    assert markdown_table() in (PROJECT_ROOT / "docs" / "planning.md").read_text(encoding="utf-8")


def test_bert_large_on_p4d_smddp_keeps_up_with_nccl_from_2_to_64_instances_and_says_what_runs():
    plan = plan_job("ml.p4d.24xlarge", "2,4,8,16,32,64", step_profile(compute_ms=150, gradient_mb=1360))
    for n in (2, 4, 8, 16, 32, 64):
        assert plan.row(n, "smddp").step_s <= plan.row(n, "stock").step_s
        assert (plan.row(n, "smddp").implementation, plan.row(n, "stock").implementation) == ("AWS SMDDP", "NCCL")
    text = render_table(plan)
    assert "smddp on ml.p4d.24xlarge is AWS's SMDDP" in text and "stock on ml.p4d.24xlarge is NCCL" in text
    assert "slower" not in text


def test_where_smddp_is_predicted_slower_the_plan_says_why():
    # p5's 3200 Gbit/s outruns the assumed reduction on the hosts' CPUs that SMDDP's servers do
    plan = plan_job("ml.p5.48xlarge", "2,8", step_profile(compute_ms=20, gradient_mb=1360))
    reasons = [n for n in plan.notes if "smddp predicted" in n]
    assert [r.split(":")[0] for r in reasons] == ["2 instances", "8 instances"]
    assert all("bound by the reduction on the hosts' CPUs" in r and "NCCL" in r for r in reasons)


def test_simulated_hosts_plan_the_bundled_backend_against_gloo():
    plan = plan_job("sim:1000mbit+0.5ms", "2,4", step_profile(compute_ms=50, gradient_mb=20, bucket_mb=4))
    assert plan.row(4, "smddp").implementation == "smddp (this project)" and plan.row(4, "stock").implementation == "gloo"
    assert plan.row(2, "smddp").algorithm == "oneshot" and plan.row(4, "smddp").algorithm == "ring"
