"""The ranks named when max_run ends a job (``hosttree.hanging``), from faulthandler dumps."""

from __future__ import annotations

from smddp_sdk.schedulers.hosttree import hanging
from smddp_sdk.schedulers.stacks import RankStack

WORKER = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
  File "/usr/lib/python3.12/threading.py", line 1032 in _bootstrap
"""
LINGERING = (
    WORKER
    + """
Current thread 0x00007f0000000002 (most recent call first):
  File "/opt/ml/code/train.py", line 61 in linger_after_training
  File "/opt/ml/code/train.py", line 55 in main
  File "/opt/ml/code/train.py", line 105 in <module>
"""
)
IN_COLLECTIVE = """Current thread 0x00007f0000000003 (most recent call first):
  File "/site-packages/smddp_sdk/collectives/shm.py", line 300 in wait_for
  File "/opt/ml/code/train.py", line 40 in main
  File "/opt/ml/code/train.py", line 105 in <module>
"""


def test_the_main_threads_innermost_frame_names_where_a_rank_is():
    frames = hanging.main_thread_frames(LINGERING)
    assert frames[0] == 'File "/opt/ml/code/train.py", line 61 in linger_after_training'
    assert hanging.where(frames[0]) == "linger_after_training (train.py:61)"
    assert hanging.main_thread_frames("no dump here") == []


def test_ranks_that_ended_are_not_named_and_a_waiting_rank_comes_after_the_one_it_waits_for():
    answers = [RankStack("algo-1", 0, IN_COLLECTIVE), RankStack("algo-1", 1, ""), RankStack("algo-2", 3, LINGERING)]
    records = hanging.records(answers, max_run=40)
    assert [(r.host, r.rank) for r in records] == [("algo-2", 3), ("algo-1", 0)]
    assert records[0].error_type == "MaxRuntimeExceeded" and "max_run=40 seconds" in records[0].message
    assert hanging.describe(records) == "; still running: algo-2/rank3 in linger_after_training (train.py:61), algo-1/rank0 in wait_for (shm.py:300)"
    assert hanging.describe([]) == ""
