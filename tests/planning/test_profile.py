"""SMDDP_PROFILE on real rank processes: what is recorded, the summary rank 0 prints, and what plan reads."""

import json
import os
import socket
import subprocess
import sys

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.planning.profile_io import load, read_step_profile, steps_of
from tests.collectives.cluster import PROJECT_ROOT

pytestmark = pytest.mark.integration

PARAM_BYTES = (256 * 1024 + 1024 + 1024 * 256 + 256) * 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, n=2, ddp="torch"):
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SM_CURRENT_HOST="algo-1",
            OMP_NUM_THREADS="1",
            SMDDP_PROFILE=str(tmp_path / "prof"),
            PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
        )
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.planning.profile_worker", ddp], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs


@pytest.mark.parametrize("ddp", ["torch", "smddp"])
def test_profile_records_buckets_steps_and_fsdp_sizes_and_plan_reads_it(tmp_path, ddp):
    outs = run_ranks(tmp_path, ddp=ddp)
    docs = load(tmp_path / "prof")
    assert [d["rank"] for d in docs] == [0, 1]
    doc = docs[0]
    assert len(doc["steps"]) == 5  # the optimizer hook marked every step
    steps = steps_of(doc)
    assert len(steps) == 4
    for step in steps:
        buckets = [e for e in step["events"] if e.nbytes >= 1024]  # DDP also sends a few bytes of its own
        assert sum(e.nbytes for e in buckets) == PARAM_BYTES  # every gradient, once, in buckets
        assert len(buckets) >= 2  # 0.25 MB buckets
        assert all(e.op == "all_reduce" for e in buckets)  # (torch's DDP also broadcasts bucket indices once)
        assert all(0 <= e.ready_s <= step["step_s"] for e in step["events"])
        assert 0 < step["compute_s"] <= step["step_s"]
    ops = {(e[0], e[1]) for e in doc["events"]}
    assert ("all_gather_into_tensor", 8000) in ops and ("reduce_scatter_tensor", 8000) in ops
    for event in doc["events"]:
        assert event[2] <= event[3] <= event[4]  # submit <= start <= end
    step = read_step_profile(tmp_path / "prof")
    assert PARAM_BYTES <= step.bytes_per_step < PARAM_BYTES + 1024 and step.measured_step_s >= step.compute_s
    # rank 0 prints the summary, the others stay quiet
    assert "smddp profile (rank 0, world size 2): 4 steps" in outs[0][1]
    assert "smddp profile" not in outs[1][1]


def test_bad_profiles_are_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="no profile"):
        read_step_profile(tmp_path / "missing")
    (tmp_path / "rank-0.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(SpecError, match="not an smddp profile"):
        read_step_profile(tmp_path)
    (tmp_path / "rank-0.json").write_text(json.dumps({"format": "smddp-profile/1", "events": [], "steps": [1.0]}))
    with pytest.raises(SpecError, match="step marks"):
        read_step_profile(tmp_path)
