"""torch_distributed launches look like torchrun's to the script: is_torchelastic_launched(), @record's error file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from smddp_sdk.specs.contract import read_failure
from tests.integration.runtime_job import make_job, wait_all

pytestmark = pytest.mark.integration

RECORDED_SCRIPT = """
import os
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    assert dist.is_torchelastic_launched()
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 broke inside @record")

main()
"""


def test_records_written_by_torchs_record_are_the_root_cause(tmp_path: Path) -> None:
    """A shell entry point runs python itself (no bootstrap of ours): the cause comes from torch's file."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(RECORDED_SCRIPT)
    (code / "run.sh").write_text(f"#!/bin/sh\nexec {sys.executable} train.py\n")
    job = make_job(tmp_path / "job", code, ["algo-1"], {"sagemaker_torch_distributed_enabled": True}, entry_point="run.sh", num_gpus=2)
    rc, output = wait_all(job.start(), 60)["algo-1"]
    assert rc == 1, output
    reason = read_failure(job.opt_ml("algo-1")) or ""
    assert "rank 1 on host algo-1" in reason and "ValueError: rank 1 broke inside @record" in reason
    assert "rank-1.torchelastic.json" in output  # the summary names the file the cause came from
    assert "Traceback" in reason
