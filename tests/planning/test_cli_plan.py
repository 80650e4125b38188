"""`smddp-launch plan`: the example job, a user's profile, JSON and SVG output, and clear errors."""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from smddp_sdk.cli.main import cli
from tests.collectives.cluster import PROJECT_ROOT

EXAMPLE = PROJECT_ROOT / "examples" / "cnn" / "job.yaml"
SAMPLE_PROFILE = PROJECT_ROOT / "docs" / "data" / "planning" / "cnn-profile"


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("SMDDP_PROFILE", "SMDDP_DEBUG"):
        monkeypatch.delenv(name, raising=False)

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["plan", *args], catch_exceptions=False)

    return invoke


def test_example_job_with_figures_prints_the_table(run):
    result = run(str(EXAMPLE), "--instance-type", "ml.p4d.24xlarge", "--compute-ms", "120", "--gradient-mb", "90", "--instances", "1,2,4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ml.p4d.24xlarge: 8 GPU(s)/host")
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("under failures:"))]  # then goodput under failures
    rows = [line.split() for line in table if line.strip().split(" ")[0].isdigit()]
    assert [(r[0], r[2]) for r in rows] == [(n, lib) for n in ("1", "2", "4") for lib in ("smddp", "stock")]
    assert [r[3] for r in rows] == ["within-node", "ring", "param-servers", "ring", "param-servers", "tree"]  # AWS SMDDP, NCCL
    assert all(r[10] == "n/a" and r[12] == "n/a" for r in rows)  # no price given: no cost
    assert rows[0][9] != "n/a"  # samples/s: batch-size 64 comes from the job's hyperparameters
    assert "--price-per-hour" in result.output


def test_json_and_svg(run, tmp_path):
    result = run(
        "--instance-type",
        "ml.p3dn.24xlarge",
        "--compute-ms",
        "300",
        "--gradient-mb",
        "1360",
        "--instances",
        "2,4,8",
        "--batch-size",
        "16",
        "--samples-per-epoch",
        "100000",
        "--price-per-hour",
        "30",
        "--json",
        "--svg",
        "p.svg",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [r["instances"] for r in doc["rows"]] == [2, 2, 4, 4, 8, 8]
    assert doc["units"]["cost_per_hour"] == "USD/h"
    assert all(r["cost_per_epoch"] > 0 for r in doc["rows"])
    ET.parse(tmp_path / "p.svg")


def test_plan_from_a_recorded_profile(run, tmp_path):
    profile = tmp_path / "prof"
    shutil.copytree(SAMPLE_PROFILE, profile)
    result = run(str(EXAMPLE), "--profile", str(profile), "--instance-type", "sim:100mbit", "--instances", "2,4")
    assert result.exit_code == 0, result.output
    assert str(profile) in result.output.splitlines()[0]
    result = run("--profile", str(profile), "--instance-type", "ml.p4d.24xlarge", "--compute-ms", "50", "--json")
    assert json.loads(result.output)["compute_s"] == pytest.approx(0.05)


@pytest.mark.parametrize(
    "args, message",
    [
        ((str(EXAMPLE), "--instance-type", "local", "--compute-ms", "1", "--gradient-mb", "1"), "no network figures for 'local'"),
        (("--instance-type", "ml.p4d.24xlarge"), "SMDDP_PROFILE"),
        (("--instance-type", "ml.p4d.24xlarge", "--compute-ms", "1", "--gradient-mb", "1", "--instances", "0"), "instance counts"),
        (("--compute-ms", "1", "--gradient-mb", "1"), "no instance type"),
    ],
)
def test_errors_exit_2_with_a_hint(run, args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
