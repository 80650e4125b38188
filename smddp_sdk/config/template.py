"""The commented job.yaml that ``smddp-launch init`` writes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from smddp_sdk.config.schema import SCHEMA_FILE_NAME

DISTRIBUTION_BLOCKS = {
    "smddp": "distribution:\n  smdistributed:\n    dataparallel:\n      enabled: true",
    "torch_distributed": "distribution:\n  torch_distributed:\n    enabled: true",
    "mpi": "distribution:\n  mpi:\n    enabled: true",
    "none": "# distribution:\n#   smdistributed:\n#     dataparallel:\n#       enabled: true",
}


@dataclass(frozen=True)
class JobTemplate:
    entry_point: str = "train.py"
    source_dir: str | None = None
    instance_type: str = "ml.g5.2xlarge"
    instance_count: int = 2
    distribution: str = "smddp"
    scheduler: str = "local"
    file_name: str = "job.yaml"

    def render(self) -> str:
        source_dir = f"source_dir: {_quote(self.source_dir)}" if self.source_dir else "# source_dir: src"
        return f"""\
# yaml-language-server: $schema={SCHEMA_FILE_NAME}
# A training job for smddp-launch.   Run it: smddp-launch {self.file_name}
# Check it: smddp-launch validate {self.file_name}    Preview: smddp-launch run {self.file_name} --dryrun
# Keys are SageMaker SDK v2 estimator arguments; all of them: docs/job-file.md, `smddp-launch schema`.

# Where it runs: local (simulated hosts on this machine), docker (one container per host) or sagemaker.
scheduler: {self.scheduler}

# The training script. With source_dir set, entry_point is relative to it and the whole directory ships.
entry_point: {_quote(self.entry_point)}
{source_dir}

# Hosts and their type. Locally each simulated host runs one rank per GPU of the type (CPU tensors).
instance_type: {self.instance_type}
instance_count: {self.instance_count}

# One rank per GPU with the smddp collectives; the script calls dist.init_process_group("smddp").
{DISTRIBUTION_BLOCKS[self.distribution]}

# Reach the script as --name value arguments (and /opt/ml/input/config/hyperparameters.json).
hyperparameters:
  epochs: 1

# Metrics: a regular expression over the log lines, its first group the value (`smddp-launch metrics <job>`).
metric_definitions:
  - {{Name: loss, Regex: 'loss[=: ]+([0-9.eE+-]+)'}}

# Data channels, found at /opt/ml/input/data/<channel> (SM_CHANNEL_<CHANNEL>).
# inputs:
#   train: s3://my-bucket/datasets/train    # or a local path / file:// URI

# Environment variables for every rank.
# environment:
#   NCCL_DEBUG: WARN

# SageMaker only: the IAM role and where outputs go.
# role: arn:aws:iam::111122223333:role/SageMakerRole
# output_path: s3://my-bucket/smddp-jobs

# Options by scheduler; --scheduler picks the section that applies (smddp-launch options {self.scheduler}).
# scheduler_options:
#   local:
#     processes_per_host: 2
#   sagemaker:
#     region: us-west-2
"""


def _quote(value: str) -> str:
    """A YAML scalar for a path or name: plain when safe, JSON-quoted otherwise."""
    plain = value and all(ch.isalnum() or ch in "._/-+" for ch in value) and value[0] not in "-."
    return value if plain else json.dumps(value)
