"""A failure's blamed peer travels as data: from ``CollectiveError`` through the rank's error file (written by
the real bootstrap in a real process) to the failure record and the root-cause rule, without parsing prose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.runtime.failures import rank_failure
from smddp_sdk.specs.failure import SOURCE_ERROR_FILE, FailureRecord, PeerRank, blamed_by, decide, is_victim

pytest.importorskip("torch")
pytestmark = pytest.mark.integration  # real bootstrap processes, each importing torch
ROOT = Path(__file__).resolve().parents[2]

# The user's script in each case: how its collective failure reaches the bootstrap.
RAISED = """
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
raise CollectiveError("smddp all_reduce timed out waiting for rank 1 (host algo-2)", awaited=[PeerRank(1, "algo-2")])
"""
# DDP's reducer waits on the comm hook's future in C++: torch re-raises the error as a bare RuntimeError.
THROUGH_TORCH = """
import torch
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
hook = torch.futures.Future()
reduced = hook.then(lambda fut: fut.value())
hook.set_exception(CollectiveError("smddp all_reduce failed: peer rank 2 (pid 9, same host) exited before completing it", lost=[PeerRank(2)]))
try:
    reduced.wait()
except RuntimeError as err:
    assert type(err) is RuntimeError and not hasattr(err, "lost"), type(err)  # what torch gives the user
    raise
"""
# A script that survives a failed collective and then fails of its own: its error is its own.
OWN_ERROR_LATER = """
from smddp_sdk.collectives.errors import CollectiveError, PeerRank
try:
    raise CollectiveError("smddp broadcast timed out waiting for rank 3 (host algo-2)", awaited=[PeerRank(3, "algo-2")])
except CollectiveError:
    pass
raise ValueError("bad batch")
"""


def _failed_rank(tmp_path: Path, script: str, *, host: str = "algo-1", rank: int = 0) -> FailureRecord:
    """Run ``script`` under the rank bootstrap as rank ``rank`` of ``host``; its failure record as the runtime makes it."""
    (tmp_path / "train.py").write_text(script)
    error_file = tmp_path / "errors" / f"rank-{rank}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SMDDP_ERROR_FILE": str(error_file), "SM_CURRENT_HOST": host, "RANK": str(rank), "LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "smddp_sdk.runtime.bootstrap", "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)  # torch imports slowly on a loaded machine
    assert done.returncode == 1, done.stderr
    return rank_failure(host=host, rank=rank, local_rank=0, pid=1, returncode=done.returncode, error_file=error_file, log_tail="")


def test_the_error_file_carries_the_awaited_peer_and_the_rule_names_it_as_hung(tmp_path: Path) -> None:
    record = _failed_rank(tmp_path, RAISED)
    assert json.loads((tmp_path / "errors" / "rank-0.json").read_text())["awaited"] == [{"rank": 1, "host": "algo-2"}]
    assert (record.source, record.awaited, record.lost) == (SOURCE_ERROR_FILE, (PeerRank(1, "algo-2"),), ())
    assert is_victim(record)
    root = decide([record]).root
    assert (root.host, root.rank, root.error_type) == ("algo-2", 1, "Hang")


def test_a_failure_that_crossed_torch_keeps_its_peer(tmp_path: Path) -> None:
    record = _failed_rank(tmp_path, THROUGH_TORCH, host="algo-1", rank=0)
    assert record.error_type == "RuntimeError" and record.lost == (PeerRank(2),)
    assert blamed_by(record) == [("algo-1", 2, False)]  # a peer on the rank's own host
    root = decide([record]).root
    assert (root.host, root.rank, root.error_type) == ("algo-1", 2, "LostRank")


def test_an_error_of_the_script_after_a_survived_collective_failure_blames_nobody(tmp_path: Path) -> None:
    record = _failed_rank(tmp_path, OWN_ERROR_LATER)
    assert (record.error_type, record.lost, record.awaited) == ("ValueError", (), ())
    assert not is_victim(record) and decide([record]).root is record


def test_peers_cross_processes_as_json_and_bad_ones_are_dropped() -> None:
    record = FailureRecord("algo-1", 0, 1, "x", lost=(PeerRank(3, "algo-2"),), awaited=(PeerRank(1),))
    assert FailureRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    odd = FailureRecord.from_json({"host": "h", "lost": [{"rank": "x"}, "rank 3", {"rank": 4}], "awaited": "rank 1"})
    assert (odd.lost, odd.awaited) == ((PeerRank(4),), ())


def test_a_message_naming_a_rank_blames_nobody_without_the_data() -> None:
    prose = FailureRecord("algo-1", 0, 1, "smddp all_reduce timed out waiting for rank 1 (host algo-2)", timestamp=1.0, error_type="CollectiveError")
    assert blamed_by(prose) == [] and decide([prose]).root is prose
    assert str(PeerRank(1, "algo-2")) == "rank 1 (host algo-2)"  # how collectives' messages name a peer
