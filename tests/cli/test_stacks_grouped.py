"""`stacks` groups ranks by where they are and prints each distinct stack once (schedulers/stacks.py), from
faulthandler dumps as ranks write them; the live jobs are in tests/collectives/test_hang_blame.py and
tests/slurm/test_slurm_habits.py."""

from __future__ import annotations

from pathlib import Path

from smddp_sdk.schedulers.stacks import RankStack, grouped, main_thread, ranks_text, where

SITE = "/usr/lib/python3.11/site-packages"
LAUNCH = """\
  File "<frozen runpy>", line 88 in _run_code
  File "/src/smddp_sdk/runtime/bootstrap.py", line 73 in _run
  File "<frozen runpy>", line 198 in _run_module_as_main
"""


def in_all_reduce(thread: str, inner: str = "") -> str:
    return (f"Current thread {thread} (most recent call first):\n{inner}"
            f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 3245 in all_reduce\n'
            f'  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
            f'  File "/opt/ml/code/train.py", line 37 in main\n'
            f'  File "/opt/ml/code/train.py", line 50 in <module>\n{LAUNCH}')


def sleeping(thread: str) -> str:
    worker = f'Thread 0x00007f00000000aa (most recent call first):\n  File "{SITE}/threading.py", line 320 in wait\n'
    return f'{worker}\nCurrent thread {thread} (most recent call first):\n  File "/opt/ml/code/train.py", line 30 in main\n  File "/opt/ml/code/train.py", line 50 in <module>\n{LAUNCH}'


def test_four_ranks_read_as_two_places_and_two_stacks(tmp_path: Path) -> None:
    code = tmp_path / "algo-2" / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text("\n" * 29 + "        time.sleep(60)  # wait for the data\n")
    call = "all_reduce #41 (SUM, float32, 1024 elements)"
    stacks = [
        RankStack("algo-1", 0, in_all_reduce("0x00007f0000000001"), call),
        RankStack("algo-1", 1, in_all_reduce("0x00007f0000000002"), call),
        RankStack("algo-2", 2, in_all_reduce("0x00007f0000000003"), call),
        RankStack("algo-2", 3, sleeping("0x00007f0000000004"), "all_reduce #40 (SUM, float32, 1024 elements)", str(tmp_path / "algo-2")),
        RankStack("algo-2", 4, ""),  # did not answer: in no group
    ]
    places, distinct = grouped(stacks)
    assert [(ranks_text(ranks), place) for place, ranks in places] == [
        ("ranks 0-2", "all_reduce #41 (SUM, float32, 1024 elements) at train.py:37"),
        ("rank 3", "time.sleep(60)  # wait for the data at train.py:30"),
    ]
    assert [ranks_text(ranks) for _, ranks in distinct] == ["ranks 0-2", "rank 3"]
    text = distinct[0][0]
    assert text.startswith("Thread (most recent call first):") and "0x0000" not in text  # thread ids differ, stacks do not
    assert "<frozen runpy>" not in text and "bootstrap.py" not in text  # how every rank starts says nothing


def test_the_main_thread_is_the_one_the_launcher_started_whichever_took_the_signal() -> None:
    dump = sleeping("0x1")
    assert main_thread(dump)[0].file == "/opt/ml/code/train.py"


def test_a_call_file_of_another_collective_is_not_taken_for_this_one() -> None:
    stack = RankStack("algo-1", 0, in_all_reduce("0x1"), "broadcast #7 (float32, 10 elements, root 0)")
    assert where(stack) == "all_reduce at train.py:37"


def test_a_rank_inside_library_code_only_is_named_by_its_innermost_frame() -> None:
    dump = f'Current thread 0x1 (most recent call first):\n  File "{SITE}/torch/serialization.py", line 12 in load\n'
    assert where(RankStack("algo-1", 0, dump)) == "load at serialization.py:12"
    assert where(RankStack("algo-1", 0, "garbage")) == "no Python stack"


def test_rank_lists_are_ranges() -> None:
    def named(*ranks: int) -> str:
        return ranks_text([RankStack("h", rank, "x") for rank in ranks])

    assert (named(3), named(1, 2), named(0, 1, 2), named(0, 2, 5, 6, 7)) == ("rank 3", "ranks 1, 2", "ranks 0-2", "ranks 0, 2, 5-7")
