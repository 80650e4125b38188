"""`smddp-launch run job.yaml --dryrun` lists what the rehearsal does not emulate under NOTES."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import invoke, isolated  # noqa: F401 - fixtures

JOB = """\
entry_point: train.py
instance_type: local
instance_count: 2
scheduler: local
metric_definitions:
  - {Name: loss, Regex: "loss=(\\\\S+)"}
max_retry_attempts: 3
inputs:
  training: {s3_data: s3://data-bucket/train, distribution: ShardedByS3Key, input_mode: FastFile}
"""


def test_dryrun_notes_every_setting_it_does_not_emulate(invoke, isolated: Path) -> None:  # noqa: F811
    (isolated / "train.py").write_text("print('hi')\n")
    (isolated / "job.yaml").write_text(JOB)
    result = invoke("run", "job.yaml", "--dryrun")
    assert result.exit_code == 0, result.output
    notes = result.stdout.split("=== NOTES ===", 1)[1]
    for words in ("metric_definitions (1) are not scraped",
                  "FastFile runs as File", "downloaded through boto3", "ShardedByS3Key"):
        assert words in notes, words


def test_pipe_mode_is_exit_2(invoke, isolated: Path) -> None:  # noqa: F811
    (isolated / "train.py").write_text("print('hi')\n")
    (isolated / "job.yaml").write_text(JOB.replace("FastFile", "Pipe"))
    result = invoke("run", "job.yaml", "--dryrun")
    assert result.exit_code == 2 and "Pipe mode" in result.stderr
