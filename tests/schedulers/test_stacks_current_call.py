"""`smddp-launch stacks` numbers the call each rank is in now (specs/call_record.py, collectives/call_file.py).

Two real ranks over smddp, on one simulated host (the arena's record) and on two (the mesh's call header),
through the native core and through Python: rank 0 waits over a second in all_reduce #1 (before, that was
when its call file was written), then both run broadcast #2 at once and park outside any call. The file
must name broadcast #2, the call each began last, not all_reduce #1; then all_reduce #3 as soon as rank 0
waits in it; and nothing once the group is destroyed."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from smddp_sdk.specs.call_record import read_call_file
from smddp_sdk.specs.contract import STACKS_FILE_ENV, rank_call_file_of
from tests.collectives.cluster import PROJECT_ROOT, rank_env

pytestmark = pytest.mark.jobs  # real rank processes, three pairs

RANKS = """\
import time, torch, torch.distributed as dist
from tests.collectives.worker import connect, init
store = connect()
init(store)
rank, t = dist.get_rank(), torch.ones(4)
if rank == 1:
    time.sleep(1.5)
dist.all_reduce(t)  # 1: rank 0 waits in it for over a second
dist.broadcast(t, 0)  # 2: at once
store.set(f"parked/{rank}", "1")
store.wait(["release"])
if rank == 1:
    store.wait(["late"])
dist.all_reduce(t)  # 3: rank 0 waits in it for rank 1
store.set(f"reduced/{rank}", "1")
dist.destroy_process_group()
store.set(f"destroyed/{rank}", "1")
store.wait(["exit"])
"""


@pytest.mark.parametrize(("hosts", "native"), [(["a", "a"], "1"), (["a", "b"], "1"), (["a", "b"], "0")], ids=["one-host-native", "two-hosts-native", "two-hosts-python"])
def test_the_call_file_names_the_call_a_rank_is_in_now_not_the_last_slow_one(tmp_path: Path, hosts: list[str], native: str) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    stacks = [tmp_path / f"rank-{rank}.txt" for rank in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RANKS], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=rank_env(rank, hosts, store.port, {STACKS_FILE_ENV: str(stacks[rank]), "SMDDP_NATIVE": native}))
             for rank in range(2)]
    try:
        store.wait(["parked/0", "parked/1"])
        calls = [read_call_file(rank_call_file_of(path)) for path in stacks]
        assert all(call.startswith("broadcast #2 (float32, 4 elements, root 0)") for call in calls), calls
        assert rank_call_file_of(stacks[0]).stat().st_mode & 0o777 == 0o600

        store.set("release", "1")
        deadline = time.monotonic() + 60
        while not read_call_file(rank_call_file_of(stacks[0])).startswith("all_reduce #3"):
            assert time.monotonic() < deadline, read_call_file(rank_call_file_of(stacks[0]))
            time.sleep(0.01)
        assert not store.check(["reduced/0"])  # rank 0 is inside all_reduce #3, waiting for rank 1
        assert read_call_file(rank_call_file_of(stacks[0])) == "all_reduce #3 (SUM, float32, 4 elements)"

        store.set("late", "1")
        store.wait(["destroyed/0", "destroyed/1"])
        assert [read_call_file(rank_call_file_of(path)) for path in stacks] == ["", ""]  # in no call of a group
        store.set("exit", "1")
    finally:
        outputs = []
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs.append(proc.communicate()[0])
    assert [proc.returncode for proc in procs] == [0, 0], outputs
